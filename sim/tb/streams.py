"""Whole-frame drivers and monitors for ``amaranth.lib.stream`` ports under cocotb 2.x.

Amaranth flattens a stream port ``i`` into ``i__valid``, ``i__ready`` and ``i__payload`` (one
vector); the payload is packed and unpacked with the same ``lib.data`` layout the gateware
uses, so the bit layout has a single source of truth. Every source can insert random idle
cycles (bubbles) and every sink random backpressure, both seeded.

The per-cycle loops follow the AXI-stream convention: after a rising edge, a beat moved if
``valid`` and ``ready`` were both high at that edge.
"""

import enum
import random
from collections import deque

from amaranth.lib import data
from cocotb.triggers import RisingEdge

from ..rtlpackets import frame_from_beats, payload_beats

__all__ = ["pack", "unpack", "frame_to_beats", "beats_to_bytes", "StreamSource",
           "StreamSink"]


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------

def _plan(layout):
    """[(name, offset, width, sub-plan or None)] of a layout, cached: packing and unpacking
    with plain integer operations is far faster than through ``lib.data.Const`` objects, and
    a testbench packs or unpacks every beat."""
    plan = _PLANS.get(id(layout))
    if plan is None:
        plan = []
        for name, field in layout:
            sub = _plan(field.shape) if isinstance(field.shape, data.Layout) else None
            plan.append((name, field.offset, field.width, sub))
        _PLANS[id(layout)] = plan
        _KEEP_ALIVE.append(layout)
    return plan


_PLANS = {}
_KEEP_ALIVE = []        # ids stay unique while the layouts live


def _pack(plan, value):
    bits = 0
    for name, offset, width, sub in plan:
        v = value.get(name, 0)
        if isinstance(v, dict):
            v = _pack(sub, v)
        elif isinstance(v, enum.Enum):
            v = v.value
        bits |= (int(v) & ((1 << width) - 1)) << offset
    return bits


def _unpack(plan, bits):
    out = {}
    for name, offset, width, sub in plan:
        v = (bits >> offset) & ((1 << width) - 1)
        out[name] = _unpack(sub, v) if sub is not None else v
    return out


def pack(layout, value):
    """A (nested) dict -> the integer image of ``layout``; missing fields are 0."""
    return _pack(_plan(layout), value)


def unpack(layout, bits):
    """The integer image of ``layout`` -> a nested dict of ints."""
    return _unpack(_plan(layout), bits)


def frame_to_beats(frame, data_width, **extra):
    """Frame (or payload) bytes -> beats ``{data, keep, first, last, **extra}``; no bytes is
    one beat with ``keep == 0`` (a packet without payload)."""
    return [{"data": data_, "keep": keep, "first": int(first), "last": int(last), **extra}
            for data_, keep, first, last in payload_beats(bytes(frame), data_width)]


def beats_to_bytes(beats, data_width):
    """Beats -> the bytes their ``keep`` marks valid."""
    return frame_from_beats([(b["data"], b["keep"]) for b in beats], data_width)


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

    async def run(self):
        # A write to a handle is applied later in the time step, so reading it back right
        # away gives the old value: the driver keeps its own copy of `valid`.
        valid = False
        while True:
            await RisingEdge(self.clock)
            if valid and int(self.ready.value):
                self.sent += 1
                valid = False
            if not valid and self.queue:
                if self.idle and self.rng.random() < self.idle:
                    self.valid.value = 0
                    continue
                beat = self.queue.popleft()
                self.payload.value = beat if isinstance(beat, int) else pack(self.layout, beat)
                valid = True
            self.valid.value = int(valid)


class StreamSink:
    """Collect beats from a stream output; ``backpressure`` is the probability ready is low."""

    def __init__(self, dut, prefix, layout, clock, *, backpressure=0.0, seed=1):
        self.valid, self.ready, self.payload = _handles(dut, prefix)
        self.layout = layout
        self.clock = clock
        self.backpressure = backpressure
        self.rng = random.Random(seed)
        self.raw = []
        self._beats = []
        self.packet_count = 0           # beats with `last` so far, counted without unpacking
        self.ready.value = 0

    async def run(self):
        last_bit = next((offset for name, offset, _, _ in _plan(self.layout) if name == "last"),
                        None)
        while True:
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            self.ready.value = int(ready)
            await RisingEdge(self.clock)
            if not self.valid.value.is_resolvable:
                raise AssertionError(f"{self.valid._name} is {self.valid.value} (not 0 or 1)")
            if ready and int(self.valid.value):
                bits = self.payload.value.to_unsigned()
                self.raw.append(bits)
                if last_bit is not None and bits >> last_bit & 1:
                    self.packet_count += 1

    @property
    def beats(self):
        """Every beat received so far, unpacked (cached)."""
        while len(self._beats) < len(self.raw):
            self._beats.append(unpack(self.layout, self.raw[len(self._beats)]))
        return self._beats

    def packets(self):
        """Complete packets so far: lists of beats, split at ``last``."""
        packets, current = [], []
        for beat in self.beats:
            current.append(beat)
            if beat["last"]:
                packets.append(current)
                current = []
        return packets
