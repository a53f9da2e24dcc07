"""Fabric statistics: counters per plane and per path, and per-plane time bins."""

import math
from collections import Counter, defaultdict

__all__ = ["Statistics", "Bin", "OUTCOMES", "MARKS", "in_us"]

#: What finally happened to a frame (exactly one per captured frame).
OUTCOMES = ("delivered", "dropped-loss", "dropped-failure", "dropped-queue",
            "dropped-unroutable")
#: What happened to it on the way (any number).
MARKS = ("trimmed", "ecn-marked", "corrupted", "reordered", "duplicated", "duplicate",
         "hostile")


def in_us(values):
    """``values`` (JSON-ready dicts and lists) with every ``*_ns`` key turned into ``*_us``,
    its number divided by 1000: the output files give every time in us."""
    if isinstance(values, dict):
        return {(k[:-3] + "_us" if k.endswith("_ns") else k):
                (v / 1000 if k.endswith("_ns") and isinstance(v, (int, float))
                 and not isinstance(v, bool) else
                 tuple(x / 1000 for x in v) if k.endswith("_ns") and isinstance(v, (list, tuple))
                 else in_us(v))
                for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return [in_us(v) for v in values]
    return values


def from_us(values):
    """The inverse of :func:`in_us`: ``*_us`` keys back to ``*_ns``."""
    if isinstance(values, dict):
        return {(k[:-3] + "_ns" if k.endswith("_us") else k):
                (v * 1000 if k.endswith("_us") and isinstance(v, (int, float))
                 and not isinstance(v, bool) else
                 tuple(x * 1000 for x in v) if k.endswith("_us") and isinstance(v, (list, tuple))
                 else from_us(v))
                for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return [from_us(v) for v in values]
    return values


class Bin:
    """One time bin of one plane.

    Members
    -------
    goodput_bytes : int
        RDMA payload bytes of data packets delivered intact: not trimmed, not corrupted,
        not the fabric's duplicate copy, not injected by a hostile source (bytes after the
        data headers, before the ICRC).
        Both directions; ``goodput_by_src`` splits them by sending endpoint.
    frames, wire_bytes : int
        Frames delivered (every copy) and their bytes (without FCS).
    drops : Counter
        Frames dropped, by outcome (``dropped-loss``, ...).
    """
    __slots__ = ("goodput_bytes", "goodput_by_src", "frames", "wire_bytes", "drops")

    def __init__(self):
        self.goodput_bytes = 0
        self.goodput_by_src = Counter()
        self.frames = 0
        self.wire_bytes = 0
        self.drops = Counter()


class Statistics:
    """Counters of every fate, per plane and per (plane, path), and time bins per plane.

    Delivered frames count in the bin of their arrival time, dropped ones in the bin of
    their hand-over time. Counter keys: ``sent`` plus every outcome and mark.

    Members
    -------
    counters : list of Counter
        Per plane.
    path_counters : dict of (plane, path) to Counter
    bins : list of dict of int to :class:`Bin`
        Per plane, keyed by bin index (time // bin_ns); bins with no frame are absent.
    goodput_bytes : int
        Total goodput bytes (see :class:`Bin`) over every plane.
    data_drops : int
        Data frames (trimmed or not) the fabric dropped, for any reason.
    queue_waits : list of ``(time_ns, receiver, plane, wait_ns)``
        Every data frame (trimmed or not) an egress queue admitted (the switch's egress port
        towards ``receiver`` on ``plane``; without a switch, the port link towards it): when
        it arrived and how long it waited behind the frames ahead of it. ACKs, which mostly
        cross idle reverse queues, are left out.
    """

    def __init__(self, planes, bin_ns):
        self.planes = planes
        self.bin_ns = bin_ns
        self.counters = [Counter() for _ in range(planes)]
        self.path_counters = defaultdict(Counter)
        self.bins = [defaultdict(Bin) for _ in range(planes)]
        self.last_ns = 0.0
        self.goodput_bytes = 0
        self.data_drops = 0
        self.queue_waits = []

    def add(self, src, plane, path, time_ns, outcome, marks, wire_bytes, payload_bytes, sent):
        counters = self.counters[plane]
        per_path = self.path_counters[(plane, path)]
        if sent:
            counters["sent"] += 1
            per_path["sent"] += 1
        counters[outcome] += 1
        per_path[outcome] += 1
        for mark in marks:
            counters[mark] += 1
            per_path[mark] += 1
        entry = self.bins[plane][int(time_ns // self.bin_ns)]
        if outcome == "delivered":
            entry.frames += 1
            entry.wire_bytes += wire_bytes
            if payload_bytes and not {"trimmed", "corrupted", "duplicate", "hostile"} & set(marks):
                entry.goodput_bytes += payload_bytes
                entry.goodput_by_src[src] += payload_bytes
                self.goodput_bytes += payload_bytes
        else:
            entry.drops[outcome] += 1
        self.last_ns = max(self.last_ns, time_ns)

    def add_queue_wait(self, receiver, plane, time_ns, wait_ns):
        self.queue_waits.append((time_ns, receiver, plane, wait_ns))

    def queue_delay_us(self):
        """``{"p50", "p99", "max"}`` of the egress queue waits in us (nearest rank), over
        every egress queue; ``None`` each without a sample."""
        waits = sorted(w for _, _, _, w in self.queue_waits)
        if not waits:
            return {"p50": None, "p99": None, "max": None}

        def rank(q):
            return round(waits[min(len(waits) - 1, max(0, math.ceil(q * len(waits)) - 1))]
                         / 1000, 4)
        return {"p50": rank(0.5), "p99": rank(0.99), "max": round(waits[-1] / 1000, 4)}

    def bin_count(self):
        return int(self.last_ns // self.bin_ns) + 1

    def goodput_gbps(self, plane, src=None):
        """(bin start times in ns, goodput in Gbit/s) of ``plane``, every bin to the last;
        both directions summed, or only frames sent by endpoint ``src``."""
        bins = self.bins[plane]
        times, rates = [], []
        for index in range(self.bin_count()):
            times.append(index * self.bin_ns)
            entry = bins.get(index)
            if entry is None:
                rates.append(0.0)
            else:
                count = entry.goodput_bytes if src is None else entry.goodput_by_src[src]
                rates.append(count * 8 / self.bin_ns)
        return times, rates

    @classmethod
    def from_dict(cls, values, planes=None):
        """Statistics back from :meth:`to_dict` (bins and totals; enough to plot)."""
        bins = values["bins"]
        bin_ns = values["bin_us"] * 1000 if "bin_us" in values else values["bin_ns"]
        stats = cls(len(bins) if planes is None else planes, bin_ns)
        stats.goodput_bytes = values.get("goodput_bytes", 0)
        for plane, counters in enumerate(values.get("planes", [])):
            stats.counters[plane].update(counters)
        for key, counters in values.get("paths", {}).items():
            plane, path = (int(x) for x in key.split("."))
            stats.path_counters[(plane, path)].update(counters)
        for plane, plane_bins in enumerate(bins):
            for index, saved in plane_bins.items():
                entry = stats.bins[plane][int(index)]
                entry.goodput_bytes = saved["goodput_bytes"]
                entry.goodput_by_src.update(saved.get("goodput_by_src", {}))
                entry.frames = saved["frames"]
                entry.wire_bytes = saved["wire_bytes"]
                entry.drops.update(saved["drops"])
                stats.last_ns = max(stats.last_ns, (int(index) + 1) * stats.bin_ns - 1e-3)
        return stats

    def to_dict(self):
        """JSON-ready: totals per plane and per path, and the bins (bin width in us, as every
        time in the output files)."""
        return {
            "bin_us": self.bin_ns / 1000,
            "goodput_bytes": self.goodput_bytes,
            "planes": [dict(sorted(c.items())) for c in self.counters],
            "paths": {f"{plane}.{path}": dict(sorted(c.items()))
                      for (plane, path), c in sorted(self.path_counters.items())},
            "bins": [{str(index): {"goodput_bytes": b.goodput_bytes,
                                   "goodput_by_src": dict(b.goodput_by_src), "frames": b.frames,
                                   "wire_bytes": b.wire_bytes, "drops": dict(b.drops)}
                      for index, b in sorted(bins.items())} for bins in self.bins],
        }
