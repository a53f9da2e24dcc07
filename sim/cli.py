"""The ``mrc-nic`` command: one entry point for everything a user runs.

Each subcommand lives beside the code it drives and registers itself here. The same flag
means the same thing everywhere: ``--sim`` the simulator, ``--config`` a NicConfig JSON file,
``--out`` the output file or folder. Errors a user can cause print one line,
``mrc-nic <command>: <flag or field>: <what is wrong>``, and exit with status 2
(:mod:`sim.errors`).
"""

import os
import sys

from . import bench, dissector, evtool, flow, fuzz, mainjob, regtool, replay, wirecheck
from .errors import CliParser, UsageError, fail, nic_config_from, set_command


def _pcap_sample(args):
    from .samples import write_sample_pcap
    try:
        samples = write_sample_pcap(args.out)
    except OSError as e:
        return fail(f"cannot write: {e.strerror}", field=args.out)
    print(f"wrote {len(samples)} packets to {args.out}")
    if args.list:
        for number, sample in enumerate(samples, 1):
            print(f"{number:3d}  {sample.name:26s} {sample.description}")
    return 0


def _verilog(args):
    import shutil
    import subprocess

    from hdl.nic import MrcNic

    from .export import export_sv
    config = nic_config_from(args.config)
    try:
        # Before the export, which takes a while: a path that cannot be written fails at once.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        export_sv(MrcNic(config), name="mrc_nic", path=args.out)
    except OSError as e:
        return fail(f"{args.out}: cannot write: {e.strerror}", field="--out")
    print(f"wrote {args.out}")
    if args.lint:
        verilator = shutil.which("verilator")
        if verilator is None:
            return fail("verilator is not on PATH: run make setup", field="--lint")
        result = subprocess.run([verilator, "--lint-only", "-Wno-fatal", "-Wno-WIDTHEXPAND",
                                 "-Wno-WIDTHTRUNC", "--top-module", "mrc_nic", str(args.out)],
                                capture_output=True, text=True)
        errors = [line for line in result.stderr.splitlines() if line.startswith("%Error")]
        warnings = [line for line in result.stderr.splitlines() if line.startswith("%Warning")]
        print(f"verilator --lint-only: {len(errors)} errors, {len(warnings)} warnings")
        for line in errors:
            print(line, file=sys.stderr)
        if result.returncode != 0 or errors:
            return 1
    return 0


def _register_verilog(sub):
    from pathlib import Path

    from .env import BUILD
    p = sub.add_parser("verilog", help="write the NIC top as SystemVerilog",
                       description="Export the NIC top (hdl/nic.py) as SystemVerilog.")
    p.add_argument("--config", type=Path, metavar="CONFIG.json",
                   help="NicConfig JSON (docs/configuration.md; default: the defaults)")
    p.add_argument("--out", type=Path, metavar="OUT.sv", help="file to write",
                   default=BUILD / "verilog" / "mrc_nic.sv")
    p.add_argument("--lint", action="store_true", help="then run verilator --lint-only on it")
    p.set_defaults(func=_verilog)


def _version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mrc-nic")
    except PackageNotFoundError:        # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser():
    from boards.cli import register as register_boards
    parser = CliParser(
        prog="mrc-nic", description="Multipath Reliable Connection NIC: simulation and tools. "
                                    "`mrc-nic COMMAND --help` describes each command.")
    parser.add_argument("--version", action="version", version=f"mrc-nic {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pcap-sample", help="write one packet of every type to a pcap",
                       description="Write one packet of every type (sim/samples.py) to a pcap.")
    p.add_argument("out", metavar="OUT.pcap", help="capture to write")
    p.add_argument("--list", action="store_true", help="also list the packets")
    p.set_defaults(func=_pcap_sample)

    evtool.register(sub)
    dissector.register(sub)
    flow.register(sub)
    mainjob.register(sub)
    fuzz.register(sub)
    replay.register(sub)
    wirecheck.register(sub)
    bench.register(sub)
    _register_verilog(sub)
    regtool.register(sub)
    register_boards(sub)
    return parser


def main(argv=None):
    """Run one ``mrc-nic`` command; return its exit status (0, 1 for a failed run, 2 for bad
    input, with the one-line error of :mod:`sim.errors`)."""
    set_command("")
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:          # --help, --version, or a usage error (printed)
            return e.code if isinstance(e.code, int) else 2
        return args.func(args)
    except UsageError as e:
        return fail(e.message, field=e.field)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`mrc-nic ... | head`): not an error; silence the final flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        set_command("")


if __name__ == "__main__":
    sys.exit(main())
