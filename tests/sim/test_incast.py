"""N model NICs over the switched fabric (``mrc-nic sim --nics N --pattern P``): every pattern
delivers every byte to the right place, the report carries the per-flow figures, and the
command line names a bad flag and its allowed range."""

import json
import random

import pytest

from sim import mainjob
from sim.cli import main
from sim.model.multi import flows_of
from sim.scenario import SCENARIOS, nic_config_for, scenario
from sim.schema import validate_report

# Short transfers on a quiet fabric; the seed is drawn so each run sees other bytes and EVs.
SEED = random.Random().randrange(1 << 16)


def small(**kw):
    values = dict(backend="model", bytes=24 * 1024, msg_size=8 * 1024, qps=2, fail_plane=-1,
                  seed=SEED, max_us=20_000.0)
    values.update(kw)
    return scenario("default", **values)


@pytest.mark.parametrize(("nics", "pattern", "flows"), [
    (4, "pairs", [(0, 1), (1, 0), (2, 3), (3, 2)]),
    (4, "incast", [(1, 0), (2, 0), (3, 0)]),
    (3, "all-to-all", [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]),
])
def test_patterns_name_who_sends_to_whom(nics, pattern, flows):
    assert flows_of(small(nics=nics, pattern=pattern)) == flows


@pytest.mark.parametrize(("nics", "pattern", "cc"), [
    (3, "incast", "ecn"),
    (3, "all-to-all", "nscc"),
])
def test_every_flow_completes_in_order_with_its_bytes_in_place(tmp_path, nics, pattern, cc):
    """Each sender's bytes land in its own slice of each receiver's region (a misdirected
    write would show as a memory mismatch), every WR completes in order, and the report
    lists one flow per sending QP with Jain's index over them."""
    scn = small(nics=nics, pattern=pattern, cc_algorithm=cc, ecn_threshold=2048,
                queue_bytes=8192)
    report = mainjob.run_scenario(scn, tmp_path, log=lambda *_: None)
    validate_report(report)
    assert report["ok"], (SEED, report["bytes_lost"], report["completions_in_order"])
    flows = flows_of(scn)
    assert len(report["flows"]) == len(flows) * scn.qps
    assert sum(f["bytes"] for f in report["flows"]) == scn.bytes * len(flows)
    assert {(f["src"], f["dst"]) for f in report["flows"]} == \
        {("abcdefghijklmnop"[s], "abcdefghijklmnop"[d]) for s, d in flows}
    assert 0 < report["jain_fairness"] <= 1.0001
    assert report["cc"]["algorithm"] == cc
    assert (report["cc"]["target_qdelay_us"] is None) == (cc != "nscc")
    delays = report["queue_delay_us"]
    assert 0 <= delays["p50"] <= delays["p99"] <= delays["max"]
    assert ("receiver_payload_capacity_gbps" in report) == (pattern == "incast")
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["flows"] == report["flows"]


def test_incast_congests_the_receivers_downlinks(tmp_path):
    """Three senders into one receiver at full rate: its egress queues fill (ECN marks,
    waits), where the same senders in pairs do not wait at all."""
    kw = dict(bytes=48 * 1024, ecn_threshold=2048, queue_bytes=16384, both_ways=False)
    incast = mainjob.run_scenario(small(nics=4, pattern="incast", **kw), tmp_path / "incast",
                                  log=lambda *_: None)
    assert incast["ok"]
    assert incast["queue_delay_us"]["max"] > 0
    assert sum(p.get("ecn-marked", 0) for p in incast["fabric"]["planes"]) > 0
    pairs = mainjob.run_scenario(small(nics=4, pattern="pairs", **kw), tmp_path / "pairs",
                                 log=lambda *_: None)
    assert pairs["ok"]
    assert pairs["queue_delay_us"]["max"] == 0.0


def test_two_nics_in_pairs_are_the_default_run(capsys):
    """``--nics 2 --pattern pairs`` is today's default scenario, field for field."""
    args = mainjob_args(["--nics", "2", "--pattern", "pairs"])
    scn, _ = mainjob.scenario_from_args(args)
    assert scn == SCENARIOS["default"]
    scn, _ = mainjob.scenario_from_args(mainjob_args(["--cc", "1"]))
    assert scn == SCENARIOS["default"]
    scn, _ = mainjob.scenario_from_args(mainjob_args(["--cc", "off"]))
    assert (scn.cc, scn.cc_algorithm) == (0, "nscc")
    scn, _ = mainjob.scenario_from_args(mainjob_args(["--cc", "nscc"]))
    assert scn == SCENARIOS["default"]
    scn, _ = mainjob.scenario_from_args(mainjob_args(["--cc", "ecn"]))
    assert (scn.cc, scn.cc_algorithm) == (1, "ecn")


def mainjob_args(argv):
    from sim.cli import build_parser
    return build_parser().parse_args(["sim", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (["--nics", "3"], "--nics: must be even when pattern (set by scenario 'default') is "
                      "pairs (NIC 2k talks to NIC 2k + 1), not 3"),
    (["--nics", "1"], "--nics: must be an integer from 2 to 16, not 1"),
    (["--nics", "6", "--pattern", "incast", "--backend", "rtl"],
     "--nics: the RTL backend runs at most 5 NICs: add --backend model"),
    (["--nics", "4", "--pattern", "incast", "--backend", "rtl", "--sim", "icarus"],
     "--sim: the RTL backend runs more than two NICs (or another pattern than pairs) under "
     "Verilator without waves only"),
])
def test_bad_nics_pattern_and_cc_name_the_flag(capsys, tmp_path, argv, message):
    status = main(["sim", *argv, "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert status == 2
    assert err == f"mrc-nic sim: {message}\n"
    assert not (tmp_path / "run").exists()


def test_the_rtl_group_runs_nscc_in_a_build_of_its_own():
    """NSCC on more than two RTL NICs is not refused, and its group build (the Verilator
    folder) is not the ECN build's: a build has the NSCC engine and its setting built in, and
    a run that does not use NSCC is built with the default fabric's setting."""
    ecn, nscc, off = (scenario("default", backend="rtl", sim="verilator", nics=5,
                               pattern="incast", cc=cc, cc_algorithm=algorithm)
                      for cc, algorithm in ((1, "ecn"), (1, "nscc"), (0, "nscc")))
    assert mainjob.backend_refusal(nscc) is None
    assert mainjob.rtl_nscc_setting(nscc, nic_config_for(nscc)) is not None
    assert mainjob.group_build_dir(nscc) != mainjob.group_build_dir(ecn)
    # NSCC asked for with the window off runs no window: the ECN run's build serves it.
    assert mainjob.group_build_dir(off) == mainjob.group_build_dir(ecn)
    assert mainjob.rtl_nscc_setting(ecn, nic_config_for(ecn)) \
        == mainjob.rtl_default_nscc_setting(nic_config_for(ecn))
    assert mainjob.group_build_dir(nscc).name.endswith("-group5-dpi")


def test_ecn_runs_share_the_default_nscc_build_and_nscc_runs_need_their_own(tmp_path):
    """The pair's RTL NICs carry the NSCC engine: ``--cc ecn``/``off`` runs of the default
    scenario use its NSCC build; an NSCC run refuses NICs built with another setting (the
    model's NSCC would run another window), before anything is built or written."""
    nscc = scenario("default", backend="rtl")
    assert nscc.cc_algorithm == "nscc"
    for other in (nscc.replace(cc_algorithm="ecn"), nscc.replace(cc=0)):
        assert mainjob._build_dir(other) == mainjob._build_dir(nscc)
    config = nic_config_for(nscc)
    elsewhere = mainjob.rtl_nscc_setting(nscc.replace(latency_us=2.0), config)
    with pytest.raises(ValueError, match="build_nscc: a run on NSCC needs NICs built with "
                                         "its own setting"):
        mainjob.run_scenario(nscc, tmp_path / "run", build_nscc=elsewhere)
    assert not (tmp_path / "run").exists()
