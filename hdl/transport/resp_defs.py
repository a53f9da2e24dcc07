"""Responder constants, enumerations and the control-command layout.

Shared by the gateware (:mod:`hdl.transport.responder`) and the reference model
(:mod:`sim.model.responder`), so a verdict, a command or a default has one definition.
"""

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .. import protocol as P

__all__ = [
    "ResponderVerdict", "ResponderCommand", "PD_BITS", "ACK_TCLASS", "ACK_HOP_LIMIT",
    "DEFAULT_ACK_EVERY", "DEFAULT_ACK_DELAY", "DEFAULT_NAK_INTERVAL", "DEFAULT_COALESCE_GAPS",
    "DEFAULT_GAP_DEPTH", "DEFAULT_ACK_NEW_HOLES", "VERDICT_NAK", "VERDICT_NACK",
    "OOO_COUNT_MAX", "RCVD_BYTES_BITS",
    "responder_command_layout", "responder_response_layout", "RESPONDER_COUNTERS",
]

#: Width of a protection-domain number in the QP and MR tables (*project choice*).
PD_BITS = 16
#: Traffic class of SACKs, NACKs and NAKs: DSCP 0, ECN ECT(0). Never the trim code point, so an
#: acknowledgement cannot be mistaken for a trimmed packet (*project choice*).
ACK_TCLASS = 0b10
#: IP hop limit / TTL of SACKs, NACKs and NAKs, as ``sim.packets`` builds them.
ACK_HOP_LIMIT = 64
#: CC_STATE ``ooo_count`` (15 bits) saturates here: the PSNs the QP holds received above its
#: expected PSN (every one waits for a hole below it to fill).
OOO_COUNT_MAX = (1 << 15) - 1
#: CC_STATE ``rcvd_bytes``: payload bytes the QP placed, modulo 2**24.
RCVD_BYTES_BITS = 24

# Reset values of the CONFIG registers (*project choice*).
# The ACK policy (docs/responder.md, "The default ACK policy"): coalesced, out-of-order
# arrivals included, with an ACK at once for a CE mark, ackreq, a trim (NACK) and a hole
# gap_depth deep.
DEFAULT_ACK_EVERY = 16          #: ACK every 16 packets ...
DEFAULT_ACK_DELAY = 4096        #: ... or 4096 cycles (33 us at 125 MHz) after the first unACKed one
DEFAULT_NAK_INTERVAL = 1024     #: at most one out-of-window NAK per QP per 1024 cycles
DEFAULT_COALESCE_GAPS = 1       #: out-of-order arrivals coalesced like in-order ones ...
DEFAULT_GAP_DEPTH = 8           #: ... but the 8th PSN above a hole ACKed at once (K = 8)
DEFAULT_ACK_NEW_HOLES = 0       #: a new hole not ACKed at once (under spraying most are reordering)
GAP_DEPTH_BITS = 4              #: CONFIG gap_depth: 0 (off) .. 15


class ResponderVerdict(enum.Enum, shape=4):
    """What the responder did with a received data packet, in the order the checks run."""
    PLACED = 0          #: new, in window, valid: written to memory and marked received
    BAD_QP = 1          #: QPN >= qps: AETH NAK REMOTE_OPERATIONAL
    BAD_STATE = 2       #: QP not in RTR or RTS: AETH NAK REMOTE_OPERATIONAL
    BAD_SEQUENCE = 3    #: not a data opcode, or a FIRST/MIDDLE not exactly one MTU: NAK INVALID
    DUPLICATE = 4       #: PSN below the cumulative PSN or already received: SACKed again
    OUT_OF_WINDOW = 5   #: PSN at or beyond expected + MPR: NACK PSN_OOR_WINDOW, rate limited
    TRIMMED = 6         #: payload trimmed by a switch: NACK TRIMMED if the QP has TRIM_NACK
    BAD_RKEY = 7        #: no valid MR with this rkey in the QP's PD: NAK REMOTE_ACCESS
    OUT_OF_BOUNDS = 8   #: the write leaves the MR: NAK REMOTE_ACCESS
    WIMM_OVERFLOW = 9   #: a WRITE_IMM beyond the QP's max_wimm pending: NAK INVALID_REQUEST


#: The AETH NAK code each fatal verdict answers with (RoCE's fatal errors, on ACKNOWLEDGE).
VERDICT_NAK = {
    ResponderVerdict.BAD_QP: P.NakCode.REMOTE_OPERATIONAL,
    ResponderVerdict.BAD_STATE: P.NakCode.REMOTE_OPERATIONAL,
    ResponderVerdict.BAD_SEQUENCE: P.NakCode.INVALID_REQUEST,
    ResponderVerdict.BAD_RKEY: P.NakCode.REMOTE_ACCESS,
    ResponderVerdict.OUT_OF_BOUNDS: P.NakCode.REMOTE_ACCESS,
    ResponderVerdict.WIMM_OVERFLOW: P.NakCode.INVALID_REQUEST,
}
#: The NETH nack_reason each recoverable refusal answers with (TRIMMED: only with the
#: TRIM_NACK capability).
VERDICT_NACK = {
    ResponderVerdict.OUT_OF_WINDOW: P.NackReason.PSN_OOR_WINDOW,
    ResponderVerdict.TRIMMED: P.NackReason.TRIMMED,
}


class ResponderCommand(enum.Enum, shape=2):
    """Control commands of the responder (``ctl`` stream); errnos in ``docs/responder.md``."""
    QP_WRITE = 0
    QP_READ = 1
    MR_WRITE = 2
    CONFIG = 3


def responder_command_layout(config):
    """One control command. Fields a command does not use are ignored."""
    return data.StructLayout({
        "cmd": ResponderCommand,
        # QP_WRITE / QP_READ
        "qpn": unsigned(P.QPN_BITS),
        "state": unsigned(3),
        "remote_qpn": unsigned(P.QPN_BITS),
        "pd": unsigned(PD_BITS),
        "psn": unsigned(P.PSN_BITS),
        "set_psn": unsigned(1),
        "mpr": unsigned(4),
        "caps": unsigned(3),
        "max_wimm": unsigned(8),
        # MR_WRITE (pd above)
        "slot": unsigned(16),
        "valid": unsigned(1),
        "rkey": unsigned(32),
        "base": unsigned(64),
        "length": unsigned(64),
        # CONFIG
        "ack_every": unsigned(8),
        "ack_delay": unsigned(32),
        "nak_interval": unsigned(32),
        # 1: an out-of-order arrival is ACKed like an in-order one (every ack_every packets
        # or after ack_delay), not at once: fewer ACKs under spraying, the SACK bitmap
        # still carries every arrival. 0 (reset): at once.
        "coalesce_gaps": unsigned(1),
        # 1..15: a packet placed above a hole that makes it the gap_depth-th PSN received
        # above the hole is ACKed at once, even with coalesce_gaps: the ACK whose SACK
        # bitmap lets a requester with infer_k <= gap_depth infer the loss leaves without
        # waiting for ack_every or ack_delay. 0 (reset): off.
        "gap_depth": unsigned(GAP_DEPTH_BITS),
        # 1: a packet that opens a new hole (placed above the expected PSN while the PSN just
        # below it has not arrived) is ACKed at once, even with coalesce_gaps: the requester
        # sees the hole one ACK after it appears. 0: off.
        "ack_new_holes": unsigned(1),
    })


def responder_response_layout(config):
    """One response per command, in command order. QP_READ data: bits 0-2 state, 8-31 expected
    PSN, 32-55 MSN, 56-63 WRITE_IMMs pending; other commands: 0."""
    return data.StructLayout({"errno": P.Errno, "data": unsigned(64)})


#: Names of the 32-bit counters, in the order of the ``counters`` struct.
RESPONDER_COUNTERS = (
    "placed", "duplicate", "out_of_window", "bad_qp", "bad_state", "bad_rkey", "out_of_bounds",
    "bad_sequence", "wimm_overflow", "trimmed", "acks", "naks", "naks_suppressed",
    "completions", "probes", "probes_dropped",
)
