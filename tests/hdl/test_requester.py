"""Requester gateware against the reference model (Amaranth simulator).

Random work requests over several QPs and random SACK/NACK/NAK streams made from the packets
the model sent (reordered, duplicated, SACK bitmaps at any offset, probe answers, trims, PSNs
out of the window and bad ACKs); every send request,
completion and feedback is compared with :class:`sim.model.requester.RequesterModel`, with
bubbles on every input and backpressure on every output. The gateware interleaves its
streams in time, so the bench compares at quiescent points: new packets in order,
retransmissions as a multiset, completions in order per QP, feedback as a subsequence (it is
dropped, and counted, when its output is full).
"""

import random

import pytest
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.transport.req_defs import (
    CC_MAX_STEPS,
    CC_MIN_WINDOW,
    PSN_CHUNK,
    REQUESTER_COUNTERS,
    RequesterCommand,
    psn_chunks,
    segmenter_contexts,
)
from hdl.transport.requester import Requester, block_ram_bits
from sim.model.requester import RequesterModel
from sim.model.responder import full_header
from sim.tb.amsim import StreamCollector, StreamDriver, const_to_dict

# A WR pool as large as every QP's WR slots: never exhausted, but its free list comes round
# after 32 WRs, so the entries are reused in a different order from the rings'.
CONFIG = NicConfig(qps=8, mpr_units=1, mtu=256, wr_slots=4, wr_pool=32, max_wimm=2,
                   evs_per_profile=8)
W = P.WrOpcode


def ack_header(qpn, cum_psn, *, sack=0, psn=None, ce=False, mark=None, offset=1, pr=0,
               probe_id=0, seth_cack=None):
    """A SACK: cumulative PSN ``cum_psn``, triggered by PSN ``psn`` (default ``cum_psn``),
    bitmap ``sack`` from PSN ``cum_psn + offset``; ``ce`` marks SKIP_ONCE; ``pr`` makes it a
    probe answer (ack_psn_offset = ``probe_id``)."""
    if mark is None:
        mark = P.SackMark.SKIP_ONCE if ce else P.SackMark.NONE
    trigger = cum_psn if psn is None else psn
    ack_offset = probe_id if pr else P.psn_diff(trigger, cum_psn)
    ack_offset = (ack_offset + 0x8000) % 0x10000 - 0x8000
    return {"kind": PacketKind.SACK,
            "bth": {"opcode": P.Opcode.RELIABILITY_SACK, "dqpn": qpn, "psn": cum_psn},
            "ctl": {"sack": {"seth": {"m": mark, "pr": pr, "ack_psn_offset": ack_offset,
                                      "cack_psn": cum_psn if seth_cack is None else seth_cack,
                                      "sack_psn_offset": offset, "sack_bitmap": sack},
                             "cc_state": {}}}}


def nack_header(qpn, psn, reason=P.NackReason.TRIMMED):
    return {"kind": PacketKind.NACK,
            "bth": {"opcode": P.Opcode.RELIABILITY_NACK, "dqpn": qpn, "psn": psn},
            "ctl": {"neth": {"nack_reason": reason, "nack_psn": psn}}}


def nak_header(qpn, psn, code):
    return {"kind": PacketKind.AETH,
            "bth": {"opcode": P.Opcode.ACKNOWLEDGE, "dqpn": qpn, "psn": psn},
            "aeth": {"syndrome": P.nak_syndrome(code), "msn": 0}}


class Bench:
    """The DUT, the model, a driver or collector per stream, and helpers that keep the two in
    step."""

    def __init__(self, config=CONFIG, *, bubbles=0.3, backpressure=0.3, seed=0,
                 feedback_backpressure=None):
        self.config = config
        self.dut = dut = Requester(config=config)
        self.model = RequesterModel(config)
        self.rng = random.Random(seed)
        b, bp = bubbles, backpressure
        self.wr = StreamDriver(dut.wr, bubbles=b, seed=seed + 1)
        self.sent = StreamDriver(dut.sent, bubbles=b, seed=seed + 2)
        self.rx = StreamDriver(dut.rx, bubbles=b, seed=seed + 3)
        self.retx = StreamDriver(dut.retx, bubbles=b, seed=seed + 4)
        self.ctl = StreamDriver(dut.ctl, bubbles=b, seed=seed + 5)
        self.send = StreamCollector(dut.send, backpressure=bp, seed=seed + 6)
        self.completion = StreamCollector(dut.completion, backpressure=bp, seed=seed + 7)
        self.feedback = StreamCollector(
            dut.feedback, backpressure=bp if feedback_backpressure is None
            else feedback_backpressure, seed=seed + 8)
        self.qp_error = StreamCollector(dut.qp_error, backpressure=bp, seed=seed + 9)
        self.ctl_resp = StreamCollector(dut.ctl_resp, backpressure=bp, seed=seed + 10)
        self.sim = Simulator(dut)
        self.sim.add_clock(1e-8)
        for stream in (self.wr, self.sent, self.rx, self.retx, self.ctl, self.send,
                       self.completion, self.feedback, self.qp_error, self.ctl_resp):
            self.sim.add_process(stream.process)
        self.expected_sends = []            # model send requests, in model order
        self.checked_sends = 0
        self.reported = 0                   # send requests whose EV was reported

    def run(self, testbench):
        async def main(ctx):
            await testbench(ctx)
        self.sim.add_testbench(main)
        self.sim.run()

    async def wait(self, ctx, condition, what, timeout=20_000):
        for _ in range(timeout):
            if condition():
                return
            await ctx.tick()
        raise AssertionError(f"timed out waiting for {what}")

    async def idle(self, ctx, driver, cycles=8):
        await self.wait(ctx, lambda: driver.idle, "a driver to drain")
        await ctx.tick().repeat(cycles)

    async def control(self, ctx, cmd, **fields):
        """Run a command on both; the gateware's response must equal the model's."""
        want = self.model.control(cmd, **fields)
        self.ctl.send([{"cmd": cmd, **fields}])
        n = len(self.ctl_resp.items) + 1
        await self.ctl_resp.wait(ctx, n)
        got = self.ctl_resp.items[n - 1]
        assert (int(got.errno), int(got.data)) == (int(want[0]), want[1]), (cmd, fields)
        return want

    def post(self, wrs):
        for wr in wrs:
            self.model.post(wr)
        self.wr.send(wrs)

    async def settle_sends(self, ctx):
        """Everything the model can send now must come out of the gateware, and no more."""
        self.expected_sends += self.model.pull_all()
        await self.send.wait(ctx, len(self.expected_sends))
        await ctx.tick().repeat(30)
        got = [const_to_dict(p) for p in self.send.items[self.checked_sends:]]
        want = self.expected_sends[self.checked_sends:]
        brief = lambda items: [(p["qpn"], p["context"]["psn"], p["context"]["retransmission"])  # noqa: E731
                               for p in items]
        assert len(got) == len(want), f"sent {brief(got)}, the model sent {brief(want)}"
        new = lambda items: [p for p in items if not p["context"]["retransmission"]]  # noqa: E731
        if segmenter_contexts(self.config) == 1:
            assert new(got) == new(want)
        else:
            # The contexts take turns as their windows allow: each QP's new packets in order.
            for qpn in range(self.config.qps):
                assert ([p for p in new(got) if p["qpn"] == qpn]
                        == [p for p in new(want) if p["qpn"] == qpn]), qpn
        key = lambda p: (p["qpn"], p["context"]["psn"], repr(p))  # noqa: E731
        assert sorted(map(key, got)) == sorted(map(key, want))
        self.checked_sends = len(self.send.items)

    async def report_evs(self, ctx):
        """The transmit side reports the EV of every send request."""
        reports = []
        for item in self.send.items[self.reported:]:
            ev = self.rng.randrange(self.config.evs_per_profile)
            self.model.sent(int(item.qpn), int(item.context.psn), ev)
            reports.append({"qpn": int(item.qpn), "psn": int(item.context.psn), "ev": ev})
        self.reported = len(self.send.items)
        self.sent.send(reports)
        await self.idle(ctx, self.sent, 2)

    async def receive(self, ctx, headers):
        headers = [full_header(h, self.config) for h in headers]
        for header in headers:
            self.model.receive(header)
        self.rx.send([{"header": h, "first": 1, "last": 1} for h in headers])
        await self.idle(ctx, self.rx)
        await self.completion.wait(ctx, len(self.model.completions))

    def check_completions(self):
        got = [const_to_dict(c) for c in self.completion.items]
        assert len(got) == len(self.model.completions)
        for qpn in range(self.config.qps):
            assert ([c for c in got if c["qpn"] == qpn]
                    == [c for c in self.model.completions if c["qpn"] == qpn]), qpn

    def check_feedback(self, ctx):
        got = [const_to_dict(f) for f in self.feedback.items]
        dropped = int(ctx.get(self.dut.counters.feedback_dropped))
        assert len(got) + dropped == len(self.model.feedback)
        want = iter(self.model.feedback)
        assert all(any(f == w for w in want) for f in got), "feedback out of order"

    async def check_counters(self, ctx):
        # The counters count their events a few cycles after them (registered).
        await ctx.tick().repeat(4)
        # Timing-dependent, not modelled: feedback dropped at a full output, WRs that found
        # the WR pool empty (the gateware frees an entry a few cycles after its completion),
        # packets that waited for a PSN pool chunk (returned a few cycles after una passes).
        for name in REQUESTER_COUNTERS:
            if name not in ("feedback_dropped", "wr_pool_waits", "psn_pool_waits"):
                assert ctx.get(self.dut.counters[name]) == self.model.counters[name], name


class Responder:
    """A responder's view per QP for making ACK streams: PSNs received, cumulative PSN."""

    def __init__(self, bench, qpns, psn0):
        self.bench = bench
        self.arrived = {q: set() for q in qpns}
        self.epsn = {q: psn0[q] for q in qpns}

    def ack(self, qpn, *, psn=None, mark=P.SackMark.NONE, offset=1, pr=0, probe_id=0):
        """A SACK of what arrived, its bitmap from PSN cum + ``offset`` (any offset: the
        requester applies whatever overlaps its window)."""
        cum = P.psn_add(self.epsn[qpn], -1)
        base = P.psn_add(cum, offset)
        sack = 0
        for i in range(P.SACK_BITMAP_BITS):
            if P.psn_add(base, i) in self.arrived[qpn]:     # bit i: PSN base + i
                sack |= 1 << i
        return ack_header(qpn, cum, sack=sack, psn=psn, mark=mark, offset=offset, pr=pr,
                          probe_id=probe_id)

    def arrive(self, qpn, psn):
        self.arrived[qpn].add(psn)
        while self.epsn[qpn] in self.arrived[qpn]:
            self.arrived[qpn].discard(self.epsn[qpn])
            self.epsn[qpn] = P.psn_add(self.epsn[qpn], 1)

    def batch(self, rng, *, arrive=0.6, trim=0.25, final=False):
        """ACKs/NAKs for the model's outstanding PSNs: some arrive, some are trimmed."""
        model, config = self.bench.model, self.bench.config
        out = []
        for qpn in self.arrived:
            for psn in model.outstanding(qpn):
                if psn in self.arrived[qpn] or P.psn_diff(psn, self.epsn[qpn]) < 0:
                    continue
                mark = rng.choice([P.SackMark.NONE] * 4 + [P.SackMark.SKIP_ONCE] * 2
                                  + [P.SackMark.ALWAYS_SKIP])
                # Mostly the responder's placements (cum + 1, or the trigger's 64-aligned
                # block), sometimes any offset.
                distance = P.psn_diff(psn, P.psn_add(self.epsn[qpn], -1))
                offset = rng.choice([1, 1, 1, rng.randrange(-80, 140),
                                     P.psn_diff(psn & ~63, P.psn_add(self.epsn[qpn], -1))
                                     if distance > 64 else 1])
                if final or rng.random() < arrive:
                    self.arrive(qpn, psn)
                    out.append(self.ack(qpn, psn=psn, mark=mark, offset=offset))
                elif rng.random() < trim:
                    out.append(nack_header(qpn, psn))
                elif rng.random() < 0.1:
                    out.append(self.ack(qpn, pr=1, probe_id=rng.getrandbits(16)))
        for i in range(len(out) - 1):           # a little reordering and duplication
            if rng.random() < 0.2:
                out[i], out[i + 1] = out[i + 1], out[i]
        for header in list(out):
            if rng.random() < 0.1:
                out.insert(rng.randrange(len(out) + 1), header)
        if not final and out:
            qpn = rng.choice(list(self.arrived))
            beyond = P.psn_add(model.qp(qpn)["next_psn"], config.window_psns + 5)
            out.insert(rng.randrange(len(out)), ack_header(qpn, beyond))
            out.insert(rng.randrange(len(out)), ack_header(config.qps + 3, 0))
            # PSN out of the window: counted; an unknown NACK reason and a SACK whose two
            # cumulative PSNs differ: bad ACKs.
            out.insert(rng.randrange(len(out)),
                       nack_header(qpn, beyond, P.NackReason.PSN_OOR_WINDOW))
            out.insert(rng.randrange(len(out)), nack_header(qpn, beyond, P.NackReason.NO_BITMAP))
            cum = P.psn_add(self.epsn[qpn], -1)
            out.insert(rng.randrange(len(out)),
                       ack_header(qpn, cum, seth_cack=P.psn_add(cum, 1)))
        return out


def random_wr(rng, qpns, mtu):
    opcode = rng.choice([W.RDMA_WRITE] * 6 + [W.RDMA_WRITE_WITH_IMM] * 3 + [W.RDMA_READ])
    length = rng.choice([0, mtu, 2 * mtu, rng.randrange(1, 5 * mtu)])
    return {"qpn": rng.choice(qpns), "opcode": opcode, "wr_id": rng.getrandbits(64),
            "local_addr": rng.getrandbits(40), "remote_addr": rng.getrandbits(48),
            "rkey": rng.getrandbits(32), "length": length, "imm": rng.getrandbits(32)}


@pytest.mark.parametrize(
    "seed, bubbles, backpressure, feedback_backpressure, wr_pool, psn_pool, segmenters", [
        # Eight segmenter contexts (three QPs use three), two, and one (then
        # the new packets leave in the model's order exactly).
        (1, 0.3, 0.3, None, 32, 4096, 8), (2, 0.0, 0.0, None, 32, 4096, 1),
        (3, 0.5, 0.5, None, 32, 4096, 8), (4, 0.1, 0.3, 0.9, 32, 4096, 2),
        # Six WR pool entries for the three QPs' twelve slots: WRs wait for the pool.
        (1, 0.3, 0.3, None, 6, 4096, 8),
        # Three or two PSN pool chunks for three QPs: packets wait for a chunk, and the chunks
        # are reused over and over (QP 3 across the 24-bit PSN wrap). One context: which
        # packets a short pool lets go depends on the order the QPs take chunks, and only
        # one context keeps it the model's.
        (5, 0.3, 0.3, None, 32, 48, 1), (6, 0.2, 0.4, None, 32, 32, 1)])
def test_random_traffic_matches_model(seed, bubbles, backpressure, feedback_backpressure,
                                      wr_pool, psn_pool, segmenters):
    bench = Bench(CONFIG.replace(wr_pool=wr_pool, psn_pool=psn_pool, segmenters=segmenters),
                  bubbles=bubbles, backpressure=backpressure, seed=seed,
                  feedback_backpressure=feedback_backpressure)
    rng = random.Random(seed)
    qpns = [0, 3, 5]
    psn0 = {0: 0, 3: 0xFFFFF4, 5: rng.getrandbits(24)}     # QP 3 wraps
    responder = Responder(bench, qpns, psn0)

    async def testbench(ctx):
        for qpn in qpns:
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=psn0[qpn], mpr=1, max_wimm=rng.choice([1, 2]))
        await bench.control(ctx, RequesterCommand.CONFIG, ackreq_every=3)
        for _ in range(8):
            bench.post([random_wr(rng, qpns, CONFIG.mtu) for _ in range(rng.randrange(3, 9))])
            await bench.settle_sends(ctx)
            await bench.report_evs(ctx)
            await bench.receive(ctx, responder.batch(rng))
            await bench.settle_sends(ctx)
            await bench.report_evs(ctx)
            if rng.random() < 0.5:          # the retransmit timer's input
                requests = []
                for qpn in qpns:
                    for psn in bench.model.outstanding(qpn)[:3] + [P.psn_add(psn0[qpn], -1)]:
                        requests.append({"qpn": qpn, "psn": psn})
                        bench.model.retransmit(qpn, psn)
                bench.retx.send(requests)
                await bench.idle(ctx, bench.retx)
                await bench.settle_sends(ctx)
                await bench.report_evs(ctx)
        while bench.model.pending_wrs or any(bench.model.outstanding(q) for q in qpns):
            await bench.receive(ctx, responder.batch(rng, final=True))
            await bench.settle_sends(ctx)
            await bench.report_evs(ctx)
        for qpn in qpns:
            await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn)
            await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn, page=1)
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)
        for name in ("retransmissions", "retx_ignored", "duplicate_acks", "bad_acks",
                     "nak_trimmed", "nak_psn_out_of_window", "wr_refused"):
            assert bench.model.counters[name] > 0, name
        if feedback_backpressure:
            assert ctx.get(bench.dut.counters.feedback_dropped) > 0
        if wr_pool < 3 * CONFIG.wr_slots:
            assert ctx.get(bench.dut.counters.wr_pool_waits) > 0
        if psn_pool < 3 * PSN_CHUNK:
            assert ctx.get(bench.dut.counters.psn_pool_waits) > 0
        await ctx.tick().repeat(10)
        assert ctx.get(bench.dut.wr_pool_free) == wr_pool        # every entry came back
        # Every chunk came back but those of PSNs still outstanding (QPs left in ERROR).
        assert (ctx.get(bench.dut.psn_pool_free)
                == psn_chunks(bench.config) - bench.model.psn_chunks_used())

    bench.run(testbench)


def test_fatal_nak_errors_qp_with_in_order_flush():
    bench = Bench(seed=11)

    async def testbench(ctx):
        for qpn in (1, 2):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=100, mpr=1, max_wimm=2)
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": i, "length": 300}
                    for i in range(3)]
                   + [{"qpn": 1, "opcode": W.RDMA_READ, "wr_id": 3},
                      {"qpn": 2, "opcode": W.RDMA_WRITE_WITH_IMM, "wr_id": 4, "length": 10}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [
            ack_header(1, 100),                                       # WR 0 half acked
            # PSN 102 is the first of WR 1: WR 0 (ending at 101) does not hold it.
            nak_header(1, 102, P.NakCode.REMOTE_ACCESS),
            ack_header(2, 100),
            ack_header(1, 104),                                       # after ERROR: dropped
        ])
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": 9, "length": 5}])
        await bench.settle_sends(ctx)
        await bench.completion.wait(ctx, len(bench.model.completions))
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions
                if c["qpn"] == 1] == [
            (0, P.CompletionStatus.WR_FLUSH_ERR), (1, P.CompletionStatus.REM_ACCESS_ERR),
            (2, P.CompletionStatus.WR_FLUSH_ERR), (3, P.CompletionStatus.LOC_QP_OP_ERR),
            (9, P.CompletionStatus.WR_FLUSH_ERR)]
        await bench.qp_error.wait(ctx, 1)
        assert [const_to_dict(e) for e in bench.qp_error.items] == bench.model.qp_errors
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=1)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=1, page=1)
        # Drained: the QP can be written again; a bad one cannot.
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=1, state=P.QpState.RTS,
                            psn=7, mpr=1, max_wimm=1)
        for fields in ({"qpn": 8}, {"qpn": 1, "state": 5, "mpr": 1, "max_wimm": 1},
                       {"qpn": 1, "state": 3, "mpr": 2, "max_wimm": 1},
                       {"qpn": 1, "state": 3, "mpr": 1, "max_wimm": 0}):
            await bench.control(ctx, RequesterCommand.QP_WRITE, **fields)
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)

    bench.run(testbench)


def test_trimmed_nack_resends_only_unacknowledged_psns():
    """NACK TRIMMED: the PSN is resent (avoiding the EV it went out on) unless it was
    acknowledged; BTH.rtx is set on every resend (the send context's retransmission)."""
    bench = Bench(seed=41)

    async def testbench(ctx):
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=4, state=P.QpState.RTS,
                            psn=0xFFFFFE, mpr=1, max_wimm=1)
        bench.post([{"qpn": 4, "opcode": W.RDMA_WRITE_WITH_IMM, "wr_id": 1, "length": 1000,
                     "remote_addr": 0x7000, "imm": 0x1234}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        # PSN 0xFFFFFE acknowledged, 0 SACKed; trims for both are ignored, the trims for
        # 0xFFFFFF and 1 are resent (each avoiding the EV it went out on), once.
        await bench.receive(ctx, [
            ack_header(4, 0xFFFFFE, sack=0b10),
            nack_header(4, 0xFFFFFE),
            nack_header(4, 0),
            nack_header(4, 0xFFFFFF),
            nack_header(4, 1),
        ])
        await bench.settle_sends(ctx)
        resent = [const_to_dict(p) for p in bench.send.items[4:]]
        assert sorted(p["context"]["psn"] for p in resent) == [1, 0xFFFFFF]
        assert all(p["context"]["retransmission"] for p in resent)
        # The resends carry their message's METH numbers (the first message of the QP).
        assert all(p["context"]["msn"] == 0 and p["context"]["rqmsn"] == 0 for p in resent)
        assert bench.model.counters["nak_trimmed"] == 4
        await bench.receive(ctx, [ack_header(4, 1)])
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)

    bench.run(testbench)


def test_window_and_slot_limits_match_model():
    bench = Bench(seed=21)

    async def testbench(ctx):
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.RTS,
                            psn=0xFFFFC0, mpr=1, max_wimm=1)
        bench.post([{"qpn": 0, "opcode": W.RDMA_WRITE, "wr_id": 1, "length": 140 * 256},
                    {"qpn": 0, "opcode": W.RDMA_WRITE_WITH_IMM, "wr_id": 2, "length": 1},
                    {"qpn": 0, "opcode": W.RDMA_WRITE_WITH_IMM, "wr_id": 3, "length": 1}])
        await bench.settle_sends(ctx)
        assert len(bench.send.items) == 128                     # the window is full
        # The packet that fills the window asks for an ACK; the ones before it do not.
        asked = [int(p.context.ackreq) for p in bench.send.items]
        assert asked == [0] * 127 + [1]
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.RTS,
                            mpr=1, max_wimm=1)                  # EBUSY
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, P.psn_add(0xFFFFC0, 19))])
        await bench.settle_sends(ctx)
        await bench.receive(ctx, [ack_header(0, P.psn_add(0xFFFFC0, 140))])
        await bench.settle_sends(ctx)
        await bench.receive(ctx, [ack_header(0, P.psn_add(0xFFFFC0, 141))])
        await bench.settle_sends(ctx)
        bench.check_completions()
        await bench.check_counters(ctx)
        assert [c["wr_id"] for c in bench.model.completions] == [1, 2, 3]

    bench.run(testbench)


@pytest.mark.parametrize("segmenters", [1, 2])
def test_a_qp_with_a_full_window_holds_other_qps_back_only_with_one_segmenter(segmenters):
    """QP 0's WR fills its window and waits for ACKs; QP 2's WR, posted behind it, goes
    meanwhile with two segmenter contexts and waits behind it with one."""
    bench = Bench(CONFIG.replace(segmenters=segmenters), seed=23)

    async def testbench(ctx):
        for qpn in (0, 2):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=100 * qpn, mpr=1, max_wimm=1)
        bench.post([{"qpn": 0, "opcode": W.RDMA_WRITE, "wr_id": 1, "length": 140 * 256},
                    {"qpn": 2, "opcode": W.RDMA_WRITE, "wr_id": 2, "length": 6 * 256}])
        await bench.settle_sends(ctx)
        sent = [(int(p.qpn), int(p.context.psn)) for p in bench.send.items]
        assert [psn for qpn, psn in sent if qpn == 0] == list(range(128))   # window full
        assert ([psn for qpn, psn in sent if qpn == 2]
                == (list(range(200, 206)) if segmenters > 1 else []))
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, 127)])     # the rest of both WRs goes
        await bench.settle_sends(ctx)
        assert len(bench.send.items) == 146
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, 139), ack_header(2, 205)])
        bench.check_completions()
        await bench.check_counters(ctx)
        assert sorted(c["wr_id"] for c in bench.model.completions) == [1, 2]

    bench.run(testbench)


def _ecn_steps(bench, qpn, psn0):
    """``start(ctx)``: CONFIG cc on and the QP in RTS from ``psn0`` (MPR 1); ``window(ctx)``:
    the QP's ECN window page (QP_READ page 3); ``step(ctx, offset, psn=, ce=)``: a SACK up
    to ``psn0 + offset`` for PSN ``psn0 + psn``, then the window."""
    async def start(ctx):
        await bench.control(ctx, RequesterCommand.CONFIG, cc=1)
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                            psn=psn0, mpr=1, max_wimm=1)

    async def window(ctx):
        return (await bench.control(ctx, RequesterCommand.QP_READ, qpn=qpn, page=3))[1]

    async def step(ctx, offset, *, psn, ce=False):
        await bench.receive(ctx, [ack_header(qpn, P.psn_add(psn0, offset),
                                             psn=P.psn_add(psn0, psn), ce=ce)])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        return await window(ctx)
    return start, window, step


def test_ecn_window_matches_model():
    """CONFIG cc: a CE echo for a PSN sent after the last decrease takes 1/8 off the PSNs in
    flight before it, a second one in the same window does nothing, every cwnd/4 PSNs that
    unmarked ACKs acknowledge (at least one per ACK) widen the window by one PSN (at most
    CC_MAX_STEPS per ACK); the segmenter stops at the window, the packet that fills it asks
    for an ACK, and the window (QP_READ page 3) equals the model's after every step."""
    bench = Bench(seed=31)
    psn0 = 0xFFFFF0                                 # the window wraps the PSN space
    start, window, step = _ecn_steps(bench, 2, psn0)

    async def testbench(ctx):
        await start(ctx)
        assert await window(ctx) == 128 | psn0 << 32
        bench.post([{"qpn": 2, "opcode": W.RDMA_WRITE, "wr_id": 7, "length": 600 * 256}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        assert len(bench.send.items) == 128                     # MPR
        # CE for PSN 10, una 0 -> 10: the 128 in flight before the ACK -> 128 - 16 = 112;
        # recover = the next PSN (128).
        assert await step(ctx, 9, psn=10, ce=True) == 112 | P.psn_add(psn0, 128) << 32
        # A second mark before PSN 128: no decrease; una 20 lets PSNs up to 131 go.
        assert await step(ctx, 19, psn=20, ce=True) == 112 | P.psn_add(psn0, 128) << 32
        assert len(bench.send.items) == 20 + 112
        # Unmarked ACKs count the PSNs they acknowledge cumulatively (bits 12-23); every
        # cwnd/4 = 28 of them add one PSN. Sending resumes exactly to una + cwnd.
        for offset in (29, 39, 49):                 # 10 PSNs each: 10, 20, 30 -> +1, 2 left
            await step(ctx, offset, psn=offset + 1)
        assert await window(ctx) == 113 | 2 << 12 | P.psn_add(psn0, 128) << 32
        assert len(bench.send.items) == 50 + 113
        # Each ACK reopened the window; the packet that filled it again asked for an ACK.
        asked = [i for i, p in enumerate(bench.send.items) if p.context.ackreq]
        assert asked == [127, 19 + 112, 29 + 112, 39 + 112, 49 + 113]
        for offset in range(50, 76):                # one PSN each: 2 + 26 = 28 -> +1, 0 left
            await step(ctx, offset, psn=offset + 1)
        assert await window(ctx) == 114 | P.psn_add(psn0, 128) << 32
        assert len(bench.send.items) == 76 + 114
        # One ACK for 86 PSNs: 86 // 28 = 3 PSNs (114 -> 117), 2 left.
        assert await step(ctx, 161, psn=100) == 117 | 2 << 12 | P.psn_add(psn0, 128) << 32
        assert len(bench.send.items) == 162 + 117
        # An ACK that acknowledges nothing new still counts one.
        assert await step(ctx, 161, psn=100) == 117 | 3 << 12 | P.psn_add(psn0, 128) << 32
        # A mark for a PSN at or after 128 shrinks it again, from the PSNs in flight before
        # the ACK (here all of the window, although the ACK itself acknowledges six of them).
        cwnd = await step(ctx, 167, psn=200, ce=True)
        flight = 117
        assert cwnd == (flight - (flight >> 3)) | P.psn_add(psn0, 162 + 117) << 32
        # Sent 279, una 168: an ACK for all 111 in flight (cwnd 103, a threshold of 25) adds
        # CC_MAX_STEPS = 4 (111 // 25), what is left (11) is kept.
        assert CC_MAX_STEPS == 4
        assert await step(ctx, 278, psn=278) == 107 | 11 << 12 | P.psn_add(psn0, 279) << 32
        # Marks on the newest PSN, una creeping up: never below CC_MIN_WINDOW.
        una = 279
        for _ in range(80):
            sent = len(bench.send.items)
            una = min(una + 3, sent)
            cwnd = (await step(ctx, una - 1, psn=sent - 1, ce=True)) & 0xFFF
            if cwnd == CC_MIN_WINDOW:
                break
        assert cwnd == CC_MIN_WINDOW
        await step(ctx, una - 1, psn=len(bench.send.items) - 1, ce=True)
        assert (await window(ctx)) & 0xFFF == CC_MIN_WINDOW
        # A mark on an ACK that leaves nothing in flight: still the floor.
        sent = len(bench.send.items)
        assert (await step(ctx, sent - 1, psn=sent - 1, ce=True)) & 0xFFF == CC_MIN_WINDOW
        await bench.check_counters(ctx)

    bench.run(testbench)



def test_ecn_window_cuts_the_window_a_bursty_qp_used():
    """A QP that sent a burst and has little of it left in flight when the mark comes back is
    cut from what it sent since the last decrease, not from the tail in flight (with WRs
    served in order over QPs, a QP's burst often ends before its marked ACK arrives: a cut
    from the tail took its window to 2-5 PSNs under a plane failure, docs/requester.md)."""
    bench = Bench(seed=32)
    psn0 = 0xFFFFFA                                 # the burst wraps the PSN space
    start, window, step = _ecn_steps(bench, 1, psn0)

    async def testbench(ctx):
        await start(ctx)
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": 3, "length": 24 * 256}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        assert len(bench.send.items) == 24
        # Unmarked ACKs up to PSN 21 (one PSN counted each time below the threshold of 32).
        assert await step(ctx, 21, psn=21) & 0xFFF == 128
        # The mark for PSN 22 with 2 in flight: 24 sent since QP_WRITE -> 24 - 3 = 21 (the
        # tail alone would have given the floor, 2).
        assert await step(ctx, 21, psn=22, ce=True) == 21 | P.psn_add(psn0, 24) << 32
        # A second burst of 8 after the decrease; its mark with 1 in flight: 8 - 1 = 7.
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": 4, "length": 8 * 256}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        assert len(bench.send.items) == 32
        # An unmarked ACK up to PSN 29 (8 PSNs, threshold 21 / 4 = 5: one step, 3 left) ...
        assert await step(ctx, 29, psn=29) == 22 | 3 << 12 | P.psn_add(psn0, 24) << 32
        # ... then the mark, 2 in flight: the 8 sent since the decrease -> 8 - 1 = 7.
        assert await step(ctx, 30, psn=31, ce=True) == 7 | P.psn_add(psn0, 32) << 32
        await bench.check_counters(ctx)

    bench.run(testbench)


class CycleLog:
    """Cycle numbers at which a stream transfers."""

    def __init__(self, stream):
        self.stream = stream
        self.cycles = []

    async def process(self, ctx):
        cycle = 0
        async for _clk, _rst, valid, ready in ctx.tick().sample(self.stream.valid,
                                                               self.stream.ready):
            if valid and ready:
                self.cycles.append(cycle)
            cycle += 1


def test_full_throughput_one_packet_and_one_ack_per_cycle():
    bench = Bench(bubbles=0.0, backpressure=0.0, seed=31)
    sends, acks = CycleLog(bench.dut.send), CycleLog(bench.dut.rx)
    bench.sim.add_process(sends.process)
    bench.sim.add_process(acks.process)
    n = 24

    async def testbench(ctx):
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=2, state=P.QpState.RTS,
                            psn=5, mpr=1, max_wimm=1)
        bench.post([{"qpn": 2, "opcode": W.RDMA_WRITE, "wr_id": 1, "length": n * 256}]
                   + [{"qpn": 2, "opcode": W.RDMA_WRITE, "wr_id": 2 + i, "length": 8}
                      for i in range(3)])
        await bench.settle_sends(ctx)
        assert sends.cycles == list(range(sends.cycles[0], sends.cycles[0] + n + 3))
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(2, 5 + i) for i in range(n + 3)])
        assert acks.cycles == list(range(acks.cycles[0], acks.cycles[0] + n + 3))
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)
        assert int(ctx.get(bench.dut.counters.feedback_dropped)) == 0

    bench.run(testbench)


def test_one_ack_per_cycle_alternating_qps():
    bench = Bench(bubbles=0.0, backpressure=0.0, seed=51)
    acks = CycleLog(bench.dut.rx)
    bench.sim.add_process(acks.process)
    qpns = [0, 1, 6, 7]

    async def testbench(ctx):
        for qpn in qpns:
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=0, mpr=1, max_wimm=1)
        bench.post([{"qpn": q, "opcode": W.RDMA_WRITE, "wr_id": i, "length": 3 * 256}
                    for i in range(4) for q in qpns])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        # Every ACK advances its QP's una (and may complete a WR), round-robin over 4 QPs.
        await bench.receive(ctx, [ack_header(q, i) for i in range(12) for q in qpns])
        assert acks.cycles == list(range(acks.cycles[0], acks.cycles[0] + 48))
        bench.check_completions()
        await bench.check_counters(ctx)

    bench.run(testbench)


def test_block_ram_bits_of_default_build():
    bits = block_ram_bits(NicConfig(), copies=False)
    # The per-PSN metadata is a pool of psn_pool PSNs (4096) whatever the QP count; it names
    # its WR by its entry of the 1024-entry WR pool (10 bits).
    assert bits["meta"] == 4096 * (10 + 16 + 1)
    assert bits["ev"] == 4096 * 6
    # Each QP's chunk map: 2 x 256 / 16 entries naming one of 4096 / 16 chunks (8 bits).
    assert bits["chunk_map"] == 256 * 32 * 8
    assert bits["acked"] == 256 * 256
    # The WR pool holds wr_pool WRs, whatever the QP count; each QP's ring names them.
    assert bits["wr_send"] == 1024 * 281 and bits["wr_done"] == 1024 * 126
    assert bits["wr_ring"] == 256 * 16 * 10
    # No more entries are built than the QPs' slots together could use.
    small = block_ram_bits(NicConfig(qps=16), copies=False)
    assert small["wr_send"] == 16 * 16 * 281 and small["meta"] == 4096 * (8 + 16 + 1)
    tiny = block_ram_bits(NicConfig(qps=4), copies=False)
    assert tiny["meta"] == 4 * 32 * 16 * (6 + 16 + 1)


def test_qp_write_waits_until_no_packet_of_the_qp_is_left_in_the_send_register():
    """A packet (and a resend behind it) decided before a fatal NAK still sits in the `send`
    register while the transmit side stalls. A QP_WRITE that re-initialises the QP with a new
    PSN answers only after they have left: nothing of the old QP follows the response."""
    bench = Bench(seed=171)
    sends, responses = CycleLog(bench.dut.send), CycleLog(bench.dut.ctl_resp)
    bench.sim.add_process(sends.process)
    bench.sim.add_process(responses.process)

    async def testbench(ctx):
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=1, state=P.QpState.RTS,
                            psn=100, mpr=1, max_wimm=1)
        bench.send.backpressure = 1.0               # the transmit side stalls
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": 1, "length": 8}])
        bench.expected_sends += bench.model.pull_all()
        await bench.wait(ctx, lambda: ctx.get(bench.dut.send.valid), "PSN 100 in `send`")
        # A trim of PSN 100: its resend is decided now and waits behind the register.
        await bench.receive(ctx, [nack_header(1, 100)])
        bench.expected_sends += bench.model.pull_all()
        await ctx.tick().repeat(20)
        await bench.receive(ctx, [nak_header(1, 100, P.NakCode.REMOTE_ACCESS)])
        assert [c["status"] for c in bench.model.completions] == [
            P.CompletionStatus.REM_ACCESS_ERR]
        fields = {"cmd": RequesterCommand.QP_WRITE, "qpn": 1, "state": P.QpState.RTS,
                  "psn": 500, "mpr": 1, "max_wimm": 1}
        want = bench.model.control(**fields)
        bench.ctl.send([fields])
        await ctx.tick().repeat(300)
        assert len(bench.ctl_resp.items) == 1 and not bench.send.items      # still waiting
        bench.send.backpressure = 0.3
        await bench.ctl_resp.wait(ctx, 2)
        got = bench.ctl_resp.items[1]
        assert (int(got.errno), int(got.data)) == (int(want[0]), want[1])
        await bench.send.wait(ctx, 2)
        assert [(int(p.context.psn), int(p.context.retransmission))
                for p in bench.send.items] == [(100, 0), (100, 1)]
        assert sends.cycles[1] < responses.cycles[1]
        bench.post([{"qpn": 1, "opcode": W.RDMA_WRITE, "wr_id": 2, "length": 300}])
        await bench.settle_sends(ctx)
        assert [int(p.context.psn) for p in bench.send.items[2:]] == [500, 501]
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(1, 501)])
        assert [c["status"] for c in bench.model.completions] == [
            P.CompletionStatus.REM_ACCESS_ERR, P.CompletionStatus.SUCCESS]
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)

    bench.run(testbench)


def test_back_to_back_acks_of_one_qp_see_each_others_writes():
    """ACK processing decides an ACK two cycles after the tables were read for it: the ACK
    right behind one of the same QP takes that one's una, SACK bitmap, ECN window and trigger
    bit from its write-back (forwarded), not from the tables. A SACK, a TRIM of a PSN it just
    SACKed (ignored) and a TRIM of a PSN still missing (resent) on consecutive cycles; then a
    SACK moving una on and a duplicate (counted as one) on consecutive cycles."""
    bench = Bench(bubbles=0.0, backpressure=0.0, seed=61)
    acks = CycleLog(bench.dut.rx)
    bench.sim.add_process(acks.process)

    async def testbench(ctx):
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=3, state=P.QpState.RTS,
                            psn=10, mpr=1, max_wimm=1)
        bench.post([{"qpn": 3, "opcode": W.RDMA_WRITE, "wr_id": 1, "length": 8 * 256}])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [
            ack_header(3, 10, sack=0b110, ce=True),     # una 11; 12 and 13 SACKed
            nack_header(3, 12),                         # SACKed just before: not resent
            nack_header(3, 11),                         # still missing: resent
        ])
        await bench.settle_sends(ctx)
        resent = [const_to_dict(p) for p in bench.send.items[8:]]
        assert [p["context"]["psn"] for p in resent] == [11]
        await bench.receive(ctx, [
            ack_header(3, 13, sack=0b1),                # una 14; 15 SACKed
            ack_header(3, 13),                          # a duplicate
        ])
        assert acks.cycles[:3] == list(range(acks.cycles[0], acks.cycles[0] + 3))
        assert acks.cycles[3:] == list(range(acks.cycles[3], acks.cycles[3] + 2))
        assert bench.model.counters["duplicate_acks"] == 1
        await bench.check_counters(ctx)
        await bench.control(ctx, RequesterCommand.QP_READ, qpn=3, page=3)
        await bench.receive(ctx, [ack_header(3, 17)])
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)

    bench.run(testbench)


# -- the shared WR pool ----------------------------------------------------------------------

#: Six WRs outstanding over all QPs, four per QP: two QPs exhaust the pool.
POOL_CONFIG = CONFIG.replace(wr_pool=6)


@pytest.mark.parametrize("seed", [71, 72])
def test_an_empty_wr_pool_holds_the_wr_back_until_a_completion_frees_an_entry(seed):
    """With the pool's six entries outstanding (QP 0 four, QP 1 two), the next WR (QP 2) is
    not taken: nothing more is sent, its wait is counted once; the ACK that completes two
    WRs of QP 0 frees their entries, and the WRs behind go out, in order, as the model
    sends them. At the end every entry is free again."""
    bench = Bench(POOL_CONFIG, seed=seed)
    wr = lambda qpn, wr_id, length: {"qpn": qpn, "opcode": W.RDMA_WRITE,  # noqa: E731
                                     "wr_id": wr_id, "length": length, "remote_addr": wr_id << 12}

    async def testbench(ctx):
        for qpn in (0, 1, 2):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=10 * qpn, mpr=1, max_wimm=1)
        assert ctx.get(bench.dut.wr_pool_free) == 6
        bench.post([wr(0, i, 300) for i in range(4)] + [wr(1, 4 + i, 200) for i in range(2)]
                   + [wr(2, 6, 100), wr(1, 7, 50)])
        await bench.settle_sends(ctx)
        assert bench.model.pending_wrs == 2
        assert {int(p.qpn) for p in bench.send.items} == {0, 1}
        assert ctx.get(bench.dut.wr_pool_free) == 0
        assert ctx.get(bench.dut.counters.wr_pool_waits) == 1
        assert not ctx.get(bench.dut.wr.ready)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, 3)])        # WRs 0 and 1 (PSNs 0-3)
        await bench.settle_sends(ctx)
        assert bench.model.pending_wrs == 0
        assert [int(p.qpn) for p in bench.send.items[-2:]] == [2, 1]
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, 7), ack_header(1, 12), ack_header(2, 20)])
        bench.check_completions()
        assert len(bench.model.completions) == 8
        await bench.check_counters(ctx)
        await ctx.tick().repeat(10)
        assert ctx.get(bench.dut.wr_pool_free) == 6

    bench.run(testbench)


def test_wr_pool_entries_come_back_after_a_flush_and_a_reset_and_are_reused_intact():
    """QP 0 holds four of the six entries and QP 1 two; QP 2's WR waits. A software ERROR
    flushes QP 0's WRs (WR_FLUSH_ERR, in order) and frees their entries: QP 2's WR goes.
    QP 0 is re-initialised; new WRs on QP 0 reuse the freed entries, and resends (NACK
    TRIMMED) rebuilt from them carry the new WRs' addresses and lengths. Every entry is free
    at the end, and a second round fills the pool again."""
    bench = Bench(POOL_CONFIG, seed=81)
    wr = lambda qpn, wr_id, length: {"qpn": qpn, "opcode": W.RDMA_WRITE,  # noqa: E731
                                     "wr_id": wr_id, "length": length,
                                     "remote_addr": 0x10000 + (wr_id << 12),
                                     "local_addr": 0x80000 + (wr_id << 12)}

    async def testbench(ctx):
        for qpn in (0, 1, 2):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=100, mpr=1, max_wimm=1)
        bench.post([wr(0, i, 600) for i in range(4)] + [wr(1, 4, 256), wr(1, 5, 256),
                                                         wr(2, 6, 200)])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        assert ctx.get(bench.dut.wr_pool_free) == 0 and bench.model.pending_wrs == 1
        # Software ERROR: QP 0's four WRs complete WR_FLUSH_ERR and free their entries.
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.ERROR,
                            mpr=1, max_wimm=1)
        await bench.completion.wait(ctx, 4)
        assert [(c["wr_id"], c["status"]) for c in bench.model.completions] == [
            (i, P.CompletionStatus.WR_FLUSH_ERR) for i in range(4)]
        await bench.settle_sends(ctx)                       # QP 2's WR goes
        assert bench.model.pending_wrs == 0
        await bench.report_evs(ctx)
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.RTS,
                            psn=500, mpr=1, max_wimm=1)
        # New WRs on QP 0 take the freed entries; trims make resends rebuilt from them.
        bench.post([wr(0, 10 + i, 300 + 100 * i) for i in range(3)])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [nack_header(0, 501), nack_header(0, 503),
                                  nack_header(0, 505)])
        await bench.settle_sends(ctx)
        resent = [const_to_dict(p) for p in bench.send.items if p.context.retransmission]
        assert sorted(p["context"]["psn"] for p in resent) == [501, 503, 505]
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(0, 505), ack_header(1, 101), ack_header(2, 100)])
        await ctx.tick().repeat(10)
        assert ctx.get(bench.dut.wr_pool_free) == 6
        # A second round fills the pool again (four WRs on QP 1, two on QP 2).
        bench.post([wr(1, 20 + i, 100) for i in range(4)] + [wr(2, 24, 100), wr(2, 25, 100)])
        await bench.settle_sends(ctx)
        assert ctx.get(bench.dut.wr_pool_free) == 0
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(1, 105), ack_header(2, 102)])
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)
        await ctx.tick().repeat(10)
        assert ctx.get(bench.dut.wr_pool_free) == 6

    bench.run(testbench)


# Four chunks of 16 PSNs for every QP's packets.
# One segmenter context: which packets a pool this short lets go depends on the order in which
# the QPs take chunks, and only one context keeps that order the model's.
PSN_POOL_CONFIG = CONFIG.replace(psn_pool=4 * PSN_CHUNK, segmenters=1)


@pytest.mark.parametrize("seed", [91, 92])
def test_psn_pool_chunks_come_back_after_a_fatal_nak_a_flush_and_a_reset(seed):
    """QP 0 starts 8 PSNs before the 24-bit wrap and holds two chunks (one each side of it),
    QP 1 one, QP 3 one: the pool is empty and QP 2's WR waits (counted once). A fatal NAK
    fails QP 0: its chunks stay held (its PSNs are still outstanding) until software
    re-initialises it, mid-chunk; then QP 2's WR goes. New WRs on QP 0 reuse the returned
    chunks, and resends (NACK TRIMMED) rebuilt from the per-PSN state in them carry the new
    WRs' addresses. A software ERROR on QP 1 flushes its WRs and a reset returns its chunk.
    When every PSN is acknowledged every chunk is free, and a second round across the wrap
    reuses them intact."""
    bench = Bench(PSN_POOL_CONFIG, seed=seed)
    wr = lambda qpn, wr_id, length: {"qpn": qpn, "opcode": W.RDMA_WRITE,  # noqa: E731
                                     "wr_id": wr_id, "length": length,
                                     "remote_addr": 0x10000 + (wr_id << 12),
                                     "local_addr": 0x80000 + (wr_id << 12)}
    mtu = PSN_POOL_CONFIG.mtu
    start = {0: 0xFFFFF8, 1: 100, 2: 40, 3: 3}

    async def free(ctx, expected):
        """``expected`` chunks are free, in the gateware and in the model."""
        await ctx.tick().repeat(10)
        assert ctx.get(bench.dut.psn_pool_free) == expected
        assert expected == 4 - bench.model.psn_chunks_used()

    async def testbench(ctx):
        for qpn in (0, 1, 2, 3):
            await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=qpn, state=P.QpState.RTS,
                                psn=start[qpn], mpr=1, max_wimm=1)
        await free(ctx, 4)
        # QP 0: PSNs 0xFFFFF8 to 0x000001 (two chunks); QP 1: 100, 101; QP 3: 3.
        bench.post([wr(0, i, 3 * mtu + 1) for i in range(3)] + [wr(1, 3, 2 * mtu),
                                                                wr(3, 4, 10), wr(2, 5, 10)])
        await bench.settle_sends(ctx)
        assert bench.model.pending_wrs == 0 and bench.model.psn_chunks_used() == 4
        assert 2 not in {int(p.qpn) for p in bench.send.items}
        await free(ctx, 0)
        assert ctx.get(bench.dut.counters.psn_pool_waits) == 1
        await bench.report_evs(ctx)
        # A fatal NAK on QP 0: its WRs fail, its PSNs stay outstanding and its chunks held.
        await bench.receive(ctx, [ack_header(0, 0xFFFFFA),
                                  nak_header(0, 0xFFFFFB, P.NakCode.REMOTE_ACCESS)])
        await bench.settle_sends(ctx)
        await free(ctx, 0)
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.RTS,
                            psn=0x7, mpr=1, max_wimm=1)
        await bench.settle_sends(ctx)                        # QP 2's WR goes
        assert 2 in {int(p.qpn) for p in bench.send.items}
        await free(ctx, 1)
        await bench.report_evs(ctx)
        # New WRs on QP 0 (PSNs 7 to 12) take the free chunk; trims resend from it.
        bench.post([wr(0, 10, 2 * mtu), wr(0, 11, 4 * mtu)])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [nack_header(0, 8), nack_header(0, 11)])
        await bench.settle_sends(ctx)
        resent = [const_to_dict(p) for p in bench.send.items if p.context.retransmission]
        assert sorted((p["qpn"], p["context"]["psn"]) for p in resent) == [(0, 8), (0, 11)]
        assert [p["context"]["va"] for p in sorted(resent, key=lambda p: p["context"]["psn"])] \
            == [0x10000 + (10 << 12) + mtu, 0x10000 + (11 << 12) + 2 * mtu]
        await bench.report_evs(ctx)
        # Software ERROR on QP 1 flushes its WR; a reset returns its chunk.
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=1, state=P.QpState.ERROR,
                            mpr=1, max_wimm=1)
        await bench.completion.wait(ctx, len(bench.model.completions))
        await free(ctx, 0)
        await bench.control(ctx, RequesterCommand.QP_WRITE, qpn=1, state=P.QpState.RTS,
                            psn=0xFFFFFE, mpr=1, max_wimm=1)
        await free(ctx, 1)
        await bench.receive(ctx, [ack_header(0, 12), ack_header(2, 40), ack_header(3, 3)])
        await free(ctx, 4)
        # A second round: QP 1 across the wrap (PSNs 0xFFFFFE to 0x000009, two chunks).
        bench.post([wr(1, 20 + i, 3 * mtu) for i in range(4)])
        await bench.settle_sends(ctx)
        await free(ctx, 2)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [nack_header(1, 0xFFFFFF), nack_header(1, 0x3)])
        await bench.settle_sends(ctx)
        await bench.report_evs(ctx)
        await bench.receive(ctx, [ack_header(1, 0x9)])
        await free(ctx, 4)
        bench.check_completions()
        bench.check_feedback(ctx)
        await bench.check_counters(ctx)

    bench.run(testbench)
