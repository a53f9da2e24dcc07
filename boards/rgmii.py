"""A NIC plane on a real 1 Gb/s Ethernet port: RGMII on ECP5, the MAC, and the clock crossing.

::

    sync (NIC clock)                  │ eth (125 MHz, the PHY's receive clock)
    tx beats ─► AsyncFIFO ────────────┼─► MacTx ─► txd/tx_en ─┐
                                      │                        ├─ Ecp5Rgmii (DDR I/O) ─ PHY
    rx beats ◄─ AsyncFIFO ◄───────────┼── MacRx ◄─ rxd/rx_dv ─┘
    counters ◄─ event toggles ◄───────┼── MAC counters

:class:`GmiiPort` is everything but the I/O: the MACs of :mod:`boards.mac` in an ``eth``
domain and the crossings to and from ``sync``. It runs in the Amaranth simulator with the
GMII signals looped back (``tests/boards/test_rgmii.py``). :class:`Ecp5Rgmii` turns GMII into RGMII
with the ECP5's DDR flip-flops (``IDDRX1F``, ``ODDRX1F``) and input delays (``DELAYF``), and
makes the ``eth`` domain from the PHY's receive clock; the transmit side is clocked by the same
clock, as LiteEth's ECP5 RGMII PHY does, so the port works once the PHY has a 1000 Mb/s link
and its receive clock runs.
"""

from amaranth import *
from amaranth.lib import data, io, stream, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from hdl.packet.headers import net_beat_layout
from hdl.util import validating

from .mac import MacRx, MacTx

__all__ = ["GmiiPort", "Ecp5Rgmii", "PORT_COUNTERS", "RX_DELAY_TAPS", "ETH_HZ"]

#: Counters of :class:`GmiiPort`, in the ``sync`` domain: frames sent and received, and
#: received carrier events dropped (any :class:`~boards.mac.MacRx` reason).
PORT_COUNTERS = ("tx_frames", "rx_frames", "rx_dropped")

#: DELAYF taps on the receive inputs: 80 x 25 ps = 2 ns, the RGMII clock-to-data skew the
#: receiver must add when the PHY sends clock and data aligned (as LiteEth sets it).
RX_DELAY_TAPS = 80

#: The GMII/RGMII clock at 1000 Mb/s.
ETH_HZ = 125_000_000

_RX_DROP_COUNTERS = ("fcs_errors", "runts", "oversize", "rx_errors", "overflows",
                     "preamble_errors")


class GmiiPort(wiring.Component):
    """A network port of the NIC on GMII: frames in ``sync`` on one side, GMII bytes in ``eth``
    on the other.

    Parameters
    ----------
    data_width : int
        The NIC's beat width.
    max_frame : int
        Longest frame in bytes, FCS included (both MACs).
    fifo_depth : int
        Beats of each clock-crossing FIFO (a power of two).

    Members
    -------
    tx : ``In(stream.Signature(net_beat_layout(W)))``, ``sync``
        Frames to send (from the NIC's ``tx`` port).
    rx : ``Out(stream.Signature(net_beat_layout(W)))``, ``sync``
        Good frames received (to the NIC's ``rx`` port).
    txd, tx_en, tx_er : ``Out``, ``eth``
    rxd, rx_dv, rx_er : ``In``, ``eth``
    counters : ``Out(data.ArrayLayout(32, len(PORT_COUNTERS)))``, ``sync``
    """

    def __init__(self, *, data_width=64, max_frame=1522, fifo_depth=16):
        with validating(self):
            if not isinstance(fifo_depth, int) or fifo_depth < 4 or \
                    fifo_depth & (fifo_depth - 1):
                raise ValueError(f"fifo_depth must be a power of two of at least 4, "
                                 f"not {fifo_depth!r}")
            # The MACs check data_width and max_frame, naming them.
            self._mac_tx = MacTx(data_width=data_width, max_frame=max_frame)
            self._mac_rx = MacRx(data_width=data_width, max_frame=max_frame)
        self._data_width = data_width
        self._fifo_depth = fifo_depth
        beat = stream.Signature(net_beat_layout(data_width))
        super().__init__({
            "tx": In(beat),
            "rx": Out(beat),
            "txd": Out(8),
            "tx_en": Out(1),
            "tx_er": Out(1),
            "rxd": In(8),
            "rx_dv": In(1),
            "rx_er": In(1),
            "counters": Out(data.ArrayLayout(32, len(PORT_COUNTERS))),
        })

    def elaborate(self, platform):
        m = Module()
        layout = net_beat_layout(self._data_width)
        m.submodules.mac_tx = mac_tx = DomainRenamer("eth")(self._mac_tx)
        m.submodules.mac_rx = mac_rx = DomainRenamer("eth")(self._mac_rx)
        m.submodules.tx_fifo = tx_fifo = AsyncFIFO(
            width=layout.size, depth=self._fifo_depth, w_domain="sync", r_domain="eth")
        m.submodules.rx_fifo = rx_fifo = AsyncFIFO(
            width=layout.size, depth=self._fifo_depth, w_domain="eth", r_domain="sync")

        m.d.comb += [
            tx_fifo.w_data.eq(self.tx.payload),
            tx_fifo.w_en.eq(self.tx.valid),
            self.tx.ready.eq(tx_fifo.w_rdy),
            mac_tx.i.payload.eq(tx_fifo.r_data),
            mac_tx.i.valid.eq(tx_fifo.r_rdy),
            tx_fifo.r_en.eq(mac_tx.i.ready),
            rx_fifo.w_data.eq(mac_rx.o.payload),
            rx_fifo.w_en.eq(mac_rx.o.valid),
            mac_rx.o.ready.eq(rx_fifo.w_rdy),
            self.rx.payload.eq(rx_fifo.r_data),
            self.rx.valid.eq(rx_fifo.r_rdy),
            rx_fifo.r_en.eq(self.rx.ready),
            self.txd.eq(mac_tx.txd),
            self.tx_en.eq(mac_tx.tx_en),
            self.tx_er.eq(mac_tx.tx_er),
            mac_rx.rxd.eq(self.rxd),
            mac_rx.rx_dv.eq(self.rx_dv),
            mac_rx.rx_er.eq(self.rx_er),
        ]

        # Counters: the low bit of a MAC counter flips at every step, so it is the event toggle
        # to cross (the XOR of them for a sum: the MACs count at most one reason per frame);
        # registered in ``eth``, then two flip-flops, and ``sync`` counts its changes. Events
        # come at most once per frame (84 bytes of ``eth`` cycles with preamble and gap, 6.7
        # cycles of a 10 MHz ``sync``), slower than the three ``sync`` cycles the crossing needs.
        events = {
            "tx_frames": [mac_tx.frames],
            "rx_frames": [mac_rx.frames],
            "rx_dropped": [getattr(mac_rx, name) for name in _RX_DROP_COUNTERS],
        }
        for index, name in enumerate(PORT_COUNTERS):
            toggle = Signal(name=f"{name}_toggle")
            m.d.eth += toggle.eq(Cat(counter[0] for counter in events[name]).xor())
            seen = Signal(name=f"{name}_seen")
            last = Signal(name=f"{name}_last")
            m.submodules[f"{name}_sync"] = FFSynchronizer(toggle, seen, o_domain="sync")
            m.d.sync += last.eq(seen)
            count = Signal(32, name=name)
            with m.If(seen != last):
                m.d.sync += count.eq(count + 1)
            m.d.comb += self.counters[index].eq(count)
        return m


class Ecp5Rgmii(Elaboratable):
    """RGMII pins of an ECP5 board (``platform.request("eth_rgmii", dir="-")``) as GMII in an
    ``eth`` domain made from the PHY's receive clock.

    Receive: ``rx_clk`` clocks ``eth``; each of ``rx_data[0:4]`` and ``rx_ctrl`` passes a
    ``DELAYF`` of ``rx_delay_taps`` taps (25 ps each) and an ``IDDRX1F``: the rising-edge half
    gives ``rxd[0:4]`` and ``rx_dv``, the falling-edge half ``rxd[4:8]`` and ``rx_dv ^ rx_er``.
    Transmit: ``ODDRX1F`` per pin in the same clock, ``tx_clk`` = an ``ODDRX1F`` of 1, 0 (the
    PHY adds the transmit clock's delay, RGMII-ID). ``eth`` is reset while ``sync`` is. The PHY
    is taken out of reset with the design (``rst`` released); MDIO is left alone (the PHY's
    strapped defaults: auto-negotiation).

    Members
    -------
    txd, tx_en, tx_er : In
    rxd, rx_dv, rx_er : Out
    """

    def __init__(self, pins, *, rx_delay_taps=RX_DELAY_TAPS):
        with validating(self):
            if not isinstance(rx_delay_taps, int) or not 0 <= rx_delay_taps <= 127:
                raise ValueError(f"rx_delay_taps must be an integer from 0 to 127, "
                                 f"not {rx_delay_taps!r}")
        self._pins = pins
        self._taps = rx_delay_taps
        self.txd = Signal(8)
        self.tx_en = Signal()
        self.tx_er = Signal()
        self.rxd = Signal(8)
        self.rx_dv = Signal()
        self.rx_er = Signal()

    def elaborate(self, platform):
        m = Module()
        pins = self._pins
        m.domains.eth = cd_eth = ClockDomain("eth")
        m.submodules.rx_clk = rx_clk = io.Buffer("i", pins.rx_clk)
        if platform is not None:
            # 1000 Mb/s: the PHY's receive clock is 125 MHz (nextpnr times ``eth`` by it).
            platform.add_clock_constraint(pins.rx_clk.io, ETH_HZ)
        m.d.comb += cd_eth.clk.eq(rx_clk.i)
        m.submodules.eth_reset = ResetSynchronizer(ResetSignal("sync"), domain="eth")
        m.submodules.phy_rst = phy_rst = io.Buffer("o", pins.rst)
        m.d.comb += phy_rst.o.eq(0)         # PinsN: the PHY leaves reset

        ctrl_names = ("tx_ctrl", "rx_ctrl") if hasattr(pins, "tx_ctrl") else ("tx_ctl", "rx_ctl")
        rx_pins = [(pins.rx_data[n], n) for n in range(4)] + [(getattr(pins, ctrl_names[1]), 4)]
        halves = Signal(10)                 # bit 2k: rising edge, 2k + 1: falling edge
        for port, n in rx_pins:
            buffer = io.Buffer("i", port)
            m.submodules[f"rx_buf{n}"] = buffer
            delayed = Signal(name=f"rx_delayed{n}")
            m.submodules[f"rx_delay{n}"] = Instance(
                "DELAYF", p_DEL_MODE="SCLK_ALIGNED", p_DEL_VALUE=f"DELAY{self._taps}",
                i_A=buffer.i, i_LOADN=1, i_MOVE=0, i_DIRECTION=0, o_Z=delayed)
            m.submodules[f"rx_ddr{n}"] = Instance(
                "IDDRX1F", i_D=delayed, i_SCLK=ClockSignal("eth"), i_RST=ResetSignal("eth"),
                o_Q0=halves[2 * n], o_Q1=halves[2 * n + 1])
        m.d.comb += [
            self.rxd.eq(Cat(*(halves[2 * n] for n in range(4)),
                            *(halves[2 * n + 1] for n in range(4)))),
            self.rx_dv.eq(halves[8]),
            self.rx_er.eq(halves[8] ^ halves[9]),
        ]

        tx_pins = [(pins.tx_data[n], self.txd[n], self.txd[4 + n], f"tx{n}") for n in range(4)]
        tx_pins += [(getattr(pins, ctrl_names[0]), self.tx_en, self.tx_en ^ self.tx_er, "txc"),
                    (pins.tx_clk, Const(1), Const(0), "txclk")]
        for port, rising, falling, name in tx_pins:
            q = Signal(name=f"{name}_q")
            m.submodules[f"{name}_ddr"] = Instance(
                "ODDRX1F", i_D0=rising, i_D1=falling, i_SCLK=ClockSignal("eth"),
                i_RST=ResetSignal("eth"), o_Q=q)
            m.submodules[f"{name}_buf"] = buffer = io.Buffer("o", port)
            m.d.comb += buffer.o.eq(q)
        return m
