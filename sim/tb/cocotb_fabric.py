"""The main job's bench: two RTL NICs (``sim/tb/pair.py``) over the multi-plane fabric.

Runs one :class:`sim.scenario.Scenario` (JSON in ``SCENARIO``) and writes its raw result
(``result.json``) and the fabric's capture into ``OUT``; :mod:`sim.mainjob` turns them into
the report. Every stream port of both NICs is driven either by one per-cycle Python loop
(:mod:`sim.tb.harness`) or, when the build has them (``MRC_DPI=1``), by the C++ agents of
:mod:`sim.tb.dpi`, which do the same beat for beat and wake Python per frame. Plane p of
the fabric joins port p of NIC ``a`` and port p of NIC ``b``. Time on the fabric counts from
the moment the work is posted (after bring-up), so the scenario's failure times are relative
to the start of the transfer.

The bench plays the NIC's control software too: it brings both NICs up through the register
bus (:class:`sim.driver.nic.NicDriver`), polls EV events, and probes every ASSUMED_BAD EV
on a per-EV backoff (:mod:`sim.probing`) so that EVs of a recovered plane come back (probe
recovery AUTO).
"""

import json
import math
import os
import random
import time
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, First, ReadWrite, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hdl import protocol as P
from hdl.control.nicmap import nic_register_map
from hdl.interfaces import completion_layout, work_request_layout
from hdl.packet.headers import net_beat_layout
from sim.analysis import analyse
from sim.defaults import MR_BASE, NIC_A, NIC_B, default_profile_spec, ip_int, mac_int
from sim.driver.nic import NicDriver
from sim.fabric import Fabric
from sim.probing import ProbeBackoff
from sim.scenario import Scenario, nic_config_for
from sim.tb.cocotb_host import CocotbBus
from sim.tb.harness import (
    CycleLoop,
    FrameSink,
    FrameSource,
    MemoryAgent,
    RegionMemory,
    Sink,
    Source,
)
from sim.tb.streams import pack, unpack
from sim.workload import fabric_config_for, make_work

SCENARIO = Scenario.from_dict(json.loads(os.environ.get("SCENARIO", "{}")))
OUT = Path(os.environ.get("OUT", "."))
CONFIG = nic_config_for(SCENARIO)
W = CONFIG.data_width
PERIOD_NS = 1e9 / CONFIG.clock_hz
PD = 1
SRC_BASE = 0x2000_0000
PSN_BASE = 0xFFFF80         # the 24-bit PSN wraps during the run (as in sim/model/pair.py)
#: Random bubbles on every input stream and backpressure on every output (tests set them
#: through the scenario's ``extra``; measurements run without).
BUBBLES = float(SCENARIO.extra.get("bubbles", 0.0))
BACKPRESSURE = float(SCENARIO.extra.get("backpressure", 0.0))
POLL_CYCLES = 500
BACKLOG_CYCLES = 1000
#: The stream agents run in C++ (sim/tb/dpi.py): the build has them.
DPI = os.environ.get("MRC_DPI", "") == "1"




def _profiler():
    """A running :class:`cProfile.Profile` when ``MRC_PROFILE`` is set (and not ``0``): the
    bench's Python from the start of the transfer to its end (``docs/performance.md``)."""
    if os.environ.get("MRC_PROFILE", "") in ("", "0"):
        return None
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _write_profile(profiler, path, wall_s, cycles):
    """The profile, by own time, with the share of the wall time spent outside Python (the
    simulator and cocotb's C++ side)."""
    import io
    import pstats
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    python_s = stats.total_tt
    stats.sort_stats("tottime").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{cycles} cycles in {wall_s:.2f} s of wall time; Python (profiled) "
                    f"{python_s:.2f} s, outside Python {wall_s - python_s:.2f} s\n"
                    + text.getvalue())


class Side:
    """One NIC with its host: memory, work requests, completions, network ports, driver."""

    def __init__(self, dut, name, endpoint, rkey_slot, loop, rng, fabric, clock_of,
                 dpi=None):
        self.name = name
        self.endpoint = endpoint
        self.loop = loop
        self.completions = []
        self.completion_times = []
        if dpi is not None:
            from sim.tb.dpi import DpiBus
            self.bus = DpiBus(dut, dpi, "ab".index(name), dut.clk)
        else:
            self.bus = CocotbBus(dut, f"{name}_bus__", dut.clk)
        self.driver = NicDriver(nic_register_map(CONFIG), self.bus, CONFIG)
        self.rkey = 0xBEE0 | rkey_slot
        self.rkey_slot = rkey_slot
        self.ev_events = []
        self.assumed_bad = set()
        self.probing = ProbeBackoff()
        self.dpi = dpi
        if dpi is not None:         # the C++ agents (sim/tb/dpi.py) are this side's ports
            self.memory = _DpiMemory(dpi, "ab".index(name))
            self.memory.add(SRC_BASE, max(SCENARIO.bytes, 1) + 4096)
            self.memory.add(MR_BASE, max(SCENARIO.bytes, 1) + 4096)
            if BUBBLES or BACKPRESSURE:
                # Seeds drawn only here: a run without either draws nothing (as before).
                dpi.set_random("ab".index(name), BUBBLES, BACKPRESSURE,
                               lambda: rng.randrange(1 << 62))
            return
        self.memory = RegionMemory()
        self.memory.add(SRC_BASE, max(SCENARIO.bytes, 1) + 4096)
        self.memory.add(MR_BASE, max(SCENARIO.bytes, 1) + 4096)
        self.mem = MemoryAgent(dut, f"{name}_", CONFIG, self.memory, loop, idle=BUBBLES,
                               backpressure=BACKPRESSURE, seed=rng.randrange(1 << 30))
        self.wr = Source(dut, f"{name}_wr", idle=BUBBLES, seed=rng.randrange(1 << 30))
        self.cq = Sink(dut, f"{name}_completion", self._completion,
                       backpressure=BACKPRESSURE, seed=rng.randrange(1 << 30))
        layout = net_beat_layout(W)
        self.rx = [FrameSource(dut, f"{name}_rx__{p}", layout, idle=BUBBLES,
                               seed=rng.randrange(1 << 30)) for p in range(CONFIG.ports)]
        self.tx = [FrameSink(dut, f"{name}_tx__{p}", layout,
                             self._transmit(p, fabric, clock_of), backpressure=BACKPRESSURE,
                             seed=rng.randrange(1 << 30)) for p in range(CONFIG.ports)]

    def agents(self):
        if self.dpi is not None:
            return []
        return [*self.mem.agents(), self.wr, self.cq, *self.rx, *self.tx]

    def post(self, beats):
        """Hand packed work requests to the NIC."""
        if self.dpi is not None:
            self.dpi.send_beats(f"{self.name}_wr", beats)
        else:
            self.wr.send(beats)

    def _completion(self, bits):
        self.completions.append(bits)
        self.completion_times.append(self.loop.cycle)

    def _transmit(self, port, fabric, clock_of):
        def on_frame(frame):
            fabric.send(self.name, port, frame, clock_of())
        return on_frame

    async def bring_up(self, peer, profile):
        d = self.driver
        await d.set_local(mac=mac_int(self.endpoint.mac),
                          ip=ip_int(self.endpoint, CONFIG.ip_version))
        await d.register_mr(slot=self.rkey_slot, rkey=self.rkey, pd=PD, base=MR_BASE,
                            length=SCENARIO.bytes + 4096)
        await d.configure_acks(ack_every=SCENARIO.ack_every, ack_delay=SCENARIO.ack_delay,
                               nak_interval=1024, coalesce_gaps=bool(SCENARIO.coalesce_gaps),
                               gap_depth=SCENARIO.gap_depth,
                               ack_new_holes=bool(SCENARIO.ack_new_holes))
        await d.configure_requester(infer_k=SCENARIO.infer_k, cc=bool(SCENARIO.cc),
                                    reo_wnd=SCENARIO.reo_wnd,
                                    cc_nscc=SCENARIO.cc_algorithm == "nscc")
        await d.set_port_watch(SCENARIO.port_wnd, SCENARIO.port_quiet)
        mode = P.EvMode.AUTO if SCENARIO.baseline == "ecmp" else None
        await d.ev_profile_online(0, profile, num_evs=SCENARIO.evs, min_active=2, mode=mode,
                                  fate=bool(SCENARIO.fate))
        for qpn in range(SCENARIO.qps):
            await d.connect_qp(qpn, ev_profile=0, ev_offset=qpn, remote_qpn=qpn,
                               remote_mac=mac_int(peer.endpoint.mac),
                               remote_ip=ip_int(peer.endpoint, CONFIG.ip_version),
                               psn=PSN_BASE + qpn, remote_psn=PSN_BASE + qpn,
                               mpr=CONFIG.mpr_units, max_wimm=min(4, CONFIG.max_wimm), pd=PD,
                               timeout=SCENARIO.timeout, retry_linear=SCENARIO.retry_linear,
                               retry_exponential=SCENARIO.retry_exponential)


class _DpiMemory:
    """One side's host memory, kept by the C++ agents (the :class:`RegionMemory` calls)."""

    def __init__(self, dpi, side):
        self.dpi = dpi
        self.side = side

    def add(self, base, size):
        self.dpi.add_region(self.side, base, size)

    def write(self, address, data):
        self.dpi.write(self.side, address, data)

    def read(self, address, length):
        return self.dpi.read(self.side, address, length)


class _TimeLoop:
    """The cycle count of the C++ agents' runs, from simulated time: at a rising edge (and
    anywhere in its time step) ``cycle`` is what the Python loop would have counted there."""

    def __init__(self, clock):
        self.clock = clock
        self._zero_ps = None

    def begin(self):
        """Called at the rising edge that counts as cycle 0."""
        self._zero_ps = get_sim_time("ps")

    @property
    def cycle(self):
        """At a rising edge, its count; between edges (where a register access ends), the
        next edge's, where the Python bus would have returned."""
        if self._zero_ps is None:
            return 0
        return math.ceil((get_sim_time("ps") - self._zero_ps) / (PERIOD_NS * 1000) - 1e-9)

    def until(self, cycle):
        """A timer to the middle of the cycle before rising edge ``cycle`` (from anywhere in
        the time step of the edge before it or earlier)."""
        target = self._zero_ps + round((cycle - 0.5) * PERIOD_NS * 1000)
        return Timer(max(1, target - get_sim_time("ps")), unit="ps")

    def edge_time_us(self, cycle):
        return (self._zero_ps + cycle * PERIOD_NS * 1000) / 1e6


async def _edges_from(loop, count):
    """``_edges`` for the C++ agents' runs, whose coroutines may be between edges (where a
    register access ends): the ``count``-th rising edge after the one this point counts as."""
    if isinstance(loop, _TimeLoop):
        await loop.until(loop.cycle + count)
        await RisingEdge(loop.clock)
    else:
        await _edges(loop.clock, count)


async def _edges(clock, count):
    """Wait for the ``count``-th rising edge of ``clock`` from now (called at a rising edge),
    as ``ClockCycles`` would, but with one wake-up instead of one per cycle: a timer to the
    middle of the last cycle, then the edge."""
    await Timer(round((count - 0.5) * PERIOD_NS * 1000), unit="ps")
    await RisingEdge(clock)


async def control_plane(side, now_us, stop):
    """Poll EV events; probe ASSUMED_BAD EVs on a per-EV backoff (:class:`sim.probing.ProbeBackoff`,
    kept in ``side.probing``)."""
    probing = side.probing
    probe_id = 0
    while not stop["done"]:
        await _edges_from(side.loop, POLL_CYCLES)
        for event in await side.driver.poll_ev_events():
            state = P.EvState(event["state"])
            side.ev_events.append({"time_us": round(now_us(), 3), "nic": side.name,
                                   "profile": event["profile"], "index": event["index"],
                                   "port": event["port"], "state": state.name,
                                   "probe_ok": event["probe_ok"]})
            if state == P.EvState.ASSUMED_BAD:
                side.assumed_bad.add(event["index"])
            elif state == P.EvState.GOOD:
                side.assumed_bad.discard(event["index"])
        probing.track(side.assumed_bad, now_us())
        due = probing.due(now_us())
        for index in due:
            probe_id += 1
            await side.driver.send_probe(qpn=0, ev=index, probe_id=probe_id)
        if due:
            await side.driver.poll_probe_results()


async def _finish_dpi(loop, start, ns_at, completion_seen, progress, report_every, all_done,
                      own_done, check_every):
    """The end of the run under the C++ agents: the cycle the per-cycle check of the Python
    loop would stop at, found by waking at completions and at the deadlines they imply
    instead of at every edge. Returns ``finished``, at that cycle's time step."""

    def us_at(cycle):
        return ns_at(cycle) / 1000

    first = start["cycle"]
    # The loop's own end: the first cycle at which the time reaches max_us.
    end = first + max(0, math.ceil(SCENARIO.max_us * 1000 / PERIOD_NS) - 1)
    while us_at(end) < SCENARIO.max_us:
        end += 1
    if us_at(first) >= SCENARIO.max_us:
        return False
    settle_at = None        # the cycle the settle rule ends the run at
    planned = False
    next_report = first + report_every
    while True:
        cycle = loop.cycle
        completion_seen.clear()
        if cycle > first:
            if all_done():
                return True
            if not planned and own_done():
                planned = True
                settle = -(-cycle // check_every) * check_every      # the next check
                deadline_us = us_at(settle) + 5.0
                settle_at = settle
                while us_at(settle_at) < deadline_us:
                    settle_at += 1
            if settle_at is not None and cycle >= settle_at:
                return True
            if cycle >= end:
                return False
        while cycle >= next_report:
            next_report += report_every
            progress()
        deadline = min(end, next_report, *(() if settle_at is None else (settle_at,)))
        timer = loop.until(deadline)
        if await First(completion_seen.wait(), timer) is timer:
            await RisingEdge(loop.clock)
            await ReadWrite()           # the agents have stepped at this edge


@cocotb.test()
async def fabric_run(dut):
    rng = random.Random(SCENARIO.seed)
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    dut.rst.value = 1
    dpi = None
    if DPI:
        from sim.tb.dpi import DpiAgents
        dpi = DpiAgents(CONFIG, first_step_edge=1 << 62, backlog_cycles=BACKLOG_CYCLES)
        loop = _TimeLoop(dut.clk)
    else:
        loop = CycleLoop(dut.clk)
    start = {"cycle": None}

    def now_ns():
        if start["cycle"] is None:
            return 0.0
        return (loop.cycle - start["cycle"]) * PERIOD_NS

    def ns_at(cycle):
        if start["cycle"] is None:
            return 0.0
        return (cycle - start["cycle"]) * PERIOD_NS

    fabric = Fabric(fabric_config_for(SCENARIO, CONFIG))
    a = Side(dut, "a", NIC_A, 1, loop, rng, fabric, now_ns, dpi)
    b = Side(dut, "b", NIC_B, 2, loop, rng, fabric, now_ns, dpi)
    sides = {"a": a, "b": b}
    if not DPI:
        for side in (a, b):
            loop.add(*side.agents())

    #: Receive backlog: beats delivered by the fabric that a NIC's ports have not yet taken,
    #: sampled every BACKLOG_CYCLES (frames wait there while the NIC's receive path is busy).
    backlog = {"a": [], "b": []}
    completion_seen = Event()

    if DPI:
        held = []           # frames in flight before the transfer's start (cycle 0 unknown)

        def release_cycle(arrival_ps):
            """The cycle whose delivery hook would hand this frame to its port."""
            cycle = start["cycle"] + max(0, math.ceil(arrival_ps / (PERIOD_NS * 1000)) - 1)
            while not (ns_at(cycle) >= arrival_ps / 1000
                       and arrival_ps <= round(ns_at(cycle) * 1000)):
                cycle += 1
            return cycle

        def hand_over(in_flight):
            if start["cycle"] is None:
                held.extend(in_flight)
                return
            for arrival_ps, serial, dst, plane, frame in in_flight:
                dpi.deliver(dpi.rx[dst][plane], release_cycle(arrival_ps), arrival_ps,
                            serial, frame)

        def service():
            """The agents' news: frames into the fabric (and what it delivers back to the
            agents), completions to their sides."""
            for event in dpi.drain():
                if event[0] == "frame":
                    _, cycle, src, port, frame = event
                    fabric.send(src, port, frame, ns_at(cycle))
                    hand_over(fabric.take_in_flight())
                else:
                    _, cycle, name, bits = event
                    sides[name].completions.append(bits)
                    sides[name].completion_times.append(cycle)
                    completion_seen.set()

        async def pump():
            change = dut.attention.value_change
            while True:
                await change
                service()
        cocotb.start_soon(pump())
    else:
        def deliver(cycle):
            for dst, plane, frame in fabric.deliver(now_ns()):
                sides[dst].rx[plane].send_frame(frame)
            if start["cycle"] is not None and cycle % BACKLOG_CYCLES == 0:
                for name, side in sides.items():
                    backlog[name].append((round(now_ns() / 1000, 3),
                                          [len(source.queue) for source in side.rx]))
        loop.hooks.append(deliver)

    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    if DPI:
        # The Python loop would count the next edge as cycle 1: so do the agents (this edge is
        # not evaluated yet at this point of the time step).
        loop.begin()
        dpi.set_first_step_edge(dpi.edge + 2)
    else:
        cocotb.start_soon(loop.run())
    spec = default_profile_spec()
    await a.bring_up(b, spec.profile)
    await b.bring_up(a, spec.profile)
    cocotb.log.info(f"both NICs up after {loop.cycle} cycles; {SCENARIO.planes} planes, "
                    f"{SCENARIO.qps} QPs, {SCENARIO.bytes} bytes per direction")

    work = {"a": make_work(SCENARIO, "a", b.rkey, SRC_BASE, MR_BASE),
            "b": make_work(SCENARIO, "b", a.rkey, SRC_BASE, MR_BASE) if SCENARIO.both_ways
            else []}
    wr_layout = work_request_layout(CONFIG)
    for side in (a, b):
        for wr in work[side.name]:
            side.memory.write(wr["local_addr"], wr["data"])
    start["cycle"] = loop.cycle
    if DPI:
        # The Python loop's count read here lags by one edge: this coroutine resumes before
        # the loop's step at the edge that ends the bring-up. Cycle 0 of the transfer is that
        # count under either agents, so that a run's times are the same.
        start["cycle"] -= 1
        dpi.set_start(start["cycle"])
        hand_over(held)
        held.clear()
    profiler = _profiler()
    # Where the transfer begins on the waves' time axis (simulated time from the start).
    transfer_start_us = (loop.edge_time_us(loop.cycle) if DPI else get_sim_time("us"))
    wall0 = time.monotonic()
    cpu0 = time.process_time()
    for side in (a, b):
        side.post([pack(wr_layout, {k: v for k, v in wr.items() if k != "data"})
                   for wr in work[side.name]])
    stop = {"done": False}

    def now_us():
        return now_ns() / 1000
    for side in (a, b):
        cocotb.start_soon(control_plane(side, now_us, stop))

    peer_imm = {side.name: sum(1 for wr in work[side.name]
                               if wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM)
                for side in (a, b)}

    def expected(side):
        return len(work[side.name]) + peer_imm["b" if side.name == "a" else "a"]

    cq_layout = completion_layout(CONFIG)
    requester_side = 0

    def own_done(side):
        """Every WR of ``side`` has completed (with any status)."""
        return sum(1 for c in side.completions
                   if unpack(cq_layout, c)["side"] == requester_side) >= len(work[side.name])

    want_a, want_b = expected(a), expected(b)
    report_every = max(1, int(20_000 / PERIOD_NS))      # progress every 20 us

    def progress():
        elapsed = time.monotonic() - wall0
        done = {s.name: f"{len(s.completions)}/{expected(s)}" for s in (a, b)}
        cocotb.log.info(
            f"t={now_us():8.1f} us  completions a {done['a']} b {done['b']}  "
            f"delivered {fabric.delivered_payload_bytes() / 1024:8.1f} KiB  "
            f"wall {elapsed:6.1f} s ({(loop.cycle - start['cycle']) / max(elapsed, 1e-9):,.0f}"
            f" cycles/s)")

    check_every = 64
    if DPI:
        finished = await _finish_dpi(loop, start, ns_at, completion_seen, progress,
                                     report_every, lambda: (len(a.completions) >= want_a
                                                            and len(b.completions) >= want_b),
                                     lambda: all(own_done(s) for s in (a, b)), check_every)
    else:
        finished = False
        next_report = report_every
        settle = None       # every WR completed (some with errors): responder side settles
        # A coroutine awaiting every edge, not a hook of the loop: where it runs in a time
        # step relative to the loop's step (which differs by simulator) decides the cycle the
        # read-out below starts from, and with it what an unfinished run reports.
        while now_us() < SCENARIO.max_us:
            await RisingEdge(dut.clk)
            if len(a.completions) >= want_a and len(b.completions) >= want_b:
                finished = True
                break
            if loop.cycle % check_every == 0 and settle is None and all(
                    own_done(s) for s in (a, b)):
                settle = now_us() + 5.0
            if settle is not None and now_us() >= settle:
                finished = True     # nothing more will complete: errors explain the rest
                break
            if loop.cycle - start["cycle"] >= next_report:
                next_report += report_every
                progress()
    done_ns = now_ns()
    wall_s = time.monotonic() - wall0
    cpu_s = time.process_time() - cpu0
    if profiler is not None:
        _write_profile(profiler, OUT / "profile.txt", wall_s, loop.cycle - start["cycle"])
    stop["done"] = True
    await ClockCycles(dut.clk, 2 * POLL_CYCLES)

    layout = completion_layout(CONFIG)
    result = {"backend": "rtl", "simulator": os.environ.get("MRC_SIMULATOR", "verilator"),
              "agents": "dpi" if DPI else "python",
              "finished": finished, "sim_us": done_ns / 1e3,
              "cycles": int(round(done_ns / PERIOD_NS)), "wall_s": wall_s,
              "completions": {}, "completion_us": {}, "work": {}, "memory_mismatches": [],
              "counters": {}, "ev_events": a.ev_events + b.ev_events,
              "qp_errors": {}, "transfer_start_us": round(transfer_start_us, 3),
              "probes_sent": {side.name: side.probing.sent for side in (a, b)}}
    cut = {}        # the cycle each side's completions are read out at
    for side in (a, b):
        cut[side.name] = loop.cycle
        if not DPI:     # under DPI read below, up to this cycle, once the agents stepped it
            result["completions"][side.name] = list(side.completions)
            result["completion_us"][side.name] = list(side.completion_times)
        result["counters"][side.name] = await side.driver.counters()
        result["qp_errors"][side.name] = await side.driver.qp_errors()
    backlog_cut = loop.cycle
    if DPI:
        # Up to the cycles the Python loop would have read them at: the agents step an edge
        # after this point of its time step, so go past it, then take what they saw.
        await RisingEdge(dut.clk)
        await ReadWrite()
        service()
        for side in (a, b):
            taken = [index for index, c in enumerate(side.completion_times)
                     if c <= cut[side.name]]
            result["completions"][side.name] = [side.completions[i] for i in taken]
            result["completion_us"][side.name] = [side.completion_times[i] for i in taken]
        ports = CONFIG.ports
        for cycle, queued in dpi.backlog:
            if cycle > backlog_cut:
                continue
            for index, name in enumerate("ab"):
                backlog[name].append((round(ns_at(cycle) / 1000, 3),
                                      queued[index * ports:(index + 1) * ports]))
    for side in (a, b):
        peer = b if side is a else a
        result["completions"][side.name] = [unpack(layout, c)
                                            for c in result["completions"][side.name]]
        result["completion_us"][side.name] = [
            round((c - start["cycle"]) * PERIOD_NS / 1000, 3)
            for c in result["completion_us"][side.name]]
        result["work"][side.name] = [{k: v for k, v in wr.items() if k != "data"}
                                     for wr in work[side.name]]
        for wr in work[side.name]:
            got = peer.memory.read(wr["remote_addr"], wr["length"])
            if got != wr["data"]:
                bad = next(i for i in range(wr["length"]) if got[i] != wr["data"][i])
                result["memory_mismatches"].append({"side": side.name, "wr_id": wr["wr_id"],
                                                    "first_bad_offset": bad})
    result["rx_backlog"] = {
        name: {"max_beats": max((sum(q) for _, q in series), default=0),
               "max_port_beats": max((max(q) for _, q in series), default=0),
               "samples": series} for name, series in backlog.items()}
    result["analysis"] = analyse(fabric, SCENARIO, CONFIG, end_ns=done_ns)
    OUT.mkdir(parents=True, exist_ok=True)
    fabric.save(OUT)
    (OUT / "result.json").write_text(json.dumps(result, default=str))
    cocotb.log.info(f"done: finished={finished} at {done_ns / 1000:.1f} us, wall {wall_s:.1f} s, "
                    f"processor {cpu_s:.1f} s ("
                    f"{round(done_ns / PERIOD_NS) / max(cpu_s, 1e-9):,.0f} cycles per "
                    f"processor second)")
