"""Helpers shared by the property wrappers."""

from amaranth import *
from amaranth.asserts import AnySeq

from .. import protocol as P
from ..config import NicConfig

__all__ = ["psn_ge", "psn_gt", "drive_free", "stream_xfer", "check_wrapper"]


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


def check_wrapper(config, check, checks):
    """A property wrapper's parameters: ``config`` a :class:`~hdl.config.NicConfig`, ``check``
    one of ``checks`` (call inside ``validating``)."""
    if not isinstance(config, NicConfig):
        raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
    if check not in checks:
        raise ValueError(f"Check must be one of {', '.join(checks)}, not {check!r}")
