"""The ``mrc-nic`` command: one entry point for everything a user runs.

Each subcommand lives beside the code it drives and registers itself here. Errors a user can
cause print one line, ``mrc-nic: error: ...``, and exit with status 2.
"""

import argparse
import os
import sys

from . import bench, dissector, evtool, flow, mainjob, replay
from .errors import fail


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""




def _pcap_sample(args):
    from .samples import write_sample_pcap
    try:
        samples = write_sample_pcap(args.out)
    except OSError as e:
        return fail(f"cannot write {args.out}: {e.strerror}")
    print(f"wrote {len(samples)} packets to {args.out}")
    if args.list:
        for number, sample in enumerate(samples, 1):
            print(f"{number:3d}  {sample.name:26s} {sample.description}")
    return 0


def _verilog(args):
    import shutil
    import subprocess

    from hdl.config import ConfigError, NicConfig
    from hdl.nic import MrcNic

    from .export import export_sv
    try:
        config = NicConfig.from_json(args.config) if args.config else NicConfig()
    except ConfigError as e:
        return fail(str(e))
    export_sv(MrcNic(config), name="mrc_nic", path=args.out)
    print(f"wrote {args.out}")
    if args.lint:
        verilator = shutil.which("verilator")
        if verilator is None:
            return fail("verilator is not on PATH: run make setup")
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
    p = sub.add_parser("verilog", help="write the NIC top as SystemVerilog")
    p.add_argument("--config", type=Path, help="NicConfig JSON (defaults otherwise)")
    p.add_argument("--out", type=Path, default=BUILD / "verilog" / "mrc_nic.sv")
    p.add_argument("--lint", action="store_true", help="then run verilator --lint-only on it")
    p.set_defaults(func=_verilog)


def _registers(args):
    from hdl.config import ConfigError, NicConfig
    from hdl.control.nicmap import nic_register_map
    try:
        config = NicConfig.from_json(args.config) if args.config else NicConfig()
    except ConfigError as e:
        return fail(str(e))
    text = nic_register_map(config).markdown()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _register_registers(sub):
    from pathlib import Path
    p = sub.add_parser("registers", help="print the NIC's register map (docs/registers.md)")
    p.add_argument("--config", type=Path, help="NicConfig JSON (defaults otherwise)")
    p.add_argument("--out", type=Path, help="write it to this file instead")
    p.set_defaults(func=_registers)


def _boards(args):
    from boards.cli import main as boards_main
    return boards_main(args.args)


def _register_boards(sub):
    p = sub.add_parser("boards", help="board bitstreams and synthesis reports (docs/boards.md)",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_boards)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mrc-nic", description="Multipath Reliable Connection NIC: simulation and tools.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pcap-sample", help="write one packet of every type to a pcap")
    p.add_argument("out", metavar="OUT.pcap")
    p.add_argument("--list", action="store_true", help="also list the packets")
    p.set_defaults(func=_pcap_sample)

    evtool.register(sub)
    dissector.register(sub)
    flow.register(sub)
    mainjob.register(sub)
    replay.register(sub)
    bench.register(sub)
    _register_verilog(sub)
    _register_registers(sub)
    _register_boards(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        return fail(str(e))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`mrc-nic ... | head`): not an error; silence the final flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
