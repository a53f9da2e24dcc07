# amaranth: UnusedElaboratable=no
"""PathSelect in the Amaranth simulator: every decision, response and event equals the model's.

A Python process answers the unit's expander ports with :class:`sim.model.path.
ReferenceExpander` (the reference :mod:`hdl.path.ev`), so these tests do not depend on the
hardware expander. Streams run with random bubbles and backpressure unless a test measures
throughput.
"""

import math
import random
from collections import Counter

import pytest
from amaranth.hdl import unsigned
from amaranth.lib import data
from amaranth.sim import Simulator

from hdl.config import NicConfig
from hdl.interfaces import feedback_layout
from hdl.path import ev as evlib
from hdl.path.select import (
    COUNTERS,
    PENALTY_TRIMMED,
    PathCommand,
    PathSelect,
    ProbeRecovery,
)
from hdl.protocol import Errno, EvMode, EvState, FeedbackKind, ProfileState
from sim.model.path import (
    PathModel,
    ReferenceExpander,
    bring_up_commands,
    command,
    fields_of_image,
    udp_ev,
    udp_profile,
)
from sim.tb.amsim import StreamCollector, StreamDriver

#: Cycles from the last feedback's transfer until selection sees its effect (the entry
#: update's latency, plus the profile table's registered candidate sets).
FEEDBACK_SETTLE_CYCLES = 8

SMALL = NicConfig(qps=16, ev_profiles=2, evs_per_profile=16, ports=4)
#: The configuration of every test on a Verilator model (``on_verilator``): one design, so one
#: model build, serves them all (64 EVs on 8 ports; 64 QPs and four profiles for the tests that
#: need them; the event depth and hash seed of the most demanding test).
WIDE = NicConfig(qps=64, ev_profiles=4, evs_per_profile=64, ports=8)
WIDE_PARAMS = {"event_depth": 128, "hash_seed": 0x1234}
CONTEXT = unsigned(16)


def chi2_sf(statistic, df):
    """Upper tail of chi-square (scipy is not installed): the regularized upper incomplete
    gamma Q(df/2, statistic/2) from the series of the lower one."""
    a, x = df / 2, statistic / 2
    term = total = 1 / a
    n = 1
    while term > total * 1e-15:
        term *= x / (a + n)
        total += term
        n += 1
    return 1 - math.exp(-x + a * math.log(x) - math.lgamma(a)) * total


class Bench:
    """The unit, its model, stream drivers and an expander service, in one simulator.

    ``run(script)`` runs the async ``script(bench, ctx)`` as the testbench; ``command``,
    ``requests``, ``feedback`` and ``settle`` are its steps and keep the model in step.
    """

    def __init__(self, config, *, profiles=None, bubbles=0.3, backpressure=0.3, seed=0,
                 event_ready=True, context=CONTEXT, **params):
        profiles = profiles or {0: udp_profile(), 1: udp_profile(EvMode.GENERATED)}
        self.config = config
        # The SKIP recovery sweep runs on a timer the model follows only through explicit
        # ticks: off unless a test asks for it.
        params.setdefault("skip_shift", None)
        self.dut = PathSelect(config=config, context=context, **params)
        model_params = {k: v for k, v in params.items() if k != "decay_shift"}
        self.model = PathModel(config=config, expander=ReferenceExpander(profiles),
                               **model_params)
        self.expander = ReferenceExpander(profiles)
        self.rng = random.Random(seed)
        self.requests_in = StreamDriver(self.dut.i, bubbles=bubbles, seed=seed + 1)
        self.decisions = StreamCollector(self.dut.o, backpressure=backpressure, seed=seed + 2)
        self.feedback_in = StreamDriver(self.dut.feedback, bubbles=bubbles, seed=seed + 3)
        self.events = StreamCollector(self.dut.events,
                                      backpressure=backpressure if event_ready else 1.0,
                                      seed=seed + 4)
        self.expected = []                      # model decisions, in order
        self.sent = []                          # requests, in order
        self.responses = []                     # (rtl, model) per command
        self.cycle = 0
        self.output_cycles = []

    # -- processes ---------------------------------------------------------------------------

    async def _serve(self, ctx, request, response, answer):
        # Plain ticks, not .until(): these processes are still waiting when the simulation
        # ends, and a pending .until() then fails to close.
        while True:
            ctx.set(request.ready, 1)
            valid = 0
            while not valid:
                _, _, valid, payload = await ctx.tick().sample(request.valid, request.payload)
            ctx.set(request.ready, 0)
            for _ in range(self.rng.randrange(4)):
                await ctx.tick()
            ctx.set(response.payload, answer(payload))
            ctx.set(response.valid, 1)
            ready = 0
            while not ready:
                _, _, ready = await ctx.tick().sample(response.ready)
            ctx.set(response.valid, 0)

    def _expand(self, payload):
        errno, fields = self.expander.expand(int(payload.profile), int(payload.value))
        return {"errno": errno, "fields": fields, "image": 0, "tag": int(payload.tag)}

    def _generate(self, payload):
        errno, value = self.expander.generate(int(payload.profile), int(payload.index))
        return {"errno": errno, "value": value}

    async def _clock(self, ctx):
        dut = self.dut
        while True:
            _, _, valid, ready = await ctx.tick().sample(dut.o.valid, dut.o.ready)
            if valid and ready:
                self.output_cycles.append(self.cycle)
            self.cycle += 1

    # -- script steps ------------------------------------------------------------------------

    async def command(self, ctx, cmd, *, timeout=20_000):
        dut = self.dut
        ctx.set(dut.ctl.payload, cmd)
        ctx.set(dut.ctl.valid, 1)
        await self._until(ctx, dut.ctl.ready, timeout)
        ctx.set(dut.ctl.valid, 0)
        ctx.set(dut.ctl_resp.ready, 1)
        payload = await self._until(ctx, dut.ctl_resp.valid, timeout, dut.ctl_resp.payload)
        ctx.set(dut.ctl_resp.ready, 0)
        got = (Errno(int(payload.errno)), int(payload.data))
        want = self.model.command(cmd)
        self.responses.append((cmd, got, (Errno(want[0]), want[1])))
        return got

    @staticmethod
    async def _until(ctx, signal, timeout, sample=None):
        for _ in range(timeout):
            if sample is None:
                _, _, value = await ctx.tick().sample(signal)
            else:
                _, _, value, payload = await ctx.tick().sample(signal, sample)
            if value:
                return payload if sample is not None else None
        raise AssertionError(f"{signal.name} not seen within {timeout} cycles")

    async def commands(self, ctx, cmds):
        for cmd in cmds:
            await self.command(ctx, cmd)

    async def requests(self, ctx, requests, *, wait=True):
        """Send requests (dicts of path_request fields + ``context``) and wait for their
        decisions; the model decides them in the same order."""
        for request in requests:
            avoid = request["avoid_ev"] if request.get("avoid_ev_valid") else None
            decision = self.model.select(request["qpn"], avoid_ev=avoid,
                                         probe=bool(request.get("probe")),
                                         ev=request.get("ev", 0),
                                         context=request.get("context", 0))
            self.expected.append(decision.as_dict())
            self.sent.append(request)
        self.requests_in.send([{"avoid_ev_valid": 0, "avoid_ev": 0, "probe": 0, "ev": 0,
                                "context": 0, **r} for r in requests])
        if wait:
            await self.decisions.wait(ctx, len(self.expected))

    async def feedback(self, ctx, items):
        for qpn, ev, kind in items:
            self.model.feedback(qpn, ev, kind)
        # Raw bits, so that kinds outside FeedbackKind can be sent too.
        layout = feedback_layout(self.config)
        self.feedback_in.send([
            data.Const(layout, q << layout["qpn"].offset | e << layout["ev"].offset
                       | int(k) << layout["kind"].offset)
            for q, e, k in items])
        await self.settle(ctx)

    async def settle(self, ctx, timeout=10_000):
        """Wait until every queued feedback has been accepted and applied."""
        for _ in range(timeout):
            if self.feedback_in.idle:
                break
            await ctx.tick()
        # f1 -> f2 -> e1 -> e2 -> e3 -> profile table -> candidate sets updated
        for _ in range(FEEDBACK_SETTLE_CYCLES):
            await ctx.tick()

    def random_request(self, qpns, evs, *, avoid=0.2, probe=0.1):
        request = {"qpn": self.rng.choice(qpns), "context": self.rng.getrandbits(16)}
        if self.rng.random() < avoid:
            request.update(avoid_ev_valid=1, avoid_ev=self.rng.randrange(evs))
        if self.rng.random() < probe:
            request.update(probe=1, ev=self.rng.randrange(evs))
        return request

    # -- running and checking ----------------------------------------------------------------

    def run(self, script):
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        dut = self.dut

        async def serve_expand(ctx):
            await self._serve(ctx, dut.exp_req, dut.exp_resp, self._expand)

        async def serve_generate(ctx):
            await self._serve(ctx, dut.gen_req, dut.gen_resp, self._generate)

        sim.add_process(serve_expand)
        sim.add_process(serve_generate)
        sim.add_process(self.requests_in.process)
        sim.add_process(self.decisions.process)
        sim.add_process(self.feedback_in.process)
        sim.add_process(self.events.process)
        sim.add_process(self._clock)
        finished = []

        async def testbench(ctx):
            await script(self, ctx)
            await self.decisions.wait(ctx, len(self.expected))
            for _ in range(8):
                await ctx.tick()
            self.counters = {name: ctx.get(getattr(dut, name)) for name in COUNTERS}
            self.profile_online = ctx.get(dut.profile_online)
            finished.append(True)

        sim.add_testbench(testbench)
        sim.run()                       # every wait in the script has a cycle timeout
        assert finished

    def check(self, *, counters=True, events=True, decisions=True):
        for cmd, got, want in self.responses:
            assert got == want, f"command {cmd}: RTL {got}, model {want}"
        got = self.decisions.as_dicts()
        if decisions:
            assert len(got) == len(self.expected)
            for n, (g, w) in enumerate(zip(got, self.expected, strict=True)):
                assert g == w, f"decision {n}: RTL {g}, model {w}"
        if events:
            assert self.events.as_dicts() == [e.as_dict() for e in self.model.pop_events()]
        if counters:
            assert self.counters == self.model.counters


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bubbles, backpressure", [(0.3, 0.3), (0.0, 0.0)])
def test_every_decision_equals_the_model(bubbles, backpressure):
    """Several QPs interleaved on an EXPLICIT profile and an adaptive GENERATED one, with
    avoid_ev, probes, DENIED entries and every feedback kind between the rounds."""
    bench = Bench(SMALL, bubbles=bubbles, backpressure=backpressure, seed=7, decay_shift=None)
    states = [EvState.DENIED if i in (3, 9) else EvState.GOOD for i in range(16)]
    kinds = list(FeedbackKind)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, min_active=4, states=states,
                                                    qpns=(0, 1, 2, 3), offsets=(0, 5, 9, 15)))
        await bench.commands(ctx, bring_up_commands(1, 12, ports=4, mode=EvMode.GENERATED,
                                                    adaptive=1, min_active=3,
                                                    qpns=(4, 5, 6), offsets=(0, 2, 11)))
        qpns = [0, 1, 2, 3, 4, 5, 6, 7]             # QP 7 is unbound: no_path
        for _ in range(4):
            await bench.requests(ctx, [bench.random_request(qpns, 16) for _ in range(60)])
            mixed = [(bench.rng.choice(qpns), bench.rng.randrange(16), bench.rng.choice(kinds))
                     for _ in range(12)]
            # Enough trims to push some adaptive EVs over the threshold, enough losses to
            # reach the floor of profile 0.
            trims = [(4, bench.rng.randrange(12), FeedbackKind.TRIMMED) for _ in range(6)]
            losses = [(bench.rng.randrange(4), bench.rng.randrange(16), FeedbackKind.LOST)
                      for _ in range(4)]
            await bench.feedback(ctx, mixed + trims + losses)
        for index in range(16):
            await bench.command(ctx, command(PathCommand.ENTRY_READ, profile=0, index=index))
            await bench.command(ctx, command(PathCommand.ENTRY_READ, profile=1, index=index))
        for profile in (0, 1):
            await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=profile))

    bench.run(script)
    bench.check()


def test_one_decision_per_cycle_at_full_rate():
    bench = Bench(SMALL, bubbles=0.0, backpressure=0.0, seed=3)
    count = 200

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, qpns=range(8)))
        # Runs of the same QP back to back, then interleaved QPs.
        requests = [{"qpn": n // 10 % 8} for n in range(count // 2)]
        requests += [{"qpn": n % 8} for n in range(count // 2)]
        await bench.requests(ctx, requests)

    bench.run(script)
    bench.check()
    first, last = bench.output_cycles[0], bench.output_cycles[-1]
    assert last - first == count - 1


@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.0, 0.3), (0.3, 0.3)])
def test_back_to_back_requests_of_one_qp_at_every_forwarding_distance(bubbles, backpressure):
    """A QP whose previous request is 1, 2, ... 7 requests ahead (QPs in a cycle of that
    length, at full rate, under backpressure and with random bubbles) gets successive
    rotation positions, as the model does: no pointer write-back is missed, however close
    the requests (a pipelined unit forwards the ones still in flight)."""
    bench = Bench(SMALL, bubbles=bubbles, backpressure=backpressure, seed=21)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, qpns=range(8),
                                                    offsets=(0, 3, 5, 7, 9, 11, 13, 15)))
        for period in range(1, 8):
            await bench.requests(ctx, [{"qpn": n % period} for n in range(6 * period)])

    bench.run(script)
    bench.check()


@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.0, 0.3), (0.4, 0.3)])
def test_back_to_back_feedback_on_one_ev_is_applied_one_after_the_other(bubbles, backpressure):
    """Feedback on a handful of EVs, so that consecutive operations hit the same entry at
    every distance (the one just ahead, two ahead, and further): each is applied to the
    entry as the one before left it (penalty, state, the floor, events), as the model
    applies them one at a time (a pipelined unit forwards the entries still in flight)."""
    bench = Bench(SMALL, bubbles=bubbles, backpressure=backpressure, seed=31,
                  decay_shift=None, event_depth=64)
    kinds = [FeedbackKind.ACKED, FeedbackKind.ECN, FeedbackKind.TRIMMED, FeedbackKind.LOST,
             FeedbackKind.PROBE_OK]

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, min_active=13, adaptive=1,
                                                    qpns=(0, 1), offsets=(0, 7)))
        for _ in range(6):
            burst = [(bench.rng.choice((0, 1)), bench.rng.choice((0, 1, 2)),
                      bench.rng.choice(kinds)) for _ in range(40)]
            await bench.feedback(ctx, burst)
            await bench.requests(ctx, [{"qpn": n % 2} for n in range(24)])
            for index in range(4):
                await bench.command(ctx, command(PathCommand.ENTRY_READ, profile=0,
                                                 index=index))
            await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))

    bench.run(script)
    bench.check()
    events = bench.events.as_dicts()
    assert {e["state"] for e in events} == {EvState.GOOD, EvState.ASSUMED_BAD}


@pytest.mark.usefixtures("on_verilator")
def test_ten_thousand_picks_are_uniform_over_64_evs():
    bench = Bench(WIDE, bubbles=0.05, backpressure=0.05, seed=11,
                  profiles={0: udp_profile()}, **WIDE_PARAMS)
    qpns = (0, 1)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, qpns=qpns, offsets=(0, 40)))
        await bench.requests(ctx, [bench.random_request(qpns, 64, probe=0)
                                   for _ in range(10_000)])

    bench.run(script)
    bench.check()
    for qpn in qpns:
        counts = [0] * 64
        for decision in bench.decisions.as_dicts():
            if decision["qpn"] == qpn:
                counts[decision["ev"]] += 1
        expected = sum(counts) / 64
        statistic = sum((c - expected) ** 2 / expected for c in counts)
        assert chi2_sf(statistic, 63) > 0.01


def test_denied_and_assumed_bad_never_carry_data_and_probes_use_their_ev():
    bench = Bench(SMALL, seed=5)
    denied, bad = {1, 6, 11}, {2, 7}

    async def script(bench, ctx):
        states = [EvState.DENIED if i in denied else EvState.GOOD for i in range(16)]
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, states=states,
                                                    qpns=(0, 1, 2)))
        for index in bad:
            await bench.command(ctx, command(PathCommand.ENTRY_STATE, profile=0, index=index,
                                             state=EvState.ASSUMED_BAD))
        await bench.requests(ctx, [bench.random_request([0, 1, 2], 16, probe=0.3)
                                   for _ in range(300)])

    bench.run(script)
    bench.check()
    probes = 0
    for request, decision in zip(bench.sent, bench.decisions.as_dicts(), strict=True):
        if request.get("probe"):
            probes += 1
            assert decision["ev"] == request["ev"]
            assert decision["no_path"] == (request["ev"] in denied)
        else:
            assert not decision["no_path"] and decision["ev"] not in denied | bad
    assert probes > 50


def test_floor_holds_under_a_storm_of_lost_feedback_and_events_report_it():
    bench = Bench(SMALL, bubbles=0.0, backpressure=0.2, seed=9, event_depth=64)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, min_active=5,
                                                    qpns=(0, 1)))
        storm = [(bench.rng.choice((0, 1)), bench.rng.randrange(16), FeedbackKind.LOST)
                 for _ in range(400)]
        await bench.feedback(ctx, storm)
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))
        await bench.requests(ctx, [{"qpn": 0} for _ in range(40)])
        for _ in range(200):
            await ctx.tick()

    bench.run(script)
    bench.check()
    _, word = bench.responses[-1][1]
    assert word >> 48 == 5                          # usable count kept at ev_min_active
    events = bench.events.as_dicts()
    assert len(events) == 11
    assert all(e["state"] == EvState.ASSUMED_BAD and e["port"] == e["index"] % 4 + 1
               for e in events)
    assert len({d["ev"] for d in bench.decisions.as_dicts()}) == 5


def test_event_queue_overflow_counts_drops():
    bench = Bench(SMALL, seed=2, event_depth=4, event_ready=False)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 16, ports=4, qpns=(0,)))
        await bench.feedback(ctx, [(0, i, FeedbackKind.LOST) for i in range(10)])
        await bench.feedback(ctx, [(0, i, FeedbackKind.PROBE_OK) for i in range(3)])

    bench.run(script)
    bench.check(events=False)
    assert bench.counters["events_dropped"] == 9
    assert bench.events.items == []


@pytest.mark.usefixtures("on_verilator")
def test_failover_no_data_on_a_dead_port_once_its_loss_feedback_is_in():
    bench = Bench(WIDE, seed=4, profiles={0: udp_profile()}, **WIDE_PARAMS)
    qpns = (0, 1, 2, 3)

    def traffic(count):
        return [{"qpn": n % 4, "avoid_ev_valid": 0, "avoid_ev": 0,
                 "probe": 0, "ev": 0, "context": 0} for n in range(count)]

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, min_active=8, qpns=qpns))
        # Port 3 (EVs 2, 10, 18, ...) dies; losses are reported while traffic flows, so
        # these decisions race the feedback and are not compared with the model.
        bench.requests_in.send(traffic(100))
        await bench.decisions.wait(ctx, 30)
        await bench.feedback(ctx, [(i % 4, i, FeedbackKind.LOST) for i in range(2, 64, 8)])
        await bench.decisions.wait(ctx, 100)
        bench.requests_in.send(traffic(400))
        await bench.decisions.wait(ctx, 500)

    bench.run(script)
    bench.check(counters=False, decisions=False)
    before = bench.decisions.as_dicts()[:100]
    after = bench.decisions.as_dicts()[100:]
    assert any(d["port"] == 2 for d in before[:30])
    assert after and all(d["port"] != 2 for d in after)
    assert [e["port"] for e in bench.events.as_dicts()] == [3] * 8


@pytest.mark.usefixtures("on_verilator")
def test_port_fate_sharing_two_losses_abandon_the_whole_port_floor_permitting():
    """A LOST that turns an EV of a fate-sharing profile ASSUMED_BAD is a strike on its port;
    a second one on another EV of the port sweeps every EV on that port (this profile and
    every other fate-sharing one); a probe that brings an EV back GOOD clears the strike; a
    profile without fate sharing is untouched, the floor holds, and a second port's sweep
    queues behind the first."""
    bench = Bench(WIDE, seed=11, profiles={0: udp_profile(), 1: udp_profile(), 2: udp_profile()},
                  **WIDE_PARAMS)
    qpns = (0, 1, 2, 3)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, min_active=8, fate=1,
                                                    qpns=qpns))
        await bench.commands(ctx, bring_up_commands(1, 16, ports=8, fate=1, qpns=(5,)))
        await bench.commands(ctx, bring_up_commands(2, 16, ports=8, qpns=(6,)))
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))
        # A strike on port 2 (EV 1), cleared by a probe answer: a later loss is a new strike.
        await bench.feedback(ctx, [(0, 1, FeedbackKind.LOST), (0, 1, FeedbackKind.PROBE_OK),
                                   (0, 9, FeedbackKind.LOST), (0, 9, FeedbackKind.PROBE_OK)])
        for _ in range(64):
            await ctx.tick()
        # Port 3 (EV 2 and every 8th after it) and port 6 lose two packets each.
        await bench.feedback(ctx, [(0, 2, FeedbackKind.LOST), (1, 13, FeedbackKind.LOST)])
        for _ in range(64):                         # strikes only: no sweep
            await ctx.tick()
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))
        await bench.feedback(ctx, [(0, 10, FeedbackKind.LOST), (1, 21, FeedbackKind.LOST)])
        for _ in range(2 * 4 * 64 + 32):            # two sweeps over 4 x 64 entries
            await ctx.tick()
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))
        await bench.requests(ctx, [{"qpn": n % 4} for n in range(200)])
        # A loss on a profile without fate sharing marks that EV only.
        await bench.feedback(ctx, [(6, 4, FeedbackKind.LOST)])
        for _ in range(300):
            await ctx.tick()
        # Down to the floor: port 1's sweep marks EVs until 8 remain usable.
        for port_ev in (0, 1, 3, 4, 6, 7):
            await bench.feedback(ctx, [(0, port_ev, FeedbackKind.LOST),
                                       (0, port_ev + 8, FeedbackKind.LOST)])
            for _ in range(300):
                await ctx.tick()
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))

    bench.run(script)
    # The model sweeps at once, the hardware after the feedback already queued: the same
    # events, in another interleaving.
    bench.check(events=False)
    events = bench.events.as_dicts()
    key = sorted
    assert key(map(str, events)) == key(str(e.as_dict()) for e in bench.model.pop_events())
    # The cleared strikes: EV 1 and EV 9 (port 2) went bad and came back, nothing swept.
    assert [(e["index"], e["state"]) for e in events[:4]] == [
        (1, EvState.ASSUMED_BAD), (1, EvState.GOOD), (9, EvState.ASSUMED_BAD),
        (9, EvState.GOOD)]
    # Profile 0: 8 EVs on port 3 and 8 on port 6; profile 1: 2 on each; profile 2: none.
    marked = Counter((e["profile"], e["port"]) for e in events[4:24]
                     if e["state"] == EvState.ASSUMED_BAD)
    assert marked == {(0, 3): 8, (0, 6): 8, (1, 3): 2, (1, 6): 2}
    reads = [got for cmd, got, _ in bench.responses if cmd["cmd"] == PathCommand.PROFILE_READ]
    assert reads[0][1] >> 7 & 1 == 1               # fate sharing reported
    assert [r[1] >> 48 for r in reads[:3]] == [64, 62, 48]     # strikes mark their EV only
    assert all(d["port"] not in (2, 5) for d in bench.decisions.as_dicts())
    assert events[24:25] == [e for e in events if e["profile"] == 2] == [
        {"profile": 2, "index": 4, "port": 5, "state": EvState.ASSUMED_BAD, "probe_ok": 0}]
    assert reads[3][1] >> 48 == 8                   # the floor
    # Seven ports swept (port 8 hit the floor); the two EVs that triggered each sweep are
    # not counted.
    assert bench.counters["fate_sweeps"] == 7 and bench.counters["fate_marked"] == 56


@pytest.mark.usefixtures("on_verilator")
def test_a_port_the_port_watch_reports_down_is_swept_in_fate_sharing_profiles_only():
    """``port_down`` (from the port watch) sweeps its port as a second strike does: every EV
    on it in a fate-sharing profile goes ASSUMED_BAD (the floor permitting), a profile
    without fate sharing is untouched, port 0 and ports above P do nothing, and the model's
    ``port_down`` gives the same events."""
    bench = Bench(WIDE, seed=13, profiles={0: udp_profile(), 1: udp_profile()}, **WIDE_PARAMS)

    async def pulse(ctx, port):
        ctx.set(bench.dut.port_down_valid, 1)
        ctx.set(bench.dut.port_down_port, port)
        await ctx.tick()
        ctx.set(bench.dut.port_down_valid, 0)
        if 1 <= port <= 8:
            bench.model.port_down(port)
        for _ in range(2 * 4 * 64 + 32):
            await ctx.tick()

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, min_active=8, fate=1,
                                                    qpns=(0, 1)))
        await bench.commands(ctx, bring_up_commands(1, 16, ports=8, qpns=(5,)))
        for port in (0, 9, 15):                     # not ports: nothing
            await pulse(ctx, port)
        await pulse(ctx, 4)
        await bench.requests(ctx, [{"qpn": n % 2} for n in range(100)])
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=0))

    bench.run(script)
    bench.check(events=False)
    events = bench.events.as_dicts()
    assert sorted(map(str, events)) == sorted(str(e.as_dict()) for e in bench.model.pop_events())
    assert Counter((e["profile"], e["port"], e["state"]) for e in events) == {
        (0, 4, EvState.ASSUMED_BAD): 8}
    assert all(d["port"] != 3 for d in bench.decisions.as_dicts())     # 0-based port 3
    assert bench.counters["fate_sweeps"] == 1 and bench.counters["fate_marked"] == 8


@pytest.mark.usefixtures("on_verilator")
def test_selection_waits_for_a_lost_and_its_fate_sweep():
    """A retransmission presented right after its LOST (the port's second) is decided only once
    the LOST and the sweep it starts are applied: no decision lands on the lost EV's port (the
    requester sends the LOST first; docs/path-select.md)."""
    bench = Bench(WIDE, seed=12, bubbles=0.0, backpressure=0.3, **WIDE_PARAMS)
    qpns = (0, 1, 2, 3)

    async def script(bench, ctx):
        # Each QP's rotation starts on a port-3 EV the sweep reaches late.
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, min_active=8, fate=1,
                                                    qpns=qpns, offsets=(58, 50, 42, 34)))
        bench.feedback_in.send([{"qpn": 0, "ev": 2, "kind": FeedbackKind.LOST},
                                {"qpn": 0, "ev": 10, "kind": FeedbackKind.LOST}])
        while not bench.feedback_in.idle:
            await ctx.tick()
        bench.requests_in.send([{"qpn": n % 4, "avoid_ev_valid": 1, "avoid_ev": 2, "probe": 0,
                                 "ev": 0, "context": n} for n in range(64)])
        await bench.decisions.wait(ctx, 64)

    bench.run(script)
    decisions = bench.decisions.as_dicts()
    assert len(decisions) == 64 and all(d["port"] != 2 for d in decisions)
    assert sorted(d["context"] for d in decisions) == list(range(64))   # each decided once
    assert {e["port"] for e in bench.events.as_dicts()} == {3}


def test_profile_state_machine_and_command_checks():
    """Table-driven: every transition from every state, and each command's refusals, as the
    model answers them (which test_path_model checks against the rules)."""
    profiles = {0: udp_profile(), 1: udp_profile(EvMode.GENERATED, max_val=9)}
    bench = Bench(SMALL, profiles=profiles, seed=1)
    reach = {ProfileState.INIT: {ProfileState.OFFLINE: [ProfileState.INIT],
                                 ProfileState.ONLINE: [ProfileState.OFFLINE,
                                                       ProfileState.INIT]},
             ProfileState.OFFLINE: {ProfileState.INIT: [ProfileState.OFFLINE],
                                    ProfileState.ONLINE: [ProfileState.OFFLINE]},
             ProfileState.ONLINE: {ProfileState.INIT: [ProfileState.OFFLINE,
                                                       ProfileState.ONLINE],
                                   ProfileState.OFFLINE: [ProfileState.ONLINE]}}
    table = []

    async def script(bench, ctx):
        state = ProfileState.INIT
        await bench.command(ctx, command(PathCommand.PROFILE_SET, profile=0, num_evs=2))
        await bench.command(ctx, command(PathCommand.PROFILE_STATE, profile=0,
                                         state=ProfileState.ONLINE))       # INIT -> ONLINE
        await bench.command(ctx, command(PathCommand.PROFILE_STATE, profile=0,
                                         state=ProfileState.OFFLINE))
        # Not fully populated: refused; then populated.
        await bench.command(ctx, command(PathCommand.ENTRY_WRITE, profile=0, index=0,
                                         value=udp_ev(0), port=1, state=EvState.GOOD))
        await bench.command(ctx, command(PathCommand.PROFILE_STATE, profile=0,
                                         state=ProfileState.ONLINE))
        await bench.command(ctx, command(PathCommand.ENTRY_WRITE, profile=0, index=1,
                                         value=udp_ev(1), port=2, state=EvState.GOOD))
        state = ProfileState.OFFLINE
        for start in ProfileState:
            for target in (*ProfileState, 3):
                if start != state:
                    for step in reach[start][state]:
                        await bench.command(ctx, command(PathCommand.PROFILE_STATE, profile=0,
                                                         state=step))
                    state = start
                errno, _ = await bench.command(ctx, command(PathCommand.PROFILE_STATE,
                                                            profile=0, state=target))
                table.append((start, target, errno))
                if errno == Errno.OK:
                    state = target
        # ONLINE now (the last OK move was OFFLINE -> ONLINE, or ONLINE stayed).
        write = dict(profile=0, index=0, value=udp_ev(0), port=1, state=EvState.GOOD)
        await bench.command(ctx, command(PathCommand.ENTRY_WRITE, **write))     # EBUSY
        await bench.command(ctx, command(PathCommand.PROFILE_STATE, profile=0,
                                         state=ProfileState.OFFLINE))
        for change in (dict(profile=5), dict(index=2), dict(port=0), dict(port=5),
                       dict(state=EvState.ASSUMED_BAD), dict(value=udp_ev(1) | 1),
                       dict(state=EvState.DENIED)):
            await bench.command(ctx, command(PathCommand.ENTRY_WRITE, **{**write, **change}))
        for change in (dict(profile=2), dict(mode=3), dict(num_evs=0), dict(num_evs=17),
                       dict(min_active=5)):
            await bench.command(ctx, command(PathCommand.PROFILE_SET, **{
                **dict(profile=0, num_evs=4, min_active=1), **change}))
        await bench.command(ctx, command(9, profile=0))                        # unknown
        # GENERATED: 12 EVs from a profile that makes 10 -> E2BIG, nothing left behind.
        for cmd in bring_up_commands(1, 12, ports=4, mode=EvMode.GENERATED):
            await bench.command(ctx, cmd)
        await bench.command(ctx, command(PathCommand.PROFILE_READ, profile=1))
        await bench.command(ctx, command(PathCommand.ENTRY_READ, profile=1, index=0))
        await bench.command(ctx, command(PathCommand.ENTRY_WRITE, profile=1, index=0,
                                         value=udp_ev(0), port=1))          # GENERATED: EINVAL
        # QP bindings and entry states.
        await bench.command(ctx, command(PathCommand.PROFILE_SET, profile=1, num_evs=2))
        await bench.command(ctx, command(PathCommand.QP_PROFILE, profile=1, qpn=3))  # INIT
        await bench.command(ctx, command(PathCommand.QP_PROFILE, profile=0, qpn=3,
                                         offset=16))
        for index, state in ((0, EvState.DENIED), (1, EvState.DENIED), (1, 3),
                             (0, EvState.ASSUMED_BAD), (0, EvState.GOOD), (7, EvState.GOOD)):
            await bench.command(ctx, command(PathCommand.ENTRY_STATE, profile=0, index=index,
                                             state=state))
        await bench.command(ctx, command(PathCommand.PROFILE_SET, profile=0, num_evs=2,
                                         min_active=2))
        await bench.command(ctx, command(PathCommand.ENTRY_STATE, profile=0, index=0,
                                         state=EvState.GOOD))                 # not written

    bench.run(script)
    bench.check()
    allowed = {(ProfileState.INIT, ProfileState.OFFLINE), (ProfileState.OFFLINE,
               ProfileState.INIT), (ProfileState.OFFLINE, ProfileState.ONLINE),
               (ProfileState.ONLINE, ProfileState.OFFLINE)}
    assert len(table) == 12
    for start, target, errno in table:
        assert errno == (Errno.OK if (start, target) in allowed else Errno.EINVAL)
    errnos = [got[0] for _, got, _ in bench.responses]
    assert Errno.E2BIG in errnos and Errno.EBUSY in errnos and Errno.ENOENT in errnos


def test_generated_profile_goes_online_with_generate_entries():
    bench = Bench(SMALL, seed=6)
    definition = udp_profile(EvMode.GENERATED)
    entries = evlib.generate_entries(definition, 14, num_ports=SMALL.ports)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(1, 14, ports=4, mode=EvMode.GENERATED,
                                                    qpns=(2,)))
        await bench.requests(ctx, [{"qpn": 2, "probe": 1, "ev": i} for i in range(14)])

    bench.run(script)
    bench.check()
    assert bench.profile_online == 0b10
    for index, decision in enumerate(bench.decisions.as_dicts()):
        ev, port = entries[index]
        assert decision["port"] == port - 1
        assert decision["fields"] == fields_of_image(definition.format,
                                                     evlib.expand(definition, ev))


@pytest.mark.usefixtures("on_verilator")
def test_auto_mode_one_ev_per_qp_and_qps_spread():
    bench = Bench(WIDE, seed=8, profiles={0: udp_profile()}, **WIDE_PARAMS)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 64, ports=8, mode=EvMode.AUTO,
                                                    qpns=range(64)))
        await bench.requests(ctx, [{"qpn": n % 64} for n in range(256)])

    bench.run(script)
    bench.check()
    chosen = {}
    for decision in bench.decisions.as_dicts():
        chosen.setdefault(decision["qpn"], set()).add(decision["ev"])
    assert all(len(evs) == 1 for evs in chosen.values())
    assert len({evs.pop() for evs in chosen.values()}) > 32


def test_controller_probe_recovery_and_auto_recovery():
    bench = Bench(SMALL, seed=12, decay_shift=None)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 4, ports=4, qpns=(0,),
                                                    recovery=ProbeRecovery.CONTROLLER))
        await bench.commands(ctx, bring_up_commands(1, 4, ports=4, qpns=(1,)))
        await bench.feedback(ctx, [(0, 1, FeedbackKind.LOST), (1, 2, FeedbackKind.LOST)])
        await bench.feedback(ctx, [(0, 1, FeedbackKind.PROBE_OK), (1, 2, FeedbackKind.PROBE_OK),
                                   (0, 0, FeedbackKind.PROBE_OK), (5, 0, FeedbackKind.LOST),
                                   (0, 3, 7)])
        await bench.requests(ctx, [{"qpn": q} for q in (0, 1) * 8])

    bench.run(script)
    bench.check()
    assert [e["probe_ok"] for e in bench.events.as_dicts()] == [0, 0, 1, 0]


def test_penalties_steer_adaptive_picks_and_decay_restores_them():
    # The trims mark EV 1 SKIP as well: the recovery sweep, on the decay's period here, ends
    # that before the second round.
    bench = Bench(SMALL, seed=13, decay_shift=8, skip_shift=8)

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=2,
                                                    qpns=(0,)))
        await bench.feedback(ctx, [(0, 1, FeedbackKind.TRIMMED)] * 3)
        read = command(PathCommand.ENTRY_READ, profile=0, index=1)
        bench.penalties = [(await bench.command(ctx, read))[1] >> 16 & 0xFF]
        bench.requests_in.send([{"qpn": 0, "avoid_ev_valid": 0, "avoid_ev": 0, "probe": 0,
                                 "ev": 0, "context": 0}] * 8)
        await bench.decisions.wait(ctx, 8)
        bench.early = {d["ev"] for d in bench.decisions.as_dicts()}
        for _ in range(3 * 256 + 64):
            await ctx.tick()
        bench.penalties.append((await bench.command(ctx, read))[1] >> 16 & 0xFF)
        bench.requests_in.send([{"qpn": 0, "avoid_ev_valid": 0, "avoid_ev": 0, "probe": 0,
                                 "ev": 0, "context": 0}] * 8)
        await bench.decisions.wait(ctx, 16)

    bench.run(script)
    # Decay halves on a timer the model does not follow: check the behaviour, not the model.
    first, later = bench.penalties
    assert 3 * PENALTY_TRIMMED // 2 <= first <= 3 * PENALTY_TRIMMED
    assert later <= first // 8
    assert 1 not in bench.early                     # high penalty: skipped
    assert 1 in {d["ev"] for d in bench.decisions.as_dicts()[8:]}


def test_adaptive_skips_high_penalty_evs_only_while_half_the_usable_are_low():
    """Adaptive spraying keeps to the low-penalty EVs only while they are at least
    ``min_active`` and at least half of the usable (GOOD) ones; below that it sprays over every
    usable EV again, so that a few low EVs (a plane just back from a failure) do not draw the
    whole load. RTL and model agree on every decision."""
    bench = Bench(SMALL, seed=21, decay_shift=None)
    request = {"qpn": 0, "avoid_ev_valid": 0, "avoid_ev": 0, "probe": 0, "ev": 0}
    picks = {}

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=1,
                                                    qpns=(0,)))
        await bench.feedback(ctx, [(0, ev, FeedbackKind.TRIMMED) for ev in (1, 2)] * 3)
        await bench.requests(ctx, [dict(request, context=n) for n in range(12)])
        picks["two_low"] = {d["ev"] for d in bench.decisions.as_dicts()[-12:]}
        await bench.feedback(ctx, [(0, 3, FeedbackKind.TRIMMED)] * 3)
        await bench.requests(ctx, [dict(request, context=n) for n in range(12)])
        picks["one_low"] = {d["ev"] for d in bench.decisions.as_dicts()[-12:]}

    bench.run(script)
    bench.check()
    assert picks["two_low"] == {0, 3}           # 2 of 4 low: half, so only those
    assert picks["one_low"] == {0, 1, 2, 3}     # 1 of 4 low: below half, every GOOD EV


@pytest.mark.parametrize("adaptive", [0, 1])
def test_ecn_and_trims_mark_good_evs_skip_until_the_second_recovery_sweep(adaptive):
    """MRC 1.0's SKIP state: ECN (a SACK's m = SKIP_ONCE) or a trim on a GOOD EV marks it
    SKIP; an adaptive profile passes SKIP EVs over, ENTRY_READ reports the mark (bit 24), and
    the recovery sweep that starts every ``2**skip_shift`` cycles ends it one to two periods
    later. RTL and model agree on every decision, response and counter (the model's sweeps
    are ticked where the RTL's have run). With or without ``adaptive``: SKIP is the
    protocol's, not the penalties'."""
    skip_shift = 8
    bench = Bench(SMALL, seed=23, decay_shift=None, skip_shift=skip_shift)
    request = {"qpn": 0, "avoid_ev_valid": 0, "avoid_ev": 0, "probe": 0, "ev": 0}
    read = command(PathCommand.ENTRY_READ, profile=0, index=2)
    seen = {}

    async def script(bench, ctx):
        await bench.commands(ctx, bring_up_commands(0, 4, ports=4, adaptive=adaptive,
                                                    min_active=1, qpns=(0,)))
        start = bench.cycle
        await bench.feedback(ctx, [(0, 2, FeedbackKind.ECN), (0, 3, FeedbackKind.TRIMMED)])
        seen["marked"] = (await bench.command(ctx, read))[1] >> 24 & 1
        await bench.requests(ctx, [dict(request, context=n) for n in range(12)])
        seen["while_marked"] = {d["ev"] for d in bench.decisions.as_dicts()[-12:]}
        # The whole first round ran within one sweep period of the marks.
        seen["first_round_cycles"] = bench.cycle - start
        for _ in range(3 << skip_shift):
            await ctx.tick()
        bench.model.skip_tick()
        bench.model.skip_tick()
        seen["recovered"] = (await bench.command(ctx, read))[1] >> 24 & 1
        await bench.requests(ctx, [dict(request, context=n) for n in range(12)])
        seen["after"] = {d["ev"] for d in bench.decisions.as_dicts()[-12:]}

    bench.run(script)
    bench.check()
    assert seen["first_round_cycles"] < 1 << skip_shift
    assert seen["marked"] == 1 and seen["recovered"] == 0
    assert seen["while_marked"] == {0, 1}
    assert seen["after"] == {0, 1, 2, 3}
    assert bench.counters["skips"] == 2 and bench.counters["skip_recoveries"] == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(config=None), "Config must be a NicConfig, not None"),
    (dict(config=SMALL, event_depth=0), "Event depth must be an integer from 1 to 1024, not 0"),
    (dict(config=SMALL, hash_seed=-1), "Hash seed must be an integer from 0 to 65535, not -1"),
    (dict(config=SMALL, decay_shift=4), "Decay shift must be None or an integer from 8 to 30"),
    (dict(config=SMALL, skip_shift=5), "Skip shift must be None or an integer from 6 to 30"),
    (dict(config=SMALL, modify_online=1), "modify_online must be a bool, not 1"),
])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        PathSelect(**kwargs)
