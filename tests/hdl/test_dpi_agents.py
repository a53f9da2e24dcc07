"""The C++ stream agents of the two-NIC bench (``sim/tb/dpi.py``, the main job's default under
Verilator) against the Python agents (``sim/tb/harness.py``): beat for beat the same run.

The runs below use the NIC pair's two builds: the C++ agents' of ``tests/hdl/test_nic_rtl.py``
and the traceable Python agents' of ``tests/sim/test_waves.py`` (each folder locked while it is
exported or built).
"""

import json

import pytest

from sim.env import BUILD
from sim.mainjob import run_scenario
from sim.schema import validate_report
from tests.hdl.test_nic_rtl import BASE, _assert_clean


def _run(name, scn, tmp_path):
    report = run_scenario(scn, tmp_path / name, build_dir=BUILD / "tests" / "nic_pair",
                          quick_build=True, log=lambda *_: None)
    validate_report(report)
    return report


def test_dpi_agents_do_what_the_python_agents_do(tmp_path, monkeypatch):
    """A run without bubbles or backpressure, with a plane failing mid-transfer and coming
    back (probes, resends, EV events), gives the same report, result and capture under the
    C++ agents as under the Python agents."""
    scn = BASE.replace(extra={}, fail_plane=1, fail_at_us=15.0, recover_at_us=60.0,
                       bytes=32 * 1024)
    if scn.sim != "verilator":
        pytest.skip("the C++ agents need Verilator (Icarus has no DPI)")
    monkeypatch.delenv("MRC_HARNESS", raising=False)
    dpi = _run("dpi", scn, tmp_path)
    monkeypatch.setenv("MRC_HARNESS", "python")
    python = _run("python", scn, tmp_path)
    assert (python["sim"]["agents"], dpi["sim"]["agents"]) == ("python", "dpi")
    _assert_clean(dpi)
    assert dpi["retransmissions"] > 0 and dpi["ev_events"]
    for report in (python, dpi):
        for key in ("wall_s", "cycles_per_s", "total_wall_s", "agents"):
            report["sim"].pop(key)
    assert dpi == python
    results = [json.loads((tmp_path / name / "result.json").read_text())
               for name in ("python", "dpi")]
    for result in results:
        result.pop("wall_s")
        result.pop("agents")
    assert results[0] == results[1]
    assert ((tmp_path / "python" / "traffic.pcapng").read_bytes()
            == (tmp_path / "dpi" / "traffic.pcapng").read_bytes())


def test_dpi_agents_bubbles_and_backpressure_slow_the_run_but_lose_nothing(tmp_path,
                                                                          monkeypatch):
    """The C++ agents apply the scenario's bubbles (sources) and backpressure (sinks): the same
    transfer with half of all cycles idle on every port takes longer, and still delivers every
    byte and completion in order."""
    monkeypatch.delenv("MRC_HARNESS", raising=False)
    # An ACK per packet: with coalesced ACKs this short transfer waits on the ACK timer, which
    # hides the stalls.
    plain = BASE.replace(extra={}, bytes=16 * 1024, ack_every=1, coalesce_gaps=0)
    if plain.sim != "verilator":
        pytest.skip("the C++ agents need Verilator (Icarus has no DPI)")
    fast = _run("plain", plain, tmp_path)
    slow = _run("stalled", plain.replace(extra={"bubbles": 0.5, "backpressure": 0.5}),
                tmp_path)
    assert (fast["sim"]["agents"], slow["sim"]["agents"]) == ("dpi", "dpi")
    for report in (fast, slow):
        _assert_clean(report)
    assert slow["duration_us"] > 1.2 * fast["duration_us"], \
        (fast["duration_us"], slow["duration_us"])
