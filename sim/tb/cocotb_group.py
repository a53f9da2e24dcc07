"""The main job's bench of more than two RTL NICs: a group (``sim/tb/pair.py``,
:class:`~sim.tb.pair.NicGroup`) over the switched fabric, a switch per plane.

Runs one :class:`sim.scenario.Scenario` (JSON in ``SCENARIO``) with ``scenario.nics`` RTL
NICs named ``a``, ``b``, ``c``, ... and writes the raw result of
:func:`sim.model.multi.run_nics` (``result.json``, the same keys, so :mod:`sim.mainjob` makes
the same report) and the fabric's capture into ``OUT``. Who sends to whom, the work
requests, every NIC's addresses, memory and QP connections come from
:mod:`sim.model.multi` (:func:`~sim.model.multi.flows_of`, :func:`~sim.model.multi.make_work`,
:func:`~sim.model.multi.nic_plan`): the RTL and the model run the same traffic.

Every stream port is driven by the C++ agents of :mod:`sim.tb.dpi` (Verilator only), with
the scenario's random bubbles and backpressure (``extra``). Python wakes when a NIC sent a
frame or a completion arrived (the wrapper's ``attention``), handing the frames to the
fabric at the time of the cycle they left, and at the time the fabric's next frame is due
(:meth:`~sim.fabric.Fabric.next_arrival`), taking what :meth:`~sim.fabric.Fabric.deliver`
gives at that cycle and handing it to the receiving port, which presents it from the next
cycle. The frames of every cycle are handed to the fabric before its deliveries of later
cycles are taken, which is what the switch needs to order its egress queues. Time on the
fabric counts from the moment the work is posted (after bring-up).

The bench plays the NICs' control software as the two-NIC bench does
(:func:`sim.tb.cocotb_fabric.control_plane`).
"""

import json
import math
import os
import random
import time
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, First, ReadWrite, RisingEdge

from hdl import protocol as P
from hdl.control.nicmap import nic_register_map
from hdl.interfaces import completion_layout, work_request_layout
from sim.analysis import analyse
from sim.defaults import default_profile_spec
from sim.driver.nic import NicDriver
from sim.fabric import Fabric
from sim.model.multi import (
    expected_completions,
    fabric_config_multi,
    flows_of,
    make_work,
    memory_mismatches,
    nic_names,
    nic_plan,
    peers_of,
)
from sim.probing import ProbeBackoff
from sim.scenario import Scenario, nic_config_for
from sim.tb.cocotb_fabric import (
    BACKLOG_CYCLES,
    POLL_CYCLES,
    _DpiMemory,
    _finish_dpi,
    _TimeLoop,
    control_plane,
)
from sim.tb.dpi import DpiAgents, DpiBus
from sim.tb.streams import pack, unpack

SCENARIO = Scenario.from_dict(json.loads(os.environ.get("SCENARIO", "{}")))
OUT = Path(os.environ.get("OUT", "."))
CONFIG = nic_config_for(SCENARIO)
PERIOD_NS = 1e9 / CONFIG.clock_hz
BUBBLES = float(SCENARIO.extra.get("bubbles", 0.0))
BACKPRESSURE = float(SCENARIO.extra.get("backpressure", 0.0))
#: Keys of a work request that are the bench's, not the NIC's.
_HOST_KEYS = ("data", "dst", "dst_qpn")


class GroupSide:
    """One RTL NIC of the group with its host: memory, completions, driver (what
    :func:`~sim.tb.cocotb_fabric.control_plane` needs of a side)."""

    def __init__(self, dut, dpi, index, name, loop, plan):
        self.index = index
        self.name = name
        self.loop = loop
        self.plan = plan
        self.bus = DpiBus(dut, dpi, index, dut.clk)
        self.driver = NicDriver(nic_register_map(CONFIG), self.bus, CONFIG)
        self.memory = _DpiMemory(dpi, index)
        self.memory.add(*plan["source"])
        self.memory.add(plan["mr"]["base"], plan["mr"]["length"])
        self.completions = []
        self.completion_times = []
        self.ev_events = []
        self.assumed_bad = set()
        self.probing = ProbeBackoff()

    async def bring_up(self, profile):
        d = self.driver
        extra = SCENARIO.extra
        await d.set_local(mac=self.plan["mac"], ip=self.plan["ip"])
        await d.register_mr(**self.plan["mr"])
        await d.configure_acks(ack_every=SCENARIO.ack_every, ack_delay=SCENARIO.ack_delay,
                               nak_interval=extra.get("nak_interval", 1024),
                               coalesce_gaps=bool(SCENARIO.coalesce_gaps),
                               gap_depth=SCENARIO.gap_depth,
                               ack_new_holes=bool(SCENARIO.ack_new_holes))
        await d.configure_requester(infer_k=SCENARIO.infer_k, cc=bool(SCENARIO.cc),
                                    reo_wnd=SCENARIO.reo_wnd,
                                    cc_nscc=SCENARIO.cc_algorithm == "nscc")
        await d.set_port_watch(SCENARIO.port_wnd, SCENARIO.port_quiet)
        mode = P.EvMode.AUTO if SCENARIO.baseline == "ecmp" else None
        await d.ev_profile_online(0, profile, num_evs=SCENARIO.evs,
                                  min_active=extra.get("min_active", min(2, SCENARIO.evs)),
                                  mode=mode, fate=bool(SCENARIO.fate))
        for connection in self.plan["connections"]:
            connection = dict(connection)
            await d.connect_qp(connection.pop("qpn"), **connection)


@cocotb.test()
async def group_run(dut):
    rng = random.Random(SCENARIO.seed)
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    dut.rst.value = 1
    names = nic_names(SCENARIO.nics)
    dpi = DpiAgents(CONFIG, first_step_edge=1 << 62, backlog_cycles=BACKLOG_CYCLES,
                    names=names)
    loop = _TimeLoop(dut.clk)
    start = {"cycle": None}

    def ns_at(cycle):
        if start["cycle"] is None:
            return 0.0
        return (cycle - start["cycle"]) * PERIOD_NS

    def now_us():
        return ns_at(loop.cycle) / 1000

    flows = flows_of(SCENARIO)
    peers = peers_of(SCENARIO, flows)
    work = make_work(SCENARIO, flows, peers)
    plan = nic_plan(SCENARIO, CONFIG, work, peers)
    expected = expected_completions(work, SCENARIO.nics)
    fabric = Fabric(fabric_config_multi(SCENARIO, CONFIG))
    sides = [GroupSide(dut, dpi, index, name, loop, plan[index])
             for index, name in enumerate(names)]
    by_name = {side.name: side for side in sides}
    if BUBBLES or BACKPRESSURE:
        for side in sides:
            dpi.set_random(side.index, BUBBLES, BACKPRESSURE, lambda: rng.randrange(1 << 62))

    completion_seen = Event()
    first_send = {"cycle": None}

    def service():
        """The agents' news: frames into the fabric at the time of their cycle, completions
        to their sides."""
        for event in dpi.drain():
            if event[0] == "frame":
                _, cycle, src, port, frame = event
                if first_send["cycle"] is None and start["cycle"] is not None:
                    first_send["cycle"] = cycle
                fabric.send(src, port, frame, ns_at(cycle))
            elif event[0] == "completion":
                _, cycle, name, bits = event
                by_name[name].completions.append(bits)
                by_name[name].completion_times.append(cycle)
                completion_seen.set()

    def release_cycle(arrival_ns):
        """The first cycle whose time is the frame's arrival or later."""
        cycle = start["cycle"] + max(0, math.ceil(arrival_ns / PERIOD_NS - 1e-9))
        while ns_at(cycle) < arrival_ns:
            cycle += 1
        return cycle

    serial = 0

    async def deliveries(stop):
        """Hand the fabric's frames to the receiving ports at the cycle they are due."""
        nonlocal serial
        change = dut.attention.value_change
        while not stop["done"]:
            service()
            due = fabric.next_arrival()
            if due is None:
                await change
                continue
            cycle = release_cycle(due)
            if cycle > loop.cycle:
                await First(change, loop.until(cycle))
                continue
            cycle = loop.cycle
            arrival_ps = round(ns_at(cycle) * 1000)
            for dst, plane, frame in fabric.deliver(ns_at(cycle)):
                serial += 1
                dpi.deliver(dpi.rx[dst][plane], cycle, arrival_ps, serial, frame)

    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    loop.begin()
    dpi.set_first_step_edge(dpi.edge + 2)
    spec = default_profile_spec()
    tasks = [cocotb.start_soon(side.bring_up(spec.profile)) for side in sides]
    for task in tasks:
        await task
    cocotb.log.info(f"{len(sides)} NICs up after {loop.cycle} cycles; {SCENARIO.pattern}, "
                    f"{len(flows)} flows of {SCENARIO.bytes} bytes on {SCENARIO.qps} QPs "
                    f"each, {SCENARIO.planes} planes")
    wr_layout = work_request_layout(CONFIG)
    for side in sides:
        for wr in work[side.index]:
            side.memory.write(wr["local_addr"], wr["data"])
    start["cycle"] = loop.cycle - 1         # as the two-NIC bench counts under the agents
    dpi.set_start(start["cycle"])
    service()           # nothing is sent during bring-up; drop what the agents kept
    wall0 = time.monotonic()
    cpu0 = time.process_time()
    for side in sides:
        dpi.send_beats(f"{side.name}_wr", [
            pack(wr_layout, {k: v for k, v in wr.items() if k not in _HOST_KEYS})
            for wr in work[side.index]])
    stop = {"done": False}
    cocotb.start_soon(deliveries(stop))
    for side in sides:
        cocotb.start_soon(control_plane(side, now_us, stop))

    cq_layout = completion_layout(CONFIG)

    def own_done(side):
        return sum(1 for c in side.completions
                   if unpack(cq_layout, c)["side"] == 0) >= len(work[side.index])

    def all_done():
        return all(len(side.completions) >= expected[side.index] for side in sides)

    report_every = max(1, int(20_000 / PERIOD_NS))      # progress every 20 us

    def progress():
        elapsed = time.monotonic() - wall0
        done = sum(len(side.completions) for side in sides)
        want = sum(expected.values())
        cocotb.log.info(
            f"t={now_us():8.1f} us  completions {done}/{want} "
            f"({100 * done / max(want, 1):.0f} %)  delivered "
            f"{fabric.delivered_payload_bytes() / 1024:8.1f} KiB  wall {elapsed:6.1f} s "
            f"({(loop.cycle - start['cycle']) / max(elapsed, 1e-9):,.0f} cycles/s)")

    finished = await _finish_dpi(loop, start, ns_at, completion_seen, progress, report_every,
                                 all_done, lambda: all(own_done(s) for s in sides), 64)
    done_ns = ns_at(loop.cycle)
    wall_s = time.monotonic() - wall0
    cpu_s = time.process_time() - cpu0
    stop["done"] = True
    await ClockCycles(dut.clk, 2 * POLL_CYCLES)

    result = {"backend": "rtl", "simulator": os.environ.get("MRC_SIMULATOR", "verilator"),
              "agents": "dpi", "finished": finished, "sim_us": done_ns / 1e3,
              "cycles": int(round(done_ns / PERIOD_NS)), "wall_s": wall_s,
              "completions": {}, "completion_times_us": {}, "counters": {}, "qp_errors": {},
              "ev_events": sorted((e for side in sides for e in side.ev_events),
                                  key=lambda e: (e["time_us"], e["nic"])),
              "flows": [(names[s], names[d]) for s, d in flows],
              "probes_sent": {side.name: side.probing.sent for side in sides}}
    cut = loop.cycle
    for side in sides:
        result["counters"][side.name] = await side.driver.counters()
        result["qp_errors"][side.name] = await side.driver.qp_errors()
    await RisingEdge(dut.clk)
    await ReadWrite()
    service()
    for side in sides:
        taken = [i for i, c in enumerate(side.completion_times) if c <= cut]
        result["completions"][side.name] = [unpack(cq_layout, side.completions[i])
                                            for i in taken]
        result["completion_times_us"][side.name] = [
            round(ns_at(side.completion_times[i]) / 1000, 3) for i in taken]
    result["work"] = {side.name: [{**{k: v for k, v in wr.items() if k not in ("data", "dst")},
                                   "dst": names[wr["dst"]]} for wr in work[side.index]]
                      for side in sides}
    result["memory_mismatches"] = memory_mismatches(
        lambda index, address, length: dpi.read(index, address, length), work, names)
    first = first_send["cycle"]
    result["first_send_us"] = ns_at(first) / 1000 if first is not None else 0.0
    result["done_us"] = done_ns / 1000
    ports = CONFIG.ports
    backlog = {name: [] for name in names}
    for cycle, queued in dpi.backlog:
        if cycle <= cut:
            for index, name in enumerate(names):
                backlog[name].append((round(ns_at(cycle) / 1000, 3),
                                      queued[index * ports:(index + 1) * ports]))
    result["rx_backlog"] = {
        name: {"max_beats": max((sum(q) for _, q in series), default=0),
               "max_port_beats": max((max(q) for _, q in series), default=0)}
        for name, series in backlog.items()}
    result["analysis"] = analyse(fabric, SCENARIO, CONFIG, end_ns=done_ns)
    result["fabric_summary"] = {"queue_delay_us": fabric.stats.queue_delay_us(),
                                "data_drops": fabric.stats.data_drops}
    OUT.mkdir(parents=True, exist_ok=True)
    fabric.save(OUT)
    try:
        from sim.fabric.plot import plot_egress_waits
        plot_egress_waits(fabric.stats.queue_waits, OUT / "egress.png",
                          title=f"{SCENARIO.name}: {SCENARIO.nics} RTL NICs, "
                                f"{SCENARIO.pattern}: egress queue waits")
    except RuntimeError:        # matplotlib missing
        pass
    (OUT / "result.json").write_text(json.dumps(result, default=str))
    cocotb.log.info(f"done: finished={finished} at {done_ns / 1000:.1f} us, wall {wall_s:.1f} s, "
                    f"processor {cpu_s:.1f} s")
