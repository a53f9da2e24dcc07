"""A tiny design for checking the harness itself: a PSN-like 24-bit cumulative counter.

:class:`SerialCounter` advances by a free amount from 0 to 128 each cycle (like a cumulative
PSN) and asserts that it never moves backwards in serial arithmetic. With
``backwards_bug=True`` it steps back by one whenever its low four bits are 0xF and the amount
is 0: a reachable violation that the harness must report as FAIL, so a PASS means something.
"""

from amaranth import *
from amaranth.asserts import AnySeq
from amaranth.hdl import Assert, Assume

from .common import psn_ge

__all__ = ["SerialCounter"]


class SerialCounter(Elaboratable):
    def __init__(self, *, backwards_bug=False):
        self.backwards_bug = backwards_bug

    def elaborate(self, platform):
        m = Module()
        count = Signal(24)
        prev = Signal(24)
        started = Signal()
        amount = Signal(8)
        m.d.comb += [amount.eq(AnySeq(8)), Assume(amount <= 128), Assume(~ResetSignal())]
        step = Mux(self.backwards_bug & (amount == 0) & (count[:4] == 0xF), -1, amount)
        m.d.sync += [count.eq(count + step), prev.eq(count), started.eq(1)]
        # 128 per step never crosses half the PSN space, so the check is inductive (k = 1).
        m.d.comb += Assert(~started | psn_ge(count, prev))
        return m
