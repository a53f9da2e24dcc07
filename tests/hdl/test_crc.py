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


class Pipe:
    """Drives the unit one cycle at a time and checks ``crc``/``match`` against the model.

    ``expected[n]`` is the CRC of the message after the beats taken by the first ``n`` enabled
    clock edges; after ``n`` enabled edges ``crc`` must be ``expected[n - 2]`` and ``match``
    must say whether ``expected[n - 1]`` is the residue (``CRC32.LATENCY`` = 3 stages: a beat
    taken at edge ``j`` shows in ``crc`` after edge ``j + 2``).
    """

    def __init__(self, ctx, dut, rng, *, stalls=0.0):
        self.ctx, self.dut, self.rng, self.stalls = ctx, dut, rng, stalls
        self.lanes = len(dut.keep)
        self.message = None                      # bytes of the current message, or None
        self.expected = [zlib.crc32(dut.init_bytes)] * 2

    def check(self):
        assert self.ctx.get(self.dut.crc) == self.expected[-3 if len(self.expected) > 2 else 0]
        assert self.ctx.get(self.dut.state) == self.ctx.get(self.dut.crc) ^ 0xFFFFFFFF
        if self.dut.residue is not None:
            assert self.ctx.get(self.dut.match) == (self.expected[-2] == self.dut.residue)

    async def cycle(self, valid, first=0, keep=0, data=0):
        """One enabled cycle (after any random disabled ones) with these inputs."""
        ctx, dut, rng = self.ctx, self.dut, self.rng
        while rng.random() < self.stalls:
            # A disabled cycle, with garbage on every input: nothing moves.
            ctx.set(dut.en, 0)
            ctx.set(dut.valid, rng.getrandbits(1))
            ctx.set(dut.first, rng.getrandbits(1))
            ctx.set(dut.keep, rng.getrandbits(self.lanes))
            ctx.set(dut.data, rng.getrandbits(8 * self.lanes))
            await ctx.tick()
            self.check()
        ctx.set(dut.en, 1)
        ctx.set(dut.valid, valid)
        ctx.set(dut.first, first if valid else rng.getrandbits(1))
        ctx.set(dut.keep, keep if valid else rng.getrandbits(self.lanes))
        ctx.set(dut.data, data if valid else rng.getrandbits(8 * self.lanes))
        self.check()                             # registered: the inputs change nothing yet
        await ctx.tick()
        current = self.expected[-1]
        if valid:
            kept = bytes((data >> 8 * lane) & 0xFF for lane in range(self.lanes)
                         if keep >> lane & 1)
            if first:
                self.message = kept
            elif self.message is not None:
                self.message += kept
            if self.message is not None:
                current = zlib.crc32(self.dut.init_bytes + self.message)
        self.expected.append(current)
        self.check()

    async def flush(self):
        for _ in range(CRC32.LATENCY):
            await self.cycle(0)


async def feed_message(pipe, buffer, start, stop, bubbles=0.0):
    """Feed ``buffer[start:stop]`` (whole beats of the buffer, see :func:`crc_beats`) with
    random bubbles, the model checking ``crc`` after every cycle."""
    for data, keep, first, _fed_until in crc_beats(buffer, start, stop, pipe.lanes):
        while pipe.rng.random() < bubbles:
            await pipe.cycle(0)                  # a bubble carries garbage, to be ignored
        await pipe.cycle(1, first, keep, data)


def run(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(testbench)
    sim.run()


# --- Random messages -------------------------------------------------------------------------

@pytest.mark.parametrize("init_bytes", [b"", ICRC_INIT], ids=["no_init", "icrc_init"])
@pytest.mark.parametrize("data_width,messages", [(64, 150), (128, 150), (8, 20), (256, 40)])
def test_random_messages_match_zlib(data_width, messages, init_bytes):
    """Back-to-back messages of 1..300 bytes, any start lane, random bubbles and disabled
    cycles: zlib's CRC, three enabled cycles later."""
    dut = CRC32(data_width=data_width, init_bytes=init_bytes)
    lanes = data_width // 8
    rng = random.Random(f"crc-{data_width}-{init_bytes.hex()}")

    async def testbench(ctx):
        assert ctx.get(dut.crc) == zlib.crc32(init_bytes), "reset value is the empty message"
        pipe = Pipe(ctx, dut, rng, stalls=0.2)
        for _ in range(messages):
            length = rng.randint(1, 300)
            start = rng.randrange(lanes)
            buffer = rng.randbytes(start + length + rng.randrange(lanes))
            await feed_message(pipe, buffer, start, start + length, bubbles=0.3)
        await pipe.flush()

    run(dut, testbench)


@pytest.mark.parametrize("data_width", [64, 256])
def test_back_to_back_full_rate(data_width):
    """Messages back to back with no bubble and ``en`` always high (II = 1), ending on every
    lane, including one-beat messages right after a partial last beat."""
    dut = CRC32(data_width=data_width, init_bytes=ICRC_INIT)
    lanes = data_width // 8
    rng = random.Random(f"b2b-{data_width}")

    async def testbench(ctx):
        pipe = Pipe(ctx, dut, rng)
        for n in range(3 * lanes):
            length = 1 + (n * 5) % (3 * lanes)
            await feed_message(pipe, rng.randbytes(length), 0, length)
        await pipe.flush()

    run(dut, testbench)


@pytest.mark.parametrize("data_width", [64, 128])
def test_every_start_and_end_lane(data_width):
    """Single-beat messages covering every (start lane, end lane) pair of a first beat."""
    dut = CRC32(data_width=data_width, init_bytes=ICRC_INIT)
    lanes = data_width // 8
    rng = random.Random(data_width)

    async def testbench(ctx):
        pipe = Pipe(ctx, dut, rng)
        for start in range(lanes):
            for stop in range(start + 1, lanes + 1):
                buffer = rng.randbytes(lanes)
                await feed_message(pipe, buffer, start, stop)
        await pipe.flush()

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
            ctx.set(dut.valid, 0)
            await ctx.tick().repeat(CRC32.LATENCY - 1)
            return ctx.get(dut.crc)

        message = b"RoCEv2!"
        assert await beat(1, 0x7F, int.from_bytes(message, "little")) == \
            zlib.crc32(ICRC_INIT + message)
        assert await beat(0, 0x00, 0x0123456789ABCDEF) == zlib.crc32(ICRC_INIT + message)
        assert await beat(1, 0x00, 0x0123456789ABCDEF) == zlib.crc32(ICRC_INIT)

    run(dut, testbench)


@pytest.mark.parametrize("data_width", [64, 128])
def test_residue_match(data_width):
    """``match``: a message followed by its own CRC (little-endian) gives the residue, one
    cycle before ``crc`` shows it; corrupted messages do not."""
    residue = zlib.crc32(zlib.crc32(b"").to_bytes(4, "little"))
    dut = CRC32(data_width=data_width, init_bytes=ICRC_INIT, residue=residue)
    lanes = data_width // 8
    rng = random.Random(f"residue-{data_width}")

    async def testbench(ctx):
        pipe = Pipe(ctx, dut, rng, stalls=0.2)
        matches = 0
        for n in range(60):
            start = rng.randrange(lanes)
            body = rng.randbytes(rng.randint(1, 100))
            message = body + icrc_bytes(zlib.crc32(ICRC_INIT + body))
            if n % 3 == 0:
                message = bytearray(message)
                message[rng.randrange(len(message))] ^= 1 << rng.randrange(8)
            else:
                matches += 1
            buffer = rng.randbytes(start) + bytes(message) + rng.randbytes(rng.randrange(lanes))
            await feed_message(pipe, buffer, start, start + len(message), bubbles=0.2)
            await pipe.flush()
            assert ctx.get(dut.match) == (n % 3 != 0)
        assert matches == 40

    run(dut, testbench)


# --- RoCEv2 ICRC against Scapy ---------------------------------------------------------------

def roce_frame(rng, ip_version):
    payload = Raw(rng.randbytes(rng.randint(0, 200)))
    bth = BTH(opcode=rng.choice([0x04, 0xCA, 0xDC]), fecn=rng.getrandbits(1),
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
        pipe = Pipe(ctx, dut, rng, stalls=0.2)
        for _ in range(12):
            frame = roce_frame(rng, ip_version)
            masked = mask_invariant_fields(frame, ip_version)
            # Whole frame on the beats, as the parser sees it; the CRC covers IP .. payload.
            await feed_message(pipe, masked, ETHERNET_HEADER_BYTES, len(frame) - 4,
                               bubbles=0.3)
            await pipe.flush()
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
    ({"residue": -1}, ValueError, r"Residue must be None or an integer .*, not -1"),
    ({"residue": 1 << 32}, ValueError, r"Residue must be None or an integer .*, not 4294967296"),
])
def test_parameter_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        CRC32(**kwargs)


def test_properties():
    dut = CRC32(data_width=128, init_bytes=bytearray(ICRC_INIT))
    assert (dut.data_width, dut.init_bytes) == (128, ICRC_INIT)
    assert (len(dut.data), len(dut.keep), len(dut.crc)) == (128, 16, 32)
    assert dut.residue is None and CRC32(residue=0x1234).residue == 0x1234
