"""The Scapy layers and builders against the layout table, RoCEv2's ICRC and the samples."""

import pytest
from scapy.compat import raw
from scapy.contrib import roce
from scapy.contrib.roce import AETH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from hdl import protocol as P
from hdl.packet import layouts as L
from sim import defaults as D
from sim import packets as pk
from sim.samples import sample_packets, sample_table

SCAPY_CLASSES = {"BTH": pk.BTH, "AETH": AETH, **{h.name: pk.LAYERS[h] for h in pk.LAYERS}}


def _scapy_header_bytes(header, **values):
    layer = SCAPY_CLASSES[header.name](**values)
    data = raw(layer)
    if header is L.BTH:
        data = data[:-4]                    # BTH's trailing ICRC field is not part of the header
    return data


@pytest.mark.parametrize("header", L.ALL_HEADERS, ids=lambda h: h.name)
def test_layout_table_agrees_with_scapy(header):
    """Every field lands at the same bits in the table and in Scapy: set it alone to all ones."""
    base = {"icrc": 0, "pkey": 0} if header is L.BTH else {}
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


def test_bth_is_the_rocev2_bth_with_the_mrc_flag_bits():
    """sim.packets.BTH is Scapy's RoCEv2 BTH with MRC 1.0's rtx and ts named: every other field
    keeps Scapy's place, rtx and ts are bits of Scapy's resv7, and the ICRC is Scapy's."""
    rocev2 = {f.name for f in roce.BTH.fields_desc} - {"icrc"}
    for field in L.BTH.fields:
        if field.name in rocev2:
            ours = raw(pk.BTH(**{field.name: 1}, icrc=0))
            assert ours == raw(roce.BTH(**{field.name: 1}, icrc=0)), field.name
    for name, resv7_bit in (("rtx", 0x20), ("ts", 0x10)):
        wire = raw(pk.BTH(**{name: 1}, pkey=0, icrc=0))[:L.BTH.size]
        assert roce.BTH(wire + bytes(4)).resv7 == resv7_bit, name
        assert L.BTH.unpack(wire)[name] == 1
    for sample in sample_packets():
        frame = raw(sample.packet)
        if sample.name != "trimmed":
            scapy = Ether(frame)
            scapy[pk.BTH].icrc = None
            assert raw(scapy) == frame, sample.name


def test_signed_fields_pack_twos_complement():
    assert L.SETH.field("ack_psn_offset").signed
    assert L.SETH.pack(ack_psn_offset=-2)[2:4] == b"\xff\xfe"
    assert L.SETH.unpack(L.SETH.pack(sack_psn_offset=-32768))["sack_psn_offset"] == -32768
    with pytest.raises(ValueError, match=r"SETH.ack_psn_offset must be from -32768 to 32767"):
        L.SETH.pack(ack_psn_offset=0x8000)


def test_header_sources_are_known():
    for header in (*L.ALL_HEADERS, *L.STANDARD_HEADERS):
        for field in header.fields:
            assert header.field_source(field.name) in L.SOURCES
    assert not any(h.own for h in (*L.ALL_HEADERS, *L.STANDARD_HEADERS))


def test_project_choices_are_only_what_the_references_leave_open():
    """The only [project choice] fields: METH's meaning, the EETH op position, the unit of the
    16-bit timestamps and the composition of the entropy echo."""
    chosen = {(h.name, f.name) for h in L.ALL_HEADERS for f in h.fields
              if h.field_source(f.name) == "project"}
    assert chosen == {
        ("METH", "rqmsn"), ("METH", "msn"), ("EETH", "op"),
        ("TSETH", "tx_timestamp"), ("CC_STATE", "tx_timestamp"), ("NETH", "tx_timestamp"),
        ("PETH", "tx_timestamp"), ("ERTH", "tx_timestamp"), ("EETH", "tx_timestamp"),
        ("SETH", "entropy"), ("NETH", "entropy")}
    assert "[uncertain]" in L.EETH.field("op").doc


def test_every_opcode_decodes_to_its_headers():
    """Each opcode of the table decodes to exactly its headers (data: METH, [TSETH], RETH,
    [ImmDt], payload), and nothing after a control packet's headers."""
    for sample in sample_packets():
        pkt = Ether(raw(sample.packet))
        opcode = pkt[pk.BTH].opcode
        headers = [layer for layer in pkt.layers()
                   if layer in set(pk.LAYERS.values())]
        if opcode in P.DATA_OPCODES:
            want = L.data_headers(opcode, ts=pkt[pk.BTH].ts)
        else:
            want = L.CONTROL_HEADERS[opcode]
            assert pk.transport_payload(pkt) == b"", sample.name
        assert headers == [pk.LAYERS[h] for h in want], sample.name


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
    for cls in (*pk.LAYERS.values(),):
        assert parsed.haslayer(cls) == sample.packet.haslayer(cls), cls.__name__
        if parsed.haslayer(cls):
            for name, value in sample.packet[cls].fields.items():
                if value is not None:           # None: computed at build time (lengths)
                    assert parsed[cls].getfieldval(name) == value, f"{cls.__name__}.{name}"
    assert parsed[UDP].dport == P.ROCEV2_UDP_PORT
    if sample.name == "trimmed":
        assert pk.is_trimmed(parsed)
        assert not pk.icrc_ok(data)         # documented: a trimmed packet's ICRC is not checked
        assert not pk.transport_payload(parsed)
    else:
        assert not pk.is_trimmed(parsed)
        assert pk.icrc_ok(data)


def test_data_packet_layers_in_order():
    pkt = Ether(raw(pk.data_packet(P.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, dqpn=5, psn=9,
                                   va=0x1234, rkey=7, payload=b"abc", imm=42, msn=3, rqmsn=1,
                                   rtx=True, tseth={"tx_timestamp": 0x77, "ftype": 1})))
    names = [layer.__name__ for layer in pkt.layers()]
    assert names == ["Ether", "IPv6", "UDP", "BTH", "METH", "TSETH", "RETH", "ImmDt", "Raw"]
    assert pkt[pk.BTH].rtx == 1 and pkt[pk.BTH].ts == 1
    assert pkt[pk.METH].msn == 3 and pkt[pk.METH].rqmsn == 1
    assert pkt[pk.TSETH].tx_timestamp == 0x77
    assert pkt[pk.RETH].dma_len == 3 and pkt[pk.ImmDt].imm == 42 and pkt.load == b"abc"
    plain = Ether(raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=5, psn=9, va=0, rkey=7,
                                     payload=b"abc")))
    assert [layer.__name__ for layer in plain.layers()][3:] == ["BTH", "METH", "RETH", "Raw"]
    assert plain[pk.BTH].ts == 0 and plain[pk.BTH].rtx == 0


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


def test_sack_fields_and_psn():
    sack = Ether(raw(pk.sack_packet(dqpn=D.QPN_A, cack_psn=0x10, ack_psn_offset=-3,
                                    sack_psn_offset=1, sack_bitmap=(1 << 63) | 5,
                                    m=int(P.SackMark.SKIP_ONCE),
                                    cc_state={"rcvd_bytes": 0xABCDEF, "ooo_count": 7})))
    seth = sack[pk.SETH]
    assert sack[pk.BTH].psn == seth.cack_psn == 0x10
    assert seth.ack_psn_offset == -3 and seth.sack_bitmap == (1 << 63) | 5
    assert sack[pk.CC_STATE].rcvd_bytes == 0xABCDEF and sack[pk.CC_STATE].ooo_count == 7
    assert len(raw(sack[pk.SETH])) == 36


@pytest.mark.parametrize("code", list(P.NakCode), ids=lambda c: c.name)
def test_aeth_nak_codes(code):
    nak = Ether(raw(pk.nak_packet(code, dqpn=1, psn=7)))
    assert nak[pk.BTH].opcode == P.Opcode.ACKNOWLEDGE
    assert nak[AETH].syndrome == 0x60 | code
    assert P.syndrome_nak_code(nak[AETH].syndrome) == code


@pytest.mark.parametrize("reason", list(P.NackReason), ids=lambda r: r.name)
def test_nack_reasons(reason):
    nack = Ether(raw(pk.nack_packet(dqpn=1, nack_psn=7, nack_reason=reason)))
    assert nack[pk.BTH].psn == nack[pk.NETH].nack_psn == 7
    assert nack[pk.NETH].nack_reason == reason


def test_probes_and_endpoint_packets():
    probe = Ether(raw(pk.probe_packet(dqpn=3, psn=4, probe_id=0xABCD, tx_timestamp=5)))
    assert probe[pk.BTH].opcode == P.Opcode.RELIABILITY_PROBE_REQUEST
    assert probe[pk.PETH].probe_id == 0xABCD
    request = Ether(raw(pk.endpoint_request(request_id=0x1234, op=P.EndpointOp.EV_PROBE)))
    assert request[pk.BTH].dqpn == P.ENDPOINT_QPN and request[pk.BTH].psn == 0x1234
    assert request[pk.ERTH].op == P.EndpointOp.EV_PROBE
    response = Ether(raw(pk.endpoint_response(request_id=0x1234, op=P.EndpointOp.EV_PROBE,
                                              tx_timestamp=9)))
    assert response[pk.BTH].opcode == P.Opcode.ENDPOINT_RESPONSE
    assert response[pk.EETH].tx_timestamp == 9 and response[pk.EETH].op == 1
    with pytest.raises(ValueError, match="request_id must be from 0 to 65535"):
        pk.endpoint_request(request_id=1 << 16, op=P.EndpointOp.EV_PROBE)


def test_trim_keeps_headers_and_rewrites_lengths():
    full = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, dqpn=1, psn=2, va=3, rkey=4,
                          payload=b"y" * 500, imm=9, ecn=P.ECN_CE)
    trimmed = pk.trim(full, dscp=10)
    ip = trimmed[IPv6]
    assert ip.tc >> 2 == 10 and ip.tc & 3 == P.ECN_CE       # ECN survives the trim
    header_bytes = L.BTH.size + L.METH.size + L.RETH.size + L.IMMDT.size
    assert ip.plen == 8 + header_bytes + P.ICRC_BYTES
    assert trimmed[UDP].len == ip.plen
    assert trimmed[pk.RETH].dma_len == 500 and trimmed[pk.ImmDt].imm == 9
    assert pk.is_trimmed(trimmed, dscp=10) and not pk.is_trimmed(trimmed)
    trimmed4 = pk.trim(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=2, va=3, rkey=4,
                                      payload=b"z" * 100, ip_version=4))
    assert Ether(raw(trimmed4))[IP].chksum == trimmed4[IP].chksum
    assert trimmed4[IP].len == 20 + 8 + L.BTH.size + L.METH.size + L.RETH.size + 4
    with pytest.raises(ValueError, match="only data packets"):
        pk.trim(pk.sack_packet(dqpn=1, cack_psn=1))


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


def test_sample_covers_every_packet_kind():
    samples = sample_packets()
    opcodes = {s.packet[pk.BTH].opcode for s in samples}
    assert opcodes == {int(o) for o in P.SUPPORTED_OPCODES}
    assert {P.syndrome_nak_code(s.packet[AETH].syndrome) for s in samples
            if s.packet.haslayer(AETH)} == set(P.NakCode)
    ips = {s.packet[UDP].underlayer.__class__ for s in samples if s.packet.haslayer(pk.RETH)}
    assert ips == {IP, IPv6}
    assert any(s.name == "trimmed" for s in samples)
