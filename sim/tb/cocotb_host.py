"""Host-side models for cocotb benches of the NIC top: host memory (payload fetch and
placement), the register bus, work-request and completion streams.

Every model is a coroutine started by the bench; each is seeded and can insert bubbles or
backpressure like the stream drivers of :mod:`sim.tb.streams`.
"""

from collections import deque

from cocotb.triggers import RisingEdge

from hdl.interfaces import fetch_beat_layout, fetch_request_layout, place_beat_layout

from .streams import StreamSink, StreamSource, unpack

__all__ = ["HostMemory", "MemoryPort", "CocotbBus"]


class HostMemory:
    """Sparse byte-addressed memory. Unwritten bytes read as zero."""

    def __init__(self):
        self.bytes = {}
        self.writes = 0

    def write(self, address, data):
        for offset, byte in enumerate(data):
            self.bytes[address + offset] = byte
        self.writes += len(data)

    def read(self, address, length):
        return bytes(self.bytes.get(address + i, 0) for i in range(length))


class MemoryPort:
    """Serves a NIC's ``fetch_req``/``fetch`` (payload reads) and ``place`` (writes) ports from
    a :class:`HostMemory`, with ``latency`` cycles before a fetch answers."""

    def __init__(self, dut, prefix, config, memory, clock, *, idle=0.0, backpressure=0.0,
                 seed=0, latency=4):
        self.config = config
        self.memory = memory
        self.clock = clock
        self.latency = latency
        self.lanes = config.data_width // 8
        self.requests = StreamSink(dut, f"{prefix}fetch_req", fetch_request_layout(config),
                                   clock, backpressure=backpressure, seed=seed)
        self.beats = StreamSource(dut, f"{prefix}fetch", fetch_beat_layout(config), clock,
                                  idle=idle, seed=seed + 1)
        self.place = StreamSink(dut, f"{prefix}place", place_beat_layout(config), clock,
                                backpressure=backpressure, seed=seed + 2)
        self.place_layout = place_beat_layout(config)
        self.placed_packets = 0

    def drivers(self):
        return [self.requests, self.beats, self.place]

    async def run(self):
        served = placed = 0
        pending = deque()
        cycle = 0
        while True:
            await RisingEdge(self.clock)
            cycle += 1
            beats = self.requests.beats
            while served < len(beats):
                pending.append((cycle + self.latency, beats[served]))
                served += 1
            while pending and pending[0][0] <= cycle:
                _, request = pending.popleft()
                data = self.memory.read(request["addr"], request["length"])
                out = []
                for offset in range(0, len(data), self.lanes):
                    chunk = data[offset:offset + self.lanes]
                    out.append({"data": int.from_bytes(chunk, "little"),
                                "keep": (1 << len(chunk)) - 1,
                                "last": int(offset + self.lanes >= len(data))})
                self.beats.send(out)
            raw = self.place.raw
            while placed < len(raw):
                beat = unpack(self.place_layout, raw[placed])
                placed += 1
                keep = beat["keep"]
                data = beat["data"].to_bytes(self.lanes, "little")
                for lane in range(self.lanes):
                    if keep >> lane & 1:
                        self.memory.write(beat["addr"] + lane, data[lane:lane + 1])
                if beat["last"]:
                    self.placed_packets += 1


class CocotbBus:
    """Register bus access for :class:`sim.driver.RegisterDriver` under cocotb. Accesses from
    several coroutines are serialised."""

    def __init__(self, dut, prefix, clock):
        self.addr = getattr(dut, f"{prefix}addr")
        self.w_data = getattr(dut, f"{prefix}w_data")
        self.w_en = getattr(dut, f"{prefix}w_en")
        self.r_en = getattr(dut, f"{prefix}r_en")
        self.r_data = getattr(dut, f"{prefix}r_data")
        self.clock = clock
        self.w_en.value = 0
        self.r_en.value = 0
        self.addr.value = 0
        self.w_data.value = 0
        self._busy = False

    async def _acquire(self):
        while self._busy:
            await RisingEdge(self.clock)
        self._busy = True

    async def write(self, address, value):
        await self._acquire()
        self.addr.value = address
        self.w_data.value = value
        self.w_en.value = 1
        await RisingEdge(self.clock)
        self.w_en.value = 0
        self._busy = False

    async def read(self, address):
        await self._acquire()
        self.addr.value = address
        self.r_en.value = 1
        await RisingEdge(self.clock)
        self.r_en.value = 0
        await RisingEdge(self.clock)
        value = int(self.r_data.value.to_unsigned())
        self._busy = False
        return value
