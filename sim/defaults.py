"""The default two-NIC set-up: addresses, QPs and memory region used by samples and benches.

``mrc-nic pcap-sample`` addresses its packets with these values, and later the default
scenario configures the NICs with them, so a sample packet can be fed to the RTL and accepted.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    name: str
    mac: str
    ipv4: str
    ipv6: str


NIC_A = Endpoint("A", "02:00:00:00:00:0a", "10.0.0.10", "fd00::a")
NIC_B = Endpoint("B", "02:00:00:00:00:0b", "10.0.0.11", "fd00::b")

#: QP pair of the default set-up: A's requester QP talks to B's responder QP.
QPN_A = 0x000011
QPN_B = 0x000022
#: B's memory region that A writes into.
MR_RKEY = 0x0000BEEF
MR_BASE = 0x0000_0001_0000_0000
MR_LENGTH = 1 << 20
#: First PSN of the default QPs.
INITIAL_PSN = 0x000100
