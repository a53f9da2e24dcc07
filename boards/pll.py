"""The ECP5 PLL (``EHXPLLL``) that clocks a board top at the engine's target frequency.

:func:`ecp5_pll_dividers` finds the dividers the way Project Trellis's ``ecppll`` does (input
divider, feedback divider and CLKOP divider with CLKOP as the feedback path), within the
LFE5U/LFE5UM data sheet's limits: input 8-400 MHz, phase detector 3.125-400 MHz, VCO
400-800 MHz, output 3.125-400 MHz, dividers 1-128. :class:`Ecp5Pll` instantiates the PLL and
makes the ``sync`` domain from its output, held in reset until the PLL has locked (and for
two cycles after, so reset leaves every flip-flop on the same edge); the reset reaches the
flip-flops through a global buffer (``DCCA``), not general routing.
"""

from amaranth import *
from amaranth.lib import io

from hdl.util import validating

__all__ = ["ecp5_pll_dividers", "Ecp5Pll", "LockReset", "PFD_HZ", "VCO_HZ", "CLKI_HZ",
           "CLKOP_HZ"]

#: Limits of the ECP5 PLL (LFE5U/LFE5UM family data sheet, sysCLOCK PLL timing).
CLKI_HZ = (8e6, 400e6)
PFD_HZ = (3.125e6, 400e6)
VCO_HZ = (400e6, 800e6)
CLKOP_HZ = (3.125e6, 400e6)
VCO_CENTRE_HZ = 600e6
_DIV = range(1, 129)


def ecp5_pll_dividers(clki_hz, clkop_hz):
    """``(clki_div, clkfb_div, clkop_div, achieved_hz)`` for an output of ``clkop_hz`` from an
    input of ``clki_hz``: the exact frequency when one exists (else the closest), and among
    equals the VCO nearest 600 MHz, the middle of its range (as ``ecppll`` chooses). Raises
    :class:`ValueError` naming the frequency out of range."""
    for name, value, (lo, hi) in (("clki_hz", clki_hz, CLKI_HZ), ("clkop_hz", clkop_hz, CLKOP_HZ)):
        if not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ValueError(f"{name} must be from {lo / 1e6:g} to {hi / 1e6:g} MHz, "
                             f"not {value!r}")
    best = None
    for clki_div in _DIV:
        pfd = clki_hz / clki_div
        if pfd < PFD_HZ[0]:
            break
        if pfd > PFD_HZ[1]:
            continue
        for clkfb_div in _DIV:
            out = pfd * clkfb_div
            if out > CLKOP_HZ[1]:
                break
            for clkop_div in _DIV:
                vco = out * clkop_div
                if vco > VCO_HZ[1]:
                    break
                if vco < VCO_HZ[0]:
                    continue
                key = (abs(out - clkop_hz), abs(vco - VCO_CENTRE_HZ))
                if best is None or key < best[0]:
                    best = (key, (clki_div, clkfb_div, clkop_div, out))
    if best is None:
        raise ValueError(f"no ECP5 PLL setting makes {clkop_hz / 1e6:g} MHz from "
                         f"{clki_hz / 1e6:g} MHz")
    return best[1]


class LockReset(Elaboratable):
    """``rst`` high while ``locked`` is low and for ``cycles`` clock cycles after it rose
    (``locked`` is not synchronous to the clock: the extra cycles let it settle, and every
    flip-flop leaves reset on the same edge). Works in its own reset-less ``sync`` domain
    (rename it to the PLL's output clock)."""

    def __init__(self, cycles=2):
        with validating(self):
            if not isinstance(cycles, int) or not 1 <= cycles <= 16:
                raise ValueError(f"cycles must be an integer from 1 to 16, not {cycles!r}")
        self.cycles = cycles
        self.locked = Signal()
        self.rst = Signal(init=1)

    def elaborate(self, platform):
        m = Module()
        hold = Signal(self.cycles, init=(1 << self.cycles) - 1, reset_less=True)
        m.d.sync += hold.eq(Mux(self.locked, hold >> 1, (1 << self.cycles) - 1))
        m.d.comb += self.rst.eq(hold[0])
        return m


class Ecp5Pll(Elaboratable):
    """The ``sync`` domain at ``clkop_hz`` from the board oscillator ``clk_port`` (a port from
    ``platform.request(platform.default_clk, dir="-")``) of ``clki_hz``.

    Raises :class:`ValueError` when the frequency cannot be made within 0.1 % (the UART's
    baud divider and the report period assume the frequency asked for).

    ``global_reset`` (default ``True``): drive ``sync``'s reset through a ``DCCA`` so nextpnr
    routes it on a global network; ``False`` wires :class:`LockReset`'s output directly.

    Members
    -------
    locked : ``Signal()``
        The PLL's LOCK output (``sync`` is in reset while it is low).
    achieved_hz : float
        The output frequency the dividers give.
    """

    def __init__(self, clk_port, *, clki_hz, clkop_hz, global_reset=True):
        with validating(self):
            if not isinstance(global_reset, bool):
                raise TypeError(f"global_reset must be a bool, not {global_reset!r}")
            self.clki_div, self.clkfb_div, self.clkop_div, self.achieved_hz = \
                ecp5_pll_dividers(clki_hz, clkop_hz)
            if abs(self.achieved_hz - clkop_hz) > clkop_hz * 1e-3:
                raise ValueError(f"clkop_hz: the ECP5 PLL makes {self.achieved_hz / 1e6:g} MHz "
                                 f"at best from {clki_hz / 1e6:g} MHz, not "
                                 f"{clkop_hz / 1e6:g} MHz")
        self._port = clk_port
        self._clki_hz = clki_hz
        self.global_reset = global_reset
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.clk_buffer = buffer = io.Buffer("i", self._port)
        clkop = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{self._clki_hz / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=f"{self.achieved_hz / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
            p_CLKI_DIV=self.clki_div, p_CLKFB_DIV=self.clkfb_div,
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=self.clkop_div,
            p_CLKOP_CPHASE=self.clkop_div // 2,             # as ecppll sets it
            p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            i_CLKI=buffer.i, i_CLKFB=clkop, i_RST=0, i_STDBY=0,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clkop, o_LOCK=self.locked,
        )
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.pll_lock = cd_lock = ClockDomain("pll_lock", reset_less=True)
        m.submodules.lock_reset = lock_reset = DomainRenamer("pll_lock")(LockReset())
        m.d.comb += [
            cd_lock.clk.eq(clkop),
            cd_sync.clk.eq(clkop),
            lock_reset.locked.eq(self.locked),
        ]
        if self.global_reset:
            # The reset drives every ``sync`` flip-flop's LSR across the chip: through a DCCA
            # (a primary clock buffer) nextpnr routes it on a global network, as it does a
            # clock, instead of on general routing from one flip-flop (a net across the chip
            # on the critical path at 125 MHz). nextpnr promotes only clocks to globals by
            # itself; a net a DCCA drives it always routes on one. The DCCA adds no delay in
            # nextpnr's model; the global's own wires replace the fabric's.
            m.submodules.rst_buffer = Instance(
                "DCCA", i_CLKI=lock_reset.rst, i_CE=Const(1), o_CLKO=cd_sync.rst)
        else:
            m.d.comb += cd_sync.rst.eq(lock_reset.rst)
        # No clock constraint of our own: nextpnr derives the output's from the oscillator's and
        # the dividers ("Derived frequency constraint of 125.0 MHz"); one on ``cd_sync.clk``
        # would name a net that synthesis renames, and nextpnr would ignore it with a warning.
        return m
