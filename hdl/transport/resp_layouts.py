"""The responder's table rows and the layouts its components pass each other, defined once.

Used by the components of :mod:`hdl.transport.responder` (admission, execute, reply) and by
:func:`~hdl.transport.responder.responder_tables` (the block RAM budget).
"""

from amaranth.lib import data
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..packet.headers import PORT_BITS, PacketKind, packet_beat_layout
from .resp_defs import PD_BITS, RCVD_BYTES_BITS, responder_command_layout

__all__ = ["CHUNK", "ResponderLayouts", "responder_layouts", "reply_layout", "op_layout",
           "OP_FIRST", "OP_BEAT", "OP_CONT", "OP_TIMER", "OP_CTL"]

#: What an operation in the pipeline is: a packet's first beat (or a reliability probe), a
#: further payload beat, a continued advance step, an ACK-delay timer, a control command.
OP_FIRST, OP_BEAT, OP_CONT, OP_TIMER, OP_CTL = range(5)

#: PSNs the cumulative PSN advances by at most in one execute step. A longer run of received
#: PSNs (a hole filled under many out-of-order arrivals) takes one more step per CHUNK PSNs,
#: so the advance logic searches and shifts CHUNK + 1 bits, never the whole window.
CHUNK = 16


class ResponderLayouts:
    """The rows of the responder's tables for ``config`` (read-only attributes).

    Members
    -------
    qp : the QP table's row
    bitmaps : the three W-bit bitmaps (bit i is PSN expected + i)
    wimm_row : ``max_wimm`` pending WRITE_IMM entries {valid, position, imm}
    mr : an MR table entry
    template : the packet a reply answers (what an ACK-delay timer keeps of it)
    timer : an ACK-delay timer entry
    state : a QP's whole row: ``{qp, bm, wt}``
    """

    def __init__(self, config):
        window = config.window_psns
        pos_bits = max(1, ceil_log2(window))
        self.qp = data.StructLayout({
            "state": 3, "remote_qpn": 24, "pd": PD_BITS, "mpr": 4, "caps": 3, "max_wimm": 8,
            "epsn": 24,                 # expected PSN: cumulative PSN + 1
            "epos": pos_bits,           # epsn modulo the window: WRITE_IMM entries' positions
            "msn": 24, "ack_count": 8, "nak_armed": 1, "last_nak": 32,
            "above": range(window + 1),  # PSNs received above the expected one (set rcv bits)
            "rcvd_bytes": RCVD_BYTES_BITS,  # payload bytes placed, modulo 2**24 (CC_STATE)
            # The TSETH timestamp of the last packet placed: what a delayed ACK echoes.
            "last_ts": P.TIMESTAMP_BITS,
            # WRITE_IMMs pending (valid `wimm_table` entries), kept here so that the
            # WIMM_OVERFLOW check is a compare of the entry, not a count of valid bits.
            "wimm_count": range(config.max_wimm + 1),
        })
        # Bit i of each bitmap is PSN epsn + i: an advance shifts them, a placement sets one.
        self.bitmaps = data.StructLayout({"rcv": window, "last": window, "wimm": window})
        wimm_entry = data.StructLayout({"valid": 1, "pos": pos_bits, "imm": 32})
        self.wimm_row = data.ArrayLayout(wimm_entry, config.max_wimm)
        # `limit` = base + length, summed when the MR is written (no adder behind the read).
        self.mr = data.StructLayout({"valid": 1, "rkey": 32, "pd": PD_BITS, "base": 64,
                                     "limit": 65})
        self.template = data.StructLayout({
            "port": PORT_BITS, "eth_src": 48, "eth_dst": 48, "vlan_valid": 1, "vlan_tci": 16,
            "ipv6": 1, "ip_src": 128, "ip_dst": 128, "flow_label": 20, "udp_sport": 16,
            "psn": 24, "tx_ts": P.TIMESTAMP_BITS, "ce": 1,
        })
        self.timer = data.StructLayout({"deadline": 32, "qpn": config.qpn_bits,
                                        "template": self.template})
        self.state = data.StructLayout({"qp": self.qp, "bm": self.bitmaps,
                                        "wt": self.wimm_row})


def op_layout(config):
    """An operation in S1 or S2: its kind (``OP_*``), the beat (a packet's), the QP it
    addresses, the command or the timer entry."""
    return data.StructLayout({
        "kind": range(5), "beat": packet_beat_layout(config), "qpn": config.qpn_bits,
        "cmd": responder_command_layout(config), "timer": responder_layouts(config).timer,
    })


def responder_layouts(config):
    """:class:`ResponderLayouts` of ``config``."""
    return ResponderLayouts(config)


def reply_layout(config):
    """A reply on its way to the reply stage: the decision (its kind and the few fields the
    execute stage computes), the packet it answers, and what the SACK bitmap is cut from (the
    receive bitmap after this packet's bit is set). The reply stage builds the header from
    these registers, so the verdict drives a few bits here, not a whole header.

    The fields that depend on the step's advance (the cumulative PSN, the offsets, where the
    bitmap starts) are not computed in the execute stage: it registers the expected PSN before
    the step (``epsn``), the ``advance``, and what it can compute without the advance from the
    trigger's distance ``dist`` = trigger PSN - ``epsn``
    (:func:`~hdl.transport.resp_reply.reply_fields` finishes them)."""
    return data.StructLayout({
        "kind": PacketKind,         # SACK, NACK or AETH
        "tmpl": responder_layouts(config).template,     # the trigger
        "dqpn": 24,
        "nack_reason": 8, "nak_code": 5, "msn": 24,
        "probe": 1, "probe_id": 16, "mpr": 4,
        "ooo_count": 15, "rcvd_bytes": RCVD_BYTES_BITS,
        "epsn": 24, "advance": range(CHUNK + 1), "dist": 24,
        "block_shift": 16,          # the trigger's 64-aligned block - epsn (low bits)
        # Whether the bitmap starts at the trigger's block (trigger - cack_psn in 65 ..
        # 2**23 - 1): at once (`far`), or by a compare of the advance with a small bound
        # (`near_lo`: advance <= `lo_max`; `near_hi`: advance >= `hi_min`).
        "far": 1, "near_lo": 1, "lo_max": range(CHUNK + 1), "near_hi": 1, "hi_min": 5,
        "rcv": config.window_psns,
    })
