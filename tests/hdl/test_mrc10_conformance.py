"""MRC 1.0 headers against byte vectors typed by hand from the specification's tables.

Every vector below was written byte by byte from the MRC 1.0 tables (the specification's
copy of them), never produced through ``hdl.packet.layouts``: each one is the independent
reference that the layout table, its ``pack``/``unpack`` and the Scapy layers must all agree
with. The per-header vectors give every field, reserved ones included, a distinct non-zero
value, so a field one bit out of place fails; the two packet vectors (a data packet's header
chain and a SACK) carry values a real packet would. Whole frames of every packet type, their
transport bytes typed by hand, go through the RTL parser and header builder both ways.

Readings the tables leave open are the project's (``docs/wire-format.md``, section 9): EETH's
op in bits 3-2 of byte 1, and BTH byte 1 with SE at bit 7 and M at bit 6 as in IBTA.
"""

import pytest
from scapy.compat import raw
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet import layouts as L
from hdl.packet.headers import DropReason, PacketKind, field_slices, header_struct
from sim import defaults as D
from sim import packets as pk
from sim import rtlpackets as rp
from tests.hdl.test_builder import BuilderBench
from tests.hdl.test_parser import run_parser

# ---------------------------------------------------------------------------------------------
# Per-header vectors: (layout, Scapy layer, wire bytes, fields)
# ---------------------------------------------------------------------------------------------

METH_BYTES = bytes.fromhex("1234 abcd")
METH_FIELDS = {"rqmsn": 0x1234, "msn": 0xABCD}

# bytes 2-3: tsr 1 | reserved 0x2A5 (11 bits) | ftype 1  ->  1 01010100101 0001 = 0xAA51
TSETH_BYTES = bytes.fromhex("8f3c aa51")
TSETH_FIELDS = {"tx_timestamp": 0x8F3C, "tsr": 1, "reserved": 0x2A5, "ftype": 1}

# bytes 0-1: type 0x9 | next header 0x15 | m 2 | reserved 0x5 | pr 1 | reserved 0
#            1001 10101 10 101 1 0 = 0x9AD6
SETH_BYTES = bytes.fromhex(
    "9ad6"                  # type, next header, m, reserved, pr, reserved
    "fffd"                  # ack_psn_offset = -3
    "c0de1234"              # entropy
    "0a0b" "0c0d"           # spdcid, dpdcid
    "5e"                    # reserved
    "123456"                # cack_psn
    "73"                    # cc_type 7, cc_flags 3
    "08"                    # mpr
    "0021"                  # sack_psn_offset = +33
    "f0e1d2c3b4a59687")     # sack_bitmap
SETH_FIELDS = {
    "type": 0x9, "next_header": 0x15, "m": 2, "reserved0": 0x5, "pr": 1, "reserved1": 0,
    "ack_psn_offset": -3, "entropy": 0xC0DE1234, "spdcid": 0x0A0B, "dpdcid": 0x0C0D,
    "reserved2": 0x5E, "cack_psn": 0x123456, "cc_type": 7, "cc_flags": 3, "mpr": 8,
    "sack_psn_offset": 33, "sack_bitmap": 0xF0E1D2C3B4A59687,
}

# bytes 2-3: reserved 1 | ooo_count 0x1234 -> 0x9234; byte 4: restore_cwnd 1 | pen 0x2B -> 0xAB
CC_STATE_BYTES = bytes.fromhex("4d2e 9234 ab 0f1e2d")
CC_STATE_FIELDS = {"tx_timestamp": 0x4D2E, "reserved": 1, "ooo_count": 0x1234,
                   "restore_cwnd": 1, "rcv_cwnd_pen": 0x2B, "rcvd_bytes": 0x0F1E2D}

NETH_BYTES = bytes.fromhex(
    "1357"                  # bytes 0-1 (0 on the wire; non-zero here to pin the position)
    "0b" "a5"               # nack_reason PSN_OOR_WINDOW, vendor_info
    "0001c0de"              # entropy
    "2468" "369c"           # spdcid, dpdcid
    "11"                    # reserved
    "abcdef"                # nack_psn
    "4e"                    # cc_type 4, cc_flags 0xE
    "22"                    # reserved
    "7788")                 # tx_timestamp
NETH_FIELDS = {
    "reserved0": 0x1357, "nack_reason": 0x0B, "vendor_info": 0xA5, "entropy": 0x0001C0DE,
    "spdcid": 0x2468, "dpdcid": 0x369C, "reserved1": 0x11, "nack_psn": 0xABCDEF,
    "cc_type": 4, "cc_flags": 0xE, "reserved2": 0x22, "tx_timestamp": 0x7788,
}

# bytes 14-15: tsr 1 | reserved 0x0AB (11 bits) | ftype 1  ->  1 00010101011 0001 = 0x8AB1
PETH_BYTES = bytes.fromhex("0102 03 c4 beef 0506 1a2b 3c4d 5e6f 8ab1")
PETH_FIELDS = {
    "reserved0": 0x0102, "reserved1": 0x03, "vendor_info": 0xC4, "probe_id": 0xBEEF,
    "reserved2": 0x0506, "spdcid": 0x1A2B, "dpdcid": 0x3C4D, "tx_timestamp": 0x5E6F,
    "tsr": 1, "reserved3": 0x0AB, "ftype": 1,
}

# bytes 0-1: reserved 0x1ABC (14 bits) | op 1  ->  0x1ABC << 2 | 1 = 0x6AF1
# bytes 14-15: tsr 0 | reserved 0x5A5 | ftype 1  ->  0 10110100101 0001 = 0x5A51
ERTH_BYTES = bytes.fromhex("6af1 77 88 000000f5 deadbeef 1122 5a51")
ERTH_FIELDS = {
    "reserved0": 0x1ABC, "op": 1, "reserved1": 0x77, "vendor_info": 0x88,
    "port_status_mask": 0xF5, "reserved2": 0xDEADBEEF, "tx_timestamp": 0x1122, "tsr": 0,
    "reserved3": 0x5A5, "ftype": 1,
}

# bytes 0-1: reserved 0xABC (12 bits) | op 1 (bits 3-2 of byte 1) | reserved 2  ->  0xABC6
EETH_BYTES = bytes.fromhex(
    "abc6"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a"     # bytes 2-27, reserved
    "3344"                                                     # tx_timestamp
    "a1a2a3a4a5a6")                                            # bytes 30-35, reserved
EETH_FIELDS = {
    "reserved0": 0xABC, "op": 1, "reserved1": 2,
    "reserved2": 0x0102030405060708090A0B0C0D0E0F101112131415161718191A,
    "tx_timestamp": 0x3344, "reserved3": 0xA1A2A3A4A5A6,
}

VECTORS = [
    (L.METH, pk.METH, METH_BYTES, METH_FIELDS),
    (L.TSETH, pk.TSETH, TSETH_BYTES, TSETH_FIELDS),
    (L.SETH, pk.SETH, SETH_BYTES, SETH_FIELDS),
    (L.CC_STATE, pk.CC_STATE, CC_STATE_BYTES, CC_STATE_FIELDS),
    (L.NETH, pk.NETH, NETH_BYTES, NETH_FIELDS),
    (L.PETH, pk.PETH, PETH_BYTES, PETH_FIELDS),
    (L.ERTH, pk.ERTH, ERTH_BYTES, ERTH_FIELDS),
    (L.EETH, pk.EETH, EETH_BYTES, EETH_FIELDS),
]
VECTOR_IDS = [v[0].name for v in VECTORS]


def test_header_sizes_are_the_specification_s():
    """METH 4, TSETH 4, SETH + CC_STATE 36, NETH 20, PETH 16, ERTH 16, EETH 36 bytes."""
    assert L.METH.size == 4
    assert L.TSETH.size == 4
    assert L.SETH.size + L.CC_STATE.size == 36
    assert sum(h.size for h in L.SACK_HEADERS) == 36
    assert L.NETH.size == 20
    assert L.PETH.size == 16
    assert L.ERTH.size == 16
    assert L.EETH.size == 36
    assert L.BTH.size == 12


@pytest.mark.parametrize(("header", "layer", "wire", "fields"), VECTORS, ids=VECTOR_IDS)
def test_vector_is_the_size_of_its_header(header, layer, wire, fields):
    assert len(wire) == header.size
    assert set(fields) == {f.name for f in header.fields}


@pytest.mark.parametrize(("header", "layer", "wire", "fields"), VECTORS, ids=VECTOR_IDS)
def test_layout_unpacks_and_packs_the_vector(header, layer, wire, fields):
    assert header.unpack(wire) == fields
    assert header.pack(**fields) == wire


@pytest.mark.parametrize(("header", "layer", "wire", "fields"), VECTORS, ids=VECTOR_IDS)
def test_scapy_layer_parses_and_builds_the_vector(header, layer, wire, fields):
    parsed = layer(wire)
    assert {name: getattr(parsed, name) for name in fields} == fields
    assert not parsed.payload
    assert raw(layer(**fields)) == wire


@pytest.mark.parametrize(("header", "layer", "wire", "fields"), VECTORS, ids=VECTOR_IDS)
def test_gateware_field_slices_find_every_field(header, layer, wire, fields):
    """The parser extracts fields by hdl.packet.headers.field_slices; the struct view has a
    member of the right width and signedness for each."""
    struct = header_struct(header)
    for name, (first_byte, bit_in_byte, bits) in field_slices(header).items():
        container = wire[first_byte:first_byte + (bit_in_byte + bits + 7) // 8]
        raw_value = int.from_bytes(container, "big") >> (8 * len(container) - bit_in_byte - bits)
        raw_value &= (1 << bits) - 1
        expected = fields[name] & ((1 << bits) - 1)
        assert raw_value == expected, name
        shape = struct[name].shape
        assert shape.width == bits and shape.signed == header.field(name).signed, name


def test_eeth_op_sits_in_bits_3_2_of_byte_1():
    """The one reading the references disagree on, kept in one place: [uncertain]."""
    assert L.EETH.bit_offset("op") == 8 + 4
    assert L.EETH.pack(op=int(P.EndpointOp.EV_PROBE))[:2] == bytes.fromhex("0004")
    assert "[uncertain]" in L.EETH.field("op").doc


# ---------------------------------------------------------------------------------------------
# BTH flag bits
# ---------------------------------------------------------------------------------------------

def bth_fields(opcode, dqpn, psn, *, ackreq=0, rtx=0, ts=0):
    """A BTH's fields by their RoCEv2 names (MRC 1.0: se, m, pad, tver, a), pkey 0xFFFF."""
    return {"opcode": opcode, "solicited": 0, "migreq": 0, "padcount": 0, "version": 0,
            "pkey": 0xFFFF, "fecn": 0, "becn": 0, "resv6": 0, "dqpn": dqpn, "ackreq": ackreq,
            "resv1": 0, "rtx": rtx, "ts": ts, "resv4": 0, "psn": psn}


# opcode 0xC9 | byte 1 0 | pkey 0xFFFF | byte 4 0 | dqpn 0x22 |
# byte 8: a 1, reserved 0, rtx 1, ts 1, reserved 0 = 1011 0000 = 0xB0 | psn 0xABCD
DATA_BTH_BYTES = bytes.fromhex("c9 00 ffff 00 000022 b0 00abcd")
DATA_BTH_FIELDS = bth_fields(0xC9, 0x22, 0xABCD, ackreq=1, rtx=1, ts=1)


def test_bth_flag_bits():
    assert L.BTH.unpack(DATA_BTH_BYTES) == DATA_BTH_FIELDS
    assert L.BTH.pack(**DATA_BTH_FIELDS) == DATA_BTH_BYTES
    # byte 8 alone: rtx is bit 5 (0x20), ts bit 4 (0x10)
    assert L.BTH.pack(rtx=1)[8] == 0x20
    assert L.BTH.pack(ts=1)[8] == 0x10
    assert L.BTH.pack(ackreq=1)[8] == 0x80
    # byte 1, IBTA order: se bit 7, m bit 6, pad bits 5-4, tver bits 3-0
    assert L.BTH.pack(solicited=1, padcount=2, version=5)[1] == 0b1010_0101
    bth = pk.BTH(DATA_BTH_BYTES + bytes(4))
    assert bth.rtx == 1 and bth.ts == 1 and bth.ackreq == 1
    assert raw(pk.BTH(**DATA_BTH_FIELDS, icrc=0))[:12] == DATA_BTH_BYTES


# ---------------------------------------------------------------------------------------------
# Whole packets after the UDP header
# ---------------------------------------------------------------------------------------------

DATA_CHAIN_BYTES = bytes.fromhex(
    "00070102"                          # METH: rqmsn 7, msn 0x102
    "beef0001"                          # TSETH: tx_timestamp 0xBEEF, tsr 0, ftype 1
    "0000000100000040 0000beef 00000030"    # RETH: va, rkey, dma_len 48
    "12345678")                         # ImmDt
PAYLOAD = bytes(range(48))
ICRC_PLACEHOLDER = bytes(4)


def test_data_packet_header_chain():
    """0xC9 with BTH.ts: BTH, METH, TSETH, RETH, ImmDt, payload, in that order."""
    wire = DATA_BTH_BYTES + DATA_CHAIN_BYTES + PAYLOAD + ICRC_PLACEHOLDER
    parsed = pk.BTH(wire)
    assert parsed.layers() == [
        pk.BTH, pk.METH, pk.TSETH, pk.RETH, pk.ImmDt, Raw]
    assert parsed[pk.METH].rqmsn == 7 and parsed[pk.METH].msn == 0x102
    assert parsed[pk.TSETH].tx_timestamp == 0xBEEF and parsed[pk.TSETH].ftype == 1
    assert parsed[pk.RETH].va == 0x1_0000_0040 and parsed[pk.RETH].dma_len == len(PAYLOAD)
    assert parsed[pk.ImmDt].imm == 0x12345678
    assert parsed[Raw].load == PAYLOAD

    built = (pk.BTH(opcode=0xC9, pkey=0xFFFF, dqpn=0x22, ackreq=1, rtx=1, ts=1, psn=0xABCD,
                    icrc=0)
             / pk.METH(rqmsn=7, msn=0x102) / pk.TSETH(tx_timestamp=0xBEEF, ftype=1)
             / pk.RETH(va=0x1_0000_0040, rkey=0xBEEF, dma_len=48) / pk.ImmDt(imm=0x12345678)
             / Raw(PAYLOAD))
    assert raw(built) == wire

    offset = L.BTH.size
    for header, expected in ((L.METH, {"rqmsn": 7, "msn": 0x102}),
                             (L.TSETH, {"tx_timestamp": 0xBEEF, "tsr": 0, "reserved": 0,
                                        "ftype": 1}),
                             (L.RETH, {"va": 0x1_0000_0040, "rkey": 0xBEEF, "dma_len": 48}),
                             (L.IMMDT, {"imm": 0x12345678})):
        assert header.unpack(wire[offset:]) == expected, header.name
        assert header.pack(**expected) == wire[offset:offset + header.size], header.name
        offset += header.size
    assert wire[offset:-4] == PAYLOAD


@pytest.mark.parametrize("opcode", sorted(P.DATA_OPCODES), ids=lambda o: o.name)
def test_every_data_opcode_carries_meth_then_reth(opcode):
    """Without BTH.ts no TSETH; ImmDt only on the two WITH_IMMEDIATE opcodes."""
    bth = bytes([int(opcode)]) + bytes.fromhex("00 ffff 00 000022 00 000001")
    immediate = opcode in P.IMMEDIATE_OPCODES
    chain = bytes.fromhex("00070102" "0000000100000040 0000beef 00000030")
    if immediate:
        chain += bytes.fromhex("12345678")
    parsed = pk.BTH(bth + chain + PAYLOAD + ICRC_PLACEHOLDER)
    expected = [pk.BTH, pk.METH, pk.RETH, *([pk.ImmDt] if immediate else []), Raw]
    assert parsed.layers() == expected


# 0xDC to the requester's QP 0x11, BTH.psn = cack_psn = 0x302
SACK_BTH_BYTES = bytes.fromhex("dc 00 ffff 00 000011 00 000302")
SACK_CHAIN_BYTES = bytes.fromhex(
    "0020"                  # type 0, next header 0, m SKIP_ONCE, pr 0
    "0003"                  # ack_psn_offset +3: PSN 0x305 triggered it
    "0000c005"              # entropy
    "0001" "0002"           # spdcid, dpdcid
    "00"                    # reserved
    "000302"                # cack_psn
    "10" "04"               # cc_type 1, cc_flags 0; mpr 4
    "0002"                  # sack_psn_offset +2
    "0000000000000005"      # sack_bitmap
    "0102"                  # CC_STATE tx_timestamp
    "0002"                  # reserved 0, ooo_count 2
    "00"                    # restore_cwnd 0, rcv_cwnd_pen 0
    "000600")               # rcvd_bytes
SACK_SETH_FIELDS = {
    "type": 0, "next_header": 0, "m": int(P.SackMark.SKIP_ONCE), "reserved0": 0, "pr": 0,
    "reserved1": 0, "ack_psn_offset": 3, "entropy": 0xC005, "spdcid": 1, "dpdcid": 2,
    "reserved2": 0, "cack_psn": 0x302, "cc_type": 1, "cc_flags": 0, "mpr": 4,
    "sack_psn_offset": 2, "sack_bitmap": 5,
}
SACK_CC_STATE_FIELDS = {"tx_timestamp": 0x0102, "reserved": 0, "ooo_count": 2,
                        "restore_cwnd": 0, "rcv_cwnd_pen": 0, "rcvd_bytes": 0x600}


def test_sack_packet_after_bth():
    assert len(SACK_CHAIN_BYTES) == 36
    wire = SACK_BTH_BYTES + SACK_CHAIN_BYTES + ICRC_PLACEHOLDER
    parsed = pk.BTH(wire)
    assert parsed.layers() == [pk.BTH, pk.SETH, pk.CC_STATE]
    assert parsed.opcode == P.Opcode.RELIABILITY_SACK
    assert parsed[pk.SETH].cack_psn == parsed.psn
    assert {n: getattr(parsed[pk.SETH], n) for n in SACK_SETH_FIELDS} == SACK_SETH_FIELDS
    assert ({n: getattr(parsed[pk.CC_STATE], n) for n in SACK_CC_STATE_FIELDS}
            == SACK_CC_STATE_FIELDS)
    assert L.SETH.unpack(SACK_CHAIN_BYTES) == SACK_SETH_FIELDS
    assert L.CC_STATE.unpack(SACK_CHAIN_BYTES[L.SETH.size:]) == SACK_CC_STATE_FIELDS
    assert (L.SETH.pack(**SACK_SETH_FIELDS) + L.CC_STATE.pack(**SACK_CC_STATE_FIELDS)
            == SACK_CHAIN_BYTES)
    built = (pk.BTH(opcode=0xDC, pkey=0xFFFF, dqpn=0x11, psn=0x302, icrc=0)
             / pk.SETH(**SACK_SETH_FIELDS) / pk.CC_STATE(**SACK_CC_STATE_FIELDS))
    assert raw(built) == wire


# ---------------------------------------------------------------------------------------------
# Codes
# ---------------------------------------------------------------------------------------------

def test_opcodes():
    assert {o.name: int(o) for o in P.Opcode} == {
        "RDMA_WRITE_FIRST": 0xC6, "RDMA_WRITE_MIDDLE": 0xC7, "RDMA_WRITE_LAST": 0xC8,
        "RDMA_WRITE_LAST_WITH_IMMEDIATE": 0xC9, "RDMA_WRITE_ONLY": 0xCA,
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE": 0xCB, "ACKNOWLEDGE": 0xD1, "ENDPOINT_REQUEST": 0xD8,
        "ENDPOINT_RESPONSE": 0xD9, "RELIABILITY_SACK": 0xDC, "RELIABILITY_NACK": 0xDD,
        "RELIABILITY_PROBE_REQUEST": 0xDE,
    }
    assert {int(o) for o in P.DATA_OPCODES} == set(range(0xC6, 0xCC))
    assert {int(o) for o in P.IMMEDIATE_OPCODES} == {0xC9, 0xCB}
    assert P.ENDPOINT_QPN == 0x000002
    assert {int(o) for o in P.SUPPORTED_OPCODES} == {int(o) for o in P.Opcode}
    assert not set(range(0x20)) & {int(o) for o in P.SUPPORTED_OPCODES}


def test_codes():
    assert {c.name: int(c) for c in P.NackReason} == {
        "TRIMMED": 0x01, "TRIMMED_LASTHOP": 0x02, "NO_BITMAP": 0x06, "NO_PKT_BUFFER": 0x07,
        "NO_RESOURCE": 0x0A, "PSN_OOR_WINDOW": 0x0B, "UNEXP_EVENT": 0x19}
    assert {c.name: int(c) for c in P.SackMark} == {
        "NONE": 0, "SKIP_ONCE": 1, "ALWAYS_SKIP": 2}
    assert {c.name: int(c) for c in P.WireEvState} == {
        "GOOD": 0, "DENIED": 1, "SKIP": 2, "ASSUMED_BAD": 3}
    assert {c.name: int(c) for c in P.EndpointOp} == {
        "PORT_STATUS_UPDATE": 0, "EV_PROBE": 1}
    assert {c.name: int(c) for c in P.NakCode} == {
        "INVALID_REQUEST": 1, "REMOTE_ACCESS": 2, "REMOTE_OPERATIONAL": 3}


def test_wire_format_doc_lists_the_codes():
    from sim.env import REPO
    doc = (REPO / "docs" / "wire-format.md").read_text()
    for kind in (P.NackReason, P.SackMark, P.WireEvState, P.EndpointOp):
        hex_codes = kind is P.NackReason
        for code in kind:
            text = f"{code.name} 0x{int(code):02X}" if hex_codes else f"{code.name} {int(code)}"
            assert text in doc, text
    for opcode in P.Opcode:
        assert f"| 0x{int(opcode):02X} | {opcode.name} |" in doc, opcode.name


# ---------------------------------------------------------------------------------------------
# Whole frames through the RTL parser and header builder, both ways
# ---------------------------------------------------------------------------------------------

RETH_BYTES = bytes.fromhex("0000000100000040 0000beef 00000030")
RETH_FIELDS = {"va": 0x1_0000_0040, "rkey": 0xBEEF, "dma_len": 48}
IMMDT_BYTES = bytes.fromhex("12345678")
IMMDT_FIELDS = {"imm": 0x12345678}
# syndrome 0x62: NAK REMOTE_ACCESS; msn 3
AETH_BYTES = bytes.fromhex("62 000003")
AETH_FIELDS = {"syndrome": 0x62, "msn": 3}

#: (name, kind, BTH bytes, BTH fields, [(header member path, bytes, fields)], payload).
#: A member path names where the parser puts the header: ("ctl", "neth"), ("meth",), ...
RTL_PACKETS = [
    ("write_last_imm_ts", PacketKind.DATA, DATA_BTH_BYTES, DATA_BTH_FIELDS,
     [(("meth",), METH_BYTES, METH_FIELDS), (("tseth",), TSETH_BYTES, TSETH_FIELDS),
      (("reth",), RETH_BYTES, RETH_FIELDS), (("immdt",), IMMDT_BYTES, IMMDT_FIELDS)],
     bytes(range(48))),
    ("write_only", PacketKind.DATA, bytes.fromhex("ca 00 ffff 00 000022 80 000001"),
     bth_fields(0xCA, 0x22, 1, ackreq=1),
     [(("meth",), METH_BYTES, METH_FIELDS), (("reth",), RETH_BYTES, RETH_FIELDS)],
     bytes(range(100, 148))),
    ("sack", PacketKind.SACK, bytes.fromhex("dc 00 ffff 00 000011 00 123456"),
     bth_fields(0xDC, 0x11, 0x123456),
     [(("ctl", "sack", "seth"), SETH_BYTES, SETH_FIELDS),
      (("ctl", "sack", "cc_state"), CC_STATE_BYTES, CC_STATE_FIELDS)], b""),
    ("nack", PacketKind.NACK, bytes.fromhex("dd 00 ffff 00 000011 00 abcdef"),
     bth_fields(0xDD, 0x11, 0xABCDEF), [(("ctl", "neth"), NETH_BYTES, NETH_FIELDS)], b""),
    ("aeth_nak", PacketKind.AETH, bytes.fromhex("d1 00 ffff 00 000011 00 000305"),
     bth_fields(0xD1, 0x11, 0x305), [(("aeth",), AETH_BYTES, AETH_FIELDS)], b""),
    ("reliability_probe", PacketKind.RPROBE, bytes.fromhex("de 00 ffff 00 000022 00 000306"),
     bth_fields(0xDE, 0x22, 0x306), [(("ctl", "peth"), PETH_BYTES, PETH_FIELDS)], b""),
    ("endpoint_request", PacketKind.EP_REQUEST,
     bytes.fromhex("d8 00 ffff 00 000002 00 00abcd"), bth_fields(0xD8, 0x02, 0xABCD),
     [(("ctl", "erth"), ERTH_BYTES, ERTH_FIELDS)], b""),
    ("endpoint_response", PacketKind.EP_RESPONSE,
     bytes.fromhex("d9 00 ffff 00 000002 00 00abcd"), bth_fields(0xD9, 0x02, 0xABCD),
     [(("ctl", "eeth"), EETH_BYTES, EETH_FIELDS)], b""),
]
RTL_IDS = [p[0] for p in RTL_PACKETS]
CONFIG = NicConfig()


def _transport(packet):
    _name, _kind, bth, _bth_fields, parts, payload = packet
    return bth + b"".join(wire for _, wire, _ in parts) + payload


def _frame(packet):
    """The hand-typed transport bytes behind a standard underlay, with the RoCEv2 ICRC."""
    under = Ether(src=D.NIC_A.mac, dst=D.NIC_B.mac) / IPv6(src=D.NIC_A.ipv6, dst=D.NIC_B.ipv6)
    frame = Ether(raw(under / pk.UDP(sport=0xC000, dport=P.ROCEV2_UDP_PORT, chksum=0)
                      / Raw(_transport(packet) + bytes(P.ICRC_BYTES))))
    frame[pk.BTH].icrc = None
    return raw(frame)


def _raw_bits(fields, header):
    """Field values as the gateware's unsigned members hold them (two's complement)."""
    return {name: value & ((1 << header.field(name).bits) - 1) for name, value in fields.items()}


def _member(header_dict, path):
    for key in path:
        header_dict = header_dict[key]
    return header_dict


def test_hand_typed_frames_decode_in_scapy():
    """The frames the RTL tests use: every header where the table puts it."""
    for packet in RTL_PACKETS:
        frame = Ether(_frame(packet))
        assert pk.icrc_ok(raw(frame)), packet[0]
        assert {n: getattr(frame[pk.BTH], n) for n in packet[3]} == packet[3], packet[0]
        assert pk.transport_payload(frame) == packet[5], packet[0]


def test_rtl_parser_reads_every_hand_typed_header():
    """All eight frames back to back (bubbles and backpressure): the parser accepts them and
    every field of the parsed header is the hand-typed value."""
    frames = [_frame(p) for p in RTL_PACKETS]
    run = run_parser(frames, seed=31)
    assert run.verdicts == [DropReason.NONE] * len(frames)
    for packet, (header, payload) in zip(RTL_PACKETS, run.packets, strict=True):
        name, kind, _bth, bth, parts, want_payload = packet
        assert header["kind"] == kind.value, name
        assert header["bth"] == bth, name
        for path, _wire, fields in parts:
            layout = {"meth": L.METH, "tseth": L.TSETH, "reth": L.RETH, "immdt": L.IMMDT,
                      "aeth": L.AETH, "seth": L.SETH, "cc_state": L.CC_STATE, "neth": L.NETH,
                      "peth": L.PETH, "erth": L.ERTH, "eeth": L.EETH}[path[-1]]
            assert _member(header, path) == _raw_bits(fields, layout), (name, path)
        assert payload == want_payload, name
        assert header["payload_len"] == len(want_payload), name


def test_rtl_builder_writes_every_hand_typed_header():
    """The builder, given the hand-typed fields (and the underlay of the frame), emits the
    hand-typed transport bytes, with a valid ICRC (bubbles and backpressure)."""
    packets = []
    for packet in RTL_PACKETS:
        name, kind, _bth, bth, parts, payload = packet
        header = rp.header_from_scapy(Ether(_frame(packet)), CONFIG)
        for member in ("meth", "tseth", "reth", "immdt", "aeth", "ctl"):
            header.pop(member, None)
        header["kind"] = kind
        header["bth"] = bth
        for path, _wire, fields in parts:
            target = header
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = dict(fields)
        packets.append((header, payload))
    frames = BuilderBench(CONFIG, seed=32, bubbles=0.3, backpressure=0.3).run(packets)
    for packet, frame in zip(RTL_PACKETS, frames, strict=True):
        assert frame == _frame(packet), packet[0]
        assert pk.icrc_ok(frame), packet[0]
