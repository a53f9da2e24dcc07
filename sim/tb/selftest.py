"""Board self-tests (``boards/transport.py``) under Verilator through cocotb.

A transport self-test is a whole NIC with its bring-up script, fabric, work generator and
checkers; its tests run it for thousands of cycles, which takes Amaranth's Python simulator
minutes and Verilator seconds (plus a build that is kept and reused while the sources are
unchanged). :func:`run_selftest_rtl` is the Verilator form of those runs: it wraps the design
in a :class:`SelfTestBench`, runs ``sim.tb.cocotb_selftest`` for a number of cycles and hands
back what the Amaranth benches read: the counters by name, the error flag and the UART line
sampled once per cycle.

The bench holds reset low, as the Amaranth simulator does: every register starts at its
initial value and counts from the first clock edge, so cycle numbers mean the same in both.
"""

import json
from pathlib import Path

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..env import BUILD, REPO
from .runner import run_cocotb, source_key

__all__ = ["SelfTestBench", "run_selftest_rtl", "SelfTestRun"]


class SelfTestBench(wiring.Component):
    """A self-test with its inputs driven for an unattended simulator run.

    Parameters
    ----------
    design : Elaboratable
        What to simulate: ``selftest`` itself, or a module that contains it (e.g. with a port
        looped back).
    selftest : TransportSelfTest
        The self-test inside ``design`` whose outputs are read.
    kill : int
        Mask driven on ``selftest.kill`` while the cycle count is inside ``kill_window``.
    kill_window : (int, int), ``"run"`` or None
        First cycle and the cycle after the last one of the kill; ``"run"``: given by each
        run, as the knobs ``kill_first`` and ``kill_end`` (0 and 0: never); ``None``: never.
    knobs : dict of str to Value
        Inputs of ``design`` that each run sets (:func:`run_selftest_rtl`'s ``knobs``),
        through inputs of the bench of the same names: one build serves runs with
        different values.

    Members
    -------
    uart_tx : ``Out(1)``
    counters : ``Out(ArrayLayout(32, len(selftest.counter_names)))``
    error : ``Out(1)``
    ext_frames : ``Out(32)``: frames sent on the first external plane.
    kill_first, kill_end, and one input per knob : ``In``, as above.
    """

    def __init__(self, design, selftest, *, kill=0, kill_window=None, knobs=None):
        if kill_window not in (None, "run") and not (isinstance(kill_window, tuple)
                                                     and len(kill_window) == 2
                                                     and 0 <= kill_window[0] <= kill_window[1]):
            raise ValueError(f"kill_window must be a (first, end) pair of cycles or \"run\", "
                             f"not {kill_window!r}")
        self._design = design
        self._selftest = selftest
        self._kill = kill
        self._kill_window = kill_window
        self._knobs = dict(knobs or {})
        members = {name: In(Value.cast(target).shape()) for name, target in self._knobs.items()}
        if kill_window == "run":
            members.update(kill_first=In(32), kill_end=In(32))
        super().__init__({
            "uart_tx": Out(1, init=1),
            "counters": Out(selftest.counters.shape()),
            "error": Out(1),
            "ext_frames": Out(32),
            **members,
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.design = self._design
        selftest = self._selftest
        cycle = Signal(32)
        m.d.sync += cycle.eq(cycle + 1)
        for name, target in self._knobs.items():
            m.d.comb += target.eq(getattr(self, name))
        if self._kill_window is not None:
            first, end = ((self.kill_first, self.kill_end) if self._kill_window == "run"
                          else self._kill_window)
            m.d.comb += selftest.kill.eq(Mux((cycle >= first) & (cycle < end), self._kill, 0))
        m.d.comb += [self.uart_tx.eq(selftest.uart_tx), self.counters.eq(selftest.counters),
                     self.error.eq(selftest.error)]
        if hasattr(selftest, "ext_tx"):
            port = selftest.ext_tx[0]
            with m.If(port.valid & port.ready & port.p.last):
                m.d.sync += self.ext_frames.eq(self.ext_frames + 1)
        return m


class SelfTestRun:
    """What a run left: ``counters`` (name: value), ``error``, ``ext_frames`` and ``levels``
    (the UART line, one sample per cycle)."""

    def __init__(self, counters, error, ext_frames, levels):
        self.counters = counters
        self.error = error
        self.ext_frames = ext_frames
        self.levels = levels


def _sources_key(*parts):
    """The export key: the gateware (``hdl/``), the self-test blocks (``boards/``), this
    bench, and ``parts``."""
    files = sorted((REPO / "boards").glob("*.py")) + [Path(__file__)]
    return source_key(*(path.read_bytes() for path in files), *parts)


def run_selftest_rtl(make, *, name, cycles, params, period_ns=10, eth_period_ns=None,
                     build_dir=None, knobs=None):
    """Run a self-test bench for ``cycles`` cycles under Verilator; return a
    :class:`SelfTestRun`.

    ``make`` returns ``(bench, selftest)``: a :class:`SelfTestBench` and the self-test in it;
    it is called only when the design must be exported again. ``params`` must name
    everything ``make`` depends on: with the sources, it keys the build kept in
    ``build/tests/<name>``, reused while they are unchanged. ``eth_period_ns`` starts a
    second clock, for an ``eth`` domain. ``knobs``: the value of each of the bench's knobs
    (and ``kill_first``, ``kill_end``) for this run, set before the first clock edge; they
    are no part of the build.
    """
    build_dir = Path(build_dir or BUILD / "tests" / name)
    names_file = build_dir / "counter_names.json"

    def export():
        bench, selftest = make()
        build_dir.mkdir(parents=True, exist_ok=True)
        names_file.write_text(json.dumps(list(selftest.counter_names)))
        return bench

    result = build_dir / "selftest.json"
    result.unlink(missing_ok=True)
    env = {"CYCLES": cycles, "PERIOD_NS": period_ns, "RESULT": result,
           "KNOBS": json.dumps(knobs or {})}
    if eth_period_ns is not None:
        env["ETH_PERIOD_NS"] = eth_period_ns
    if not names_file.exists():     # no names kept beside the export: export again
        (build_dir / "export.key").unlink(missing_ok=True)
    run_cocotb(export, toplevel=name, test_module="sim.tb.cocotb_selftest",
               build_dir=build_dir, sim="verilator", quick_build=True, reuse=True, waves=False,
               export_key=_sources_key(name, params), extra_env=env)
    data = json.loads(result.read_text())
    counters = dict(zip(json.loads(names_file.read_text()), data["counters"], strict=True))
    return SelfTestRun(counters, data["error"], data["ext_frames"],
                       [int(level) for level in data["levels"]])
