"""NSCC in the requester: the divider, the engine against its bit-exact Python mirror
(:class:`~hdl.transport.req_nscc.NsccFixed`) and the mirror against the model's NSCC
(:mod:`sim.model.nscc`), the requester with NSCC selected.

The engine's timing decides when a division's result lands (it waits for an idle input
cycle), so the mirror replays the engine's own order of operations (its ``o`` stream); every
window it reports must be the mirror's exactly. Against the float model, with ACKs spaced so
that every division lands before the QP's next ACK, the window must stay within the
fixed-point tolerance of ``docs/congestion.md``.
"""

import math
import random

import pytest
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.transport.req_nscc import (
    AVG_FRAC,
    CWND_FRAC,
    INC_FRAC,
    QUOTIENT_BITS,
    NsccDivider,
    NsccEngine,
    NsccFixed,
    NsccOp,
    nscc_constants,
)
from sim.model.nscc import Nscc, NsccSetting
from sim.tb.amsim import StreamCollector, StreamDriver

CONFIG = NicConfig(qps=8, mpr_units=1, mtu=256, wr_slots=4, max_wimm=2, evs_per_profile=8)
SETTING = NsccSetting(line_rate_gbps=100.0, base_rtt_ns=4000.0, mtu=CONFIG.mtu)
K = nscc_constants(SETTING)
BASE_T = 500                    # the setting's round trip in 8 ns units


def _sim(dut):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    return sim


# -- the divider ------------------------------------------------------------------------------

@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.5, 0.5)])
def test_divider_gives_the_floor_quotient_or_saturates(bubbles, backpressure):
    rng = random.Random(5)
    jobs = [(7, 3), (0, 1), (1 << 63, 1), ((5 << 32) - 1, 5), (5 << 32, 5), (123, 0)]
    for _ in range(40):
        divisor = rng.randrange(1, 1 << rng.randrange(1, 33))
        jobs.append((rng.randrange(divisor << rng.randrange(0, 33)), divisor))
    dut = NsccDivider()
    driver = StreamDriver(dut.i, bubbles=bubbles, seed=1)
    collector = StreamCollector(dut.o, backpressure=backpressure, seed=2)
    sim = _sim(dut)
    sim.add_process(driver.process)
    sim.add_process(collector.process)
    driver.send([{"dividend": a, "divisor": b} for a, b in jobs])

    async def bench(ctx):
        await collector.wait(ctx, len(jobs), timeout=10_000)
        await ctx.tick().repeat(50)
        assert len(collector.items) == len(jobs), "a result without a job"

    sim.add_testbench(bench)
    sim.run()
    top = (1 << QUOTIENT_BITS) - 1
    for (a, b), got in zip(jobs, collector.items, strict=True):
        assert int(got) == (min(a // b, top) if b else top), (a, b)


def test_divider_takes_one_job_at_a_time_and_answers_in_quotient_bits_plus_one_cycles():
    dut = NsccDivider()

    async def bench(ctx):
        ctx.set(dut.i.payload, {"dividend": 1000, "divisor": 7})
        ctx.set(dut.i.valid, 1)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for cycle in range(1, QUOTIENT_BITS + 1):
            assert not ctx.get(dut.i.ready) and not ctx.get(dut.o.valid), cycle
            await ctx.tick()
        assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == 142
        assert not ctx.get(dut.i.ready)         # until the result is taken
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        assert ctx.get(dut.i.ready) and not ctx.get(dut.o.valid)

    sim = _sim(dut)
    sim.add_testbench(bench)
    sim.run()


# -- the engine against its mirror --------------------------------------------------------------

def random_events(rng, qpns, count, *, qp_weights=None):
    """ACK-side events with a target round trip each (``rtt``: the echo is made from it and
    the time the event is queued; the engine's own sample is a little longer)."""
    events = []
    for _ in range(count):
        qpn = rng.choices(qpns, weights=qp_weights)[0]
        if rng.random() < 0.05:
            events.append({"qpn": qpn, "nack": 1, "ecn": 0, "acked": 0, "rtt": 0})
            continue
        band = rng.random()
        if band < 0.3:
            delay = rng.randrange(0, 100)                   # fast increase territory
        elif band < 0.6:
            delay = rng.randrange(100, K.target)            # proportional
        elif band < 0.97:
            delay = rng.randrange(K.target, 3 * K.target)   # fair / decrease
        else:
            delay = rng.randrange(K.qa_delay, K.qa_delay + 500)     # quick adapt
        events.append({"qpn": qpn, "nack": 0, "ecn": int(rng.random() < 0.3),
                       "acked": rng.choice([0, 1, 1, 1, 2, 2, 3, 8, 40]),
                       "rtt": BASE_T + delay})
    return events


class EngineBench:
    """The engine with a driver (bubbles) and a collector (backpressure) and a clock of
    ``step`` time units per cycle."""

    def __init__(self, *, bubbles, backpressure, seed, step=4):
        self.dut = dut = NsccEngine(config=CONFIG, setting=SETTING)
        self.driver = StreamDriver(dut.i, bubbles=bubbles, seed=seed)
        self.collector = StreamCollector(dut.o, backpressure=0.0, seed=seed + 1)
        self.backpressure = backpressure
        self.step = step
        self.now = 1000
        self.sim = _sim(dut)
        self.sim.add_process(self.driver.process)
        self.sim.add_process(self.collector.process)
        self.sim.add_process(self._clock)
        self.events = []
        self.max_level = 0

    async def _clock(self, ctx):
        while True:
            ctx.set(self.dut.now, self.now & ((1 << 24) - 1))
            await ctx.tick()
            self.now += self.step

    async def reset(self, ctx, qpns):
        self.collector.backpressure = 0.0
        for qpn in qpns:
            ctx.set(self.dut.control.write, 1)
            ctx.set(self.dut.control.qpn, qpn)
            await ctx.tick()
            ctx.set(self.dut.control.write, 0)
        await ctx.tick().repeat(3)
        self.collector.backpressure = self.backpressure

    def send(self, events):
        """Queue events; each echo is made from its round trip and the time now."""
        for event in events:
            echo = (self.now - event["rtt"]) & 0xFFFF
            payload = {name: event[name] for name in ("qpn", "nack", "ecn", "acked")}
            self.events.append({**payload, "echo": echo})
            self.driver.send([{**payload, "echo": echo}])

    async def drain(self, ctx, *, cycles=200):
        while not self.driver.idle:
            await ctx.tick()
        for _ in range(cycles):
            await ctx.tick()
            if not ctx.get(self.dut.busy):
                break
        await ctx.tick().repeat(4)
        self.collector.backpressure = 0.0
        for _ in range(2000):
            await ctx.tick()
            if not ctx.get(self.dut.busy):
                break
        await ctx.tick().repeat(4)
        self.collector.backpressure = self.backpressure

    def replay(self):
        """Replay the engine's operations in the mirror; every update must match. Returns the
        operations' kinds."""
        mirror = NsccFixed(K)
        events = iter(self.events)
        kinds = []
        for update in self.collector.items:
            op, qpn, now = NsccOp(update.op), int(update.qpn), int(update.now)
            kinds.append(op)
            if op in (NsccOp.ACK, NsccOp.NACK):
                event = next(events)
                assert (event["qpn"], event["nack"]) == (qpn, int(op == NsccOp.NACK))
                want = mirror.step(op, qpn, now, acked=event["acked"],
                                   rtt=(now - event["echo"]) & 0xFFFF, ecn=bool(event["ecn"]),
                                   div_free=bool(update.div_free))
            else:
                want = mirror.step(op, qpn, now)
            assert int(update.cwnd) == want, (len(kinds), op, qpn)
            assert int(update.window) == mirror.window(qpn)
        assert next(events, None) is None, "an event left no update"
        return kinds, mirror


@pytest.mark.parametrize("seed, bubbles, backpressure", [
    (1, 0.0, 0.0), (2, 0.3, 0.3), (3, 0.6, 0.2), (4, 0.1, 0.6)])
def test_engine_matches_its_mirror_on_random_events(seed, bubbles, backpressure):
    rng = random.Random(seed)
    qpns = [0, 3, 5, 7]
    bench = EngineBench(bubbles=bubbles, backpressure=backpressure, seed=seed)

    async def testbench(ctx):
        await bench.reset(ctx, qpns)
        for _ in range(6):
            bench.send(random_events(rng, qpns, 300, qp_weights=[6, 2, 1, 1]))
            await bench.drain(ctx)

    bench.sim.add_testbench(testbench)
    bench.sim.run()
    kinds, mirror = bench.replay()
    assert kinds.count(NsccOp.APPLY) > 5
    assert mirror.job is None
    assert len({int(u.cwnd) for u in bench.collector.items}) > 50


def test_back_to_back_events_of_one_qp_one_per_cycle():
    """An unbroken stream of one QP's events: taken one per cycle (never a stall), each sees
    the one before; the divisions wait for the gap after the stream."""
    rng = random.Random(9)
    bench = EngineBench(bubbles=0.0, backpressure=0.0, seed=9, step=16)
    events = random_events(rng, [2], 400)

    async def testbench(ctx):
        await bench.reset(ctx, [2])
        bench.send(events)
        await ctx.tick()
        for _ in range(len(events)):
            assert ctx.get(bench.dut.i.ready) and ctx.get(bench.dut.i.valid)
            await ctx.tick()
        await bench.drain(ctx)

    bench.sim.add_testbench(testbench)
    bench.sim.run()
    kinds, _ = bench.replay()
    ops = [k for k in kinds if k != NsccOp.RESET]
    first_apply = ops.index(NsccOp.APPLY)
    assert first_apply == len(events)           # nothing cut into the stream
    assert ops.count(NsccOp.APPLY) == 1         # one job at a time: the rest waited


# -- the mirror against the model ----------------------------------------------------------------

def _model_run(setting, seed, count, *, gap_ns=400):
    """One QP's events through the mirror (every division landing at once, as the engine's
    does when the QP's ACKs are spaced) and through the float model side by side; yields
    (mirror cwnd in bytes, model cwnd, the model's rule)."""
    k = nscc_constants(setting)
    rng = random.Random(seed)
    mirror = NsccFixed(k)
    now = 1000
    mirror.reset(0, now)
    model = Nscc(setting, now * 8)
    base = round(setting.base_rtt_ns / 8)
    for event in random_events(rng, [0], count):
        now += gap_ns // 8 + rng.randrange(4)
        rtt = base + event["rtt"] - BASE_T
        if event["nack"]:
            mirror.step(NsccOp.NACK, 0, now)
            rule = model.on_nack(now * 8, setting.mtu)
        else:
            mirror.step(NsccOp.ACK, 0, now, acked=event["acked"], rtt=rtt,
                        ecn=bool(event["ecn"]))
            rule = model.on_ack(now * 8, event["acked"] * setting.mtu,
                                P.timestamp_age_ns(now * 8, (now - rtt) & 0xFFFF),
                                bool(event["ecn"]))
        if mirror.job is not None:
            mirror.step(NsccOp.APPLY, 0, now)
        yield mirror.qps[0]["cwnd"] / (1 << CWND_FRAC), model.cwnd, rule


@pytest.mark.parametrize("seed, setting", [
    (1, SETTING),
    (2, NsccSetting(line_rate_gbps=400.0, base_rtt_ns=12_000.0, mtu=4096, trimming=True)),
])
def test_fixed_point_tracks_the_model(seed, setting):
    """Run side by side, within 1 % of the model's window plus an MTU / 64, ACK by ACK
    (rounding of the delay average and of the increase: docs/congestion.md)."""
    worst = 0.0
    for mirror, model, rule in _model_run(setting, seed, 3000):
        if rule != "decrease":      # that ACK's period end waits for the next ACK
            worst = max(worst, abs(mirror - model) / (0.01 * model + setting.mtu / 64))
    assert worst <= 1.0, worst


def _load(mirror, model, now):
    """The model QP's state in the mirror's formats (QP 0)."""
    k, mtu = mirror.k, model.p.setting.mtu
    mask = (1 << 24) - 1
    units = lambda ns: math.ceil(ns / 8) & mask        # noqa: E731
    mirror.qps[0] = dict(
        cwnd=round(model.cwnd * (1 << CWND_FRAC)),
        base_valid=int(model.base_rtt_ns != math.inf),
        base=0 if model.base_rtt_ns == math.inf else int(model.base_rtt_ns // 8),
        avg=round(model.avg_delay_ns / 8 * (1 << AVG_FRAC)),
        inc=round(model.inc * (1 << INC_FRAC)), adjust=model.adjust_bytes // mtu,
        adjust_at=units(model.adjust_start_ns), eta_at=units(model.eta_ns),
        md_valid=int(model.md_ns != -math.inf),
        md_at=0 if model.md_ns == -math.inf else units(model.md_ns),
        fast=int(model.fast), fast_psns=model.fast_bytes // mtu,
        qa_end=units(model.qa_end_ns), qa_psns=model.qa_bytes // mtu,
        qa_trig=int(model.qa_triggered), pending=0)
    assert k is not None and now >= 0


@pytest.mark.parametrize("seed, setting", [
    (1, SETTING),
    (2, NsccSetting(line_rate_gbps=400.0, base_rtt_ns=12_000.0, mtu=4096, trimming=True)),
    (3, NsccSetting(line_rate_gbps=8.0, base_rtt_ns=3000.0, mtu=1024)),
    (4, NsccSetting(line_rate_gbps=25.0, base_rtt_ns=2000.0, mtu=256, trimming=True)),
])
def test_one_event_from_the_models_state_gives_the_models_window(seed, setting):
    """From the model's state, one event in the mirror gives the model's window within
    0.1 % plus a byte, every rule included (a decrease's ACK without its period end). Run
    side by side, small windows drift apart: one period end that waited shifts the periods
    after it."""
    k = nscc_constants(setting)
    rng = random.Random(seed)
    model = Nscc(setting, 8000)
    now = 1000
    base = round(setting.base_rtt_ns / 8)
    rules = set()
    for event in random_events(rng, [0], 3000):
        now += rng.choice([1, 20, 50, 200])
        mirror = NsccFixed(k)
        _load(mirror, model, now)
        rtt = base + (event["rtt"] - BASE_T) * base // BASE_T     # the same delays in targets
        if event["nack"]:
            mirror.step(NsccOp.NACK, 0, now)
            rule = "nack-qa" if model.on_nack(now * 8, setting.mtu) else "nack"
        else:
            mirror.step(NsccOp.ACK, 0, now, acked=event["acked"], rtt=rtt,
                        ecn=bool(event["ecn"]))
            rule = model.on_ack(now * 8, event["acked"] * setting.mtu,
                                P.timestamp_age_ns(now * 8, (now - rtt) & 0xFFFF),
                                bool(event["ecn"]))
        if mirror.job is not None:
            mirror.step(NsccOp.APPLY, 0, now)
        rules.add(rule)
        got = mirror.qps[0]["cwnd"] / (1 << CWND_FRAC)
        if rule == "decrease" and model.adjust_bytes == 0 and model.inc == 0:
            continue                # the model also ended the period: the mirror waits
        assert abs(got - model.cwnd) <= 0.001 * model.cwnd + 1, (rule, got, model.cwnd)
    assert {"fast", "proportional", "fair", "hold", "decrease", "nack"} <= rules, rules
    # (with a window of many MTUs a quick-adapt period always acknowledges more than its gate)
    assert setting.mtu > 256 or rules & {"quick-adapt", "nack-qa"}, rules


def test_engine_with_spaced_acks_tracks_the_model():
    """The gateware itself against the float model: ACKs of one QP spaced wider than a
    division, random bubbles and backpressure."""
    rng = random.Random(21)
    bench = EngineBench(bubbles=0.3, backpressure=0.3, seed=21, step=2)
    events = random_events(rng, [1], 500)

    async def testbench(ctx):
        await bench.reset(ctx, [1])
        for event in events:
            bench.send([event])
            await ctx.tick().repeat(60)
        await bench.drain(ctx)

    bench.sim.add_testbench(testbench)
    bench.sim.run()
    kinds, _ = bench.replay()
    updates = bench.collector.items
    model = Nscc(SETTING, int(updates[0].now) * 8)
    logged = iter(bench.events)
    worst = 0.0
    for index, update in enumerate(updates[1:], 1):
        now = int(update.now)
        if NsccOp(update.op) == NsccOp.ACK:
            event = next(logged)
            rule = model.on_ack(now * 8, event["acked"] * CONFIG.mtu,
                         P.timestamp_age_ns(now * 8, event["echo"]), bool(event["ecn"]))
        elif NsccOp(update.op) == NsccOp.NACK:
            event = next(logged)
            rule = model.on_nack(now * 8, CONFIG.mtu)
        else:
            continue
        # A division this event started lands right after it (the model's lands at once).
        landed = updates[index + 1] if index + 1 < len(updates) else update
        got = int((landed if NsccOp(landed.op) == NsccOp.APPLY else update).cwnd)
        got /= 1 << CWND_FRAC
        if rule != "decrease":      # that ACK's period end waits for the next ACK
            worst = max(worst, abs(got - model.cwnd) / (0.01 * model.cwnd + CONFIG.mtu / 64))
    assert kinds.count(NsccOp.APPLY) > 5
    assert worst <= 1.0, worst


# -- the requester with NSCC selected ------------------------------------------------------------

def test_requester_with_nscc_selected_sends_within_the_nscc_window_and_completes():
    """End to end: two QPs write through a bottleneck whose queue grows with the PSNs in
    flight (round trip = base + queue, CE above a queue), every packet ACKed with its
    timestamp echo. With CONFIG cc and cc_nscc, the segmenter gates on NSCC's window: no QP
    ever has more PSNs in flight than NSCC's largest window (well under the MPR), and every
    WR completes in order without error."""
    from hdl.transport.req_defs import RequesterCommand
    from hdl.transport.requester import Requester
    from sim.model.responder import full_header
    from tests.hdl.test_requester import ack_header

    setting = NsccSetting(line_rate_gbps=8.0, base_rtt_ns=4000.0, mtu=CONFIG.mtu)
    k = nscc_constants(setting)
    max_window = k.cwnd_max >> (CWND_FRAC + k.mtu_log2)
    assert max_window < 128                         # MPR 1: NSCC is what limits
    dut = Requester(config=CONFIG, nscc=setting)
    rng = random.Random(3)
    wr = StreamDriver(dut.wr, bubbles=0.2, seed=1)
    rx = StreamDriver(dut.rx, bubbles=0.2, seed=2)
    ctl = StreamDriver(dut.ctl, seed=3)
    send = StreamCollector(dut.send, backpressure=0.2, seed=4)
    completion = StreamCollector(dut.completion, backpressure=0.2, seed=5)
    ctl_resp = StreamCollector(dut.ctl_resp, seed=6)
    sim = _sim(dut)
    for process in (wr.process, rx.process, ctl.process, send.process, completion.process,
                    ctl_resp.process):
        sim.add_process(process)
    clock = {"ns": 0}

    async def timebase(ctx):
        while True:
            ctx.set(dut.now_ns, clock["ns"] & 0xFFFF_FFFF)
            ctx.set(dut.now_units, clock["ns"] >> 10)
            await ctx.tick()
            clock["ns"] += 8

    sim.add_process(timebase)
    qpns = (1, 6)
    wrs = [{"qpn": qpns[i % 2], "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": i,
            "local_addr": 0, "remote_addr": 0, "rkey": 0, "imm": 0,
            "length": rng.randrange(1, 10) * CONFIG.mtu} for i in range(12)]
    stats = {"in_flight": 0, "marks": 0}

    async def testbench(ctx):
        commands = [{"cmd": RequesterCommand.QP_WRITE, "qpn": q, "state": P.QpState.RTS,
                     "psn": 0, "mpr": 1, "max_wimm": 1, "timeout": 8, "retry_linear": 7,
                     "retry_exp": 5} for q in qpns]
        commands.append({"cmd": RequesterCommand.CONFIG, "cc": 1, "cc_nscc": 1,
                         "infer_k": 0, "ackreq_every": 0})
        for n, command in enumerate(commands, 1):
            ctl.send([command])
            await ctl_resp.wait(ctx, n)
            assert int(ctl_resp.items[-1].errno) == 0
        wr.send(wrs)
        seen = 0
        una = dict.fromkeys(qpns, 0)
        flight = []                                 # [due ns, qpn, psn, echo, marked]
        for _ in range(100_000):
            for item in send.items[seen:]:
                qpn, psn = int(item.qpn), int(item.context.psn)
                ahead = psn - una[qpn]
                stats["in_flight"] = max(stats["in_flight"], ahead + 1)
                assert ahead < max_window, (qpn, psn, una[qpn])
                queued = max(0, len(flight) - 12)   # beyond the pipe: a queue of 1 us each
                marked = queued * 1024 > 4000
                stats["marks"] += marked
                flight.append([clock["ns"] + 4000 + queued * 1024, qpn, psn,
                               P.wire_timestamp(clock["ns"]), marked])
            seen = len(send.items)
            due = [f for f in flight if f[0] <= clock["ns"]]
            for entry in due:
                flight.remove(entry)
                _, qpn, psn, echo, marked = entry
                header = ack_header(qpn, psn, ce=marked)
                header["ctl"]["sack"]["cc_state"]["tx_timestamp"] = echo
                rx.send([{"header": full_header(header, CONFIG), "first": 1, "last": 1}])
                una[qpn] = max(una[qpn], psn + 1)
            if len(completion.items) == len(wrs):
                break
            await ctx.tick()
        assert len(completion.items) == len(wrs), (len(completion.items), len(send.items))

    sim.add_testbench(testbench)
    sim.run()
    for qpn in qpns:
        got = [(int(c.wr_id), int(c.status)) for c in completion.items if int(c.qpn) == qpn]
        assert got == [(w["wr_id"], 0) for w in wrs if w["qpn"] == qpn]
    assert stats["marks"] > 0 and 4 < stats["in_flight"] <= max_window


@pytest.mark.parametrize("built, cc_nscc, window", [
    (True, 1, "nscc"), (True, 0, "ecn"), (False, 1, "ecn")])
def test_config_cc_nscc_selects_the_window_the_segmenter_gates_on(built, cc_nscc, window):
    """Without ACKs a QP sends what its window allows: NSCC's first window (one BDP) with
    CONFIG cc_nscc in a build with NSCC; the ECN window (mpr x 128) with cc_nscc 0, or in a
    build without NSCC, where cc_nscc is ignored."""
    from hdl.transport.req_defs import RequesterCommand
    from hdl.transport.requester import Requester

    setting = NsccSetting(line_rate_gbps=8.0, base_rtt_ns=4000.0, mtu=CONFIG.mtu)
    k = nscc_constants(setting)
    dut = Requester(config=CONFIG, nscc=setting if built else None)
    wr = StreamDriver(dut.wr)
    ctl = StreamDriver(dut.ctl)
    send = StreamCollector(dut.send)
    ctl_resp = StreamCollector(dut.ctl_resp)
    sim = _sim(dut)
    for process in (wr.process, ctl.process, send.process, ctl_resp.process):
        sim.add_process(process)
    packets = 60

    async def testbench(ctx):
        for n, command in enumerate([
                {"cmd": RequesterCommand.QP_WRITE, "qpn": 2, "state": P.QpState.RTS,
                 "psn": 0, "mpr": 1, "max_wimm": 1, "timeout": 20},
                {"cmd": RequesterCommand.CONFIG, "cc": 1, "cc_nscc": cc_nscc}], 1):
            ctl.send([command])
            await ctl_resp.wait(ctx, n)
        wr.send([{"qpn": 2, "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": 1, "local_addr": 0,
                  "remote_addr": 0, "rkey": 0, "imm": 0, "length": packets * CONFIG.mtu}])
        await ctx.tick().repeat(packets + 40)

    sim.add_testbench(testbench)
    sim.run()
    first = k.cwnd_init >> (CWND_FRAC + k.mtu_log2)
    assert len(send.items) == (first if window == "nscc" else packets)
