# amaranth: UnusedElaboratable=no
"""EV probes (ENDPOINT_REQUEST/ERTH, ENDPOINT_RESPONSE/EETH): the responder answers every EV
probe field by field, the requester keeps an id table, times the answers from the echoed
timestamp and reports PROBE_OK; everything else, and an answer naming no outstanding probe, is
dropped and counted."""

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
from hdl.packet.headers import PacketKind
from hdl.path.probe import (
    PROBE_RESPONSE_HOP_LIMIT,
    PROBE_RESPONSE_TCLASS,
    PROBE_TABLE_BITS,
    ProbeRequester,
    ProbeResponder,
)
from sim import packets as pk
from sim.defaults import Endpoint
from sim.model.responder import canonical_header, full_header
from sim.rtlpackets import (
    header_from_scapy,
    packet_from_header,
    payload_beats,
    payload_from_scapy,
)
from sim.tb.amsim import StreamCollector, StreamDriver

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


def probe_request(rng, *, op=P.EndpointOp.EV_PROBE):
    return pk.endpoint_request(request_id=rng.getrandbits(16), op=op,
                               tx_timestamp=rng.getrandbits(16), ftype=P.Ftype.TIMESTAMP,
                               **underlay(rng))


def probe_response(rng, *, request_id, tx_timestamp):
    return pk.endpoint_response(request_id=request_id, op=P.EndpointOp.EV_PROBE,
                                tx_timestamp=tx_timestamp, **underlay(rng))


def other_packets(rng):
    """Packets that are not EV probe requests: a three-beat write, a SACK, an endpoint
    response, a port status request and an endpoint request to another QP."""
    return [
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=5, psn=7, va=0x1000, rkey=1,
                       payload=rng.randbytes(20), **underlay(rng)),
        pk.sack_packet(dqpn=5, cack_psn=7, **underlay(rng)),
        probe_response(rng, request_id=1, tx_timestamp=1),
        probe_request(rng, op=P.EndpointOp.PORT_STATUS_UPDATE),
        pk.endpoint_request(request_id=3, op=P.EndpointOp.EV_PROBE, dqpn=7, **underlay(rng)),
    ]


def beats_of(pkt, *, port=0):
    """The parser's output for ``pkt``: its header on every payload beat."""
    header = full_header(header_from_scapy(pkt, CONFIG, port=port), CONFIG)
    payload = payload_from_scapy(pkt)
    return [{"header": header, "data": data, "keep": keep, "first": first, "last": last}
            for data, keep, first, last in payload_beats(payload, CONFIG.data_width)]


def is_request(header):
    return (header["bth"]["opcode"] == P.Opcode.ENDPOINT_REQUEST
            and header["bth"]["dqpn"] == P.ENDPOINT_QPN
            and header["ctl"]["erth"]["op"] == P.EndpointOp.EV_PROBE)


def expected_response(request):
    """The response header for request header ``request`` (a full header dict)."""
    return full_header({
        "kind": PacketKind.EP_RESPONSE, "port": request["port"],
        "eth_dst": request["eth_src"], "eth_src": request["eth_dst"],
        "vlan_valid": request["vlan_valid"], "vlan_tci": request["vlan_tci"],
        "ipv6": request["ipv6"], "ip_src": request["ip_dst"], "ip_dst": request["ip_src"],
        "tclass": PROBE_RESPONSE_TCLASS, "flow_label": request["flow_label"],
        "hop_limit": PROBE_RESPONSE_HOP_LIMIT, "udp_sport": request["udp_sport"],
        "bth": {"opcode": P.Opcode.ENDPOINT_RESPONSE, "pkey": request["bth"]["pkey"],
                "dqpn": P.ENDPOINT_QPN, "psn": request["bth"]["psn"] & 0xFFFF},
        "ctl": {"eeth": {"op": P.EndpointOp.EV_PROBE,
                         "tx_timestamp": request["ctl"]["erth"]["tx_timestamp"]}},
    }, CONFIG)


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
    requests = [beat["header"] for beat in beats if beat["first"] and is_request(beat["header"])]
    result = {}

    async def testbench(ctx):
        await sink.wait(ctx, len(requests), timeout=20 * len(beats) + 100)
        for _ in range(5):          # nothing more comes out
            await ctx.tick()
        result.update(answered=ctx.get(dut.answered), dropped=ctx.get(dut.dropped))

    run(dut, [source.process, sink.process], testbench, [dut.now_ns])
    return requests, sink, result


@pytest.mark.parametrize("bubbles, backpressure", [(0.3, 0.3), (0.0, 0.6)])
def test_responder_answers_every_request_field_by_field(bubbles, backpressure):
    rng = random.Random(1)
    packets = [probe_request(rng) for _ in range(30)]
    packets[5:5] = other_packets(rng)
    requests, sink, counters = responder_run(packets, bubbles=bubbles,
                                             backpressure=backpressure, seed=2)
    got = sink.as_dicts()
    assert len(got) == len(requests) == 30
    for response, request in zip(got, requests, strict=True):
        assert canonical_header(response["header"]) == expected_response(request)
        assert (response["first"], response["last"], response["keep"], response["data"]) == \
            (1, 1, 0, 0)
    assert counters == {"answered": 30, "dropped": 5}


def test_responder_full_throughput():
    """II = 1: back-to-back requests leave back to back, one cycle later."""
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


def test_responder_output_is_an_endpoint_response_frame():
    """The response header, built into a frame as the header builder builds it, parses in Scapy
    as an ENDPOINT_RESPONSE to the endpoint QP echoing the request's id and timestamp."""
    rng = random.Random(4)
    packets = [probe_request(rng) for _ in range(6)]
    _requests, sink, _counters = responder_run(packets, bubbles=0.2, backpressure=0.2, seed=5)
    for request, item in zip(packets, sink.as_dicts(), strict=True):
        frame = Ether(bytes(packet_from_header(canonical_header(item["header"]), b"", CONFIG)))
        ip = IPv6 if IPv6 in request else IP
        assert frame[Ether].dst == request[Ether].src and frame[Ether].src == request[Ether].dst
        assert (frame[ip].src, frame[ip].dst) == (request[ip].dst, request[ip].src)
        assert frame[UDP].sport == request[UDP].sport
        assert frame[UDP].dport == P.ROCEV2_UDP_PORT
        bth, eeth = frame[pk.BTH], frame[pk.EETH]
        assert bth.opcode == P.Opcode.ENDPOINT_RESPONSE and bth.dqpn == P.ENDPOINT_QPN
        assert bth.psn == request[pk.BTH].psn & 0xFFFF
        assert eeth.op == P.EndpointOp.EV_PROBE
        assert eeth.tx_timestamp == request[pk.ERTH].tx_timestamp
        # The frame parses back into the very header the responder sent.
        assert full_header(header_from_scapy(frame, CONFIG, port=item["header"]["port"]),
                           CONFIG) == canonical_header(item["header"])


# ---------------------------------------------------------------------------------------------
# ProbeRequester
# ---------------------------------------------------------------------------------------------

def test_requester_sends_probes_through_path_selection():
    """Each probe gets the next id (BTH.psn[15:0]) and the wire timestamp of the cycle its
    command is taken."""
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
    for n, (command, (_offered, time, _payload), request) in enumerate(
            zip(commands, taken, sink.as_dicts(), strict=True)):
        assert request == {"qpn": command["qpn"], "avoid_ev_valid": 0, "avoid_ev": 0,
                           "probe": 1, "ev": command["ev"],
                           "context": {"probe_id": n, "tx_ts": P.wire_timestamp(time)}}


def send_probes(dut, commands):
    """A testbench step: send ``commands``, return the path requests they became."""
    async def step(ctx):
        requests = []
        ctx.set(dut.o.ready, 1)
        for command in commands:
            ctx.set(dut.cmd.payload, command)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.o.valid)
            requests.append(ctx.get(dut.o.payload))
        ctx.set(dut.cmd.valid, 0)
        await ctx.tick()
        return requests
    return step


def test_requester_measures_the_simulated_delay():
    """Answers arrive a known delay after their probe left; the RTT is that delay in ns (the
    echo's age, across the wire timestamp's and the clock's wrap) and PROBE_OK goes to path
    selection for the probe's QP and EV."""
    dut = ProbeRequester(config=CONFIG)
    rng = random.Random(8)
    probes = [(rng.randrange(CONFIG.qps), rng.randrange(CONFIG.evs_per_profile),
               rng.getrandbits(32), rng.randrange(1, 60)) for _ in range(20)]
    results = StreamCollector(dut.result)
    feedback = StreamCollector(dut.feedback)

    async def network(ctx):
        for qpn, ev, probe_id, delay in probes:
            (request,) = await send_probes(dut, [{"qpn": qpn, "ev": ev,
                                                  "probe_id": probe_id}])(ctx)
            for _ in range(delay - 2):
                await ctx.tick()
            response = probe_response(rng, request_id=request.context.probe_id,
                                      tx_timestamp=request.context.tx_ts)
            (beat,) = beats_of(response)
            ctx.set(dut.rx.payload, beat)
            ctx.set(dut.rx.valid, 1)
            await ctx.tick().until(dut.rx.ready)
            ctx.set(dut.rx.valid, 0)
        await results.wait(ctx, len(probes), timeout=100)
        assert ctx.get(dut.answered) == len(probes)

    run(dut, [results.process, feedback.process], network, [dut.now_ns])
    for (qpn, ev, probe_id, delay), result, fb in zip(
            probes, results.as_dicts(), feedback.as_dicts(), strict=True):
        rtt = delay * NS_PER_CYCLE
        assert result == {"qpn": qpn, "ev": ev, "probe_id": probe_id, "rtt_ns": rtt,
                          "svc_time": 0, "rtt_adjusted_ns": rtt}
        assert fb == {"qpn": qpn, "ev": ev, "kind": P.FeedbackKind.PROBE_OK}


def test_requester_drops_unknown_ids_and_other_packets():
    """Under bubbles and backpressure every answer to an outstanding probe is timed once; an
    EETH whose id names no outstanding probe (never sent, answered already, or forgotten
    after 2**PROBE_TABLE_BITS later probes) is dropped and counted in ``unknown_ids``; a
    packet that is not an EV probe answer in ``rx_dropped``."""
    dut = ProbeRequester(config=CONFIG, results=32)
    rng = random.Random(9)
    slots = 1 << PROBE_TABLE_BITS
    commands = [{"qpn": rng.randrange(CONFIG.qps), "ev": rng.randrange(CONFIG.evs_per_profile),
                 "probe_id": 1000 + n} for n in range(slots + 4)]
    source = StreamDriver(dut.rx, bubbles=0.3, seed=9)
    results = StreamCollector(dut.result, backpressure=0.3, seed=10)
    feedback = StreamCollector(dut.feedback, backpressure=0.5, seed=11)
    expected = []

    async def testbench(ctx):
        requests = await send_probes(dut, commands)(ctx)
        ids = [int(r.context.probe_id) for r in requests]
        # The first four were forgotten when probes 16-19 took their entries.
        good = [(n, probe_response(rng, request_id=ids[n],
                                   tx_timestamp=int(requests[n].context.tx_ts)))
                for n in range(4, slots + 4)]
        unknown = [probe_response(rng, request_id=ids[0], tx_timestamp=0),     # forgotten
                   probe_response(rng, request_id=ids[-1] + 1, tx_timestamp=0),  # never sent
                   good[3][1]]                                                   # answered
        bad = [probe_request(rng),
               pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=1, va=0, rkey=0,
                              payload=rng.randbytes(30)),
               pk.endpoint_response(request_id=ids[5], op=P.EndpointOp.PORT_STATUS_UPDATE)]
        packets = [pkt for _, pkt in good[:6]] + unknown + bad + [pkt for _, pkt in good[6:]]
        expected.extend(commands[n] for n, _ in good)
        source.send([beat for pkt in packets for beat in beats_of(pkt)])
        await results.wait(ctx, len(good), timeout=2000)
        await feedback.wait(ctx, len(good), timeout=2000)
        for _ in range(5):
            await ctx.tick()
        assert (ctx.get(dut.answered), ctx.get(dut.unknown_ids), ctx.get(dut.rx_dropped)) == \
            (len(good), len(unknown), len(bad))
        assert ctx.get(dut.results_dropped) == 0

    run(dut, [source.process, results.process, feedback.process], testbench, [dut.now_ns])
    got = results.as_dicts()
    assert [(r["qpn"], r["ev"], r["probe_id"]) for r in got] == \
        [(c["qpn"], c["ev"], c["probe_id"]) for c in expected]
    assert all(r["rtt_ns"] % 8 == 0 and r["rtt_ns"] == r["rtt_adjusted_ns"] for r in got)
    assert [(f["qpn"], f["ev"], f["kind"]) for f in feedback.as_dicts()] == \
        [(c["qpn"], c["ev"], P.FeedbackKind.PROBE_OK) for c in expected]


def test_requester_never_waits_for_results():
    """Nobody reads ``result``: answers keep flowing (their PROBE_OK feedback with them),
    the result FIFO keeps the first ``results`` and counts the rest dropped; once read, the
    kept results come out in order. (Before the FIFO, one unread result stopped the receive
    path: the feedback wait below timed out.)"""
    depth = 4
    dut = ProbeRequester(config=CONFIG, results=depth)
    rng = random.Random(15)
    commands = [{"qpn": rng.randrange(CONFIG.qps), "ev": rng.randrange(CONFIG.evs_per_profile),
                 "probe_id": n} for n in range(12)]
    source = StreamDriver(dut.rx, bubbles=0.3, seed=15)
    results = StreamCollector(dut.result, backpressure=1.0, seed=16)     # nobody reads
    feedback = StreamCollector(dut.feedback, backpressure=0.3, seed=17)

    async def testbench(ctx):
        requests = await send_probes(dut, commands)(ctx)
        source.send([beat for r in requests for beat in beats_of(probe_response(
            rng, request_id=int(r.context.probe_id), tx_timestamp=int(r.context.tx_ts)))])
        await feedback.wait(ctx, len(commands), timeout=400)
        for _ in range(5):
            await ctx.tick()
        assert ctx.get(dut.answered) == len(commands)
        assert ctx.get(dut.results_dropped) == len(commands) - depth
        assert results.items == []
        results.backpressure = 0.3                  # software reads now
        await results.wait(ctx, depth, timeout=200)
        for _ in range(20):
            await ctx.tick()

    run(dut, [source.process, results.process, feedback.process], testbench, [dut.now_ns])
    assert [(f["qpn"], f["ev"]) for f in feedback.as_dicts()] == \
        [(c["qpn"], c["ev"]) for c in commands]
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
                request = pk.endpoint_request(request_id=probe.context.probe_id,
                                              op=P.EndpointOp.EV_PROBE,
                                              tx_timestamp=probe.context.tx_ts,
                                              ftype=P.Ftype.TIMESTAMP)
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
        assert result["rtt_ns"] >= 5 * NS_PER_CYCLE and result["svc_time"] == 0
    assert [(f["qpn"], f["ev"]) for f in feedback.as_dicts()] == \
        [(c["qpn"], c["ev"]) for c in commands]


def test_config_must_be_a_nic_config():
    with pytest.raises(TypeError, match="config must be a NicConfig, not None"):
        ProbeResponder(config=None)
    with pytest.raises(TypeError, match="config must be a NicConfig, not 'x'"):
        ProbeRequester(config="x")
