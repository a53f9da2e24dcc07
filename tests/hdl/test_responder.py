# amaranth: UnusedElaboratable=no
"""Responder gateware (Amaranth simulator) against the reference model, arrival by arrival."""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.transport.resp_defs import ResponderCommand as Cmd
from hdl.transport.resp_defs import ResponderVerdict as V
from hdl.transport.responder import Responder
from sim.model.responder import ResponderModel, canonical_header, full_header
from sim.rtlpackets import payload_beats
from sim.tb.amsim import StreamCollector, StreamDriver

CONFIG = NicConfig(qps=4, mpr_units=1, mtu=256, max_wimm=4, data_width=256)
LANES = CONFIG.bytes_per_beat
BASE = 0x2_0000_0000
Op = P.Opcode


def rkey_of(qpn):
    return 0xAB00_0000 | qpn << 4 | qpn      # slot qpn of 16


def setup_commands(qps, *, psn, ack_every=3, ack_delay=1 << 30, nak_interval=0,
                   caps=P.QpCapability.TRIM_NACK | P.QpCapability.SVC_TIME, state=P.QpState.RTS):
    cmds = [{"cmd": Cmd.CONFIG, "ack_every": ack_every, "ack_delay": ack_delay,
             "nak_interval": nak_interval}]
    for qpn in qps:
        cmds.append({"cmd": Cmd.QP_WRITE, "qpn": qpn, "state": state, "remote_qpn": 0x100 + qpn,
                     "pd": qpn, "psn": psn(qpn), "set_psn": 1, "mpr": 1, "caps": caps,
                     "max_wimm": 4})
        cmds.append({"cmd": Cmd.MR_WRITE, "slot": qpn, "valid": 1, "rkey": rkey_of(qpn),
                     "pd": qpn, "base": BASE + (qpn << 20), "length": 1 << 20})
    return cmds


def header(opcode, *, qpn, psn, va, length, imm=None, rkey=None, ackreq=0, ecn=0b10,
           trimmed=False, ev=0, tx_ts=0, rtx=0, port=1, ipv6=1):
    h = {"kind": 0, "port": port, "eth_src": 0x0200_0000_0000 | qpn, "eth_dst": 0x0200_0000_00FF,
         "ipv6": ipv6, "ip_src": 0xFD00 << 112 | qpn, "ip_dst": 0xFD00 << 112 | 0xFF,
         "tclass": (P.DEFAULT_TRIM_DSCP << 2 if trimmed else 0) | ecn, "trimmed": int(trimmed),
         "flow_label": 0x1000 + psn % 256 if ipv6 else 0, "udp_sport": 0xC000 | ev,
         "hop_limit": 64, "payload_len": 0 if trimmed else length,
         "bth": {"opcode": opcode, "dqpn": qpn, "psn": psn, "ackreq": ackreq, "rtx": rtx,
                 "ts": 1},
         "tseth": {"tx_timestamp": tx_ts, "ftype": P.Ftype.TIMESTAMP},
         "reth": {"va": va, "rkey": rkey_of(qpn % CONFIG.qps) if rkey is None else rkey,
                  "dma_len": length}}
    if imm is not None:
        h["immdt"] = {"imm": imm}
    return full_header(h, CONFIG)


def probe_header(*, qpn, probe_id, tx_ts, psn=0, ev=5, port=2):
    """A reliability probe (PETH): consumes no PSN, answered by a pr = 1 SACK."""
    return full_header({
        "kind": PacketKind.RPROBE, "port": port, "eth_src": 0x0200_0000_0000 | qpn,
        "eth_dst": 0x0200_0000_00FF, "ipv6": 1, "ip_src": 0xFD00 << 112 | qpn,
        "ip_dst": 0xFD00 << 112 | 0xFF, "tclass": 0b10, "flow_label": 0x2_0000 | probe_id,
        "udp_sport": 0xC000 | ev, "hop_limit": 64,
        "bth": {"opcode": Op.RELIABILITY_PROBE_REQUEST, "dqpn": qpn, "psn": psn},
        "ctl": {"peth": {"probe_id": probe_id, "tx_timestamp": tx_ts,
                         "ftype": P.Ftype.TIMESTAMP}}}, CONFIG)


def is_probe(h):
    return PacketKind(h["kind"]) == PacketKind.RPROBE


def beats(h, payload):
    return [{"header": h, "data": data, "keep": keep, "first": first, "last": last}
            for data, keep, first, last in payload_beats(payload, CONFIG.data_width)]


def run(packets, commands, *, bubbles=0.3, backpressure=0.3, seed=0, now_ns=None,
        after=None, timeout=200_000, counts=None, late_commands=(), ctl_bubbles=None, **dut_kw):
    """Send ``commands`` (waiting for their responses), then ``late_commands`` and ``packets``
    ([(header, payload)]) together: a command offered in the same cycle as a first beat is
    taken first. Returns the collected outputs and verdicts; ``after`` is an extra testbench
    step."""
    dut = Responder(config=CONFIG, **dut_kw)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    source = StreamDriver(dut.i, bubbles=bubbles, seed=seed)
    ctl = StreamDriver(dut.ctl, bubbles=bubbles if ctl_bubbles is None else ctl_bubbles,
                       seed=seed + 1)
    outs = {name: StreamCollector(getattr(dut, name), backpressure=backpressure, seed=seed + k)
            for k, name in enumerate(["place", "ack", "completion", "ctl_resp"], start=2)}
    for collector in outs.values():
        sim.add_process(collector.process)
    sim.add_process(source.process)
    sim.add_process(ctl.process)
    verdicts, accepted, acked = [], [], []
    expected = dict(counts or {})

    async def watch(ctx):
        cycle = 0
        async for _clk, _, valid, verdict, i_valid, i_ready, first, a_valid, a_ready in \
                ctx.tick().sample(dut.verdict_valid, dut.verdict, dut.i.valid, dut.i.ready,
                                  dut.i.payload.first, dut.ack.valid, dut.ack.ready):
            cycle += 1
            if valid:
                verdicts.append(V(verdict))
            if i_valid and i_ready and first:
                accepted.append(cycle)
            if a_valid and a_ready:
                acked.append(cycle)
            if now_ns is not None:
                ctx.set(dut.now_ns, now_ns(cycle))
    sim.add_process(watch)

    async def bench(ctx):
        ctl.send(commands)
        await outs["ctl_resp"].wait(ctx, len(commands), timeout=timeout)
        ctl.send(list(late_commands))
        for h, payload in packets:
            source.send(beats(h, payload))
        for _ in range(timeout):
            if len(verdicts) >= sum(not is_probe(h) for h, _ in packets) and source.idle and \
                    len(outs["ctl_resp"].items) >= len(commands) + len(late_commands) and all(
                    len(outs[name].items) >= expected.get(name, 0) for name in outs):
                break
            await ctx.tick()
        for _ in range(20):                 # anything extra would show up now
            await ctx.tick()
        if after is not None:
            await after(ctx, dut, outs)
        expected["counters"] = to_dict(ctx.get(dut.counters))

    sim.add_testbench(bench)
    sim.run()
    return {"verdicts": verdicts, "accepted": accepted, "acked": acked,
            "counters": expected["counters"],
            **{name: [to_dict(item) for item in c.items] for name, c in outs.items()}}


def to_dict(value):
    """Like ``sim.tb.amsim.const_to_dict``, but also for non-integer enums (PacketKind)."""
    if isinstance(value, data.Const):
        layout = value.shape()
        if isinstance(layout, data.ArrayLayout):
            return [to_dict(value[i]) for i in range(layout.length)]
        return {name: to_dict(value[name]) for name, _ in layout}
    return int(getattr(value, "value", value))


def place_writes(beats_out):
    """[(addr, bytes)] per packet from place beats."""
    writes, current, addr = [], b"", None
    for beat in beats_out:
        if addr is None:
            addr = beat["addr"]
        count = bin(beat["keep"]).count("1")
        assert beat["keep"] == (1 << count) - 1
        assert beat["addr"] == addr + len(current)
        current += beat["data"].to_bytes(LANES, "little")[:count]
        if beat["last"]:
            writes.append((addr, current))
            current, addr = b"", None
    assert current == b""
    return writes


def expect(model, packets):
    want = {"verdicts": [], "writes": [], "acks": [], "completions": []}
    for h, payload in packets:
        if is_probe(h):
            reply = model.probe(h)
            want["acks"] += [] if reply is None else [reply]
            continue
        result = model.receive(h, payload)
        want["verdicts"].append(result.verdict)
        want["writes"] += result.writes
        want["acks"] += result.replies
        want["completions"] += result.completions
    return want


def counts_of(want):
    return {"ack": len(want["acks"]), "completion": len(want["completions"])}


def check(got, want, model):
    assert got["verdicts"] == want["verdicts"]
    assert place_writes(got["place"]) == want["writes"]
    acks = [canonical_header(beat["header"]) for beat in got["ack"]]
    for beat in got["ack"]:
        assert beat["first"] == 1 and beat["last"] == 1 and beat["keep"] == 0
    assert len(acks) == len(want["acks"])
    for n, (ack, ref) in enumerate(zip(acks, want["acks"], strict=True)):
        assert ack == ref, f"reply {n}"
    assert got["completion"] == want["completions"]
    assert got["counters"] == model.counters


# ---------------------------------------------------------------------------------------------
# Random traffic: several QPs, reordering, loss + retransmission, duplicates, PSN wrap
# ---------------------------------------------------------------------------------------------

def traffic(rng, qps, start, messages):
    """Per QP, messages of 1-3 packets (some WRITE_IMM); arrival order shuffled locally, some
    packets lost and resent later, some duplicated; QPs interleaved."""
    streams = {}
    for qpn in qps:
        psn, va, out = start(qpn), BASE + (qpn << 20), []
        for msg in range(messages):
            npkts = rng.choice([1, 1, 1, 2, 3])
            imm = rng.random() < 0.4
            for k in range(npkts):
                last = k == npkts - 1
                op = P.write_opcode(first=k == 0, last=last, immediate=imm and last)
                length = CONFIG.mtu if not last else rng.randrange(0, 70)
                out.append(header(op, qpn=qpn, psn=psn, va=va, length=length,
                                  imm=(qpn << 16 | msg) if imm and last else None,
                                  ackreq=int(last and rng.random() < 0.3),
                                  ecn=3 if rng.random() < 0.1 else 2, ev=rng.randrange(64),
                                  tx_ts=rng.getrandbits(16), ipv6=int(rng.random() < 0.8),
                                  rtx=int(rng.random() < 0.1)))
                psn, va = P.psn_add(psn, 1), va + length
        # local shuffle, loss (resent at the end), duplicates
        for i in range(len(out) - 1):
            if rng.random() < 0.3:
                j = min(len(out) - 1, i + rng.randrange(1, 5))
                out[i], out[j] = out[j], out[i]
        arrivals, lost = [], []
        for h in out:
            (lost if rng.random() < 0.1 else arrivals).append(h)
            if rng.random() < 0.1:
                arrivals.append(h)
        arrivals += lost
        streams[qpn] = arrivals
    order = []
    while any(streams.values()):
        qpn = rng.choice([q for q in streams if streams[q]])
        order.append(streams[qpn].pop(0))
    return [(h, bytes(rng.getrandbits(8) for _ in range(h["reth"]["dma_len"]))) for h in order]


@pytest.mark.parametrize("bubbles, backpressure, seed", [(0.3, 0.3, 1), (0.0, 0.0, 2),
                                                          (0.1, 0.6, 3)])
def test_random_traffic_matches_model(bubbles, backpressure, seed):
    rng = random.Random(seed)
    qps = [0, 1, 3]
    starts = {q: (0xFFFF00 + rng.randrange(0, 250)) % P.PSN_MODULUS for q in qps}
    packets = traffic(rng, qps, starts.__getitem__, messages=14)
    commands = setup_commands(qps, psn=starts.__getitem__)
    model = ResponderModel(CONFIG)
    for cmd in commands:
        assert model.command(cmd)[0] == P.Errno.OK
    want = expect(model, packets)
    assert V.PLACED in want["verdicts"] and V.DUPLICATE in want["verdicts"]
    assert want["completions"]
    got = run(packets, commands, bubbles=bubbles, backpressure=backpressure, seed=seed,
              counts=counts_of(want))
    assert all(r["errno"] == 0 for r in got["ctl_resp"])
    check(got, want, model)


# ---------------------------------------------------------------------------------------------
# Throughput: back-to-back single-beat packets of the same QP
# ---------------------------------------------------------------------------------------------

def test_one_packet_per_cycle_same_qp():
    rng = random.Random(7)
    start = 0xFFFFF0
    psns = [P.psn_add(start, n) for n in range(60)]
    for i in range(0, 58, 3):               # reordered pairs: SACK, gap ACKs, advances by 2
        psns[i], psns[i + 1] = psns[i + 1], psns[i]
    packets = []
    for n, psn in enumerate(psns):
        imm = n % 5 == 0
        op = Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE if imm else Op.RDMA_WRITE_ONLY
        length = rng.randrange(0, LANES + 1)
        packets.append((header(op, qpn=2, psn=psn, va=BASE + (2 << 20) + 64 * n, length=length,
                               imm=n if imm else None),
                        bytes(rng.getrandbits(8) for _ in range(length))))
    commands = setup_commands([2], psn=lambda q: start, ack_every=1)
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    got = run(packets, commands, bubbles=0, backpressure=0, counts=counts_of(want))
    check(got, want, model)
    cycles = got["accepted"][-1] - got["accepted"][0] + 1
    assert len(got["accepted"]) == len(packets)
    assert len(packets) / cycles == 1.0, f"{len(packets)} packets in {cycles} cycles"


@pytest.mark.parametrize("seed", [11, 12])
def test_a_hole_under_more_than_a_chunk_of_arrivals_advances_in_steps(seed):
    """Every PSN of the window but the expected one arrives first (WRITE_IMMs among them), then
    the expected one: the cumulative PSN advances over more than CHUNK PSNs in several steps,
    with the replies and completions of one long advance."""
    rng = random.Random(seed)
    start = 0xFFFFA0 + seed                 # wraps on the way
    window = CONFIG.window_psns
    packets = []
    imms = set(rng.sample(range(1, window), CONFIG.max_wimm - 1))  # all pending at once
    for n in list(range(1, window)) + [0]:
        imm = n in imms
        last = imm or rng.random() < 0.5
        op = P.write_opcode(first=True, last=last, immediate=imm)
        length = rng.randrange(0, LANES + 1) if last else CONFIG.mtu
        packets.append((header(op, qpn=1, psn=P.psn_add(start, n), va=BASE + (1 << 20) + 512 * n,
                               length=length, imm=n if imm else None),
                        bytes(rng.getrandbits(8) for _ in range(length))))
    commands = setup_commands([1], psn=lambda q: start, ack_every=window)
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert want["acks"][-1]["ctl"]["sack"]["seth"]["cack_psn"] == P.psn_add(start, window - 1)
    assert len(want["completions"]) == len(imms)
    got = run(packets, commands, seed=seed, counts=counts_of(want))
    check(got, want, model)


def test_commands_reach_the_packets_right_behind_them():
    """CONFIG, MR_WRITE and QP_WRITE offered with the first beats are taken first and already
    hold for the next packet, though it reads the tables before the commands have written
    them (the MR and QP entries are forwarded)."""
    rng = random.Random(5)
    commands = setup_commands([0, 1], psn=lambda q: 500, ack_every=4)
    late = [
        {"cmd": Cmd.CONFIG, "ack_every": 1, "ack_delay": 1 << 30, "nak_interval": 0},
        {"cmd": Cmd.MR_WRITE, "slot": 0, "valid": 0, "rkey": 0, "pd": 0, "base": 0,
         "length": 0},                                      # QP 0's region is gone
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": P.QpState.RTS, "remote_qpn": 0x2A1, "pd": 1,
         "mpr": 1, "caps": P.QpCapability.TRIM_NACK, "max_wimm": 4, "set_psn": 0},
    ]
    packets = []
    for n in range(12):
        qpn = n % 2
        length = rng.randrange(1, LANES + 1)
        packets.append((header(Op.RDMA_WRITE_ONLY, qpn=qpn, psn=500 + n // 2,
                               va=BASE + (qpn << 20) + 64 * n, length=length),
                        bytes(rng.getrandbits(8) for _ in range(length))))
    model = ResponderModel(CONFIG)
    for cmd in commands + late:
        model.command(cmd)
    want = expect(model, packets)
    assert want["verdicts"][0] == V.BAD_RKEY and want["verdicts"][1] == V.PLACED
    assert all(ack["bth"]["dqpn"] == 0x2A1 for ack in want["acks"]
               if ack["kind"] == PacketKind.SACK)
    for bubbles, backpressure in ((0.0, 0.0), (0.3, 0.3)):
        model = ResponderModel(CONFIG)
        for cmd in commands + late:
            model.command(cmd)
        want = expect(model, packets)
        got = run(packets, commands, late_commands=late, bubbles=bubbles,
                  backpressure=backpressure, ctl_bubbles=0, counts=counts_of(want))
        check(got, want, model)


# ---------------------------------------------------------------------------------------------
# Adversarial packets: nothing written, the right NAK, counters
# ---------------------------------------------------------------------------------------------

def test_adversarial_packets_are_refused():
    commands = setup_commands([0, 1], psn=lambda q: 100, nak_interval=1 << 30)
    commands.append({"cmd": Cmd.QP_WRITE, "qpn": 2, "state": P.QpState.INIT, "pd": 2, "mpr": 1,
                     "max_wimm": 1, "set_psn": 1})
    commands.append({"cmd": Cmd.MR_WRITE, "slot": 5, "valid": 1, "rkey": 0x55, "pd": 1,
                     "base": BASE, "length": 4096})       # QP 0's PD is 0: wrong domain
    va0 = BASE
    bad = [
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0, length=8, rkey=rkey_of(0) ^ 0x100),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0, length=8, rkey=0x55),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0 - 1, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0 + (1 << 20) - 7, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=4, psn=100, va=va0, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=0x800001, psn=100, va=va0, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=2, psn=0, va=va0, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=3, psn=0, va=va0, length=8),     # RESET
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100 + 128, va=va0, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100 + 5000, va=va0, length=8),  # rate limited
        header(Op.RDMA_WRITE_ONLY, qpn=1, psn=100 + 200, va=va0, length=8),   # other QP: NAK
        header(Op.RDMA_WRITE_FIRST, qpn=0, psn=100, va=va0, length=8),
        header(Op.ACKNOWLEDGE, qpn=0, psn=100, va=va0, length=8),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0, length=CONFIG.mtu + 1),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=101, va=va0, length=8, trimmed=True),
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0 + (1 << 20) - 8, length=8),  # ok
        header(Op.RDMA_WRITE_ONLY, qpn=0, psn=100, va=va0, length=8),      # duplicate
    ]
    packets = [(h, b"" if h["trimmed"] else bytes(h["reth"]["dma_len"])) for h in bad]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert want["verdicts"] == [V.BAD_RKEY, V.BAD_RKEY, V.OUT_OF_BOUNDS, V.OUT_OF_BOUNDS,
                                V.BAD_QP, V.BAD_QP, V.BAD_STATE, V.BAD_STATE, V.OUT_OF_WINDOW,
                                V.OUT_OF_WINDOW, V.OUT_OF_WINDOW, V.BAD_SEQUENCE,
                                V.BAD_SEQUENCE, V.BAD_SEQUENCE, V.TRIMMED, V.PLACED,
                                V.DUPLICATE]
    got = run(packets, commands, counts=counts_of(want), seed=4)
    check(got, want, model)
    assert place_writes(got["place"]) == [(va0 + (1 << 20) - 8, bytes(8))]
    counters = got["counters"]
    assert counters["naks_suppressed"] == 1 and counters["naks"] == 14
    assert counters["bad_qp"] == 2 and counters["out_of_window"] == 3


# ---------------------------------------------------------------------------------------------
# ACK delay, service time, commands
# ---------------------------------------------------------------------------------------------

def test_ack_after_delay_when_fewer_than_n_packets():
    delay = 60
    commands = setup_commands([1], psn=lambda q: 7, ack_every=8, ack_delay=delay)
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=1, psn=7 + n, va=BASE + (1 << 20), length=4,
                       tx_ts=0x100 + n), b"abcd") for n in range(3)]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert want["acks"] == []
    delayed = model.expire(1 << 20)
    # It answers the first packet (the one that started the timer) but echoes the last one's
    # timestamp: the round trip measured from it holds no ACK delay.
    (sack,) = delayed
    assert sack["ctl"]["sack"]["seth"]["ack_psn_offset"] == -2
    assert sack["ctl"]["sack"]["cc_state"]["tx_timestamp"] == 0x102

    async def after(ctx, dut, outs):
        for _ in range(400):
            if outs["ack"].items:
                return
            await ctx.tick()

    got = run(packets, commands, bubbles=0, backpressure=0, after=after, counts={"ack": 0})
    assert [canonical_header(beat["header"]) for beat in got["ack"]] == delayed
    # The timer starts when the first packet is classified (the cycle after it is taken) and
    # fires when its entry reaches the FIFO head: a few cycles of slack, never early.
    (acked,) = got["acked"]
    assert delay <= acked - got["accepted"][0] <= delay + 6


@pytest.mark.parametrize("coalesce", [0, 1])
def test_out_of_order_arrivals_ack_at_once_unless_coalesced(coalesce):
    """Sprayed packets arrive out of order: by default each gap is ACKed at once; with
    ``coalesce_gaps`` they wait for ack_every like in-order ones (the SACK bitmap of the next
    ACK still reports every arrival)."""
    commands = setup_commands([1], psn=lambda q: 7, ack_every=4)
    commands[0]["coalesce_gaps"] = coalesce
    order = [2, 0, 3, 1, 6, 4, 5, 7]
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=1, psn=7 + n, va=BASE + (1 << 20) + 4 * n,
                       length=4), bytes([n]) * 4) for n in order]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert len(want["acks"]) == (2 if coalesce else 5)
    got = run(packets, commands, counts=counts_of(want))
    check(got, want, model)


@pytest.mark.parametrize("depth", [0, 3])
def test_deep_gap_acks_at_once_while_coalescing(depth):
    """With ``coalesce_gaps`` and ``gap_depth`` D, the packet that is the D-th received above a
    hole is ACKed at once (the ones after it are coalesced), so a requester with K <= D can
    infer the loss without waiting for ack_every. The count of PSNs above the hole is a
    per-QP register (+1 per placed packet, - advance per step); the WRITE_IMMs below make a
    filled hole release two completions in two steps, and the next hole must count from zero
    again."""
    commands = setup_commands([1], psn=lambda q: 7, ack_every=16)
    commands[0].update(coalesce_gaps=1, gap_depth=depth)
    order = [1, 2, 3, 0, 5, 6, 7, 4, 9, 8]
    imm = {1, 2}
    packets = [(header(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE if n in imm else Op.RDMA_WRITE_ONLY,
                       qpn=1, psn=7 + n, va=BASE + (1 << 20) + 4 * n, length=4,
                       imm=n if n in imm else None), bytes([n]) * 4) for n in order]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    # depth 3: PSN offsets 3 and 7 are each the third arrival above a hole (0, then 4);
    # the cumulative PSN shows the four PSNs that offset 0 completed before the second.
    assert [ack["ctl"]["sack"]["seth"]["cack_psn"] for ack in want["acks"]] == \
        ([] if depth == 0 else [6, 10])
    assert len(want["completions"]) == 2
    got = run(packets, commands, counts=counts_of(want))
    check(got, want, model)


def test_deep_gap_acks_once_per_hole_not_every_arrival_above_it():
    """``gap_depth`` 3: the third PSN above the hole is ACKed at once; the fourth and fifth
    wait (coalesced), and so does the packet that fills the hole."""
    commands = setup_commands([1], psn=lambda q: 7, ack_every=16)
    commands[0].update(coalesce_gaps=1, gap_depth=3)
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=1, psn=7 + n, va=BASE + (1 << 20) + 4 * n,
                       length=4), bytes([n]) * 4) for n in [1, 2, 3, 4, 5, 0]]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert [ack["bth"]["psn"] + ack["ctl"]["sack"]["seth"]["ack_psn_offset"] - 7
            for ack in want["acks"]] == [3]
    got = run(packets, commands, counts=counts_of(want))
    check(got, want, model)


@pytest.mark.parametrize("new_holes", [0, 1])
def test_new_hole_acks_at_once_while_coalescing(new_holes):
    """With ``coalesce_gaps`` and ``ack_new_holes``, a packet that opens a new hole (placed
    above the expected PSN while the PSN just below it has not arrived) is ACKed at once; one
    that lands above a hole whose top PSN had arrived is not (the hole was reported)."""
    commands = setup_commands([1], psn=lambda q: 7, ack_every=16)
    commands[0].update(coalesce_gaps=1, ack_new_holes=new_holes)
    # 2: opens the hole 0-1; 3: above it, PSN 2 arrived (no ACK); 5: opens the hole at 4;
    # 0: fills the bottom (in order: not a hole); 1 fills up to 3; 4 fills the rest; 7: a hole.
    order = [2, 3, 5, 0, 1, 4, 7, 6]
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=1, psn=7 + n, va=BASE + (1 << 20) + 4 * n,
                       length=4), bytes([n]) * 4) for n in order]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert [ack["bth"]["psn"] + ack["ctl"]["sack"]["seth"]["ack_psn_offset"] - 7
            for ack in want["acks"]] == ([] if new_holes == 0 else [2, 5, 7])
    got = run(packets, commands, counts=counts_of(want))
    check(got, want, model)


def test_sack_bitmap_placed_by_an_offset_other_than_one():
    """A trigger more than 64 PSNs above cack_psn gets its 64-aligned block as the bitmap
    (sack_psn_offset above 1); nearer ones the 64 PSNs above cack_psn. Gateware = model."""
    start = 0xFFFFC0                        # the blocks straddle the PSN wrap
    commands = setup_commands([1], psn=lambda q: start, ack_every=1)
    offsets = [70, 100, 120, 63, 64, 2, 127, 0]
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=1, psn=P.psn_add(start, n),
                       va=BASE + (1 << 20) + 4 * n, length=4, tx_ts=n, ev=n % 7),
                bytes([n]) * 4) for n in offsets]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    placements = [ack["ctl"]["sack"]["seth"]["sack_psn_offset"] for ack in want["acks"]]
    assert placements == [1 + 64, 1 + 64, 1 + 64, 1, 1 + 64, 1, 1 + 64, 1]
    got = run(packets, commands, counts=counts_of(want), seed=9)
    check(got, want, model)


@pytest.mark.parametrize("seed", [1, 2])
def test_reliability_probe_is_answered_by_a_pr_sack(seed):
    """A PETH among data packets: answered with a pr = 1 SACK (ack_psn_offset = probe id,
    CC_STATE tx_timestamp = the PETH's), it consumes no PSN; one for a QP in RESET is dropped
    and counted."""
    commands = setup_commands([0, 1], psn=lambda q: 10, ack_every=2)
    packets = []
    for n in range(12):
        packets.append((header(Op.RDMA_WRITE_ONLY, qpn=n % 2, psn=10 + n // 2 + (n == 4),
                               va=BASE + ((n % 2) << 20) + 4 * n, length=4), bytes(4)))
        if n % 3 == 1:
            packets.append((probe_header(qpn=n % 2, probe_id=0xFFF0 + n, tx_ts=0x100 * n), b""))
    packets.append((probe_header(qpn=3, probe_id=1, tx_ts=1), b""))
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    answers = [a["ctl"]["sack"]["seth"] for a in want["acks"] if a["ctl"]["sack"]["seth"]["pr"]]
    assert [a["ack_psn_offset"] for a in answers] == [0xFFF1 - 0x10000, 0xFFF4 - 0x10000,
                                                      0xFFF7 - 0x10000, 0xFFFA - 0x10000]
    got = run(packets, commands, counts=counts_of(want), seed=seed)
    check(got, want, model)
    assert got["counters"]["probes"] == 4 and got["counters"]["probes_dropped"] == 1


def test_a_requester_far_from_the_expected_psn_is_refused_never_placed():
    """A QP re-initialised (set_psn) far from the PSNs its requester still sends: a PSN up to
    2**23 - 1 ahead of the expected one is out of the window (a NACK PSN_OOR_WINDOW, then
    suppressed within nak_interval), one 2**23 or more ahead, that is behind, a duplicate
    answered by a SACK of the QP's own cumulative PSN. Nothing is placed; a PSN in the window
    still is afterwards."""
    expected = 0x400000
    commands = setup_commands([0], psn=lambda q: 0x100, nak_interval=1 << 30)
    commands += [dict(commands[1], psn=expected)]            # restarted
    psns = [expected + (1 << 22), expected + (1 << 22) + 1, expected - (1 << 22),
            expected + (1 << 23) - 1, expected + (1 << 23), expected - 1,
            0x100, 0x101, expected]
    packets = [(header(Op.RDMA_WRITE_ONLY, qpn=0, psn=psn % P.PSN_MODULUS, va=BASE + 8 * n,
                       length=8, ackreq=1), bytes(range(n, n + 8)))
               for n, psn in enumerate(psns)]
    model = ResponderModel(CONFIG)
    for cmd in commands:
        model.command(cmd)
    want = expect(model, packets)
    assert want["verdicts"] == [V.OUT_OF_WINDOW, V.OUT_OF_WINDOW, V.DUPLICATE, V.OUT_OF_WINDOW,
                                V.DUPLICATE, V.DUPLICATE, V.DUPLICATE, V.DUPLICATE, V.PLACED]
    got = run(packets, commands, counts=counts_of(want), seed=9)
    check(got, want, model)
    kinds = [PacketKind(a["kind"]) for a in want["acks"]]
    assert kinds == [PacketKind.NACK] + [PacketKind.SACK] * 6
    assert {a["bth"]["psn"] for a in want["acks"][1:-1]} == {expected - 1}
    assert place_writes(got["place"]) == [(BASE + 8 * 8, bytes(range(8, 16)))]
    assert got["counters"]["naks_suppressed"] == 2


def test_commands_answer_like_the_model():
    commands = [
        {"cmd": Cmd.QP_WRITE, "qpn": 4, "state": 3, "mpr": 1, "max_wimm": 1},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 5, "mpr": 1, "max_wimm": 1},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 3, "mpr": 2, "max_wimm": 1},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 3, "mpr": 1, "max_wimm": 0},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 3, "mpr": 1, "max_wimm": 5},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 3, "mpr": 1, "max_wimm": 4, "psn": 0xABCDEF,
         "set_psn": 1},
        {"cmd": Cmd.QP_WRITE, "qpn": 1, "state": 2, "mpr": 1, "max_wimm": 4, "psn": 5},
        {"cmd": Cmd.QP_READ, "qpn": 1},
        {"cmd": Cmd.QP_READ, "qpn": 9},
        {"cmd": Cmd.MR_WRITE, "slot": 16, "valid": 1},
        {"cmd": Cmd.MR_WRITE, "slot": 3, "valid": 1, "rkey": 0x14},
        {"cmd": Cmd.MR_WRITE, "slot": 3, "valid": 0, "rkey": 0x14},
        {"cmd": Cmd.CONFIG, "ack_every": 0},
        {"cmd": Cmd.CONFIG, "ack_every": 255, "ack_delay": 9, "nak_interval": 3},
    ]
    model = ResponderModel(CONFIG)
    want = [model.command(cmd) for cmd in commands]
    got = run([], commands)
    assert [(r["errno"], r["data"]) for r in got["ctl_resp"]] == want
    assert [errno for errno, _ in want] == [2, 22, 22, 22, 22, 0, 0, 0, 2, 2, 22, 0, 22, 0]


def test_bad_parameters():
    with pytest.raises(ValueError, match="MR slot count must be a power of two"):
        Responder(config=CONFIG, mr_slots=12)
    with pytest.raises(TypeError, match="Configuration must be a NicConfig"):
        Responder(config=None)
