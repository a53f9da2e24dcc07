"""Gateware pieces shared by the requester's engines (:mod:`hdl.transport.requester`):
serial-number arithmetic on PSNs, bit tricks, the control signature every engine reads and
the counter-event ports.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from .. import protocol as P
from ..config import NicConfig
from .req_defs import ACKREQ_EVERY_BITS, INFER_K_BITS, REO_WND_BITS

__all__ = [
    "PSN", "WIMM_BITS", "log2", "psn_sub", "psn_ge", "psn_gt", "clamp", "at_or_above",
    "ones", "circular_span", "rotate_left",
    "popcount", "kth_highest", "data_opcode", "ControlSignature", "events_layout",
    "check_config", "check_depth", "check_observe",
]

PSN = P.PSN_BITS
#: WRITE_IMM counters: in flight = started - done (mod 512) <= 255.
WIMM_BITS = 9


def log2(n):
    """Bits of an index below ``n``."""
    return (n - 1).bit_length()


def psn_sub(a, b):
    """``a - b`` modulo 2**24 (serial-number distance, non-negative view)."""
    return (a - b)[:PSN]


def psn_ge(a, b):
    """``psn_diff(a, b) >= 0``."""
    return ~psn_sub(a, b)[PSN - 1]


def psn_gt(a, b):
    """``psn_diff(a, b) > 0``."""
    return psn_ge(a, b) & (a != b)


def clamp(distance, limit):
    """A 24-bit serial distance clamped to ``[0, limit]`` (negative -> 0)."""
    bits = limit.bit_length()
    if limit & (limit - 1) == 0:    # a power of two: at or over it is a high bit set
        over = distance[bits - 1:PSN - 1].any()
    else:
        over = distance >= limit
    return Mux(distance[PSN - 1], 0, Mux(over, limit, distance[:bits]))


def at_or_above(value, width):
    """Bits ``i`` in ``[0, width)`` (a power of two) set where ``i >= value`` (none when
    ``value`` is ``width`` or more). A two-level decode, no compare per bit: the value's
    high and low halves are each decoded once (which high half it has, which it is below,
    which low halves it is at or under), and each bit is one small function of three of
    those lines."""
    bits = log2(width)
    value = Value.cast(value)
    over = value[bits:].any() if len(value) > bits else C(0)
    low_bits = bits // 2
    v_low, v_high = value[:low_bits], value[low_bits:bits]
    high_is = [v_high == j for j in range(1 << (bits - low_bits))]
    high_below = [Cat(*high_is[:j]).any() if j else C(0) for j in range(len(high_is))]
    if low_bits:
        low_is = [v_low == k for k in range(1 << low_bits)]
        low_at_most = [Cat(*low_is[:k + 1]).any() for k in range(len(low_is))]
    else:
        low_at_most = [C(1)]
    lows = len(low_at_most)
    return Cat(*(~over & (high_below[i // lows] | (high_is[i // lows] & low_at_most[i % lows]))
                 for i in range(width)))


def ones(count, width):
    """``count`` low bits set, ``count`` from 0 to ``width``: the bits below ``count``
    (:func:`at_or_above`, inverted; no shifter and no borrow chain across ``width`` bits)."""
    return ~at_or_above(count, width)


def circular_span(start, end, width):
    """The bits from ``start`` up to ``end`` (not included), wrapping at ``width`` (a power
    of two); every bit when ``start == end`` (callers gate an empty run)."""
    bits = log2(width)
    from_start = at_or_above(start, width)
    from_end = at_or_above(end, width)
    wraps = end[:bits] <= start[:bits]
    return Mux(wraps, from_start | ~from_end, from_start & ~from_end)


def rotate_left(value, amount, width):
    return (Cat(value, value) << amount)[width:2 * width]


def popcount(value):
    return sum((value[i] for i in range(len(value))), C(0, 1))


def kth_highest(byte, rank):
    """Position (0-7) of the ``rank``-th highest set bit of an 8-bit ``byte``."""
    position = C(0, 3)
    for i in range(8):
        above = popcount(byte[i:])
        position = Mux(byte[i] & (above == rank), i, position)
    return position


class ControlSignature(wiring.Signature):
    """What the control FSM (:class:`~hdl.transport.req_control.RequesterControl`) tells the
    engines, from the control's side (every member an output).

    Members
    -------
    hold : ``Out(1)``
        A command is being decided: the pipelines may not start anything that writes a QP
        table.
    write : ``Out(1)``
        This cycle an accepted QP_WRITE resets QP ``qpn`` in every table; each table's owner
        muxes the reset into its write port, ahead of its own write.
    flush : ``Out(1)``
        This cycle a QP_WRITE ERROR fails QP ``qpn`` with WRs outstanding (ACK processing
        writes the error and queues the completion trigger).
    qpn, psn, mpr : ``Out(...)``
        The command's QP, start PSN and MPR.
    flush_una : ``Out(24)``
        The QP's una, for the flush's error PSN.
    flush_trigger, flush_trigger_bit : ``Out(1)``
        The flush queues a completion trigger (none is queued for the QP yet), with this bit.
    ackreq_every, infer_k, reo_wnd, cc_on, cc_nscc : ``Out(...)``
        The CONFIG settings (``cc_nscc``: the congestion window is NSCC's, not the ECN
        window; always 0 in a build without NSCC).
    """

    def __init__(self, config):
        super().__init__({
            "hold": Out(1),
            "write": Out(1),
            "flush": Out(1),
            "qpn": Out(config.qpn_bits),
            "psn": Out(PSN),
            "mpr": Out(4),
            "flush_una": Out(PSN),
            "flush_trigger": Out(1),
            "flush_trigger_bit": Out(1),
            "ackreq_every": Out(ACKREQ_EVERY_BITS),
            "infer_k": Out(INFER_K_BITS),
            "reo_wnd": Out(REO_WND_BITS),
            "cc_on": Out(1),
            "cc_nscc": Out(1),
        })


def events_layout(names):
    """One bit per counter an engine increments: the requester adds each to its counter."""
    return data.StructLayout({name: 1 for name in names})


def data_opcode(first, last, imm):
    """The BTH opcode of an RDMA WRITE packet: its place in the message, with immediate data
    on the last."""
    return Mux(first & last, Mux(imm, P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                                 P.Opcode.RDMA_WRITE_ONLY),
           Mux(first, P.Opcode.RDMA_WRITE_FIRST,
           Mux(last, Mux(imm, P.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE,
                         P.Opcode.RDMA_WRITE_LAST),
               P.Opcode.RDMA_WRITE_MIDDLE)))


def check_config(config):
    """An engine's ``config`` parameter: a :class:`~hdl.config.NicConfig`."""
    if not isinstance(config, NicConfig):
        raise TypeError(f"Configuration must be a NicConfig, not {config!r}")


def check_depth(name, depth):
    """A queue depth parameter: an integer of at least 2."""
    if not isinstance(depth, int) or depth < 2:
        raise ValueError(f"{name} must be an integer of at least 2, not {depth!r}")


def check_observe(observe):
    """An engine's ``observe`` parameter: a bool (observation ports for the formal proofs)."""
    if not isinstance(observe, bool):
        raise TypeError(f"Observe must be a bool, not {observe!r}")
