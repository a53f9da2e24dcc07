"""Formal verification harness: Amaranth properties -> RTLIL -> SymbiYosys (smtbmc + z3).

A *check* is an Elaboratable (usually a wrapper around a design under test, see
:mod:`hdl.formal`) whose ``Assert``/``Assume``/``Cover`` statements Amaranth emits as
``$check`` cells. :func:`run_formal` converts it to RTLIL, writes a ``.sby`` file with one
task (``bmc``, ``prove`` or ``cover``, engine ``smtbmc z3``, ``multiclock off``), runs
``yowasp-sby -f`` in ``build/formal/<name>_<mode>/`` and returns a :class:`FormalResult`:
PASS, FAIL (with the failing property's source line and step), or ERROR/TIMEOUT with the
log path. Runs are reproducible (z3 is deterministic on the same problem) and bounded
(``timeout`` is passed to sby and, with a margin, to the subprocess).

The registered proofs (:data:`PROOFS`) run from ``python -m sim.formal``; ``docs/formal.md``
says what each one proves and how deep.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.back import rtlil

from .env import BUILD, apply_defaults

__all__ = ["FormalResult", "FormalError", "run_formal", "PROOFS", "run_proof", "main"]

MODES = ("bmc", "prove", "cover")
FORMAL_DIR = BUILD / "formal"
ENGINE = "smtbmc z3"
#: After ``prep``: flatten, fold constants (the wrappers tie unused inputs to 0) and map the
#: small memories to registers, which z3 handles better than array theory.
SCRIPT = ("flatten", "opt -keepdc", "memory_map", "opt -keepdc")


class FormalError(RuntimeError):
    """The harness could not run a check (tool missing, bad arguments)."""


@dataclass
class FormalResult:
    """Outcome of one sby task.

    ``status`` is ``"PASS"`` (bmc: no assertion fails up to ``depth``; prove: the basecase and
    the k-induction step both hold; cover: every ``Cover`` reached), ``"FAIL"`` (a
    counterexample, or in cover mode an unreached cover), ``"UNKNOWN"`` (prove: the induction
    step failed, so only the bounded base case holds), ``"TIMEOUT"`` or ``"ERROR"``.
    """
    name: str
    mode: str
    depth: int
    status: str
    seconds: float
    workdir: Path
    log: Path
    failures: list = field(default_factory=list)    # "file:line step N" of failed asserts

    @property
    def passed(self):
        return self.status == "PASS"

    def summary(self):
        text = f"{self.name} {self.mode} depth {self.depth}: {self.status} " \
               f"({self.seconds:.1f} s, log {self.log})"
        for failure in self.failures:
            text += f"\n  {failure}"
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


def run_formal(top, *, name, mode="bmc", depth=20, timeout=300, ports=(), directory=None,
               engine=ENGINE, script=SCRIPT):
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
        Seconds before sby gives up (status TIMEOUT).
    ports : sequence of Signals
        Top-level ports for :func:`amaranth.back.rtlil.convert`.
    directory : path, optional
        Parent of the work directory; default ``build/formal``.
    """
    if mode not in MODES:
        raise FormalError(f"Mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not isinstance(depth, int) or depth < 1:
        raise FormalError(f"Depth must be a positive integer, not {depth!r}")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise FormalError(f"Check name must be letters, digits and underscores, not {name!r}")
    apply_defaults()
    sby = _tool("yowasp-sby")
    _tool(os.environ["SMTBMC"])
    _tool("z3")

    workdir = Path(directory or FORMAL_DIR) / f"{name}_{mode}"
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / "top.il").write_text(rtlil.convert(top, name="top", ports=list(ports)))
    (workdir / "check.sby").write_text(_sby_text(mode, depth, timeout, "top.il", engine,
                                                 script))

    # YoWASP tools see only their working directory: sby runs there with relative paths.
    start = time.monotonic()
    try:
        result = subprocess.run([sby, "-f", "check.sby"], cwd=workdir, capture_output=True,
                                text=True, timeout=timeout + 60)
        output = result.stdout + result.stderr
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        output += "\nharness: sby did not finish in time\n"
    seconds = time.monotonic() - start
    log = workdir / "sby.log"
    log.write_text(output)

    status = "ERROR"
    done = re.findall(r"DONE \((\w+), rc=\d+\)", output)
    if done:
        status = done[-1]
    elif "did not finish in time" in output:
        status = "TIMEOUT"
    failures = sorted(set(re.findall(r"failed assertion \S+ at (\S+ step \d+)", output)))
    failures += sorted(set(re.findall(r"(unreached cover statement .*)", output)))
    return FormalResult(name=name, mode=mode, depth=depth, status=status, seconds=seconds,
                        workdir=workdir, log=log, failures=failures)


# --- Registered proofs ------------------------------------------------------------------------

def _responder(check):
    from hdl.formal.responder_props import ResponderProperties, formal_config
    return ResponderProperties(config=formal_config(), check=check)


def _requester(check):
    from hdl.formal.requester_props import RequesterProperties, formal_config
    return RequesterProperties(config=formal_config(), check=check)


def _mutant(check):
    from hdl.formal.examples import SerialCounter
    return SerialCounter(backwards_bug=(check == "buggy"))


#: name: (factory, check, mode, depth, expected status). ``docs/formal.md`` reports these
#: depths and their run times.
PROOFS = {
    "responder_cum_psn": (_responder, "cum_psn", "bmc", 6, "PASS"),
    "responder_placed_once": (_responder, "placed_once", "bmc", 6, "PASS"),
    "responder_never_placed": (_responder, "never_placed", "bmc", 5, "FAIL"),
    "responder_cover": (_responder, "cover", "cover", 6, "PASS"),
    "requester_window": (_requester, "window", "bmc", 8, "PASS"),
    "requester_cover": (_requester, "cover", "cover", 8, "PASS"),
    "counter_prove": (_mutant, "good", "prove", 4, "PASS"),
    "counter_mutant": (_mutant, "buggy", "bmc", 40, "FAIL"),
}


def run_proof(name, *, mode=None, depth=None, timeout=300, directory=None):
    """Run the registered proof ``name``, optionally with another mode or depth."""
    if name not in PROOFS:
        raise FormalError(f"Proof must be one of {', '.join(PROOFS)}, not {name!r}")
    factory, check, default_mode, default_depth, _expected = PROOFS[name]
    return run_formal(factory(check), name=name, mode=mode or default_mode,
                      depth=depth or default_depth, timeout=timeout, directory=directory)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.formal",
                                     description="Run the formal checks (docs/formal.md).")
    parser.add_argument("proofs", nargs="*", help=f"default: all of {', '.join(PROOFS)}")
    parser.add_argument("--mode", choices=MODES, help="override the proof's mode")
    parser.add_argument("--depth", type=int, help="override the proof's depth")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per proof")
    args = parser.parse_args(argv)
    unknown = [p for p in args.proofs if p not in PROOFS]
    if unknown:
        parser.error(f"unknown proof {unknown[0]!r}; known: {', '.join(PROOFS)}")
    ok = True
    for name in args.proofs or PROOFS:
        result = run_proof(name, mode=args.mode, depth=args.depth, timeout=args.timeout)
        expected = PROOFS[name][4] if args.mode is None else None
        print(result.summary(), flush=True)
        if expected is not None and result.status != expected:
            print(f"  expected {expected}", flush=True)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
