"""Small bit-level building blocks of the responder's execute stage: log-depth trees, no
carry chains where a tree will do, and sums made before the index that selects them."""

from amaranth import *
from amaranth.utils import ceil_log2

from ..util import as_signal

__all__ = ["popcount", "or_all", "lowest_set", "prefix_counts", "select_sum"]


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


def prefix_counts(m, bits, name):
    """``[popcount(bits[:k]) for k in 0 .. len(bits)]``, a parallel prefix (log depth, half
    the adders of one count per prefix), each as a Signal."""
    width = len(bits)
    count_bits = max(1, ceil_log2(width + 1))
    counts = [bits[i] for i in range(width)]
    span = 1
    while span < width:
        # Sklansky: each element in the upper half of a 2 * span block adds the total of the
        # lower half (the block's element span - 1, finished at the previous level).
        merged = []
        for i, count in enumerate(counts):
            if (i // span) % 2:
                count = as_signal(m, (count + counts[(i // span) * span - 1])[:count_bits],
                                  f"{name}_l{span}_{i}")
            merged.append(count)
        counts = merged
        span *= 2
    return [C(0, count_bits)] + [as_signal(m, count, f"{name}_{i + 1}")
                                 for i, count in enumerate(counts)]


def select_sum(m, base, increments, index, name):
    """``(base + increments[index])`` modulo ``2**len(base)``, each sum made before ``index``
    (which may come late) selects it: the low bits of every sum and the high bits plus one
    are added from ``base`` and the increments, so after the index only a select and the
    choice of the high bits by the selected carry remain (no carry chain). ``increments``
    are small: at most ``len(base)`` bits wide."""
    width = len(base)
    low_bits = max(len(Value.cast(inc)) for inc in increments)
    if low_bits >= width:
        sums = [as_signal(m, (base + inc)[:width], f"{name}_sum{k}")
                for k, inc in enumerate(increments)]
        return as_signal(m, Array(sums)[index], name)
    high = base[low_bits:]
    high_up = as_signal(m, (high + 1)[:width - low_bits], f"{name}_high_up")
    # The low bits of each sum with their carry out.
    lows = [as_signal(m, base[:low_bits] + inc, f"{name}_low{k}")
            for k, inc in enumerate(increments)]
    low = as_signal(m, Array(lows)[index], f"{name}_low")
    return as_signal(m, Cat(low[:low_bits], Mux(low[low_bits], high_up, high)), name)
