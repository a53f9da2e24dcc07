"""The C++ stream agents of the two-NIC bench (``sim/tb/dpi.py``, the main job's default under
Verilator) against the Python agents (``sim/tb/harness.py``): beat for beat the same run.

The Python run below uses the NIC pair build of ``tests/hdl/test_nic_rtl.py`` and simulates in
its folder, so ``tests/conftest.py`` puts this test in that file's group (one worker).
"""

import json

import pytest
from test_nic_rtl import BASE, _assert_clean

from sim.env import BUILD
from sim.mainjob import run_scenario
from sim.schema import validate_report


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
