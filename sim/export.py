"""Export Amaranth components to SystemVerilog, for cocotb and for lint.

Two Icarus traps decide the script. Plain ``always @*`` (what ``amaranth.back.verilog.convert``
writes) never runs when its inputs never change after time 0, leaving outputs stuck at ``X``
(amaranth issue #594): ``write_verilog -sv`` emits ``always_comb`` instead. And processes kept
as ``if`` chains (``proc -nomux``) made Icarus 11 spin forever at time 0 on a design whose
ready/valid paths cross modules (seen here on the port arbiter feeding the port demux, which
Verilator ran fine); a full ``proc`` turns them into multiplexers and continuous assignments.
"""

from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil


def export_sv(component, *, name, path=None):
    """Convert ``component`` to SystemVerilog through Amaranth's builtin Yosys.

    Returns the text; with ``path`` it is also written there. The Yosys is the WebAssembly one
    (``AMARANTH_USE_YOSYS=builtin``), which cannot see host paths: the design goes in and the
    Verilog comes out through standard input and output.
    """
    text = rtlil.convert(component, name=name, emit_src=False)
    yosys = find_yosys(lambda version: version >= (0, 40))
    script = "\n".join([
        f"read_rtlil <<rtlil\n{text}\nrtlil",
        "proc",
        "opt_clean",
        "memory_collect",
        "write_verilog -sv -norename",
    ])
    verilog = yosys.run(["-q", "-"], script, ignore_warnings=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(verilog)
    return verilog
