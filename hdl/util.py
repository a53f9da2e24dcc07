"""Small helpers shared by the gateware."""

from contextlib import contextmanager

from amaranth.hdl import Cat, Const, Mux, Signal, Value

__all__ = ["validating", "as_signal", "shift_right", "shift_left", "onehot", "below_mask", "any_of",
           "onehot_select", "REPLICA_TAG", "chunks"]


@contextmanager
def validating(component):
    """Wrap a component's parameter checks: if one fails, the half-built component is marked
    as deliberately unused, so Amaranth's ``UnusedElaboratable`` warning does not bury the
    real error (and does not fail a test suite that turns warnings into errors)."""
    try:
        yield
    except Exception:
        component._MustUse__silence = True
        raise


# Variable shifts written as explicit logarithmic stages, each stage a Signal. Amaranth's
# ``>>``/``<<`` by a signal is one cell whose every output bit depends on every input bit; on
# the window-wide bitmaps of the trackers that makes elaboration's combinational-loop check
# quadratic. And an expression (not a Signal) is lowered again at every place it is used, so
# a stage that reads the previous stage twice must read a Signal, or the copies double per
# stage.

def as_signal(m, value, name):
    """``value`` as a Signal named ``name`` (driven combinationally): an expression read in
    many places would otherwise be lowered again at every read."""
    value = Value.cast(value)
    signal = Signal(len(value), name=name)
    m.d.comb += signal.eq(value)
    return signal


def shift_right(m, value, amount, *, name="shr"):
    """``value >> amount`` (zero fill), same width as ``value``, in log2 stages of muxes."""
    value = as_signal(m, value, f"{name}_in")
    amount = as_signal(m, amount, f"{name}_by")
    width = len(value)
    for stage in range(len(amount)):
        step = 1 << stage
        shifted = Const(0, width) if step >= width else Cat(value[step:], Const(0, step))
        value = as_signal(m, Mux(amount[stage], shifted, value), f"{name}_{stage}")
    return value


def shift_left(m, value, amount, *, name="shl"):
    """``(value << amount)`` truncated to the width of ``value``, in log2 stages of muxes."""
    value = as_signal(m, value, f"{name}_in")
    amount = as_signal(m, amount, f"{name}_by")
    width = len(value)
    for stage in range(len(amount)):
        step = 1 << stage
        shifted = Const(0, width) if step >= width else Cat(Const(0, step), value[:width - step])
        value = as_signal(m, Mux(amount[stage], shifted, value), f"{name}_{stage}")
    return value


def onehot(m, index, width, *, name="onehot"):
    """A ``width``-bit vector with only bit ``index`` set (none if ``index >= width``)."""
    index = as_signal(m, index, f"{name}_index")
    return as_signal(m, Cat(index == position for position in range(width)), name)


def below_mask(m, count, width, *, name="below"):
    """A ``width``-bit vector with bits ``0 .. count-1`` set."""
    count = as_signal(m, count, f"{name}_count")
    return as_signal(m, Cat(count > position for position in range(width)), name)


def any_of(values):
    """The OR of ``values`` (a balanced tree is left to synthesis)."""
    acc = values[0]
    for value in values[1:]:
        acc = acc | value
    return acc


def onehot_select(hot, values):
    """``values[i]`` where bit ``i`` of the one-hot ``hot`` is set, as an AND-OR (no decode in
    front of the select); 0 when no bit is set."""
    return any_of([Mux(hot[i], value, 0) for i, value in enumerate(values)])


#: Name fragment of a register copy made to split a fan-out (one copy per chunk of the bits
#: it steers): the board builds mark the flip-flops driving such wires ``keep``, so that Yosys
#: does not merge the copies back into one (``boards/build.py``).
REPLICA_TAG = "_replica"


def chunks(width, step):
    """``(lo, hi)`` bit ranges of at most ``step`` bits that cover ``width`` bits, in order."""
    return [(lo, min(lo + step, width)) for lo in range(0, width, step)]
