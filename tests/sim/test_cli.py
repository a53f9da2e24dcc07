"""The `mrc-nic` command: pcap-sample, flow, sim, scenario files, and one-line errors with exit
status 2 (every subcommand's errors: tests/sim/test_cli_errors.py)."""

import json
import subprocess
import sys

import pytest
from scapy.compat import raw
from scapy.utils import rdpcap

from sim.samples import sample_packets
from sim.schema import validate_report
from sim.tb.pair import RECEIVE_CONFIG


def mrc_nic(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sim.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_pcap_sample_writes_every_sample(tmp_path):
    out = tmp_path / "sample.pcap"
    result = mrc_nic("pcap-sample", out, "--list")
    assert result.returncode == 0, result.stderr
    samples = sample_packets()
    assert f"wrote {len(samples)} packets" in result.stdout
    assert [raw(p) for p in rdpcap(str(out))] == [raw(s.packet) for s in samples]
    assert all(s.name in result.stdout for s in samples)


def test_pcap_sample_unwritable_is_one_line_error(tmp_path):
    out = tmp_path / "missing-dir" / "x.pcap"
    result = mrc_nic("pcap-sample", out)
    assert result.returncode == 2
    assert result.stderr == f"mrc-nic pcap-sample: {out}: cannot write: No such file or directory\n"


def test_sim_foundation_flow(tmp_path):
    result = mrc_nic("flow", "--bytes", 20000, "--msg-size", 5000, "--out", tmp_path,
                     "--ack-every", 2, "--planes", 4, "--evs", 8, "--sim", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # 20000 B in 5000 B messages at MTU 1024: 4 messages of 5 packets.
    assert report["messages"] == 4 and report["data_packets"] == 20
    assert sum(report["packets_per_plane"]) == 20 and len(report["packets_per_plane"]) == 4
    assert min(report["packets_per_plane"]) >= 4          # 8 EVs round-robin over 4 planes
    assert report["bad_icrc"] == 0
    assert report["tshark"]["status"] == "ok" and report["tshark"]["mismatches"] == 0
    frames = rdpcap(str(tmp_path / "traffic.pcap"))
    assert len(frames) == report["data_packets"] + report["acks"]


def test_sim_runs_the_rtl_receive_path(tmp_path):
    """Every frame of the flow's capture goes through the NIC top (Icarus) and is accepted."""
    # The receive path's reduced NIC (64 QPs, one EV profile, 2 ports): the export, Icarus's
    # compile and its run take a fraction of the default NIC's, and the conversion is the one
    # tests/sim/test_replay.py's Verilator build reads.
    config = tmp_path / "config.json"
    config.write_text(json.dumps(RECEIVE_CONFIG.to_dict()))
    result = mrc_nic("flow", "--bytes", 3000, "--msg-size", 1500, "--out", tmp_path,
                     "--config", config, "--planes", RECEIVE_CONFIG.ports, "--evs", 4,
                     "--sim", "icarus")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    frames = report["data_packets"] + report["acks"]
    rtl = report["rtl_receive"]
    assert rtl["status"] == "ok" and rtl["accepted"] == frames
    assert sum(rtl["drop_counters"].values()) == 0
    assert rtl["placed_bytes"] == 3000, rtl             # every payload byte was written
    assert "RTL receive path (icarus)" in result.stdout


def test_sim_rejects_bad_arguments(tmp_path):
    bad_mtu = mrc_nic("flow", "--mtu", 1500, "--out", tmp_path)
    assert bad_mtu.returncode == 2
    assert bad_mtu.stderr == ("mrc-nic flow: --mtu: must be one of 256, 512, 1024, 2048, 4096, "
                              "not 1500\n")
    missing = mrc_nic("flow", "--profile", tmp_path / "nope.json", "--out", tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.startswith("mrc-nic flow: --profile: cannot read EV profile")
    no_config = mrc_nic("flow", "--config", tmp_path / "nope.json", "--out", tmp_path)
    assert no_config.returncode == 2
    assert no_config.stderr.startswith("mrc-nic flow: --config: "), no_config.stderr
    zero = mrc_nic("flow", "--bytes", 0, "--out", tmp_path)
    assert zero.returncode == 2
    assert zero.stderr == "mrc-nic flow: --bytes: must be at least 1, not 0\n"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--planes", 40, "--planes: must be an integer from 1 to 16, not 40"),
    ("--reo-wnd", 64, "--reo-wnd: must be an integer from 0 to 63, not 64"),
    ("--infer-k", 16, "--infer-k: must be an integer from 0 to 15, not 16"),
    ("--gap-depth", 16, "--gap-depth: must be an integer from 0 to 15, not 16"),
])
def test_sim_bad_flag_is_one_line_error(tmp_path, flag, value, message):
    result = mrc_nic("sim", flag, value, "--out", tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"mrc-nic sim: {message}\n"
    assert not (tmp_path / "report.json").exists()


def test_sim_one_way_leaves_the_acks_off_the_sending_sides_wire(tmp_path):
    """``--one-way``: only NIC a sends; its peer's ACKs cross the idle reverse planes, so none
    of a's wire goes to control frames, while both ways each side's ACKs share its planes."""
    shares = {}
    for name, flags in (("one", ["--one-way"]), ("both", [])):
        result = mrc_nic("sim", "--backend", "model", "--scenario", "clean", "--bytes", 65536,
                         "--out", tmp_path / name, *flags)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads((tmp_path / name / "report.json").read_text())
        validate_report(report)
        assert report["scenario"]["both_ways"] is (name == "both")
        assert report["bytes_delivered"] == report["bytes_offered"] == \
            65536 * (2 if name == "both" else 1)
        assert "wire of the sending side" in result.stdout
        shares[name] = report["wire_shares"]
    assert shares["one"]["data_sides"] == 1 and shares["one"]["control"] == 0
    assert shares["both"]["data_sides"] == 2 and shares["both"]["control"] > 0
    for s in shares.values():
        assert s["first_transmission"] + s["retransmission"] + s["control"] == \
            pytest.approx(1, abs=2e-4)


def test_sim_scenario_file_and_config_reach_more_qps_than_the_default_build(tmp_path):
    """``--config`` builds the NICs from a NicConfig, so 32 QPs (the default build holds 16)
    run; the scenario file sets the run, a flag overrides it, and the report echoes the file
    and the resolved scenario."""
    config = tmp_path / "nic.json"
    config.write_text(json.dumps({"qps": 32, "ports": 4, "evs_per_profile": 32, "mpr_units": 1,
                                  "ev_profiles": 1, "wr_slots": 4, "max_wimm": 4}))
    scenario = tmp_path / "wide.toml"
    scenario.write_text('description = "32 QPs"\nbase = "clean"\nqps = 32\nevs = 8\n'
                        'bytes = 65536\nmsg_size = 2048\nbackend = "model"\nseed = 1\n')
    result = mrc_nic("sim", "--scenario", scenario, "--config", config, "--seed", 3,
                     "--out", tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["scenario_file"] == str(scenario.resolve())
    used = report["scenario"]
    assert (used["name"], used["qps"], used["planes"], used["seed"]) == ("wide", 32, 4, 3)
    assert used["fail_plane"] is None and used["nic_config"]["qps"] == 32
    assert report["ok"] and report["bytes_delivered"] == report["bytes_offered"] == 2 * 65536


NO_FAILURE = {"fail_plane": None, "fail_at_us": None, "recover_at_us": None}
#: What each named scenario file changes from the defaults (the values the scenarios had when
#: they were written in Python, so runs by name give the same figures as before).
NAMED = {
    "default": {},
    "clean": NO_FAILURE,
    "plane-failure": {"recover_at_us": None},
    "timeout-only": {"recover_at_us": None, "infer_k": 0, "reo_wnd": 0, "port_wnd": 0},
    "flap": {"fail_kind": "flap", "fail_at_us": 30.0, "recover_at_us": 150.0,
             "flap_period_us": 30.0},
    "loss1": {**NO_FAILURE, "loss": 0.01},
    "ecmp": {**NO_FAILURE, "baseline": "ecmp", "qps": 8},
    "mrc-8qp": {**NO_FAILURE, "qps": 8},
    "congestion": {**NO_FAILURE, "trim_threshold": 8 * 1024, "ecn_threshold": 2 * 1024},
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_scenario_files(name):
    from sim.scenario import SCENARIOS, Scenario, scenario_names
    assert set(scenario_names()) == set(NAMED)
    expected = Scenario(name=name, **NAMED[name])
    assert SCENARIOS[name] == expected
    assert {k: type(v) for k, v in SCENARIOS[name].to_dict().items()} == \
        {k: type(v) for k, v in expected.to_dict().items()}
