"""`mrc-nic replay`: per-frame verdicts from the RTL receive path, and clear errors."""

import json
import subprocess
import sys

from scapy.compat import raw
from scapy.layers.inet import IP
from scapy.utils import rdpcap, wrpcap

from hdl import protocol as P
from sim import defaults as D
from sim import packets as pk
from sim.samples import sample_packets
from sim.tb.pair import RECEIVE_CONFIG as TEST_CONFIG


def small_config(tmp_path):
    """The receive path's reduced configuration (2 ports; the NIC's conversion is shared with
    the RTL run of tests/sim/test_cli.py), as a file."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TEST_CONFIG.to_dict()))
    return path


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
    result = mrc_nic("replay", capture, "--json", verdicts, "--out", out,
                     "--config", small_config(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(verdicts.read_text())
    got = [(f["verdict"], f["reason"]) for f in report["frames"]]
    assert got == [("accepted", None), ("dropped", "bad_icrc"), ("accepted", None),
                   ("dropped", "runt"), ("dropped", "unsupported_opcode"),
                   ("accepted", None), ("accepted", None), ("accepted", None)]
    assert report["accepted"] == 5
    assert report["drop_counters"]["bad_icrc"] == 1 and report["drop_counters"]["runt"] == 1
    assert "bad_icrc" in result.stdout and out.exists()
    # Transport verdicts: the responder's for every accepted data packet, none for the rest.
    for number, frame in enumerate(frames):
        entry = report["frames"][number]
        is_data = (entry["verdict"] == "accepted"
                   and pk.Ether(frame)[pk.BTH].opcode in P.DATA_OPCODES)
        assert (entry["transport"] is not None) == is_data, entry
    # The NIC answered: every response decodes, carries a good ICRC and is addressed to A.
    responses = rdpcap(str(out))
    assert len(responses) == len(report["responses"]) >= 1
    for response in responses:
        assert pk.icrc_ok(bytes(response))
        assert response[pk.BTH].dqpn == D.QPN_A


def test_replay_covers_every_packet_type(tmp_path):
    """Every packet type of the sample set (WRITE opcodes over IPv4 and IPv6 with and without
    TSETH, SACKs, NACKs, every AETH NAK, reliability and EV probes and the EV probe answer,
    trimmed, retransmission, CE, STEV, VLAN, SRv6 with and without SRH) through the RTL
    receive path: each verdict equals the reference-model parser's."""
    from sim.model.nic import ModelNic

    samples = sample_packets()
    frames = [raw(s.packet) for s in samples]
    capture = tmp_path / "all.pcap"
    pk.write_pcap(capture, frames)
    verdicts = tmp_path / "v.json"
    result = mrc_nic("replay", capture, "--json", verdicts, "--config", small_config(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(verdicts.read_text())
    model = ModelNic(TEST_CONFIG)
    want = []
    for frame in frames:
        before = dict(model.counters["rx_counters"])
        model._parse(0, frame)
        (reason,) = [k for k, v in model.counters["rx_counters"].items() if v != before[k]]
        want.append(("accepted", None) if reason == "none" else ("dropped", reason))
    got = [(f["verdict"], f["reason"]) for f in report["frames"]]
    assert len(got) == len(samples) >= 30
    assert got == want, [(s.name, g, w)
                         for s, g, w in zip(samples, got, want, strict=True) if g != w]
    assert sum(v == "accepted" for v, _ in got) >= 25


def test_replay_answers_adversarial_packets_with_the_right_nak(tmp_path):
    """Wrong rkey, a write past the region's end, an unknown QP: AETH NAKs; a PSN beyond the
    window: a NETH NACK PSN_OOR_WINDOW; nothing written, each counted."""
    def write(**kw):
        fields = dict(dqpn=D.QPN_B, psn=D.INITIAL_PSN, va=D.MR_BASE, rkey=D.MR_RKEY,
                      payload=b"z" * 16)
        fields.update(kw)
        return raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, ackreq=1, **fields))
    frames = [
        write(rkey=D.MR_RKEY ^ 0x100),                          # wrong rkey
        write(va=D.MR_BASE + D.MR_LENGTH - 8),                  # runs past the region
        write(dqpn=TEST_CONFIG.qps + 5),                        # no such QP
        write(psn=D.INITIAL_PSN + 4096),                        # far beyond the window
        write(),                                                # a good one, last
    ]
    capture = tmp_path / "bad.pcap"
    pk.write_pcap(capture, frames)
    verdicts, out = tmp_path / "v.json", tmp_path / "out.pcap"
    result = mrc_nic("replay", capture, "--json", verdicts, "--out", out,
                     "--config", small_config(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(verdicts.read_text())
    assert [f["transport"] for f in report["frames"]] == \
        ["bad_rkey", "out_of_bounds", "bad_qp", "out_of_window", "placed"]
    counters = report["responder_counters"]
    assert (counters["bad_rkey"], counters["out_of_bounds"], counters["bad_qp"],
            counters["out_of_window"], counters["placed"]) == (1, 1, 1, 1, 1)
    assert report["placed_bytes"] == 16                         # only the good write
    naks, nacks = {}, {}
    for response in rdpcap(str(out)):
        if pk.AETH in response:         # fatal errors: AETH NAKs
            code = P.syndrome_nak_code(response[pk.AETH].syndrome)
            naks.setdefault(response[pk.BTH].psn, set()).add(code)
        elif pk.NETH in response:       # recoverable refusals: NETH NACKs
            nacks.setdefault(response[pk.NETH].nack_psn, set()).add(
                response[pk.NETH].nack_reason)
    assert P.NakCode.REMOTE_ACCESS in naks[D.INITIAL_PSN]
    assert P.NakCode.REMOTE_OPERATIONAL in naks[D.INITIAL_PSN]
    assert P.NackReason.PSN_OOR_WINDOW in nacks[D.INITIAL_PSN + 4096]


def test_replay_rejects_what_is_not_a_capture(tmp_path):
    text = tmp_path / "notes.pcap"
    text.write_text("this is not a capture\n")
    result = mrc_nic("replay", text)
    assert result.returncode == 2
    assert result.stderr.startswith(f"mrc-nic replay: {text}: not a pcap")
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
    assert bad_port.returncode == 2
    assert bad_port.stderr == ("mrc-nic replay: --port: must be an integer from 0 to 7 (the "
                               "config's ports), not 99\n")
