"""A fast cocotb harness for whole-NIC benches: one coroutine drives every stream port.

The per-port coroutines of :mod:`sim.tb.streams` cost one scheduler wake-up each per clock
cycle; a two-NIC bench with 8 planes has ~40 stream ports, and the scheduler, not the
simulator, then sets the pace. Here a single :class:`CycleLoop` awaits the clock once per
cycle and steps every awake agent in turn; agents touch a handle only when they must
(``ready`` of a source only while it drives ``valid``, writes only when a value changes).
An agent sleeps while its step would do nothing: a source with nothing to send, a sink
without backpressure while its ``valid`` is low (a value-change trigger on ``valid`` wakes
it), so an idle port costs no handle access at all. Host memory is a few ``bytearray``
regions instead of a dictionary per byte.

The handshake convention is the one of :mod:`sim.tb.streams`: after a rising edge, a beat
moved if ``valid`` and ``ready`` were both high at that edge. Sources may insert random
bubbles and sinks random backpressure (seeded).
"""

import random
from collections import deque

import cocotb
from cocotb.triggers import RisingEdge

from hdl.interfaces import fetch_beat_layout, fetch_request_layout, place_beat_layout

from .streams import _plan, pack

__all__ = ["CycleLoop", "Source", "Sink", "FrameSource", "FrameSink", "RegionMemory",
           "MemoryAgent"]


def _field(layout, name):
    """(offset, width) of a top-level field of ``layout``."""
    for field_name, offset, width, _ in _plan(layout):
        if field_name == name:
            return offset, width
    raise KeyError(name)


class CycleLoop:
    """Steps every awake agent once per rising edge of ``clock``, in the order they were
    added; ``cycle`` counts the edges. An agent has an ``awake`` attribute and a ``step``
    method; it may clear ``awake`` only when its ``step`` would change nothing (no handle
    access, no random draw), and whatever gives it work sets ``awake`` again."""

    def __init__(self, clock):
        self.clock = clock
        self.agents = []
        self.cycle = 0
        self.hooks = []         # callables(cycle) run after the agents

    def add(self, *agents):
        self.agents.extend(agents)
        return agents[0] if len(agents) == 1 else agents

    async def run(self):
        edge = RisingEdge(self.clock)
        agents = self.agents
        hooks = self.hooks
        while True:
            await edge
            self.cycle += 1
            for agent in agents:
                if agent.awake:
                    agent.step()
            for hook in hooks:
                hook(self.cycle)


class Source:
    """Drives packed beats (ints) into a stream input; ``idle``: probability of a bubble."""

    def __init__(self, dut, prefix, *, idle=0.0, seed=0):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.idle = idle
        self.rng = random.Random(seed)
        self.queue = deque()
        self.sent = 0
        self._valid = False
        self.awake = False
        self.valid.value = 0
        self.payload.value = 0

    def send(self, beats):
        self.queue.extend(beats)
        self.awake = True

    @property
    def busy(self):
        return self._valid or bool(self.queue)

    def step(self):
        if self._valid:
            if not int(self.ready.value):
                return
            self.sent += 1
        elif not self.queue:
            self.awake = False          # idle and nothing to send: touch no handle
            return
        if self.queue and not (self.idle and self.rng.random() < self.idle):
            self.payload.value = self.queue.popleft()
            if not self._valid:
                self.valid.value = 1
                self._valid = True
        elif self._valid:
            self.valid.value = 0
            self._valid = False


class Sink:
    """Takes beats from a stream output and hands each (packed int) to ``on_beat``;
    ``backpressure``: probability that ``ready`` is low in a cycle."""

    def __init__(self, dut, prefix, on_beat, *, backpressure=0.0, seed=1):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.on_beat = on_beat
        self.backpressure = backpressure
        self.rng = random.Random(seed)
        self._ready = True
        self.ready.value = 1
        self.beats = 0
        self.awake = True
        if not backpressure:
            cocotb.start_soon(self._watch())

    async def _watch(self):
        """Wake the sink whenever ``valid`` rises: it is then read at the next clock edge,
        as it would have been by a sink that never slept."""
        rise = RisingEdge(self.valid)
        while True:
            await rise
            self.awake = True

    def step(self):
        if self._ready and int(self.valid.value):
            self.beats += 1
            self.on_beat(self.payload.value.to_unsigned())
        elif not self.backpressure:
            self.awake = False          # valid is low: sleep until it rises
            return
        if self.backpressure:
            ready = self.rng.random() >= self.backpressure
            if ready != self._ready:
                self.ready.value = int(ready)
                self._ready = ready


def _beat_fields(layout):
    data_at, data_w = _field(layout, "data")
    keep_at, keep_w = _field(layout, "keep")
    last_at, _ = _field(layout, "last")
    first_at = _field(layout, "first")[0] if any(
        name == "first" for name, *_ in _plan(layout)) else None
    return data_at, data_w, keep_at, keep_w, last_at, first_at


class FrameSource(Source):
    """Sends whole frames (bytes) as beats of a ``data/keep/first/last`` layout."""

    def __init__(self, dut, prefix, layout, *, idle=0.0, seed=0):
        super().__init__(dut, prefix, idle=idle, seed=seed)
        (self._data_at, data_w, self._keep_at, _, self._last_at,
         self._first_at) = _beat_fields(layout)
        self.lanes = data_w // 8
        self.frames = 0

    def send_frame(self, frame):
        lanes = self.lanes
        frame = bytes(frame)
        count = max(1, -(-len(frame) // lanes))
        beats = []
        for index in range(count):
            chunk = frame[index * lanes:(index + 1) * lanes]
            bits = (int.from_bytes(chunk, "little") << self._data_at
                    | ((1 << len(chunk)) - 1) << self._keep_at)
            if index == count - 1:
                bits |= 1 << self._last_at
            if index == 0 and self._first_at is not None:
                bits |= 1 << self._first_at
            beats.append(bits)
        self.send(beats)
        self.frames += 1


class FrameSink(Sink):
    """Reassembles frames from beats and hands each (bytes) to ``on_frame``."""

    def __init__(self, dut, prefix, layout, on_frame, *, backpressure=0.0, seed=1):
        super().__init__(dut, prefix, self._beat, backpressure=backpressure, seed=seed)
        (self._data_at, data_w, self._keep_at, keep_w, self._last_at,
         _) = _beat_fields(layout)
        self.lanes = data_w // 8
        self._data_mask = (1 << data_w) - 1
        self._keep_mask = (1 << keep_w) - 1
        self.on_frame = on_frame
        self._parts = []
        self.frames = 0

    def _beat(self, bits):
        keep = bits >> self._keep_at & self._keep_mask
        data = (bits >> self._data_at & self._data_mask).to_bytes(self.lanes, "little")
        if keep == self._keep_mask:
            self._parts.append(data)
        else:
            self._parts.append(bytes(data[i] for i in range(self.lanes) if keep >> i & 1))
        if bits >> self._last_at & 1:
            frame = b"".join(self._parts)
            self._parts = []
            self.frames += 1
            self.on_frame(frame)


class RegionMemory:
    """Host memory as a few regions (``bytearray``); an access outside every region raises."""

    def __init__(self):
        self.regions = []       # (base, bytearray)
        self.writes = 0

    def add(self, base, size):
        self.regions.append((base, bytearray(size)))

    def _find(self, address, length):
        for base, buffer in self.regions:
            if base <= address and address + length <= base + len(buffer):
                return base, buffer
        raise ValueError(f"host access [{address:#x}, +{length}) outside every region")

    def write(self, address, data):
        base, buffer = self._find(address, len(data))
        buffer[address - base:address - base + len(data)] = data
        self.writes += len(data)

    def read(self, address, length):
        base, buffer = self._find(address, length)
        return bytes(buffer[address - base:address - base + length])


class MemoryAgent:
    """A NIC's payload fetch (``fetch_req`` -> ``fetch``) and placement (``place``) ports over
    a :class:`RegionMemory`, answering a fetch ``latency`` cycles after its request."""

    def __init__(self, dut, prefix, config, memory, loop, *, latency=4, idle=0.0,
                 backpressure=0.0, seed=0):
        self.memory = memory
        self.loop = loop
        self.latency = latency
        self.lanes = config.data_width // 8
        self.pending = deque()
        req = fetch_request_layout(config)
        self._addr = _field(req, "addr")
        self._length = _field(req, "length")
        place = place_beat_layout(config)
        self._p_addr = _field(place, "addr")
        (self._p_data_at, data_w, self._p_keep_at, keep_w, self._p_last_at,
         _) = _beat_fields(place)
        self._p_keep_mask = (1 << keep_w) - 1
        self._p_data_mask = (1 << data_w) - 1
        self.fetch_layout = fetch_beat_layout(config)
        self.requests = Sink(dut, f"{prefix}fetch_req", self._request,
                             backpressure=backpressure, seed=seed)
        self.beats = Source(dut, f"{prefix}fetch", idle=idle, seed=seed + 1)
        self.place = Sink(dut, f"{prefix}place", self._place, backpressure=backpressure,
                          seed=seed + 2)
        self.placed_bytes = 0
        self.fetched_bytes = 0
        self.awake = False

    def agents(self):
        return [self.requests, self.beats, self.place, self]

    def _request(self, bits):
        at, width = self._addr
        addr = bits >> at & ((1 << width) - 1)
        at, width = self._length
        length = bits >> at & ((1 << width) - 1)
        self.pending.append((self.loop.cycle + self.latency, addr, length))
        self.awake = True

    def step(self):
        pending = self.pending
        if not pending:
            self.awake = False
            return
        while pending and pending[0][0] <= self.loop.cycle:
            _, addr, length = pending.popleft()
            data = self.memory.read(addr, length)
            self.fetched_bytes += length
            lanes = self.lanes
            count = -(-length // lanes)         # no beats for a zero-length fetch
            for index in range(count):
                chunk = data[index * lanes:(index + 1) * lanes]
                self.beats.send([pack(self.fetch_layout, {
                    "data": int.from_bytes(chunk, "little"),
                    "keep": (1 << len(chunk)) - 1, "last": int(index == count - 1)})])

    def _place(self, bits):
        at, width = self._p_addr
        addr = bits >> at & ((1 << width) - 1)
        keep = bits >> self._p_keep_at & self._p_keep_mask
        data = (bits >> self._p_data_at & self._p_data_mask).to_bytes(self.lanes, "little")
        if keep == self._p_keep_mask:
            self.memory.write(addr, data)
            self.placed_bytes += self.lanes
        else:
            for lane in range(self.lanes):
                if keep >> lane & 1:
                    self.memory.write(addr + lane, data[lane:lane + 1])
                    self.placed_bytes += 1
