"""Loss recovery in the requester: retransmit timer, retry policy, exhaustion,
timeout walks, SACK-inferred losses and LOST feedback (Amaranth simulator).

The time input ``now_units`` is driven by the bench: frozen (``step`` 0) and jumped where a
test compares with the reference model (then the gateware and the model see the same times),
or advanced one unit per cycle where a test measures when the timer expires. Every stream
runs with bubbles and backpressure (0.3/0.3) unless a test says otherwise.
"""

import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.transport.req_defs import (
    REQUESTER_COUNTERS,
    RETRY_COUNT_BITS,
    RequesterCommand,
    retry_expiry,
    timer_page,
)
from hdl.transport.requester import retry_expiry_gateware
from sim.tb.amsim import const_to_dict
from tests.hdl.test_requester import CONFIG, Bench, ack_header, nack_header, nak_header
from tests.sim.test_requester_model import FAILURES, Peer

W = P.WrOpcode
S = P.CompletionStatus
LOST = P.FeedbackKind.LOST
SCAN_UNITS = CONFIG.qps + 2         # one scan period (qps cycles at one unit per cycle) + V0/V1


class TimedBench(Bench):
    """:class:`Bench` with the time input: ``now`` advances by ``step`` units per cycle.
    ``events`` records ``(counter, now)`` when ``timeouts`` or ``retry_exceeded`` counts, with
    the time the gateware saw in the cycle it decided."""

    WATCH = ("timeouts", "retry_exceeded")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.now = 0
        self.step = 0
        self.events = []
        self.sim.add_process(self.clock)

    async def clock(self, ctx):
        last = dict.fromkeys(self.WATCH, 0)
        before = 0                  # the time of the previous cycle
        counters = [self.dut.counters[name] for name in self.WATCH]
        while True:
            seen = self.now
            ctx.set(self.dut.now_units, seen % (1 << 32))
            # Sampled before this cycle's edge: a change counts a decision of the last cycle.
            _, _, *values = await ctx.tick().sample(*counters)
            for name, value in zip(self.WATCH, values, strict=True):
                if value != last[name]:
                    self.events.append((name, before))
                    last[name] = value
            before = seen
            self.now += self.step

    async def read_timer(self, ctx, qpn):
        """QP_READ page 2 (the model's timer is ideal, so this is not compared with it)."""
        self.ctl.send([{"cmd": RequesterCommand.QP_READ, "qpn": qpn, "page": 2}])
        n = len(self.ctl_resp.items) + 1
        await self.ctl_resp.wait(ctx, n)
        got = self.ctl_resp.items[n - 1]
        assert int(got.errno) == P.Errno.OK
        return int(got.data)

    async def next_event(self, ctx, timeout=2_000):
        n = len(self.events)
        await self.wait(ctx, lambda: len(self.events) > n, "a timer event", timeout)
        return self.events[n]

    async def settle(self, ctx):
        """The model sees the gateware's time; its sends must come out of the gateware."""
        self.model.now_units = self.now
        await self.settle_sends(ctx)
        await self.report_evs(ctx)

    async def expire(self, ctx, qpn, at):
        """Jump the frozen time to ``at``: the gateware's timer must expire once; the model
        is told to expire at the same time. Returns the model's verdict."""
        n = len(self.events)
        self.now = at
        event = await self.next_event(ctx)
        await ctx.tick().repeat(40)
        assert len(self.events) == n + 1, self.events[n:]
        self.model.now_units = at
        verdict = self.model.expire(qpn)
        assert event == ({"timeout": "timeouts", "exceeded": "retry_exceeded"}[verdict], at)
        await self.settle(ctx)
        return verdict

    def check_feedback(self, ctx):
        """ACK-side feedback in model order; LOST feedback (merged in by turns) as a
        multiset. At one ACK per cycle a LOST item makes the merge drop one (counted)."""
        got = [const_to_dict(f) for f in self.feedback.items]
        dropped = int(ctx.get(self.dut.counters.feedback_dropped))
        assert len(got) + dropped == len(self.model.feedback)
        want = iter(f for f in self.model.feedback if f["kind"] != LOST)
        assert all(any(f == w for w in want) for f in got if f["kind"] != LOST)
        if not dropped:
            key = lambda f: (f["qpn"], f["ev"])         # noqa: E731
            assert sorted(map(key, (f for f in got if f["kind"] == LOST))) == sorted(
                map(key, (f for f in self.model.feedback if f["kind"] == LOST)))

    async def check_all(self, ctx):
        await self.completion.wait(ctx, len(self.model.completions))
        await ctx.tick().repeat(50)
        self.check_completions()
        self.check_feedback(ctx)
        await self.check_counters(ctx)


def qp_write(bench, ctx, qpn, *, psn=0, timeout=4, linear=0, exp=0, mpr=1):
    return bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                         psn=psn, mpr=mpr, max_wimm=2, timeout=timeout, retry_linear=linear,
                         retry_exp=exp)


async def expect_expiries(bench, ctx, start, t, linear, exp, retries, *, jump=False):
    """Wait for the expiries of ``retries`` (a range of retry counts), each within one scan
    period of ``retry_expiry`` after the previous one (6 cycles more for the exhausting one,
    applied by A1); ``jump`` skips the simulated time of long waits. Returns the time of the
    last expiry and whether each one exhausted the retries."""
    exhausted_flags = []
    for r in retries:
        wait, exhausted = retry_expiry(t, linear, exp, r)
        due = start + wait
        if jump and due - bench.now > 64:           # jump over most of a long wait
            bench.now = due - 32
        name, at = await bench.next_event(ctx)
        slack = 6 if exhausted else 0
        assert due <= at <= due + SCAN_UNITS + slack, (r, due, at)
        assert name == ("retry_exceeded" if exhausted else "timeouts"), r
        exhausted_flags.append(exhausted)
        start = at
    return start, exhausted_flags


async def start_timer_only(bench, ctx, qpn, *, psn, t, linear=7, exp=25, packets):
    """QP ``qpn`` (timeout ``t``), SACK inference off, one WR of ``packets`` packets sent at
    the bench's present time: the timer is the only recovery."""
    await qp_write(bench, ctx, qpn, psn=psn, timeout=t, linear=linear, exp=exp)
    await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0)
    bench.post([write_wr(qpn, 1, packets)])
    await bench.settle(ctx)


def write_wr(qpn, wr_id, packets, *, remote_addr=0x4000):
    return {"qpn": qpn, "opcode": W.RDMA_WRITE, "wr_id": wr_id,
            "length": packets * CONFIG.mtu - 7, "remote_addr": remote_addr + wr_id * 0x10000,
            "local_addr": 0x900000 + wr_id * 0x10000, "rkey": 0x77}


def sack_of(cand, psns):
    return sum(1 << P.psn_diff(p, cand) for p in psns)


# -- the retry policy, one function ------------------------------------------------------------

def test_retry_schedule_worked_example():
    # t = 4 (16 units), L = 3, E = 2: the first send and 3 linear retries wait 16, then 32,
    # 64, and the expiry after the second exponential retry ends the QP.
    schedule = [retry_expiry(4, 3, 2, r) for r in range(6)]
    assert schedule == [(16, False), (16, False), (16, False), (16, False), (32, False),
                        (64, True)]
    assert retry_expiry(0, 0, 0, 0) == (1, True)
    assert retry_expiry(24, 0, 25, 60) == (1 << 30, False)         # capped; never exhausted
    with pytest.raises(ValueError, match="Timeout exponent must be"):
        retry_expiry(25, 0, 0, 0)


class _RetryLogic(Elaboratable):
    def __init__(self):
        self.t, self.linear = Signal(5), Signal(3)
        self.exp, self.retries = Signal(5), Signal(RETRY_COUNT_BITS)
        self.exponent, self.exhausted = Signal(5), Signal()

    def elaborate(self, platform):
        m = Module()
        exponent, exhausted = retry_expiry_gateware(self.t, self.linear, self.exp, self.retries)
        m.d.comb += [self.exponent.eq(exponent), self.exhausted.eq(exhausted)]
        return m


def test_retry_logic_matches_retry_expiry():
    dut = _RetryLogic()
    rng = random.Random(5)
    cases = [(t, lin, e, r) for t in (0, 1, 23, 24) for lin in (0, 3, 7) for e in (0, 1, 24, 25)
             for r in (0, lin, lin + 1, lin + e, 63)]
    cases += [(rng.randrange(25), rng.randrange(8), rng.randrange(26), rng.randrange(64))
              for _ in range(600)]

    async def testbench(ctx):
        for t, lin, e, r in cases:
            for signal, value in ((dut.t, t), (dut.linear, lin), (dut.exp, e),
                                  (dut.retries, r)):
                ctx.set(signal, value)
            wait, exhausted = retry_expiry(t, lin, e, r)
            assert (1 << ctx.get(dut.exponent), ctx.get(dut.exhausted)) == (wait, exhausted)

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()


# -- timer accuracy and the retry sequence (one unit per cycle, jumps over long waits) --------

@pytest.mark.parametrize("linear, exp, expiries", [
    (3, 2, None), (0, 0, None), (7, 0, None), (1, P.RETRY_INFINITE, 1 + 30 + 3)])
def test_timer_expires_on_schedule(linear, exp, expiries):
    bench = TimedBench(seed=61 + linear + exp)
    qpn, t = 5, 5

    async def testbench(ctx):
        bench.now = 5_000
        await start_timer_only(bench, ctx, qpn, psn=0xFFFFFF, t=t, linear=linear, exp=exp,
                               packets=2)
        start = bench.now
        assert await bench.read_timer(ctx, qpn) == timer_page(armed=1, retries=0, start=start)
        bench.step = 1
        count = expiries or linear + exp + 1
        await expect_expiries(bench, ctx, start, t, linear, exp, range(count), jump=True)
        bench.step = 0
        await ctx.tick().repeat(100)
        timeouts = count - (expiries is None)
        assert int(ctx.get(bench.dut.counters.timeouts)) == timeouts
        sends = [const_to_dict(p) for p in bench.send.items]
        oldest = [p for p in sends if p["context"]["psn"] == 0xFFFFFF]
        assert len(oldest) == 1 + timeouts          # the oldest PSN first, on every expiry
        assert all(p["context"]["retransmission"] for p in oldest[1:])
        if expiries is None:
            await bench.qp_error.wait(ctx, 1)
            assert const_to_dict(bench.qp_error.items[0]) == {
                "qpn": qpn, "status": S.RETRY_EXC_ERR}
            assert await bench.read_timer(ctx, qpn) & 1 == 0       # disarmed in ERROR
        else:
            assert not bench.qp_error.items
            page = await bench.read_timer(ctx, qpn)
            assert page & 1 and (page >> 8) & 0x3F == timeouts

    bench.run(testbench)


def test_progress_restarts_timer_and_resets_retries():
    bench = TimedBench(seed=71)
    qpn, t = 2, 4

    async def testbench(ctx):
        bench.now = 100
        await qp_write(bench, ctx, qpn, psn=10, timeout=t, linear=0, exp=2)
        bench.post([write_wr(qpn, 1, 4)])
        await bench.settle(ctx)
        start = bench.now
        bench.step = 1
        # Two retries: the next expiry would end it.
        _, exhausted = await expect_expiries(bench, ctx, start, t, 0, 2, range(2))
        assert not any(exhausted)
        bench.step = 0
        await bench.report_evs(ctx)
        bench.rx.send([{"header": ack_header(qpn, 10), "first": 1, "last": 1}])
        await bench.idle(ctx, bench.rx)
        progress = bench.now
        await ctx.tick().repeat(20)
        assert await bench.read_timer(ctx, qpn) == timer_page(armed=1, retries=0,
                                                              start=progress)
        bench.step = 1
        # 16, 32, then 64 and ERROR.
        await expect_expiries(bench, ctx, progress, t, 0, 2, range(3))
        await bench.qp_error.wait(ctx, 1)

    bench.run(testbench)


# -- exhaustion --------------------------------------------------------------------------------

def test_exhausted_retries_error_the_qp_and_complete_every_wr():
    bench = TimedBench(seed=81)
    qpn, other = 2, 6

    async def testbench(ctx):
        bench.now = 1_000
        await qp_write(bench, ctx, qpn, psn=50, timeout=3, linear=1, exp=0)
        await qp_write(bench, ctx, other, psn=7, timeout=20)
        bench.post([write_wr(qpn, 0, 1), write_wr(qpn, 1, 3), write_wr(other, 9, 2),
                    write_wr(qpn, 2, 2), write_wr(qpn, 3, 1)])
        await bench.settle(ctx)
        # WR 0 acknowledged, WR 1 half (PSN 51 of 51-53): the oldest is then 52.
        await bench.receive(ctx, [ack_header(qpn, 51)])
        assert await bench.expire(ctx, qpn, bench.now + 8) == "timeout"
        assert any(p.context.psn == 52 and p.context.retransmission
                   for p in bench.send.items)
        assert await bench.expire(ctx, qpn, bench.now + 8) == "exceeded"
        await bench.qp_error.wait(ctx, 1)
        assert [const_to_dict(e) for e in bench.qp_error.items] == bench.model.qp_errors == [
            {"qpn": qpn, "status": S.RETRY_EXC_ERR}]
        sent_before = len(bench.send.items)
        bench.post([write_wr(qpn, 4, 1)])           # after ERROR: flushed
        bench.now += 1 << 10                        # nothing more for the QP
        await ctx.tick().repeat(200)
        await bench.settle(ctx)
        assert len(bench.send.items) == sent_before
        await bench.check_all(ctx)
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions
                if c["qpn"] == qpn] == [
            (0, S.SUCCESS), (1, S.RETRY_EXC_ERR), (2, S.RETRY_EXC_ERR), (3, S.RETRY_EXC_ERR),
            (4, S.WR_FLUSH_ERR)]
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn, page=1)
        # The other QP is untouched; the failed one can be written again once drained.
        await bench.receive(ctx, [ack_header(other, 8)])
        await qp_write(bench, ctx, qpn, psn=3)
        await bench.check_all(ctx)

    bench.run(testbench)


# -- timeout walk ------------------------------------------------------------------------------

def test_timeout_walk_resends_oldest_then_old_holes():
    bench = TimedBench(seed=91)
    qpn, t = 3, 4                                   # base timeout 16 units

    async def testbench(ctx):
        t0 = bench.now = 4_000
        await start_timer_only(bench, ctx, qpn, psn=0xFFFFFE, t=t, packets=6)  # -2..3 at t0
        bench.now = t0 + 10
        bench.post([write_wr(qpn, 2, 2)])           # PSNs 4, 5 at t0 + 10: young below
        await bench.settle(ctx)
        # PSN 0 and 3 SACKed (bit i: PSN cum + 1 + i).
        cand = 0xFFFFFE
        await bench.receive(ctx, [ack_header(qpn, P.psn_add(cand, -1),
                                             sack=sack_of(cand, [0, 3]))])
        first = len(bench.send.items)
        sent_on = {psn: bench.model.last_ev(qpn, psn) for psn in bench.model.outstanding(qpn)}
        assert await bench.expire(ctx, qpn, t0 + 16) == "timeout"
        resent = [const_to_dict(p) for p in bench.send.items[first:]]
        assert [p["context"]["psn"] for p in resent][:1] == [0xFFFFFE]     # oldest first
        assert sorted(p["context"]["psn"] for p in resent) == [1, 2, 0xFFFFFE, 0xFFFFFF]
        originals = {p["context"]["psn"]: const_to_dict(p) for p in bench.send.items[:first]}
        evs = {}
        for p in resent:
            psn = p["context"]["psn"]
            want = dict(originals[psn]["context"], retransmission=1, ackreq=1)
            assert p["context"] == want
            ev = sent_on[psn]
            assert (p["avoid_ev_valid"], p["avoid_ev"]) == (1, ev)
            evs[(qpn, psn)] = ev
        await bench.feedback.wait(ctx, len(bench.model.feedback))
        lost = [const_to_dict(f) for f in bench.feedback.items if f.kind == LOST]
        assert [f["ev"] for f in lost] == [evs[(qpn, 0xFFFFFE)]]    # the oldest PSN's EV only
        # Second expiry: everything old by now (4 and 5 too) but the SACKed PSNs.
        first = len(bench.send.items)
        assert await bench.expire(ctx, qpn, t0 + 32) == "timeout"
        assert sorted(p.context.psn for p in bench.send.items[first:]) == [
            1, 2, 4, 5, 0xFFFFFE, 0xFFFFFF]
        await bench.check_all(ctx)
        assert int(ctx.get(bench.dut.counters.walk_skipped)) == 2 + 2 + 2

    bench.run(testbench)


def test_timeout_gives_no_lost_for_an_oldest_psn_resent_since_the_timer_started():
    """The oldest PSN, trimmed and resent 6 units before the timer expires: the TIMEOUT walk
    resends it again but gives no LOST (that copy has not had its time, and its EV did not lose
    the PSN); one base timeout later the next expiry gives LOST for the EV it went out on."""
    bench = TimedBench(seed=93)
    qpn, t = 2, 4                                   # base timeout 16 units

    async def testbench(ctx):
        t0 = bench.now = 5_000
        await start_timer_only(bench, ctx, qpn, psn=10, t=t, packets=3)   # 10, 11, 12 at t0
        bench.now = t0 + 10
        await bench.receive(ctx, [nack_header(qpn, 10)])
        await bench.settle(ctx)
        assert [p.context.psn for p in bench.send.items] == [10, 11, 12, 10]
        n = len(bench.send.items)
        assert await bench.expire(ctx, qpn, t0 + 16) == "timeout"
        assert sorted(p.context.psn for p in bench.send.items[n:]) == [10, 11, 12]
        await bench.feedback.wait(ctx, len(bench.model.feedback))
        assert not [f for f in bench.feedback.items if f.kind == LOST]
        assert not [f for f in bench.model.feedback if f["kind"] == LOST]
        ev = bench.model.last_ev(qpn, 10)           # where the walk's copy of PSN 10 went
        assert await bench.expire(ctx, qpn, t0 + 32) == "timeout"
        await bench.feedback.wait(ctx, len(bench.model.feedback))
        assert [f.ev for f in bench.feedback.items if f.kind == LOST] == [ev]
        await bench.check_all(ctx)

    bench.run(testbench)


# -- SACK inference ----------------------------------------------------------------------------

def test_inferred_losses_resent_once_without_waiting():
    bench = TimedBench(seed=101)
    qpn, psn0 = 1, 0xFFFFF8

    def at(i):
        return P.psn_add(psn0, i)

    async def sack_ack(ctx, sacked):
        await bench.receive(ctx, [ack_header(qpn, at(-1), sack=sack_of(psn0, map(at, sacked)))])
        await bench.settle(ctx)

    def resent_since(n):
        return sorted(P.psn_diff(p.context.psn, psn0) for p in bench.send.items[n:])

    async def testbench(ctx):
        bench.now = 77
        await qp_write(bench, ctx, qpn, psn=psn0, timeout=20, linear=0, exp=0)
        bench.post([write_wr(qpn, 1, 14)])
        await bench.settle(ctx)
        n = len(bench.send.items)
        await sack_ack(ctx, [2, 3])                   # K = 3 by default: 2 later only
        assert resent_since(n) == []
        await sack_ack(ctx, [2, 3, 5])                # 0, 1 have 3 later SACKed
        assert resent_since(n) == [0, 1]
        n = len(bench.send.items)
        await sack_ack(ctx, [2, 3, 5])                # the same SACK: nothing again
        assert resent_since(n) == []
        # PSN 9 trimmed and resent: an inference leaves it to the timer.
        await bench.receive(ctx, [nack_header(qpn, at(9))])
        await bench.settle(ctx)
        n = len(bench.send.items)
        await sack_ack(ctx, [2, 3, 5, 6, 8, 10, 11, 12])    # region [2, 10): 4 and 7
        assert resent_since(n) == [4, 7]
        # K = 0: no inference; K = 1: every hole below the highest SACKed PSN.
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0)
        n = len(bench.send.items)
        await sack_ack(ctx, [2, 3, 5, 6, 8, 10, 11, 12, 13])
        assert resent_since(n) == []
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=1)
        await sack_ack(ctx, [2, 3, 5, 6, 8, 10, 11, 12, 13])
        assert resent_since(n) == []                        # [10, 13): all SACKed
        await bench.check_all(ctx)
        assert bench.model.counters["inferred_losses"] == 4
        assert int(ctx.get(bench.dut.counters.infer_dropped)) == 0

    bench.run(testbench)


def test_inference_keeps_up_with_back_to_back_acks():
    """One ACK per cycle on one QP, each SACKing one more PSN: one inference per ACK (the
    infer_to pointer forwarded between back-to-back ACKs), no drops, as the model."""
    bench = TimedBench(seed=111, bubbles=0.0, backpressure=0.0)
    qpns = (0, 7)

    async def testbench(ctx):
        for qpn in qpns:
            await qp_write(bench, ctx, qpn, psn=qpn * 1000, timeout=20, mpr=1)
        bench.post([write_wr(q, q, 20) for q in qpns])
        await bench.settle(ctx)
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=2)
        headers = []
        for qpn in qpns:
            base = qpn * 1000                     # PSN base lost; base + 1 .. SACKed one by one
            for i in range(1, 13):
                sacked = [base + j for j in range(1, i + 2)]
                headers.append(ack_header(qpn, base - 1, sack=sack_of(base, sacked)))
        await bench.receive(ctx, headers)
        await bench.settle(ctx)
        await bench.check_all(ctx)
        assert bench.model.counters["inferred_losses"] == 2
        assert bench.model.counters["walk_skipped"] == 2 * 11

    bench.run(testbench)


def test_time_rule_infers_holes_a_reorder_window_after_a_later_psn_was_sacked():
    """CONFIG reo_wnd (time-based inference, count rule off): the first ACK showing a PSN
    SACKed above holes arms the QP's reorder window; an ACK reo_wnd units later or more
    resends the holes below the PSN it armed with that are still not SACKed, once; an
    earlier ACK resends nothing, and neither does the same SACK later. As the model."""
    bench = TimedBench(seed=131)
    qpn, psn0 = 2, 0xFFFFFA                 # across the PSN wrap

    def at(i):
        return P.psn_add(psn0, i)

    def resent_since(n):
        return sorted(P.psn_diff(p.context.psn, psn0) for p in bench.send.items[n:])

    async def sack_ack(ctx, now, sacked):
        bench.now = bench.model.now_units = now
        await bench.receive(ctx, [ack_header(qpn, at(-1), sack=sack_of(psn0, map(at, sacked)))])
        await bench.settle(ctx)

    async def testbench(ctx):
        bench.now = 90
        await qp_write(bench, ctx, qpn, psn=psn0, timeout=20)
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0, reo_wnd=5)
        bench.post([write_wr(qpn, 1, 14)])
        await bench.settle(ctx)
        n = len(bench.send.items)
        await sack_ack(ctx, 100, [3])                   # arms: holes below 4, since 100
        await sack_ack(ctx, 103, [3, 6])                # 3 units: still running
        assert resent_since(n) == []
        await sack_ack(ctx, 105, [3, 6, 7])             # 5 units: 0, 1, 2 lost; re-arms (8)
        assert resent_since(n) == [0, 1, 2]
        n = len(bench.send.items)
        await sack_ack(ctx, 107, [3, 5, 6, 7])          # 5 arrived; 2 units since 105
        assert resent_since(n) == []
        await sack_ack(ctx, 110, [3, 5, 6, 7])          # [4, 8): 4 lost
        assert resent_since(n) == [4]
        n = len(bench.send.items)
        await sack_ack(ctx, 200, [3, 5, 6, 7])          # nothing above the region: stays off
        assert resent_since(n) == []
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0, reo_wnd=0)
        await sack_ack(ctx, 210, [3, 5, 6, 7, 10])      # off: nothing
        await sack_ack(ctx, 300, [3, 5, 6, 7, 10, 11])
        assert resent_since(n) == []
        await bench.check_all(ctx)
        assert bench.model.counters["reorder_expiries"] == 2
        assert bench.model.counters["inferred_losses"] == 4

    bench.run(testbench)


def test_time_rule_keeps_up_with_back_to_back_acks():
    """One ACK per cycle on two QPs with the time frozen: the first ACK of each QP finds its
    window expired, resends the hole and re-arms; the window it wrote reaches the next ACK
    of the QP in the next cycle (forwarded by the transparent read port), so the following
    ACKs, at the same time, resend nothing. As the model, counters included."""
    bench = TimedBench(seed=141, bubbles=0.0, backpressure=0.0)
    qpns = (1, 6)

    def acks(qpn, count, first):
        base = qpn * 1000                   # even PSNs lost, odd ones SACKed one by one
        return [ack_header(qpn, base - 1, sack=sack_of(base, range(base + 1, base + 2 * i, 2)))
                for i in range(first, first + count)]

    async def testbench(ctx):
        for qpn in qpns:
            await qp_write(bench, ctx, qpn, psn=qpn * 1000, timeout=20, mpr=1)
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0, reo_wnd=1)
        bench.post([write_wr(q, q, 24) for q in qpns])
        bench.now = bench.model.now_units = 10
        await bench.settle(ctx)
        await bench.receive(ctx, [h for q in qpns for h in acks(q, 1, 1)])    # arm: end 2
        await bench.settle(ctx)
        n = len(bench.send.items)
        bench.now = bench.model.now_units = 20
        await bench.receive(ctx, [h for q in qpns for h in acks(q, 8, 2)])
        await bench.settle(ctx)
        assert sorted((int(p.qpn), P.psn_diff(p.context.psn, int(p.qpn) * 1000))
                      for p in bench.send.items[n:]) == [(1, 0), (6, 0)]
        bench.now = bench.model.now_units = 30
        await bench.receive(ctx, [h for q in qpns for h in acks(q, 1, 10)])   # [2, 4): 2
        await bench.settle(ctx)
        await bench.check_all(ctx)
        assert bench.model.counters["reorder_expiries"] == 4
        assert bench.model.counters["inferred_losses"] == 4

    bench.run(testbench)


def test_scanner_expires_a_reorder_window_without_a_later_ack():
    """The timer scanner polls every live QP's reorder window: holes below the PSN a window
    armed with are resent reo_wnd units after it armed (within a scan period) though no
    further ACK of the QP arrives; one unit earlier nothing is; once expired the window is
    off, so later visits resend nothing more. As the model's poll_reorder."""
    bench = TimedBench(seed=151)
    qpn, psn0 = 5, 0xFFFFFC                 # across the PSN wrap

    def resent_since(n):
        return sorted(P.psn_diff(p.context.psn, psn0) for p in bench.send.items[n:])

    async def visit(ctx, now):
        """Freeze the time at ``now`` for three scan periods."""
        bench.now = bench.model.now_units = now
        await ctx.tick().repeat(3 * SCAN_UNITS + 8)

    async def testbench(ctx):
        bench.now = bench.model.now_units = 40
        await qp_write(bench, ctx, qpn, psn=psn0, timeout=20)
        await bench.control(ctx, RequesterCommand.CONFIG, infer_k=0, reo_wnd=6)
        bench.post([write_wr(qpn, 1, 12)])
        await bench.settle(ctx)
        n = len(bench.send.items)
        bench.now = bench.model.now_units = 50
        # 0, 1 and 4 lost; 2, 3, 5 SACKed: the window arms for the holes below 6, at 50.
        await bench.receive(ctx, [ack_header(qpn, P.psn_add(psn0, -1),
                                             sack=sack_of(psn0, [P.psn_add(psn0, i)
                                                                 for i in (2, 3, 5)]))])
        await bench.settle(ctx)
        await visit(ctx, 55)                            # 5 units: still running
        assert resent_since(n) == []
        assert not bench.model.poll_reorder(qpn)
        await visit(ctx, 56)                            # 6 units: expired by the scanner
        assert bench.model.poll_reorder(qpn)
        await bench.settle(ctx)
        assert resent_since(n) == [0, 1, 4]
        n = len(bench.send.items)
        await visit(ctx, 90)                            # off now: nothing more
        assert not bench.model.poll_reorder(qpn)
        await bench.settle(ctx)
        assert resent_since(n) == []
        await bench.check_all(ctx)
        assert bench.model.counters["reorder_expiries"] == 1
        assert bench.model.counters["inferred_losses"] == 3
        # The time rule alone: resent without LOST feedback (a REORDER walk).
        assert int(ctx.get(bench.dut.counters.lost_feedback)) == 0
        assert not [f for f in bench.feedback.items if f.kind == LOST]

    bench.run(testbench)


# -- control -----------------------------------------------------------------------------------

def test_timer_fields_are_checked():
    bench = TimedBench(seed=121)

    async def testbench(ctx):
        for fields in ({"timeout": 25}, {"retry_exp": 26}, {"timeout": 24, "retry_exp": 25,
                                                            "retry_linear": 7}):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=4, state=P.QpState.RTS,
                                mpr=1, max_wimm=1, **fields)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=4, page=3)     # ECN window
        assert [int(r.errno) for r in bench.ctl_resp.items] == [
            P.Errno.EINVAL, P.Errno.EINVAL, P.Errno.OK, P.Errno.OK]
        assert await bench.read_timer(ctx, 4) == timer_page(armed=0, retries=0, start=0)

    bench.run(testbench)


def test_counter_names_are_appended():
    assert REQUESTER_COUNTERS[:16][-1] == "feedback_dropped"
    assert REQUESTER_COUNTERS[16:] == (
        "timeouts", "retry_exceeded", "timeout_retransmissions", "inferred_losses",
        "lost_feedback", "walk_skipped", "arm_dropped", "infer_dropped", "reorder_expiries",
        "wr_pool_waits", "psn_pool_waits")


# -- every QP fails cleanly, and works again -----------------------------------------------------

def test_software_error_flushes_outstanding_wrs_and_stops_the_qp():
    """QP_WRITE ERROR with WRs outstanding (one half acknowledged, one refused, one holding the
    segmenter at its window, one waiting for a WR slot): answered at once; every outstanding WR
    completes in order, WR_FLUSH_ERR (the refused one its own status); the other QP's WR behind
    them is sent within a bound; nothing more is sent or resent for the QP (timer, trims,
    `retx`, ACKs with SACK bits); no qp_error event. As the model, counters included."""
    bench = TimedBench(seed=161)
    qpn, other, psn0 = 1, 2, 0xFFFFF0

    async def testbench(ctx):
        bench.now = 1_000
        await qp_write(bench, ctx, qpn, psn=psn0, timeout=3, exp=P.RETRY_INFINITE)
        await qp_write(bench, ctx, other, psn=50, timeout=20)
        bench.post([write_wr(qpn, 0, 2), write_wr(qpn, 1, 3),
                    {"qpn": qpn, "opcode": W.RDMA_READ, "wr_id": 2},
                    write_wr(qpn, 3, 200),              # holds the segmenter at the window
                    write_wr(qpn, 4, 1),                # waits for a WR slot
                    write_wr(other, 9, 1)])             # behind them
        await bench.settle(ctx)
        assert len(bench.send.items) == 128
        await bench.receive(ctx, [ack_header(qpn, P.psn_add(psn0, 2))])    # WR 0, 1 PSN of WR 1
        await bench.settle(ctx)
        for state in (P.QpState.RTS, P.QpState.RESET):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=state, mpr=1,
                                max_wimm=1)             # EBUSY
        await bench.receive(ctx, [nack_header(qpn, P.psn_add(psn0, 4))])  # decided before
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.ERROR,
                            mpr=1, max_wimm=1)
        assert [int(r.errno) for r in bench.ctl_resp.items[-3:]] == [
            P.Errno.EBUSY, P.Errno.EBUSY, P.Errno.OK]
        # The other QP's WR no longer waits behind the failed one.
        await bench.wait(ctx, lambda: any(int(p.qpn) == other for p in bench.send.items),
                         "the other QP's packet", timeout=100)
        await bench.settle(ctx)
        await bench.completion.wait(ctx, len(bench.model.completions))
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions
                if c["qpn"] == qpn] == [
            (0, S.SUCCESS), (1, S.WR_FLUSH_ERR), (2, S.LOC_QP_OP_ERR), (3, S.WR_FLUSH_ERR),
            (4, S.WR_FLUSH_ERR)]
        # Nothing more for the QP: time runs far past its timeout, trims, retransmit
        # requests and ACKs (with SACK bits) arrive, a WR is posted.
        sent = len(bench.send.items)
        bench.now += 1 << 12
        await ctx.tick().repeat(3 * SCAN_UNITS)
        bench.retx.send([{"qpn": qpn, "psn": P.psn_add(psn0, i)} for i in (3, 5)])
        for i in (3, 5):
            bench.model.retransmit(qpn, P.psn_add(psn0, i))
        await bench.idle(ctx, bench.retx)
        await bench.receive(ctx, [nack_header(qpn, P.psn_add(psn0, 6)),
                                  ack_header(qpn, P.psn_add(psn0, 2), sack=0b1011)])
        bench.post([write_wr(qpn, 5, 1)])
        await bench.settle(ctx)
        assert len(bench.send.items) == sent
        assert bench.events == [] and not bench.qp_error.items and not bench.model.qp_errors
        for page in (0, 1):
            await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn, page=page)
        assert await bench.read_timer(ctx, qpn) & 1 == 0         # disarmed
        await bench.receive(ctx, [ack_header(other, 50)])
        await bench.check_all(ctx)
        assert bench.model.counters["retx_ignored"] == 2
        assert bench.model.counters["bad_acks"] == 2

    bench.run(testbench)


async def exchange(bench, ctx, peer, *, since=None, deliver=True, now_cycles=0, rounds=50):
    """What the requester sends (from send request ``since`` on, default: from now) goes to
    ``peer`` (a :class:`Peer`: a responder model QP), or is lost; the answers come back
    (gateware and model alike), until nothing more is sent. Returns the send requests."""
    sent = []
    for _ in range(rounds):
        n = len(bench.expected_sends) if since is None else since
        since = None
        await bench.settle(ctx)
        new = bench.expected_sends[n:]
        if not new:
            return sent
        sent += new
        if deliver:
            await bench.receive(ctx, [h for r in new
                                      for h in peer.deliver(r, now_cycles=now_cycles)])
    raise AssertionError(f"still sending after {rounds} rounds")


def peer_wr(wr_id, packets, *, offset, **fields):
    return {"qpn": 0, "opcode": W.RDMA_WRITE, "wr_id": wr_id,
            "length": packets * CONFIG.mtu - 5, "remote_addr": Peer.BASE + offset,
            "local_addr": 0x90000 + wr_id * 0x1000, "rkey": Peer.RKEY, "imm": 0} | fields


@pytest.mark.parametrize("failure", FAILURES)
def test_qp_carries_traffic_again_after_each_failure(failure):
    """Retry exhaustion, a fatal NAK (a bad rkey at the peer) or software ERROR; once the
    flush completions are out, QP_WRITE with a new PSN (through RESET for one failure, straight
    to RTS for the others) and the peer QP re-initialised with it: the QP carries traffic
    again, every WR succeeds and lands in the peer's memory. Gateware and model alike."""
    bench = TimedBench(seed=171 + FAILURES.index(failure))
    peer = Peer(CONFIG, psn=0x10)

    async def testbench(ctx):
        bench.now = 2_000
        await qp_write(bench, ctx, 0, psn=0x10, timeout=3, linear=1, exp=0)
        first = peer_wr(1, 3, offset=0x8000)
        bench.post([first])
        await exchange(bench, ctx, peer)
        if failure == "fatal_nak":
            bench.post([peer_wr(10, 2, offset=0, rkey=0x66), peer_wr(11, 1, offset=0x1000)])
            await exchange(bench, ctx, peer)
            expected = [(10, S.REM_ACCESS_ERR), (11, S.WR_FLUSH_ERR)]
        else:
            bench.post([peer_wr(10, 2, offset=0), peer_wr(11, 1, offset=0x1000)])
            await exchange(bench, ctx, peer, deliver=False)
            if failure == "software_error":
                await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0,
                                    state=P.QpState.ERROR, mpr=1, max_wimm=2)
                expected = [(10, S.WR_FLUSH_ERR), (11, S.WR_FLUSH_ERR)]
            else:
                assert await bench.expire(ctx, 0, bench.now + 8) == "timeout"
                assert await bench.expire(ctx, 0, bench.now + 8) == "exceeded"
                expected = [(10, S.RETRY_EXC_ERR), (11, S.RETRY_EXC_ERR)]
        await bench.completion.wait(ctx, len(bench.model.completions))
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions] == [
            (1, S.SUCCESS), *expected]
        assert peer.holds(first)
        psn = 0xFFFFFC                              # the new incarnation wraps the PSN space
        if failure == "retry_exhausted":
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0,
                                state=P.QpState.RESET, mpr=1, max_wimm=1)
        await qp_write(bench, ctx, 0, psn=psn, timeout=3, linear=1, exp=0)
        peer.restart(psn)
        wrs = [peer_wr(20, 5, offset=0x20000),
               peer_wr(21, 2, offset=0x30000, opcode=W.RDMA_WRITE_WITH_IMM, imm=0x77)]
        bench.post(wrs)
        sent = await exchange(bench, ctx, peer)
        assert [r["context"]["psn"] for r in sent] == [P.psn_add(psn, i) for i in range(7)]
        await bench.check_all(ctx)
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions][-2:] == [
            (20, S.SUCCESS), (21, S.SUCCESS)]
        assert all(peer.holds(w) for w in wrs)
        assert peer.responder.counters["completions"] == 1      # the WRITE_IMM
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=0)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=0, page=1)

    bench.run(testbench)


@pytest.mark.parametrize("distance", [1 << 22, -(1 << 22)], ids=["peer_ahead", "peer_behind"])
def test_a_peer_restarted_far_away_fails_the_qp_by_its_retries(distance):
    """The peer QP re-initialised 2**22 PSNs away. Ahead: its duplicate SACKs name a
    cumulative PSN beyond anything sent (bad ACKs); behind: it NACKs PSN_OOR_WINDOW, once per
    nak_interval (counted). Nothing is acknowledged, so the retransmit timer runs out and the
    QP fails with RETRY_EXC_ERR for every WR and one qp_error event, within a bound: the QP is
    never left silent. Gateware and model alike."""
    bench = TimedBench(seed=181)
    peer = Peer(CONFIG, psn=P.psn_add(0x100, distance), nak_interval=1000)

    async def testbench(ctx):
        bench.now = 3_000
        await qp_write(bench, ctx, 0, psn=0x100, timeout=3, linear=1, exp=0)
        bench.post([peer_wr(1, 2, offset=0), peer_wr(2, 1, offset=0x1000)])
        sent = await exchange(bench, ctx, peer, now_cycles=0)
        n = len(bench.expected_sends)
        assert await bench.expire(ctx, 0, bench.now + 8) == "timeout"
        sent += await exchange(bench, ctx, peer, since=n, now_cycles=8 << 10)
        assert await bench.expire(ctx, 0, bench.now + 8) == "exceeded"
        await bench.qp_error.wait(ctx, 1, timeout=1_000)
        assert [const_to_dict(e) for e in bench.qp_error.items] == [
            {"qpn": 0, "status": S.RETRY_EXC_ERR}]
        await bench.check_all(ctx)
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions] == [
            (1, S.RETRY_EXC_ERR), (2, S.RETRY_EXC_ERR)]
        responder = peer.responder.counters
        assert len(sent) == 6 and responder["placed"] == 0
        if distance > 0:
            assert responder["duplicate"] == 6 and bench.model.counters["bad_acks"] == 6
        else:
            assert responder["out_of_window"] == 6 and responder["naks"] == 2
            assert bench.model.counters["nak_psn_out_of_window"] == 2
        assert bench.model.counters["acks"] == 0

    bench.run(testbench)


@pytest.mark.parametrize("failure", ["fatal_nak", "retry_exhausted"])
def test_a_failed_qp_frees_the_engines_for_the_wrs_behind_it(failure):
    """A QP fails (a fatal NAK for a PSN of its third WR, or exhausted retries) while that WR
    holds the segmenter at the window and its next WRITE_IMM waits in the intake (the one
    WRITE_IMM credit is taken), with another QP's WR behind them: the segmenter drops the
    rest, the waiting WR is refused (WR_FLUSH_ERR), the other QP's packet leaves within 100
    cycles, and the completions come in order: SUCCESS for the acknowledged WR, the NAK's
    status for the WR holding its PSN and WR_FLUSH_ERR for the one before it (or
    RETRY_EXC_ERR for both)."""
    bench = TimedBench(seed=191)
    qpn, other, psn0 = 3, 4, 0x7FFFF8

    async def testbench(ctx):
        bench.now = 500
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                            psn=psn0, mpr=1, max_wimm=1, timeout=3, retry_linear=1)
        await qp_write(bench, ctx, other, psn=9, timeout=20)
        bench.post([write_wr(qpn, 0, 1),
                    write_wr(qpn, 1, 2) | {"opcode": W.RDMA_WRITE_WITH_IMM, "imm": 5},
                    write_wr(qpn, 2, 200),      # holds the segmenter at the window
                    write_wr(qpn, 3, 1) | {"opcode": W.RDMA_WRITE_WITH_IMM, "imm": 6},
                    write_wr(other, 9, 1)])     # behind them
        await bench.settle(ctx)
        assert len(bench.send.items) == 128
        await bench.receive(ctx, [ack_header(qpn, psn0)])           # WR 0 only
        await bench.settle(ctx)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn, page=1)
        assert (int(bench.ctl_resp.items[-1].data) >> 8) & 0xFF == 1      # WRITE_IMM credit
        assert not any(int(p.qpn) == other for p in bench.send.items)
        if failure == "fatal_nak":
            await bench.receive(ctx, [nak_header(qpn, P.psn_add(psn0, 7),
                                                 P.NakCode.REMOTE_OPERATIONAL)])
            status = S.REM_OP_ERR
        else:
            assert await bench.expire(ctx, qpn, bench.now + 8) == "timeout"
            n = len(bench.completion.items)
            bench.now += 8
            await bench.wait(ctx, lambda: len(bench.completion.items) > n,
                             "the first flush completion", timeout=100)
            bench.model.now_units = bench.now
            assert bench.model.expire(qpn) == "exceeded"
            status = S.RETRY_EXC_ERR
        await bench.wait(ctx, lambda: any(int(p.qpn) == other for p in bench.send.items),
                         "the other QP's packet", timeout=100)
        await bench.settle(ctx)
        await bench.receive(ctx, [ack_header(other, 9)])
        await bench.check_all(ctx)
        earlier = S.WR_FLUSH_ERR if failure == "fatal_nak" else S.RETRY_EXC_ERR
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions] == [
            (0, S.SUCCESS), (1, earlier), (2, status), (3, S.WR_FLUSH_ERR), (9, S.SUCCESS)]
        assert [const_to_dict(e) for e in bench.qp_error.items] == [
            {"qpn": qpn, "status": status}]

    bench.run(testbench)
