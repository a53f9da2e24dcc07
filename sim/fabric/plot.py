"""The fabric's plots, as PNGs: goodput over time per plane and in total (``goodput.png``),
queueing delay per plane and data in flight per sending endpoint (``queues.png``).

Goodput is averaged over a rolling window sized to the traffic (:data:`WINDOW_FRAMES` MTU
frames at the rate of what it measures), from the captured frames; failures are shaded, their
start and recovery drawn as vertical lines. Needs matplotlib (Agg backend, no display).
"""

import json
from bisect import bisect_left
from itertools import accumulate
from os import PathLike
from pathlib import Path

from .frames import parse, roce_payload_bytes
from .schedule import Failure
from .stats import Statistics, from_us

__all__ = ["plot_goodput", "plot_queues", "plot_egress_waits", "plot_run", "WINDOW_FRAMES"]

_MAX_SHADED_WINDOWS = 400       # a long flap is shaded as one light band beyond this
#: MTU data frames a rolling goodput window holds at the rate it measures (a plane's, or the
#: whole fabric's), over every direction that carries data.
WINDOW_FRAMES = 20
_POINTS = 600                   # samples of a rolling curve
_EXCLUDED = frozenset(("trimmed", "corrupted", "duplicate"))


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise RuntimeError("plotting the fabric's goodput needs the 'matplotlib' package: "
                           "pip install matplotlib") from error
    return Figure, FigureCanvasAgg


def _mark_failures(axes, failures, end_ns, *, labels=True):
    """Shade where each failure is down; a line at its start and one at its recovery."""
    colors = ["tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:gray"]
    for index, failure in enumerate(failures):
        color = colors[index % len(colors)]
        target = f"plane {failure.plane}" + ("" if failure.path is None
                                             else f" path {failure.path}")
        windows = failure.down_windows(end_ns)
        if len(windows) > _MAX_SHADED_WINDOWS:
            windows = [(failure.at_ns, min(failure.end_ns, end_ns))]
        for number, (start, stop) in enumerate(windows):
            axes.axvspan(start / 1000, stop / 1000, color=color, alpha=0.12,
                         label=f"{failure.kind} {target}" if labels and number == 0 else None)
        axes.axvline(failure.at_ns / 1000, color=color, linestyle="--", linewidth=1,
                     label="failure" if labels and index == 0 else None)
        if failure.recover_ns is not None and failure.recover_ns <= end_ns:
            axes.axvline(failure.recover_ns / 1000, color=color, linestyle=":", linewidth=1.2,
                         label="recovery" if labels and index == 0 else None)


def _goodput_arrivals(records, src=None):
    """``{plane: (arrival times, payload bytes)}`` of the frames that count as goodput."""
    planes = {}
    for r in sorted((r for r in records if r.outcome == "delivered"),
                    key=lambda r: r.arrival_ns):
        if _EXCLUDED & set(r.marks) or (src is not None and r.src != src):
            continue
        payload = roce_payload_bytes(r.frame, parse(r.frame))
        if payload:
            times, sizes = planes.setdefault(r.plane, ([], []))
            times.append(r.arrival_ns)
            sizes.append(payload)
    return planes


def rolling_gbps(times, sizes, window_ns, end_ns, points=_POINTS):
    """(sample times, Gbit/s over the ``window_ns`` before each), from one whole window on."""
    sums = [0, *accumulate(sizes)]
    out_t, out_r = [], []
    step = max((end_ns - window_ns) / points, 1.0)
    t = window_ns
    while t <= end_ns:
        lo, hi = bisect_left(times, t - window_ns), bisect_left(times, t)
        out_t.append(t)
        out_r.append((sums[hi] - sums[lo]) * 8 / window_ns)
        t += step
    return out_t, out_r


def _frame_ns(records, rate_gbps, directions):
    frame = max((r.sent_len for r in records if parse(r.frame).is_data), default=1100)
    return frame * 8 / (rate_gbps * directions)


def plot_goodput(stats, path, *, failures=(), src=None, title=None, records=None,
                 plane_rates_gbps=None):
    """Draw the goodput of each plane and of the whole fabric over time into ``path`` (PNG):
    both directions summed, or only the frames sent by endpoint ``src``; ``failures``
    (:class:`~sim.fabric.schedule.Failure`) shaded where they are down, with their start and
    recovery marked.

    With ``records`` (the fabric's :class:`~sim.fabric.fabric.Record` list) each curve is a
    rolling mean over :data:`WINDOW_FRAMES` MTU frame times at the plane's rate (top) or the
    sum of the plane rates (bottom), over the directions that carry data, at most a fifth of
    the run; without, the ``stats.bin_ns`` bins are drawn as steps.

    ``stats`` is a :class:`~sim.fabric.stats.Statistics`, or the ``fabric.json`` that
    :meth:`Fabric.save <sim.fabric.fabric.Fabric.save>` wrote (or its directory): a bench that
    ran in another process is plotted from its files (the records from ``traffic.pcapng``
    beside it, the failures and rates from the saved configuration, unless given).

    Raises :class:`RuntimeError` naming the package when matplotlib is missing.
    """
    if isinstance(stats, (str, PathLike)):
        stats, saved_failures, saved_records, saved_rates = _load(stats)
        failures = failures or saved_failures
        records = saved_records if records is None else records
        plane_rates_gbps = plane_rates_gbps or saved_rates
    Figure, FigureCanvasAgg = _matplotlib()
    figure = Figure(figsize=(9, 7), dpi=100)
    FigureCanvasAgg(figure)
    planes_axes, total_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    end_ns = stats.bin_count() * stats.bin_ns
    direction = "both directions" if src is None else f"sent by {src}"
    if records:
        end_ns = max((r.time_ns for r in records), default=end_ns)
        arrivals = _goodput_arrivals(records, src)
        directions = 1 if src is not None else max(1, len({r.src for r in records
                                                          if parse(r.frame).is_data}))
        rates = plane_rates_gbps or [1.0] * stats.planes
        total_t = sorted((t, b) for times, sizes in arrivals.values()
                         for t, b in zip(times, sizes, strict=True))
        for plane in range(stats.planes):
            window = min(WINDOW_FRAMES * _frame_ns(records, rates[plane], directions),
                         end_ns / 5)
            times, sizes = arrivals.get(plane, ([], []))
            t, r = rolling_gbps(times, sizes, window, end_ns)
            planes_axes.plot([x / 1000 for x in t], r, linewidth=1, label=f"plane {plane}")
        window = min(WINDOW_FRAMES * _frame_ns(records, sum(rates), directions), end_ns / 5)
        label = window_label(records, rates, directions, end_ns)
        planes_axes.set_ylabel(f"Gbit/s per plane\n(rolling {label})")
        t, r = rolling_gbps([x for x, _ in total_t], [b for _, b in total_t], window, end_ns)
        total_axes.plot([x / 1000 for x in t], r, color="black", linewidth=1.2,
                        label="every plane")
        total_axes.set_ylabel(f"Gbit/s in total\n(rolling {window / 1000:.3g} us)")
    else:
        for plane in range(stats.planes):
            times, rates = stats.goodput_gbps(plane, src)
            planes_axes.step([t / 1000 for t in times] + [end_ns / 1000], rates + rates[-1:],
                             where="post", label=f"plane {plane}")
        times = stats.goodput_gbps(0, src)[0]
        total = [sum(values) for values in zip(*(stats.goodput_gbps(p, src)[1]
                                                 for p in range(stats.planes)), strict=True)]
        total_axes.step([t / 1000 for t in times] + [end_ns / 1000], total + total[-1:],
                        where="post", color="black", label="every plane")
        planes_axes.set_ylabel(f"Gbit/s per plane\n({stats.bin_ns / 1000:g} us bins)")
        total_axes.set_ylabel(f"Gbit/s in total\n({stats.bin_ns / 1000:g} us bins)")
    _mark_failures(planes_axes, failures, end_ns)
    _mark_failures(total_axes, failures, end_ns, labels=False)
    planes_axes.set_title(title or f"fabric goodput per plane, {direction}")
    total_axes.set_xlabel("time (us)")
    for axes in (planes_axes, total_axes):
        axes.set_xlim(0, end_ns / 1000)
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
    planes_axes.legend(loc="upper right", fontsize="small", ncols=3)
    figure.tight_layout()
    figure.savefig(str(path), format="png")


def window_label(records, rates, directions, end_ns):
    """The per-plane rolling window(s), for an axis label."""
    windows = sorted({round(min(WINDOW_FRAMES * _frame_ns(records, rate, directions),
                                end_ns / 5) / 1000, 1) for rate in rates})
    return " / ".join(f"{w:g}" for w in windows) + " us"


def queueing_delays(records, config):
    """``{plane: (arrival times, queueing delays)}`` in ns of the delivered frames: arrival
    minus hand-over minus the path's latency and the serialization at the plane's (and the
    path's) rate; frames the fabric reordered or duplicated are left out. ``config`` is the
    fabric configuration as a dict in ns (:meth:`FabricConfig.to_dict`)."""
    latency = config["latency_ns"]
    overhead = config.get("wire_overhead_bytes", 0)
    rates = config["plane_rates_gbps"]
    path_rate = config.get("path_rate_gbps")
    out = {}
    for r in records:
        if r.outcome != "delivered" or {"reordered", "duplicate"} & set(r.marks):
            continue
        base = latency[r.path] if isinstance(latency, (list, tuple)) else latency
        wire = (len(r.frame) + overhead) * 8
        fixed = base + r.path * config.get("path_skew_ns", 0.0) + wire / rates[r.plane]
        if path_rate:
            fixed += wire / path_rate
        times, delays = out.setdefault(r.plane, ([], []))
        times.append(r.arrival_ns)
        delays.append(max(0.0, r.arrival_ns - r.sent_ns - fixed))
    return out


def in_flight_bytes(records):
    """``{src: (times, data bytes in flight)}``: data frames handed to the fabric whose arrival
    is still to come (queued or propagating), per sending endpoint, as steps."""
    events = {}
    for r in records:
        if r.outcome != "delivered" or "duplicate" in r.marks or not parse(r.frame).is_data:
            continue
        side = events.setdefault(r.src, [])
        side.append((r.sent_ns, r.sent_len))
        side.append((r.arrival_ns, -r.sent_len))
    out = {}
    for src, side in sorted(events.items()):
        side.sort()
        out[src] = ([t for t, _ in side], list(accumulate(d for _, d in side)))
    return out


def plot_queues(records, config, path, *, failures=(), title=None):
    """Queueing delay per plane (:func:`queueing_delays`) and data in flight per sending
    endpoint (:func:`in_flight_bytes`) over time, into ``path`` (PNG). ``config``: the fabric
    configuration as a dict in ns. The NICs' congestion windows are not visible here; the
    data in flight is a lower bound of each requester's outstanding window."""
    Figure, FigureCanvasAgg = _matplotlib()
    figure = Figure(figsize=(9, 7), dpi=100)
    FigureCanvasAgg(figure)
    delay_axes, flight_axes = figure.subplots(2, 1, sharex=True)
    end_ns = max((r.time_ns for r in records), default=1.0)
    for plane, (times, delays) in sorted(queueing_delays(records, config).items()):
        delay_axes.plot([t / 1000 for t in times], [d / 1000 for d in delays], ".",
                        markersize=2, label=f"plane {plane}")
    # Dashed after the first: with symmetric traffic the two sides' curves coincide.
    for index, (src, (times, inflight)) in enumerate(in_flight_bytes(records).items()):
        flight_axes.step([t / 1000 for t in times], inflight, where="post", linewidth=1,
                         linestyle="-" if index == 0 else "--", label=f"sent by {src}")
    _mark_failures(delay_axes, failures, end_ns)
    _mark_failures(flight_axes, failures, end_ns, labels=False)
    delay_axes.set_title(title or "fabric queues")
    delay_axes.set_ylabel("queueing delay (us)")
    flight_axes.set_ylabel("data in flight in the fabric\n(bytes)")
    flight_axes.set_xlabel("time (us)")
    for axes in (delay_axes, flight_axes):
        axes.set_xlim(0, end_ns / 1000)
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
    delay_axes.legend(loc="upper right", fontsize="small", ncols=4, markerscale=4)
    flight_axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(str(path), format="png")


def plot_egress_waits(queue_waits, path, *, title=None):
    """The wait of every data frame at an egress queue over time, one series per receiving
    endpoint (all its planes), into ``path`` (PNG): the switches' egress ports, where incast
    meets. ``queue_waits`` is :attr:`Statistics.queue_waits` (times in ns)."""
    Figure, FigureCanvasAgg = _matplotlib()
    figure = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    series = {}
    for time_ns, receiver, _, wait_ns in queue_waits:
        times, waits = series.setdefault(receiver, ([], []))
        times.append(time_ns / 1000)
        waits.append(wait_ns / 1000)
    for receiver, (times, waits) in sorted(series.items()):
        axes.plot(times, waits, ".", markersize=2, label=f"towards {receiver}")
    axes.set_title(title or "egress queues")
    axes.set_xlabel("time (us)")
    axes.set_ylabel("wait of a data frame\nat the egress port (us)")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    if series:
        axes.legend(loc="upper right", fontsize="small", markerscale=4,
                    ncols=max(1, len(series) // 6))
    figure.tight_layout()
    figure.savefig(str(path), format="png")


def plot_run(directory, *, title=None):
    """``goodput.png`` and ``queues.png`` in ``directory`` from the ``fabric.json`` and
    ``traffic.pcapng`` a run saved there."""
    directory = Path(directory)
    stats, failures, records, rates = _load(directory)
    name = title or directory.name
    plot_goodput(stats, directory / "goodput.png", failures=failures, records=records,
                 plane_rates_gbps=rates, title=f"{name}: goodput per plane")
    if records:
        config = from_us(json.loads((directory / "fabric.json").read_text())["config"])
        plot_queues(records, config, directory / "queues.png", failures=failures,
                    title=f"{name}: queueing delay and data in flight")


def _load(path):
    from .capture import read_pcapng
    path = Path(path)
    if path.is_dir():
        path = path / "fabric.json"
    saved = json.loads(path.read_text())
    config = from_us(saved["config"])
    failures = tuple(Failure(**f) for f in config.get("failures", []))
    capture = path.with_name("traffic.pcapng")
    records = read_pcapng(capture) if capture.exists() else None
    return (Statistics.from_dict(saved["stats"]), failures, records,
            config.get("plane_rates_gbps"))
