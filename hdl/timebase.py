"""The NIC's notion of time: a free-running nanosecond counter for timestamps and timers."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from .util import validating

__all__ = ["Timebase"]


class Timebase(wiring.Component):
    """Nanoseconds since reset, modulo 2**32, advanced by the clock period every cycle.

    The period need not be a whole number of ns (125 MHz: 8 ns; 156.25 MHz: 6.4 ns): a
    fractional accumulator with 16 fraction bits keeps the long-run error under 1 ppm.

    Parameters
    ----------
    clock_hz : int
        Frequency of the domain this runs in.

    Members
    -------
    ns : ``Out(32)``
        Current time in ns (wraps after 4.29 s).
    units : ``Out(32)``
        Current time in units of 1.024 us (1024 ns), the unit of the local ACK timeout
        (wraps after 73 minutes): the retransmit timers count in it.
    """

    FRACTION_BITS = 16

    def __init__(self, *, clock_hz):
        with validating(self):
            if not isinstance(clock_hz, int) or not 1_000_000 <= clock_hz <= 500_000_000:
                raise ValueError(f"Clock frequency must be an integer from 1 MHz to 500 MHz, "
                                 f"not {clock_hz!r}")
        self._clock_hz = clock_hz
        super().__init__({"ns": Out(32), "units": Out(32)})

    @property
    def step(self):
        """Increment per cycle, in ns with :attr:`FRACTION_BITS` fraction bits."""
        return round((10**9 << self.FRACTION_BITS) / self._clock_hz)

    def elaborate(self, platform):
        m = Module()
        count = Signal(42 + self.FRACTION_BITS)
        m.d.sync += count.eq(count + self.step)
        m.d.comb += [
            self.ns.eq(count[self.FRACTION_BITS:self.FRACTION_BITS + 32]),
            self.units.eq(count[self.FRACTION_BITS + 10:]),
        ]
        return m
