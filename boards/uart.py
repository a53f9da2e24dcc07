"""A transmit-only UART: 8 data bits, no parity, one stop bit (8N1)."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.util import validating

__all__ = ["UARTTx"]


class UARTTx(wiring.Component):
    """Send each byte of a stream as one 8N1 character, least significant bit first.

    A byte is taken from ``i`` only while the line is idle, so ``i.ready`` is high for one
    cycle per character; back-to-back bytes leave with no idle bit between characters (one
    character every ``10 * divisor`` cycles).

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 2: ``round(clock_hz / baud)``. At 100 MHz and 115200
        baud, 868 (0.006 % fast).

    Members
    -------
    i : ``In(stream.Signature(8))``
        Bytes to send.
    tx : ``Out(1, init=1)``
        The serial line; idle high.
    busy : ``Out(1)``
        A character is on the line.
    """

    def __init__(self, *, divisor):
        with validating(self):
            if not isinstance(divisor, int) or divisor < 2:
                raise ValueError(f"divisor must be an integer of at least 2, not {divisor!r}")
        self._divisor = divisor
        super().__init__({
            "i": In(stream.Signature(8)),
            "tx": Out(1, init=1),
            "busy": Out(1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self._divisor))
        shift = Signal(10, init=0x3FF)      # stop bit, data, start bit; shifted out LSB first
        bits_left = Signal(range(11))
        m.d.comb += [
            self.busy.eq(bits_left != 0),
            self.i.ready.eq(bits_left == 0),
            self.tx.eq(shift[0]),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                shift.eq(Cat(C(0, 1), self.i.payload, C(1, 1))),
                bits_left.eq(10),
                timer.eq(self._divisor - 1),
            ]
        with m.Elif(bits_left != 0):
            with m.If(timer == 0):
                m.d.sync += [
                    shift.eq(Cat(shift[1:], C(1, 1))),
                    bits_left.eq(bits_left - 1),
                    timer.eq(self._divisor - 1),
                ]
            with m.Else():
                m.d.sync += timer.eq(timer - 1)
        return m
