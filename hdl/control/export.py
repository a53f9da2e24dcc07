"""Exports of a :class:`~hdl.control.regmap.RegisterMap` for drivers and register viewers: a C
header, JSON and CMSIS-SVD 1.3, each generated from the same description as the bus decoder
and ``docs/registers.md``. Addresses are byte addresses (bus word ``w`` at byte ``4 * w``).

JSON
----
:func:`to_json` writes one object, keys in a fixed order:

``format``
    ``"mrc-nic-registers"``.
``version``
    1. Raised when a key changes meaning or goes; new keys may appear without it.
``title``, ``word_bits`` (32), ``address_unit_bits`` (8: addresses below count bytes where
they say ``byte``), ``address_bits`` (of the word-addressed bus), ``block_words`` (the stride
between blocks, in words).
``blocks``
    :meth:`RegisterMap.to_dict`, by block name in address order. Each block has ``base`` (its
    first word), ``kind`` (``CommandBlock``, ``StatusBlock``, ``ControlBlock``,
    ``QueueBlock``), ``doc``, ``words`` (its length) and ``registers``. Command blocks add
    ``request`` and ``response`` (``[path, offset, width]`` per field: bit ``offset`` from the
    first argument or result word), ``args`` and ``response_base`` (their first words, from
    ``base``), ``request_words``, ``response_words`` and ``commands`` (``{name: code}`` of the
    ``cmd``/``op`` field, or null); the other kinds add ``fields`` (the same triples, from
    ``base``; for a queue, from its ``data`` word). Control blocks add ``init`` (reset values
    by field).
``registers``
    One entry per 32-bit word of the block: ``name``, ``word`` and ``byte_offset`` (from the
    block's base), ``access`` (``R``, ``W`` or ``RW``), ``reset``, ``doc``, ``fields``. A field
    entry has ``name`` (an identifier), ``path`` (the layout field it shows), ``bit``,
    ``width``, ``lsb`` (the first bit of ``path`` it holds: fields wider than 32 bits span
    several registers), ``field_width``, ``access``, ``reset`` and ``enum`` (``{name: value}``
    or null).
"""

import json
from xml.sax.saxutils import escape

from .regmap import WORD_BITS, WORD_BYTES, CommandBlock

__all__ = ["to_json", "to_c_header", "to_svd", "JSON_FORMAT", "JSON_VERSION", "C_PREFIX"]

JSON_FORMAT = "mrc-nic-registers"
JSON_VERSION = 1
C_PREFIX = "MRC_"

_ACCESS_SVD = {"R": "read-only", "W": "write-only", "RW": "read-write"}


def to_json(regmap):
    """The register map as JSON text (see the module docstring)."""
    document = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "title": regmap.title,
        "word_bits": WORD_BITS,
        "address_unit_bits": 8,
        "address_bits": regmap.address_bits,
        "block_words": regmap.block_words,
        "blocks": regmap.to_dict(),
    }
    return json.dumps(document, indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# C header
# ---------------------------------------------------------------------------------------------

def _c_name(*parts):
    return "_".join(str(part).upper() for part in parts)


def _hex(value, digits=8):
    return f"0x{value:0{digits}X}u"


def _comment(text):
    return " ".join(text.replace("*/", "* /").split())


def to_c_header(regmap, *, prefix=C_PREFIX, guard=None):
    """The register map as a C11 header: byte addresses, per-field shift/width/mask/reset
    macros, enum values, ``MRC_GET``/``MRC_SET`` and volatile read/write helpers."""
    stem = prefix.rstrip("_")
    guard = guard or f"{stem}_NIC_REGS_H"
    lines = [
        f"/* {_comment(regmap.title)}.",
        " *",
        " * Generated from hdl/control/nicmap.py by `mrc-nic registers --format c`; do not edit.",
        " *",
        " * Addresses are in bytes: the register bus is word-addressed (32-bit words), word w",
        f" * at byte {stem}_BASE + 4 * w. Per register: _OFFSET (from its block's _BASE), _ADDR",
        " * and _RESET. Per field: _SHIFT, _WIDTH, _MASK (in place) and _RESET; a field wider",
        " * than 32 bits is split in pieces _W0, _W1, ... from its least significant word.",
        f" * Access: R read-only, W write-only, RW read/write. {stem}_GET(FIELD, reg) and",
        f" * {stem}_SET(FIELD, reg, value) take a field's macro name without its suffix.",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdint.h>",
        "",
        f"#ifndef {stem}_BASE",
        f"#define {stem}_BASE {_hex(0)}",
        "#endif",
        "",
        f"#define {stem}_WORD_BITS {WORD_BITS}u",
        f"#define {stem}_BLOCK_BYTES {_hex(regmap.block_words * WORD_BYTES, 4)}",
        "",
        f"#define {stem}_GET(field, reg) \\",
        "    (((uint32_t)(reg) & field##_MASK) >> field##_SHIFT)",
        f"#define {stem}_SET(field, reg, value) \\",
        "    (((uint32_t)(reg) & ~(uint32_t)field##_MASK) | \\",
        "     (((uint32_t)(value) << field##_SHIFT) & field##_MASK))",
        "",
        f"static inline uint32_t {stem.lower()}_read32(uintptr_t address)",
        "{",
        "    return *(volatile const uint32_t *)address;",
        "}",
        "",
        f"static inline void {stem.lower()}_write32(uintptr_t address, uint32_t value)",
        "{",
        "    *(volatile uint32_t *)address = value;",
        "}",
    ]
    for block in regmap.blocks:
        block_name = _c_name(stem, block.name)
        base = regmap.base(block.name) * WORD_BYTES
        lines += ["", f"/* ---- {block.name} ({type(block).__name__}): {_comment(block.doc)} */",
                  f"#define {block_name}_BASE ({stem}_BASE + {_hex(base, 4)})"]
        if isinstance(block, CommandBlock):
            lines += [f"#define {block_name}_ARGS_COUNT {block.request_words}u",
                      f"#define {block_name}_RESULT_COUNT {block.response_words}u"]
        for register in regmap.registers(block.name):
            name = _c_name(block_name, register.name)
            lines += ["", f"/* {register.name} ({register.access}): {_comment(register.doc)} */",
                      f"#define {name}_OFFSET {_hex(register.word * WORD_BYTES, 4)}",
                      f"#define {name}_ADDR ({block_name}_BASE + {name}_OFFSET)",
                      f"#define {name}_RESET {_hex(register.reset)}"]
            for piece in register.fields:
                field = _c_name(name, piece.name)
                what = piece.path if piece.width == piece.field_width else \
                    f"bits {piece.lsb + piece.width - 1}:{piece.lsb} of {piece.path}"
                mask = ((1 << piece.width) - 1) << piece.bit
                lines += [f"/* {what} ({piece.access}) */",
                          f"#define {field}_SHIFT {piece.bit}u",
                          f"#define {field}_WIDTH {piece.width}u",
                          f"#define {field}_MASK {_hex(mask)}",
                          f"#define {field}_RESET {_hex(piece.reset)}"]
                for member in piece.enum or ():
                    lines.append(f"#define {_c_name(field, member.name)} {int(member.value)}u")
    lines += ["", f"#endif /* {guard} */", ""]
    defined = [line.split()[1] for line in lines if line.startswith("#define ")]
    clashes = sorted({name for name in defined if defined.count(name) > 1})
    if clashes:
        raise ValueError(f"C macro names clash (an enum value named like a suffix?): {clashes}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CMSIS-SVD 1.3
# ---------------------------------------------------------------------------------------------

def _svd_name(text):
    return text.upper()


def to_svd(regmap, *, device="MRC_NIC", version="0.1.0", base_address=0):
    """The register map as a CMSIS-SVD 1.3 device: one peripheral per block at its byte
    address (plus ``base_address``), one 32-bit register per word, fields with enumerated
    values where the field has an enum."""
    def text(tag, value, indent):
        return f"{' ' * indent}<{tag}>{escape(str(value))}</{tag}>"

    lines = [
        '<?xml version="1.0" encoding="utf-8"?>',
        '<device schemaVersion="1.3" '
        'xmlns:xs="http://www.w3.org/2001/XMLSchema-instance" '
        'xs:noNamespaceSchemaLocation="CMSIS-SVD.xsd">',
        text("name", device, 2),
        text("version", version, 2),
        text("description", f"{regmap.title}: generated from hdl/control/nicmap.py by "
                            f"mrc-nic registers --format svd; do not edit.", 2),
        text("addressUnitBits", 8, 2),
        text("width", WORD_BITS, 2),
        text("size", WORD_BITS, 2),
        text("access", "read-write", 2),
        text("resetValue", "0x00000000", 2),
        text("resetMask", "0xFFFFFFFF", 2),
        "  <peripherals>",
    ]
    for block in regmap.blocks:
        base = base_address + regmap.base(block.name) * WORD_BYTES
        lines += [
            "    <peripheral>",
            text("name", _svd_name(block.name), 6),
            text("description", f"{type(block).__name__}: {block.doc}", 6),
            text("groupName", type(block).__name__, 6),
            text("baseAddress", f"0x{base:08X}", 6),
            "      <addressBlock>",
            text("offset", "0x0", 8),
            text("size", f"0x{block.words * WORD_BYTES:X}", 8),
            text("usage", "registers", 8),
            "      </addressBlock>",
            "      <registers>",
        ]
        for register in regmap.registers(block.name):
            lines += [
                "        <register>",
                text("name", register.name, 10),
                text("description", register.doc, 10),
                text("addressOffset", f"0x{register.word * WORD_BYTES:X}", 10),
                text("size", WORD_BITS, 10),
                text("access", _ACCESS_SVD[register.access], 10),
                text("resetValue", f"0x{register.reset:08X}", 10),
                text("resetMask", "0xFFFFFFFF", 10),
            ]
            if register.fields:
                lines.append("          <fields>")
                for piece in register.fields:
                    what = piece.path if piece.width == piece.field_width else \
                        f"bits {piece.lsb + piece.width - 1}:{piece.lsb} of {piece.path}"
                    lines += [
                        "            <field>",
                        text("name", _svd_name(piece.name), 14),
                        text("description", what, 14),
                        text("bitOffset", piece.bit, 14),
                        text("bitWidth", piece.width, 14),
                        text("access", _ACCESS_SVD[piece.access], 14),
                    ]
                    if piece.enum:
                        lines.append("              <enumeratedValues>")
                        for member in piece.enum:
                            lines += ["                <enumeratedValue>",
                                      text("name", member.name, 18),
                                      text("description", member.name, 18),
                                      text("value", int(member.value), 18),
                                      "                </enumeratedValue>"]
                        lines.append("              </enumeratedValues>")
                    lines.append("            </field>")
                lines.append("          </fields>")
            lines.append("        </register>")
        lines += ["      </registers>", "    </peripheral>"]
    lines += ["  </peripherals>", "</device>", ""]
    return "\n".join(lines)
