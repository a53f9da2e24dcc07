# amaranth: UnusedElaboratable=no
"""The receive parser: frames parse exactly as Scapy decodes them, bad frames are dropped whole
with the documented reason, and a stream of frames is taken at one beat per cycle.

Every stream test sends frames back to back with random input bubbles and drains ``o`` with
random backpressure (seeded). Verdicts of malformed frames are checked against
:func:`reference_verdict`, a plain-Python statement of the rules in ``docs/parser.md``, and
against the exact reason wherever the case is unambiguous.
"""

import ipaddress
import random
import struct

import pytest
from amaranth.sim import Simulator
from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Dot1Q, Ether

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet import layouts as L
from hdl.packet.headers import DropReason, PacketKind, packet_header_layout
from hdl.packet.parser import Parser, max_frame_bytes
from hdl.packet.pktfifo import PacketFifo
from sim import defaults as D
from sim import packets as pk
from sim import rtlpackets
from sim.packets import AETH, BTH
from sim.samples import sample_packets

R = DropReason
CONFIG = NicConfig()


# =============================================================================================
# Stream helpers: whole frames in with bubbles, whole packets out with backpressure
# =============================================================================================

def frame_beats(frame, lanes, port=0):
    """Network beats of ``frame``: wire byte i in lane i % lanes; keep full but on the last."""
    beats = []
    for base in range(0, len(frame), lanes):
        chunk = frame[base:base + lanes]
        beats.append({"data": int.from_bytes(chunk.ljust(lanes, b"\0"), "little"),
                      "keep": (1 << len(chunk)) - 1, "first": base == 0,
                      "last": base + lanes >= len(frame), "port": port})
    return beats


def pack(layout, fields):
    """The raw value of a flat struct: setting it as an int is much cheaper in simulation."""
    value = 0
    for name, field in layout:
        value |= (int(fields.get(name, 0)) & ((1 << field.width) - 1)) << field.offset
    return value


async def stream_put(ctx, stream, payload, *, rng=None, bubbles=0.0):
    """Transfer one payload, after a random number of idle cycles (valid low)."""
    while rng is not None and rng.random() < bubbles:
        ctx.set(stream.valid, 0)
        await ctx.tick()
    target = stream.payload
    if isinstance(payload, int) and hasattr(target, "as_value"):
        target = target.as_value()          # a raw value for a struct payload
    ctx.set(target, payload)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream, *, rng=None, backpressure=0.0):
    """Take one payload, holding ``ready`` low for random cycles first."""
    while rng is not None and rng.random() < backpressure:
        ctx.set(stream.ready, 0)
        await ctx.tick()
    ctx.set(stream.ready, 1)
    payload, = await ctx.tick().sample(stream.payload).until(stream.valid)
    ctx.set(stream.ready, 0)
    return payload


def _unpack(layout, value):
    """A raw struct value as nested ``{field: int}`` dicts, following ``layout``."""
    out = {}
    for name, field in layout:
        raw_field = (value >> field.offset) & ((1 << field.width) - 1)
        if hasattr(field.shape, "members"):
            out[name] = _unpack(field.shape, raw_field)
        else:
            out[name] = raw_field
    return out


def _zero(layout):
    return {name: _zero(f.shape) if hasattr(f.shape, "members") else 0 for name, f in layout}


def _pack_nested(layout, fields):
    """The raw value of a (nested) struct or union from ``{field: int or dict}``; missing
    fields are 0, negative values two's complement."""
    value = 0
    for name, field in layout:
        if name not in fields:
            continue
        if hasattr(field.shape, "members"):
            raw_field = _pack_nested(field.shape, fields[name])
        else:
            raw_field = int(fields[name]) & ((1 << field.width) - 1)
        value |= raw_field << field.offset
    return value


def _layer_fields(layer, header):
    return {f.name: getattr(layer, f.name) for f in header.fields}


class Run:
    """What came out of one simulation: verdicts, packets (header dict, payload) and counters."""

    def __init__(self):
        self.verdicts = []
        self.packets = []
        self.counters = None
        self.input_stalls = 0


def run_parser(frames, *, config=CONFIG, seed=0, bubbles=0.3, backpressure=0.3, ports=None,
               trim_dscp=None, full_rate=False, hold_cycles=0):
    """Send ``frames`` back to back and collect everything the parser does with them.

    With ``full_rate`` the input has no bubbles and ``o`` is always ready, and every beat must
    be taken in the cycle it is offered. ``Run.input_stalls`` counts cycles where a beat was
    offered and not taken. ``hold_cycles`` keeps ``o.ready`` low for that long at the start.
    """
    dut = Parser(config=config)
    rng = random.Random(seed)
    lanes = config.bytes_per_beat
    W = config.data_width
    beat_layout = dut.i.payload.shape()
    out_layout = dut.o.payload.shape()
    header_layout = packet_header_layout(config)
    header_at = out_layout["header"].offset
    header_mask = (1 << header_layout.size) - 1
    fields_at = {name: (out_layout[name].offset, out_layout[name].width)
                 for name in ("data", "keep", "first", "last")}
    run = Run()
    ports = ports or [0] * len(frames)
    total_beats = sum(len(frame_beats(f, lanes)) for f in frames)
    i_payload, o_payload = dut.i.payload.as_value(), dut.o.payload.as_value()
    reason_value = dut.verdict_reason.as_value()

    def field(value, name):
        offset, width = fields_at[name]
        return (value >> offset) & ((1 << width) - 1)

    async def producer(ctx):
        if trim_dscp is not None:
            ctx.set(dut.trim_dscp, trim_dscp)
        for frame, port in zip(frames, ports, strict=True):
            for beat in frame_beats(frame, lanes, port):
                value = pack(beat_layout, beat)
                if full_rate:
                    ctx.set(i_payload, value)
                    ctx.set(dut.i.valid, 1)
                    await ctx.tick().until(dut.i.ready)
                else:
                    await stream_put(ctx, dut.i, value, rng=rng, bubbles=bubbles)
        ctx.set(dut.i.valid, 0)
        for _ in range(40 * total_beats + 2000):
            accepted = run.verdicts.count(R.NONE)
            if len(run.verdicts) == len(frames) and len(run.packets) == accepted:
                break
            await ctx.tick()
        else:
            raise AssertionError(f"timed out: {len(run.verdicts)} verdicts for {len(frames)} "
                                 f"frames, {len(run.packets)} packets out")
        await ctx.tick().repeat(20)
        assert not ctx.get(dut.o.valid), "a packet came out that was not accepted"
        run.counters = [ctx.get(dut.counters[r]) for r in range(len(R))]

    async def monitor(ctx):
        """Drain ``o`` with random backpressure, checking beat framing; record verdicts."""
        beats = []
        cycle = 0
        while True:
            ready = full_rate or (cycle >= hold_cycles and rng.random() >= backpressure)
            cycle += 1
            ctx.set(dut.o.ready, ready)
            *_, valid, value, verdict, reason, offered, taken = await ctx.tick().sample(
                dut.o.valid, o_payload, dut.verdict_valid, reason_value, dut.i.valid,
                dut.i.ready)
            if verdict:
                run.verdicts.append(R(reason))
            if offered and not taken:
                run.input_stalls += 1
            if not (valid and ready):
                continue
            assert bool(field(value, "first")) == (not beats), "first on a packet's first beat"
            beats.append(value)
            if not field(value, "last"):
                continue
            header = (beats[0] >> header_at) & header_mask
            body = b""
            for k, beat in enumerate(beats):
                assert (beat >> header_at) & header_mask == header, "header changed in a packet"
                keep = field(beat, "keep")
                if k < len(beats) - 1:
                    assert keep == (1 << lanes) - 1, "keep full on all beats but the last"
                assert keep & (keep + 1) == 0, "keep starts at lane 0"
                body += field(beat, "data").to_bytes(W // 8, "little")[:keep.bit_length()]
            if len(beats) > 1 or field(beats[0], "keep"):
                assert field(beats[-1], "keep"), "a payload's last beat has data"
            run.packets.append((_unpack(header_layout, header), body))
            beats = []

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(producer)
    sim.add_testbench(monitor, background=True)
    sim.run()
    return run


# =============================================================================================
# The independent views: Scapy's decode, and the drop rules in plain Python
# =============================================================================================

def _ip_int(address):
    return int(ipaddress.ip_address(address))


def scapy_header(frame, *, config=CONFIG, port=0, trim_dscp=P.DEFAULT_TRIM_DSCP):
    """The parsed header and payload the parser must produce, from Scapy's decode of ``frame``."""
    pkt = Ether(frame)
    h = _zero(packet_header_layout(config))
    h["port"] = port
    h["eth_dst"] = int(pkt[Ether].dst.replace(":", ""), 16)
    h["eth_src"] = int(pkt[Ether].src.replace(":", ""), 16)
    first_ip = pkt[Ether].payload
    if Dot1Q in pkt:
        tag = pkt[Dot1Q]
        h["vlan_valid"] = 1
        h["vlan_tci"] = tag.prio << 13 | tag.dei << 12 | tag.vlan
        first_ip = tag.payload
    ip = pkt[UDP].underlayer
    if ip is not first_ip:
        h["srv6_valid"] = 1
        h["srv6_src"] = _ip_int(first_ip.src)
        h["srv6_dst"] = _ip_int(first_ip.dst)
        if IPv6ExtHdrSegmentRouting in pkt:
            h["srh_valid"] = 1
            h["srh_segment"] = _ip_int(pkt[IPv6ExtHdrSegmentRouting].addresses[0])
    if isinstance(ip, IPv6):
        h.update(ipv6=1, tclass=ip.tc, flow_label=ip.fl, hop_limit=ip.hlim)
    else:
        h.update(ipv6=0, tclass=ip.tos, flow_label=0, hop_limit=ip.ttl)
    h["ip_src"] = _ip_int(ip.src)
    h["ip_dst"] = _ip_int(ip.dst)
    h["udp_sport"] = pkt[UDP].sport
    bth = pkt[BTH]
    h["bth"] = _layer_fields(bth, L.BTH)
    payload = b""
    if bth.opcode in P.DATA_OPCODES:
        h["kind"] = PacketKind.DATA.value
        h["meth"] = _layer_fields(pkt[pk.METH], L.METH)
        if bth.ts:
            h["tseth"] = _layer_fields(pkt[pk.TSETH], L.TSETH)
        h["reth"] = _layer_fields(pkt[pk.RETH], L.RETH)
        if pk.ImmDt in pkt:
            h["immdt"] = _layer_fields(pkt[pk.ImmDt], L.IMMDT)
        h["trimmed"] = int(ip.tc >> 2 == trim_dscp if isinstance(ip, IPv6)
                           else ip.tos >> 2 == trim_dscp)
        if not h["trimmed"]:
            payload = pk.transport_payload(pkt)
    elif bth.opcode == P.Opcode.ACKNOWLEDGE:
        h["kind"] = PacketKind.AETH.value
        h["aeth"] = _layer_fields(pkt[AETH], L.AETH)
    else:
        kind, member = rtlpackets.CONTROL_KINDS[bth.opcode]
        h["kind"] = kind.value
        if member == "sack":
            ctl = {"sack": {"seth": _layer_fields(pkt[pk.SETH], L.SETH),
                            "cc_state": _layer_fields(pkt[pk.CC_STATE], L.CC_STATE)}}
        else:
            header, = L.CONTROL_HEADERS[bth.opcode]
            ctl = {member: _layer_fields(pkt[pk.LAYERS[header]], header)}
        # The parser's view of the union: every member read from the same bits.
        ctl_layout = packet_header_layout(config)["ctl"].shape
        h["ctl"] = _unpack(ctl_layout, _pack_nested(ctl_layout, ctl))
    h["payload_len"] = len(payload)
    # Signed fields as the parser's raw bits.
    layout = packet_header_layout(config)
    return _unpack(layout, _pack_nested(layout, h)), payload


def _be(frame, offset, size):
    return int.from_bytes(frame[offset:offset + size], "big")


def _ones_complement_ok(header):
    total = sum(_be(header, k, 2) for k in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def _ipv4_header_bad(ip):
    return (ip[0] >> 4 != 4 or ip[0] & 0xF != 5 or ip[6] & 0x20 or _be(ip, 6, 2) & 0x1FFF
            or not _ones_complement_ok(ip[:20]))


def reference_verdict(frame, *, config=CONFIG, trim_dscp=P.DEFAULT_TRIM_DSCP):
    """The drop reason ``docs/parser.md`` gives ``frame``: the first failing check in order."""
    n = len(frame)
    if n > max_frame_bytes(config):
        return R.OVERSIZE
    if n < 14:
        return R.RUNT
    ethertype, l3 = _be(frame, 12, 2), 14
    if ethertype == P.ETHERTYPE_VLAN:
        if n < 18:
            return R.RUNT
        ethertype, l3 = _be(frame, 16, 2), 18
    if ethertype not in (P.ETHERTYPE_IPV4, P.ETHERTYPE_IPV6):
        return R.BAD_ETHERTYPE
    v4 = ethertype == P.ETHERTYPE_IPV4
    if n < l3 + (20 if v4 else 40):
        return R.RUNT
    ip = frame[l3:]
    if (_ipv4_header_bad(ip) if v4 else ip[0] >> 4 != 6):
        return R.BAD_IP_HEADER
    ip_len = _be(ip, 2, 2) if v4 else 40 + _be(ip, 4, 2)
    end = l3 + ip_len
    if (v4 and ip_len < 20) or not (end == n or (n == 60 and end < 60)):
        return R.BAD_IP_LENGTH
    proto = ip[9] if v4 else ip[6]
    if proto not in ((17,) if v4 else (17, 41, 4, 43)):
        return R.BAD_IP_PROTOCOL
    x, inner_v4 = l3, v4
    if proto in (41, 4, 43):
        x, inner_v4 = l3 + 40, proto == 4
        if proto == 43:
            if end < l3 + 64:
                return R.RUNT
            srh = frame[l3 + 40:]
            if srh[2] != 4 or srh[1] != 2 or srh[0] not in (41, 4):
                return R.BAD_IP_PROTOCOL
            x, inner_v4 = l3 + 64, srh[0] == 4
        if end < x + (20 if inner_v4 else 40):
            return R.RUNT
        inner = frame[x:]
        if (_ipv4_header_bad(inner) if inner_v4 else inner[0] >> 4 != 6):
            return R.BAD_IP_HEADER
        inner_len = _be(inner, 2, 2) if inner_v4 else 40 + _be(inner, 4, 2)
        if (inner_v4 and inner_len < 20) or x + inner_len != end:
            return R.BAD_IP_LENGTH
        if (inner[9] if inner_v4 else inner[6]) != 17:
            return R.BAD_IP_PROTOCOL
    u = x + (20 if inner_v4 else 40)
    if end < u + 8:
        return R.RUNT
    if _be(frame, u + 2, 2) != P.ROCEV2_UDP_PORT:
        return R.BAD_UDP_PORT
    if u + _be(frame, u + 4, 2) != end:
        return R.BAD_UDP_LENGTH
    t = u + 8
    if end < t + L.BTH.size:
        return R.RUNT
    bth = L.BTH.unpack(frame[t:])
    if bth["version"] != 0 or bth["padcount"] != 0:
        return R.BAD_BTH
    if bth["opcode"] not in P.SUPPORTED_OPCODES:
        return R.UNSUPPORTED_OPCODE
    ext = t + L.BTH.size
    data = bth["opcode"] in P.DATA_OPCODES
    if data:
        headers = L.data_headers(bth["opcode"], ts=bth["ts"])
    else:
        headers = L.CONTROL_HEADERS[bth["opcode"]]
    need = ext + L.headers_size(headers) + 4
    if data and end < need:
        return R.RUNT
    if not data and end != need:
        return R.BAD_LENGTH
    tclass = inner_tclass(frame, x, inner_v4)
    trimmed = data and tclass >> 2 == trim_dscp
    if data:
        if end - need > config.mtu:
            return R.OVERSIZE
        reth_at = ext + L.METH.size + (L.TSETH.size if bth["ts"] else 0)
        if not trimmed and L.RETH.unpack(frame[reth_at:])["dma_len"] != end - need:
            return R.BAD_LENGTH
    if not trimmed and not pk.icrc_ok(frame[:end]):
        return R.BAD_ICRC
    return R.NONE


def inner_tclass(frame, x, inner_v4):
    return frame[x + 1] if inner_v4 else (_be(frame, x, 2) >> 4) & 0xFF


# =============================================================================================
# Frames
# =============================================================================================

SAMPLES = [(s.name, raw(s.packet)) for s in sample_packets()]
GOOD = dict(SAMPLES)


def write(payload=b"", **kw):
    kw.setdefault("dqpn", D.QPN_B)
    kw.setdefault("psn", 0x300)
    kw.setdefault("va", D.MR_BASE)
    kw.setdefault("rkey", D.MR_RKEY)
    return pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, payload=payload, **kw)


def sack(**kw):
    kw.setdefault("dqpn", D.QPN_A)
    kw.setdefault("cack_psn", 0x104)
    return pk.sack_packet(**kw)


def probe(**kw):
    return pk.probe_packet(dqpn=D.QPN_B, psn=0x105, probe_id=0x55, **kw)


def random_fields(rng, header, skip=()):
    """Every field of ``header`` random over its whole range."""
    return {f.name: rng.randint(f.minimum, f.maximum) for f in header.fields
            if f.name not in skip}


def random_control(rng, **kw):
    """A control packet of a random kind with every field random."""
    opcode = rng.choice(sorted(L.CONTROL_HEADERS))
    dqpn, psn = rng.getrandbits(24), rng.getrandbits(24)
    if opcode == P.Opcode.ACKNOWLEDGE:
        return pk.ack_packet(dqpn=dqpn, psn=psn, **random_fields(rng, L.AETH), **kw)
    if opcode == P.Opcode.RELIABILITY_SACK:
        return pk.sack_packet(dqpn=dqpn, cack_psn=psn,
                              **random_fields(rng, L.SETH, skip=("cack_psn",)),
                              cc_state=random_fields(rng, L.CC_STATE), **kw)
    if opcode == P.Opcode.RELIABILITY_NACK:
        fields = random_fields(rng, L.NETH, skip=("nack_psn", "nack_reason"))
        return pk.nack_packet(dqpn=dqpn, nack_psn=psn,
                              nack_reason=rng.choice(list(P.NackReason)), **fields, **kw)
    if opcode == P.Opcode.RELIABILITY_PROBE_REQUEST:
        return pk.probe_packet(dqpn=dqpn, psn=psn, **random_fields(rng, L.PETH), **kw)
    builder = (pk.endpoint_request if opcode == P.Opcode.ENDPOINT_REQUEST
               else pk.endpoint_response)
    header = L.ERTH if opcode == P.Opcode.ENDPOINT_REQUEST else L.EETH
    return builder(request_id=rng.getrandbits(16), op=rng.choice(list(P.EndpointOp)),
                   dqpn=dqpn, **random_fields(rng, header, skip=("op",)), **kw)


def fix_ipv4_checksum(frame, offset):
    header = bytearray(frame[offset:offset + 20])
    header[10:12] = b"\0\0"
    total = sum(_be(header, k, 2) for k in range(0, 20, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    header[10:12] = (~total & 0xFFFF).to_bytes(2, "big")
    return frame[:offset] + bytes(header) + frame[offset + 20:]


def add_vlan(frame, vlan=0x123, prio=5):
    return frame[:12] + struct.pack(">HH", P.ETHERTYPE_VLAN, prio << 13 | vlan) + frame[12:]


def random_frame(rng, config=CONFIG):
    """A random legal frame: any kind, any field values, payload 0..MTU, any stack."""
    kw = {"ip_version": rng.choice((4, 6)), "udp_sport": rng.getrandbits(16),
          "dscp": rng.choice((0, 26, 46, rng.getrandbits(6))), "ecn": rng.getrandbits(2),
          "hop_limit": rng.getrandbits(8)}
    if kw["ip_version"] == 6:
        kw["flow_label"] = rng.getrandbits(20)
    if rng.random() < 0.6:
        opcode = rng.choice(sorted(P.DATA_OPCODES))
        size = rng.choice((0, 1, config.mtu - 1, config.mtu, rng.randrange(config.mtu + 1),
                           rng.randrange(64)))
        pkt = pk.data_packet(
            opcode, dqpn=rng.getrandbits(24), psn=rng.getrandbits(24), va=rng.getrandbits(64),
            rkey=rng.getrandbits(32), payload=rng.randbytes(size),
            imm=rng.getrandbits(32) if opcode in P.IMMEDIATE_OPCODES else None,
            rqmsn=rng.getrandbits(16), msn=rng.getrandbits(16), rtx=rng.random() < 0.3,
            tseth=random_fields(rng, L.TSETH) if rng.random() < 0.7 else None,
            ackreq=rng.getrandbits(1), **kw)
    else:
        pkt = random_control(rng, **kw)
    stack = rng.random()
    if stack < 0.15:
        pkt = pk.srv6_encapsulate(pkt, dst=rng.randbytes(16))
    elif stack < 0.3:
        pkt = pk.srv6_encapsulate(pkt, dst=rng.randbytes(16), segment=rng.randbytes(16))
    frame = raw(pkt)
    if rng.random() < 0.25:
        frame = add_vlan(frame, rng.getrandbits(12), rng.getrandbits(3))
    return frame


# =============================================================================================
# Tests: parsing what is legal
# =============================================================================================

def check_packets(run, frames, ports, *, config=CONFIG, trim_dscp=P.DEFAULT_TRIM_DSCP,
                  expected=None):
    """Verdicts as expected (NONE by default) and every accepted frame out once, as Scapy says."""
    expected = expected or [R.NONE] * len(frames)
    assert run.verdicts == expected
    accepted = [(f, p) for f, p, e in zip(frames, ports, expected, strict=True) if e == R.NONE]
    assert len(run.packets) == len(accepted)
    for k, ((frame, port), (header, payload)) in enumerate(zip(accepted, run.packets,
                                                               strict=True)):
        want_header, want_payload = scapy_header(frame, config=config, port=port,
                                                 trim_dscp=trim_dscp)
        diff = {name: (header[name], want_header[name]) for name in want_header
                if header[name] != want_header[name]}
        assert not diff, f"accepted frame {k}: (parser, scapy) differ: {diff}"
        assert payload == want_payload, f"accepted frame {k}: payload differs"
    counts = [0] * len(R)
    for verdict in expected:
        counts[verdict.value] += 1
    assert run.counters == counts


@pytest.mark.parametrize("data_width", [64, 128, 256])
def test_every_sample_parses_as_scapy_decodes_it(data_width):
    """Every sample back to back, bubbles and backpressure: every field and payload byte."""
    config = NicConfig(data_width=data_width)
    frames = [frame for _name, frame in SAMPLES]
    ports = [k % 16 for k in range(len(frames))]
    run = run_parser(frames, config=config, seed=data_width, ports=ports)
    check_packets(run, frames, ports, config=config)


@pytest.mark.parametrize("data_width,count", [(64, 40), (128, 40)])
def test_random_frames_parse_as_scapy_decodes_them(data_width, count):
    """Random kinds, opcodes, field values, stacks and sizes from 0 to the MTU."""
    config = NicConfig(data_width=data_width)
    rng = random.Random(f"random-frames-{data_width}")
    frames = [random_frame(rng, config) for _ in range(count)]
    ports = [rng.randrange(16) for _ in frames]
    run = run_parser(frames, config=config, seed=data_width + 1, ports=ports)
    check_packets(run, frames, ports, config=config)


def test_control_headers_in_the_longest_stack():
    """Every control kind with every field random (the SACK bitmap all ones once) behind the
    longest stack (802.1Q, SRv6 with an SRH, inner IPv6): the capture reaches their end."""
    rng = random.Random("longest-control")
    frames = []
    for _ in range(12):
        pkt = random_control(rng)
        frames.append(add_vlan(raw(pk.srv6_encapsulate(pkt, dst=rng.randbytes(16),
                                                       segment=rng.randbytes(16)))))
    frames.append(add_vlan(raw(pk.srv6_encapsulate(
        sack(sack_bitmap=(1 << 64) - 1, sack_psn_offset=-1, ack_psn_offset=-(1 << 15),
             cc_state={"rcvd_bytes": (1 << 24) - 1, "ooo_count": (1 << 15) - 1}),
        dst=bytes(16), segment=bytes(16)))))
    ports = [0] * len(frames)
    run = run_parser(frames, seed=3, ports=ports)
    check_packets(run, frames, ports)
    assert run.packets[-1][0]["ctl"]["sack"]["seth"]["sack_bitmap"] == (1 << 64) - 1


def test_data_headers_follow_bth_ts_and_the_opcode():
    """METH, then a TSETH only with BTH.ts, then RETH and ImmDt: the payload starts after
    them, and the parser reads every field where the flag and the opcode put it."""
    rng = random.Random("data-layouts")
    frames = []
    for opcode in sorted(P.DATA_OPCODES):
        for tseth in (None, random_fields(rng, L.TSETH)):
            frames.append(raw(pk.data_packet(
                opcode, dqpn=1, psn=rng.getrandbits(24), va=rng.getrandbits(64),
                rkey=rng.getrandbits(32), payload=rng.randbytes(rng.randrange(1, 90)),
                imm=rng.getrandbits(32) if opcode in P.IMMEDIATE_OPCODES else None,
                rqmsn=rng.getrandbits(16), msn=rng.getrandbits(16), rtx=True, tseth=tseth,
                ip_version=rng.choice((4, 6)))))
    ports = [0] * len(frames)
    run = run_parser(frames, seed=19, ports=ports)
    check_packets(run, frames, ports)
    assert [h["bth"]["ts"] for h, _ in run.packets] == [0, 1] * len(P.DATA_OPCODES)
    assert all(h["bth"]["rtx"] for h, _ in run.packets)


def test_trimmed_packets_lose_their_payload_and_skip_icrc_and_dma_len():
    """Trim DSCP on a DATA packet: accepted without payload whatever its ICRC and dma_len say;
    on a SACK or a probe the DSCP means nothing."""
    trimmed = GOOD["trimmed"]
    with_payload = bytearray(raw(write(b"x" * 100, dscp=P.DEFAULT_TRIM_DSCP, ip_version=4)))
    with_payload[-1] ^= 0xFF                                      # ICRC not checked
    frames = [trimmed, bytes(with_payload),
              raw(write(b"abc", dscp=P.DEFAULT_TRIM_DSCP, dma_len=999)),
              _flip_last(raw(sack(dscp=P.DEFAULT_TRIM_DSCP))),
              raw(probe(dscp=P.DEFAULT_TRIM_DSCP)),
              raw(write(b"abc", dscp=12)), raw(write(b"abc", dscp=12))]
    # Runtime trim_dscp: 12 marks trimmed packets now, 33 does not.
    run = run_parser(frames[:5], seed=4)
    expected = [R.NONE, R.NONE, R.NONE, R.BAD_ICRC, R.NONE]
    check_packets(run, frames[:5], [0] * 5, expected=expected)
    assert [h["trimmed"] for h, _ in run.packets] == [1, 1, 1, 0]
    assert [h["payload_len"] for h, _ in run.packets] == [0, 0, 0, 0]
    run = run_parser(frames[5:], seed=5, trim_dscp=12)
    check_packets(run, frames[5:], [0, 0], trim_dscp=12)
    assert [h["trimmed"] for h, _ in run.packets] == [1, 1]


@pytest.mark.parametrize("data_width", [64, 128, 256])
def test_back_to_back_frames_are_taken_one_beat_per_cycle(data_width):
    """II = 1: with no bubbles and ``o`` always ready, i.ready never drops, whatever the mix of
    sizes (1-beat runts, header-only, MTU, oversize)."""
    rng = random.Random(f"full-rate-{data_width}")
    frames = []
    for _ in range(4):
        frames += [frame for _name, frame in SAMPLES[:8]]
        frames += [random_frame(rng) for _ in range(3)]
        frames += [GOOD["reliability_probe"]] * 3 + [b"\x01" * rng.randrange(1, 9)] * 3
    frames += [raw(write(bytes(CONFIG.mtu))) for _ in range(3)] + [bytes(3000)]
    frames += [GOOD["sack_ipv4"], GOOD["reliability_probe"], GOOD["nak_remote_access"]] * 4
    # The tightest case for the reader: the shortest headers, payloads just past a beat.
    frames += [raw(write(bytes(32 * k + r), ip_version=4)) for k in (0, 2) for r in (1, 7, 14)]
    config = NicConfig(data_width=data_width)
    run = run_parser(frames, config=config, full_rate=True)
    assert run.input_stalls == 0
    assert run.verdicts == [reference_verdict(f) for f in frames]
    assert len(run.packets) == run.verdicts.count(R.NONE)


@pytest.mark.parametrize("full", ["header_queue", "packet_fifo"])
def test_a_stalled_output_fills_the_fifo_and_loses_nothing(full):
    """``o`` held off for 2000 cycles: the header queue (many short frames) or the packet FIFO
    (long ones) fills, i.ready drops, and once ``o`` drains every accepted frame comes out
    whole and in order (the FIFO pointers wrap several times)."""
    rng = random.Random(f"stall-{full}")
    frames = []
    for _ in range(2):
        if full == "header_queue":
            frames += [GOOD["sack_ipv4"], b"junk" * 3, GOOD["ev_probe_response"]] * 12
        else:
            frames += [raw(write(rng.randbytes(rng.randrange(CONFIG.mtu - 200, CONFIG.mtu))))
                       for _ in range(6)]
        frames += [frame for _name, frame in SAMPLES[:10]]
    run = run_parser(frames, seed=17, hold_cycles=2000, bubbles=0.1)
    assert run.input_stalls > 1000
    check_packets(run, frames, [0] * len(frames),
                  expected=[reference_verdict(f) for f in frames])


# =============================================================================================
# Tests: dropping what is not
# =============================================================================================

def run_each_then_good(cases, *, config=CONFIG, seed=0, trim_dscp=P.DEFAULT_TRIM_DSCP,
                       exact=True, good=None):
    """Each malformed frame followed by a good one: the malformed frame's verdict is the
    expected one, the good one passes untouched. With ``exact`` the expected reason must also
    be the reference model's; a reason of None means "whatever the model says"."""
    good = good or [frame for _name, frame in SAMPLES]
    frames, expected = [], []
    for k, (name, frame, reason) in enumerate(cases):
        if exact or reason is None:         # else the caller took `reason` from the model
            model = reference_verdict(frame, config=config, trim_dscp=trim_dscp)
            if exact:
                assert model == reason, f"{name}: the reference model says {model.name}"
            reason = model
        frames += [frame, good[k % len(good)]]
        expected += [reason, R.NONE]
    ports = [k % 4 for k in range(len(frames))]
    run = run_parser(frames, config=config, seed=seed, ports=ports,
                     trim_dscp=None if trim_dscp == P.DEFAULT_TRIM_DSCP else trim_dscp)
    for k, (name, _frame, _reason) in enumerate(cases):
        assert run.verdicts[2 * k] == expected[2 * k], \
            f"{name}: parser says {run.verdicts[2 * k].name}, expected {expected[2 * k].name}"
    check_packets(run, frames, ports, config=config, expected=expected, trim_dscp=trim_dscp)
    return run


def _set(pkt, layer, **fields):
    pkt = pkt.copy()
    for name, value in fields.items():
        setattr(pkt[layer], name, value)
    if BTH in pkt:
        pkt[BTH].icrc = None                # a valid ICRC over the modified packet
    return raw(pkt)


def _poke(frame, offset, value, size=1):
    return frame[:offset] + value.to_bytes(size, "big") + frame[offset + size:]


def malformed_cases():
    w4, w6 = write(b"p" * 40, ip_version=4), write(b"p" * 40)
    f4, f6 = raw(w4), raw(w6)
    srv6 = raw(pk.srv6_encapsulate(w6, dst=bytes(16), segment=bytes(16)))
    padded = raw(Ether(dst=D.NIC_B.mac, src=D.NIC_A.mac) / IP(src="10.0.0.1", dst="10.0.0.2")
                 / UDP(sport=1, dport=P.ROCEV2_UDP_PORT) / BTH(opcode=P.Opcode.RDMA_WRITE_ONLY))
    assert len(padded) == 58
    probe4 = raw(probe(ip_version=4))
    trimmed_v4 = raw(pk.trim(write(b"t" * 10, ip_version=4)))
    sack4 = raw(sack(ip_version=4))
    return [
        ("runt_1_byte", b"\x00", R.RUNT),
        ("runt_13_bytes", f6[:13], R.RUNT),
        ("runt_vlan_tag", add_vlan(f6)[:17], R.RUNT),
        ("runt_inside_ipv6_header", f6[:53], R.RUNT),
        ("runt_ipv4_bth_cut_lengths_consistent", _refit_lengths(probe4[:46]), R.RUNT),
        ("ethertype_arp", _poke(f4, 12, 0x0806, 2), R.BAD_ETHERTYPE),
        ("ethertype_after_vlan", _poke(add_vlan(f4), 16, 0x88CC, 2), R.BAD_ETHERTYPE),
        ("ipv4_version_5", _set(w4, IP, version=5), R.BAD_IP_HEADER),
        ("ipv6_version_4", _poke(f6, 14, 0x40, 1), R.BAD_IP_HEADER),
        ("ipv4_options", _set(w4, IP, ihl=6), R.BAD_IP_HEADER),
        ("ipv4_more_fragments", _set(w4, IP, flags="MF"), R.BAD_IP_HEADER),
        ("ipv4_fragment_offset", _set(w4, IP, frag=8), R.BAD_IP_HEADER),
        ("ipv4_bad_checksum", _poke(f4, 24, _be(f4, 24, 2) ^ 0x100, 2), R.BAD_IP_HEADER),
        ("ipv4_total_length_long", _set(w4, IP, len=len(f4) - 14 + 1), R.BAD_IP_LENGTH),
        ("ipv4_total_length_short", _set(w4, IP, len=len(f4) - 14 - 1), R.BAD_IP_LENGTH),
        ("ipv6_payload_length_long", _set(w6, IPv6, plen=len(f6) - 54 + 1), R.BAD_IP_LENGTH),
        ("ipv6_payload_length_short", _set(w6, IPv6, plen=len(f6) - 54 - 1), R.BAD_IP_LENGTH),
        ("ipv4_protocol_tcp", _set(w4, IP, proto=6), R.BAD_IP_PROTOCOL),
        ("ipv6_next_header_tcp", _set(w6, IPv6, nh=6), R.BAD_IP_PROTOCOL),
        ("udp_port_4792", _set(w6, UDP, dport=4792), R.BAD_UDP_PORT),
        ("udp_length_long", _set(w4, UDP, len=len(f4) - 34 + 1), R.BAD_UDP_LENGTH),
        ("udp_length_short", _set(w6, UDP, len=len(f6) - 54 - 2), R.BAD_UDP_LENGTH),
        ("bth_version_1", _set(w6, BTH, version=1), R.BAD_BTH),
        ("bth_padcount_1", _set(w4, BTH, padcount=1), R.BAD_BTH),
        ("opcode_send_only", _set(w6, BTH, opcode=0x04), R.UNSUPPORTED_OPCODE),
        ("opcode_read_request", _set(w4, BTH, opcode=0x0C), R.UNSUPPORTED_OPCODE),
        ("opcode_cnp", _set(w6, BTH, opcode=0x81), R.UNSUPPORTED_OPCODE),
        ("opcode_atomic", _set(w6, BTH, opcode=0x13), R.UNSUPPORTED_OPCODE),
        ("opcode_rc_write_only", _set(w6, BTH, opcode=0x0A), R.UNSUPPORTED_OPCODE),
        ("opcode_rc_acknowledge", _set(sack(), BTH, opcode=0x11), R.UNSUPPORTED_OPCODE),
        ("opcode_old_probe", _set(probe(), BTH, opcode=0xC0), R.UNSUPPORTED_OPCODE),
        ("opcode_mrc_reserved_0xcc", _set(w4, BTH, opcode=0xCC), R.UNSUPPORTED_OPCODE),
        ("payload_over_mtu", raw(write(bytes(CONFIG.mtu + 1), ip_version=4)), R.OVERSIZE),
        ("frame_over_longest", add_vlan(raw(pk.srv6_encapsulate(
            write(bytes(CONFIG.mtu + 50)), dst=bytes(16), segment=bytes(16)))), R.OVERSIZE),
        ("jumbo_garbage", bytes(range(256)) * 20, R.OVERSIZE),
        ("dma_len_long", raw(write(b"p" * 40, dma_len=41)), R.BAD_LENGTH),
        ("dma_len_zero", raw(write(b"p" * 40, dma_len=0, ip_version=4)), R.BAD_LENGTH),
        ("sack_4_bytes_short", _refit_lengths(sack4[:-8] + sack4[-4:]), R.BAD_LENGTH),
        ("sack_with_trailing_bytes", _refit_lengths(sack4[:-4] + bytes(8) + sack4[-4:]),
         R.BAD_LENGTH),
        ("sack_cut_to_the_bth", _refit_lengths(sack4[:54] + sack4[-4:]), R.BAD_LENGTH),
        ("probe_with_trailing_bytes", _refit_lengths(raw(probe()) + bytes(4)), R.BAD_LENGTH),
        ("nack_1_byte_short", _refit_lengths(raw(pk.nack_packet(
            dqpn=1, nack_psn=2, nack_reason=P.NackReason.TRIMMED))[:-5]), R.BAD_LENGTH),
        ("aeth_with_payload", _refit_lengths(raw(pk.nak_packet(
            P.NakCode.REMOTE_ACCESS, dqpn=1, psn=2))[:-4] + b"payload!" + bytes(4)),
         R.BAD_LENGTH),
        ("endpoint_response_short", _refit_lengths(raw(pk.endpoint_response(
            request_id=1, op=P.EndpointOp.EV_PROBE))[:-8]), R.BAD_LENGTH),
        ("endpoint_request_long", _refit_lengths(raw(pk.endpoint_request(
            request_id=1, op=P.EndpointOp.EV_PROBE)) + bytes(16)), R.BAD_LENGTH),
        ("data_ts_set_without_tseth", _set(w4, BTH, ts=1), R.BAD_LENGTH),
        ("data_ts_clear_with_tseth", _set(write(b"p" * 40, tseth={"tx_timestamp": 5}), BTH,
                                          ts=0), R.BAD_LENGTH),
        ("icrc_flipped", _poke(f6, len(f6) - 1, f6[-1] ^ 1), R.BAD_ICRC),
        ("payload_flipped", _poke(f4, 90, f4[90] ^ 0x80), R.BAD_ICRC),
        ("sack_trim_dscp_is_not_trimmed", _flip_last(raw(sack(dscp=P.DEFAULT_TRIM_DSCP))),
         R.BAD_ICRC),
        ("trimmed_cut_inside_reth", _refit_lengths(trimmed_v4[:-8]), R.RUNT),
        ("srh_type_3", _poke(srv6, 56, 3), R.BAD_IP_PROTOCOL),
        ("srh_two_segments", _poke(srv6, 55, 4), R.BAD_IP_PROTOCOL),
        ("srh_next_header_udp", _poke(srv6, 54, 17), R.BAD_IP_PROTOCOL),
        ("srv6_next_header_41_inner_ipv4",
         _poke(raw(pk.srv6_encapsulate(w4, dst=bytes(16))), 20, P.IP_PROTO_IPV6),
         R.BAD_IP_HEADER),
        ("srv6_next_header_4_inner_ipv6",
         _poke(raw(pk.srv6_encapsulate(w6, dst=bytes(16))), 20, P.IP_PROTO_IPV4),
         R.BAD_IP_HEADER),
        ("srv6_inner_payload_length", _poke(srv6, 78 + 5, srv6[78 + 5] + 1), R.BAD_IP_LENGTH),
        ("srv6_outer_payload_length", _poke(srv6, 14 + 5, srv6[14 + 5] + 1), R.BAD_IP_LENGTH),
        ("srv6_inner_next_header", _poke(srv6, 78 + 6, 6), R.BAD_IP_PROTOCOL),
        ("padded_60_bytes_headers_cut", padded + b"\0\0", R.RUNT),
        ("padded_61_bytes", padded + b"\0\0\0", R.BAD_IP_LENGTH),
    ]


def two_fault_cases():
    """Frames with two faults: the one met first in header order is reported."""
    w4, w6 = write(b"q" * 20, ip_version=4), write(b"q" * 20)
    f6 = raw(w6)
    return [
        ("ethertype_and_runt_ip", _poke(f6[:30], 12, 0x88CC, 2), R.BAD_ETHERTYPE),
        ("ip_checksum_and_length", _poke(_poke(raw(w4), 17, 99), 24, 0), R.BAD_IP_HEADER),
        ("ip_version_and_length", _poke(_poke(f6, 14, 0x50), 19, 3), R.BAD_IP_HEADER),
        ("ip_length_and_protocol", _set(w6, IPv6, plen=200, nh=6), R.BAD_IP_LENGTH),
        ("ip_protocol_and_udp_port", _set(w4, IP, proto=6)[:36] + b"\x99\x99"
         + _set(w4, IP, proto=6)[38:], R.BAD_IP_PROTOCOL),
        ("udp_port_and_length", _set(w6, UDP, dport=1, len=9), R.BAD_UDP_PORT),
        ("udp_length_and_bth", _set(w6, UDP, len=9)[:63] + b"\x0f" + _set(w6, UDP, len=9)[64:],
         R.BAD_UDP_LENGTH),
        ("bth_version_and_opcode", _set(w6, BTH, version=2, opcode=0x04), R.BAD_BTH),
        ("opcode_and_icrc", _flip_last(_set(w6, BTH, opcode=0x0C)), R.UNSUPPORTED_OPCODE),
        ("oversize_and_dma_len", raw(write(bytes(CONFIG.mtu + 1), dma_len=5)), R.OVERSIZE),
        ("dma_len_and_icrc", _flip_last(raw(write(b"q" * 20, dma_len=5))), R.BAD_LENGTH),
        ("control_length_and_icrc", _flip_last(_refit_lengths(raw(sack(ip_version=4))
                                                               + bytes(4))), R.BAD_LENGTH),
        ("srh_type_and_inner_version", _poke(_poke(raw(pk.srv6_encapsulate(
            w6, dst=bytes(16), segment=bytes(16))), 56, 0), 78, 0x40), R.BAD_IP_PROTOCOL),
        ("inner_version_and_inner_length", _poke(_poke(raw(pk.srv6_encapsulate(
            w6, dst=bytes(16))), 54, 0x40), 59, 1), R.BAD_IP_HEADER),
    ]


def test_the_first_fault_in_header_order_is_reported():
    run_each_then_good(two_fault_cases(), seed=8)


def test_random_corruptions_agree_with_the_reference_model():
    """Good frames with one to three header bytes overwritten: the parser's verdict is the
    reference model's (which tries the checks in documented order) for every one."""
    rng = random.Random("corrupt")
    goods = [frame for _name, frame in SAMPLES]
    cases = []
    for k in range(100):
        frame = bytearray(rng.choice(goods))
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(min(len(frame), 100))] = rng.choice(
                (0, 0xFF, rng.getrandbits(8), frame[0] ^ 1))
        cases.append((f"corruption {k}", bytes(frame), None))
    run_each_then_good(cases, seed=9, exact=False, config=NicConfig(data_width=128))


def test_malformed_frames_are_dropped_with_their_reason():
    """One case per check: the exact reason, counters, and the next good frame untouched."""
    run_each_then_good(malformed_cases(), seed=7)


def _flip_last(frame):
    return frame[:-1] + bytes([frame[-1] ^ 0xFF])


def _refit_lengths(frame):
    """Rewrite the IP and UDP lengths (and IPv4 checksum) of a plain frame to its size."""
    frame = bytearray(frame)
    if _be(frame, 12, 2) == P.ETHERTYPE_IPV4:
        frame[16:18] = (len(frame) - 14).to_bytes(2, "big")
        frame[38:40] = (len(frame) - 34).to_bytes(2, "big")
        return fix_ipv4_checksum(bytes(frame), 14)
    frame[18:20] = (len(frame) - 54).to_bytes(2, "big")
    frame[58:60] = (len(frame) - 54).to_bytes(2, "big")
    return bytes(frame)


@pytest.mark.parametrize("name,data_width", [("sack_ipv6", 64), ("reliability_probe", 256)])
def test_truncation_at_every_offset(name, data_width):
    """A header-only frame cut at every byte: RUNT inside the Ethernet and IP headers,
    BAD_IP_LENGTH once the IP header is complete (its length no longer matches)."""
    frame = GOOD[name]
    cases = []
    for cut in range(1, len(frame)):
        reason = R.RUNT if cut < 54 else R.BAD_IP_LENGTH
        cases.append((f"{name}[:{cut}]", frame[:cut], reason))
    run_each_then_good(cases, seed=len(frame), config=NicConfig(data_width=data_width))


def test_truncation_of_a_long_data_packet():
    """A 1024-byte write over IPv4 with VLAN: every cut in the headers, a spread through the
    payload, every cut in the last beats and the ICRC."""
    frame = add_vlan(raw(write(bytes(range(256)) * 4, ip_version=4)))
    cuts = sorted(set(range(1, 110)) | set(range(110, len(frame) - 12, 97))
                  | set(range(len(frame) - 12, len(frame))))
    cases = [(f"cut {cut}", frame[:cut], R.RUNT if cut < 38 else R.BAD_IP_LENGTH)
             for cut in cuts]
    run_each_then_good(cases, seed=11, config=NicConfig(data_width=128))


def _masked_bits(frame):
    """Wire bit numbers the ICRC does not cover in a plain IPv6 frame, or the parser ignores."""
    bits = set(range(0, 96))                                # Ethernet addresses: not checked
    bits |= set(range(14 * 8 + 4, 14 * 8 + 32))             # traffic class, flow label
    bits |= set(range(21 * 8, 22 * 8))                      # hop limit
    bits |= set(range(60 * 8, 62 * 8))                      # UDP checksum
    bits |= set(range(66 * 8, 67 * 8))                      # BTH FECN, BECN, resv6
    return bits


def test_single_bit_flips_across_a_frame():
    """Every bit of a short write: flips in fields the ICRC masks (and the MAC addresses) are
    accepted (a DSCP flip that hits the trim code point makes a trimmed packet); every other
    flip is dropped, with the reference model's reason."""
    config = NicConfig(data_width=128)
    frame = raw(write(b"flip", dscp=P.DEFAULT_TRIM_DSCP ^ 1))       # one bit from trimmed
    cases = []
    for bit in range(8 * len(frame)):
        flipped = bytearray(frame)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        flipped = bytes(flipped)
        reason = reference_verdict(flipped, config=config)
        if bit in _masked_bits(frame):
            assert reason == R.NONE, f"bit {bit}"
        else:
            assert reason != R.NONE, f"bit {bit}"
        cases.append((f"bit {bit}", flipped, reason))
    run = run_each_then_good(cases, config=config, seed=13, good=[raw(probe(ip_version=4))],
                             exact=False)
    trimmed = [h for h, _ in run.packets if h["trimmed"]]
    assert len(trimmed) == 1 and trimmed[0]["payload_len"] == 0
    assert set(run.verdicts) == {
        R.NONE, R.BAD_ETHERTYPE, R.BAD_IP_HEADER, R.BAD_IP_LENGTH, R.BAD_IP_PROTOCOL,
        R.BAD_UDP_PORT, R.BAD_UDP_LENGTH, R.BAD_BTH, R.UNSUPPORTED_OPCODE, R.BAD_LENGTH,
        R.BAD_ICRC}


# =============================================================================================
# PacketFifo
# =============================================================================================

@pytest.mark.parametrize("registered_read", [True, False], ids=["registered", "direct"])
def test_packet_fifo_commit_rollback_seek_and_wrap(registered_read):
    """Rolled-back beats never reach the reader and free their space; a full FIFO ignores
    writes; seeks skip beats; pointers wrap many times (random soak against a model)."""
    depth = 16
    dut = PacketFifo(width=16, depth=depth, registered_read=registered_read)
    rng = random.Random(21)

    async def testbench(ctx):
        committed = []          # (pointer, data) visible to the reader, oldest first
        pending = []            # written, not yet committed
        wr = 0
        release = 0
        received = []
        ctx.set(dut.r.ready, 0)
        # Rollback frees space and hides the beats; a full FIFO drops writes.
        for k in range(depth):
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_data, 0x100 + k)
            await ctx.tick()
        ctx.set(dut.w_en, 0)
        assert ctx.get(dut.w_space) == 0
        ctx.set(dut.w_en, 1)
        ctx.set(dut.w_rollback, 1)
        await ctx.tick()
        ctx.set(dut.w_en, 0)
        ctx.set(dut.w_rollback, 0)
        assert ctx.get(dut.w_space) == depth and ctx.get(dut.w_ptr) == 0
        await ctx.tick().repeat(3)
        assert not ctx.get(dut.r.valid)
        # Random soak.
        serial = 0
        for _cycle in range(3000):
            space = ctx.get(dut.w_space)
            assert space == depth - (wr - release) % (2 * depth)
            write_now = rng.random() < 0.7
            action = rng.random()
            ctx.set(dut.w_en, write_now)
            ctx.set(dut.w_data, serial & 0xFFFF)
            ctx.set(dut.w_commit, action < 0.2)
            ctx.set(dut.w_rollback, 0.2 <= action < 0.25)
            seek = rng.random() < 0.03 and committed
            ready = rng.random() < 0.6
            if seek:
                target = rng.randrange(len(committed) + 1)
                ptr = committed[target][0] if target < len(committed) else \
                    (committed[-1][0] + 1) % (2 * depth)
                ctx.set(dut.r_seek, 1)
                ctx.set(dut.r_seek_ptr, ptr)
            ctx.set(dut.r.ready, ready)
            *_, valid, payload = await ctx.tick().sample(dut.r.valid, dut.r.payload)
            ctx.set(dut.r_seek, 0)
            # Model.
            if seek:
                del committed[:target]
                release = ptr
            elif valid and ready:
                received.append(payload)
                assert payload == committed[0][1]
                committed.pop(0)
                release = (release + 1) % (2 * depth)
            if write_now and space:
                pending.append((wr, serial & 0xFFFF))
                wr = (wr + 1) % (2 * depth)
                serial += 1
            if action < 0.2:
                committed += pending
                pending = []
            elif action < 0.25:
                wr = (wr - len(pending)) % (2 * depth)
                pending = []
        assert len(received) > 500

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(testbench)
    sim.run()


def test_parser_rejects_a_bad_config():
    with pytest.raises(TypeError, match="Config must be a NicConfig"):
        Parser(config={"data_width": 64})
    with pytest.raises(ValueError, match="Depth must be a power of two"):
        PacketFifo(width=8, depth=12)
