"""Register slice: a two-entry skid buffer that cuts every combinational path of a stream.

Between two large blocks (the port arbiter and the parser, the header builder and the port
demux) the forward path (``valid``, payload) and the backward path (``ready``) would otherwise
chain the producer's output logic into the consumer's input logic in one clock cycle; on the
ECP5 that chain was the packet engine's critical path (``docs/boards.md``).
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import validating

__all__ = ["RegisterSlice"]


class RegisterSlice(wiring.Component):
    """A two-entry skid buffer with registered ``o.valid``, ``o.payload`` and ``i.ready``.

    No combinational path runs from ``i`` to ``o`` or from ``o.ready`` to ``i.ready``. Order is
    kept; nothing is dropped or duplicated. Throughput: one transfer per cycle (II = 1) for as
    long as ``o`` is ready, with bubbles and backpressure in any pattern. Latency: one cycle
    (a beat taken in cycle t is offered on ``o`` from cycle t + 1).

    When ``o`` stalls while a beat is being taken, the beat goes to the skid register and
    ``i.ready`` falls in the next cycle; it rises again the cycle after the skid entry moved to
    the output register. Cost: two payload-wide registers, a 2:1 multiplexer on the output
    register's input, and two flip-flops of state.

    Parameters
    ----------
    shape : shape-castable
        The payload shape (any :class:`~amaranth.lib.data.Layout`, ``unsigned(n)``, ...).

    Members
    -------
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
    """

    def __init__(self, *, shape):
        with validating(self):
            try:
                Shape.cast(shape)
            except TypeError:
                raise TypeError(f"shape must be a shape-castable object, not {shape!r}") \
                    from None
        self._shape = shape
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    @property
    def shape(self):
        return self._shape

    def elaborate(self, platform):
        m = Module()
        skid = Signal(self._shape)
        skid_valid = Signal()

        # i.ready is the registered "skid is empty": a beat can always be taken into the skid
        # register when the output register is held, so ready need not look at o.ready.
        m.d.comb += self.i.ready.eq(~skid_valid)
        # The skid register follows the input while empty, whether or not a beat is offered:
        # its clock enable then depends on a flip-flop only, not on the producer's (possibly
        # deep) valid logic; the payload is only kept when skid_valid is set below.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        with m.If(self.o.ready | ~self.o.valid):
            # The output register moves (or is empty): refill it, skid entry first.
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_valid):
            m.d.sync += skid_valid.eq(1)
        return m
