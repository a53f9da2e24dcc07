"""``mrc-nic wirecheck``: the independent MRC 1.0 reader passes a coherent exchange, fails each
rule on a capture made to break it, and passes a two-NIC run with loss, trimming and a plane
failure.

The captures here are made with the Scapy builders (the checker itself reads bytes with
:mod:`struct` only and imports neither them nor the layout table).
"""

import ast
import json
import shutil
import subprocess
import sys

import pytest
from scapy.compat import raw

from hdl import protocol as P
from sim import defaults as D
from sim import packets as pk
from sim import wirecheck
from sim.cli import main
from sim.env import REPO

TSHARK = shutil.which("tshark")
LUA = REPO / "sim" / "wireshark" / "mrc.lua"
A, B = dict(src=D.NIC_A, dst=D.NIC_B), dict(src=D.NIC_B, dst=D.NIC_A)
TSETH = {"tx_timestamp": 0x100, "ftype": int(P.Ftype.TIMESTAMP)}


def data(psn, *, rtx=False, tseth=TSETH, **kw):
    return pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=psn, va=D.MR_BASE,
                          rkey=D.MR_RKEY, payload=bytes(range(32)), rtx=rtx, tseth=tseth,
                          **(A | kw))


def sack(cack_psn, ack_psn_offset=0, **kw):
    return pk.sack_packet(dqpn=D.QPN_A, cack_psn=cack_psn, ack_psn_offset=ack_psn_offset,
                          sack_psn_offset=kw.pop("sack_psn_offset", 1), **(B | kw))


def good_exchange():
    """A's PSNs 0-4 (PSN 2 resent with rtx), B's SACKs, a NACK, an AETH NAK, a reliability
    probe and its answer, an EV probe and its answer."""
    return [
        data(0), data(1), data(3), data(4),
        sack(1, ack_psn_offset=0),
        sack(1, ack_psn_offset=3, sack_bitmap=0b110),        # bitmap from PSN 2: 3 and 4
        pk.nack_packet(dqpn=D.QPN_A, nack_psn=2, nack_reason=P.NackReason.TRIMMED, **B),
        data(2, rtx=True),
        sack(4, ack_psn_offset=-2),                          # PSN 2 triggered it
        pk.nak_packet(P.NakCode.REMOTE_ACCESS, dqpn=D.QPN_A, psn=4, **B),
        pk.probe_packet(dqpn=D.QPN_B, psn=5, probe_id=7, **A),
        sack(4, pr=1, ack_psn_offset=7),
        pk.endpoint_request(request_id=9, op=P.EndpointOp.EV_PROBE, tx_timestamp=5, **A),
        pk.endpoint_response(request_id=9, op=P.EndpointOp.EV_PROBE, tx_timestamp=5, **B),
    ]


def _write(tmp_path, name, frames, report=None):
    folder = tmp_path / name
    folder.mkdir()
    pk.write_pcap(folder / "traffic.pcap", frames)
    if report is not None:
        (folder / "report.json").write_text(json.dumps(report))
    return folder / "traffic.pcap"


def _check(path, **kw):
    report = path.parent / "report.json"
    return wirecheck.check_capture(
        path, report=json.loads(report.read_text()) if report.exists() else None,
        tshark=TSHARK, lua=LUA, **kw)


GOOD_REPORT = {"bytes_lost": 0, "bytes_corrupted": 0, "finished": True}


def test_the_checker_imports_neither_the_layouts_nor_the_scapy_layers():
    tree = ast.parse((REPO / "sim" / "wirecheck.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if "layouts" in name or "packets" in name
                or name.startswith(("hdl", "scapy"))}, imported


def test_a_coherent_exchange_passes_every_rule(tmp_path):
    path = _write(tmp_path, "good", good_exchange(), GOOD_REPORT)
    verdict = _check(path)
    assert verdict["pass"], verdict["failed_rules"]
    assert verdict["roce_frames"] == len(good_exchange())
    for name in ("opcode", "data_headers", "rtx", "control_length", "psn_echo", "ack_psn",
                 "bitmap", "no_byte_lost"):
        assert verdict["rules"][name]["checked"] > 0, name
    if TSHARK:
        assert verdict["rules"]["tshark"]["checked"] == len(good_exchange())


def _cut(frame, keep):
    """``frame`` with its UDP payload cut to ``keep`` bytes before the ICRC, the lengths kept
    consistent (an IPv6 frame)."""
    frame = bytearray(raw(frame))
    del frame[54 + 8 + keep:-4]
    length = len(frame) - 54
    frame[18:20] = length.to_bytes(2, "big")
    frame[58:60] = length.to_bytes(2, "big")
    return bytes(frame)


def _pad(frame, extra):
    frame = bytearray(raw(frame))
    frame[-4:-4] = bytes(extra)
    length = len(frame) - 54
    frame[18:20] = length.to_bytes(2, "big")
    frame[58:60] = length.to_bytes(2, "big")
    return bytes(frame)


def _opcode(frame, opcode):
    frame = bytearray(raw(frame))
    frame[62] = opcode
    return bytes(frame)


# (rule, frames added to the good exchange that break it)
BAD = [
    ("opcode", lambda: [_opcode(data(7), 0x0A)]),
    ("opcode", lambda: [_opcode(sack(1), 0x11)]),
    ("data_headers", lambda: [_cut(data(7), 12 + 4 + 4 + 8)]),         # cut inside the RETH
    ("data_headers", lambda: [_set_bits(data(7, tseth=None), 62 + 8, 0x10)]),  # ts, no TSETH
    ("rtx", lambda: [data(3)]),                                       # PSN 3 again, no rtx
    ("control_length", lambda: [_pad(sack(4), 4)]),
    ("control_length", lambda: [_cut(pk.endpoint_response(request_id=1, op=1, **B), 12 + 30)]),
    ("psn_echo", lambda: [_with_bth_psn(sack(1), 3)]),
    ("psn_echo", lambda: [_with_bth_psn(pk.nack_packet(dqpn=D.QPN_A, nack_psn=2,
                                                       nack_reason=1, **B), 1)]),
    ("ack_psn", lambda: [sack(4, ack_psn_offset=20)]),               # PSN 24 was never sent
    ("bitmap", lambda: [sack(4, sack_psn_offset=0, sack_bitmap=1)]),  # marks cack_psn itself
    ("bitmap", lambda: [sack(4, sack_psn_offset=-3, sack_bitmap=0b10)]),
]


def _set_bits(frame, offset, bits):
    frame = bytearray(raw(frame))
    frame[offset] |= bits
    return bytes(frame)


def _with_bth_psn(frame, psn):
    frame = bytearray(raw(frame))
    frame[71:74] = psn.to_bytes(3, "big")
    return bytes(frame)


@pytest.mark.parametrize(("rule", "make"), BAD, ids=[f"{r}-{n}" for n, (r, _) in
                                                     enumerate(BAD)])
def test_each_rule_fails_on_a_capture_that_breaks_it(tmp_path, rule, make):
    frames = [raw(f) for f in good_exchange()] + [
        f if isinstance(f, bytes) else raw(f) for f in make()]
    path = _write(tmp_path, "bad", frames, GOOD_REPORT)
    verdict = wirecheck.check_capture(path, report=GOOD_REPORT, tshark=None, lua=LUA)
    assert not verdict["pass"]
    assert rule in verdict["failed_rules"], verdict["failed_rules"]
    assert verdict["rules"][rule]["examples"][0].startswith(f"frame {len(frames)}:")


def test_a_retransmission_may_arrive_before_its_original(tmp_path):
    """Captures are in arrival order: an original delayed on a slow path shows after its
    retransmission, and that is no repeat without BTH.rtx."""
    path = _write(tmp_path, "reordered", [*good_exchange(), data(5, rtx=True), data(5)])
    verdict = wirecheck.check_capture(path, report=None, tshark=None, lua=LUA)
    assert verdict["failed_rules"] == []


def test_a_lost_byte_in_the_report_fails(tmp_path):
    path = _write(tmp_path, "lost", good_exchange(),
                  {"bytes_lost": 64, "bytes_corrupted": 0, "finished": True})
    verdict = _check(path)
    assert verdict["failed_rules"] == ["no_byte_lost"]


@pytest.mark.skipif(TSHARK is None, reason="no tshark")
def test_a_frame_the_dissector_finds_malformed_fails(tmp_path):
    frames = [raw(f) for f in good_exchange()] + [_cut(sack(4), 10)]
    path = _write(tmp_path, "malformed", frames, GOOD_REPORT)
    verdict = _check(path)
    assert "tshark" in verdict["failed_rules"]
    assert verdict["rules"]["tshark"]["examples"] == [f"frame {len(frames)}: malformed"]


def test_pcapng_is_read_too(tmp_path):
    from sim.fabric.capture import write_pcapng
    from sim.fabric.fabric import Record

    frames = [raw(f) for f in good_exchange()]
    records = [Record(sent_ns=1000.0 * n, arrival_ns=1000.0 * n + 500, src="ab"[n % 2],
                      dst="ba"[n % 2], plane=0, path=0, outcome="delivered", marks=(),
                      frame=frame, sent_len=len(frame))
               for n, frame in enumerate(frames)]
    write_pcapng(tmp_path / "t.pcapng", records, planes=1)
    assert [f for _, f in wirecheck.read_capture(tmp_path / "t.pcapng")] == frames
    assert [f for _, f in wirecheck.read_capture(_write(tmp_path, "p", frames))] == frames


def test_command_writes_the_verdict_and_exit_status(tmp_path, capsys):
    good = _write(tmp_path, "good", good_exchange(), GOOD_REPORT)
    assert main(["wirecheck", str(good), "--tshark", "never"]) == 0
    verdict = json.loads((good.parent / "wirecheck.json").read_text())
    assert verdict["pass"] and verdict["skipped_rules"] == ["tshark"]
    bad = _write(tmp_path, "bad", [*good_exchange(), data(3)])
    out = tmp_path / "verdict.json"
    assert main(["wirecheck", str(bad), "--tshark", "never", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["failed_rules"] == ["rtx"]
    assert "FAIL" in capsys.readouterr().out


def test_a_two_nic_run_with_loss_trimming_and_a_plane_failure_passes(tmp_path):
    """The model backend (the RTL run is the same command with --backend rtl): every rule
    passes on its capture."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "sim", "--backend", "model", "--planes", "4",
         "--qps", "2", "--bytes", "131072", "--loss", "0.01", "--trim-threshold", "16384",
         "--fail-plane", "2", "--fail-at", "20", "--recover-at", "60", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=1800, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    verdict = _check(out / "traffic.pcap")
    assert verdict["pass"], {r: verdict["rules"][r]["examples"] for r in verdict["failed_rules"]}
    assert verdict["rules"]["rtx"]["checked"] > 0 and verdict["rules"]["ack_psn"]["checked"] > 0
