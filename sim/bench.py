"""``mrc-nic bench``: benchmarks that write JSON into ``build/bench/`` (never tests).

``packet``: beat utilization (beats moved / cycles) of the parser's input and the builder's
output with back-to-back packets of 64-byte and MTU payloads, for W = 64 and 128, and the
simulated cycles per second of the NIC top under Icarus and Verilator.

``path`` (``build/bench/path.json``, ``sim/bench_path.py``): path-select decisions per cycle
with all 256 QPs active, and block RAM per 256 EVs.

``fabric`` (``build/bench/fabric.json`` and ``recovery.json``, ``sim/bench_fabric.py``): two
RTL NICs over the multi-plane fabric: efficiency, plane failure, MRC against the single-path
baseline, random loss, and the two-NIC system's simulated cycles per second
(``docs/performance.md``).

``incast`` (``build/bench/incast.json``, ``sim/bench_incast.py``): 4, 8 and 15 model NICs
writing to one over a switch per plane, with the ECN window and with NSCC.
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from .env import BUILD
from .errors import UsageError, fail
from .waves import add_waves_arguments, waves_from_args

SIMULATORS = ("icarus", "verilator")
WIDTHS = (64, 128, 256)


def register(subparsers):
    p = subparsers.add_parser(
        "bench", help="run the benchmarks, JSON into build/bench/",
        description="Run the benchmarks (packet engines, path select, two NICs over the "
                    "fabric, incast on the model NIC) and write their JSON beside --out "
                    "(docs/performance.md).")
    p.add_argument("--widths", default="64,128", metavar="W,...",
                   help=f"packet benchmark: datapath widths, comma-separated, each one of "
                        f"{', '.join(map(str, WIDTHS))}")
    p.add_argument("--sim", default=None, metavar="SIM,...",
                   help="simulators, comma-separated, each icarus or verilator (default: "
                        "icarus,verilator for the packet benchmark, verilator,icarus for the "
                        "fabric benchmark's cycles/s)")
    p.add_argument("--count", type=int, default=40, metavar="N",
                   help="packet benchmark: packets per measurement, at least 1")
    p.add_argument("--out", type=Path, default=BUILD / "bench" / "packet.json",
                   metavar="PACKET.json",
                   help="the packet benchmark's JSON; the others go into its folder")
    p.add_argument("--only", choices=("packet", "path", "fabric", "incast"), action="append",
                   help="run only these benchmarks (repeatable; default: all)")
    # The spellings from before --sim applied to both benchmarks, kept for scripts.
    p.add_argument("--sims", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fabric-sims", default=None, help=argparse.SUPPRESS)
    add_waves_arguments(p, "one file per RTL run (packet: waves-<sim>-w<W>-p<payload>.fst "
                           "beside --out; fabric: fabric/<scenario>/waves.fst); tracing slows "
                           "the simulation, so the figures of such a run are no benchmark")
    p.set_defaults(func=run)


def _list(text, flag, allowed, kind=str):
    """A comma-separated flag value as a list; :class:`UsageError` naming ``flag`` when an
    item is not one of ``allowed``."""
    items = [item for item in text.split(",") if item]
    try:
        values = [kind(item) for item in items]
    except ValueError:
        values = None
    if not values or any(value not in allowed for value in values):
        raise UsageError(flag, f"must be a comma-separated list of "
                               f"{', '.join(map(str, allowed))}, not {text!r}")
    return values


def run(args):
    args.widths = _list(args.widths, "--widths", WIDTHS, int)
    sims = None
    for flag, given in (("--sims", args.sims), ("--sim", args.sim)):
        if given is not None:
            sims = _list(given, flag, SIMULATORS)
    args.packet_sims = sims or ["icarus", "verilator"]
    fabric_sims = sims or ["verilator", "icarus"]
    if args.fabric_sims is not None:
        fabric_sims = _list(args.fabric_sims, "--fabric-sims", SIMULATORS)
    if args.count < 1:
        return fail(f"must be at least 1, not {args.count}", field="--count")
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(f"{args.out.parent}: cannot create: {e.strerror}", field="--out")
    only = set(args.only or ("packet", "path", "fabric", "incast"))
    if "packet" in only:
        status = _packet(args)
        if status:
            return status
    if "path" in only:
        from . import bench_path
        print("bench: path select, 256 QPs, one request per cycle ...", flush=True)
        path = bench_path.run(args.out.parent)
        print(f"  {path['decisions_per_cycle']:.3f} decisions/cycle; wrote "
              f"{args.out.parent / 'path.json'}")
    if "fabric" in only:
        from . import bench_fabric
        window = waves_from_args(args, "waves.fst")
        waves = {"waves": True, "waves_from_us": window.from_us,
                 "waves_to_us": window.to_us} if window else {}
        bench_fabric.run(args.out.parent, sims=tuple(fabric_sims), **waves)
    if "incast" in only:
        from . import bench_incast
        bench_incast.run(args.out.parent)
    return 0


def _packet(args):
    from hdl.config import NicConfig
    from hdl.packet.engine import PacketEngine
    from sim.tb.runner import CocotbFailure, run_cocotb

    widths = args.widths
    sims = args.packet_sims
    results = []
    for sim in sims:
        for width in widths:
            config = NicConfig(data_width=width, ports=1)
            for payload in (64, config.mtu):
                print(f"bench: {sim}, W={width}, payload {payload} B ...", flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "bench.json"
                    started = time.monotonic()
                    try:
                        run_cocotb(PacketEngine(config), toplevel="packet_engine",
                                   test_module="sim.tb.cocotb_bench",
                                   build_dir=BUILD / "bench" / f"{sim}-w{width}", sim=sim,
                                   waves=waves_from_args(args, args.out.parent /
                                                         f"waves-{sim}-w{width}-p{payload}.fst"),
                                   extra_env={"DATA_WIDTH": width, "PAYLOAD": payload,
                                              "COUNT": args.count, "BENCH_OUT": out})
                    except CocotbFailure as e:
                        return fail(str(e), status=1)
                    result = json.loads(out.read_text())
                result.update(simulator=sim, wall_seconds=round(time.monotonic() - started, 1))
                results.append(result)
                print(f"  parser {result['parser']['utilization']:.3f}, builder "
                      f"{result['builder']['utilization']:.3f} beats/cycle, "
                      f"{result['cycles_per_second']:.0f} cycles/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "packet engines", "machine": platform.node(),
        "python": platform.python_version(), "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
