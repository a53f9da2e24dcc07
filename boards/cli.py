"""``mrc-nic boards``: build board bitstreams and the synthesis report (docs/boards.md).

Usage::

    mrc-nic boards bitstream --board ecpix5 [--seed 1]
    mrc-nic boards synth-report [--boards ecpix5,icebreaker] [--benches engine-w64-q256]
    mrc-nic boards synth-report --scaling [--blocks requester] [--qps 64,256,1024] [--place]
    mrc-nic boards list

``python -m boards.cli ...`` runs the same. Errors are the one line of :mod:`sim.errors`.
"""

import json
import sys

from sim.errors import CliParser, fail

__all__ = ["main", "build_parser", "register"]


def _fail(message, field=None):
    return fail(message, field=field)


def _bitstream(args):
    from .build import BuildError, _one_line, build_board
    try:
        result = build_board(args.board, seed=args.seed,
                             allow_timing_fail=args.allow_timing_fail)
    except BuildError as e:
        return _fail(str(e), args.board)
    (result.build_dir / "summary.json").write_text(json.dumps(result.report, indent=2) + "\n")
    bitstream = "top.bin" if args.board == "icebreaker" else "top.bit"
    print(_one_line(result.report))
    print(f"wrote {result.build_dir / bitstream}")
    return 0


def _synth_report(args):
    from .build import (
        BENCH_CONFIGS,
        DEFAULT_BENCHES,
        SCALING_BLOCKS,
        SCALING_QPS,
        BuildError,
        scaling_config,
        scaling_report,
        synth_report,
    )
    from .tops import BOARDS
    only_scaling = args.scaling and args.boards is None and args.benches is None
    if args.place and not args.scaling:
        return _fail("places the scaling blocks: it needs --scaling", "--place")
    for flag, given in (("--blocks", args.blocks), ("--qps", args.qps)):
        if given is not None and not args.scaling:
            return _fail("chooses the scaling runs: it needs --scaling", flag)
    if args.timeout is not None and not args.timeout > 0:
        return _fail(f"must be a positive number of minutes, not {args.timeout}", "--timeout")
    if args.scaling:
        blocks = [b for b in (args.blocks or ",".join(SCALING_BLOCKS)).split(",") if b]
        for block in blocks:
            if block not in SCALING_BLOCKS:
                return _fail(f"block must be one of {', '.join(SCALING_BLOCKS)}, not {block!r}",
                             "--blocks")
        try:
            qps = [int(q) for q in args.qps.split(",")] if args.qps else list(SCALING_QPS)
        except ValueError:
            return _fail(f"must be comma-separated integers, not {args.qps!r}", "--qps")
        from hdl.config import ConfigError
        for count in qps:
            try:
                scaling_config(count)
            except ConfigError as e:
                what = str(e).removeprefix(f"NicConfig.{e.field} ")
                return _fail(f"{what} (NicConfig.qps)", "--qps")
        try:
            scaling_report(blocks=blocks, qps=qps, out=args.out, place=args.place,
                           timeout=args.timeout * 60 if args.timeout else None)
        except BuildError as e:
            return _fail(str(e))
        if only_scaling:
            return 0
    boards = [b for b in args.boards.split(",") if b] if args.boards is not None else ["ecpix5"]
    for board in boards:
        if board not in BOARDS:
            return _fail(f"board must be one of {', '.join(BOARDS)}, not {board!r}", "--boards")
    known = dict(BENCH_CONFIGS)
    if args.benches is None:
        benches = [(label, known[label]) for label in DEFAULT_BENCHES]
    else:
        benches = []
        for label in (b for b in args.benches.split(",") if b):
            if label not in known:
                return _fail(f"bench must be one of {', '.join(known)}, not {label!r}",
                             "--benches")
            benches.append((label, known[label]))
    try:
        synth_report(boards=boards, benches=benches, out=args.out,
                     bench_timeout=args.timeout * 60 if args.timeout else None)
    except BuildError as e:
        return _fail(str(e))
    return 0


def _list(args):
    from .build import BENCH_CONFIGS
    from .tops import BOARDS
    for name, board in BOARDS.items():
        print(f"{name:12s} {board.description}")
    for label, config in BENCH_CONFIGS:
        print(f"{label:18s} engine bench, W={config.data_width}, {config.ports} ports, "
              f"{config.qps} QPs, LFE5UM5G-85F at 125 MHz")
    return 0


def register(subparsers):
    """Add ``boards`` (with its own subcommands) to the ``mrc-nic`` command line."""
    parser = subparsers.add_parser(
        "boards", help="board bitstreams and synthesis reports (docs/boards.md)",
        description="Board bitstreams and synthesis reports (docs/boards.md).")
    return build_parser(parser)


def build_parser(parser=None):
    from .build import SEED
    from .tops import BOARDS
    parser = parser or CliParser(
        prog="mrc-nic boards", description="Board bitstreams and synthesis reports.")
    sub = parser.add_subparsers(dest="boards_command", required=True, metavar="ACTION")
    p = sub.add_parser("bitstream", help="build one board's top into build/boards/<board>/",
                       description="Build one board's top into build/boards/<board>/.")
    p.add_argument("--board", required=True, choices=sorted(BOARDS), metavar="BOARD",
                   help=f"board to build: {', '.join(sorted(BOARDS))}")
    p.add_argument("--seed", type=int, default=SEED, help="nextpnr seed, any integer")
    p.add_argument("--allow-timing-fail", action="store_true",
                   help="write the bitstream even if the clock constraint is missed")
    p.set_defaults(func=_bitstream)
    p = sub.add_parser("synth-report", help="build boards and engine benches, write "
                                            "build/synth/report.json",
                       description="Build boards and engine benches (or, with --scaling, "
                                   "the per-QP blocks) and write build/synth/report.json.")
    p.add_argument("--boards", help="comma-separated boards (default ecpix5; '' for none)")
    p.add_argument("--benches", help="comma-separated engine benches (default "
                                     "engine-w64-q256,engine-w128-q256; see `list`)")
    p.add_argument("--out", help="report path (default build/synth/report.json)")
    p.add_argument("--timeout", type=float, metavar="MINUTES",
                   help="minutes (more than 0) after which an engine bench (or --place) build "
                        "is stopped and recorded as incomplete (default: none)")
    p.add_argument("--scaling", action="store_true",
                   help="synthesize (Yosys only) the per-QP blocks at several QP counts; alone, "
                        "it builds no board or bench")
    p.add_argument("--blocks", help="scaling blocks (default requester,responder,path_select)")
    p.add_argument("--qps", help="scaling QP counts (default 64,256,1024)")
    p.add_argument("--place", action="store_true",
                   help="with --scaling: also place and route each block that fits, alone on "
                        "the LFE5UM5G-85F (--timeout applies to each)")
    p.set_defaults(func=_synth_report)
    p = sub.add_parser("list", help="boards and engine benches",
                       description="List the boards and the engine benches.")
    p.set_defaults(func=_list)
    return parser


def main(argv=None):
    """``mrc-nic boards ...``: the same parser and error handling as through ``mrc-nic``."""
    from sim.cli import main as mrc_nic
    return mrc_nic(["boards", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
