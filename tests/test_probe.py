# amaranth: UnusedElaboratable=no
"""EV probes: the responder answers every probe request field by field, the requester times the
responses and reports PROBE_OK; everything else is dropped and counted."""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind, packet_header_layout
from hdl.path.probe import (
    PROBE_RESPONSE_HOP_LIMIT,
    PROBE_RESPONSE_TCLASS,
    ProbeRequester,
    ProbeResponder,
)
from sim import packets as pk
from sim.defaults import Endpoint
from sim.rtlpackets import header_from_scapy, packet_from_header, payload_beats
from sim.tb.amsim import StreamCollector, StreamDriver, const_to_dict

CONFIG = NicConfig(qps=16, evs_per_profile=12)
NS_PER_CYCLE = 8
NOW_START = (1 << 32) - 40 * NS_PER_CYCLE      # the clock wraps during every test
MASK32 = (1 << 32) - 1


# ---------------------------------------------------------------------------------------------
# Packets
# ---------------------------------------------------------------------------------------------

def endpoint(rng, name):
    mac = ":".join(f"{b:02x}" for b in [2, *rng.randbytes(5)])
    ipv4 = ".".join(str(rng.randrange(1, 255)) for _ in range(4))
    ipv6 = "fd00::" + ":".join(f"{rng.getrandbits(16):x}" for _ in range(4))
    return Endpoint(name, mac, ipv4, ipv6)


def underlay(rng):
    ip_version = rng.choice([4, 6])
    return dict(ip_version=ip_version, src=endpoint(rng, "src"), dst=endpoint(rng, "dst"),
                udp_sport=rng.getrandbits(16),
                flow_label=rng.getrandbits(20) if ip_version == 6 else 0,
                dscp=rng.randrange(64), ecn=rng.randrange(4), hop_limit=rng.randrange(1, 256),
                vlan=rng.choice([None, rng.randrange(1, 4095)]))


def probe_request(rng):
    return pk.probe_packet(dqpn=rng.getrandbits(24), probe_id=rng.getrandbits(32),
                           ev_index=rng.getrandbits(16), src_qpn=rng.getrandbits(24),
                           tx_ts=rng.getrandbits(32), **underlay(rng))


def probe_response(rng, *, dqpn, ev_index, probe_id, tx_ts, svc_time=None):
    flags = 0 if svc_time is None else P.ProbeFlags.SERVICE_TIME
    return pk.probe_packet(response=True, dqpn=dqpn, probe_id=probe_id, ev_index=ev_index,
                           src_qpn=rng.getrandbits(24), tx_ts=tx_ts, svc_time=svc_time or 0,
                           flags=flags, **underlay(rng))


def other_packets(rng):
    """Packets that are not probe requests: a three-beat write, an ACK, a probe response."""
    return [
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=5, psn=7, va=0x1000, rkey=1,
                       payload=rng.randbytes(20), **underlay(rng)),
        pk.ack_packet(dqpn=5, psn=7, cum_psn=7, **underlay(rng)),
        probe_response(rng, dqpn=1, ev_index=1, probe_id=1, tx_ts=1),
    ]


def beats_of(pkt, *, port=0):
    """The parser's output for ``pkt``: its header on every payload beat."""
    header = header_from_scapy(pkt, CONFIG, port=port)
    payload = bytes(pkt[pk.MDETH].payload) if pk.MDETH in pkt else b""
    return [{"header": header, "data": data, "keep": keep, "first": first, "last": last}
            for data, keep, first, last in payload_beats(payload, CONFIG.data_width)]


def zero_header():
    return const_to_dict(packet_header_layout(CONFIG).const({}))


def merged(header):
    """A header dict from header_from_scapy (only the fields a frame has) over all zeros."""
    full = zero_header()
    for name, value in header.items():
        if isinstance(value, dict):
            full[name].update(value)
        else:
            full[name] = value.value if isinstance(value, PacketKind) else int(value)
    return full


def expected_response(request, svc_time):
    """The response header for request header ``request`` (a dict from header_from_scapy)."""
    response = zero_header()
    mprh = request["mprh"]
    response.update(
        kind=PacketKind.PROBE.value, port=request["port"],
        eth_dst=request["eth_src"], eth_src=request["eth_dst"],
        vlan_valid=request.get("vlan_valid", 0), vlan_tci=request.get("vlan_tci", 0),
        ipv6=request["ipv6"], ip_src=request["ip_dst"], ip_dst=request["ip_src"],
        tclass=PROBE_RESPONSE_TCLASS, flow_label=request["flow_label"],
        hop_limit=PROBE_RESPONSE_HOP_LIMIT, udp_sport=request["udp_sport"])
    response["bth"].update(opcode=P.Opcode.PROBE_RESPONSE, pkey=request["bth"]["pkey"],
                           dqpn=mprh["src_qpn"])
    response["mprh"].update(probe_id=mprh["probe_id"], ev_index=mprh["ev_index"],
                            flags=P.ProbeFlags.SERVICE_TIME, src_qpn=mprh["src_qpn"],
                            tx_ts=mprh["tx_ts"], svc_time=svc_time)
    return response


# ---------------------------------------------------------------------------------------------
# Simulation helpers
# ---------------------------------------------------------------------------------------------

def run(dut, processes, testbench, clocks):
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def clock(ctx):
        now = NOW_START
        while True:
            for signal in clocks:
                ctx.set(signal, now)
            await ctx.tick()
            now = (now + NS_PER_CYCLE) & MASK32

    sim.add_process(clock)
    for process in processes:
        sim.add_process(process)
    sim.add_testbench(testbench)
    sim.run()


def transfer_monitor(stream, now, log, *, first_only=True):
    """A process logging ``(offered_ns, taken_ns, payload)`` for every transfer on ``stream``:
    the time of the first cycle the payload was offered and of the cycle it was taken."""
    async def process(ctx):
        offered = None
        async for _clk, _rst, valid, ready, payload, time in ctx.tick().sample(
                stream.valid, stream.ready, stream.payload, now):
            if valid and offered is None:
                offered = time
            if valid and ready:
                if not first_only or payload.first:
                    log.append((offered, time, payload))
                offered = None
    return process


# ---------------------------------------------------------------------------------------------
# ProbeResponder
# ---------------------------------------------------------------------------------------------

def responder_run(packets, *, bubbles, backpressure, seed):
    dut = ProbeResponder(config=CONFIG)
    rng = random.Random(seed)
    beats = [beat for pkt in packets for beat in beats_of(pkt, port=rng.randrange(8))]
    source = StreamDriver(dut.i, bubbles=bubbles, seed=seed)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=seed + 1)
    source.send(beats)
    taken = []
    requests = sum(1 for beat in beats
                   if beat["header"]["bth"]["opcode"] == P.Opcode.PROBE_REQUEST)
    result = {}

    async def testbench(ctx):
        await sink.wait(ctx, requests, timeout=20 * len(beats) + 100)
        for _ in range(5):          # nothing more comes out
            await ctx.tick()
        result.update(answered=ctx.get(dut.answered), dropped=ctx.get(dut.dropped))

    run(dut, [source.process, sink.process,
              transfer_monitor(dut.i, dut.now_ns, taken)], testbench, [dut.now_ns])
    return beats, taken, sink, result


@pytest.mark.parametrize("bubbles, backpressure", [(0.3, 0.3), (0.0, 0.6)])
def test_responder_answers_every_request_field_by_field(bubbles, backpressure):
    rng = random.Random(1)
    packets = [probe_request(rng) for _ in range(30)]
    packets[5:5] = other_packets(rng)
    beats, taken, sink, counters = responder_run(packets, bubbles=bubbles,
                                                 backpressure=backpressure, seed=2)
    want = [expected_response(const_to_dict(payload.header), (time - offered) & MASK32)
            for offered, time, payload in taken
            if payload.header.bth.opcode == P.Opcode.PROBE_REQUEST]
    got = sink.as_dicts()
    assert len(got) == len(want) == 30
    for response, expected in zip(got, want, strict=True):
        assert response["header"] == expected
        assert (response["first"], response["last"], response["keep"], response["data"]) == \
            (1, 1, 0, 0)
    assert counters == {"answered": 30, "dropped": 3}
    if backpressure:                # some requests waited: the service time says how long
        assert any(response["header"]["mprh"]["svc_time"] for response in got)


def test_responder_full_throughput():
    """II = 1: back-to-back requests leave back to back, one cycle later, 0 ns service time."""
    rng = random.Random(3)
    packets = [probe_request(rng) for _ in range(20)]
    dut = ProbeResponder(config=CONFIG)
    source = StreamDriver(dut.i)
    sink = StreamCollector(dut.o)
    source.send([beat for pkt in packets for beat in beats_of(pkt)])
    cycles = {}

    async def testbench(ctx):
        for cycle in range(100):
            if len(sink.items) == 20:
                cycles["done"] = cycle
                break
            await ctx.tick()

    run(dut, [source.process, sink.process], testbench, [dut.now_ns])
    assert sink.cycles_valid == 20
    assert cycles["done"] <= 20 + 3
    assert all(item.header.mprh.svc_time == 0 for item in sink.items)


def test_responder_output_is_a_probe_response_frame():
    """The response header, built into a frame as the header builder builds it, parses in Scapy
    as a PROBE_RESPONSE to the requester with the request's MPRH echoed and a valid ICRC."""
    rng = random.Random(4)
    packets = [probe_request(rng) for _ in range(6)]
    _beats, _taken, sink, _counters = responder_run(packets, bubbles=0.2, backpressure=0.2,
                                                    seed=5)
    for request, item in zip(packets, sink.as_dicts(), strict=True):
        frame = Ether(bytes(packet_from_header(item["header"], b"", CONFIG)))
        ip = IPv6 if IPv6 in request else IP
        assert frame[Ether].dst == request[Ether].src and frame[Ether].src == request[Ether].dst
        assert (frame[ip].src, frame[ip].dst) == (request[ip].dst, request[ip].src)
        assert frame[UDP].sport == request[UDP].sport
        assert frame[UDP].dport == P.ROCEV2_UDP_PORT
        bth, mprh = frame[pk.BTH], frame[pk.MPRH]
        assert bth.opcode == P.Opcode.PROBE_RESPONSE
        assert bth.dqpn == request[pk.MPRH].src_qpn
        for name in ("probe_id", "ev_index", "src_qpn", "tx_ts"):
            assert getattr(mprh, name) == getattr(request[pk.MPRH], name)
        assert mprh.flags == P.ProbeFlags.SERVICE_TIME
        # The frame parses back into the very header the responder sent: nothing in it is lost
        # or out of range when the builder writes it.
        assert merged(header_from_scapy(frame, CONFIG, port=item["header"]["port"])) == \
            item["header"]


# ---------------------------------------------------------------------------------------------
# ProbeRequester
# ---------------------------------------------------------------------------------------------

def test_requester_sends_probes_through_path_selection():
    dut = ProbeRequester(config=CONFIG)
    rng = random.Random(6)
    commands = [{"qpn": rng.randrange(CONFIG.qps), "ev": rng.randrange(CONFIG.evs_per_profile),
                 "probe_id": rng.getrandbits(32)} for _ in range(25)]
    source = StreamDriver(dut.cmd, bubbles=0.3, seed=6)
    sink = StreamCollector(dut.o, backpressure=0.3, seed=7)
    source.send(commands)
    taken = []

    async def testbench(ctx):
        await sink.wait(ctx, len(commands), timeout=500)
        assert ctx.get(dut.sent) == len(commands)

    run(dut, [source.process, sink.process,
              transfer_monitor(dut.cmd, dut.now_ns, taken, first_only=False)],
        testbench, [dut.now_ns])
    for command, (_offered, time, _payload), request in zip(commands, taken, sink.as_dicts(),
                                                            strict=True):
        assert request == {"qpn": command["qpn"], "avoid_ev_valid": 0, "avoid_ev": 0,
                           "probe": 1, "ev": command["ev"],
                           "context": {"probe_id": command["probe_id"], "tx_ts": time}}


def test_requester_measures_the_simulated_delay():
    """Responses arrive a known delay after their probe left; the RTT is that delay in ns (over
    the 2**32 wrap), the adjusted RTT that minus the service time, and PROBE_OK goes to path
    selection for the EV."""
    dut = ProbeRequester(config=CONFIG)
    rng = random.Random(8)
    probes = [(rng.randrange(CONFIG.qps), rng.randrange(CONFIG.evs_per_profile),
               rng.getrandbits(32), rng.randrange(1, 60), rng.choice([None, 0, 40, 10_000]))
              for _ in range(20)]
    results = StreamCollector(dut.result)
    feedback = StreamCollector(dut.feedback)

    async def network(ctx):
        for qpn, ev, probe_id, delay, svc_time in probes:
            ctx.set(dut.cmd.payload, {"qpn": qpn, "ev": ev, "probe_id": probe_id})
            ctx.set(dut.cmd.valid, 1)
            ctx.set(dut.o.ready, 1)
            await ctx.tick().until(dut.o.valid)
            ctx.set(dut.cmd.valid, 0)
            request = ctx.get(dut.o.payload)
            for _ in range(delay - 1):
                await ctx.tick()
            response = probe_response(rng, dqpn=qpn, ev_index=ev, probe_id=probe_id,
                                      tx_ts=request.context.tx_ts, svc_time=svc_time)
            (beat,) = beats_of(response)
            ctx.set(dut.rx.payload, beat)
            ctx.set(dut.rx.valid, 1)
            await ctx.tick().until(dut.rx.ready)
            ctx.set(dut.rx.valid, 0)
        await results.wait(ctx, len(probes), timeout=100)
        assert ctx.get(dut.answered) == len(probes)

    run(dut, [results.process, feedback.process], network, [dut.now_ns])
    for (qpn, ev, probe_id, delay, svc_time), result, fb in zip(
            probes, results.as_dicts(), feedback.as_dicts(), strict=True):
        rtt = delay * NS_PER_CYCLE
        service = svc_time or 0
        assert result == {"qpn": qpn, "ev": ev, "probe_id": probe_id, "rtt_ns": rtt,
                          "svc_time": service, "rtt_adjusted_ns": max(rtt - service, 0)}
        assert fb == {"qpn": qpn, "ev": ev, "kind": P.FeedbackKind.PROBE_OK}


def test_requester_drops_what_it_cannot_time():
    """Under bubbles and backpressure every response is timed once; packets that are not probe
    responses, or name a QP or EV the build does not hold, are dropped and counted."""
    dut = ProbeRequester(config=CONFIG, results=32)
    rng = random.Random(9)
    good = [probe_response(rng, dqpn=rng.randrange(CONFIG.qps),
                           ev_index=rng.randrange(CONFIG.evs_per_profile),
                           probe_id=rng.getrandbits(32), tx_ts=rng.getrandbits(32),
                           svc_time=rng.choice([None, rng.getrandbits(12)]))
            for _ in range(25)]
    bad = [probe_request(rng),
           pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=1, va=0, rkey=0,
                          payload=rng.randbytes(30)),
           probe_response(rng, dqpn=CONFIG.qps, ev_index=0, probe_id=1, tx_ts=0),
           probe_response(rng, dqpn=0, ev_index=CONFIG.evs_per_profile, probe_id=1, tx_ts=0)]
    packets = good[:10] + bad + good[10:]
    source = StreamDriver(dut.rx, bubbles=0.3, seed=9)
    results = StreamCollector(dut.result, backpressure=0.3, seed=10)
    feedback = StreamCollector(dut.feedback, backpressure=0.5, seed=11)
    source.send([beat for pkt in packets for beat in beats_of(pkt)])
    taken = []

    async def testbench(ctx):
        await results.wait(ctx, len(good), timeout=1000)
        await feedback.wait(ctx, len(good), timeout=1000)
        for _ in range(5):
            await ctx.tick()
        assert (ctx.get(dut.answered), ctx.get(dut.rx_dropped)) == (len(good), len(bad))
        assert ctx.get(dut.results_dropped) == 0

    run(dut, [source.process, results.process, feedback.process,
              transfer_monitor(dut.rx, dut.now_ns, taken)], testbench, [dut.now_ns])
    timed = [(time, payload) for _offered, time, payload in taken
             if payload.header.bth.opcode == P.Opcode.PROBE_RESPONSE
             and payload.header.bth.dqpn < CONFIG.qps
             and payload.header.mprh.ev_index < CONFIG.evs_per_profile]
    assert len(timed) == len(good) == len(results.items) == len(feedback.items)
    for (time, payload), result, fb in zip(timed, results.as_dicts(), feedback.as_dicts(),
                                           strict=True):
        mprh = payload.header.mprh
        rtt = (time - mprh.tx_ts) & MASK32
        service = mprh.svc_time if mprh.flags & P.ProbeFlags.SERVICE_TIME else 0
        assert result == {"qpn": payload.header.bth.dqpn, "ev": mprh.ev_index,
                          "probe_id": mprh.probe_id, "rtt_ns": rtt, "svc_time": service,
                          "rtt_adjusted_ns": max(rtt - service, 0)}
        assert fb == {"qpn": result["qpn"], "ev": result["ev"],
                      "kind": P.FeedbackKind.PROBE_OK}


def test_requester_never_waits_for_results():
    """Nobody reads ``result``: responses keep flowing (their PROBE_OK feedback with them),
    the result FIFO keeps the first ``results`` and counts the rest dropped; once read, the
    kept results come out in order. (Before the FIFO, one unread result stopped the receive
    path: the feedback wait below timed out.)"""
    depth = 4
    dut = ProbeRequester(config=CONFIG, results=depth)
    rng = random.Random(15)
    probes = [(rng.randrange(CONFIG.qps), rng.randrange(CONFIG.evs_per_profile), n)
              for n in range(12)]
    packets = [probe_response(rng, dqpn=qpn, ev_index=ev, probe_id=probe_id,
                              tx_ts=rng.getrandbits(32)) for qpn, ev, probe_id in probes]
    source = StreamDriver(dut.rx, bubbles=0.3, seed=15)
    results = StreamCollector(dut.result, backpressure=1.0, seed=16)     # nobody reads
    feedback = StreamCollector(dut.feedback, backpressure=0.3, seed=17)
    source.send([beat for pkt in packets for beat in beats_of(pkt)])

    async def testbench(ctx):
        await feedback.wait(ctx, len(probes), timeout=400)
        for _ in range(5):
            await ctx.tick()
        assert ctx.get(dut.answered) == len(probes)
        assert ctx.get(dut.results_dropped) == len(probes) - depth
        assert results.items == []
        results.backpressure = 0.3                  # software reads now
        await results.wait(ctx, depth, timeout=200)
        for _ in range(20):
            await ctx.tick()

    run(dut, [source.process, results.process, feedback.process], testbench, [dut.now_ns])
    assert [(f["qpn"], f["ev"]) for f in feedback.as_dicts()] == \
        [(qpn, ev) for qpn, ev, _ in probes]
    assert [r["probe_id"] for r in results.as_dicts()] == list(range(depth))


@pytest.mark.parametrize("results", [1, 1025, True, 4.0])
def test_requester_result_depth_is_checked(results):
    with pytest.raises(ValueError, match="results must be an integer from 2 to 1024"):
        ProbeRequester(config=CONFIG, results=results)


# ---------------------------------------------------------------------------------------------
# Requester and responder in one loop
# ---------------------------------------------------------------------------------------------

class ProbeLoop(wiring.Component):
    """A requester whose probes (turned into request headers by the test, standing in for path
    selection, the transmit former and the network) reach a responder, whose responses go
    straight back to the requester."""

    def __init__(self, config):
        self.requester = ProbeRequester(config=config)
        self.responder = ProbeResponder(config=config)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.requester = self.requester
        m.submodules.responder = self.responder
        wiring.connect(m, self.responder.o, self.requester.rx)
        return m


def test_probe_loop():
    dut = ProbeLoop(CONFIG)
    requester, responder = dut.requester, dut.responder
    rng = random.Random(12)
    commands = [{"qpn": rng.randrange(CONFIG.qps), "ev": rng.randrange(CONFIG.evs_per_profile),
                 "probe_id": n} for n in range(20)]
    source = StreamDriver(requester.cmd, bubbles=0.3, seed=12)
    results = StreamCollector(requester.result, backpressure=0.3, seed=13)
    feedback = StreamCollector(requester.feedback, backpressure=0.3, seed=14)
    source.send(commands)

    async def network(ctx):
        """Path selection, transmit former and wire: each probe reaches the responder 5 to 15
        cycles after it left the requester."""
        ctx.set(requester.o.ready, 1)
        in_flight, wire = [], []
        async for _clk, _rst, sent, probe, offered, taken in ctx.tick().sample(
                requester.o.valid, requester.o.payload, responder.i.valid, responder.i.ready):
            if offered and taken:
                wire.pop(0)
            if sent:
                request = pk.probe_packet(dqpn=0, probe_id=probe.context.probe_id,
                                          ev_index=probe.ev, src_qpn=probe.qpn,
                                          tx_ts=probe.context.tx_ts)
                in_flight.append([rng.randrange(5, 15), beats_of(request)[0]])
            for flight in in_flight:
                flight[0] -= 1
            while in_flight and in_flight[0][0] <= 0:
                wire.append(in_flight.pop(0)[1])
            if wire:
                ctx.set(responder.i.payload, wire[0])
            ctx.set(responder.i.valid, bool(wire))

    async def testbench(ctx):
        await results.wait(ctx, len(commands), timeout=2000)

    run(dut, [source.process, results.process, feedback.process, network], testbench,
        [requester.now_ns, responder.now_ns])
    got = results.as_dicts()
    assert [r["probe_id"] for r in got] == list(range(20))
    for command, result in zip(commands, got, strict=True):
        assert (result["qpn"], result["ev"]) == (command["qpn"], command["ev"])
        assert result["rtt_ns"] >= result["svc_time"] + 5 * NS_PER_CYCLE
        assert result["rtt_adjusted_ns"] == result["rtt_ns"] - result["svc_time"]
    assert [(f["qpn"], f["ev"]) for f in feedback.as_dicts()] == \
        [(c["qpn"], c["ev"]) for c in commands]


def test_config_must_be_a_nic_config():
    with pytest.raises(TypeError, match="config must be a NicConfig, not None"):
        ProbeResponder(config=None)
    with pytest.raises(TypeError, match="config must be a NicConfig, not 'x'"):
        ProbeRequester(config="x")
