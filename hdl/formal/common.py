"""Helpers shared by the property wrappers."""

from amaranth import *
from amaranth.asserts import AnySeq

from .. import protocol as P

__all__ = ["psn_ge", "psn_gt", "drive_free", "stream_xfer"]


def psn_ge(a, b):
    """``psn_diff(a, b) >= 0`` in 24-bit serial arithmetic."""
    return ~(a - b)[P.PSN_BITS - 1]


def psn_gt(a, b):
    """``psn_diff(a, b) > 0``."""
    return psn_ge(a, b) & (a[:P.PSN_BITS] != b[:P.PSN_BITS])


def drive_free(m, *values):
    """Drive each value from a fresh ``AnySeq``: a free input, new every step."""
    for value in values:
        m.d.comb += value.eq(AnySeq(len(Value.cast(value))))


def stream_xfer(s):
    return s.valid & s.ready
