"""``mrc-nic boards``: build board bitstreams and the synthesis report (docs/boards.md).

Usage::

    python -m boards.cli bitstream --board ecpix5 [--seed 1]
    python -m boards.cli synth-report [--boards ecpix5,icebreaker] [--benches engine-w64-q256]
    python -m boards.cli synth-report --scaling [--blocks requester] [--qps 64,256,1024] [--place]
    python -m boards.cli list
"""

import argparse
import json
import sys

__all__ = ["main", "build_parser"]


def _fail(message):
    print(f"mrc-nic boards: error: {message}", file=sys.stderr)
    return 2


def _bitstream(args):
    from .build import BuildError, _one_line, build_board
    try:
        result = build_board(args.board, seed=args.seed,
                             allow_timing_fail=args.allow_timing_fail)
    except BuildError as e:
        return _fail(str(e))
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
        scaling_report,
        synth_report,
    )
    from .tops import BOARDS
    only_scaling = args.scaling and args.boards is None and args.benches is None
    if args.place and not args.scaling:
        return _fail("--place places the scaling blocks: it needs --scaling")
    if args.scaling:
        blocks = [b for b in (args.blocks or ",".join(SCALING_BLOCKS)).split(",") if b]
        for block in blocks:
            if block not in SCALING_BLOCKS:
                return _fail(f"block must be one of {', '.join(SCALING_BLOCKS)}, not {block!r}")
        try:
            qps = [int(q) for q in args.qps.split(",")] if args.qps else list(SCALING_QPS)
        except ValueError:
            return _fail(f"qps must be comma-separated integers, not {args.qps!r}")
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
            return _fail(f"board must be one of {', '.join(BOARDS)}, not {board!r}")
    known = dict(BENCH_CONFIGS)
    if args.benches is None:
        benches = [(label, known[label]) for label in DEFAULT_BENCHES]
    else:
        benches = []
        for label in (b for b in args.benches.split(",") if b):
            if label not in known:
                return _fail(f"bench must be one of {', '.join(known)}, not {label!r}")
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


def build_parser(parser=None):
    from .build import SEED
    from .tops import BOARDS
    parser = parser or argparse.ArgumentParser(
        prog="mrc-nic boards", description="Board bitstreams and synthesis reports.")
    sub = parser.add_subparsers(dest="boards_command", required=True, metavar="ACTION")
    p = sub.add_parser("bitstream", help="build one board's top into build/boards/<board>/")
    p.add_argument("--board", required=True, choices=sorted(BOARDS))
    p.add_argument("--seed", type=int, default=SEED, help="nextpnr seed (default %(default)s)")
    p.add_argument("--allow-timing-fail", action="store_true",
                   help="write the bitstream even if the clock constraint is missed")
    p.set_defaults(func=_bitstream)
    p = sub.add_parser("synth-report", help="build boards and engine benches, write "
                                            "build/synth/report.json")
    p.add_argument("--boards", help="comma-separated boards (default ecpix5; '' for none)")
    p.add_argument("--benches", help="comma-separated engine benches (default "
                                     "engine-w64-q256,engine-w128-q256; see `list`)")
    p.add_argument("--out", help="report path (default build/synth/report.json)")
    p.add_argument("--timeout", type=float,
                   help="minutes after which an engine bench (or --place) build is stopped and "
                        "recorded as incomplete (default: none)")
    p.add_argument("--scaling", action="store_true",
                   help="synthesize (Yosys only) the per-QP blocks at several QP counts; alone, "
                        "it builds no board or bench")
    p.add_argument("--blocks", help="scaling blocks (default requester,responder,path_select)")
    p.add_argument("--qps", help="scaling QP counts (default 64,256,1024)")
    p.add_argument("--place", action="store_true",
                   help="with --scaling: also place and route each block that fits, alone on "
                        "the LFE5UM5G-85F (--timeout applies to each)")
    p.set_defaults(func=_synth_report)
    p = sub.add_parser("list", help="boards and engine benches")
    p.set_defaults(func=_list)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
