"""`mrc-nic replay`: per-frame verdicts from the RTL receive path, and clear errors."""

import json
import subprocess
import sys

from scapy.compat import raw
from scapy.layers.inet import IP
from scapy.utils import wrpcap

from hdl import protocol as P
from sim import packets as pk
from sim.samples import sample_packets


def mrc_nic(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=900)


def test_replay_verdicts(tmp_path):
    good = [raw(s.packet) for s in sample_packets()[:6]]
    corrupt = bytearray(good[0])
    corrupt[-10] ^= 0x40                               # a payload bit: only the ICRC sees it
    send = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=0x22, psn=1, va=0, rkey=1,
                          payload=b"x" * 8)
    send[pk.BTH].opcode = 0x04                         # SEND ONLY: not an MRC operation
    frames = [good[0], bytes(corrupt), good[1], good[2][:40], raw(send), *good[3:]]
    capture = tmp_path / "in.pcap"
    pk.write_pcap(capture, frames)
    verdicts, out = tmp_path / "v.json", tmp_path / "out.pcap"
    result = mrc_nic("replay", capture, "--json", verdicts, "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(verdicts.read_text())
    got = [(f["verdict"], f["reason"]) for f in report["frames"]]
    assert got == [("accepted", None), ("dropped", "bad_icrc"), ("accepted", None),
                   ("dropped", "runt"), ("dropped", "unsupported_opcode"),
                   ("accepted", None), ("accepted", None), ("accepted", None)]
    assert report["accepted"] == 5
    assert report["drop_counters"]["bad_icrc"] == 1 and report["drop_counters"]["runt"] == 1
    assert [p["psn"] for p in report["packets"]] == \
        [pk.Ether(f)[pk.BTH].psn for f in (good[0], good[1], *good[3:])]
    assert all(p["payload_ok"] for p in report["packets"])
    assert "bad_icrc" in result.stdout and out.exists()


def test_replay_rejects_what_is_not_a_capture(tmp_path):
    text = tmp_path / "notes.pcap"
    text.write_text("this is not a capture\n")
    result = mrc_nic("replay", text)
    assert result.returncode == 2
    assert result.stderr.startswith("mrc-nic: error:") and "not a pcap" in result.stderr
    assert result.stderr.count("\n") == 1


def test_replay_rejects_non_ethernet_capture(tmp_path):
    capture = tmp_path / "ip.pcap"
    wrpcap(str(capture), [IP(dst="10.0.0.1")])         # raw-IP link type
    result = mrc_nic("replay", capture)
    assert result.returncode == 2 and "not Ethernet" in result.stderr


def test_replay_missing_file_and_bad_port(tmp_path):
    missing = mrc_nic("replay", tmp_path / "nope.pcap")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    capture = tmp_path / "one.pcap"
    pk.write_pcap(capture, [raw(sample_packets()[0].packet)])
    bad_port = mrc_nic("replay", capture, "--port", 99)
    assert bad_port.returncode == 2 and "--port must be from 0 to 7, not 99" in bad_port.stderr
