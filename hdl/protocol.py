"""Protocol constants of MRC as this project implements it: the single source of truth.

Everything numeric that appears on the wire or in the control interface is defined here and
imported by the gateware, the Scapy layers, the reference model, the dissector generator and
the docs' tests. Values taken from RoCEv2/InfiniBand or from the OCP MRC headers
(``mrc.h``/``mrc_ctl.h``) say so; values marked *project choice* were invented here because
the OCP byte layouts were not available (see ``docs/wire-format.md``).

The enumerations are :class:`amaranth.lib.enum.IntEnum` with an explicit shape, so gateware can
use them as signal shapes while plain Python treats them as ordinary ``IntEnum`` members.
"""

from amaranth.lib import enum

# ---------------------------------------------------------------------------------------------
# RoCEv2 framing
# ---------------------------------------------------------------------------------------------

ROCEV2_UDP_PORT = 4791          #: IANA port of RoCEv2, the UDP destination port of every packet.
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
ETHERTYPE_VLAN = 0x8100
IP_PROTO_UDP = 17
IP_PROTO_IPV4 = 4               #: IPv4-in-IPv6: SRv6 outer (or SRH) next header, inner IPv4.
IP_PROTO_IPV6 = 41              #: IPv6-in-IPv6: SRv6 outer (or SRH) next header, inner IPv6.
IP_PROTO_ROUTING = 43           #: IPv6 routing header: the SRv6 SRH.
SRH_ROUTING_TYPE = 4            #: Segment Routing Header routing type (RFC 8754).
BTH_VERSION = 0                 #: BTH transport header version; anything else is dropped.
BTH_DEFAULT_PKEY = 0xFFFF       #: Default partition key.
ICRC_BYTES = 4

PSN_BITS = 24
PSN_MODULUS = 1 << PSN_BITS
QPN_BITS = 24
MPR_UNIT_PSNS = 128             #: MPR (max PSN range) is configured in units of 128 PSNs (mrc.h).


class Opcode(enum.IntEnum, shape=8):
    """BTH opcodes of MRC 1.0 (OCP MRC 1.0 tables, as the public references cite them). Any
    other opcode, RoCE's RC opcodes 0x00-0x1F included, is not MRC: dropped and counted."""
    RDMA_WRITE_FIRST = 0xC6                 #: METH, [TSETH], RETH, payload
    RDMA_WRITE_MIDDLE = 0xC7                #: METH, [TSETH], RETH, payload
    RDMA_WRITE_LAST = 0xC8                  #: METH, [TSETH], RETH, payload
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xC9   #: METH, [TSETH], RETH, ImmDt, payload
    RDMA_WRITE_ONLY = 0xCA                  #: METH, [TSETH], RETH, payload
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xCB   #: METH, [TSETH], RETH, ImmDt, payload
    ACKNOWLEDGE = 0xD1                      #: AETH (RoCE's fatal NAKs stay AETH NAKs)
    ENDPOINT_REQUEST = 0xD8                 #: ERTH (EV probe, port status)
    ENDPOINT_RESPONSE = 0xD9                #: EETH
    RELIABILITY_SACK = 0xDC                 #: SETH, CC_STATE
    RELIABILITY_NACK = 0xDD                 #: NETH
    RELIABILITY_PROBE_REQUEST = 0xDE        #: PETH


#: Opcodes of data packets: every one carries METH and RETH (MRC places packets in any order).
DATA_OPCODES = frozenset({
    Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
    Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, Opcode.RDMA_WRITE_ONLY,
    Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
})
#: Data opcodes that carry an ImmDt header.
IMMEDIATE_OPCODES = frozenset({
    Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
})
#: Data opcodes that end a message.
LAST_OPCODES = frozenset({
    Opcode.RDMA_WRITE_LAST, Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
})
#: Data opcodes that start a message.
FIRST_OPCODES = frozenset({
    Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
})
#: Endpoint (EV probe) opcodes.
ENDPOINT_OPCODES = frozenset({Opcode.ENDPOINT_REQUEST, Opcode.ENDPOINT_RESPONSE})
#: Every opcode an MRC NIC accepts. SEND, READ, ATOMIC, CNP and RC's own WRITE opcodes are not
#: MRC operations.
SUPPORTED_OPCODES = frozenset(Opcode)
#: The BTH destination QP of endpoint requests and responses (ERTH, EETH).
ENDPOINT_QPN = 0x000002
#: Bits of BTH.psn that carry an endpoint request's id (echoed by the response).
ENDPOINT_ID_BITS = 16

# Wire timestamps (TSETH, CC_STATE, NETH, PETH, ERTH, EETH tx_timestamp) are 16 bits. The unit
# is a *project choice*: 8 ns (the 125 MHz clock), so a timestamp wraps after 524 us, far above
# any round trip the loss rules allow.
TIMESTAMP_BITS = 16
TIMESTAMP_SHIFT = 3             #: a wire timestamp is (time in ns >> 3) modulo 2**16.


def wire_timestamp(now_ns):
    """The 16-bit wire timestamp of time ``now_ns``."""
    return (now_ns >> TIMESTAMP_SHIFT) & ((1 << TIMESTAMP_BITS) - 1)


def timestamp_age_ns(now_ns, echo):
    """Nanoseconds since wire timestamp ``echo`` was taken, as seen at ``now_ns`` (modulo the
    timestamp's wrap), in units of the timestamp (a multiple of 8 ns)."""
    return ((wire_timestamp(now_ns) - echo) & ((1 << TIMESTAMP_BITS) - 1)) << TIMESTAMP_SHIFT


def write_opcode(*, first, last, immediate):
    """The RDMA WRITE opcode for a packet at the given position of its message."""
    if immediate and not last:
        raise ValueError("Only the last packet of a message can carry immediate data")
    if first and last:
        return Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE if immediate else Opcode.RDMA_WRITE_ONLY
    if first:
        return Opcode.RDMA_WRITE_FIRST
    if last:
        return Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE if immediate else Opcode.RDMA_WRITE_LAST
    return Opcode.RDMA_WRITE_MIDDLE


# ---------------------------------------------------------------------------------------------
# ACK / NACK (AETH syndrome, InfiniBand encoding)
# ---------------------------------------------------------------------------------------------

AETH_ACK = 0x1F                 #: ACK syndrome: "no credit count" (MRC has no RNR and no credits).
AETH_NAK_BASE = 0x60            #: NAK syndromes are 0x60 | NakCode.
AETH_KIND_MASK = 0x60


class NakCode(enum.IntEnum, shape=5):
    """NAK codes in the low five bits of an AETH NAK syndrome (InfiniBand's): RoCE's fatal
    errors, which MRC keeps as AETH NAKs on ACKNOWLEDGE. Recoverable refusals (trimmed, PSN
    out of the window) are NETH NACKs with a :class:`NackReason`."""
    INVALID_REQUEST = 1         #: unsupported opcode, illegal opcode sequence, bad length.
    REMOTE_ACCESS = 2           #: rkey/protection domain/bounds check failed; nothing written.
    REMOTE_OPERATIONAL = 3      #: the responder cannot complete (QP not ready, internal error).


def nak_syndrome(code):
    return AETH_NAK_BASE | NakCode(code)


def syndrome_nak_code(syndrome):
    """The :class:`NakCode` of an AETH syndrome, or ``None`` for an ACK."""
    if syndrome & AETH_KIND_MASK != AETH_NAK_BASE:
        return None
    return NakCode(syndrome & 0x1F)


SACK_BITMAP_BITS = 64           #: PSNs one SETH bitmap covers [MRC 1.0].

# Trimming: a switch under congestion forwards the headers, drops the payload and marks the
# packet with this DSCP code point (configurable per NIC; this is the default).
DEFAULT_TRIM_DSCP = 33          #: *project choice*
ECN_CE = 0b11

# ---------------------------------------------------------------------------------------------
# MRC 1.0 codes (OCP MRC 1.0 tables, as the public references cite them)
# ---------------------------------------------------------------------------------------------

class NackReason(enum.IntEnum, shape=8):
    """NETH ``nack_reason``."""
    TRIMMED = 0x01
    TRIMMED_LASTHOP = 0x02
    NO_BITMAP = 0x06
    NO_PKT_BUFFER = 0x07
    NO_RESOURCE = 0x0A
    PSN_OOR_WINDOW = 0x0B
    UNEXP_EVENT = 0x19


class SackMark(enum.IntEnum, shape=2):
    """SETH ``m``: what the SACK says about the EV of the packet that triggered it."""
    NONE = 0
    SKIP_ONCE = 1               #: CE seen: GOOD -> SKIP
    ALWAYS_SKIP = 2             #: GOOD -> ASSUMED_BAD


class WireEvState(enum.IntEnum, shape=2):
    """EV states on the wire and in the tables (``mrc_ctl.h``'s values, :class:`EvState`,
    stay in the driver API)."""
    GOOD = 0
    DENIED = 1
    SKIP = 2                    #: skipped until time-based recovery
    ASSUMED_BAD = 3


class EndpointOp(enum.IntEnum, shape=2):
    """ERTH/EETH ``op``."""
    PORT_STATUS_UPDATE = 0
    EV_PROBE = 1


class Ftype(enum.IntEnum, shape=4):
    """TSETH/PETH/ERTH ``ftype``."""
    TIMESTAMP = 1


# ---------------------------------------------------------------------------------------------
# Control-plane enumerations (OCP MRC API headers)
# ---------------------------------------------------------------------------------------------


class EvState(enum.IntEnum, shape=3):
    """EV states, numeric values as in ``mrc_ctl.h``."""
    GOOD = 1
    ASSUMED_BAD = 2
    DENIED = 4


class EvMode(enum.IntEnum, shape=2):
    """How an EV profile's array is obtained."""
    EXPLICIT = 0                #: the controller writes the array.
    GENERATED = 1               #: the NIC generates it from per-field definitions.
    AUTO = 2                    #: one hashed EV per QP (the ECMP-like baseline).


class EvFormatMode(enum.IntEnum, shape=2):
    """Where an expanded EV lands in the packet headers."""
    STEV = 0                    #: IPv6 flow label (20 bits) + UDP source port (16 bits).
    UDP = 1                     #: UDP source port only.
    SRV6 = 2                    #: outer IPv6 destination address, optional SRH segment.


#: Bits an expanded EV occupies for each format mode.
EV_FORMAT_CAPACITY_BITS = {EvFormatMode.STEV: 36, EvFormatMode.UDP: 16, EvFormatMode.SRV6: 256}
EV_MAX_BYTES = 32               #: an EV value is at most 32 bytes.
EV_FORMAT_MAX_FIELDS = 16       #: *project choice*


class ProfileState(enum.IntEnum, shape=2):
    """EV format profile / EV profile life cycle: INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT."""
    INIT = 0
    OFFLINE = 1
    ONLINE = 2


class QpState(enum.IntEnum, shape=3):
    """QP states, numbered as in ibverbs."""
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 6


class QpCapability(enum.IntFlag, shape=3):
    TRIM_NACK = 0x1
    DYNAMIC_MPR = 0x2
    SVC_TIME = 0x4


class CompletionStatus(enum.IntEnum, shape=5):
    """Work completion status, numbered as ibverbs' ``ibv_wc_status``."""
    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    BAD_RESP_ERR = 7
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12


class WrOpcode(enum.IntEnum, shape=3):
    """Work-request opcodes, numbered as ibverbs' ``ibv_wr_opcode``. MRC performs only the two
    RDMA WRITE forms; the others are refused at the work-request interface with a
    ``LOC_QP_OP_ERR`` completion and never reach the wire."""
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6


SUPPORTED_WR_OPCODES = frozenset({WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM})


class WcOpcode(enum.IntEnum, shape=8):
    """Work-completion opcodes, numbered as ibverbs' ``ibv_wc_opcode``."""
    RDMA_WRITE = 1                  #: requester: an RDMA WRITE (with or without immediate) done
    RECV_RDMA_WITH_IMM = 129        #: responder: a WRITE WITH IMMEDIATE has fully arrived


class FeedbackKind(enum.IntEnum, shape=3):
    """Path feedback from ACK/NACK processing and the retransmit timer to path selection."""
    ACKED = 0                   #: a packet on this EV was acknowledged: the path works.
    ECN = 1                     #: acknowledged with ECN echo: a small penalty.
    TRIMMED = 2                 #: trimmed by a switch: congestion, a larger penalty.
    LOST = 3                    #: inferred loss or timeout: ASSUMED_BAD, floor permitting.
    PROBE_OK = 4                #: a probe on this EV was answered.


class Errno(enum.IntEnum, shape=8):
    """Error codes of refused control operations, Linux values as ``mrc_ctl.h`` returns them
    (negated there). 0 means the operation was done."""
    OK = 0
    ENOENT = 2                  #: no such QP, profile or entry.
    E2BIG = 7                   #: more entries/fields than the build holds.
    EBUSY = 16                  #: the object is in a state that forbids this (e.g. ONLINE).
    EINVAL = 22                 #: a bad argument or an illegal state transition.


# Timers and retries (mrc.h)
LOCAL_ACK_TIMEOUT_MAX = 24      #: t in 1.024 us * 2**t
RETRY_LINEAR_MAX = 7
RETRY_EXPONENTIAL_MAX = 25
RETRY_INFINITE = 25             #: an exponential count of 25 retries forever


def local_ack_timeout_ns(t):
    """Local ACK timeout for exponent ``t``: 1.024 us * 2**t, in nanoseconds."""
    if not isinstance(t, int) or not 0 <= t <= LOCAL_ACK_TIMEOUT_MAX:
        raise ValueError(f"Local ACK timeout exponent must be an integer from 0 to "
                         f"{LOCAL_ACK_TIMEOUT_MAX}, not {t!r}")
    return 1024 << t


# ---------------------------------------------------------------------------------------------
# PSN serial-number arithmetic (24 bits, RFC 1982 style)
# ---------------------------------------------------------------------------------------------

def psn_add(psn, n):
    return (psn + n) % PSN_MODULUS


def psn_diff(a, b):
    """Signed distance ``a - b`` in PSN space, in ``[-2**23, 2**23)``."""
    d = (a - b) % PSN_MODULUS
    return d - PSN_MODULUS if d >= PSN_MODULUS // 2 else d


def psn_lt(a, b):
    return psn_diff(a, b) < 0
