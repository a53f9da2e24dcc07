"""The main job's bench: two RTL NICs (``sim/tb/pair.py``) over the multi-plane fabric.

Runs one :class:`sim.scenario.Scenario` (JSON in ``SCENARIO``) and writes its raw result
(``result.json``) and the fabric's capture into ``OUT``; :mod:`sim.mainjob` turns them into
the report. Every stream port of both NICs is driven by one per-cycle loop
(:mod:`sim.tb.harness`). Plane p of the fabric joins port p of NIC ``a`` and port p of NIC
``b``. Time on the fabric counts from the moment the work is posted (after bring-up), so the
scenario's failure times are relative to the start of the transfer.

The bench plays the NIC's control software too: it brings both NICs up through the register
bus (:class:`sim.driver.nic.NicDriver`), polls EV events, and probes every ASSUMED_BAD EV
periodically so that EVs of a recovered plane come back (probe recovery AUTO).
"""

import json
import os
import random
import time
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hdl import protocol as P
from hdl.control.nicmap import nic_register_map
from hdl.interfaces import completion_layout, work_request_layout
from hdl.packet.headers import net_beat_layout
from sim.analysis import analyse
from sim.defaults import MR_BASE, NIC_A, NIC_B, default_profile_spec, ip_int, mac_int
from sim.driver.nic import NicDriver
from sim.fabric import Fabric
from sim.scenario import PROBE_INTERVAL_US, Scenario, nic_config_for
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

    def __init__(self, dut, name, endpoint, rkey_slot, loop, rng, fabric, clock_of):
        self.name = name
        self.endpoint = endpoint
        self.memory = RegionMemory()
        self.memory.add(SRC_BASE, max(SCENARIO.bytes, 1) + 4096)
        self.memory.add(MR_BASE, max(SCENARIO.bytes, 1) + 4096)
        self.mem = MemoryAgent(dut, f"{name}_", CONFIG, self.memory, loop, idle=BUBBLES,
                               backpressure=BACKPRESSURE, seed=rng.randrange(1 << 30))
        self.wr = Source(dut, f"{name}_wr", idle=BUBBLES, seed=rng.randrange(1 << 30))
        self.completions = []
        self.completion_times = []
        self.cq = Sink(dut, f"{name}_completion", self._completion,
                       backpressure=BACKPRESSURE, seed=rng.randrange(1 << 30))
        layout = net_beat_layout(W)
        self.rx = [FrameSource(dut, f"{name}_rx__{p}", layout, idle=BUBBLES,
                               seed=rng.randrange(1 << 30)) for p in range(CONFIG.ports)]
        self.tx = [FrameSink(dut, f"{name}_tx__{p}", layout,
                             self._transmit(p, fabric, clock_of), backpressure=BACKPRESSURE,
                             seed=rng.randrange(1 << 30)) for p in range(CONFIG.ports)]
        self.loop = loop
        self.bus = CocotbBus(dut, f"{name}_bus__", dut.clk)
        self.driver = NicDriver(nic_register_map(CONFIG), self.bus, CONFIG)
        self.rkey = 0xBEE0 | rkey_slot
        self.rkey_slot = rkey_slot
        self.ev_events = []
        self.assumed_bad = set()

    def agents(self):
        return [*self.mem.agents(), self.wr, self.cq, *self.rx, *self.tx]

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
                               gap_depth=SCENARIO.gap_depth)
        await d.configure_requester(infer_k=SCENARIO.infer_k, cc=bool(SCENARIO.cc),
                                    reo_wnd=SCENARIO.reo_wnd)
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


async def _edges(clock, count):
    """Wait for the ``count``-th rising edge of ``clock`` from now (called at a rising edge),
    as ``ClockCycles`` would, but with one wake-up instead of one per cycle: a timer to the
    middle of the last cycle, then the edge."""
    await Timer(round((count - 0.5) * PERIOD_NS * 1000), unit="ps")
    await RisingEdge(clock)


async def control_plane(side, now_us, stop):
    """Poll EV events; probe ASSUMED_BAD EVs every PROBE_INTERVAL_US."""
    last_probe = 0.0
    probe_id = 0
    while not stop["done"]:
        await _edges(side.loop.clock, POLL_CYCLES)
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
        if side.assumed_bad and now_us() - last_probe >= PROBE_INTERVAL_US:
            last_probe = now_us()
            for index in sorted(side.assumed_bad):
                probe_id += 1
                await side.driver.send_probe(qpn=0, ev=index, probe_id=probe_id)
            await side.driver.poll_probe_results()


@cocotb.test()
async def fabric_run(dut):
    rng = random.Random(SCENARIO.seed)
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    dut.rst.value = 1
    loop = CycleLoop(dut.clk)
    start = {"cycle": None}

    def now_ns():
        if start["cycle"] is None:
            return 0.0
        return (loop.cycle - start["cycle"]) * PERIOD_NS

    fabric = Fabric(fabric_config_for(SCENARIO, CONFIG))
    a = Side(dut, "a", NIC_A, 1, loop, rng, fabric, now_ns)
    b = Side(dut, "b", NIC_B, 2, loop, rng, fabric, now_ns)
    sides = {"a": a, "b": b}
    for side in (a, b):
        loop.add(*side.agents())

    #: Receive backlog: beats delivered by the fabric that a NIC's ports have not yet taken,
    #: sampled every BACKLOG_CYCLES (frames wait there while the NIC's receive path is busy).
    backlog = {"a": [], "b": []}

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
    profiler = _profiler()
    # Where the transfer begins on the waves' time axis (simulated time from the start).
    transfer_start_us = get_sim_time("us")
    wall0 = time.monotonic()
    cpu0 = time.process_time()
    for side in (a, b):
        side.wr.send([pack(wr_layout, {k: v for k, v in wr.items() if k != "data"})
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

    finished = False
    want_a, want_b = expected(a), expected(b)
    report_every = max(1, int(20_000 / PERIOD_NS))      # progress every 20 us
    next_report = report_every
    settle = None           # every WR completed (some with errors): responder side settles
    check_every = 64
    # A coroutine awaiting every edge, not a hook of the loop: where it runs in a time step
    # relative to the loop's step (which differs by simulator) decides the cycle the read-out
    # below starts from, and with it what an unfinished run reports.
    while now_us() < SCENARIO.max_us:
        await RisingEdge(dut.clk)
        if len(a.completions) >= want_a and len(b.completions) >= want_b:
            finished = True
            break
        if loop.cycle % check_every == 0 and settle is None and all(
                own_done(s) for s in (a, b)):
            settle = now_us() + 5.0
        if settle is not None and now_us() >= settle:
            finished = True         # nothing more will complete: errors explain the rest
            break
        if loop.cycle - start["cycle"] >= next_report:
            next_report += report_every
            elapsed = time.monotonic() - wall0
            done = {s.name: f"{len(s.completions)}/{expected(s)}" for s in (a, b)}
            cocotb.log.info(
                f"t={now_us():8.1f} us  completions a {done['a']} b {done['b']}  "
                f"delivered {fabric.delivered_payload_bytes() / 1024:8.1f} KiB  "
                f"wall {elapsed:6.1f} s ({(loop.cycle - start['cycle']) / max(elapsed, 1e-9):,.0f}"
                f" cycles/s)")
    done_ns = now_ns()
    wall_s = time.monotonic() - wall0
    cpu_s = time.process_time() - cpu0
    if profiler is not None:
        _write_profile(profiler, OUT / "profile.txt", wall_s, loop.cycle - start["cycle"])
    stop["done"] = True
    await ClockCycles(dut.clk, 2 * POLL_CYCLES)

    layout = completion_layout(CONFIG)
    result = {"backend": "rtl", "simulator": os.environ.get("MRC_SIMULATOR", "verilator"),
              "finished": finished, "sim_us": done_ns / 1e3,
              "cycles": int(round(done_ns / PERIOD_NS)), "wall_s": wall_s,
              "completions": {}, "completion_us": {}, "work": {}, "memory_mismatches": [],
              "counters": {}, "ev_events": a.ev_events + b.ev_events,
              "qp_errors": {}, "transfer_start_us": round(transfer_start_us, 3)}
    for side in (a, b):
        peer = b if side is a else a
        result["completions"][side.name] = [unpack(layout, c) for c in side.completions]
        result["completion_us"][side.name] = [
            round((c - start["cycle"]) * PERIOD_NS / 1000, 3) for c in side.completion_times]
        result["work"][side.name] = [{k: v for k, v in wr.items() if k != "data"}
                                     for wr in work[side.name]]
        for wr in work[side.name]:
            got = peer.memory.read(wr["remote_addr"], wr["length"])
            if got != wr["data"]:
                bad = next(i for i in range(wr["length"]) if got[i] != wr["data"][i])
                result["memory_mismatches"].append({"side": side.name, "wr_id": wr["wr_id"],
                                                    "first_bad_offset": bad})
        result["counters"][side.name] = await side.driver.counters()
        result["qp_errors"][side.name] = await side.driver.qp_errors()
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
