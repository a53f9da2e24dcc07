"""What ``mrc-nic sim`` writes tells the truth: ``report.json`` matches its schema and every key
is documented, the capture holds every frame with the dropped ones marked, the classic pcap
only the delivered ones, and the plots are there. One model-backend run of the default
scenario (a plane fails and recovers) serves every test."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.env import REPO
from sim.fabric.capture import read_pcapng
from sim.mainjob import run_scenario
from sim.scenario import scenario
from sim.schema import report_schema, validate_report

DOCS = (REPO / "docs" / "sim.md").read_text()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("default-model")
    report = run_scenario(scenario("default").replace(name="default", backend="model"), out,
                          log=lambda *_: None)
    return report, out


def test_the_report_matches_its_schema(run):
    report, out = run
    validate_report(report)
    validate_report((out / "report.json").read_text())
    assert report["failure"]["goodput"]["before"]["goodput_gbps"] is not None


def test_the_schema_refuses_an_undocumented_key_and_the_old_counter_name(run):
    from jsonschema import ValidationError
    report, _ = run
    with pytest.raises(ValidationError):
        validate_report({**report, "surprise": 1})
    counters = {side: {**blocks, "rx_counters": {"none": 1}}
                for side, blocks in report["counters"].items()}
    with pytest.raises(ValidationError):
        validate_report({**report, "counters": counters})


def _schema_keys(node):
    """Every property name the schema spells out, at any depth."""
    if isinstance(node, dict):
        for name, value in node.get("properties", {}).items():
            yield name
            yield from _schema_keys(value)
        for key, value in node.items():
            if key != "properties":
                yield from _schema_keys(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_keys(value)


def _report_keys(node, path=()):
    """Every key of a report, but not inside the scenario (the flags), nor the names of the
    NICs, of their counters (docs/registers.md) or of their QP errors."""
    if isinstance(node, dict):
        for key, value in node.items():
            if path and path[-1] in ("counters", "qp_errors", "rx_backlog"):
                yield from _report_keys(value, (*path, "*"))
                continue
            if path[:1] == ("counters",) and len(path) >= 2:
                continue
            yield key
            if key != "scenario":
                yield from _report_keys(value, (*path, key))
    elif isinstance(node, list):
        for value in node:
            yield from _report_keys(value, path)


def _documented(key):
    return re.search(rf"`{re.escape(key)}`", DOCS) is not None


def test_every_key_of_the_schema_is_documented():
    missing = sorted({key for key in _schema_keys(report_schema()) if not _documented(key)})
    assert not missing, f"not in docs/sim.md: {missing}"


def test_every_key_of_a_report_is_documented(run):
    report, _ = run
    missing = sorted({key for key in _report_keys(report) if not _documented(key)})
    assert not missing, f"not in docs/sim.md: {missing}"
    assert _documented("accepted")


def test_the_capture_holds_every_frame_and_marks_the_dropped_ones(run):
    report, out = run
    records = read_pcapng(out / "traffic.pcapng")
    planes = report["fabric"]["planes"]
    dropped = [r for r in records if r.outcome.startswith("dropped-")]
    assert len(dropped) == sum(v for plane in planes for k, v in plane.items()
                               if k.startswith("dropped-")) > 0
    assert {r.outcome for r in dropped} == {"dropped-failure"}
    assert all(r.arrival_ns is None and r.plane == report["failure"]["plane"] for r in dropped)
    assert len(records) == sum(plane["sent"] + plane.get("duplicate", 0) for plane in planes)
    # The classic pcap has no comment to mark a drop: it holds the delivered frames only.
    from scapy.utils import rdpcap
    classic = rdpcap(str(out / "traffic.pcap"))
    assert len(classic) == sum(plane.get("delivered", 0) for plane in planes) \
        == len(records) - len(dropped)


def test_every_time_in_the_output_files_is_in_us(run):
    _, out = run
    saved = json.loads((out / "fabric.json").read_text())
    text = json.dumps(saved) + (out / "report.json").read_text()
    assert not re.search(r'_ns"', text)
    assert saved["stats"]["bin_us"] > 0
    assert saved["config"]["failures"][0]["at_us"] == 40.0
    comment = read_pcapng(out / "traffic.pcapng")[0]
    assert comment.sent_ns >= 0


def test_the_plots_are_written(run):
    _, out = run
    for name in ("goodput.png", "queues.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")
def test_wireshark_reports_no_error_with_the_zero_checksum_preference(run, tmp_path):
    _, out = run
    capture = out / "traffic.pcapng"
    option = ["-o", "udp.ignore_ipv6_zero_checksum:TRUE"]
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / ".config"),
           "PATH": "/usr/bin:/bin"}

    def errors(*extra):
        result = subprocess.run(["tshark", "-n", *extra, "-r", str(capture), "-z",
                                 "expert,error", "-q"], capture_output=True, text=True,
                                env=env, timeout=120, check=True)
        return "Illegal checksum" in result.stdout
    assert errors() and not errors(*option)
    # The shipped profile sets the same preference.
    profiles = tmp_path / ".config" / "wireshark" / "profiles"
    shutil.copytree(Path(REPO / "sim" / "wireshark" / "profile"), profiles / "mrc-nic")
    assert not errors("-C", "mrc-nic")
