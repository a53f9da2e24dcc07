"""Goodput over time per plane, as a PNG, with the failure windows shaded."""

import json
from os import PathLike
from pathlib import Path

from .schedule import Failure
from .stats import Statistics

__all__ = ["plot_goodput"]

_MAX_SHADED_WINDOWS = 400       # a long flap is shaded as one light band beyond this


def plot_goodput(stats, path, *, failures=(), src=None, title=None):
    """Draw one goodput line per plane (Gbit/s averaged over each ``stats.bin_ns`` bin) into
    ``path`` (PNG): both directions summed, or only the frames sent by endpoint ``src``.
    ``failures`` (:class:`~sim.fabric.schedule.Failure`) are shaded where they are down.

    ``stats`` is a :class:`~sim.fabric.stats.Statistics`, or the ``fabric.json`` that
    :meth:`Fabric.save <sim.fabric.fabric.Fabric.save>` wrote (or its directory): a bench that
    ran in another process is plotted from its files, failures taken from the saved
    configuration unless given.

    Needs matplotlib (Agg backend, no display); raises :class:`RuntimeError` naming the
    package when it is missing.
    """
    if isinstance(stats, (str, PathLike)):
        stats, saved_failures = _load(stats)
        failures = failures or saved_failures
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise RuntimeError("plotting the fabric's goodput needs the 'matplotlib' package: "
                           "pip install matplotlib") from error
    figure = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    end_ns = stats.bin_count() * stats.bin_ns
    for plane in range(stats.planes):
        times, rates = stats.goodput_gbps(plane, src)
        # A closing point so the last bin is drawn as wide as the others.
        axes.step([t / 1000 for t in times] + [end_ns / 1000], rates + rates[-1:],
                  where="post", label=f"plane {plane}")
    colors = ["tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:gray"]
    for index, failure in enumerate(failures):
        color = colors[index % len(colors)]
        target = f"plane {failure.plane}" + ("" if failure.path is None
                                             else f" path {failure.path}")
        label = f"{failure.kind} {target}"
        windows = failure.down_windows(end_ns)
        if len(windows) > _MAX_SHADED_WINDOWS:
            windows = [(failure.at_ns, min(failure.end_ns, end_ns))]
        for number, (start, stop) in enumerate(windows):
            axes.axvspan(start / 1000, stop / 1000, color=color, alpha=0.15,
                         label=label if number == 0 else None)
    axes.set_xlabel("time (us)")
    direction = "both directions" if src is None else f"sent by {src}"
    axes.set_ylabel(f"goodput (Gbit/s, {stats.bin_ns / 1000:g} us bins)")
    axes.set_title(title or f"fabric goodput per plane, {direction}")
    axes.set_xlim(0, end_ns / 1000)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper right", fontsize="small", ncols=2)
    figure.tight_layout()
    figure.savefig(str(path), format="png")


def _load(path):
    path = Path(path)
    if path.is_dir():
        path = path / "fabric.json"
    saved = json.loads(path.read_text())
    failures = tuple(Failure(**f) for f in saved["config"].get("failures", []))
    return Statistics.from_dict(saved["stats"]), failures
