"""The transport self-test: the whole NIC (``hdl.nic.MrcNic``) in loopback through the impaired
fabric, brought up from a register script, with host memory and work requests on chip.

::

    BusScript (ROM) ─► bus ─► MrcNic ◄─ WorkGenerator (RDMA WRITE / WRITE WITH IMM, QP 0)
                               │  ▲ fetch_req/fetch ◄─► PatternMemory (byte = f(address))
                               │  │ place ─► PlaceChecker (every placed byte = f(address))
                               │  │ completion ─► CompletionChecker (in order, SUCCESS)
                      tx[0..P-1]  rx[0..P-1]
                               └─► ImpairedFabric ─┘ (per-plane delay, LFSR loss, kill)

QP 0 and QP 1 of the one NIC are connected to each other (the NIC's own MAC and IP as the
remote), so every data packet QP 0's requester sends crosses the fabric to QP 1's responder,
and every ACK, SACK and NAK crosses it back: retransmission, SACK loss inference, the
retransmit timer and path selection all run against a lossy multi-plane network (the port
watch is instantiated but left off, ``port_wnd`` 0). Two whole NICs do not fit the
LFE5UM5G-85F (one small-table NIC is ~46k LUT4 and 4.5k carry cells after Yosys,
docs/boards.md), so the self-test loops one back to itself.

The bring-up is what ``sim.driver.NicDriver`` does in every bench, recorded once at
elaboration time against the register map (:func:`record_bring_up`) and replayed by
:class:`BusScript` from a ROM: the same driver code, not a second copy of the sequence.

The fabric's trimmer rewrites fixed offsets of the engine self-test's one header stack and would
damage the NIC's other stacks (WRITE MIDDLE/LAST have no RETH, ACKs have no payload), so
``trim_rate`` is 0 here.
"""

import asyncio
from pathlib import Path

from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.control.nicmap import nic_register_map
from hdl.control.regmap import (
    WORD_BITS,
    CommandBlock,
    ControlBlock,
    StatusBlock,
    bus_signature,
)
from hdl.interfaces import (
    CompletionSide,
    completion_layout,
    fetch_beat_layout,
    fetch_request_layout,
    place_beat_layout,
    work_request_layout,
)
from hdl.nic import MrcNic
from hdl.packet.headers import DropReason, net_beat_layout
from hdl.util import validating
from sim import defaults as D

from .selftest import (
    ImpairedFabric,
    Reporter,
    activity_flag,
    fabric_counts,
    kill_schedule,
    popcount,
)
from .uart import UARTTx

__all__ = [
    "ScriptOp", "ScriptRecorder", "record_bring_up", "BusScript", "pattern_byte",
    "PatternMemory", "PlaceChecker", "WorkGenerator", "CompletionChecker", "wr_length",
    "wr_is_imm",
    "TRANSPORT_COUNTERS", "MONITORED", "TransportSelfTest", "transport_config",
]

_MASK = (1 << WORD_BITS) - 1
REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# The bring-up script
# ---------------------------------------------------------------------------------------------

class ScriptOp(enum.IntEnum, shape=2):
    WRITE = 0       #: write ``data`` to ``addr``
    WAIT = 1        #: read ``addr`` until bit 0 (a command block's busy flag) is clear
    EXPECT = 2      #: read ``addr``; an error unless ``value & data`` is 0 (a response's errno)
    END = 3         #: bring-up done


class ScriptRecorder:
    """A bus for :class:`~sim.driver.RegisterDriver` that records what the driver does instead
    of doing it: writes as ``WRITE``, a command's status polls as one ``WAIT``, the response
    word holding ``errno`` as an ``EXPECT`` that it is 0. Control blocks read back what was
    written (their reset values before that), so read-modify-write is exact. Any other read
    (a status block, a queue) cannot be answered ahead of time and raises ``ValueError``."""

    def __init__(self, regmap):
        self.ops = []
        self._kinds = {}
        self._words = {}
        layout = regmap.to_dict()
        for block in regmap.blocks:
            base = regmap.base(block.name)
            if isinstance(block, CommandBlock):
                self._kinds[base + block.STATUS] = ("status", 0)
                errno = [(offset, width) for path, offset, width in layout[block.name]["response"]
                         if path == "errno"]
                for index in range(block.response_words):
                    mask = 0
                    for offset, width in errno:
                        for bit in range(offset, offset + width):
                            if bit // WORD_BITS == index:
                                mask |= 1 << (bit % WORD_BITS)
                    self._kinds[base + block.response_base + index] = ("response", mask)
            elif isinstance(block, ControlBlock):
                init = regmap.reset_value(block.name)
                for index in range(block.words):
                    self._kinds[base + index] = ("control", 0)
                    self._words[base + index] = (init >> (index * WORD_BITS)) & _MASK

    async def write(self, address, value):
        self.ops.append((ScriptOp.WRITE, address, value & _MASK))
        if address in self._words:
            self._words[address] = value & _MASK

    async def read(self, address):
        kind, mask = self._kinds.get(address, (None, 0))
        if kind == "status":
            self.ops.append((ScriptOp.WAIT, address, 1))
            return 0
        if kind == "response":
            if mask:
                self.ops.append((ScriptOp.EXPECT, address, mask))
            return 0
        if kind == "control":
            return self._words[address]
        raise ValueError(f"a bring-up script cannot read address {address:#x}: only command "
                         f"status and response words and control blocks are known ahead")


#: The NIC's addresses in the transport self-test (its QPs 0 and 1 talk to each other).
LOCAL = D.NIC_A
PD = 1
RKEY_SLOT = 0
#: The memory region's key: its low bits name the responder's MR table slot.
RKEY = 0xBEE0 | RKEY_SLOT
#: First PSNs of QP 0 and QP 1: QP 0's wraps the 24-bit PSN space early in a run.
PSN_BASES = (0xFFFFC0, 0x000200)
#: Memory region: WRs write to ``MR_BASE + slot * SLOT_BYTES`` (and fetch from the same).
MR_BASE = D.MR_BASE
SLOT_BYTES = 4096
SLOTS = 16


def record_bring_up(config, *, timeout=3, port_wnd=0):
    """The register operations that bring the NIC up for the transport self-test, as
    ``[(ScriptOp, address, data)]`` ending with ``END``: local addresses, the memory region,
    ACK and requester settings, the port watch, EV profile 0 online, QP 0 <-> QP 1.

    ``timeout``: the QPs' local ACK timeout exponent (4.096 us x 2^timeout)."""
    from sim.driver.nic import NicDriver

    regmap = nic_register_map(config)
    recorder = ScriptRecorder(regmap)
    driver = NicDriver(regmap, recorder, config)
    mac, ip = D.mac_int(LOCAL.mac), D.ip_int(LOCAL, config.ip_version)

    async def bring_up():
        await driver.set_local(mac=mac, ip=ip)
        await driver.register_mr(slot=RKEY_SLOT, rkey=RKEY, pd=PD, base=MR_BASE,
                                 length=SLOTS * SLOT_BYTES)
        await driver.configure_acks(ack_every=4, ack_delay=128, nak_interval=1024)
        await driver.configure_requester(infer_k=3, cc=False)
        await driver.set_port_watch(port_wnd)
        await driver.ev_profile_online(0, D.default_profile_spec().profile,
                                       num_evs=config.evs_per_profile, min_active=1)
        for qpn in (0, 1):
            await driver.connect_qp(qpn, ev_profile=0, ev_offset=qpn, remote_qpn=1 - qpn,
                                    remote_mac=mac, remote_ip=ip, psn=PSN_BASES[qpn],
                                    remote_psn=PSN_BASES[1 - qpn], mpr=config.mpr_units,
                                    max_wimm=min(4, config.max_wimm), pd=PD, timeout=timeout)

    asyncio.run(bring_up())
    return recorder.ops + [(ScriptOp.END, 0, 0)]


def status_word(regmap, block, field):
    """The word address of a 32-bit, word-aligned field of a status block."""
    spec = regmap.block(block)
    if not isinstance(spec, StatusBlock):
        raise ValueError(f"{block} is not a status block")
    for placed in spec.fields:
        if placed.path == field:
            if placed.bit or placed.width > WORD_BITS:
                raise ValueError(f"{block}.{field} is not one aligned word")
            return regmap.base(block) + placed.word
    raise KeyError(f"{block} has no field {field!r}")


class BusScript(wiring.Component):
    """Replay a recorded register script from a ROM on the register bus, then read the
    ``monitor`` addresses round-robin forever into ``captured``.

    A ``WAIT`` that sees the busy flag set for ``timeout`` reads, or an ``EXPECT`` whose masked
    value is not 0, stops the script: ``error`` is set and ``failed_at`` holds the operation's
    index (into the recorded list). ``done`` is set at ``END``.

    Members
    -------
    bus : ``Out(bus_signature(address_bits))``
    done, error : ``Out(1)``
    failed_at : ``Out(16)``
    captured : ``Out(data.ArrayLayout(32, len(monitor)))``
    """

    def __init__(self, ops, *, address_bits, monitor=(), timeout=4096):
        with validating(self):
            if not ops or ops[-1][0] != ScriptOp.END:
                raise ValueError("ops must be a non-empty script ending with ScriptOp.END")
            for op, address, value in ops:
                if not 0 <= address < 1 << address_bits or not 0 <= value <= _MASK:
                    raise ValueError(f"script operation {(op, address, value)!r} is out of "
                                     f"range ({address_bits}-bit address, 32-bit data)")
            if not isinstance(timeout, int) or timeout < 1:
                raise ValueError(f"timeout must be a positive integer, not {timeout!r}")
        self._ops = list(ops)
        self._address_bits = address_bits
        self._monitor = tuple(monitor)
        self._timeout = timeout
        super().__init__({
            "bus": Out(bus_signature(address_bits)),
            "done": Out(1),
            "error": Out(1),
            "failed_at": Out(16),
            "captured": Out(data.ArrayLayout(32, max(1, len(self._monitor)))),
        })

    def elaborate(self, platform):
        m = Module()
        entry = data.StructLayout({"op": ScriptOp, "addr": self._address_bits,
                                   "data": WORD_BITS})
        init = [{"op": op, "addr": address, "data": value}
                for op, address, value in self._ops]
        m.submodules.rom = rom = Memory(shape=entry, depth=len(init), init=init)
        port = rom.read_port()
        pc = Signal(range(len(init)))
        tries = Signal(range(self._timeout + 1))
        m.d.comb += port.addr.eq(pc)
        op = port.data

        monitor = self._monitor
        mon_index = Signal(range(max(1, len(monitor))))
        mon_addr = Signal(self._address_bits)
        with m.Switch(mon_index):
            for n, address in enumerate(monitor):
                with m.Case(n):
                    m.d.comb += mon_addr.eq(address)

        with m.FSM():
            with m.State("LOAD"):               # the ROM's output follows pc a cycle later
                m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += self.bus.addr.eq(op.addr)
                with m.Switch(op.op):
                    with m.Case(ScriptOp.WRITE):
                        m.d.comb += [self.bus.w_data.eq(op.data), self.bus.w_en.eq(1)]
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "LOAD"
                    with m.Case(ScriptOp.WAIT, ScriptOp.EXPECT):
                        m.d.comb += self.bus.r_en.eq(1)
                        m.next = "CHECK"
                    with m.Case(ScriptOp.END):
                        m.d.sync += self.done.eq(1)
                        m.next = "MONITOR" if monitor else "IDLE"
            with m.State("CHECK"):
                m.d.comb += self.bus.addr.eq(op.addr)
                failed = Signal()
                with m.If(op.op == ScriptOp.WAIT):
                    with m.If(self.bus.r_data[0]):
                        m.d.sync += tries.eq(tries + 1)
                        m.d.comb += failed.eq(tries == self._timeout - 1)
                        m.next = "EXEC"
                    with m.Else():
                        m.d.sync += [tries.eq(0), pc.eq(pc + 1)]
                        m.next = "LOAD"
                with m.Else():
                    with m.If((self.bus.r_data & op.data) != 0):
                        m.d.comb += failed.eq(1)
                    with m.Else():
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "LOAD"
                with m.If(failed):
                    m.d.sync += [self.error.eq(1), self.failed_at.eq(pc)]
                    m.next = "IDLE"
            with m.State("MONITOR"):
                m.d.comb += [self.bus.addr.eq(mon_addr), self.bus.r_en.eq(1)]
                m.next = "CAPTURE"
            with m.State("CAPTURE"):
                m.d.comb += self.bus.addr.eq(mon_addr)
                m.d.sync += self.captured[mon_index].eq(self.bus.r_data)
                m.d.sync += mon_index.eq(Mux(mon_index == len(monitor) - 1, 0, mon_index + 1))
                m.next = "MONITOR"
            with m.State("IDLE"):
                pass
        return m


# ---------------------------------------------------------------------------------------------
# Host memory and work
# ---------------------------------------------------------------------------------------------

def pattern_byte(address):
    """The byte the self-test's host memory holds at ``address`` (fetch and place alike)."""
    return (address ^ (address >> 8) ^ (address >> 16) ^ 0x5A) & 0xFF


def _hw_pattern(address):
    return (address[0:8] ^ address[8:16] ^ address[16:24] ^ 0x5A)[:8]


class PatternMemory(wiring.Component):
    """Answers the requester's payload fetches: ``length`` bytes from ``addr``, byte at address
    ``a`` = :func:`pattern_byte` ``(a)``, in ``ceil(length / L)`` beats, one per cycle (a
    request of length 0 gets one empty beat with ``last``)."""

    def __init__(self, config):
        self._config = config
        super().__init__({
            "req": In(stream.Signature(fetch_request_layout(config))),
            "o": Out(stream.Signature(fetch_beat_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._config.data_width // 8
        addr = Signal(24)
        left = Signal(16)
        busy = Signal()
        m.d.comb += self.req.ready.eq(~busy)
        with m.If(self.req.valid & self.req.ready):
            m.d.sync += [addr.eq(self.req.p.addr[:24]), left.eq(self.req.p.length),
                         busy.eq(1)]
        last = Signal()
        m.d.comb += [
            last.eq(left <= lanes),
            self.o.valid.eq(busy),
            self.o.p.last.eq(last),
        ]
        for lane in range(lanes):
            m.d.comb += [
                self.o.p.data[8 * lane:8 * lane + 8].eq(_hw_pattern((addr + lane)[:24])),
                self.o.p.keep[lane].eq(left > lane),
            ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [addr.eq(addr + lanes), left.eq(left - lanes)]
            with m.If(last):
                m.d.sync += busy.eq(0)
        return m


class PlaceChecker(wiring.Component):
    """Always ready; every byte the responder places must equal :func:`pattern_byte` of its
    address. Counts placed bytes and bad beats."""

    def __init__(self, config):
        self._config = config
        super().__init__({
            "i": In(stream.Signature(place_beat_layout(config))),
            "bytes": Out(32),
            "bad": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._config.data_width // 8
        m.d.comb += self.i.ready.eq(1)
        # Registered first, compared a cycle later: off the responder's paths.
        beat = Signal.like(self.i.payload)
        valid = Signal()
        m.d.sync += [beat.eq(self.i.payload), valid.eq(self.i.valid)]
        mismatch = Signal(lanes)
        for lane in range(lanes):
            expect = _hw_pattern((beat.addr[:24] + lane)[:24])
            m.d.comb += mismatch[lane].eq(beat.keep[lane] &
                                          (beat.data[8 * lane:8 * lane + 8] != expect))
        with m.If(valid):
            m.d.sync += self.bytes.eq(self.bytes + popcount(beat.keep))
            with m.If(mismatch.any()):
                m.d.sync += self.bad.eq(self.bad + 1)
        return m


#: Work request n is 1 + (WR_STEP * n mod WR_MTUS * MTU) bytes long: 1 byte to 3 MTUs.
WR_STEP = 389
WR_MTUS = 3


def wr_length(n, mtu):
    """Bytes of work request ``n``: 1 to 3 MTUs, stepping by 389 (every remainder occurs)."""
    return 1 + (WR_STEP * n) % (WR_MTUS * mtu)


def _next_length(length, mtu):
    """Hardware: the length of the next work request from this one's (no multiplier)."""
    step, span = WR_STEP % (WR_MTUS * mtu), WR_MTUS * mtu
    return Mux(length + step > span, length + step - span, length + step)


#: Every IMM_EVERY-th work request (n = IMM_EVERY - 1, 2 IMM_EVERY - 1, ...) is WITH IMMEDIATE.
IMM_EVERY = 4


def wr_is_imm(n):
    return n % IMM_EVERY == IMM_EVERY - 1


class WorkGenerator(wiring.Component):
    """RDMA WRITEs from QP 0 to QP 1: work request ``n`` writes :func:`wr_length` ``(n)`` bytes
    from and to ``MR_BASE + (n mod 16) * 4096`` (the same address on both sides, so the placed
    bytes equal the fetched ones), every fourth one WITH IMMEDIATE (``imm`` = ``n``);
    ``wr_id`` = ``n``. At most ``outstanding`` WRs without a requester completion; ``limit``
    WRs in all (0: forever)."""

    def __init__(self, config, *, outstanding=4):
        self._config = config
        self._outstanding = outstanding
        super().__init__({
            "o": Out(stream.Signature(work_request_layout(config))),
            "enable": In(1),
            "limit": In(32),
            "completed": In(32),
            "posted": Out(32),
            "bytes": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        mtu = self._config.mtu
        length = Signal(range(WR_MTUS * mtu + 1), init=wr_length(0, mtu))
        slot = Signal(range(SLOTS))
        in_flight = Signal(32)
        m.d.comb += in_flight.eq(self.posted - self.completed)
        room = Signal()
        m.d.comb += room.eq((in_flight < self._outstanding) &
                            ((self.limit == 0) | (self.posted < self.limit)))
        address = MR_BASE + Cat(Const(0, 12), slot)
        m.d.comb += [
            self.o.valid.eq(self.enable & room),
            self.o.p.qpn.eq(0),
            self.o.p.opcode.eq(Mux(self.posted % IMM_EVERY == IMM_EVERY - 1,
                                   P.WrOpcode.RDMA_WRITE_WITH_IMM, P.WrOpcode.RDMA_WRITE)),
            self.o.p.wr_id.eq(self.posted),
            self.o.p.local_addr.eq(address),
            self.o.p.remote_addr.eq(address),
            self.o.p.rkey.eq(RKEY),
            self.o.p.length.eq(length),
            self.o.p.imm.eq(self.posted),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [
                self.posted.eq(self.posted + 1),
                self.bytes.eq(self.bytes + length),
                slot.eq(slot + 1),
                length.eq(_next_length(length, mtu)),
            ]
        return m


class CompletionChecker(wiring.Component):
    """Always ready. Requester completions must come in WR order (``wr_id`` = 0, 1, ...) with
    status SUCCESS and ``byte_len`` = :func:`wr_length`; responder completions (the WRITE
    WITH IMMEDIATEs) in order with ``imm`` = their WR number. Anything else counts as bad."""

    def __init__(self, config):
        self._config = config
        super().__init__({
            "i": In(stream.Signature(completion_layout(config))),
            "completed": Out(32),
            "received": Out(32),
            "bad": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        mtu = self._config.mtu
        length = Signal(range(WR_MTUS * mtu + 1), init=wr_length(0, mtu))
        expect_imm = Signal(32, init=IMM_EVERY - 1)
        c = Signal.like(self.i.payload)
        valid = Signal()
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += [c.eq(self.i.payload), valid.eq(self.i.valid)]
        with m.If(valid):
            with m.If(c.side == CompletionSide.REQUESTER):
                m.d.sync += [
                    self.completed.eq(self.completed + 1),
                    length.eq(_next_length(length, mtu)),
                ]
                with m.If((c.wr_id != self.completed) | (c.status != P.CompletionStatus.SUCCESS)
                          | (c.qpn != 0) | (c.byte_len != length)):
                    m.d.sync += self.bad.eq(self.bad + 1)
            with m.Else():
                m.d.sync += [self.received.eq(self.received + 1),
                             expect_imm.eq(expect_imm + IMM_EVERY)]
                with m.If(~c.imm_valid | (c.imm != expect_imm) | (c.qpn != 1) |
                          (c.status != P.CompletionStatus.SUCCESS)):
                    m.d.sync += self.bad.eq(self.bad + 1)
        return m


# ---------------------------------------------------------------------------------------------
# The transport self-test
# ---------------------------------------------------------------------------------------------

def transport_config(clock_hz, *, data_width=64):
    """The NIC of the transport self-test: two planes, two QPs, one 128-PSN window, one EV
    profile of 8 EVs, 512-byte MTU, 4 WR slots: every block of the NIC, small tables."""
    return NicConfig(data_width=data_width, ports=2, qps=2, mpr_units=1,
                     ev_profiles=1, evs_per_profile=8, mtu=512, max_wimm=4, wr_slots=4,
                     clock_hz=int(clock_hz))


#: NIC counters read over the register bus after bring-up: (UART name, block, field).
MONITORED = (
    ("retx", "requester_counters", "retransmissions"),
    ("timeouts", "requester_counters", "timeouts"),
    ("inferred", "requester_counters", "inferred_losses"),
    ("dup", "responder_counters", "duplicate"),
)

#: Counters of :class:`TransportSelfTest`, in the UART line; ``MONITORED`` names follow.
TRANSPORT_COUNTERS = (
    "posted",       # work requests handed to the NIC
    "completed",    # requester completions (in order, SUCCESS)
    "imm",          # responder completions of WRITE WITH IMM
    "placed",       # payload bytes the responder placed (retransmitted bytes again)
    "bad",          # completion or placement check failures
    "lost",         # frames the fabric lost
    "killed",       # frames dropped on a killed plane
    "dropped",      # frames the parser dropped
    "script",       # 0 while bringing up, 1 when up, 2 + the failed operation on error
)


class TransportSelfTest(wiring.Component):
    """Bring-up script, one :class:`~hdl.nic.MrcNic` in loopback through the impaired fabric,
    work generator, pattern memory, checkers, UART report and LED status.

    When all is well: ``script`` = 1, ``completed`` follows ``posted`` (at most
    ``outstanding`` behind), ``imm`` = the WITH IMMEDIATE WRs among ``completed``, ``bad`` =
    ``dropped`` = 0 and lost or killed frames show as ``retx`` (retransmissions), not as
    missing completions.

    Parameters
    ----------
    config : NicConfig
        From :func:`transport_config` (``qps`` at least 2).
    delays : tuple of int
        Per-plane fabric delay in cycles, one per port.
    loss_rate : int
        Per-frame loss probability in 1/256, every plane (data and ACKs alike).
    report_period, baud, auto_kill, wr_limit, timeout
        As :class:`~boards.selftest.SelfTest`; ``wr_limit`` stops after that many work
        requests (0: never); ``timeout`` is the QPs' local ACK timeout exponent. ``auto_kill``
        kills the last on-chip plane.
    external_planes : tuple of int
        Planes that leave the chip instead of crossing the fabric (a real port,
        :mod:`boards.rgmii`): their frames go out on ``ext_tx`` and come back on ``ext_rx``
        (their ``delays`` entries are unused). At least one plane stays on chip.
    extra_counters : tuple of str
        Names of counters from outside (e.g. a real port's, ``boards.rgmii.PORT_COUNTERS``),
        given on ``extra`` and appended to the UART line.
    knobs : bool
        Take the loss rate and the WR limit from the ``loss_rate`` and ``wr_limit`` inputs
        instead of building ``loss_rate`` and ``wr_limit`` in: one build of the design then
        serves simulator runs with different values (``sim/tb/selftest.py``).

    Members
    -------
    uart_tx, kill, heartbeat, activity, error, killed_planes : as ``SelfTest``.
    ext_tx, ext_rx : ``Out/In(stream.Signature(net_beat_layout(W))).array(len(external_planes))``
        The external planes' frames, when there are any.
    extra : ``In(data.ArrayLayout(32, len(extra_counters)))``, when there are any.
    loss_rate : ``In(8)``, wr_limit : ``In(32)``: with ``knobs``.
    up : ``Out(1)``: the bring-up script finished without error.
    counters : ``Out(data.ArrayLayout(32, len(counter_names)))``
    """

    def __init__(self, *, config, delays=None, loss_rate=8, report_period=None, baud=115200,
                 auto_kill=False, wr_limit=0, outstanding=4, timeout=3, external_planes=(),
                 extra_counters=(), knobs=False):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
            if config.qps < 2:
                raise ValueError(f"config.qps must be at least 2 (QP 0 talks to QP 1), "
                                 f"not {config.qps}")
            delays = tuple(16 + 24 * p for p in range(config.ports)) if delays is None \
                else delays
            if not isinstance(delays, tuple) or len(delays) != config.ports:
                raise ValueError(f"delays must be a tuple of {config.ports} plane delays, "
                                 f"not {delays!r}")
            if not isinstance(external_planes, tuple) or \
                    len(set(external_planes)) != len(external_planes) or \
                    len(external_planes) >= config.ports or \
                    not all(isinstance(p, int) and 0 <= p < config.ports
                            for p in external_planes):
                raise ValueError(f"external_planes must be a tuple of distinct planes from 0 "
                                 f"to {config.ports - 1}, leaving at least one on chip, "
                                 f"not {external_planes!r}")
            if not isinstance(extra_counters, tuple) or \
                    not all(isinstance(n, str) and n.isidentifier() for n in extra_counters):
                raise ValueError(f"extra_counters must be a tuple of identifiers, "
                                 f"not {extra_counters!r}")
            if not isinstance(loss_rate, int) or not 0 <= loss_rate <= 255:
                raise ValueError(f"loss_rate must be an integer from 0 to 255, "
                                 f"not {loss_rate!r}")
            report_period = config.clock_hz if report_period is None else report_period
            divisor = round(config.clock_hz / baud)
            if divisor < 2:
                raise ValueError(f"baud must be at most clock_hz / 2, not {baud!r}")
        self._config = config
        self._delays = delays
        self._loss_rate = loss_rate
        self._report_period = report_period
        self._divisor = divisor
        self._auto_kill = auto_kill
        self._external = external_planes
        self._extra = extra_counters
        self._internal = tuple(p for p in range(config.ports) if p not in external_planes)
        self._wr_limit = wr_limit
        self._knobs = knobs
        self._outstanding = outstanding
        self.nic = MrcNic(config)
        self.script = record_bring_up(config, timeout=timeout)
        regmap = self.nic.register_map
        self.monitor = tuple(status_word(regmap, block, field) for _, block, field in MONITORED)
        ports = config.ports
        beat = stream.Signature(net_beat_layout(config.data_width))
        external = {"ext_tx": Out(beat).array(len(external_planes)),
                    "ext_rx": In(beat).array(len(external_planes))} if external_planes else {}
        if extra_counters:
            external["extra"] = In(data.ArrayLayout(32, len(extra_counters)))
        if knobs:
            external["loss_rate"] = In(8, init=loss_rate)
            external["wr_limit"] = In(32, init=wr_limit)
        super().__init__({
            **external,
            "uart_tx": Out(1, init=1),
            "kill": In(ports),
            "counters": Out(data.ArrayLayout(32, len(self.counter_names))),
            "up": Out(1),
            "heartbeat": Out(1),
            "activity": Out(1),
            "error": Out(1),
            "killed_planes": Out(ports),
        })

    @property
    def config(self):
        return self._config

    @property
    def counter_names(self):
        return TRANSPORT_COUNTERS + tuple(name for name, _, _ in MONITORED) + self._extra

    def elaborate(self, platform):
        m = Module()
        config = self._config
        ports = config.ports
        names = self.counter_names
        index = {name: n for n, name in enumerate(names)}

        m.submodules.nic = nic = self.nic
        m.submodules.script = script = BusScript(
            self.script, address_bits=nic.register_map.address_bits, monitor=self.monitor)
        internal = self._internal
        m.submodules.fabric = fabric = ImpairedFabric(
            data_width=config.data_width, delays=tuple(self._delays[p] for p in internal),
            trim_dscp=config.trim_dscp)
        m.submodules.memory = memory = PatternMemory(config)
        m.submodules.place = place = PlaceChecker(config)
        m.submodules.work = work = WorkGenerator(config, outstanding=self._outstanding)
        m.submodules.completions = completions = CompletionChecker(config)
        m.submodules.reporter = reporter = Reporter(names=names, period=self._report_period)
        m.submodules.uart = uart = UARTTx(divisor=self._divisor)

        wiring.connect(m, script.bus, nic.bus)
        for n, p in enumerate(internal):
            wiring.connect(m, nic.tx[p], fabric.i[n])
            wiring.connect(m, fabric.o[n], nic.rx[p])
        for n, p in enumerate(self._external):
            wiring.connect(m, nic.tx[p], wiring.flipped(self.ext_tx[n]))
            wiring.connect(m, wiring.flipped(self.ext_rx[n]), nic.rx[p])
        wiring.connect(m, nic.fetch_req, memory.req)
        wiring.connect(m, memory.o, nic.fetch)
        wiring.connect(m, nic.place, place.i)
        wiring.connect(m, work.o, nic.wr)
        wiring.connect(m, nic.completion, completions.i)
        wiring.connect(m, reporter.o, uart.i)
        m.d.comb += [
            self.uart_tx.eq(uart.tx),
            self.up.eq(script.done & ~script.error),
            work.enable.eq(self.up),
            work.limit.eq(self.wr_limit if self._knobs else self._wr_limit),
            work.completed.eq(completions.completed),
            fabric.loss_rate.eq(self.loss_rate if self._knobs else self._loss_rate),
            fabric.trim_rate.eq(0),
        ]

        auto = kill_schedule(m, tick=reporter.tick, heartbeat=self.heartbeat, planes=ports,
                             plane=internal[-1] if self._auto_kill else None)
        kill = Signal(ports)
        m.d.sync += kill.eq((self.kill | auto) & sum(1 << p for p in internal))
        m.d.comb += [fabric.kill.eq(Cat(kill[p] for p in internal)),
                     self.killed_planes.eq(kill)]

        _, counts = fabric_counts(m, fabric, ("lost", "killed"))
        dropped = Signal(32)
        with m.If(nic.rx_verdict_valid & (nic.rx_verdict_reason != DropReason.NONE)):
            m.d.sync += dropped.eq(dropped + 1)
        bad = Signal(32)
        m.d.sync += bad.eq(completions.bad + place.bad)
        state = Signal(32)
        m.d.sync += state.eq(Mux(script.error, 2 + script.failed_at, script.done))

        counters = self.counters
        m.d.comb += [
            counters[index["posted"]].eq(work.posted),
            counters[index["completed"]].eq(completions.completed),
            counters[index["imm"]].eq(completions.received),
            counters[index["placed"]].eq(place.bytes),
            counters[index["bad"]].eq(bad),
            counters[index["lost"]].eq(counts["lost"]),
            counters[index["killed"]].eq(counts["killed"]),
            counters[index["dropped"]].eq(dropped),
            counters[index["script"]].eq(state),
        ]
        for n, (name, _, _) in enumerate(MONITORED):
            m.d.comb += counters[index[name]].eq(script.captured[n])
        for n, name in enumerate(self._extra):
            m.d.comb += counters[index[name]].eq(self.extra[n])
        m.d.comb += reporter.values.eq(counters)

        activity_flag(m, tick=reporter.tick, progress=completions.completed,
                      activity=self.activity)
        with m.If((bad != 0) | (dropped != 0) | script.error):
            m.d.sync += self.error.eq(1)
        return m
