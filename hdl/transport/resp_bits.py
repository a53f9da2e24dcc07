"""Small bit-level building blocks of the responder's execute stage: log-depth trees, no
carry chains where a tree will do."""

from amaranth import *
from amaranth.utils import ceil_log2

from ..util import as_signal

__all__ = ["popcount", "or_all", "lowest_set"]


def popcount(bits):
    """The number of set bits of ``bits``, an adder tree."""
    values = [bits[i] for i in range(len(bits))]
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def or_all(values):
    """The OR of ``values`` (the cheapest select among values of which at most one is not 0)."""
    result = values[0]
    for value in values[1:]:
        result = result | value
    return result


def lowest_set(m, bits, name):
    """Index of the lowest set bit of ``bits``, or ``len(bits)`` when none is.

    A log-depth tree of (found, index) pairs: no carry chain (``x & -x`` would be one wide
    adder, slow to place and slow to elaborate)."""
    width = len(bits)
    index_bits = max(1, ceil_log2(width + 1))
    if not isinstance(bits, Signal):
        bits = as_signal(m, bits, f"{name}_bits")       # each bit is read below
    nodes = [(bits[i], C(0, index_bits)) for i in range(width)]
    span = 1
    while len(nodes) > 1:
        merged = []
        for k in range(0, len(nodes), 2):
            if k + 1 == len(nodes):
                merged.append(nodes[k])
                continue
            (found_lo, index_lo), (found_hi, index_hi) = nodes[k], nodes[k + 1]
            # Signals, not expressions: each is read twice by the next level, and an
            # expression would be lowered once per read (doubling per level).
            found = Signal(name=f"{name}_f{span}_{k}")
            index = Signal(index_bits, name=f"{name}_i{span}_{k}")
            m.d.comb += [found.eq(found_lo | found_hi),
                         index.eq(Mux(found_lo, index_lo, index_hi | C(span, index_bits)))]
            merged.append((found, index))
        nodes = merged
        span *= 2
    found, lowest = nodes[0]
    index = Signal(range(width + 1), name=name)
    m.d.comb += index.eq(Mux(found, lowest, width))
    return index
