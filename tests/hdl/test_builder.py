"""The header builder against Scapy: every frame byte-identical, at full rate, with noise."""

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from scapy.compat import raw

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet import layouts as L
from hdl.packet.builder import (
    CONTROL_SIZES,
    LAYOUT_COUNT,
    HeaderBuilder,
    Transport,
    header_bytes,
)
from hdl.packet.builder import decode_layout_id as decode_lid
from hdl.packet.headers import KIND_OPCODES, PacketKind
from sim import packets as pk
from sim import rtlpackets as rp
from sim.defaults import Endpoint
from sim.samples import sample_packets

CONFIGS = {
    "w64": NicConfig(),
    "w128": NicConfig(data_width=128),
}


# ---------------------------------------------------------------------------------------------
# Bench
# ---------------------------------------------------------------------------------------------

class BuilderBench:
    """Drive ``(header, payload)`` packets through a HeaderBuilder and collect the frames.

    ``bubbles`` is the probability of an idle input cycle before each beat, ``backpressure``
    the probability that ``o.ready`` is low in a cycle. The output trace (``o.valid`` per
    cycle from the first output beat on) is kept for the throughput checks.
    """

    def __init__(self, config, *, seed=0, bubbles=0.0, backpressure=0.0):
        self.config = config
        self.dut = HeaderBuilder(config=config)
        self.rng_in = random.Random(seed)
        self.rng_out = random.Random(seed + 1)
        self.bubbles = bubbles
        self.backpressure = backpressure

    def run(self, packets, *, max_cycles=200_000):
        dut, config = self.dut, self.config
        lanes = config.data_width // 8
        frames, ports, trace = [], [], []
        result = {}

        async def producer(ctx):
            for header, payload in packets:
                ctx.set(dut.i.payload.header, header)
                for data, keep, first, last in rp.payload_beats(payload, config.data_width):
                    while self.rng_in.random() < self.bubbles:
                        ctx.set(dut.i.valid, 0)
                        await ctx.tick()
                    ctx.set(dut.i.payload.data, data)
                    ctx.set(dut.i.payload.keep, keep)
                    ctx.set(dut.i.payload.first, first)
                    ctx.set(dut.i.payload.last, last)
                    ctx.set(dut.i.valid, 1)
                    await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)

        async def consumer(ctx):
            beats, frame_ports = [], set()
            started = False
            held = None                     # a beat offered but not taken
            for _ in range(max_cycles):
                ready = self.rng_out.random() >= self.backpressure
                ctx.set(dut.o.ready, ready)
                _, _, valid, beat = await ctx.tick().sample(dut.o.valid, dut.o.payload)
                if held is not None:
                    assert valid and beat.as_bits() == held, "a beat must wait to be taken"
                held = beat.as_bits() if valid and not ready else None
                if valid:
                    started = True
                if started:
                    trace.append(bool(valid))
                if not (valid and ready):
                    continue
                assert bool(beat.first) == (not beats), "first must mark exactly beat 0"
                if not beat.last:
                    assert beat.keep == (1 << lanes) - 1, "only the last beat may be partial"
                beats.append((beat.data, beat.keep))
                frame_ports.add(beat.port)
                if beat.last:
                    frames.append(rp.frame_from_beats(beats, config.data_width))
                    assert len(frame_ports) == 1, "port must be stable over a frame"
                    ports.append(frame_ports.pop())
                    beats = []
                    if len(frames) == len(packets):
                        break
            else:
                raise AssertionError(f"only {len(frames)} of {len(packets)} frames after "
                                     f"{max_cycles} cycles")
            await ctx.tick().repeat(4)      # let the length check settle
            result["length_errors"] = ctx.get(dut.length_errors)

        sim = Simulator(dut)
        sim.add_clock(1e-8)
        sim.add_testbench(producer)
        sim.add_testbench(consumer)
        sim.run()
        self.trace = trace
        self.length_errors = result["length_errors"]
        self.ports = ports
        return frames


def idle_cycles(trace):
    """Cycles without an output beat between the first and the last output beat."""
    last = max(n for n, valid in enumerate(trace) if valid)
    return trace[:last + 1].count(False)


def as_packet(pkt, config, *, port=0):
    """``(header dict, payload)`` of a Scapy frame, as the builder's input carries it."""
    return rp.header_from_scapy(pkt, config, port=port), rp.payload_from_scapy(pkt)


def first_difference(a, b):
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def assert_frames_equal(frames, expected, *, check_icrc=True):
    """Byte for byte; and Scapy's ICRC check (which cannot hold when the IP length says the
    packet ends before the bytes do: Scapy then drops the rest as padding)."""
    assert len(frames) == len(expected)
    for n, (frame, want) in enumerate(zip(frames, expected, strict=True)):
        assert frame == want, (f"frame {n} differs from byte {first_difference(frame, want)}:"
                               f"\n got {frame.hex()}\nwant {want.hex()}")
        if check_icrc:
            assert pk.icrc_ok(frame), f"frame {n}: bad ICRC"


# ---------------------------------------------------------------------------------------------
# Random packets through the sim.packets builders
# ---------------------------------------------------------------------------------------------

def random_endpoint(rng, name):
    mac = ":".join(f"{b:02x}" for b in [0x02] + [rng.randrange(256) for _ in range(5)])
    ipv4 = ".".join(str(rng.randrange(1, 255)) for _ in range(4))
    ipv6 = ":".join(f"{rng.randrange(1 << 16):x}" for _ in range(8))
    return Endpoint(name, mac, ipv4, ipv6)


def random_underlay(rng, *, ip_version=None):
    ip_version = ip_version or rng.choice((4, 6))
    return dict(
        ip_version=ip_version, src=random_endpoint(rng, "s"), dst=random_endpoint(rng, "d"),
        udp_sport=rng.randrange(1 << 16),
        flow_label=rng.randrange(1 << 20) if ip_version == 6 else 0,
        dscp=rng.randrange(64), ecn=rng.randrange(4), hop_limit=rng.randrange(256),
        vlan=rng.choice((None, rng.randrange(1, 4095))))


def random_fields(rng, header, skip=()):
    """Every field of ``header`` random over its whole range."""
    return {f.name: rng.randint(f.minimum, f.maximum) for f in header.fields
            if f.name not in skip}


def random_data(rng, config, *, payload_len=None, **kw):
    opcode = rng.choice(sorted(P.DATA_OPCODES))
    if payload_len is None:
        payload_len = rng.choice((0, 1, 2, 3, 4, 5, rng.randrange(config.mtu + 1), config.mtu))
    return pk.data_packet(
        opcode, dqpn=rng.randrange(1 << 24), psn=rng.randrange(1 << 24),
        va=rng.randrange(1 << 64), rkey=rng.randrange(1 << 32),
        payload=rng.randbytes(payload_len),
        imm=rng.randrange(1 << 32) if opcode in P.IMMEDIATE_OPCODES else None,
        rqmsn=rng.randrange(1 << 16), msn=rng.randrange(1 << 16), rtx=rng.random() < 0.5,
        tseth=random_fields(rng, L.TSETH) if rng.random() < 0.75 else None,
        ackreq=rng.randrange(2),
        **(random_underlay(rng, ip_version=kw.pop("ip_version", None)) | kw))


def random_control(rng, config, *, opcode=None, **kw):
    """A control packet (of a random kind unless ``opcode`` is given), every field random."""
    opcode = opcode if opcode is not None else rng.choice(sorted(L.CONTROL_HEADERS))
    kw = random_underlay(rng, ip_version=kw.pop("ip_version", None)) | kw
    dqpn, psn = rng.randrange(1 << 24), rng.randrange(1 << 24)
    if opcode == P.Opcode.ACKNOWLEDGE:
        return pk.ack_packet(dqpn=dqpn, psn=psn, **random_fields(rng, L.AETH), **kw)
    if opcode == P.Opcode.RELIABILITY_SACK:
        return pk.sack_packet(dqpn=dqpn, cack_psn=psn,
                              **random_fields(rng, L.SETH, skip=("cack_psn",)),
                              cc_state=random_fields(rng, L.CC_STATE), **kw)
    if opcode == P.Opcode.RELIABILITY_NACK:
        return pk.nack_packet(dqpn=dqpn, nack_psn=psn,
                              nack_reason=rng.choice(list(P.NackReason)),
                              **random_fields(rng, L.NETH, skip=("nack_psn", "nack_reason")),
                              **kw)
    if opcode == P.Opcode.RELIABILITY_PROBE_REQUEST:
        return pk.probe_packet(dqpn=dqpn, psn=psn, **random_fields(rng, L.PETH), **kw)
    request = opcode == P.Opcode.ENDPOINT_REQUEST
    builder = pk.endpoint_request if request else pk.endpoint_response
    return builder(request_id=rng.randrange(1 << 16), op=rng.choice(list(P.EndpointOp)),
                   dqpn=dqpn, **random_fields(rng, L.ERTH if request else L.EETH, skip=("op",)),
                   **kw)


def random_srv6(rng, config):
    inner = random_data(rng, config, ip_version=6, vlan=None)
    segment = rng.randbytes(16) if rng.random() < 0.5 else None
    return pk.srv6_encapsulate(inner, dst=rng.randbytes(16), segment=segment)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def test_parameters():
    with pytest.raises(TypeError, match="NicConfig"):
        HeaderBuilder(config=64)
    dut = HeaderBuilder(config=NicConfig())
    Fragment.get(dut, None)             # elaborates (and is not left unused)
    assert dut.config == NicConfig()


def _layouts():
    """Every layout id in use (the SRv6 code 3 is not)."""
    return [lid for lid in range(LAYOUT_COUNT) if (lid >> 1) & 3 != 3]


def _transport_kinds(transport):
    """``[(kind, opcode)]`` a transport code stands for."""
    if transport < Transport.CONTROL:
        opcode = (P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE if transport & 2
                  else P.Opcode.RDMA_WRITE_ONLY)
        return [(PacketKind.DATA, opcode)]
    size = CONTROL_SIZES[transport - Transport.CONTROL]
    return [(kind, opcode) for kind, opcode in KIND_OPCODES.items()
            if L.headers_size(L.CONTROL_HEADERS[opcode]) == size]


def test_layout_table_matches_scapy():
    """The elaboration-time header length of each of the 96 layouts is Scapy's, for every
    kind the layout stands for."""
    config = NicConfig()
    assert len(_layouts()) == 96
    for lid in _layouts():
        vlan, srv6, ipv6, transport = decode_lid(lid)
        for kind, opcode in _transport_kinds(transport):
            header = {"vlan_valid": vlan, "srv6_valid": int(srv6 > 0),
                      "srh_valid": int(srv6 == 2), "ipv6": ipv6, "kind": kind,
                      "bth": {"opcode": opcode, "ts": transport & 1 if kind == PacketKind.DATA
                              else 0}}
            frame = raw(rp.packet_from_header(header, b"", config))
            assert len(frame) == header_bytes(lid) + P.ICRC_BYTES, (lid, kind)


def test_rtlpackets_round_trip():
    """sim.rtlpackets: header struct and payload of each sample rebuild the same frame, and
    frames the NIC cannot build are refused."""
    config = NicConfig()
    for sample in sample_packets():
        if sample.name == "trimmed":
            continue
        header = rp.header_from_scapy(sample.packet, config)
        payload = rp.payload_from_scapy(sample.packet)
        assert header["payload_len"] == len(payload)
        assert raw(rp.packet_from_header(header, payload, config)) == raw(sample.packet)
        frame = raw(sample.packet)
        assert rp.frame_from_beats(rp.frame_beats(frame, 64), 64) == frame
    with pytest.raises(ValueError, match="not an MRC opcode"):
        bad = pk.probe_packet(dqpn=1, psn=1, probe_id=1)
        bad[pk.BTH].opcode = 0x04      # SEND ONLY
        rp.header_from_scapy(bad, config)


@pytest.mark.parametrize("name", CONFIGS)
def test_samples_byte_identical(name):
    """Every sample the NIC can send (all but `trimmed`), back to back, with input bubbles and
    output backpressure, comes out byte-identical to Scapy's frame, ICRC included, on the
    port of its header."""
    config = CONFIGS[name]
    samples = [s for s in sample_packets() if s.name != "trimmed"]
    packets = [as_packet(s.packet, config, port=n % 16) for n, s in enumerate(samples)]
    bench = BuilderBench(config, seed=2, bubbles=0.3, backpressure=0.3)
    frames = bench.run(packets)
    assert_frames_equal(frames, [raw(s.packet) for s in samples])
    assert bench.ports == [n % 16 for n in range(len(samples))]
    assert bench.length_errors == 0


@pytest.mark.parametrize("name", CONFIGS)
def test_random_packets_byte_identical(name):
    """Random data packets (0 .. MTU bytes, every opcode, IPv4/IPv6, VLAN on/off, SRv6 with
    and without an SRH, with and without TSETH) and control packets of every kind with every
    field random match the sim.packets builders byte for byte."""
    config = CONFIGS[name]
    rng = random.Random(3)
    makers = [random_data] * 5 + [random_control] * 2 + [random_srv6]
    pkts = [rng.choice(makers)(rng, config) for _ in range(40)]
    packets = [as_packet(p, config, port=rng.randrange(16)) for p in pkts]
    bench = BuilderBench(config, seed=4, bubbles=0.2, backpressure=0.4)
    frames = bench.run(packets)
    assert_frames_equal(frames, [raw(p) for p in pkts])
    assert bench.length_errors == 0


def layout_header(rng, config, lid):
    """A random header (and payload) of layout ``lid``, every field random."""
    vlan, srv6, ipv6, transport = decode_lid(lid)
    kind, opcode = rng.choice(_transport_kinds(transport))
    if kind == PacketKind.DATA:
        pkt = random_data(rng, config, payload_len=rng.randrange(2 * config.data_width // 8))
    else:
        pkt = random_control(rng, config, opcode=opcode)
    header, payload = as_packet(pkt, config)
    if kind == PacketKind.DATA:
        immediate = bool(transport & 2)
        header["bth"]["opcode"] = rng.choice(sorted(
            P.IMMEDIATE_OPCODES if immediate else P.DATA_OPCODES - P.IMMEDIATE_OPCODES))
        header["immdt"] = {"imm": rng.randrange(1 << 32)} if immediate else {}
        header["bth"]["ts"] = transport & 1
        header["tseth"] = random_fields(rng, L.TSETH) if transport & 1 else {}
    bits = 32 if not ipv6 else 128
    header.update(
        ipv6=ipv6, ip_src=rng.randrange(1 << bits), ip_dst=rng.randrange(1 << bits),
        flow_label=rng.randrange(1 << 20) if ipv6 else 0,
        vlan_valid=vlan, vlan_tci=rng.randrange(1 << 16),
        srv6_valid=int(srv6 > 0), srh_valid=int(srv6 == 2), srv6_src=rng.randrange(1 << 128),
        srv6_dst=rng.randrange(1 << 128), srh_segment=rng.randrange(1 << 128))
    for field in ("solicited", "migreq", "padcount", "version", "pkey", "fecn", "becn",
                  "resv6", "resv1", "rtx", "resv4"):
        header["bth"][field] = rng.randrange(1 << L.BTH.field(field).bits)
    return header, payload


@pytest.mark.parametrize("name", CONFIGS)
def test_every_layout(name):
    """All 96 layouts, including stacks sim.packets does not build (VLAN with SRv6, IPv4
    inside SRv6) and random BTH reserved bits, match Scapy built from the same header fields
    (sim.rtlpackets.packet_from_header)."""
    config = CONFIGS[name]
    rng = random.Random(5)
    packets = [layout_header(rng, config, lid) for lid in _layouts()]
    assert len(packets) == 96
    expected = [raw(rp.packet_from_header(h, p, config)) for h, p in packets]
    bench = BuilderBench(config, seed=6, bubbles=0.2, backpressure=0.2)
    assert_frames_equal(bench.run(packets), expected)


def test_payload_length_mismatch_is_counted():
    """The length fields follow payload_len, the frame carries the bytes received (the ICRC
    covers them), and length_errors counts each packet whose byte count differs."""
    config = CONFIGS["w64"]
    rng = random.Random(7)
    packets, expected = [], []
    for actual, claimed in ((64, 64), (60, 64), (64, 60), (0, 8), (9, 0), (1024, 1024),
                            (17, 16), (0, 0)):
        header, payload = as_packet(random_data(rng, config, payload_len=actual), config)
        header["payload_len"] = claimed
        header["reth"]["dma_len"] = claimed
        packets.append((header, payload))
        expected.append(raw(rp.packet_from_header(header, payload, config)))
    bench = BuilderBench(config, seed=8, bubbles=0.3, backpressure=0.3)
    frames = bench.run(packets)
    assert_frames_equal(frames, expected, check_icrc=False)
    for frame, (header, payload) in zip(frames, packets, strict=True):
        assert frame[-4 - len(payload):-4] == payload
        if header["payload_len"] >= len(payload):
            assert pk.icrc_ok(frame)
    assert bench.length_errors == 5


@pytest.mark.parametrize("name", CONFIGS)
def test_back_to_back_at_full_rate(name):
    """With no input bubbles and `o` always ready, frames leave back to back: not one idle
    output cycle from the first frame's first beat to the last frame's last beat. Payloads of
    every length modulo the beat (so every ICRC position, in the last beat or in a beat of its
    own) at both IP versions, MTU-sized writes, SACKs and the shortest frame, an AETH NAK."""
    config = CONFIGS[name]
    lanes = config.data_width // 8
    rng = random.Random(9)
    pkts = []
    for payload_len in [*range(lanes + 4), config.mtu, config.mtu - 1]:
        for ip_version in (4, 6):
            pkts.append(random_data(rng, config, payload_len=payload_len, vlan=None,
                                    ip_version=ip_version))
    for _ in range(8):
        pkts.append(random_control(rng, config, opcode=P.Opcode.ACKNOWLEDGE, ip_version=4,
                                   vlan=None))
        pkts.append(random_control(rng, config, opcode=P.Opcode.RELIABILITY_SACK))
        pkts.append(random_data(rng, config, payload_len=config.mtu))
    packets = [as_packet(p, config) for p in pkts]
    bench = BuilderBench(config, seed=10)
    assert_frames_equal(bench.run(packets), [raw(p) for p in pkts])
    assert idle_cycles(bench.trace) == 0
