"""The default two-NIC set-up: addresses, QPs and memory region used by samples and benches.

``mrc-nic pcap-sample`` addresses its packets with these values, and later the default
scenario configures the NICs with them, so a sample packet can be fed to the RTL and accepted.
"""

import ipaddress
import json
from dataclasses import dataclass

from .env import REPO

#: The EV profile every bench and self-test brings online as profile 0.
DEFAULT_PROFILE_JSON = REPO / "sim" / "data" / "default-ev-profile.json"


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


def mac_int(text):
    """A MAC address ``"02:00:..."`` as the integer the register map and headers carry."""
    return int(text.replace(":", ""), 16)


def ip_int(endpoint, ip_version):
    """An endpoint's IPv6 or IPv4 address (``ip_version`` 6 or 4) as an integer."""
    if ip_version == 6:
        return int(ipaddress.IPv6Address(endpoint.ipv6))
    return int(ipaddress.IPv4Address(endpoint.ipv4))


def default_profile_spec():
    """:data:`DEFAULT_PROFILE_JSON` loaded (``hdl.path.ev.load_profile_json``)."""
    from hdl.path.ev import load_profile_json
    return load_profile_json(json.loads(DEFAULT_PROFILE_JSON.read_text()))
