"""The Wireshark dissector: generated from the layout table, and tshark decodes every sample.

tshark runs twice for the whole module (once with the default trim DSCP, once with the
preference changed). Expected values come from the Scapy packets, never from literals.
"""

import argparse
import os
import re
import shutil
import subprocess

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import PcapWriter

from hdl import protocol as P
from hdl.packet import layouts as L
from sim import dissector
from sim import packets as pk
from sim.samples import sample_packets, write_sample_pcap

TSHARK = shutil.which("tshark")

SAMPLES = sample_packets()
SAMPLE_IDS = [s.name for s in SAMPLES]
#: Frame numbers of the extra frames after the samples: a data packet cut in the middle of its
#: RETH, a SACK cut in the middle of its SETH.
TRUNCATED_FRAME = len(SAMPLES) + 1
TRUNCATED_SACK = len(SAMPLES) + 2

HEADER_FIELDS = [(header, field.name)
                 for header in dissector.DECODED_HEADERS for field in header.fields]
FLAG_FIELDS = [(header, field, flag)
               for header in dissector.DECODED_HEADERS for field in header.fields
               if (flags := dissector.flag_enum(header, field)) is not None
               for flag in flags if flag.value & (flag.value - 1) == 0]
TSHARK_OWN_FIELDS = ["ip.src", "ipv6.src", "udp.dstport", "infiniband.bth.opcode",
                     "infiniband.bth.destqp", "infiniband.bth.psn"]
FIELDS = ["frame.number", "_ws.malformed", *TSHARK_OWN_FIELDS,
          *(dissector.field_abbrev(h, f) for h, f in HEADER_FIELDS),
          *(dissector.flag_abbrev(h, f, flag) for h, f, flag in FLAG_FIELDS),
          *dissector.SUMMARY_FIELDS, "_ws.expert.message", "_ws.col.Info"]
LAYERS = {header: pk.LAYERS[header] for header in dissector.DECODED_HEADERS}


def _truncated_frame():
    """A data packet cut in the middle of its RETH (8 of its 16 bytes present)."""
    frame = bytes(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=0x22, psn=1, va=0x1000,
                                 rkey=0xBEEF, payload=bytes(64)))
    parsed = Ether(frame)
    reth_offset = len(frame) - len(bytes(parsed[pk.RETH])) - P.ICRC_BYTES
    return frame[:reth_offset + L.RETH.size // 2]


def _truncated_sack():
    """The SACK sample cut in the middle of its SETH."""
    frame = bytes([s for s in SAMPLES if s.name == "sack_ipv6"][0].packet)
    seth_offset = len(frame) - L.SETH.size - L.CC_STATE.size - P.ICRC_BYTES
    return frame[:seth_offset + L.SETH.size // 2]


def _run_tshark(pcap, home, fields, *options):
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    # RoCEv2's zero UDP checksum is legal here: without the preference every IPv6 frame carries
    # an "Illegal checksum value (0)" expert item beside the ones the tests look for.
    command = [TSHARK, "-n", "-r", str(pcap), "-X", f"lua_script:{dissector.DEFAULT_LUA_PATH}",
               "-o", "udp.ignore_ipv6_zero_checksum:TRUE", *options, "-T", "fields",
               "-E", "separator=/t", "-E", "occurrence=a",
               *(arg for field in fields for arg in ("-e", field))]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    rows = {}
    for line in result.stdout.splitlines():
        values = dict(zip(fields, line.split("\t"), strict=True))
        rows[int(values["frame.number"])] = values
    return result, rows


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """The sample pcap plus the truncated frame, as files."""
    folder = tmp_path_factory.mktemp("dissector")
    pcap = folder / "samples.pcap"
    write_sample_pcap(pcap)
    with PcapWriter(str(pcap), append=True) as writer:
        writer.write(Ether(_truncated_frame()))
        writer.write(Ether(_truncated_sack()))
    return folder, pcap


@pytest.fixture(scope="module")
def decoded(capture):
    folder, pcap = capture
    return _run_tshark(pcap, folder, FIELDS)


def _last(text):
    """The last occurrence of a repeated field (SRv6: the inner header)."""
    return text.split(",")[-1]


def _int(text):
    return int(_last(text), 0)


def _bool(text):
    return {"1": True, "0": False, "True": True, "False": False}[text]


def _parsed(sample):
    return Ether(bytes(sample.packet))


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def test_committed_lua_is_generated_from_the_layouts():
    assert dissector.DEFAULT_LUA_PATH.read_text() == dissector.generate_lua(), (
        "sim/wireshark/mrc.lua is stale: run `python -m sim.dissector`")


def test_every_layout_field_has_a_protofield():
    abbrevs = re.findall(r'ProtoField\.\w+\("([^"]+)"', dissector.generate_lua())
    assert len(abbrevs) == len(set(abbrevs)), "duplicate ProtoField names"
    expected = {dissector.field_abbrev(h, f) for h, f in HEADER_FIELDS}
    expected |= {dissector.header_abbrev(h) for h in dissector.DECODED_HEADERS}
    expected |= {dissector.flag_abbrev(h, f, flag) for h, f, flag in FLAG_FIELDS}
    expected |= set(dissector.SUMMARY_FIELDS)
    assert set(abbrevs) == expected


def test_dissector_command_writes_the_lua_file(tmp_path):
    parser = argparse.ArgumentParser()
    dissector.register(parser.add_subparsers())
    out = tmp_path / "out" / "mrc.lua"
    args = parser.parse_args(["dissector", "--out", str(out)])
    assert args.func(args) == 0
    assert out.read_text() == dissector.generate_lua()


def test_dissector_command_reports_an_unwritable_path(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    dissector.register(parser.add_subparsers())
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = parser.parse_args(["dissector", "--out", str(blocker / "mrc.lua")])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("mrc-nic") and ": cannot write " in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# tshark
# ---------------------------------------------------------------------------------------------

def test_tshark_loads_the_script_without_errors(decoded):
    result, rows = decoded
    assert result.returncode == 0, result.stderr
    errors = dissector.tshark_errors(result.stderr)
    assert errors == []
    assert sorted(rows) == list(range(1, TRUNCATED_SACK + 1))
    assert all(row["mrc.kind"] for row in rows.values()), "the postdissector did not run"
    # A Lua error while dissecting is no stderr line but an expert item on the frame.
    lua_errors = {number: row["_ws.expert.message"] for number, row in rows.items()
                  if "Lua Error" in row["_ws.expert.message"]}
    assert lua_errors == {}


def test_no_sample_is_malformed(decoded):
    """Neither Wireshark's dissectors nor ours find a sample malformed."""
    for number, row in decoded[1].items():
        if number in (TRUNCATED_FRAME, TRUNCATED_SACK):
            continue
        assert row["_ws.malformed"] == "", SAMPLE_IDS[number - 1]
        assert row["mrc.malformed"] == "", SAMPLE_IDS[number - 1]


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_tshark_still_decodes_ip_udp_and_bth(decoded, sample):
    row = decoded[1][SAMPLES.index(sample) + 1]
    pkt = _parsed(sample)
    ip = pkt[UDP].underlayer
    assert _last(row["ipv6.src" if isinstance(ip, IPv6) else "ip.src"]) == ip.src
    assert _int(row["udp.dstport"]) == P.ROCEV2_UDP_PORT
    assert _int(row["infiniband.bth.opcode"]) == pkt[pk.BTH].opcode
    assert _int(row["infiniband.bth.destqp"]) == pkt[pk.BTH].dqpn
    assert _int(row["infiniband.bth.psn"]) == pkt[pk.BTH].psn


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_header_fields_match_scapy(decoded, sample):
    """Every field of every header, with the specification's names (mrc.seth.cack_psn, ...)."""
    row = decoded[1][SAMPLES.index(sample) + 1]
    pkt = _parsed(sample)
    for header, name in HEADER_FIELDS:
        layer = LAYERS[header]
        text = row[dissector.field_abbrev(header, name)]
        if layer not in pkt:
            assert text == "", f"{header.name}.{name} decoded in a packet without it"
            continue
        value = getattr(pkt[layer], name)
        bits = header.field(name).bits
        if bits > 32 and bits != 64:
            assert text == value.to_bytes(bits // 8, "big").hex(), f"{header.name}.{name}"
        else:
            assert _int(text) == value, f"{header.name}.{name}"
    for header, field, flag in FLAG_FIELDS:
        layer = LAYERS[header]
        text = row[dissector.flag_abbrev(header, field, flag)]
        expected = bool(getattr(pkt[layer], field.name) & flag) if layer in pkt else None
        assert (_bool(text) if text else None) == expected, f"{header.name} flag {flag.name}"


def _expected_summary(pkt):
    bth = pkt[pk.BTH]
    summary = {"mrc.opcode": str(bth.opcode), "mrc.icrc": str(bth.icrc), "mrc.nak_code": "",
               "mrc.trimmed": "", "mrc.payload_len": "", "mrc.retransmission": "",
               "mrc.ack_psn": "", "mrc.sack_psn": "", "mrc.malformed": ""}
    if bth.opcode in P.DATA_OPCODES:
        summary["mrc.kind"] = "data"
        summary["mrc.trimmed"] = str(pk.is_trimmed(pkt))
        summary["mrc.payload_len"] = str(len(pk.transport_payload(pkt)))
        summary["mrc.retransmission"] = str(bool(bth.rtx))
        return summary
    summary["mrc.kind"] = dissector.CONTROL_KINDS[bth.opcode]
    if bth.opcode == P.Opcode.ACKNOWLEDGE:
        code = P.syndrome_nak_code(pkt[pk.AETH].syndrome)
        if code is not None:
            summary["mrc.kind"], summary["mrc.nak_code"] = "nak", code.name
    if pk.SETH in pkt:
        seth = pkt[pk.SETH]
        if not seth.pr:
            summary["mrc.ack_psn"] = str(P.psn_add(seth.cack_psn, seth.ack_psn_offset))
        base = P.psn_add(seth.cack_psn, seth.sack_psn_offset)
        summary["mrc.sack_psn"] = ",".join(
            str(P.psn_add(base, bit)) for bit in range(64) if seth.sack_bitmap >> bit & 1)
    return summary


def _actual_summary(row):
    def normal(abbrev, text):
        if not text or abbrev in ("mrc.kind", "mrc.nak_code"):
            return text
        if abbrev in ("mrc.trimmed", "mrc.retransmission", "mrc.malformed"):
            return str(_bool(text))
        return ",".join(str(int(part, 0)) for part in text.split(","))
    return {abbrev: normal(abbrev, row[abbrev]) for abbrev in dissector.SUMMARY_FIELDS}


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_summary_fields_match_scapy(decoded, sample):
    row = decoded[1][SAMPLES.index(sample) + 1]
    assert _actual_summary(row) == _expected_summary(_parsed(sample))
    assert row["_ws.col.Info"].startswith("MRC ")


def test_trimmed_sample_is_named_in_the_info_column(decoded):
    rows = decoded[1]
    for number, sample in enumerate(SAMPLES, 1):
        pkt = _parsed(sample)
        trimmed = pk.METH in pkt and pk.is_trimmed(pkt)
        assert ("[TRIMMED]" in rows[number]["_ws.col.Info"]) == trimmed, sample.name


def test_frame_cut_inside_reth_is_flagged_malformed(decoded):
    row = decoded[1][TRUNCATED_FRAME]
    assert row["mrc.kind"] == "data"
    assert _bool(row["mrc.malformed"])
    assert "RETH needs" in row["_ws.expert.message"]
    assert "[MALFORMED]" in row["_ws.col.Info"]
    assert row[dissector.field_abbrev(L.METH, "msn")] != ""
    for header, name in HEADER_FIELDS:
        if header is not L.METH:
            assert row[dissector.field_abbrev(header, name)] == "", f"{header.name}.{name}"


def test_sack_cut_inside_seth_is_flagged_malformed(decoded):
    row = decoded[1][TRUNCATED_SACK]
    assert row["mrc.kind"] == "sack"
    assert _bool(row["mrc.malformed"])
    assert "SETH needs" in row["_ws.expert.message"]
    assert row[dissector.field_abbrev(L.SETH, "cack_psn")] == ""


def test_trim_dscp_preference_selects_the_trim_code_point(capture):
    """With the preference at the samples' ordinary DSCP, every other data packet reads as
    trimmed and the switch-trimmed one does not."""
    folder, pcap = capture
    ordinary = _parsed(SAMPLES[0])[UDP].underlayer.tc >> 2
    assert ordinary != P.DEFAULT_TRIM_DSCP
    fields = ["frame.number", "mrc.trimmed"]
    result, rows = _run_tshark(pcap, folder, fields, "-o", f"mrc.trim_dscp:{ordinary}")
    assert dissector.tshark_errors(result.stderr) == []
    for number, sample in enumerate(SAMPLES, 1):
        pkt = _parsed(sample)
        if pk.METH not in pkt:
            assert rows[number]["mrc.trimmed"] == "", sample.name
            continue
        expected = pk.is_trimmed(pkt, dscp=ordinary)
        assert _bool(rows[number]["mrc.trimmed"]) == expected, sample.name


