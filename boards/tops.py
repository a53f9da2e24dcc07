"""Platform tops: the self-test on each ECP5 board, the reduced top on the iCEBreaker, and the
engine bench (the packet engine alone on an LFE5UM5G-85F, for fmax and resource figures).

The ECPIX-5 and Versa self-tests take their clock from the board's default oscillator
(Amaranth makes the ``sync`` domain from it); the ULX3S self-test runs at 50 MHz from the ECP5
PLL (:class:`~boards.pll.Ecp5Pll`) fed by its 25 MHz oscillator; ``ecpix5-125`` runs the
ECPIX-5 self-test at the engine's target of 125 MHz, made from the 100 MHz oscillator by the
PLL; whether it meets that clock is in docs/boards.md (generated from the synthesis report).
"""

from amaranth import *
from amaranth.build import Attrs, Clock, Pins, Resource
from amaranth.lib import io, wiring
from amaranth.vendor import LatticeECP5Platform
from amaranth_boards.ecpix5 import ECPIX585Platform
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from amaranth_boards.versa_ecp5 import VersaECP5Platform

from hdl.config import NicConfig
from hdl.packet.engine import PacketEngine
from hdl.util import validating

from .pll import Ecp5Pll
from .rgmii import PORT_COUNTERS, Ecp5Rgmii, GmiiPort
from .selftest import SelfTest
from .transport import TransportSelfTest, transport_config

__all__ = [
    "BOARDS", "Board", "selftest_config", "SelfTestTop", "NetworkSelftestTop", "BlockBench",
    "EngineBench", "EngineBenchPlatform", "TransportSelfTestTop", "TRANSPORT_HZ", "ULX3S_HZ",
]


def output_pin(m, port):
    """The output signal of an output buffer on ``port`` (``platform.request(..., dir="-")``);
    an inverted pin (``PinsN``) is inverted by the buffer."""
    buffer = io.Buffer("o", port)
    m.submodules += buffer
    return buffer.o


def input_pin(m, port):
    buffer = io.Buffer("i", port)
    m.submodules += buffer
    return buffer.i


def selftest_config(clock_hz, *, data_width=64):
    """The engine configuration of the board self-tests: two planes, 64 QPs, 512-byte MTU."""
    return NicConfig(data_width=data_width, ports=2, qps=64, mtu=512,
                     clock_hz=int(clock_hz))


class SelfTestTop(Elaboratable):
    """:class:`~boards.selftest.SelfTest` on an ECP5 board: UART, LEDs, kill inputs.

    LEDs (``docs/boards.md``): heartbeat (toggles every report), activity (good packets in the
    last second), error (sticky: a bad packet, a parser drop or an engine-A error), killed
    planes. Kill inputs: Versa DIP switches 0 and 1, ULX3S FIRE buttons 1 and 2; the ECPIX-5
    has no user button, so its last plane is killed by the automatic schedule (every fourth
    second).
    """

    def __init__(self, board, *, pll_hz=None):
        self.board = board
        self.pll_hz = pll_hz

    def elaborate(self, platform):
        m = Module()
        clock_hz = platform.default_clk_frequency
        if self.pll_hz is not None:
            # The PLL makes ``sync`` at pll_hz from the oscillator (the platform then makes no
            # default domain of its own).
            m.submodules.pll = pll = Ecp5Pll(
                platform.request(platform.default_clk, dir="-"), clki_hz=clock_hz,
                clkop_hz=self.pll_hz)
            clock_hz = pll.achieved_hz
        auto_kill = self.board == "ecpix5"
        m.submodules.selftest = selftest = SelfTest(
            config=selftest_config(clock_hz), max_payload=256, auto_kill=auto_kill)
        uart = platform.request("uart", 0, dir="-")
        m.d.comb += output_pin(m, uart.tx).eq(selftest.uart_tx)
        status = [selftest.heartbeat, selftest.activity, selftest.error,
                  selftest.activity & ~selftest.error]

        if self.board == "ecpix5":
            # RGB LED 0: heartbeat (green); 1: activity (green); 2: error (red) or pass
            # (green); 3: a plane is killed (red), else blue.
            leds = [platform.request("rgb_led", n, dir="-") for n in range(4)]
            killed = selftest.killed_planes.any()
            m.d.comb += [
                output_pin(m, leds[0].g).eq(selftest.heartbeat),
                output_pin(m, leds[1].g).eq(selftest.activity),
                output_pin(m, leds[2].r).eq(selftest.error),
                output_pin(m, leds[2].g).eq(~selftest.error & selftest.activity),
                output_pin(m, leds[3].r).eq(killed),
                output_pin(m, leds[3].b).eq(~killed),
            ]
        else:
            leds = [output_pin(m, platform.request("led", n, dir="-")) for n in range(6)]
            for n, value in enumerate(status):
                m.d.comb += leds[n].eq(value)
            for plane in range(2):
                m.d.comb += leds[4 + plane].eq(selftest.killed_planes[plane])
            kill_name = "switch" if self.board == "versa" else "button_fire"
            kills = [input_pin(m, platform.request(kill_name, n, dir="-")) for n in range(2)]
            # Buttons and switches are asynchronous: two flip-flops before use.
            sync_kill = [Signal(2, name=f"kill_sync{n}") for n in range(2)]
            for n, pin in enumerate(kills):
                m.d.sync += sync_kill[n].eq(Cat(pin, sync_kill[n][0]))
                m.d.comb += selftest.kill[n].eq(sync_kill[n][1])
        return m


class NetworkSelftestTop(Elaboratable):
    """The network-level self-test (:class:`~boards.ice40.Ice40Selftest`: frame source,
    impaired fabric, port arbiter, frame checker, UART report; no packet engines) on the
    ECPIX-5, the CI bitstream (``ecpix5-ci``, docs/boards.md).

    RGB LED 0: heartbeat (green); 2: error (red) or no error (green); 3: plane 1 killed (red),
    else blue. The ECPIX-5 has no user button: plane 1 is killed during every fourth report
    period.
    """

    def elaborate(self, platform):
        from .ice40 import Ice40Selftest
        m = Module()
        m.submodules.selftest = selftest = Ice40Selftest(
            clock_hz=int(platform.default_clk_frequency), auto_kill=True)
        leds = [platform.request("rgb_led", n, dir="-") for n in range(4)]
        killed = selftest.killed_planes[1]
        m.d.comb += [
            output_pin(m, platform.request("uart", 0, dir="-").tx).eq(selftest.uart_tx),
            output_pin(m, leds[0].g).eq(selftest.heartbeat),
            output_pin(m, leds[2].r).eq(selftest.error),
            output_pin(m, leds[2].g).eq(~selftest.error),
            output_pin(m, leds[3].r).eq(killed),
            output_pin(m, leds[3].b).eq(~killed),
        ]
        return m


class TransportSelfTestTop(Elaboratable):
    """:class:`~boards.transport.TransportSelfTest` (the whole NIC in loopback through the
    impaired fabric) on the ECPIX-5, its ``sync`` domain at ``clock_hz`` from the ECP5 PLL.

    RGB LED 0: heartbeat (green); 1: work completing in the last second (green), bring-up
    not finished (blue); 2: error (red: a bad completion or placement, a parser drop or a
    refused bring-up command) or pass (green); 3: plane 1 killed (red), else blue. The
    ECPIX-5 has no user button: plane 1 is killed during every fourth report period.

    With ``rgmii``, plane 1 leaves the chip on the Ethernet port (``boards.rgmii``: MAC,
    clock crossing, RGMII DDR I/O) and plane 0 stays on chip; there is no kill schedule (the
    port may be dead already), and the port's counters are appended to the UART line.
    """

    def __init__(self, *, clock_hz, rgmii=False):
        self.clock_hz = clock_hz
        self.rgmii = rgmii

    def elaborate(self, platform):
        m = Module()
        m.submodules.pll = pll = Ecp5Pll(
            platform.request(platform.default_clk, dir="-"),
            clki_hz=platform.default_clk_frequency, clkop_hz=self.clock_hz)
        config = transport_config(pll.achieved_hz)
        if self.rgmii:
            # No kill schedule: with nothing on the port, plane 1 is dead already, and killing
            # plane 0 as well would stop the NIC (its QPs would exhaust their retries).
            m.submodules.selftest = selftest = TransportSelfTest(
                config=config, auto_kill=False, external_planes=(1,),
                extra_counters=PORT_COUNTERS)
            m.submodules.port = port = GmiiPort(data_width=config.data_width)
            m.submodules.phy = phy = Ecp5Rgmii(platform.request("eth_rgmii", 0, dir="-"))
            wiring.connect(m, selftest.ext_tx[0], port.tx)
            wiring.connect(m, port.rx, selftest.ext_rx[0])
            m.d.comb += [
                selftest.extra.eq(port.counters),
                phy.txd.eq(port.txd), phy.tx_en.eq(port.tx_en), phy.tx_er.eq(port.tx_er),
                port.rxd.eq(phy.rxd), port.rx_dv.eq(phy.rx_dv), port.rx_er.eq(phy.rx_er),
            ]
        else:
            m.submodules.selftest = selftest = TransportSelfTest(
                config=config, auto_kill=True)
        leds = [platform.request("rgb_led", n, dir="-") for n in range(4)]
        killed = selftest.killed_planes.any()
        m.d.comb += [
            output_pin(m, platform.request("uart", 0, dir="-").tx).eq(selftest.uart_tx),
            output_pin(m, leds[0].g).eq(selftest.heartbeat),
            output_pin(m, leds[1].g).eq(selftest.activity),
            output_pin(m, leds[1].b).eq(~selftest.up),
            output_pin(m, leds[2].r).eq(selftest.error),
            output_pin(m, leds[2].g).eq(~selftest.error & selftest.activity),
            output_pin(m, leds[3].r).eq(killed),
            output_pin(m, leds[3].b).eq(~killed),
        ]
        return m


class EngineBenchPlatform(LatticeECP5Platform):
    """An LFE5UM5G-85F (the ECPIX-5's device and package, speed 8) with one clock pin at the
    engine target of 125 MHz and two pins for the bench's scan chain; no board around it."""

    device = "LFE5UM5G-85F"
    package = "BG554"
    speed = "8"
    default_clk = "clk"
    resources = [
        Resource("clk", 0, Pins("K23", dir="i"), Clock(125e6), Attrs(IO_TYPE="LVCMOS33")),
        Resource("scan", 0, Pins("R26", dir="i"), Attrs(IO_TYPE="LVCMOS33")),
        Resource("scan", 1, Pins("R24", dir="o"), Attrs(IO_TYPE="LVCMOS33")),
    ]
    connectors = []


class BlockBench(Elaboratable):
    """A :class:`~amaranth.lib.wiring.Component` on a bare device with every input driven from
    a shift register fed by one pin and every output folded into a multiple-input signature
    register (MISR) read out on another pin: all of the block's paths start and end at
    flip-flops, nothing is optimised away, and the wrapper adds only flip-flops and about one
    LUT per three output bits. ``name`` is the block's submodule name (it prefixes the cell
    names in nextpnr's reports).
    """

    FOLD = 3

    def __init__(self, block, *, name="block"):
        with validating(self):
            if not isinstance(block, wiring.Component):
                raise TypeError(f"block must be a wiring.Component, not {block!r}")
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"name must be an identifier, not {name!r}")
        self.block = block
        self.name = name
        #: The scan chain's input and the MISR's last bit (on the ``scan`` pins on a platform).
        self.scan_in = Signal()
        self.scan_out = Signal()

    def elaborate(self, platform):
        m = Module()
        block = self.block
        m.submodules[self.name] = block
        inputs, outputs = [], []
        for _path, member, value in block.signature.flatten(block):
            (inputs if member.flow == wiring.In else outputs).append(Value.cast(value))
        in_bits = sum(len(v) for v in inputs)
        out_value = Cat(*outputs)

        scan_in, scan_out = self.scan_in, self.scan_out
        if platform is not None:
            m.d.comb += [scan_in.eq(input_pin(m, platform.request("scan", 0, dir="-"))),
                         output_pin(m, platform.request("scan", 1, dir="-")).eq(scan_out)]

        chain = Signal(in_bits)
        m.d.sync += chain.eq(Cat(scan_in, chain[:-1]))
        offset = 0
        for value in inputs:
            m.d.comb += value.eq(chain[offset:offset + len(value)])
            offset += len(value)

        folded = [out_value[n:n + self.FOLD].xor()
                  for n in range(0, len(out_value), self.FOLD)]
        misr = Signal(len(folded))
        m.d.sync += misr.eq(Cat(misr[-1], misr[:-1]) ^ Cat(*folded))
        m.d.comb += scan_out.eq(misr[-1])
        return m


class EngineBench(BlockBench):
    """The packet engine (:class:`~hdl.packet.engine.PacketEngine`) in a :class:`BlockBench`
    (its cost is reported by ``make synth-report``)."""

    def __init__(self, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
        self.config = config
        super().__init__(PacketEngine(config), name="engine")


class Board:
    """A board the flow knows: its platform class, top and the engine config of its top, and
    the nextpnr router its build uses (``None``: nextpnr's default, router1)."""

    def __init__(self, name, platform, top, description, *, router=None):
        self.name = name
        self.platform = platform
        self.top = top
        self.description = description
        self.router = router


def _ice40_top(board):
    from .ice40 import Ice40Top
    return Ice40Top()


#: The engine's target clock (64-bit datapath: 8 Gb/s), made by the PLL for ``ecpix5-125``.
ENGINE_HZ = NicConfig().clock_hz

#: The clock of the transport self-test (the whole NIC), made by the PLL for
#: ``ecpix5-transport`` and ``ecpix5-rgmii``. Not every transport block is pipelined for an
#: FPGA yet: the requester's ACK handling is one long cycle (docs/boards.md).
TRANSPORT_HZ = 10_000_000

#: The ULX3S self-test's clock, made by the PLL from the 25 MHz oscillator. The LFE5U-85F on
#: the ULX3S is speed grade 6, slower than the other boards' (docs/boards.md).
ULX3S_HZ = 50_000_000

#: Boards of ``make bitstream BOARD=...``.
BOARDS = {
    "ecpix5": Board("ecpix5", ECPIX585Platform, SelfTestTop,
                    "LambdaConcept ECPIX-5 85F (LFE5UM5G-85F-8BG554), self-test at 100 MHz"),
    "ecpix5-125": Board("ecpix5-125", ECPIX585Platform,
                        lambda name: SelfTestTop("ecpix5", pll_hz=ENGINE_HZ),
                        "LambdaConcept ECPIX-5 85F (LFE5UM5G-85F-8BG554), self-test at the "
                        "engine's 125 MHz (PLL from the 100 MHz oscillator; build with "
                        "--allow-timing-fail if it misses: docs/boards.md)", router="router2"),
    "ecpix5-ci": Board("ecpix5-ci", ECPIX585Platform, lambda name: NetworkSelftestTop(),
                       "LambdaConcept ECPIX-5 85F (LFE5UM5G-85F-8BG554), network-level "
                       "self-test (no packet engines) at 100 MHz, the CI bitstream"),
    "ecpix5-transport": Board(
        "ecpix5-transport", ECPIX585Platform,
        lambda name: TransportSelfTestTop(clock_hz=TRANSPORT_HZ),
        "LambdaConcept ECPIX-5 85F (LFE5UM5G-85F-8BG554), transport self-test: the whole NIC "
        "in loopback through the impaired fabric, 10 MHz from the PLL", router="router2"),
    "ecpix5-rgmii": Board(
        "ecpix5-rgmii", ECPIX585Platform,
        lambda name: TransportSelfTestTop(clock_hz=TRANSPORT_HZ, rgmii=True),
        "LambdaConcept ECPIX-5 85F (LFE5UM5G-85F-8BG554), transport self-test with plane 1 on "
        "the RGMII Ethernet port (1 Gb/s MAC), 10 MHz from the PLL", router="router2"),
    "versa": Board("versa", VersaECP5Platform, SelfTestTop,
                   "Lattice Versa ECP5 (LFE5UM-45F-8BG381), self-test at 100 MHz"),
    "ulx3s": Board("ulx3s", ULX3S_85F_Platform,
                   lambda name: SelfTestTop(name, pll_hz=ULX3S_HZ),
                   "Radiona ULX3S 85F (LFE5U-85F-6BG381), self-test at 50 MHz (PLL from the "
                   "25 MHz oscillator)"),
    "icebreaker": Board("icebreaker", ICEBreakerPlatform, _ice40_top,
                        "1BitSquared iCEBreaker (iCE40UP5K-SG48), reduced self-test at 12 MHz"),
}
