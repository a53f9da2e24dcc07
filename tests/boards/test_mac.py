"""The GMII Ethernet MAC (boards/mac.py): what MacTx puts on the wire, what MacRx delivers and
drops, and the two back to back. Every stream runs with random input bubbles and output
backpressure; expected wire bytes come from Scapy frames, ``zlib.crc32`` and ``struct``."""

import random
import struct
import zlib

import pytest
from amaranth import Elaboratable, Module
from amaranth.sim import Simulator
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from boards.mac import MacRx, MacTx
from sim.rtlpackets import frame_beats, frame_from_beats
from sim.tb.amsim import StreamCollector, StreamDriver

PERIOD = 8e-9       # 125 MHz: one GMII byte per cycle

# ---------------------------------------------------------------------------------------------
# Reference model and helpers
# ---------------------------------------------------------------------------------------------


def padded(frame):
    """The frame as a MAC sends (and delivers) it: zero padding up to 60 bytes."""
    return frame + bytes(max(0, 60 - len(frame)))


def with_fcs(frame):
    return frame + struct.pack("<I", zlib.crc32(frame))


def wire(frame, *, preamble=7):
    """GMII bytes of a frame: preamble, SFD, padded frame, FCS."""
    return bytes([0x55] * preamble + [0xD5]) + with_fcs(padded(frame))


def scapy_frame(payload_len, *, seed):
    rng = random.Random(seed)
    return bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") /
                 IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=49152 + seed, dport=4791) /
                 Raw(bytes(rng.randrange(256) for _ in range(payload_len))))


def short_frame(length, *, seed):
    """A frame shorter than 60 bytes: only an Ethernet header and a few payload bytes."""
    rng = random.Random(seed)
    return bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01", type=0x88B5) /
                 Raw(bytes(rng.randrange(256) for _ in range(length - 14))))


def beats(frame, data_width):
    return [{"data": d, "keep": k, "first": f, "last": la}
            for d, k, f, la in frame_beats(frame, data_width)]


def collected_frames(sink, data_width):
    """Frames out of a collector, checking the beat rules (first, keep, last) on the way."""
    full = (1 << data_width // 8) - 1
    frames, current = [], []
    for beat in sink.as_dicts():
        current.append(beat)
        if beat["last"]:
            assert current[0]["first"] == 1
            assert all(b["first"] == 0 for b in current[1:])
            assert all(b["keep"] == full for b in current[:-1])
            frames.append(frame_from_beats([(b["data"], b["keep"]) for b in current],
                                           data_width))
            current = []
    return frames


class FramesDone:
    """Counts the frames a collector has completed, scanning each beat once."""

    def __init__(self, sink):
        self.sink = sink
        self.scanned = 0
        self.count = 0

    def __call__(self):
        items = self.sink.items
        self.count += sum(1 for item in items[self.scanned:] if item.last)
        self.scanned = len(items)
        return self.count


class GmiiMonitor:
    """Samples ``txd``/``tx_en``/``tx_er`` every cycle; ``bursts`` splits the record into frames."""

    def __init__(self, mac):
        self.mac = mac
        self.cycles = []
        self.ends = 0           # bursts completed so far

    async def process(self, ctx):
        mac = self.mac
        while True:
            _, _, txd, tx_en, tx_er = await ctx.tick().sample(mac.txd, mac.tx_en, mac.tx_er)
            if self.cycles and self.cycles[-1][0] and not tx_en:
                self.ends += 1
            self.cycles.append((tx_en, tx_er, txd))

    def bursts(self):
        """``[(gap_before, bytes)]`` for each complete burst of ``tx_en``."""
        out, current, gap = [], None, 0
        for tx_en, _, txd in self.cycles:
            if tx_en:
                if current is None:
                    current = bytearray()
                current.append(txd)
            elif current is not None:
                out.append((gap, bytes(current)))
                current, gap = None, 1
            else:
                gap += 1
        return out

    def tx_er_seen(self):
        return any(tx_er for _, tx_er, _ in self.cycles)


def gmii_cycles(wire_bytes, *, error_at=None):
    """``(rx_dv, rx_er, rxd)`` per cycle for a carrier event."""
    return [(1, int(n == error_at), byte) for n, byte in enumerate(wire_bytes)]


def idle(cycles):
    return [(0, 0, 0)] * cycles


async def wait_for(ctx, condition, *, timeout, what):
    for _ in range(timeout):
        if condition():
            return
        await ctx.tick()
    raise AssertionError(f"timed out waiting for {what}")


RX_COUNTERS = ["frames", "fcs_errors", "runts", "oversize", "rx_errors", "overflows",
               "preamble_errors"]


def counters(ctx, mac):
    return {name: ctx.get(getattr(mac, name)) for name in RX_COUNTERS}


def run_rx(mac, cycles, *, expected_frames, backpressure, seed, timeout=20_000):
    """Drive GMII cycles into ``mac``; return the delivered frames and the counters."""
    sim = Simulator(mac)
    sim.add_clock(PERIOD)
    sink = StreamCollector(mac.o, backpressure=backpressure, seed=seed)
    done = FramesDone(sink)
    sim.add_process(sink.process)
    result = {}

    async def bench(ctx):
        for rx_dv, rx_er, rxd in cycles:
            ctx.set(mac.rx_dv, rx_dv)
            ctx.set(mac.rx_er, rx_er)
            ctx.set(mac.rxd, rxd)
            await ctx.tick()
        ctx.set(mac.rx_dv, 0)
        ctx.set(mac.rx_er, 0)
        await wait_for(ctx, lambda: done() >= expected_frames, timeout=timeout,
                       what=f"{expected_frames} frames")
        await ctx.tick().repeat(50)         # nothing more may arrive
        result.update(counters(ctx, mac))

    sim.add_testbench(bench)
    sim.run()
    return collected_frames(sink, mac.data_width), result


# ---------------------------------------------------------------------------------------------
# Transmit
# ---------------------------------------------------------------------------------------------


def run_tx(mac, frames, *, bubbles, seed, expected=None, timeout=50_000):
    """Send ``frames`` through ``mac``; return the wire monitor and the counters once
    ``expected`` frames (default: all) have left."""
    expected = len(frames) if expected is None else expected
    sim = Simulator(mac)
    sim.add_clock(PERIOD)
    source = StreamDriver(mac.i, bubbles=bubbles, seed=seed)
    source.send([beat for frame in frames for beat in beats(frame, mac.data_width)])
    monitor = GmiiMonitor(mac)
    sim.add_process(source.process)
    sim.add_process(monitor.process)
    result = {}

    async def bench(ctx):
        await wait_for(ctx, lambda: monitor.ends >= expected, timeout=timeout,
                       what=f"{expected} frames on the wire")
        await ctx.tick().repeat(mac.ifg + 100)
        result["frames"] = ctx.get(mac.frames)
        result["oversize"] = ctx.get(mac.oversize)

    sim.add_testbench(bench)
    sim.run()
    return monitor, result


TX_FRAMES = [
    scapy_frame(100, seed=1),
    short_frame(20, seed=2),                # padded to 60
    scapy_frame(0, seed=3),                 # 62 bytes: no padding
    short_frame(59, seed=4),                # one byte of padding
    short_frame(60, seed=5),                # exactly the minimum
    scapy_frame(333, seed=6),               # a partial last beat
    short_frame(14, seed=7),                # the header alone
]


@pytest.mark.parametrize("data_width, ifg", [(64, 12), (8, 3), (32, 12)])
def test_tx_sends_preamble_sfd_frame_padding_and_fcs(data_width, ifg):
    """Each frame leaves as 7 x 0x55, 0xD5, the frame, zeros up to 60 bytes and the FCS
    (least significant byte first), with at least ``ifg`` idle cycles between frames."""
    mac = MacTx(data_width=data_width, ifg=ifg)
    monitor, result = run_tx(mac, TX_FRAMES, bubbles=0.4, seed=data_width)
    bursts = monitor.bursts()
    assert [burst for _, burst in bursts] == [wire(frame) for frame in TX_FRAMES]
    assert all(gap >= ifg for gap, _ in bursts[1:])
    assert not monitor.tx_er_seen()
    assert result == {"frames": len(TX_FRAMES), "oversize": 0}


def test_tx_back_to_back_frames_leave_at_line_rate():
    """With the next frame stored while one is on the wire, the gap is exactly ``ifg``."""
    frames = [scapy_frame(random.Random(n).randrange(0, 400), seed=n) for n in range(8)]
    mac = MacTx(data_width=64, ifg=12)
    monitor, _ = run_tx(mac, frames, bubbles=0.3, seed=11)
    bursts = monitor.bursts()
    assert [burst for _, burst in bursts] == [wire(frame) for frame in frames]
    assert [gap for gap, _ in bursts[1:]] == [12] * (len(frames) - 1)


def test_tx_drops_a_frame_longer_than_max_frame():
    """A frame the FIFO could never hold is dropped whole and counted; the others go out."""
    frames = [short_frame(60, seed=1), scapy_frame(300, seed=2), scapy_frame(62, seed=3)]
    assert len(frames[2]) == 124                # max_frame - FCS: the longest allowed
    mac = MacTx(data_width=64, max_frame=128)
    monitor, result = run_tx(mac, frames, bubbles=0.3, seed=5, expected=2)
    assert result == {"frames": 2, "oversize": 1}
    assert [burst for _, burst in monitor.bursts()] == [wire(frames[0]), wire(frames[2])]


# ---------------------------------------------------------------------------------------------
# Transmit to receive
# ---------------------------------------------------------------------------------------------


class Loopback(Elaboratable):
    """MacTx's GMII outputs wired to MacRx's inputs."""

    def __init__(self, data_width):
        self.tx = MacTx(data_width=data_width)
        self.rx = MacRx(data_width=data_width)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = self.tx
        m.submodules.rx = self.rx
        m.d.comb += [
            self.rx.rxd.eq(self.tx.txd),
            self.rx.rx_dv.eq(self.tx.tx_en),
            self.rx.rx_er.eq(self.tx.tx_er),
        ]
        return m


@pytest.mark.parametrize("data_width", [64, 32, 8])
def test_loopback_delivers_the_frames_sent(data_width):
    """Frames through MacTx and MacRx come out as they went in, short ones with their padding."""
    rng = random.Random(data_width)
    frames = [short_frame(14, seed=0), scapy_frame(1514 - 62, seed=1)]
    frames += [scapy_frame(rng.randrange(0, 300), seed=n) for n in range(2, 8)]
    frames += [short_frame(rng.randrange(14, 60), seed=n) for n in range(8, 11)]
    dut = Loopback(data_width)
    sim = Simulator(dut)
    sim.add_clock(PERIOD)
    source = StreamDriver(dut.tx.i, bubbles=0.3, seed=1)
    source.send([beat for frame in frames for beat in beats(frame, data_width)])
    sink = StreamCollector(dut.rx.o, backpressure=0.3, seed=2)
    done = FramesDone(sink)
    sim.add_process(source.process)
    sim.add_process(sink.process)

    async def bench(ctx):
        await wait_for(ctx, lambda: done() >= len(frames), timeout=20_000,
                       what="the frames back")
        await ctx.tick().repeat(50)
        assert counters(ctx, dut.rx) == {**dict.fromkeys(RX_COUNTERS, 0),
                                         "frames": len(frames)}
        assert ctx.get(dut.tx.frames) == len(frames)

    sim.add_testbench(bench)
    sim.run()
    assert collected_frames(sink, data_width) == [padded(frame) for frame in frames]


# ---------------------------------------------------------------------------------------------
# Receive: what is dropped, and why
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data_width", [64, 8])
def test_rx_drops_bad_frames_whole_and_counts_each_reason(data_width):
    """A flipped byte, a runt, an oversize frame, rx_er mid-frame and garbage before the SFD are
    each dropped and counted under their reason; the good frames around them (at the length
    limits, with short preambles, and after gaps down to one cycle) come out intact."""
    max_frame = 256
    rng = random.Random(7)
    good = [scapy_frame(rng.randrange(0, 150), seed=n) for n in range(10)]
    good[1] = short_frame(60, seed=20)                      # 64 bytes with FCS: the shortest
    good[3] = scapy_frame(max_frame - 4 - 62, seed=21)      # max_frame with FCS: the longest
    good[8] = scapy_frame(2, seed=22)                       # 64 bytes: whole beats only
    good[9] = scapy_frame(66, seed=23)                      # 128 bytes
    flipped = bytearray(wire(scapy_frame(80, seed=30)))
    flipped[40] ^= 0x10
    late_error = wire(scapy_frame(10, seed=37))
    # (carrier event, idle cycles after it): gaps of one cycle after good and bad frames.
    events = [
        (gmii_cycles(wire(good[0])), 1),
        (gmii_cycles(bytes(flipped)), 1),                                       # fcs_errors
        (gmii_cycles(wire(good[1])), 2),
        (gmii_cycles(b"\x55" * 7 + b"\xd5" + with_fcs(short_frame(59, seed=31))), 1),  # runts
        (gmii_cycles(wire(good[2], preamble=1)), 12),
        (gmii_cycles(wire(scapy_frame(max_frame - 4 - 62 + 1, seed=32))), 3),  # oversize
        (gmii_cycles(wire(good[3], preamble=0)), 1),
        (gmii_cycles(wire(scapy_frame(70, seed=33)), error_at=50), 1),         # rx_errors
        (gmii_cycles(wire(good[4], preamble=15)), 12),
        (gmii_cycles(b"\x55\x55\x12\x55" + wire(scapy_frame(70, seed=34))), 1),  # preamble
        (gmii_cycles(wire(good[5])), 1),
        (gmii_cycles(wire(good[6], preamble=0)), 1),
        (gmii_cycles(wire(good[7])), 1),
        (gmii_cycles(b"\x55" * 5), 2),                                         # preamble
        (gmii_cycles(wire(scapy_frame(2000, seed=35))), 1),  # oversize (and overflowing)
        (gmii_cycles(wire(scapy_frame(10, seed=36)), error_at=3), 1),  # rx_er in the preamble
        (gmii_cycles(wire(good[8])), 1),
        (gmii_cycles(late_error, error_at=len(late_error) - 1), 1),  # rx_er on the FCS
        (gmii_cycles(wire(good[9])), 5),
    ]
    cycles = idle(5)
    for event, gap in events:
        cycles += event + idle(gap)
    mac = MacRx(data_width=data_width, max_frame=max_frame)
    frames, result = run_rx(mac, cycles, expected_frames=len(good), backpressure=0.5, seed=3)
    assert frames == good
    assert result == {"frames": len(good), "fcs_errors": 1, "runts": 1, "oversize": 2,
                      "rx_errors": 3, "overflows": 0, "preamble_errors": 2}


def test_rx_drops_frames_that_do_not_fit_the_buffer():
    """With a small buffer and a slow reader, frames that find no room are dropped whole and
    counted as overflows; the ones delivered are intact and in order."""
    frames = [scapy_frame(100 + 7 * n, seed=n) for n in range(12)]
    cycles = idle(3)
    for frame in frames:
        cycles += gmii_cycles(wire(frame)) + idle(12)
    mac = MacRx(data_width=64, buffer_beats=64)
    sim = Simulator(mac)
    sim.add_clock(PERIOD)
    sink = StreamCollector(mac.o, backpressure=0.9, seed=4)
    done = FramesDone(sink)
    sim.add_process(sink.process)
    result = {}

    async def bench(ctx):
        for rx_dv, rx_er, rxd in cycles:
            ctx.set(mac.rx_dv, rx_dv)
            ctx.set(mac.rx_er, rx_er)
            ctx.set(mac.rxd, rxd)
            await ctx.tick()
        ctx.set(mac.rx_dv, 0)
        await wait_for(ctx, lambda: done() >= ctx.get(mac.frames), timeout=20_000,
                       what="the stored frames")
        result.update(counters(ctx, mac))

    sim.add_testbench(bench)
    sim.run()
    delivered = collected_frames(sink, 64)
    assert result["overflows"] > 0
    assert result["frames"] + result["overflows"] == len(frames)
    assert len(delivered) == result["frames"]
    positions = [frames.index(frame) for frame in delivered]
    assert positions == sorted(positions)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda: MacTx(data_width=12), r"data_width must be a multiple of 8 from 8 to 512, not 12"),
    (lambda: MacTx(data_width=1024), r"data_width .* not 1024"),
    (lambda: MacTx(ifg=0), r"ifg must be an integer from 1 to 255, not 0"),
    (lambda: MacTx(ifg=12.0), r"ifg must be .* not 12\.0"),
    (lambda: MacTx(max_frame=63), r"max_frame must be an integer from 64 to 16384 .* not 63"),
    (lambda: MacRx(data_width=0), r"data_width .* not 0"),
    (lambda: MacRx(max_frame=20000), r"max_frame .* not 20000"),
    (lambda: MacRx(buffer_beats=48), r"buffer_beats must be None or a power of two of at "
                                     r"least 2, not 48"),
    (lambda: MacRx(buffer_beats=1), r"buffer_beats .* not 1"),
])
def test_bad_parameters_are_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()
