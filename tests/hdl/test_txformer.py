"""The transmit former: MRC 1.0 data headers (METH, TSETH, RETH, BTH.rtx) and EV probe
requests (ERTH) from path decisions, payload from host memory."""

import random

from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.path.probe import probe_context_layout
from hdl.transport.req_defs import send_context_layout
from hdl.transport.txformer import DATA_TCLASS, TxCommand, TxFormer
from sim.tb.amsim import StreamCollector, StreamDriver

CONFIG = NicConfig(qps=16, data_width=64)

SEND_CONTEXT = send_context_layout(CONFIG)
PROBE_CONTEXT = probe_context_layout(CONFIG)
NOW_NS = 0x1234_5678            # the time the former stamps into every TSETH


def host_bytes(addr, length):
    return bytes((addr + i) * 7 % 251 for i in range(length))


def run(decisions, *, bubbles, backpressure, seed):
    dut = TxFormer(config=CONFIG, send_context=SEND_CONTEXT, probe_context=PROBE_CONTEXT)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    lanes = CONFIG.bytes_per_beat
    ctl = StreamDriver(dut.ctl, bubbles=bubbles, seed=seed)
    ctl_resp = StreamCollector(dut.ctl_resp, backpressure=backpressure, seed=seed + 1)
    source = StreamDriver(dut.i, bubbles=bubbles, seed=seed + 2)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=seed + 3)
    fetch_req = StreamCollector(dut.fetch_req, backpressure=backpressure, seed=seed + 4)
    fetch = StreamDriver(dut.fetch, bubbles=bubbles, seed=seed + 5)
    sent = StreamCollector(dut.sent, backpressure=backpressure, seed=seed + 6)
    ctl.send([{"op": TxCommand.LOCAL_WRITE, "eth": 0x02_00_00_00_00_0A, "ip": 0xFD00_0A,
               "ipv6": 1}]
             + [{"op": TxCommand.CONN_WRITE, "qpn": q, "dqpn": 0x100 + q,
                 "eth": 0x02_00_00_00_00_B0 + q, "ip": 0xFD00_B0 + q} for q in range(16)])
    packets = []
    result = {}

    async def memory(ctx):
        served = 0
        while True:
            while served < len(fetch_req.items):
                request = fetch_req.items[served]
                payload = host_bytes(request.addr, request.length)
                beats = []
                for offset in range(0, len(payload), lanes):
                    chunk = payload[offset:offset + lanes]
                    beats.append({"data": int.from_bytes(chunk, "little"),
                                  "keep": (1 << len(chunk)) - 1,
                                  "last": int(offset + lanes >= len(payload))})
                fetch.send(beats)
                served += 1
            await ctx.tick()

    async def bench(ctx):
        ctx.set(dut.now_ns, NOW_NS)
        await ctl_resp.wait(ctx, 17)
        source.send(decisions)
        expected = sum(1 for d in decisions if not d["no_path"])
        current = []
        cycle = 0
        while sum(int(beat.last) for beat in sink.items) < expected:
            cycle += 1
            if cycle > 100_000:
                raise AssertionError("packets did not all leave")
            await ctx.tick()
        result["cycles"] = cycle
        for beat in sink.items:
            current.append(beat)
            if beat.last:
                packets.append(current)
                current = []
        for _ in range(20):
            await ctx.tick()
        assert ctx.get(dut.no_path) == len(decisions) - expected

    for process in (ctl.process, ctl_resp.process, source.process, sink.process,
                    fetch_req.process, fetch.process, sent.process, memory):
        sim.add_process(process)
    sim.add_testbench(bench)
    sim.run()
    assert all(int(r.errno) == 0 for r in ctl_resp.items)
    return packets, sent.as_dicts(), result["cycles"]


def decision(rng, qpn, *, probe=False, no_path=False, length=None):
    length = rng.choice([0, 1, 7, 8, 9, 64, 100, 1024]) if length is None else length
    return {
        "qpn": qpn, "no_path": int(no_path), "ev": rng.randrange(64), "port": rng.randrange(8),
        "fields": {"flow_label": rng.getrandbits(20), "udp_sport": rng.getrandbits(16)},
        "context": {
            "probe": int(probe),
            "send": {"psn": rng.getrandbits(24), "opcode": P.Opcode.RDMA_WRITE_ONLY,
                     "ackreq": 1, "va": rng.getrandbits(64), "rkey": rng.getrandbits(32),
                     "dma_len": length, "imm": rng.getrandbits(32),
                     "local_addr": rng.getrandbits(20),
                     "retransmission": rng.getrandbits(1), "msn": rng.getrandbits(16),
                     "rqmsn": rng.getrandbits(16)},
            "probe_ctx": {"probe_id": rng.getrandbits(16), "tx_ts": rng.getrandbits(16)},
        },
    }


def check(decisions, packets, sent):
    wanted = [d for d in decisions if not d["no_path"]]
    assert len(packets) == len(wanted)
    lanes = CONFIG.bytes_per_beat
    sent_iter = iter(sent)
    for d, beats in zip(wanted, packets, strict=True):
        header = beats[0].header
        assert all(beat.header.as_value().value == header.as_value().value for beat in beats)
        assert int(beats[0].first) == 1 and all(int(b.first) == 0 for b in beats[1:])
        qpn, ctx = d["qpn"], d["context"]
        assert int(header.port) == d["port"]
        assert int(header.eth_dst) == 0x02_00_00_00_00_B0 + qpn
        assert int(header.eth_src) == 0x02_00_00_00_00_0A
        assert int(header.ip_dst) == 0xFD00_B0 + qpn and int(header.ip_src) == 0xFD00_0A
        assert int(header.ipv6) == 1 and int(header.tclass) == DATA_TCLASS
        assert int(header.flow_label) == d["fields"]["flow_label"]
        assert int(header.udp_sport) == d["fields"]["udp_sport"]
        if ctx["probe"]:
            # An EV probe: ENDPOINT_REQUEST to the endpoint QP, the id in BTH.psn[15:0].
            erth = header.ctl.erth
            assert header.kind == PacketKind.EP_REQUEST
            assert int(header.bth.opcode) == P.Opcode.ENDPOINT_REQUEST
            assert int(header.bth.dqpn) == P.ENDPOINT_QPN
            assert int(header.bth.psn) == ctx["probe_ctx"]["probe_id"]
            assert int(erth.op) == P.EndpointOp.EV_PROBE
            assert int(erth.tx_timestamp) == ctx["probe_ctx"]["tx_ts"]
            assert int(erth.ftype) == P.Ftype.TIMESTAMP
            assert len(beats) == 1 and int(beats[0].keep) == 0
            continue
        send = ctx["send"]
        assert header.kind == PacketKind.DATA
        assert int(header.bth.dqpn) == 0x100 + qpn
        assert int(header.bth.psn) == send["psn"] and int(header.reth.va) == send["va"]
        assert int(header.reth.rkey) == send["rkey"]
        assert int(header.reth.dma_len) == send["dma_len"] == int(header.payload_len)
        # BTH.rtx on a retransmission; BTH.ts and a TSETH stamped with the send time; METH.
        assert int(header.bth.rtx) == send["retransmission"] and int(header.bth.ts) == 1
        assert int(header.tseth.tx_timestamp) == P.wire_timestamp(NOW_NS)
        assert int(header.tseth.ftype) == P.Ftype.TIMESTAMP and int(header.tseth.tsr) == 0
        assert int(header.meth.msn) == send["msn"] and int(header.meth.rqmsn) == send["rqmsn"]
        payload = b"".join(int(b.data).to_bytes(lanes, "little")[:bin(int(b.keep)).count("1")]
                           for b in beats)
        assert payload == host_bytes(send["local_addr"], send["dma_len"])
        assert next(sent_iter) == {"qpn": qpn, "psn": send["psn"], "ev": d["ev"]}
    assert next(sent_iter, None) is None


def test_data_and_probe_packets_with_bubbles_and_backpressure():
    rng = random.Random(5)
    decisions = [decision(rng, rng.randrange(16), probe=rng.random() < 0.2,
                          no_path=rng.random() < 0.1) for _ in range(60)]
    packets, sent, _ = run(decisions, bubbles=0.3, backpressure=0.3, seed=11)
    check(decisions, packets, sent)


def test_full_rate_for_back_to_back_short_packets():
    rng = random.Random(6)
    decisions = [decision(rng, q % 16, length=8) for q in range(40)]
    packets, sent, cycles = run(decisions, bubbles=0.0, backpressure=0.0, seed=3)
    check(decisions, packets, sent)
    # One packet per cycle after a fixed latency (accept, form, header FIFO, memory model).
    assert cycles <= len(decisions) + 8, cycles
