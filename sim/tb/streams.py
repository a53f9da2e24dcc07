"""Whole-frame drivers and monitors for ``amaranth.lib.stream`` ports under cocotb 2.x.

Amaranth flattens a stream port ``i`` into ``i__valid``, ``i__ready`` and ``i__payload`` (one
vector); the payload is packed and unpacked with the same ``lib.data`` layout the gateware
uses, so the bit layout has a single source of truth. Every source can insert random idle
cycles (bubbles) and every sink random backpressure, both seeded.

The per-cycle loops follow the AXI-stream convention: after a rising edge, a beat moved if
``valid`` and ``ready`` were both high at that edge.
"""

import random
from collections import deque

from amaranth.lib import data
from cocotb.triggers import RisingEdge

__all__ = ["pack", "unpack", "frame_to_beats", "beats_to_bytes", "StreamSource",
           "StreamSink"]


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------

def pack(layout, value):
    """A (nested) dict -> the integer image of ``layout``."""
    return layout.const(value).as_bits()


def unpack(layout, bits):
    """The integer image of ``layout`` -> a nested dict of ints."""
    return _to_dict(layout, layout.from_bits(bits))


def _to_dict(layout, const):
    out = {}
    for name, member in layout:
        value = const[name]
        if isinstance(member.shape, data.Layout):
            out[name] = _to_dict(member.shape, value)
        elif isinstance(value, data.Const):
            out[name] = value.as_bits()
        else:
            out[name] = int(value.value) if hasattr(value, "value") else int(value)
    return out


def frame_to_beats(frame, data_width, **extra):
    """Ethernet frame bytes -> beats ``{data, keep, first, last, **extra}``."""
    frame = bytes(frame)
    lanes = data_width // 8
    beats = []
    for offset in range(0, max(len(frame), 1), lanes):
        chunk = frame[offset:offset + lanes]
        beats.append({
            "data": int.from_bytes(chunk, "little"),
            "keep": (1 << len(chunk)) - 1,
            "first": int(offset == 0),
            "last": int(offset + lanes >= len(frame)),
            **extra,
        })
    return beats


def beats_to_bytes(beats, data_width):
    """Beats -> the bytes their ``keep`` marks valid (lanes in order)."""
    out = bytearray()
    lanes = data_width // 8
    for beat in beats:
        chunk = beat["data"].to_bytes(lanes, "little")
        out += bytes(chunk[lane] for lane in range(lanes) if beat["keep"] >> lane & 1)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Drivers
# ---------------------------------------------------------------------------------------------

def _handles(dut, prefix):
    return (getattr(dut, f"{prefix}__valid"), getattr(dut, f"{prefix}__ready"),
            getattr(dut, f"{prefix}__payload"))


class StreamSource:
    """Drive beats into a stream input; ``idle`` is the probability of a bubble before a beat."""

    def __init__(self, dut, prefix, layout, clock, *, idle=0.0, seed=0):
        self.valid, self.ready, self.payload = _handles(dut, prefix)
        self.layout = layout
        self.clock = clock
        self.idle = idle
        self.rng = random.Random(seed)
        self.queue = deque()
        self.sent = 0
        self.valid.value = 0
        self.payload.value = 0          # no X on the payload: X in comparisons can oscillate

    def send(self, beats):
        self.queue.extend(beats)

    @property
    def idle_now(self):
        return not self.queue and not int(self.valid.value)

    async def run(self):
        while True:
            await RisingEdge(self.clock)
            if int(self.valid.value) and int(self.ready.value):
                self.sent += 1
                self.valid.value = 0
            if not int(self.valid.value) and self.queue:
                if self.idle and self.rng.random() < self.idle:
                    continue
                self.payload.value = pack(self.layout, self.queue.popleft())
                self.valid.value = 1


class StreamSink:
    """Collect beats from a stream output; ``backpressure`` is the probability ready is low."""

    def __init__(self, dut, prefix, layout, clock, *, backpressure=0.0, seed=1):
        self.valid, self.ready, self.payload = _handles(dut, prefix)
        self.layout = layout
        self.clock = clock
        self.backpressure = backpressure
        self.rng = random.Random(seed)
        self.beats = []
        self.ready.value = 0

    async def run(self):
        while True:
            self.ready.value = int(not (self.backpressure
                                        and self.rng.random() < self.backpressure))
            await RisingEdge(self.clock)
            if int(self.valid.value) and int(self.ready.value):
                self.beats.append(unpack(self.layout, self.payload.value.to_unsigned()))

    def packets(self):
        """Complete packets so far: lists of beats, split at ``last``."""
        packets, current = [], []
        for beat in self.beats:
            current.append(beat)
            if beat["last"]:
                packets.append(current)
                current = []
        return packets
