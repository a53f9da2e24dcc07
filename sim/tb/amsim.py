"""Stream drivers for the Amaranth simulator (``amaranth.sim``), with bubbles and backpressure.

Every stream test runs with random input bubbles and output backpressure. These helpers keep
that to one line per stream::

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    source = StreamDriver(dut.i, bubbles=0.3, seed=1)
    sink = StreamCollector(dut.o, backpressure=0.3, seed=2)
    source.send([{"qpn": 1, ...}, ...])       # dicts, ints or data.Const, one per transfer
    sim.add_process(source.process)
    sim.add_process(sink.process)
    sim.add_testbench(check)                  # e.g. await sink.wait(n, ctx)
    sim.run_until(...) or sim.run()

Payloads read back are :class:`amaranth.lib.data.Const` views (``beat.qpn``) or plain ints for
non-struct streams; :meth:`StreamCollector.as_dicts` turns them into nested dicts.
"""

import random
from collections import deque

from amaranth.lib import data

__all__ = ["StreamDriver", "StreamCollector", "const_to_dict"]


def const_to_dict(value):
    """A :class:`data.Const` (struct/array view) as nested dicts/lists of ints."""
    if isinstance(value, data.Const):
        layout = value.shape()
        if isinstance(layout, data.ArrayLayout):
            return [const_to_dict(value[i]) for i in range(layout.length)]
        return {name: const_to_dict(value[name]) for name, _ in layout}
    return int(getattr(value, "value", value))     # enum members of any enum class


class StreamDriver:
    """Sends queued payloads into a stream input. ``bubbles`` is the probability of an idle
    cycle before each transfer. ``valid`` never waits for ``ready`` and the payload holds
    until the transfer, as the stream rules require."""

    def __init__(self, stream, *, bubbles=0.0, seed=0):
        self.stream = stream
        self.bubbles = bubbles
        self.rng = random.Random(seed)
        self.queue = deque()
        self.sent = 0

    def send(self, payloads):
        self.queue.extend(payloads)

    @property
    def idle(self):
        """True when everything queued has been transferred."""
        return not self.queue

    async def process(self, ctx):
        stream = self.stream
        while True:
            if not self.queue:
                ctx.set(stream.valid, 0)
                await ctx.tick()
                continue
            while self.bubbles and self.rng.random() < self.bubbles:
                ctx.set(stream.valid, 0)
                await ctx.tick()
            ctx.set(stream.payload, self.queue[0])
            ctx.set(stream.valid, 1)
            await ctx.tick().until(stream.ready)
            self.queue.popleft()
            self.sent += 1
            ctx.set(stream.valid, 0)


class StreamCollector:
    """Collects transfers from a stream output; ``backpressure`` is the probability that
    ``ready`` is low in a cycle. ``items`` holds the payloads in arrival order."""

    def __init__(self, stream, *, backpressure=0.0, seed=1):
        self.stream = stream
        self.backpressure = backpressure
        self.rng = random.Random(seed)
        self.items = []
        self.cycles_valid = 0           # cycles with valid high (for throughput checks)

    async def process(self, ctx):
        stream = self.stream
        while True:
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            ctx.set(stream.ready, int(ready))
            _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
            if valid:
                self.cycles_valid += 1
                if ready:
                    self.items.append(payload)

    async def wait(self, ctx, count, *, timeout=100_000):
        """Testbench helper: tick until ``count`` items arrived; fail after ``timeout`` cycles
        (a hang is a failure, never a silent pass)."""
        for _ in range(timeout):
            if len(self.items) >= count:
                return self.items
            await ctx.tick()
        raise AssertionError(f"{len(self.items)} of {count} transfers after {timeout} cycles")

    def as_dicts(self):
        return [const_to_dict(item) for item in self.items]
