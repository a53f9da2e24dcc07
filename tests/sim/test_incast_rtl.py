"""RTL NICs in the N-NIC fabric (``mrc-nic sim --backend rtl --nics N --pattern incast``):
two RTL NICs send into a third over a switch per plane, every stream port with random input
bubbles and output backpressure; every flow completes with its bytes in place, and the
report's N-NIC fields follow the model run's definitions. Three NICs, not the five of the
benchmark, and a build without optimisation: the same bench and group top, built in a
fraction of the time. Once with the ECN window (``--cc ecn``) and once with NSCC (the
default), on one build: the main job's RTL NICs always carry the NSCC engine and run the ECN
window when CONFIG ``cc_nscc`` is off, so both runs use the NSCC scenario's build (an ECN run
on its own is built with the default fabric's NSCC setting, another build here)."""

import random

import pytest

from sim import mainjob
from sim.env import BUILD
from sim.model.multi import flows_of
from sim.scenario import scenario
from sim.schema import validate_report

SEED = random.Random().randrange(1 << 16)


@pytest.mark.parametrize("cc", ["ecn", "nscc"])
def test_incast_two_to_one_on_rtl_delivers_every_flow(tmp_path, cc):
    scn = scenario("default", backend="rtl", sim="verilator", nics=3, pattern="incast",
                   bytes=16 * 1024, msg_size=8 * 1024, qps=2, fail_plane=-1, seed=SEED,
                   cc=1, cc_algorithm=cc, ecn_threshold=2048, queue_bytes=8192,
                   max_us=2_000.0, extra={"bubbles": 0.2, "backpressure": 0.2})
    lines = []
    # Both runs on the NSCC scenario's build, kept in build/ (ignored by git): reused while
    # the gateware is unchanged. On its own, the ECN scenario would build with the default
    # fabric's setting.
    config = mainjob.nic_config_for(scn)
    nscc = mainjob.rtl_nscc_setting(scn.replace(cc_algorithm="nscc"), config)
    assert (mainjob.rtl_nscc_setting(scn, config) == nscc) == (cc == "nscc")
    build = BUILD / "tests" / "nic_group3-nscc-dpi"
    report = mainjob.run_scenario(scn, tmp_path, log=lines.append, quick_build=True,
                                  build_dir=build, build_nscc=nscc)
    validate_report(report)
    assert report["sim"]["backend"] == "rtl" and report["sim"]["agents"] == "dpi"
    assert report["scenario"]["extra"] == {"bubbles": 0.2, "backpressure": 0.2}
    assert report["finished"], (SEED, report["messages_completed"], report["qp_errors"])
    assert report["ok"], (SEED, report["bytes_lost"], report["bytes_corrupted"],
                          report["completions_in_order"])
    assert report["bytes_delivered"] == report["bytes_offered"] == 2 * scn.bytes
    assert report["messages_completed"] == report["messages_posted"]

    # One flow per sending QP, each sender's bytes into NIC a only.
    flows = flows_of(scn)
    assert len(report["flows"]) == len(flows) * scn.qps
    assert {(f["src"], f["dst"]) for f in report["flows"]} == {(s, "a") for s in "bc"}
    assert sum(f["bytes"] for f in report["flows"]) == 2 * scn.bytes
    assert all(f["bytes"] > 0 and f["goodput_gbps"] > 0 for f in report["flows"])
    rates = [f["goodput_gbps"] for f in report["flows"]]
    jain = sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates))
    assert report["jain_fairness"] == pytest.approx(jain, abs=1e-3)

    # One receiver: the goodput is over its downlinks, whose capacity the report names.
    assert report["receiver_payload_capacity_gbps"] == report["payload_capacity_gbps"]
    assert report["goodput_gbps"] == pytest.approx(
        report["bytes_delivered"] * 8 / (report["duration_us"] * 1000), rel=1e-3)
    assert report["efficiency"] == pytest.approx(
        report["goodput_gbps"] / report["payload_capacity_gbps"], abs=1e-3)
    delays = report["queue_delay_us"]
    assert 0 <= delays["p50"] <= delays["p99"] <= delays["max"]
    assert delays["max"] > 0            # two senders into one receiver's egress ports
    assert report["fabric_data_drops"] >= 0
    assert report["cc"]["algorithm"] == cc
    assert (report["cc"]["target_qdelay_us"] is None) == (cc == "ecn")
    assert set(report["counters"]) == set("abc")
    # Both runs are on NICs built with the engine (the requester's ``nscc`` submodule in the
    # exported Verilog); the bench tells them to gate on its window (CONFIG ``cc_nscc``) only
    # for NSCC's run.
    assert any(line.startswith("building 3 RTL NICs") and f"NSCC engine; {cc} runs" in line
               for line in lines)
    exported = (build / "nic_group_dpi.sv").read_text()
    assert "requester.nscc" in exported
