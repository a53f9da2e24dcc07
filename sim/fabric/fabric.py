"""The multi-plane fabric: planes x paths between two endpoints (or a switch per plane
joining up to 16), event driven, in ns.

A frame handed to :meth:`Fabric.send` crosses, on its plane and in its direction:

1. the plane's port link: a FIFO queue (ECN marking, trimming, tail drop) in front of a
   serializer at the plane rate;
2. the path the ECMP hash picks, optionally with its own queue and serializer
   (``path_rate_gbps``), then the path's propagation latency;
3. with more than two endpoints only: the plane's switch, which forwards the frame by its
   destination MAC to its egress port towards that endpoint: a second queue of the same kind
   (ECN marking, trimming, tail drop) at the plane rate, cut-through (an idle egress port
   adds no delay), where the frames of several senders to one receiver meet;
4. the failure schedule, random and burst loss, corruption, reordering and duplication.

With two endpoints there is no switch stage: each port link already carries the traffic
of one sender to one receiver, which is all an egress port towards that receiver would see
(and an egress port fed at its own rate by one sender never queues). The port link is then
the queue whose delays :class:`~sim.fabric.stats.Statistics` samples as the egress queue.

A *hostile source* (``hostile``, the fuzzer's: ``sim/fuzz.py``) stands beside the impairments:
a callable asked, at every hand-over and whenever a bench calls :meth:`Fabric.run_hostile`, for
forged frames, which :meth:`Fabric.inject` puts on a plane towards an endpoint as an attacker
on the last hop would: past every queue and impairment, one path latency later, marked
``hostile``.

With two endpoints everything is decided at send time (the queues are FIFO, so a later frame
cannot change an earlier one's fate); :meth:`Fabric.deliver` only pops the frames that are
due. With a switch, frames of several senders reach an egress port in the order of their
arrival there, not of their hand-over: the fabric decides a frame's fate at the egress port
when the bench's time reaches its arrival there (in :meth:`Fabric.deliver` and
:meth:`Fabric.next_arrival`), which is exact because every later hand-over arrives later.
Times are ns at the interface and integer picoseconds inside, so back-to-back arrival times
are exact.
"""

import heapq
import math
import random
import zlib
from collections import deque
from typing import NamedTuple

from scapy.compat import raw
from scapy.layers.l2 import Ether

from sim import packets as pk

from .config import FabricConfig
from .frames import mark_ce, parse, roce_payload_bytes
from .stats import Statistics, in_us

__all__ = ["Fabric", "Record"]

_ICRC_MASKED_BTH_BYTE = 4       # FECN/BECN/resv6: masked in the ICRC, so flipping it is unseen


class Record(NamedTuple):
    """One captured frame. ``arrival_ns`` is None for a dropped frame; ``frame`` is the frame
    as delivered (after marking, trimming, corruption) or as it was when dropped."""
    sent_ns: float
    arrival_ns: float | None
    src: str
    dst: str
    plane: int
    path: int
    outcome: str
    marks: tuple
    frame: bytes
    sent_len: int

    @property
    def time_ns(self):
        """Capture timestamp: arrival for a delivered frame, hand-over for a dropped one."""
        return self.sent_ns if self.arrival_ns is None else self.arrival_ns

    @property
    def fate(self):
        return ",".join((self.outcome, *self.marks))


class _Link:
    """A FIFO in front of a serializer. Occupancy: bytes not yet fully serialized."""
    __slots__ = ("ps_per_byte", "overhead", "busy_until", "backlog", "occupancy", "last_wait")

    def __init__(self, rate_gbps, overhead_bytes):
        self.ps_per_byte = 8000 / rate_gbps
        self.overhead = overhead_bytes
        self.busy_until = 0
        self.backlog = deque()
        self.occupancy = 0
        self.last_wait = 0          # ps the last frame enqueued waited before serialization

    def occupancy_at(self, t_ps):
        backlog = self.backlog
        while backlog and backlog[0][0] <= t_ps:
            self.occupancy -= backlog.popleft()[1]
        return self.occupancy

    def enqueue(self, t_ps, nbytes):
        """Serialize ``nbytes`` arriving at ``t_ps``; returns when its last bit leaves."""
        start = max(t_ps, self.busy_until)
        self.last_wait = start - t_ps
        finish = start + self.serialization_ps(nbytes)
        self.busy_until = finish
        self.backlog.append((finish, nbytes))
        self.occupancy += nbytes
        return finish

    def serialization_ps(self, nbytes):
        return round((nbytes + self.overhead) * self.ps_per_byte)


class Fabric:
    """Two endpoints joined by ``planes`` planes of ``paths_per_plane`` paths each, or up to
    16 joined by a switch per plane (``config.endpoints`` and ``config.macs``).

    Parameters
    ----------
    config : :class:`~sim.fabric.config.FabricConfig`

    Members
    -------
    records : list of :class:`Record`
        Every frame, in hand-over order (when ``config.capture``).
    stats : :class:`~sim.fabric.stats.Statistics`

    hostile : callable or None
        The hostile source: ``hostile(now)`` (ns) returns the forged frames due by then, as
        ``(dst, plane, frame)``; each is injected (:meth:`inject`) at ``now``. Asked at every
        :meth:`send` (before the frame handed over) and at every :meth:`run_hostile`.

    A frame sent by one endpoint on plane p arrives at the other endpoint on plane p (NIC
    port p <-> plane p); with a switch, at the endpoint whose MAC (``config.macs``) the
    frame's destination MAC is (a frame to no endpoint, or back to its sender, is dropped as
    ``dropped-unroutable``). ``send`` times must not decrease. Frames the fabric cannot parse
    are forwarded as opaque frames (hashed on their first bytes, never marked or trimmed).
    """

    def __init__(self, config=None, *, hostile=None):
        if config is None:
            config = FabricConfig()
        if not isinstance(config, FabricConfig):
            raise ValueError(f"config must be a FabricConfig, not {config!r}")
        self.config = config
        c = config
        self._directions = {name: index for index, name in enumerate(c.endpoints)}
        count = len(c.endpoints)
        self.switched = count > 2
        self._peer = {} if self.switched else {c.endpoints[0]: c.endpoints[1],
                                               c.endpoints[1]: c.endpoints[0]}
        self._routes = {mac.to_bytes(6, "big"): name for name, mac in zip(c.endpoints, c.macs,
                                                                     strict=False)}
        self._ports = [[_Link(c.plane_rate_gbps(p), c.wire_overhead_bytes)
                        for p in range(c.planes)] for _ in range(count)]
        self._paths = None
        if c.path_rate_gbps is not None:
            self._paths = [[[_Link(c.path_rate_gbps, c.wire_overhead_bytes)
                             for _ in range(c.paths_per_plane)] for _ in range(c.planes)]
                           for _ in range(count)]
        # The switches' egress ports, [destination][plane], and the frames on their way to
        # one: a heap of (arrival of the last bit, serial, hand-over state).
        self._egress = [[_Link(c.plane_rate_gbps(p), c.wire_overhead_bytes)
                         for p in range(c.planes)] for _ in range(count)] \
            if self.switched else None
        self._pending = []
        self._latency_ps = [round(c.path_latency_ns(j) * 1000) for j in range(c.paths_per_plane)]
        # One generator per direction and plane: traffic on one cannot shift another's draws.
        self._rngs = [[random.Random(f"mrc-fabric/{c.seed}/{name}/{p}") for p in range(c.planes)]
                      for name in c.endpoints]
        self._bursting = [[False] * c.planes for _ in range(count)]
        self._salts = [zlib.crc32(f"ecmp/{c.seed}/{p}".encode()) for p in range(c.planes)]
        self._failures = [[[f for f in c.failures
                            if f.plane == p and f.direction in (None, name)]
                           for p in range(c.planes)] for name in c.endpoints]
        self._heap = []
        self._serial = 0
        self._next_ns = math.inf
        self._last_send_ps = 0
        self.records = []
        self.stats = Statistics(c.planes, c.bin_ns)
        self.hostile = hostile

    # -- the interface of a bench -------------------------------------------------------------

    def send(self, src, plane, frame, now):
        """Hand ``frame`` (bytes, without FCS) from endpoint ``src`` to plane ``plane`` at
        ``now`` ns. Returns the frame's :class:`Record` (its fate is decided at once), or,
        with a switch, None for a frame on its way to an egress port (its record is made when
        it leaves that port, or is dropped there)."""
        direction = self._directions.get(src)
        if direction is None:
            raise ValueError(f"src must be one of {', '.join(self.config.endpoints)}, "
                             f"not {src!r}")
        if not isinstance(plane, int) or not 0 <= plane < self.config.planes:
            raise ValueError(f"plane must be from 0 to {self.config.planes - 1}, not {plane!r}")
        now_ps = round(now * 1000)
        if now_ps < self._last_send_ps:
            raise ValueError(f"send times must not decrease: {now} ns after "
                             f"{self._last_send_ps / 1000} ns")
        self._last_send_ps = now_ps
        if self.hostile is not None:
            self.run_hostile(now)
        frame = bytes(frame)
        sent_len = len(frame)
        info = parse(frame)
        path = self.path_of(plane, frame, info)
        dst = self._route(src, frame) if self.switched else self._peer[src]
        marks = []

        def dropped(outcome, frame):
            return self._record(now_ps, None, src, dst, plane, path, outcome, marks, frame,
                                info, sent_len)

        if dst is None:
            return dropped("dropped-unroutable", frame)
        # Without a switch the port link is the queue towards the receiver: its delays are
        # the egress queue's.
        egress = None if self.switched else (dst, plane)
        frame, info, t_ps = self._queue(self._ports[direction][plane], now_ps, frame, info,
                                        marks, egress=egress)
        if t_ps is None:
            return dropped("dropped-queue", frame)
        if self._paths is not None:
            frame, info, t_ps = self._queue(self._paths[direction][plane][path], t_ps, frame,
                                            info, marks)
            if t_ps is None:
                return dropped("dropped-queue", frame)
        arrival_ps = t_ps + self._latency_ps[path]
        if self.switched:
            self._serial += 1
            heapq.heappush(self._pending, (arrival_ps, self._serial, now_ps, src, dst, plane,
                                           path, frame, info, marks, sent_len))
            self._next_ns = min(self._next_ns, arrival_ps / 1000)
            return None
        return self._impair(now_ps, arrival_ps, src, dst, plane, path, frame, info, marks,
                            sent_len)

    def _impair(self, now_ps, arrival_ps, src, dst, plane, path, frame, info, marks,
                sent_len):
        """The failure schedule, loss, corruption, reordering and duplication of a frame that
        left its last queue and arrives at ``arrival_ps``: push it, record it."""
        c = self.config
        direction = self._directions[src]
        rng = self._rngs[direction][plane]
        for failure in self._failures[direction][plane]:
            if (failure.path is None or failure.path == path) \
                    and failure.down_during(now_ps / 1000, arrival_ps / 1000):
                return self._record(now_ps, None, src, dst, plane, path, "dropped-failure",
                                    marks, frame, info, sent_len)
        if self._lost(direction, plane, rng):
            return self._record(now_ps, None, src, dst, plane, path, "dropped-loss", marks,
                                frame, info, sent_len)
        if c.corrupt and rng.random() < c.corrupt:
            frame = self._corrupt(frame, info, rng)
            marks.append("corrupted")
        if c.reorder and rng.random() < c.reorder:
            arrival_ps += round(rng.uniform(0, c.reorder_delay_ns) * 1000)
            marks.append("reordered")
        copy_ps = None
        if c.duplicate and rng.random() < c.duplicate:
            copy_ps = arrival_ps + round(rng.uniform(0, c.reorder_delay_ns) * 1000)
            marks.append("duplicated")
        self._push(arrival_ps, dst, plane, frame)
        record = self._record(now_ps, arrival_ps, src, dst, plane, path, "delivered", marks,
                              frame, info, sent_len)
        if copy_ps is not None:
            self._push(copy_ps, dst, plane, frame)
            copy_marks = [m for m in marks if m != "duplicated"] + ["duplicate"]
            self._record(now_ps, copy_ps, src, dst, plane, path, "delivered", copy_marks,
                         frame, info, sent_len, sent=False)
        return record

    def _route(self, src, frame):
        """The endpoint a switch forwards ``frame`` to (by destination MAC), or None."""
        dst = self._routes.get(frame[:6])
        return None if dst == src else dst

    def _switch(self, until_ps):
        """Pass every frame that reaches its egress port by ``until_ps`` through that port,
        in order of arrival there (cut-through: a frame whose port is idle leaves as its last
        bit arrives), then on to :meth:`_impair`."""
        pending = self._pending
        while pending and pending[0][0] <= until_ps:
            (arrival_ps, _, sent_ps, src, dst, plane, path, frame, info, marks,
             sent_len) = heapq.heappop(pending)
            link = self._egress[self._directions[dst]][plane]
            first_bit_ps = arrival_ps - link.serialization_ps(len(frame))
            frame, info, t_ps = self._queue(link, first_bit_ps, frame, info, marks,
                                            egress=(dst, plane))
            if t_ps is None:
                self._record(sent_ps, None, src, dst, plane, path, "dropped-queue", marks,
                             frame, info, sent_len)
                continue
            self._impair(sent_ps, max(t_ps, arrival_ps), src, dst, plane, path, frame, info,
                         marks, sent_len)
        self._next_ns = self._earliest_ns()

    def _earliest_ns(self):
        times = [entry[0] / 1000 for entry in (self._heap[:1] + self._pending[:1])]
        return min(times) if times else math.inf

    def inject(self, dst, plane, frame, now):
        """Put a forged ``frame`` on ``plane`` towards endpoint ``dst`` at ``now`` ns, as an
        attacker on the last hop: no queue, no impairment, no failure; it arrives one latency
        of path 0 later. Recorded (and counted) as delivered with the mark ``hostile``, sent
        by the other endpoint (whose addresses a forged frame carries). Returns its
        :class:`Record`."""
        if self.switched:
            raise ValueError("a hostile source needs a fabric of two endpoints")
        src = self._peer.get(dst)
        if src is None:
            raise ValueError(f"dst must be one of {', '.join(self.config.endpoints)}, "
                             f"not {dst!r}")
        if not isinstance(plane, int) or not 0 <= plane < self.config.planes:
            raise ValueError(f"plane must be from 0 to {self.config.planes - 1}, not {plane!r}")
        now_ps = round(now * 1000)
        frame = bytes(frame)
        arrival_ps = now_ps + self._latency_ps[0]
        self._push(arrival_ps, dst, plane, frame)
        return self._record(now_ps, arrival_ps, src, dst, plane, 0, "delivered", ["hostile"],
                            frame, None, len(frame))

    def run_hostile(self, now):
        """Inject what the hostile source has due by ``now`` ns; returns how many frames."""
        if self.hostile is None:
            return 0
        count = 0
        for dst, plane, frame in self.hostile(now):
            self.inject(dst, plane, frame, now)
            count += 1
        return count

    def deliver(self, now):
        """Frames due at ``now`` ns, in arrival order, as ``(dst, plane, frame)``. Costs one
        comparison when nothing is due."""
        if now < self._next_ns:
            return []
        now_ps = round(now * 1000) if now != math.inf else math.inf
        if self._pending:
            self._switch(now_ps)
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now_ps:
            _, _, dst, plane, frame = heapq.heappop(heap)
            out.append((dst, plane, frame))
        self._next_ns = self._earliest_ns()
        return out

    def take_in_flight(self):
        """Every frame in flight, as ``(arrival_ps, serial, dst, plane, frame)``, taken out of
        the fabric (a bench that schedules deliveries itself orders them by arrival time, then
        serial number, as :meth:`deliver` would hand them out). Two endpoints only: with a
        switch, frames not yet through their egress port have no arrival time yet."""
        if self.switched:
            raise ValueError("take_in_flight needs a fabric of two endpoints")
        out = self._heap
        self._heap = []
        self._next_ns = math.inf
        return out

    def plane_up(self, plane, start_ns, end_ns):
        """True when no whole-plane failure (either direction) is down at any instant of
        [start_ns, end_ns]: what a probe round trip on that plane would see."""
        return not any(f.path is None and f.down_during(start_ns, end_ns)
                       for direction in self._failures for f in direction[plane])

    def next_arrival(self):
        """Arrival time (ns) of the next frame in flight, or None. With a switch, a frame not
        yet through its egress port counts with its arrival there (:meth:`deliver` at that
        time passes it through)."""
        earliest = self._earliest_ns()
        return None if earliest == math.inf else earliest

    def in_flight(self):
        return len(self._heap) + len(self._pending)

    def path_of(self, plane, frame, info=None):
        """The path the ECMP hash gives ``frame`` on ``plane``."""
        key = (info or parse(frame)).ecmp_key
        h = zlib.crc32(key, self._salts[plane])
        # CRC bits are linear in the key; a multiply-xorshift spreads the low bits we use.
        h ^= h >> 16
        h = (h * 0x45D9F3B) & 0xFFFFFFFF
        h ^= h >> 16
        return h % self.config.paths_per_plane

    # -- outputs ------------------------------------------------------------------------------

    def write_pcapng(self, path):
        from .capture import write_pcapng
        write_pcapng(path, self.records, planes=self.config.planes,
                     endpoints=self.config.endpoints)

    def write_pcap(self, path):
        from .capture import write_pcap
        write_pcap(path, self.records)

    def save(self, directory):
        """Write ``traffic.pcapng``, ``traffic.pcap`` and ``fabric.json`` (configuration and
        :meth:`Statistics.to_dict`, times in us) into ``directory``."""
        import json
        from pathlib import Path
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.write_pcapng(directory / "traffic.pcapng")
        self.write_pcap(directory / "traffic.pcap")
        summary = {"config": in_us(self.config.to_dict()), "stats": self.stats.to_dict()}
        (directory / "fabric.json").write_text(json.dumps(summary, indent=1))

    def delivered_payload_bytes(self):
        """Goodput bytes delivered so far (or due) over every plane."""
        return self.stats.goodput_bytes

    def plot(self, path, *, src=None, title=None):
        from .plot import plot_goodput
        plot_goodput(self.stats, path, failures=self.config.failures, src=src, title=title)

    # -- internals ----------------------------------------------------------------------------

    def _queue(self, link, t_ps, frame, info, marks, *, egress=None):
        """Admit ``frame`` to ``link`` at ``t_ps``: (frame, info, departure) or departure None.

        The thresholds compare the backlog ahead of the frame; tail drop applies when the
        frame (trimmed if it was) does not fit in ``queue_bytes``. ``egress``: the (receiver,
        plane) of an egress queue, whose data frames' waits the statistics sample.
        """
        c = self.config
        backlog = link.occupancy_at(t_ps)
        if c.trim_threshold_bytes and backlog > c.trim_threshold_bytes \
                and "trimmed" not in marks:
            trimmed = self._trim(frame) if info.is_data else None
            if trimmed is None:
                return frame, info, None
            frame, info = trimmed, parse(trimmed)
            marks.append("trimmed")
        if backlog + len(frame) > c.queue_bytes:
            return frame, info, None
        if c.ecn_threshold_bytes and backlog > c.ecn_threshold_bytes \
                and "ecn-marked" not in marks:
            buffer = bytearray(frame)
            if mark_ce(buffer, info):
                frame = bytes(buffer)
                marks.append("ecn-marked")
        departure = link.enqueue(t_ps, len(frame))
        if egress is not None and info.is_data:
            self.stats.add_queue_wait(egress[0], egress[1], t_ps / 1000, link.last_wait / 1000)
        return frame, info, departure

    def _trim(self, frame):
        """The trimmed frame, or None for a data opcode whose headers are cut short (a frame
        a switch could not trim: it is dropped instead)."""
        try:
            return raw(pk.trim(Ether(frame), dscp=self.config.trim_dscp))
        except Exception:
            return None

    def _lost(self, direction, plane, rng):
        c = self.config
        bursting = self._bursting[direction]
        if not bursting[plane] and c.burst_loss and rng.random() < c.burst_loss:
            bursting[plane] = True
        if bursting[plane]:
            # Leaving after each lost frame with probability 1/L: bursts of mean length L.
            if rng.random() < 1 / c.burst_length:
                bursting[plane] = False
            return True
        return bool(c.loss) and rng.random() < c.loss

    @staticmethod
    def _corrupt(frame, info, rng):
        buffer = bytearray(frame)
        if info.bth_offset >= 0:
            # Any ICRC-covered byte from the BTH on, except the one the ICRC masks.
            position = rng.randrange(info.bth_offset, len(buffer) - 1)
            if position >= info.bth_offset + _ICRC_MASKED_BTH_BYTE:
                position += 1
        else:
            position = rng.randrange(min(14, len(buffer) - 1), len(buffer)) if buffer else 0
        if buffer:
            buffer[position] ^= rng.randrange(1, 256)
        return bytes(buffer)

    def _push(self, arrival_ps, dst, plane, frame):
        self._serial += 1
        heapq.heappush(self._heap, (arrival_ps, self._serial, dst, plane, frame))
        if arrival_ps / 1000 < self._next_ns:
            self._next_ns = arrival_ps / 1000

    def _record(self, sent_ps, arrival_ps, src, dst, plane, path, outcome, marks, frame, info,
                sent_len, sent=True):
        arrival_ns = None if arrival_ps is None else arrival_ps / 1000
        record = Record(sent_ps / 1000, arrival_ns, src, dst, plane, path, outcome,
                        tuple(marks), frame, sent_len)
        payload = (roce_payload_bytes(frame, info) if outcome == "delivered" and info is not None
                   else 0)
        if outcome != "delivered" and info is not None and info.is_data:
            self.stats.data_drops += 1
        self.stats.add(src, plane, path, record.time_ns, outcome, record.marks, len(frame),
                       payload, sent)
        if self.config.capture:
            self.records.append(record)
        return record
