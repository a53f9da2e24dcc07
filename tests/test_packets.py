"""The Scapy layers and builders against the layout table, RoCEv2's ICRC and the samples."""

import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from hdl import protocol as P
from hdl.packet import layouts as L
from sim import defaults as D
from sim import packets as pk
from sim.samples import sample_packets, sample_table

SCAPY_CLASSES = {"BTH": BTH, "AETH": AETH, "RETH": pk.RETH, "ImmDt": pk.ImmDt,
                 "MDETH": pk.MDETH, "MACKETH": pk.MACKETH, "MPRH": pk.MPRH,
                 **{h.name: getattr(pk, h.name) for h in L.MRC10_HEADERS}}


def _scapy_header_bytes(header, **values):
    layer = SCAPY_CLASSES[header.name](**values)
    data = raw(layer)
    if header is L.BTH:
        data = data[:-4]                    # BTH's trailing ICRC field is not part of the header
    if header is L.MACKETH:
        data = data[:header.size]           # the SACK bitmap follows the fixed part
    return data


@pytest.mark.parametrize("header", L.ALL_HEADERS, ids=lambda h: h.name)
def test_layout_table_agrees_with_scapy(header):
    """Every field lands at the same bits in the table and in Scapy: set it alone to all ones."""
    base = {"icrc": 0, "pkey": 0} if header is L.BTH else {}
    if header is L.MACKETH:
        base["sack_bytes"] = 8
    assert len(_scapy_header_bytes(header, **base)) == header.size
    for field in header.fields:
        ones = -1 if field.signed else (1 << field.bits) - 1
        values = dict(base, **{field.name: ones})
        expect = header.pack(**{k: v for k, v in values.items() if k != "icrc"})
        background = header.pack(**{k: v for k, v in base.items() if k != "icrc"})
        assert expect == bytes(a | b for a, b in zip(header.byte_mask([field.name]), background,
                                                     strict=True)), field.name
        assert _scapy_header_bytes(header, **values) == expect, field.name
        assert header.unpack(expect)[field.name] == ones
        trailer = bytes(P.ICRC_BYTES) if header is L.BTH else b""
        assert getattr(SCAPY_CLASSES[header.name](expect + trailer), field.name) == ones


def test_mrc10_bth_is_the_rocev2_bth_with_flag_names():
    """BTH_MRC10 names the bits of the same 12 bytes: every RoCEv2 field keeps its place, and
    rtx and ts are bits of Scapy's resv7 (sim.packets.BTH_RTX, BTH_TS)."""
    assert L.BTH_MRC10.size == L.BTH.size
    renamed = {"se": "solicited", "m": "migreq", "pad": "padcount", "tver": "version",
               "reserved0": "resv6", "a": "ackreq"}
    for field in L.BTH_MRC10.fields:
        rocev2 = renamed.get(field.name, field.name)
        if rocev2 in {f.name for f in L.BTH.fields}:
            assert L.BTH_MRC10.bit_offset(field.name) == L.BTH.bit_offset(rocev2), field.name
            assert field.bits == L.BTH.field(rocev2).bits, field.name
    for name, resv7_bit in (("rtx", pk.BTH_RTX), ("ts", pk.BTH_TS)):
        wire = L.BTH.pack(resv7=resv7_bit)
        assert L.BTH_MRC10.unpack(wire)[name] == 1
        assert sum(L.BTH_MRC10.unpack(wire).values()) == 1
        bth = BTH(wire + bytes(4))
        assert pk.bth_rtx(bth) == (name == "rtx") and pk.bth_ts(bth) == (name == "ts")


def test_signed_fields_pack_twos_complement():
    assert L.SETH.field("ack_psn_offset").signed
    assert L.SETH.pack(ack_psn_offset=-2)[2:4] == b"\xff\xfe"
    assert L.SETH.unpack(L.SETH.pack(sack_psn_offset=-32768))["sack_psn_offset"] == -32768
    with pytest.raises(ValueError, match=r"SETH.ack_psn_offset must be from -32768 to 32767"):
        L.SETH.pack(ack_psn_offset=0x8000)


def test_header_sources_are_known():
    for header in (*L.ALL_HEADERS, L.BTH_MRC10, *L.STANDARD_HEADERS):
        for field in header.fields:
            assert header.field_source(field.name) in L.SOURCES
    assert L.MDETH.own and not L.RETH.own and not L.SETH.own


def test_mrc10_layers_do_not_change_current_format_dissection():
    """The MRC 1.0 bindings leave every current-format sample decoding as before."""
    for sample in sample_packets():
        layers = Ether(raw(sample.packet)).layers()
        assert not {pk.METH, pk.TSETH, pk.SETH, pk.CC_STATE, pk.NETH, pk.PETH, pk.ERTH,
                    pk.EETH} & set(layers), sample.name


def test_header_pack_names_bad_field():
    with pytest.raises(ValueError, match=r"RETH.dma_len must be from 0 to 4294967295"):
        L.RETH.pack(dma_len=1 << 32)
    with pytest.raises(KeyError, match="no field"):
        L.RETH.pack(length=1)


@pytest.mark.parametrize("sample", sample_packets(), ids=lambda s: s.name)
def test_sample_round_trip(sample):
    """build -> bytes -> parse -> bytes is the identity, every layer decodes, ICRC valid."""
    data = raw(sample.packet)
    parsed = Ether(data)
    assert raw(parsed) == data
    for cls in (pk.RETH, pk.ImmDt, pk.MDETH, AETH, pk.MACKETH, pk.MPRH):
        assert parsed.haslayer(cls) == sample.packet.haslayer(cls), cls.__name__
        if parsed.haslayer(cls):
            for name, value in sample.packet[cls].fields.items():
                if value is not None:           # None: computed at build time (lengths)
                    assert parsed[cls].getfieldval(name) == value, f"{cls.__name__}.{name}"
    assert parsed[UDP].dport == P.ROCEV2_UDP_PORT
    if sample.name == "trimmed":
        assert pk.is_trimmed(parsed)
        assert not pk.icrc_ok(data)         # documented: a trimmed packet's ICRC is not checked
        assert not parsed[pk.MDETH].payload
    else:
        assert not pk.is_trimmed(parsed)
        assert pk.icrc_ok(data)


def test_data_packet_layers_in_order():
    pkt = Ether(raw(pk.data_packet(P.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, dqpn=5, psn=9,
                                   va=0x1234, rkey=7, payload=b"abc", imm=42, ev_index=3)))
    names = [layer.__name__ for layer in pkt.layers()]
    assert names == ["Ether", "IPv6", "UDP", "BTH", "RETH", "ImmDt", "MDETH", "Raw"]
    assert pkt[pk.RETH].dma_len == 3 and pkt[pk.ImmDt].imm == 42 and pkt.load == b"abc"


def test_icrc_covers_everything_but_the_variant_fields():
    pkt = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=1, va=D.MR_BASE,
                         rkey=D.MR_RKEY, payload=bytes(range(40)), flow_label=0x12345)
    data = bytearray(raw(pkt))
    # Variant fields a router may rewrite: traffic class, flow label, hop limit (IPv6),
    # UDP checksum, BTH FECN/BECN/resv6. Changing them keeps the ICRC valid.
    variant = {14: 0x0F, 15: 0xFF, 16: 0xFF, 17: 0xFF, 21: 0xFF, 60: 0xFF, 61: 0xFF, 66: 0xFF}
    changed = bytearray(data)
    for offset, value in variant.items():
        changed[offset] ^= value
    assert pk.icrc_ok(bytes(changed))
    # Any other byte after the Ethernet header is covered: flip each one in turn.
    for offset in range(14, len(data) - 4):
        if offset in variant:
            continue
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        try:
            ok = pk.icrc_ok(bytes(flipped))
        except Exception:                   # a flip that breaks the decode is also detected
            ok = False
        assert not ok, f"flip at byte {offset} not detected"


def test_ipv4_checksum_and_dscp_masked():
    pkt = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=2, va=3, rkey=4,
                         payload=b"x" * 10, ip_version=4)
    parsed = Ether(raw(pkt))
    parsed[IP].tos = 0xFC
    parsed[IP].ttl = 3
    parsed[IP].chksum = None
    assert pk.icrc_ok(raw(parsed))


def test_ack_sack_bitmap_and_flags():
    ack = Ether(raw(pk.ack_packet(dqpn=D.QPN_A, psn=0x20, cum_psn=0x10, sack=(1 << 63) | 5,
                                  sack_bytes=8, flags=P.AckFlags.ECN_ECHO, svc_time=99)))
    m = ack[pk.MACKETH]
    assert m.sack_bytes == 8 and m.sack_int() == (1 << 63) | 5
    assert m.cum_psn == 0x10 and m.svc_time == 99 and m.flags == P.AckFlags.ECN_ECHO
    assert ack[AETH].syndrome == P.AETH_ACK
    assert P.syndrome_nak_code(ack[AETH].syndrome) is None
    wide = Ether(raw(pk.ack_packet(dqpn=1, psn=1, cum_psn=0, sack=1 << 1000, sack_bytes=128)))
    assert wide[pk.MACKETH].sack_bytes == 128 and wide[pk.MACKETH].sack_int() == 1 << 1000
    assert pk.icrc_ok(raw(wide))


@pytest.mark.parametrize("code", list(P.NakCode), ids=lambda c: c.name)
def test_nack_codes(code):
    nack = Ether(raw(pk.nack_packet(code, dqpn=1, psn=7, cum_psn=6)))
    assert nack[AETH].syndrome == 0x60 | code
    assert P.syndrome_nak_code(nack[AETH].syndrome) == code


def test_probe_request_and_response():
    for response, opcode in [(False, P.Opcode.PROBE_REQUEST), (True, P.Opcode.PROBE_RESPONSE)]:
        probe = Ether(raw(pk.probe_packet(response=response, dqpn=3, probe_id=0xABCD,
                                          ev_index=17, src_qpn=0x11, tx_ts=5, svc_time=6)))
        assert probe[BTH].opcode == opcode
        assert (probe[pk.MPRH].probe_id, probe[pk.MPRH].ev_index) == (0xABCD, 17)


def test_trim_keeps_headers_and_rewrites_lengths():
    full = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, dqpn=1, psn=2, va=3, rkey=4,
                          payload=b"y" * 500, imm=9, ecn=P.ECN_CE)
    trimmed = pk.trim(full, dscp=10)
    ip = trimmed[IPv6]
    assert ip.tc >> 2 == 10 and ip.tc & 3 == P.ECN_CE       # ECN survives the trim
    header_bytes = L.BTH.size + L.RETH.size + L.IMMDT.size + L.MDETH.size
    assert ip.plen == 8 + header_bytes + P.ICRC_BYTES
    assert trimmed[UDP].len == ip.plen
    assert trimmed[pk.RETH].dma_len == 500 and trimmed[pk.ImmDt].imm == 9
    assert pk.is_trimmed(trimmed, dscp=10) and not pk.is_trimmed(trimmed)
    trimmed4 = pk.trim(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=2, va=3, rkey=4,
                                      payload=b"z" * 100, ip_version=4))
    assert Ether(raw(trimmed4))[IP].chksum == trimmed4[IP].chksum
    assert trimmed4[IP].len == 20 + 8 + L.BTH.size + L.RETH.size + L.MDETH.size + 4
    with pytest.raises(ValueError, match="only data packets"):
        pk.trim(pk.ack_packet(dqpn=1, psn=1, cum_psn=1))


def test_srv6_icrc_covers_inner_packet_only():
    inner = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=2, va=3, rkey=4,
                           payload=b"q" * 33)
    a = raw(pk.srv6_encapsulate(inner, dst="fc00::1", segment="fc00::2"))
    b = raw(pk.srv6_encapsulate(inner, dst="fc00::99", segment="fc00::2"))
    assert a[-4:] == b[-4:] == raw(inner)[-4:]
    outer = Ether(a)
    assert outer[IPv6].dst == "fc00::1" and outer[IPv6].nh == P.IP_PROTO_ROUTING
    assert outer.getlayer(IPv6, 2).dst == D.NIC_B.ipv6


@pytest.mark.parametrize("kwargs, message", [
    (dict(imm=None, opcode=P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE), "needs immediate"),
    (dict(imm=5, opcode=P.Opcode.RDMA_WRITE_ONLY), "takes no immediate"),
    (dict(opcode=P.Opcode.ACKNOWLEDGE), "not an MRC data opcode"),
    (dict(opcode=P.Opcode.RDMA_WRITE_ONLY, dscp=64), "dscp must be from 0 to 63"),
    (dict(opcode=P.Opcode.RDMA_WRITE_ONLY, ip_version=4, flow_label=1), "STEV format mode"),
    (dict(opcode=P.Opcode.RDMA_WRITE_ONLY, ip_version=5), "ip_version must be 4 or 6"),
])
def test_builder_errors_name_the_problem(kwargs, message):
    opcode = kwargs.pop("opcode")
    with pytest.raises(ValueError, match=message):
        pk.data_packet(opcode, dqpn=1, psn=1, va=0, rkey=0, **kwargs)


def test_sack_bytes_must_be_allowed():
    with pytest.raises(ValueError, match=r"sack_bytes must be one of \(8, 16, 32, 64, 128\)"):
        pk.ack_packet(dqpn=1, psn=1, cum_psn=0, sack_bytes=12)
    with pytest.raises(ValueError, match="does not fit"):
        pk.ack_packet(dqpn=1, psn=1, cum_psn=0, sack=1 << 64)


def test_pcap_written_and_read_back(tmp_path):
    samples = sample_packets()
    path = tmp_path / "s.pcap"
    pk.write_pcap(path, [s.packet for s in samples])
    back = rdpcap(str(path))
    assert [raw(p) for p in back] == [raw(s.packet) for s in samples]


def test_wire_format_doc_lists_the_sample_capture():
    from sim.env import REPO
    doc = (REPO / "docs" / "wire-format.md").read_text()
    assert sample_table() in doc, "regenerate the table with: mrc-nic pcap-sample --list"


@pytest.mark.parametrize("header", L.ALL_HEADERS, ids=lambda h: h.name)
def test_wire_format_doc_shows_the_layout_table(header):
    from sim.env import REPO
    doc = (REPO / "docs" / "wire-format.md").read_text()
    assert L.markdown_table(header) in doc, f"docs/wire-format.md: {header.name} table is stale"


def test_wire_format_doc_shows_the_mrc10_tables():
    from sim.env import REPO
    doc = (REPO / "docs" / "wire-format.md").read_text()
    assert L.mrc10_markdown() in doc, (
        "docs/wire-format.md: the MRC 1.0 tables are stale: python -m hdl.packet.layouts")


def test_sample_covers_every_packet_kind():
    samples = sample_packets()
    opcodes = {s.packet[BTH].opcode for s in samples}
    assert opcodes == {int(o) for o in P.SUPPORTED_OPCODES}
    assert {P.syndrome_nak_code(s.packet[AETH].syndrome) for s in samples
            if s.packet.haslayer(AETH)} == {None, *P.NakCode}
    ips = {s.packet[UDP].underlayer.__class__ for s in samples if s.packet.haslayer(pk.RETH)}
    assert ips == {IP, IPv6}
    assert any(s.name == "trimmed" for s in samples)
