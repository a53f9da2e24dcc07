"""Wireshark dissector for MRC's transport headers, generated from the single layout table.

:func:`generate_lua` writes the whole Lua source from :mod:`hdl.packet.layouts` (field names,
widths, offsets) and :mod:`hdl.protocol` (opcodes, NAK codes, flag bits, the trim DSCP), so
the dissector cannot drift from the gateware and the Scapy layers. The committed
``sim/wireshark/mrc.lua`` is this output; regenerate it with ``python -m sim.dissector`` or
``mrc-nic dissector``, and a test keeps the two equal.

The Lua is a postdissector named ``mrc``: Wireshark's own Ethernet, VLAN, IP, IPv6 (with
SRv6), UDP and InfiniBand dissectors still decode the frame; ``mrc`` then finds the BTH after
the last UDP header to port 4791 and decodes the MRC 1.0 headers the opcode table names (METH,
TSETH when BTH.ts is set, RETH and ImmDt on data; AETH, SETH + CC_STATE, NETH, PETH, ERTH or
EETH on control packets) as ``mrc.<header>.<field>`` with the specification's field names
(``mrc.seth.cack_psn``, ``mrc.seth.sack_bitmap``, ``mrc.neth.nack_reason``, ...), plus
summary fields (``mrc.kind``, ``mrc.nak_code``, ``mrc.trimmed``, ``mrc.payload_len``,
``mrc.retransmission``, ``mrc.ack_psn``, ``mrc.sack_psn``, ``mrc.malformed``, ...). A
frame too short for its headers gets ``mrc.malformed`` and an
expert error, never a Lua error. Use it with
``tshark -X lua_script:sim/wireshark/mrc.lua`` or copy it to Wireshark's plugin folder.
"""

import enum
import re
import sys
from pathlib import Path
from string import Template

from hdl import protocol as P
from hdl.packet import layouts as L

from .errors import fail

__all__ = [
    "DEFAULT_LUA_PATH", "DECODED_HEADERS", "SUMMARY_FIELDS", "CONTROL_KINDS",
    "header_abbrev", "field_abbrev", "flag_abbrev", "flag_enum", "value_enum",
    "generate_lua", "write_lua", "register", "handler", "main",
]

DEFAULT_LUA_PATH = Path(__file__).resolve().parent / "wireshark" / "mrc.lua"

#: Headers decoded into ``mrc.*`` fields. The BTH is left to Wireshark's InfiniBand dissector
#: (``infiniband.bth.*``); the generator only reads its opcode, QPN and PSN.
DECODED_HEADERS = tuple(h for h in L.ALL_HEADERS if h is not L.BTH)

#: Summary fields that are not header fields: abbreviation -> (kind, description).
SUMMARY_FIELDS = {
    "mrc.kind": ("string", "packet kind: data, ack, nak, sack, nack, reliability_probe, "
                 "endpoint_request, endpoint_response or unsupported"),
    "mrc.opcode": ("opcode", "BTH opcode"),
    "mrc.nak_code": ("string", "NAK code name of an AETH NAK (hdl.protocol.NakCode)"),
    "mrc.trimmed": ("bool", "data packet whose inner IP DSCP is the trim DSCP preference"),
    "mrc.payload_len": ("uint32", "bytes of data payload between the headers and the ICRC"),
    "mrc.retransmission": ("bool", "data packet with BTH.rtx set"),
    "mrc.ack_psn": ("uint32", "the PSN that triggered a SACK: cack_psn + ack_psn_offset "
                    "(not on a probe answer, pr = 1)"),
    "mrc.sack_psn": ("uint32", "a PSN the SACK bitmap acknowledges (one per set bit): "
                     "cack_psn + sack_psn_offset + bit"),
    "mrc.icrc": ("uint32", "invariant CRC trailer (zero and unchecked on trimmed packets)"),
    "mrc.malformed": ("bool", "the frame is too short for its headers"),
}

UDP_HEADER_BYTES = 8


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------

def header_abbrev(header):
    """Display filter name of a header: ``mrc.reth``."""
    return f"mrc.{header.name.lower()}"


def field_abbrev(header, field_name):
    """Display filter name of a header field: ``mrc.reth.va``."""
    return f"{header_abbrev(header)}.{field_name}"


def flag_abbrev(header, field, flag):
    """Display filter name of one flag bit: ``mrc.<header>.<field>.<flag>``."""
    return f"{field_abbrev(header, field.name)}.{flag.name.lower()}"


_PROTOCOL_REFERENCE = re.compile(r"hdl\.protocol\.(\w+)")


def _protocol_type(header, field):
    """The :mod:`hdl.protocol` enumeration a field's doc names, or ``None``."""
    match = _PROTOCOL_REFERENCE.search(field.doc)
    if match is None:
        return None
    value = getattr(P, match.group(1), None)
    if not (isinstance(value, type) and issubclass(value, enum.Enum)):
        raise ValueError(f"{header.name}.{field.name} refers to hdl.protocol.{match.group(1)}, "
                         f"which is not an enumeration in hdl.protocol")
    return value


def value_enum(header, field):
    """The :class:`enum.IntEnum` whose values a field holds (named in its doc), or ``None``."""
    kind = _protocol_type(header, field)
    return kind if kind is not None and not issubclass(kind, enum.IntFlag) else None


def flag_enum(header, field):
    """The :class:`enum.IntFlag` whose bits a field holds (named in its doc), or ``None``."""
    kind = _protocol_type(header, field)
    return kind if kind is not None and issubclass(kind, enum.IntFlag) else None


def _flag_bits(flags):
    """Single-bit members of an IntFlag class, in value order."""
    members = [m for m in flags.__members__.values() if m.value and m.value & (m.value - 1) == 0]
    return sorted(members, key=lambda m: m.value)


# ---------------------------------------------------------------------------------------------
# Lua text helpers
# ---------------------------------------------------------------------------------------------

def _lua_str(text):
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _lua_set(values, key="0x{:02X}"):
    return "{ " + ", ".join(f"[{key.format(int(v))}] = true" for v in sorted(values)) + " }"


def _lua_names(pairs):
    return "{\n" + "".join(f"    [0x{int(k):02X}] = {_lua_str(v)},\n" for k, v in pairs) + "}"


def _is_bytes(header, field):
    """A byte-aligned field wider than 32 bits that is not 64 bits: shown as bytes."""
    bit_offset = header.bit_offset(field.name)
    return (field.bits > 32 and field.bits != 64 and bit_offset % 8 == 0
            and field.bits % 8 == 0)


def _field_spec(header, field):
    """Where a field sits: (byte offset, container bytes, bit offset in container, mask)."""
    bit_offset = header.bit_offset(field.name)
    start = bit_offset // 8
    length = (bit_offset + field.bits + 7) // 8 - start
    bit_in = bit_offset - 8 * start
    aligned = bit_in == 0 and field.bits == 8 * length
    if field.signed and not (aligned and length <= 4):
        raise ValueError(f"{header.name}.{field.name}: signed fields must be whole bytes, "
                         f"at most 4")
    if _is_bytes(header, field):
        return start, length, bit_in, None
    if field.bits > 32 and not (aligned and length == 8):
        raise ValueError(f"{header.name}.{field.name}: fields wider than 32 bits must be "
                         f"64 bits on a byte boundary, not {field.bits} bits at bit {bit_offset}")
    if length > 4 and not aligned:
        raise ValueError(f"{header.name}.{field.name} spans {length} bytes; unaligned fields "
                         f"must fit in 4 bytes")
    mask = None if aligned else ((1 << field.bits) - 1) << (8 * length - bit_in - field.bits)
    return start, length, bit_in, mask


_UINT_TYPES = {1: "uint8", 2: "uint16", 3: "uint24", 4: "uint32", 8: "uint64"}
_INT_TYPES = {1: "int8", 2: "int16", 3: "int24", 4: "int32"}

#: ``mrc.kind`` of every control opcode (its headers are hdl.packet.layouts.CONTROL_HEADERS).
CONTROL_KINDS = {
    P.Opcode.ACKNOWLEDGE: "ack",
    P.Opcode.ENDPOINT_REQUEST: "endpoint_request",
    P.Opcode.ENDPOINT_RESPONSE: "endpoint_response",
    P.Opcode.RELIABILITY_SACK: "sack",
    P.Opcode.RELIABILITY_NACK: "nack",
    P.Opcode.RELIABILITY_PROBE_REQUEST: "reliability_probe",
}


def _value_enums():
    """Every enumeration a decoded field's doc names, by name, in a stable order."""
    found = {}
    for header in DECODED_HEADERS:
        for field in header.fields:
            kind = value_enum(header, field)
            if kind is not None:
                found[kind.__name__] = kind
    return dict(sorted(found.items()))


def _control_table():
    rows = []
    for opcode, headers in sorted(L.CONTROL_HEADERS.items()):
        names = ", ".join(f"HEADERS[{_lua_str(h.name)}]" for h in headers)
        rows.append(f"    [0x{int(opcode):02X}] = {{ kind = {_lua_str(CONTROL_KINDS[opcode])}, "
                    f"headers = {{ {names} }} }},\n")
    return "{\n" + "".join(rows) + "}"


# ---------------------------------------------------------------------------------------------
# Generated sections
# ---------------------------------------------------------------------------------------------

def _constants():
    syndromes = [(P.AETH_ACK, "ACK")] + [(P.nak_syndrome(c), f"NAK {c.name}") for c in P.NakCode]
    return "\n".join([
        f"local ROCEV2_UDP_PORT = {P.ROCEV2_UDP_PORT}",
        f"local UDP_HEADER_BYTES = {UDP_HEADER_BYTES}",
        f"local BTH_BYTES = {L.BTH.size}",
        f"local ICRC_BYTES = {P.ICRC_BYTES}",
        f"local PSN_MODULUS = 0x{P.PSN_MODULUS:X}",
        f"local DEFAULT_TRIM_DSCP = {P.DEFAULT_TRIM_DSCP}",
        f"local SACK_BITMAP_INDEX = {[f.name for f in L.SETH.fields].index('sack_bitmap') + 1}",
        f"local AETH_KIND_MASK = 0x{P.AETH_KIND_MASK:02X}",
        f"local AETH_NAK_BASE = 0x{P.AETH_NAK_BASE:02X}",
        f"local NAK_CODE_MASK = 0x{(1 << P.NakCode.as_shape().width) - 1:02X}",
        f"local DATA_OPCODES = {_lua_set(P.DATA_OPCODES)}",
        f"local IMMEDIATE_OPCODES = {_lua_set(P.IMMEDIATE_OPCODES)}",
        f"local OPCODE_NAMES = "
        f"{_lua_names((o, o.name) for o in P.Opcode)}",
        f"local NAK_NAMES = {_lua_names((c, c.name) for c in P.NakCode)}",
        f"local SYNDROME_NAMES = {_lua_names(syndromes)}",
        "local VALUE_NAMES = {}",
        *(f"VALUE_NAMES.{name} = {_lua_names((v, v.name) for v in kind)}"
          for name, kind in _value_enums().items()),
    ])


def _header_fields(header):
    """ProtoFields of one header and its spec table, read by the generic decoder."""
    key = header.name.lower()
    lines = [
        f"-- {header.name}: {header.title}, {header.size} bytes",
        f"hf[{_lua_str(key)}] = ProtoField.none({_lua_str(header_abbrev(header))}, "
        f"{_lua_str(header.title)})",
    ]
    specs = []
    for field in header.fields:
        start, length, bit_in, mask = _field_spec(header, field)
        abbrev = field_abbrev(header, field.name)
        hf_key = f"{key}.{field.name}"
        flags = flag_enum(header, field)
        values = value_enum(header, field)
        valuestring = "nil"
        if header is L.AETH and field.name == "syndrome":
            valuestring = "SYNDROME_NAMES"
        elif values is not None:
            valuestring = f"VALUE_NAMES.{values.__name__}"
        display = "base.HEX" if flags is not None or valuestring != "nil" else "base.HEX_DEC"
        mask_text = "nil" if mask is None else f"0x{mask:X}"
        kind = ""
        if _is_bytes(header, field):
            kind = ", bytes = true"
            lines.append(
                f"hf[{_lua_str(hf_key)}] = ProtoField.bytes({_lua_str(abbrev)}, "
                f"{_lua_str(field.name)}, base.NONE, {_lua_str(field.doc)})")
        elif field.signed:
            kind = ", signed = true"
            lines.append(
                f"hf[{_lua_str(hf_key)}] = ProtoField.{_INT_TYPES[length]}({_lua_str(abbrev)}, "
                f"{_lua_str(field.name)}, base.DEC, nil, nil, {_lua_str(field.doc)})")
        else:
            lines.append(
                f"hf[{_lua_str(hf_key)}] = ProtoField.{_UINT_TYPES[length]}({_lua_str(abbrev)}, "
                f"{_lua_str(field.name)}, {display}, {valuestring}, {mask_text}, "
                f"{_lua_str(field.doc)})")
        flag_keys = []
        if flags is not None:
            for flag in _flag_bits(flags):
                flag_key = f"{hf_key}.{flag.name.lower()}"
                flag_keys.append(f"{{ key = {_lua_str(flag_key)}, mask = 0x{flag.value:X}, "
                                 f"name = {_lua_str(flag.name)} }}")
                lines.append(
                    f"hf[{_lua_str(flag_key)}] = ProtoField.bool("
                    f"{_lua_str(flag_abbrev(header, field, flag))}, {_lua_str(flag.name)}, "
                    f"{8 * length}, nil, 0x{flag.value:X})")
        flag_text = ("nil" if not flag_keys
                     else "{\n            " + ",\n            ".join(flag_keys) + " }")
        specs.append(
            f"        {{ name = {_lua_str(field.name)}, key = {_lua_str(hf_key)}, "
            f"offset = {start}, length = {length}, bit = {bit_in}, bits = {field.bits}{kind}, "
            f"flags = {flag_text} }},")
    table = (f"HEADERS[{_lua_str(header.name)}] = {{\n"
             f"    name = {_lua_str(header.name)}, key = {_lua_str(key)}, "
             f"size = {header.size},\n    fields = {{\n" + "\n".join(specs) + "\n    },\n}")
    return "\n".join(lines) + "\n" + table


def _bth_spec():
    # Only read, never added to the tree: Wireshark's InfiniBand dissector shows the BTH.
    specs = []
    for field in L.BTH.fields:
        start, length, bit_in, _ = _field_spec(L.BTH, field)
        specs.append(f"    {field.name} = {{ name = {_lua_str(field.name)}, offset = {start}, "
                     f"length = {length}, bit = {bit_in}, bits = {field.bits} }},")
    return "local BTH_FIELDS = {\n" + "\n".join(specs) + "\n}"


_SUMMARY_CONSTRUCTORS = {
    "string": "ProtoField.string({abbrev}, {name}, base.ASCII, {doc})",
    "bool": "ProtoField.bool({abbrev}, {name}, base.NONE, nil, nil, {doc})",
    "opcode": "ProtoField.uint8({abbrev}, {name}, base.HEX, OPCODE_NAMES, nil, {doc})",
    "uint32": "ProtoField.uint32({abbrev}, {name}, base.HEX_DEC, nil, nil, {doc})",
}


def _summary_fields():
    lines = []
    for abbrev, (kind, doc) in SUMMARY_FIELDS.items():
        key = abbrev.removeprefix("mrc.")
        text = _SUMMARY_CONSTRUCTORS[kind].format(
            abbrev=_lua_str(abbrev), name=_lua_str(key), doc=_lua_str(doc))
        lines.append(f"hf[{_lua_str(key)}] = {text}")
    return "\n".join(lines)


_PRELUDE = """\
-- Wireshark dissector for MRC 1.0 (multipath RoCEv2) transport headers, as mrc-nic sends them.
--
-- GENERATED by sim/dissector.py from hdl/packet/layouts.py and hdl/protocol.py: do not edit.
-- Regenerate with `python -m sim.dissector` or `mrc-nic dissector`.
--
-- A postdissector: Wireshark's own dissectors decode Ethernet, VLAN, IP/IPv6 (and SRv6), UDP
-- and the BTH (infiniband.bth.*); this one decodes what follows the BTH of every frame sent
-- to UDP port 4791. Load it with `tshark -X lua_script:mrc.lua` or put it in the plugins
-- folder. Preference: mrc.trim_dscp, the DSCP that marks a trimmed data packet.

local mrc = Proto("mrc", "Multipath Reliable Connection (MRC)")
"""

_BODY = Template("""\
mrc.prefs.trim_dscp = Pref.uint("Trim DSCP", DEFAULT_TRIM_DSCP,
    "Inner IP DSCP that marks a data packet trimmed by a switch (payload removed)")

local experts = {
    too_short = ProtoExpert.new("mrc.expert.too_short", "Frame too short for its MRC headers",
        expert.group.MALFORMED, expert.severity.ERROR),
    unsupported = ProtoExpert.new("mrc.expert.unsupported", "Opcode is not an MRC operation",
        expert.group.PROTOCOL, expert.severity.NOTE),
    length_mismatch = ProtoExpert.new("mrc.expert.length_mismatch",
        "Payload length differs from RETH dma_len", expert.group.PROTOCOL, expert.severity.WARN),
    extra_bytes = ProtoExpert.new("mrc.expert.extra_bytes", "Bytes after the last MRC header",
        expert.group.PROTOCOL, expert.severity.WARN),
    trimmed = ProtoExpert.new("mrc.expert.trimmed", "Payload trimmed by a switch",
        expert.group.SEQUENCE, expert.severity.NOTE),
}

local field_list = {}
for _, field in pairs(hf) do field_list[#field_list + 1] = field end
mrc.fields = field_list
local expert_list = {}
for _, e in pairs(experts) do expert_list[#expert_list + 1] = e end
mrc.experts = expert_list

local f_udp_srcport = Field.new("udp.srcport")
local f_udp_dstport = Field.new("udp.dstport")
local f_udp_length = Field.new("udp.length")
local f_ip_dscp = Field.new("ip.dsfield.dscp")
local f_ipv6_dscp = Field.new("ipv6.tclass.dscp")
local f_icmp = Field.new("icmp")
local f_icmpv6 = Field.new("icmpv6")

-- Portable bit operations: Wireshark's Lua version (and so its bit library) varies.
local function band(a, b)
    local result, bit = 0, 1
    while a > 0 and b > 0 do
        if a % 2 == 1 and b % 2 == 1 then result = result + bit end
        a, b, bit = math.floor(a / 2), math.floor(b / 2), bit * 2
    end
    return result
end

local function hex(value)
    if type(value) == "number" then return string.format("0x%X", value) end
    local digits = value:tohex():gsub("^0+", "")
    return "0x" .. (digits == "" and "0" or digits)
end

local function last(extractor)
    local all = { extractor() }
    return all[#all]
end

local function read_field(tvb, offset, spec)
    local range = tvb:range(offset + spec.offset, spec.length)
    if spec.bytes then return range:bytes() end
    if spec.signed then return range:int() end
    if spec.bits > 32 then return range:uint64() end
    if spec.bit == 0 and spec.bits == 8 * spec.length then return range:uint() end
    return range:bitfield(spec.bit, spec.bits)
end

-- The inner IP header's DSCP: the last IPv4/IPv6 DSCP before the UDP header.
local function inner_dscp(udp_offset)
    local best
    for _, extractor in ipairs({ f_ip_dscp, f_ipv6_dscp }) do
        for _, fi in ipairs({ extractor() }) do
            if fi.offset < udp_offset and (best == nil or fi.offset > best.offset) then
                best = fi
            end
        end
    end
    return best and best.value
end

local function flag_names(value, spec)
    local names = {}
    for _, flag in ipairs(spec.flags or {}) do
        if band(value, flag.mask) ~= 0 then names[#names + 1] = flag.name end
    end
    return names
end

-- ---------------------------------------------------------------------------------------------
-- Parsing: where each header is and what it holds; nothing is added to the tree yet, so the
-- summary fields can come first.
-- ---------------------------------------------------------------------------------------------

local Parse = {}
Parse.__index = Parse

local function new_parse(tvb, bth_offset, stop)
    return setmetatable({ tvb = tvb, bth_offset = bth_offset, offset = bth_offset,
                          stop = stop, parts = {}, info = {}, notes = {} }, Parse)
end

-- True when `bytes` more bytes are in the frame; otherwise records why it is malformed.
function Parse:need(what, bytes)
    if self.offset + bytes <= self.stop then return true end
    self.malformed = string.format("%s needs %d bytes at offset %d from the BTH, the frame "
        .. "has %d", what, bytes, self.offset - self.bth_offset,
        math.max(self.stop - self.offset, 0))
    return false
end

function Parse:header(header)
    if not self:need(header.name, header.size) then return nil end
    local values = {}
    for _, spec in ipairs(header.fields) do
        values[spec.name] = read_field(self.tvb, self.offset, spec)
    end
    self.parts[#self.parts + 1] = { header = header, offset = self.offset, values = values }
    self.offset = self.offset + header.size
    return values
end

-- The PSNs of a SACK's bitmap: bit i (value 2^i of the 64-bit field) is PSN base + i.
function Parse:sack_psns(part, base)
    local spec = part.header.fields[SACK_BITMAP_INDEX]
    local range = self.tvb:range(part.offset + spec.offset, spec.length)
    local psns = {}
    for index = 0, 8 * spec.length - 1 do
        local byte = range:range(spec.length - 1 - math.floor(index / 8), 1):uint()
        if band(byte, 2 ^ (index % 8)) ~= 0 then
            psns[#psns + 1] = (base + index) % PSN_MODULUS
        end
    end
    return psns
end

-- The ICRC ends the UDP payload; `payload` says whether bytes may sit before it.
function Parse:icrc(payload)
    if not self:need("ICRC", ICRC_BYTES) then return false end
    local between = self.stop - self.offset - ICRC_BYTES
    if payload then
        self.payload_len = between
    elseif between > 0 then
        self.notes[#self.notes + 1] = { experts.extra_bytes,
            string.format("%d bytes after the last header, before the ICRC", between) }
    end
    self.icrc_offset = self.stop - ICRC_BYTES
    return true
end

function Parse:add_info(text) self.info[#self.info + 1] = text end

-- Data: METH, TSETH when BTH.ts, RETH, ImmDt on the immediate opcodes, payload.
local function parse_data(p, opcode, trim_dscp)
    p.kind = "data"
    p:add_info(OPCODE_NAMES[opcode])
    p:add_info("QP=" .. hex(p.dqpn))
    p:add_info("PSN=" .. hex(p.psn))
    local dscp = inner_dscp(p.udp_offset)
    p.trimmed = dscp ~= nil and dscp == trim_dscp
    p.retransmission = p.bth.${rtx} ~= 0
    local meth = p:header(${METH})
    if not meth then return end
    p:add_info("MSN=" .. meth.${meth_msn})
    if p.bth.${ts} ~= 0 and not p:header(${TSETH}) then return end
    local reth = p:header(${RETH})
    if not reth then return end
    p:add_info("va=" .. hex(reth.${va}))
    p:add_info("dma_len=" .. reth.${dma_len})
    if IMMEDIATE_OPCODES[opcode] and not p:header(${IMMDT}) then return end
    if p.retransmission then p:add_info("[RTX]") end
    if not p:icrc(true) then return end
    if p.trimmed then
        p.notes[#p.notes + 1] = { experts.trimmed }
    elseif p.payload_len ~= reth.${dma_len} then
        p.notes[#p.notes + 1] = { experts.length_mismatch, string.format(
            "Payload is %d bytes, RETH dma_len says %d", p.payload_len, reth.${dma_len}) }
    end
end

local CONTROL = ${CONTROL}

-- Control packets: exactly their headers (the opcode table), no payload.
local function parse_control(p, opcode)
    local entry = CONTROL[opcode]
    p.kind = entry.kind
    p:add_info(OPCODE_NAMES[opcode])
    p:add_info("QP=" .. hex(p.dqpn))
    p:add_info("PSN=" .. hex(p.psn))
    for _, header in ipairs(entry.headers) do
        local values = p:header(header)
        if not values then return end
        if header == ${AETH} then
            if band(values.${syndrome}, AETH_KIND_MASK) == AETH_NAK_BASE then
                local code = band(values.${syndrome}, NAK_CODE_MASK)
                p.kind = "nak"
                p.nak_code = NAK_NAMES[code] or string.format("UNKNOWN_%d", code)
                p:add_info("NAK " .. p.nak_code)
            end
            p:add_info("MSN=" .. values.${msn})
        elseif header == ${SETH} then
            local base = (values.${cack_psn} + values.${sack_psn_offset}) % PSN_MODULUS
            p:add_info("cack_psn=" .. hex(values.${cack_psn}))
            if values.${pr} ~= 0 then
                p:add_info("probe_id=" .. hex(values.${ack_psn_offset} % 0x10000))
            else
                p.ack_psn = (values.${cack_psn} + values.${ack_psn_offset}) % PSN_MODULUS
                p:add_info("ack_psn=" .. hex(p.ack_psn))
            end
            p.sack_psn = p:sack_psns(p.parts[#p.parts], base)
            p:add_info("sacked=" .. #p.sack_psn)
        elseif header == ${NETH} then
            p:add_info(VALUE_NAMES.NackReason[values.${nack_reason}]
                or string.format("reason 0x%02X", values.${nack_reason}))
        elseif header == ${PETH} then
            p:add_info("probe_id=" .. hex(values.${probe_id}))
        end
    end
    p:icrc(false)
end

-- ---------------------------------------------------------------------------------------------
-- Tree
-- ---------------------------------------------------------------------------------------------

local function generated(tree, key, value)
    local item = tree:add(hf[key], value)
    item:set_generated()
    return item
end

local function add_parts(root, p)
    for _, part in ipairs(p.parts) do
        local header = part.header
        local subtree = root:add(hf[header.key], p.tvb:range(part.offset, header.size))
        for _, spec in ipairs(header.fields) do
            local range = p.tvb:range(part.offset + spec.offset, spec.length)
            local item = subtree:add(hf[spec.key], range)
            for _, flag in ipairs(spec.flags or {}) do item:add(hf[flag.key], range) end
        end
    end
end

function mrc.dissector(tvb, pinfo, tree)
    local dstport = last(f_udp_dstport)
    local srcport = last(f_udp_srcport)
    if dstport == nil or srcport == nil or dstport.value ~= ROCEV2_UDP_PORT then return 0 end
    -- A UDP header quoted inside an ICMP error is not an MRC packet.
    if last(f_icmp) ~= nil or last(f_icmpv6) ~= nil then return 0 end
    local source = srcport.source or tvb
    local udp_offset = srcport.offset
    local bth_offset = udp_offset + UDP_HEADER_BYTES
    local stop = source:len()
    local udp_length = last(f_udp_length)
    if udp_length ~= nil and udp_offset + udp_length.value < stop then
        stop = udp_offset + udp_length.value    -- Ethernet padding is not ours
    end
    if bth_offset > stop then return 0 end

    local p = new_parse(source, bth_offset, stop)
    p.udp_offset = udp_offset
    local opcode
    if p:need("BTH", BTH_BYTES) then
        opcode = read_field(source, bth_offset, BTH_FIELDS.${opcode})
        p.dqpn = read_field(source, bth_offset, BTH_FIELDS.${dqpn})
        p.psn = read_field(source, bth_offset, BTH_FIELDS.${psn})
        p.bth = {}
        for name, spec in pairs(BTH_FIELDS) do
            p.bth[name] = read_field(source, bth_offset, spec)
        end
        p.offset = bth_offset + BTH_BYTES
        if DATA_OPCODES[opcode] then
            parse_data(p, opcode, mrc.prefs.trim_dscp)
        elseif CONTROL[opcode] then
            parse_control(p, opcode)
        else
            p.kind = "unsupported"
            p:add_info(string.format("unsupported opcode 0x%02X", opcode))
            p.notes[#p.notes + 1] = { experts.unsupported, string.format("opcode 0x%02X", opcode) }
        end
    end
    if p.malformed then p:add_info("[MALFORMED]") end
    if p.trimmed then p:add_info("[TRIMMED]") end
    local info = table.concat(p.info, " ")

    local root = tree:add(mrc, source:range(bth_offset, stop - bth_offset))
    root:append_text(", " .. info)
    if p.kind then generated(root, "kind", p.kind) end
    if opcode then generated(root, "opcode", opcode) end
    if p.nak_code then generated(root, "nak_code", p.nak_code) end
    if p.kind == "data" then generated(root, "trimmed", p.trimmed) end
    if p.retransmission ~= nil then generated(root, "retransmission", p.retransmission) end
    if p.payload_len ~= nil then generated(root, "payload_len", p.payload_len) end
    if p.ack_psn ~= nil then generated(root, "ack_psn", p.ack_psn) end
    for _, psn in ipairs(p.sack_psn or {}) do generated(root, "sack_psn", psn) end
    if p.malformed then
        local item = generated(root, "malformed", true)
        item:add_proto_expert_info(experts.too_short, p.malformed)
    end
    add_parts(root, p)
    if p.icrc_offset then root:add(hf["icrc"], source:range(p.icrc_offset, ICRC_BYTES)) end
    for _, note in ipairs(p.notes) do
        if note[2] then
            root:add_proto_expert_info(note[1], note[2])
        else
            root:add_proto_expert_info(note[1])
        end
    end

    pinfo.cols.protocol = "MRC"
    pinfo.cols.info = "MRC " .. info
    return stop - bth_offset
end

register_postdissector(mrc, true)
""")


def _body():
    def name(header, field_name):
        return header.field(field_name).name

    return _BODY.substitute(
        {h.name.upper(): f"HEADERS[{_lua_str(h.name)}]" for h in DECODED_HEADERS},
        va=name(L.RETH, "va"), dma_len=name(L.RETH, "dma_len"),
        syndrome=name(L.AETH, "syndrome"), msn=name(L.AETH, "msn"),
        opcode=name(L.BTH, "opcode"), dqpn=name(L.BTH, "dqpn"), psn=name(L.BTH, "psn"),
        rtx=name(L.BTH, "rtx"), ts=name(L.BTH, "ts"), meth_msn=name(L.METH, "msn"),
        cack_psn=name(L.SETH, "cack_psn"), sack_psn_offset=name(L.SETH, "sack_psn_offset"),
        ack_psn_offset=name(L.SETH, "ack_psn_offset"), pr=name(L.SETH, "pr"),
        nack_reason=name(L.NETH, "nack_reason"), probe_id=name(L.PETH, "probe_id"),
        CONTROL=_control_table(),
    )


def generate_lua():
    """The complete Lua source of the ``mrc`` dissector."""
    sections = [
        _PRELUDE,
        _banner("Constants (hdl.protocol)"),
        _constants(),
        _banner("Header layouts and fields (hdl.packet.layouts)"),
        "local hf = {}\nlocal HEADERS = {}\n" + _bth_spec(),
        *(_header_fields(h) for h in DECODED_HEADERS),
        _banner("Summary fields"),
        _summary_fields(),
        _banner("Decoder"),
        _body(),
    ]
    return "\n\n".join(s.rstrip("\n") for s in sections) + "\n"


def _banner(title):
    rule = "-- " + "-" * 93
    return f"{rule}\n-- {title}\n{rule}"


def write_lua(path=DEFAULT_LUA_PATH):
    """Write :func:`generate_lua` to ``path`` (creating its folder); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(generate_lua(), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def register(subparsers):
    """Add the ``dissector`` command to the ``mrc-nic`` command line."""
    parser = subparsers.add_parser(
        "dissector", help="write the Wireshark Lua dissector",
        description="Generate the Wireshark dissector for MRC's headers from the layout "
                    "table. Use it with: tshark -X lua_script:PATH")
    parser.add_argument("--out", type=Path, default=DEFAULT_LUA_PATH, metavar="PATH",
                        help="Lua file to write (default: sim/wireshark/mrc.lua)")
    parser.set_defaults(func=handler)
    return parser


def handler(args):
    """Write the Lua file; exit status 0, or 2 with one error line (as :mod:`sim.errors`
    reports user errors) when the path cannot be written."""
    try:
        path = write_lua(args.out)
    except OSError as error:
        return fail(f"cannot write {args.out}: {error.strerror}", field="--out")
    print(f"wrote {path}")
    return 0


def main(argv=None):
    """``python -m sim.dissector [--out PATH]``: the same as ``mrc-nic dissector``."""
    from .cli import main as mrc_nic
    return mrc_nic(["dissector", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())


#: tshark's only stderr line when run as root; anything else on stderr is a problem (a Lua
#: script that fails to load still lets tshark exit 0).
TSHARK_ROOT_NOTICE = re.compile(
    r'^Running as user "root" and group "root"\. This could be dangerous\.$')


def tshark_errors(stderr):
    """The lines of tshark's stderr that report a problem (everything but the root notice)."""
    return [line for line in stderr.splitlines() if line and not TSHARK_ROOT_NOTICE.match(line)]
