# amaranth: UnusedElaboratable=no

import random
import zlib

import pytest
from amaranth.sim import Simulator
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from hdl.packet.crc import CRC32, icrc_bytes

ICRC_INIT = b"\xff" * 8         # the pseudo-LRH that RoCEv2 puts in front of the IP header
ETHERNET_HEADER_BYTES = 14
ROCE_V2_PORT = 4791


# --- Helpers ---------------------------------------------------------------------------------

def crc_beats(buffer, start, stop, lanes):
    """Cut ``buffer`` into beats (byte 0 in lane 0 of beat 0) that feed bytes ``start..stop-1``.

    Every beat of the buffer is yielded, as ``(data, keep, first, fed_until)``: beats before
    ``start`` and after ``stop`` have an all-zero ``keep`` (and garbage data), the beat holding
    ``start`` is the ``first`` one, and ``fed_until`` is the end of the bytes fed so far.
    """
    first_beat = start // lanes
    for base in range(0, len(buffer), lanes):
        keep = 0
        for lane in range(lanes):
            if start <= base + lane < stop:
                keep |= 1 << lane
        data = int.from_bytes(buffer[base:base + lanes].ljust(lanes, b"\0"), "little")
        yield data, keep, base // lanes == first_beat, min(max(base + lanes, start), stop)


async def feed_message(ctx, dut, rng, buffer, start, stop, bubbles=0.0):
    """Feed ``buffer[start:stop]`` with random bubbles, checking ``crc`` around every beat.

    Until the message's first beat ``crc`` must hold the previous value; from then on, after
    each beat it must be ``zlib.crc32(init_bytes + buffer[start:fed_until])``.
    """
    lanes = len(dut.keep)
    expected = ctx.get(dut.crc)
    started = False
    for data, keep, first, fed_until in crc_beats(buffer, start, stop, lanes):
        while rng.random() < bubbles:
            # A bubble carries garbage, which must be ignored.
            ctx.set(dut.valid, 0)
            ctx.set(dut.first, rng.getrandbits(1))
            ctx.set(dut.keep, rng.getrandbits(lanes))
            ctx.set(dut.data, rng.getrandbits(8 * lanes))
            await ctx.tick()
            assert ctx.get(dut.crc) == expected
        ctx.set(dut.valid, 1)
        ctx.set(dut.first, first)
        ctx.set(dut.keep, keep)
        ctx.set(dut.data, data)
        assert ctx.get(dut.crc) == expected, "crc must be registered, not combinational"
        await ctx.tick()
        started |= first
        if started:
            expected = zlib.crc32(dut.init_bytes + buffer[start:fed_until])
        assert ctx.get(dut.crc) == expected, f"after byte {fed_until} of {start}..{stop}"
        assert ctx.get(dut.state) == expected ^ 0xFFFFFFFF
    ctx.set(dut.valid, 0)


def run(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(testbench)
    sim.run()


# --- Random messages -------------------------------------------------------------------------

@pytest.mark.parametrize("init_bytes", [b"", ICRC_INIT], ids=["no_init", "icrc_init"])
@pytest.mark.parametrize("data_width,messages", [(64, 150), (128, 150), (8, 20), (256, 40)])
def test_random_messages_match_zlib(data_width, messages, init_bytes):
    """Back-to-back messages of 1..300 bytes, any start lane, random bubbles: zlib's CRC."""
    dut = CRC32(data_width=data_width, init_bytes=init_bytes)
    lanes = data_width // 8
    rng = random.Random(f"crc-{data_width}-{init_bytes.hex()}")

    async def testbench(ctx):
        assert ctx.get(dut.crc) == zlib.crc32(init_bytes), "reset value is the empty message"
        for _ in range(messages):
            length = rng.randint(1, 300)
            start = rng.randrange(lanes)
            buffer = rng.randbytes(start + length + rng.randrange(lanes))
            await feed_message(ctx, dut, rng, buffer, start, start + length, bubbles=0.3)

    run(dut, testbench)


@pytest.mark.parametrize("data_width", [64, 128])
def test_every_start_and_end_lane(data_width):
    """Single-beat messages covering every (start lane, end lane) pair of a first beat."""
    dut = CRC32(data_width=data_width, init_bytes=ICRC_INIT)
    lanes = data_width // 8
    rng = random.Random(data_width)

    async def testbench(ctx):
        for start in range(lanes):
            for stop in range(start + 1, lanes + 1):
                buffer = rng.randbytes(lanes)
                await feed_message(ctx, dut, rng, buffer, start, stop)

    run(dut, testbench)


def test_empty_keep():
    """An all-zero keep: on a first beat it starts an empty message, otherwise it is a no-op."""
    dut = CRC32(data_width=64, init_bytes=ICRC_INIT)

    async def testbench(ctx):
        async def beat(first, keep, data):
            ctx.set(dut.valid, 1)
            ctx.set(dut.first, first)
            ctx.set(dut.keep, keep)
            ctx.set(dut.data, data)
            await ctx.tick()
            return ctx.get(dut.crc)

        message = b"RoCEv2!"
        assert await beat(1, 0x7F, int.from_bytes(message, "little")) == \
            zlib.crc32(ICRC_INIT + message)
        assert await beat(0, 0x00, 0x0123456789ABCDEF) == zlib.crc32(ICRC_INIT + message)
        assert await beat(1, 0x00, 0x0123456789ABCDEF) == zlib.crc32(ICRC_INIT)

    run(dut, testbench)


# --- RoCEv2 ICRC against Scapy ---------------------------------------------------------------

def roce_frame(rng, ip_version):
    payload = Raw(rng.randbytes(rng.randint(0, 200)))
    bth = BTH(opcode=rng.choice([0x04, 0x0A, 0x11]), fecn=rng.getrandbits(1),
              becn=rng.getrandbits(1), dqpn=rng.getrandbits(24), ackreq=rng.getrandbits(1),
              psn=rng.getrandbits(24))
    udp = UDP(sport=rng.randrange(49152, 65536), dport=ROCE_V2_PORT)
    if ip_version == 6:
        ip = IPv6(tc=rng.getrandbits(8), fl=rng.getrandbits(20), hlim=rng.randint(1, 255),
                  src="fd00::1", dst="fd00::2")
    else:
        ip = IP(tos=rng.getrandbits(8), ttl=rng.randint(1, 255), id=rng.getrandbits(16),
                src="10.0.0.1", dst="10.0.0.2")
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip / udp / bth /
                 payload)


def mask_invariant_fields(frame, ip_version):
    """Set the fields that routers may change to all ones, as the ICRC definition does."""
    masked = bytearray(frame)
    ip = ETHERNET_HEADER_BYTES
    if ip_version == 6:
        masked[ip] |= 0x0F                          # traffic class, high nibble
        masked[ip + 1:ip + 4] = b"\xff" * 3         # traffic class low nibble, flow label
        masked[ip + 7] = 0xFF                       # hop limit
        udp = ip + 40
    else:
        masked[ip + 1] = 0xFF                       # type of service (DSCP, ECN)
        masked[ip + 8] = 0xFF                       # time to live
        masked[ip + 10:ip + 12] = b"\xff" * 2       # header checksum
        udp = ip + 4 * (frame[ip] & 0x0F)
    masked[udp + 6:udp + 8] = b"\xff" * 2           # UDP checksum
    masked[udp + 8 + 4] = 0xFF                      # BTH FECN, BECN, reserved
    return bytes(masked)


@pytest.mark.parametrize("ip_version", [6, 4])
@pytest.mark.parametrize("data_width", [64, 128])
def test_icrc_matches_scapy(data_width, ip_version):
    """The unit, seeded with the pseudo-LRH and fed the masked frame, gives Scapy's ICRC."""
    dut = CRC32(data_width=data_width, init_bytes=ICRC_INIT)
    rng = random.Random(f"icrc-{data_width}-{ip_version}")

    async def testbench(ctx):
        for _ in range(12):
            frame = roce_frame(rng, ip_version)
            masked = mask_invariant_fields(frame, ip_version)
            # Whole frame on the beats, as the parser sees it; the CRC covers IP .. payload.
            await feed_message(ctx, dut, rng, masked, ETHERNET_HEADER_BYTES, len(frame) - 4,
                               bubbles=0.3)
            assert icrc_bytes(ctx.get(dut.crc)) == frame[-4:]

    run(dut, testbench)


def test_icrc_bytes_is_little_endian():
    assert icrc_bytes(0x12345678) == b"\x78\x56\x34\x12"
    assert icrc_bytes(zlib.crc32(b"abc")) == BTH.pack_icrc(zlib.crc32(b"abc"))
    with pytest.raises(ValueError, match=r"CRC value must be .*, not 4294967296"):
        icrc_bytes(1 << 32)


# --- Parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,message", [
    ({"data_width": "64"}, TypeError, r"Data width must be an integer, not '64'"),
    ({"data_width": True}, TypeError, r"Data width must be an integer, not True"),
    ({"data_width": 0}, ValueError, r"Data width must be a multiple of 8 from 8 to 512, not 0"),
    ({"data_width": 60}, ValueError, r"Data width must be a multiple of 8 .*, not 60"),
    ({"data_width": 520}, ValueError, r"Data width must be a multiple of 8 .*, not 520"),
    ({"init_bytes": "\xff"}, TypeError, r"Initial bytes must be a bytes object, not '\xff'"),
    ({"init_bytes": None}, TypeError, r"Initial bytes must be a bytes object, not None"),
])
def test_parameter_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        CRC32(**kwargs)


def test_properties():
    dut = CRC32(data_width=128, init_bytes=bytearray(ICRC_INIT))
    assert (dut.data_width, dut.init_bytes) == (128, ICRC_INIT)
    assert (len(dut.data), len(dut.keep), len(dut.crc)) == (128, 16, 32)
