"""The two-NIC bench's stream agents in C++ (``sim/tb/dpi_ports.cpp``), for Verilator.

The Python agents of :mod:`sim.tb.harness` wake once per clock cycle and read or write a
handle for every beat that moves; for two NICs on 8 planes that Python, not the simulator,
sets the pace. Here a generated wrapper, ``nic_pair_dpi``, instantiates the pair and, at every
rising edge, calls the C++ agents through DPI for each stream port, in the order the Python
loop steps its agents: host memory (fetch requests, fetch beats, placement), the work-request
source, the completion sink, the receive sources and the transmit sinks of NIC ``a``, then
those of NIC ``b``, then the fabric's delivery. Without bubbles or backpressure the agents are
the Python ones beat for beat, so a run gives the same result either way; with them, sources
insert bubbles and sinks drop ready by the same rules, drawn from a generator of their own.

Python (the cocotb test, in the same process) reaches the agents through :mod:`ctypes`: it
hands over frames the fabric delivers (with the cycle they are due at), work requests and host
memory contents, and takes the frames the NICs sent and the completions. It sleeps until the
wrapper's ``attention`` output changes (a frame left a NIC, a completion arrived, a host access
fell outside memory), so it wakes per frame, not per cycle.

The register buses are driven by a bus master in C++ too (:class:`DpiBus`), with the timing of
:class:`sim.tb.cocotb_host.CocotbBus`; Python waits once per access instead of once per clock
edge and writes no handle. Icarus has no DPI: benches there and runs with waves use the
Python agents (:func:`uses_dpi`); ``MRC_HARNESS=python`` asks for them in any run.
"""

import ctypes
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from hdl.interfaces import (
    completion_layout,
    fetch_beat_layout,
    fetch_request_layout,
    place_beat_layout,
    work_request_layout,
)
from hdl.packet.headers import net_beat_layout

from .streams import _plan

__all__ = ["DPI_SOURCE", "DPI_TOP", "StreamPlan", "stream_plan", "wrapper_sv",
           "verilator_args", "DpiAgents", "DpiBus", "DpiPair", "DpiGroup", "GROUP_DPI_TOP",
           "uses_dpi", "dpi_key", "pair_build",
           "MAX_PAYLOAD_BITS", "MAX_STREAMS"]

#: The C++ agents.
DPI_SOURCE = Path(__file__).with_name("dpi_ports.cpp")
#: The wrapper's module name.
DPI_TOP = "nic_pair_dpi"
#: The wrapper's module name around a group of NICs (:class:`DpiGroup`).
GROUP_DPI_TOP = "nic_group_dpi"
#: The widest payload a DPI call passes (``MAX_WORDS`` 32-bit words in the C++).
MAX_PAYLOAD_BITS = 512
#: The most streams the agents serve (``BUSY_WORDS`` 32-bit words of the busy mask).
MAX_STREAMS = 128

# Roles, as ``enum Role`` of the C++.
RX, TX, BEAT_SOURCE, BEAT_SINK, FETCH_REQ, FETCH, PLACE = range(7)
_SOURCES = (RX, BEAT_SOURCE, FETCH)
_FIELDS = ("data", "keep", "last", "first", "addr", "length")

# Event kinds of ``mrc_drain``.
_FRAME, _COMPLETION, _BACKLOG, _ERROR, _PLACEMENT, _STALL = range(6)
#: First bytes of a placed packet that a placement record keeps (``PLACE_HEAD`` in the C++).
PLACE_HEAD = 16


@dataclass(frozen=True)
class StreamPlan:
    """One stream port the C++ agents drive: its port prefix on the pair (``a_rx__0``), role,
    side (0 for ``a``), payload width and field offsets (``(at, width)``, ``(-1, 0)`` for a
    field the layout lacks)."""
    prefix: str
    role: int
    side: int
    width: int
    fields: tuple


def _fields(layout):
    plan = {name: (offset, width) for name, offset, width, _ in _plan(layout)}
    return tuple(plan.get(name, (-1, 0)) for name in _FIELDS)


def stream_plan(config, names="ab"):
    """The stream ports in the order the agents step (their DPI ids are the indices), for the
    NICs ``names`` (side i is ``names[i]``)."""
    net = net_beat_layout(config.data_width)
    layouts = {
        FETCH_REQ: fetch_request_layout(config), FETCH: fetch_beat_layout(config),
        PLACE: place_beat_layout(config), BEAT_SOURCE: work_request_layout(config),
        BEAT_SINK: completion_layout(config), RX: net, TX: net,
    }
    out = []
    for side, name in enumerate(names):
        ports = [(f"{name}_fetch_req", FETCH_REQ), (f"{name}_fetch", FETCH),
                 (f"{name}_place", PLACE), (None, None), (f"{name}_wr", BEAT_SOURCE),
                 (f"{name}_completion", BEAT_SINK)]
        ports += [(f"{name}_rx__{p}", RX) for p in range(config.ports)]
        ports += [(f"{name}_tx__{p}", TX) for p in range(config.ports)]
        for prefix, role in ports:
            if prefix is None:          # the memory's own step, after its three ports
                out.append(StreamPlan(f"{name}_memory", -1, side, 0, ()))
                continue
            layout = layouts[role]
            width = layout.size
            if width > MAX_PAYLOAD_BITS:
                raise ValueError(f"{prefix}: a {width}-bit payload is wider than the DPI "
                                 f"agents pass ({MAX_PAYLOAD_BITS} bits)")
            out.append(StreamPlan(prefix, role, side, width, _fields(layout)))
    if len(out) > MAX_STREAMS:
        raise ValueError(f"ports: {config.ports} ports give {len(out)} streams; the DPI agents "
                         f"take at most {MAX_STREAMS}")
    return out


_PORT = re.compile(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):0\]\s+)?(\w+)\s*;",
                   re.M)


def _module_ports(text, module):
    """{name: (direction, width)} of ``module`` in exported Verilog ``text``."""
    start = re.search(rf"^module {re.escape(module)}\b", text, re.M)
    if not start:
        raise ValueError(f"no module {module} in the exported design")
    end = text.index("endmodule", start.end())
    return {m.group(3): (m.group(1), int(m.group(2) or 0) + 1)
            for m in _PORT.finditer(text[start.end():end])}


def wrapper_sv(pair_text, config, pair_module="nic_pair", names="ab", top=DPI_TOP):
    """The wrapper module ``top`` (:data:`DPI_TOP`) around ``pair_module`` (defined in
    ``pair_text``, with the NICs ``names``): clock, reset and every NIC's register bus as
    ports, every stream port driven by the agents, and the ``attention`` counter."""
    ports = _module_ports(pair_text, pair_module)
    plan = stream_plan(config, names)
    pad = MAX_PAYLOAD_BITS
    lines = [f"module {top}(", "    input clk,", "    input rst,",
             *(f"    output reg [31:0] bus_done_{name}," for name in names),
             "    output reg [31:0] attention", ");"]
    lines += [
        '    import "DPI-C" function void mrc_edge_begin(output bit [127:0] busy, '
        'output bit backpressure);',
        '    import "DPI-C" function bit mrc_source(input int id, input bit ready, '
        f'output bit [{pad - 1}:0] payload);',
        f'    import "DPI-C" function void mrc_sink(input int id, input bit [{pad - 1}:0] '
        'payload);',
        '    import "DPI-C" function bit mrc_sink_ready(input int id);',
        '    import "DPI-C" function void mrc_memory_step(input int side);',
        '    import "DPI-C" function int mrc_edge_end();',
        '    import "DPI-C" function void mrc_bus_step(input int side, output bit [31:0] addr, '
        'output bit [31:0] w_data, output bit w_en, output bit r_en);',
        '    import "DPI-C" function int mrc_bus_sample(input int side, '
        'input bit [31:0] r_data);',
        "    bit [31:0] bus_addr;",
        "    bit [31:0] bus_w_data;",
        "    bit bus_w_en;",
        "    bit bus_r_en;",
        *(f"    initial bus_done_{name} = 0;" for name in names),
        f"    bit [{pad - 1}:0] beat;",
        "    bit [127:0] busy;",
        "    bit valid;",
        "    bit backpressure;",
        "    initial attention = 0;",
    ]
    connect = {"clk": "clk", "rst": "rst"}
    body = []
    falling = []
    for side, name in enumerate(names):
        bus = {field: ports.get(f"{name}_bus__{field}") for field in
               ("addr", "w_data", "w_en", "r_en", "r_data")}
        missing = [field for field, port in bus.items() if port is None]
        if missing:
            raise ValueError(f"the exported pair has no port {name}_bus__{missing[0]}")
        aw, dw, rw = bus["addr"][1], bus["w_data"][1], bus["r_data"][1]
        if max(aw, dw, rw) > 32:
            raise ValueError(f"{name}_bus: the DPI bus master drives 32-bit addresses and data")
        lines += [f"    reg [{aw - 1}:0] {name}_addr = 0;",
                  f"    reg [{dw - 1}:0] {name}_w_data = 0;",
                  f"    reg {name}_w_en = 0;", f"    reg {name}_r_en = 0;",
                  f"    wire [{rw - 1}:0] {name}_r_data;"]
        connect.update({f"{name}_bus__addr": f"{name}_addr",
                        f"{name}_bus__w_data": f"{name}_w_data",
                        f"{name}_bus__w_en": f"{name}_w_en", f"{name}_bus__r_en": f"{name}_r_en",
                        f"{name}_bus__r_data": f"{name}_r_data"})
        body += [f"        mrc_bus_step({side}, bus_addr, bus_w_data, bus_w_en, bus_r_en);",
                 f"        {name}_addr <= bus_addr[{aw - 1}:0];",
                 f"        {name}_w_data <= bus_w_data[{dw - 1}:0];",
                 f"        {name}_w_en <= bus_w_en;", f"        {name}_r_en <= bus_r_en;"]
        r_data = f"{{{32 - rw}'b0, {name}_r_data}}" if rw < 32 else f"{name}_r_data"
        falling.append(f"        bus_done_{name} <= mrc_bus_sample({side}, {r_data});")
    for index, s in enumerate(plan):
        if s.role < 0:
            body.append(f"        mrc_memory_step({s.side});")
            continue
        v, r, p = f"{s.prefix}__valid", f"{s.prefix}__ready", f"{s.prefix}__payload"
        for name in (v, r, p):
            if name not in ports:
                raise ValueError(f"the exported pair has no port {name}")
        if s.role in _SOURCES:
            lines += [f"    reg s{index}_valid = 0;",
                      f"    reg [{s.width - 1}:0] s{index}_payload = 0;",
                      f"    wire s{index}_ready;"]
            connect.update({v: f"s{index}_valid", p: f"s{index}_payload", r: f"s{index}_ready"})
            body += [f"        if (busy[{index}]) begin",
                     f"            valid = mrc_source({index}, s{index}_ready, beat);",
                     f"            s{index}_valid <= valid;",
                     f"            s{index}_payload <= beat[{s.width - 1}:0];",
                     "        end"]
        else:
            lines += [f"    wire s{index}_valid;", f"    wire [{s.width - 1}:0] s{index}_payload;",
                      f"    reg s{index}_ready = 1;"]
            connect.update({v: f"s{index}_valid", p: f"s{index}_payload", r: f"s{index}_ready"})
            body += [f"        if (s{index}_valid && s{index}_ready) mrc_sink({index}, "
                     f"{{{pad - s.width}'b0, s{index}_payload}});",
                     f"        if (backpressure) s{index}_ready <= mrc_sink_ready({index});"]
    lines.append(f"    {pair_module} pair (")
    lines.append(",\n".join(f"        .{port}({signal})" for port, signal in connect.items()))
    lines.append("    );")
    lines += ["    always @(posedge clk) begin", "        mrc_edge_begin(busy, backpressure);",
              *body,
              "        attention <= mrc_edge_end();", "    end",
              "    always @(negedge clk) begin", *falling, "    end", "endmodule", ""]
    return "\n".join(lines)


def verilator_args():
    """Verilator arguments that compile the agents into the model and export their symbols
    from the executable, so that :mod:`ctypes` finds them in the running simulator."""
    return [str(DPI_SOURCE), "-LDFLAGS", "-Wl,--export-dynamic"]


class DpiAgents:
    """The C++ agents, from the cocotb test (ctypes into the running simulator).

    ``first_step_edge``: the rising edge (counting from 1) at which the agents first step, as
    cycle 1. ``backlog_cycles``: sample every receive port's queued beats every that many
    cycles after :meth:`set_start`. ``names``: the NICs of the build (side i is
    ``names[i]``): the pair's ``ab``, or a group's (:class:`DpiGroup`).
    """

    def __init__(self, config, *, first_step_edge, backlog_cycles, latency=4, names="ab"):
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "mrc_reset"):
            raise RuntimeError("the simulator was built without the DPI agents "
                               f"({DPI_SOURCE.name})")
        self._lib = lib
        i64, u64, i32 = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int
        lib.mrc_reset.argtypes = [i64, i64]
        lib.mrc_add_stream.argtypes = [i32, i32, i32, ctypes.POINTER(i32)]
        lib.mrc_add_stream.restype = i32
        lib.mrc_set_latency.argtypes = [i32, i32]
        lib.mrc_set_random.argtypes = [i32, ctypes.c_double, u64]
        lib.mrc_add_region.argtypes = [i32, u64, u64]
        lib.mrc_memory_write.argtypes = [i32, u64, ctypes.c_char_p, u64]
        lib.mrc_memory_read.argtypes = [i32, u64, ctypes.c_char_p, u64]
        lib.mrc_memory_write.restype = lib.mrc_memory_read.restype = i32
        lib.mrc_deliver.argtypes = [i32, i64, i64, u64, ctypes.c_char_p, ctypes.c_uint32]
        lib.mrc_send_beats.argtypes = [i32, ctypes.c_char_p, i32, i32]
        lib.mrc_drain.argtypes = [ctypes.c_void_p, u64]
        lib.mrc_drain.restype = u64
        lib.mrc_edge.restype = lib.mrc_cycle.restype = i64
        lib.mrc_set_start.argtypes = [i64]
        lib.mrc_set_first_edge.argtypes = [i64]
        lib.mrc_queued.argtypes = lib.mrc_beats.argtypes = [i32]
        lib.mrc_queued.restype = lib.mrc_beats.restype = u64
        lib.mrc_error.restype = ctypes.c_char_p
        lib.mrc_bus_access.argtypes = [i32, i32, ctypes.c_uint32, ctypes.c_uint32]
        lib.mrc_bus_result.argtypes = [i32]
        lib.mrc_bus_result.restype = ctypes.c_uint32
        lib.mrc_set_place_log.argtypes = [i32]
        lib.mrc_set_stall_bound.argtypes = [i64]
        lib.mrc_max_stall.argtypes = [i32]
        lib.mrc_max_stall.restype = i64
        lib.mrc_reset(first_step_edge, backlog_cycles)
        self.names = tuple(names)
        self.plan = stream_plan(config, names)
        self.ids = {}
        for index, s in enumerate(self.plan):
            flat = [value for pair in (s.fields or ((-1, 0),) * 6) for value in pair]
            got = lib.mrc_add_stream(max(s.role, 0) if s.role >= 0 else 7, s.side, s.width,
                                     (i32 * 12)(*flat))
            assert got == index, (got, index)
            self.ids[s.prefix] = index
        for side in range(len(names)):
            lib.mrc_set_latency(side, latency)
        self.rx = {name: [self.ids[f"{name}_rx__{p}"] for p in range(config.ports)]
                   for name in names}
        self.tx_port = {}
        for name in names:
            for p in range(config.ports):
                self.tx_port[self.ids[f"{name}_tx__{p}"]] = (name, p)
        self.cq_side = {self.ids[f"{name}_completion"]: name for name in names}
        self.place_side = {self.ids[f"{name}_place"]: name for name in names}
        self.prefixes = {index: s.prefix for index, s in enumerate(self.plan)}
        self._buffer = ctypes.create_string_buffer(1 << 16)
        self.backlog = []           # (cycle, [queued beats per receive port, a then b])

    def set_place_log(self, on=True):
        """Record every placed packet (``("placement", ...)`` from :meth:`drain`); a placement
        byte outside every host region is then counted in its record instead of stopping the
        run."""
        self._lib.mrc_set_place_log(int(bool(on)))

    def set_stall_bound(self, cycles):
        """Raise ``("stall", cycle, stream)`` from :meth:`drain` when a source's beat has
        waited ``cycles`` cycles for ready (0: off)."""
        self._lib.mrc_set_stall_bound(cycles)

    def max_stall(self, prefix):
        """The most cycles a beat of source ``prefix`` (``a_rx__0``) waited for ready."""
        return self._lib.mrc_max_stall(self.ids[prefix])

    def set_random(self, side, bubbles, backpressure, seed):
        """Random bubbles on every source and backpressure on every sink of ``side`` (0 for
        ``a``), each stream seeded by a call of ``seed()``."""
        for index, s in enumerate(self.plan):
            if s.role >= 0 and s.side == side:
                probability = bubbles if s.role in _SOURCES else backpressure
                self._lib.mrc_set_random(index, probability, seed())

    # -- memory --------------------------------------------------------------------------------

    def add_region(self, side, base, size):
        self._lib.mrc_add_region(side, base, size)

    def write(self, side, address, data):
        data = bytes(data)
        if self._lib.mrc_memory_write(side, address, data, len(data)):
            self.check()

    def read(self, side, address, length):
        out = ctypes.create_string_buffer(length)
        if self._lib.mrc_memory_read(side, address, out, length):
            self.check()
        return out.raw[:length]

    # -- register bus ------------------------------------------------------------------------

    def bus_access(self, side, address, value=None):
        """Queue a read (``value`` None) or a write on ``side``'s bus master."""
        self._lib.mrc_bus_access(side, int(value is None), address, value or 0)

    def bus_result(self, side):
        return self._lib.mrc_bus_result(side)

    # -- streams -------------------------------------------------------------------------------

    def deliver(self, stream, release_cycle, arrival_ps, serial, frame):
        self._lib.mrc_deliver(stream, release_cycle, arrival_ps, serial, frame, len(frame))

    def send_beats(self, prefix, beats):
        """Packed beats (ints) for the beat source ``prefix`` (the work requests)."""
        stream = self.ids[prefix]
        words = (self.plan[stream].width + 31) // 32
        raw = b"".join(beat.to_bytes(4 * words, "little") for beat in beats)
        self._lib.mrc_send_beats(stream, raw, len(beats), words)

    def queued(self, prefix):
        return self._lib.mrc_queued(self.ids[prefix])

    @property
    def cycle(self):
        return self._lib.mrc_cycle()

    @property
    def edge(self):
        """Rising edges the agents have been called at."""
        return self._lib.mrc_edge()

    def set_first_step_edge(self, edge):
        self._lib.mrc_set_first_edge(edge)

    def set_start(self, cycle):
        self._lib.mrc_set_start(cycle)

    def check(self):
        error = self._lib.mrc_error()
        if error:
            raise ValueError(error.decode())

    def drain(self):
        """The frames sent and completions taken since the last call, in the order the agents
        took them: ``("frame", cycle, side, port, bytes)`` and ``("completion", cycle, side,
        bits)``; with the watches on, ``("placement", cycle, side, lo, hi, nbytes, outside,
        head)`` (a placed packet: its byte span [lo, hi), bytes written, bytes outside every
        host region, its first :data:`PLACE_HEAD` bytes) and ``("stall", cycle, prefix)``;
        backlog samples go to :attr:`backlog`. Raises :class:`ValueError` for a host access
        outside memory."""
        lib = self._lib
        size = lib.mrc_drain(None, 0)
        if not size:
            return []
        if size > len(self._buffer):
            self._buffer = ctypes.create_string_buffer(2 * size)
        size = lib.mrc_drain(self._buffer, len(self._buffer))
        raw = ctypes.string_at(self._buffer, size)
        out = []
        at = 0
        header = struct.Struct("<BHqI")
        while at < size:
            kind, stream, cycle, length = header.unpack_from(raw, at)
            at += header.size
            body = raw[at:at + length]
            at += length
            if kind == _FRAME:
                side, port = self.tx_port[stream]
                out.append(("frame", cycle, side, port, body))
            elif kind == _COMPLETION:
                out.append(("completion", cycle, self.cq_side[stream],
                            int.from_bytes(body, "little")))
            elif kind == _BACKLOG:
                self.backlog.append((cycle, list(struct.unpack(f"<{length // 4}I", body))))
            elif kind == _PLACEMENT:
                lo, hi, nbytes, outside = struct.unpack_from("<4Q", body)
                out.append(("placement", cycle, self.place_side[stream], lo, hi, nbytes,
                            outside, body[32:]))
            elif kind == _STALL:
                out.append(("stall", cycle, self.prefixes[stream]))
            elif kind == _ERROR:
                self.check()
        return out


class DpiPair:
    """The NIC pair (:class:`sim.tb.pair.NicPair`) with the wrapper :data:`DPI_TOP`, for
    :func:`sim.tb.runner.run_cocotb` (``toplevel=DPI_TOP``, ``verilator_args=
    verilator_args()``). The pair's Verilog is :meth:`NicPair.export_sv`'s, exported once per
    design for this wrapper and the benches that run the pair as the top. ``nscc``: both NICs'
    NSCC setting (``None``: none)."""

    def __init__(self, config, *, nscc=None):
        self.config = config
        self.nscc = nscc

    def export_sv(self, path):
        from ..export import write_if_changed
        from .pair import NicPair
        text = NicPair(self.config, nscc=self.nscc).export_sv()
        text = text + "\n" + wrapper_sv(text, self.config)
        write_if_changed(path, text)
        return text


def pair_build(config, nscc):
    """The :func:`sim.tb.runner.run_cocotb` arguments of the C++ agents' pair build, which the
    main job and the fuzzer share (one build folder): the design, its top and export key, the
    agents' Verilator arguments, and the per-cycle code at ``-O1`` under ``quick_build``
    (``optimise_cycles``: its runs are paced by the model, not by Python). ``nscc``: both NICs'
    NSCC setting."""
    import dataclasses

    from .runner import source_key
    return {"component": lambda: DpiPair(config, nscc=nscc), "toplevel": DPI_TOP,
            "export_key": source_key("nic_pair-dpi", config.to_dict(), dpi_key(),
                                     dataclasses.asdict(nscc)),
            "verilator_args": verilator_args(), "optimise_cycles": True}


class DpiGroup:
    """A group of NICs (:class:`sim.tb.pair.NicGroup`) with the wrapper ``top`` (default
    :data:`GROUP_DPI_TOP`), for :func:`sim.tb.runner.run_cocotb`. ``nscc``: the NICs' NSCC
    setting (``None``: none), as for :class:`DpiPair`."""

    def __init__(self, config, names, top=None, *, nscc=None):
        self.config = config
        self.names = tuple(names)
        self.top = top or GROUP_DPI_TOP
        self.nscc = nscc

    def export_sv(self, path):
        from ..export import write_if_changed
        from .pair import GROUP_MODULE, NicGroup
        text = NicGroup(self.config, self.names, nscc=self.nscc).export_sv(path)
        text = text + "\n" + wrapper_sv(text, self.config, pair_module=GROUP_MODULE,
                                        names=self.names, top=self.top)
        write_if_changed(path, text)
        return text


def uses_dpi(scn):
    """Whether the main job runs ``scn`` on the C++ agents: under Verilator and without waves
    (the waves keep the pair as the top, the names their views group by), unless
    ``MRC_HARNESS=python`` asks for the Python agents."""
    import os
    return (scn.sim == "verilator" and not scn.waves
            and os.environ.get("MRC_HARNESS", "") != "python")


def dpi_key():
    """What the wrapper's build depends on besides the gateware: the agents' source and the
    wrapper's generator (not the Python side of the agents, which needs no rebuild)."""
    import hashlib
    import inspect
    digest = hashlib.sha256(DPI_SOURCE.read_bytes())
    for function in (wrapper_sv, stream_plan, _module_ports, _fields):
        digest.update(inspect.getsource(function).encode())
    return digest.hexdigest()


class DpiBus:
    """A NIC's register bus for :class:`sim.driver.RegisterDriver`, through the C++ bus master:
    each access takes the clock edges a :class:`sim.tb.cocotb_host.CocotbBus` access takes
    (one for a write, two for a read) and returns at the falling edge after its last one.
    Accesses from several coroutines are serialised."""

    def __init__(self, dut, dpi, side, clock):
        self.dpi = dpi
        self.side = side
        self.clock = clock
        self._done = getattr(dut, f"bus_done_{dpi.names[side]}").value_change
        self._busy = False

    # The same serialisation as the Python bus (waiters poll at each rising edge).
    from .cocotb_host import CocotbBus as _CocotbBus
    _acquire = _CocotbBus._acquire
    del _CocotbBus

    async def write(self, address, value):
        await self._acquire()
        self.dpi.bus_access(self.side, address, value)
        await self._done
        self._busy = False

    async def read(self, address):
        await self._acquire()
        self.dpi.bus_access(self.side, address)
        await self._done
        self._busy = False
        return self.dpi.bus_result(self.side)
