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
from scapy.packet import Raw
from scapy.utils import PcapWriter

from hdl import protocol as P
from hdl.packet import layouts as L
from sim import dissector, mrc10
from sim import packets as pk
from sim.samples import sample_packets, write_sample_pcap

TSHARK = shutil.which("tshark")

SAMPLES = sample_packets()
SAMPLE_IDS = [s.name for s in SAMPLES]
#: Frame number of the extra frame cut in the middle of its RETH, after the samples.
TRUNCATED_FRAME = len(SAMPLES) + 1

HEADER_FIELDS = [(header, field.name)
                 for header in dissector.DECODED_HEADERS for field in header.fields]
FLAG_FIELDS = [(header, field, flag)
               for header in dissector.DECODED_HEADERS for field in header.fields
               if (flags := dissector.flag_enum(header, field)) is not None
               for flag in flags if flag.value & (flag.value - 1) == 0]
SACK_ABBREV = dissector.field_abbrev(L.MACKETH, dissector.SACK_FIELD)
TSHARK_OWN_FIELDS = ["ip.src", "ipv6.src", "udp.dstport", "infiniband.bth.opcode",
                     "infiniband.bth.destqp", "infiniband.bth.psn"]
FIELDS = ["frame.number", *TSHARK_OWN_FIELDS,
          *(dissector.field_abbrev(h, f) for h, f in HEADER_FIELDS),
          *(dissector.flag_abbrev(h, f, flag) for h, f, flag in FLAG_FIELDS),
          SACK_ABBREV, *dissector.SUMMARY_FIELDS, "_ws.expert.message", "_ws.col.Info"]


def _truncated_frame():
    """A data packet cut in the middle of its RETH (8 of its 16 bytes present)."""
    frame = bytes(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=0x22, psn=1, va=0x1000,
                                 rkey=0xBEEF, payload=bytes(64)))
    parsed = Ether(frame)
    reth_offset = len(frame) - len(bytes(parsed[pk.RETH])) - P.ICRC_BYTES
    return frame[:reth_offset + L.RETH.size // 2]


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
    expected |= {SACK_ABBREV, *dissector.SUMMARY_FIELDS}
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
    assert sorted(rows) == list(range(1, TRUNCATED_FRAME + 1))
    assert all(row["mrc.kind"] for row in rows.values()), "the postdissector did not run"
    # A Lua error while dissecting is no stderr line but an expert item on the frame.
    lua_errors = {number: row["_ws.expert.message"] for number, row in rows.items()
                  if "Lua Error" in row["_ws.expert.message"]}
    assert lua_errors == {}


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
    row = decoded[1][SAMPLES.index(sample) + 1]
    pkt = _parsed(sample)
    for header, name in HEADER_FIELDS:
        layer = getattr(pk, header.name)
        text = row[dissector.field_abbrev(header, name)]
        if layer in pkt:
            assert _int(text) == getattr(pkt[layer], name), f"{header.name}.{name}"
        else:
            assert text == "", f"{header.name}.{name} decoded in a packet without it"
    for header, field, flag in FLAG_FIELDS:
        layer = getattr(pk, header.name)
        text = row[dissector.flag_abbrev(header, field, flag)]
        expected = bool(getattr(pkt[layer], field.name) & flag) if layer in pkt else None
        assert (_bool(text) if text else None) == expected, f"{header.name} flag {flag.name}"
    expected_sack = pkt[pk.MACKETH].sack.hex() if pk.MACKETH in pkt else ""
    assert row[SACK_ABBREV] == expected_sack


def _expected_summary(pkt):
    bth = pkt[pk.BTH]
    summary = {"mrc.opcode": str(bth.opcode), "mrc.icrc": str(bth.icrc), "mrc.nak_code": "",
               "mrc.trimmed": "", "mrc.payload_len": "", "mrc.retransmission": "",
               "mrc.sack_psn": "", "mrc.malformed": ""}
    if bth.opcode in P.DATA_OPCODES:
        summary["mrc.kind"] = "data"
        summary["mrc.trimmed"] = str(pk.is_trimmed(pkt))
        summary["mrc.payload_len"] = str(len(bytes(pkt[pk.MDETH].payload)))
        summary["mrc.retransmission"] = str(bool(pkt[pk.MDETH].flags
                                                 & P.DataFlags.RETRANSMISSION))
    elif bth.opcode == P.Opcode.ACKNOWLEDGE:
        code = P.syndrome_nak_code(pkt[pk.AETH].syndrome)
        summary["mrc.kind"] = "ack" if code is None else "nack"
        summary["mrc.nak_code"] = "" if code is None else code.name
        macketh = pkt[pk.MACKETH]
        summary["mrc.sack_psn"] = ",".join(
            str(P.psn_add(macketh.cum_psn, 1 + bit)) for bit in range(8 * macketh.sack_bytes)
            if macketh.sack_int() >> bit & 1)
    else:
        summary["mrc.kind"] = P.Opcode(bth.opcode).name.lower()
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
        trimmed = pk.MDETH in pkt and pk.is_trimmed(pkt)
        assert ("[TRIMMED]" in rows[number]["_ws.col.Info"]) == trimmed, sample.name


def test_frame_cut_inside_reth_is_flagged_malformed(decoded):
    row = decoded[1][TRUNCATED_FRAME]
    assert row["mrc.kind"] == "data"
    assert _bool(row["mrc.malformed"])
    assert "RETH needs" in row["_ws.expert.message"]
    assert "[MALFORMED]" in row["_ws.col.Info"]
    for header, name in HEADER_FIELDS:
        assert row[dissector.field_abbrev(header, name)] == "", f"{header.name}.{name}"


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
        if pk.MDETH not in pkt:
            assert rows[number]["mrc.trimmed"] == "", sample.name
            continue
        expected = pk.is_trimmed(pkt, dscp=ordinary)
        assert _bool(rows[number]["mrc.trimmed"]) == expected, sample.name


# ---------------------------------------------------------------------------------------------
# MRC 1.0 (one packet of each type; the NIC does not send them yet)
# ---------------------------------------------------------------------------------------------

MRC10_SAMPLES = mrc10.sample_packets()
MRC10_HEADERS = {h.name: h for h in (L.RETH, L.IMMDT, L.AETH, *L.MRC10_HEADERS)}
MRC10_FIELDS = ["frame.number", "_ws.malformed", "_ws.expert.message", "mrc.kind",
                "mrc.opcode", "mrc.malformed", "mrc.retransmission", "mrc.payload_len",
                *(dissector.field_abbrev(h, f.name)
                  for h in MRC10_HEADERS.values() for f in h.fields)]


def _mrc10_kind(pkt):
    opcode = P.Mrc10Opcode(pkt[pk.BTH].opcode)
    if opcode in P.MRC10_DATA_OPCODES:
        return "mrc10_data"
    return dissector.MRC10_CONTROL[opcode][1]


def _mrc10_truncated_sack():
    """The SACK sample cut in the middle of its SETH."""
    frame = bytes(dict(MRC10_SAMPLES)["mrc10_sack"])
    seth_offset = len(frame) - L.SETH.size - L.CC_STATE.size - P.ICRC_BYTES
    return frame[:seth_offset + L.SETH.size // 2]


#: Frame number of the cut SACK, after the MRC 1.0 samples.
MRC10_TRUNCATED_FRAME = len(MRC10_SAMPLES) + 1


@pytest.fixture(scope="module")
def mrc10_decoded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mrc10")
    pcap = folder / "mrc10.pcap"
    pk.write_pcap(pcap, [*(packet for _, packet in MRC10_SAMPLES), _mrc10_truncated_sack()])
    return _run_tshark(pcap, folder, MRC10_FIELDS)


def test_mrc10_capture_decodes_without_errors(mrc10_decoded):
    result, rows = mrc10_decoded
    assert result.returncode == 0, result.stderr
    assert dissector.tshark_errors(result.stderr) == []
    assert sorted(rows) == list(range(1, MRC10_TRUNCATED_FRAME + 1))
    for number, row in rows.items():
        assert "Lua Error" not in row["_ws.expert.message"], number
        if number == MRC10_TRUNCATED_FRAME:
            continue
        assert row["_ws.malformed"] == "", number
        assert row["mrc.malformed"] == "", number


def test_mrc10_sack_cut_inside_seth_is_flagged_malformed(mrc10_decoded):
    row = mrc10_decoded[1][MRC10_TRUNCATED_FRAME]
    assert row["mrc.kind"] == "mrc10_sack"
    assert _bool(row["mrc.malformed"])
    assert "SETH needs" in row["_ws.expert.message"]
    assert row[dissector.field_abbrev(L.SETH, "cack_psn")] == ""


@pytest.mark.parametrize(("name", "packet"), MRC10_SAMPLES, ids=[n for n, _ in MRC10_SAMPLES])
def test_mrc10_fields_match_scapy(mrc10_decoded, name, packet):
    row = mrc10_decoded[1][[n for n, _ in MRC10_SAMPLES].index(name) + 1]
    pkt = Ether(bytes(packet))
    assert row["mrc.kind"] == _mrc10_kind(pkt)
    assert _int(row["mrc.opcode"]) == pkt[pk.BTH].opcode
    if pk.METH in pkt:
        assert _bool(row["mrc.retransmission"]) == pk.bth_rtx(pkt[pk.BTH])
        assert _int(row["mrc.payload_len"]) == len(pkt[Raw].load)
    for header in MRC10_HEADERS.values():
        layer = getattr(pk, header.name)
        for field in header.fields:
            text = row[dissector.field_abbrev(header, field.name)]
            if layer not in pkt:
                assert text == "", f"{header.name}.{field.name} decoded in {name}"
                continue
            value = getattr(pkt[layer], field.name)
            if field.bits > 64:
                assert text == value.to_bytes(field.bits // 8, "big").hex(), field.name
            elif field.bits == 48:
                assert text == value.to_bytes(6, "big").hex(), field.name
            else:
                assert int(text, 0) == value, f"{header.name}.{field.name}"
