"""The register map's exports (C header, JSON, CMSIS-SVD) and ``mrc-nic registers``: each is
the Python register map, checked against it field by field."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hdl.config import NicConfig
from hdl.control.export import JSON_FORMAT, JSON_VERSION, to_c_header, to_json, to_svd
from hdl.control.nicmap import nic_register_map
from hdl.control.regmap import WORD_BITS, WORD_BYTES, CommandBlock, ControlBlock, QueueBlock
from sim.cli import main

CONFIGS = {"default": NicConfig(), "small": NicConfig(qps=4, ports=2, ip_version=4)}


@pytest.fixture(params=sorted(CONFIGS))
def regmap(request):
    return nic_register_map(CONFIGS[request.param])


def expected_fields(regmap):
    """``[(block, register name, field name, bit, width, reset)]`` derived from the map's field
    placement (``to_dict``), not from its word-level view: every field cut at word boundaries,
    in the register the words are named after."""
    out = []
    for name, entry in regmap.to_dict().items():
        block = regmap.block(name)
        if isinstance(block, CommandBlock):
            parts = [("ARGS", entry["request"], {}), ("RESULT", entry["response"], {})]
        elif isinstance(block, QueueBlock):
            parts = [("DATA", entry["fields"], {})]
        else:
            parts = [("WORD", entry["fields"],
                      entry.get("init", {}) if isinstance(block, ControlBlock) else {})]
        for prefix, fields, init in parts:
            per_word = {}
            for path, offset, width in fields:
                lsb = 0
                while lsb < width:
                    word, bit = divmod(offset + lsb, WORD_BITS)
                    length = min(width - lsb, WORD_BITS - bit)
                    field = path.replace("[", "_").replace("]", "").replace(".", "_")
                    if width > WORD_BITS:
                        field += f"_w{lsb // WORD_BITS}"
                    reset = (init.get(path, 0) >> lsb) & ((1 << length) - 1)
                    per_word.setdefault(word, []).append((field, bit, length, reset))
                    lsb += length
            for word, pieces in per_word.items():
                register = f"{prefix}{word}"
                if prefix == "WORD" and len(pieces) == 1:
                    register = pieces[0][0].upper()
                out += [(name, register, *piece) for piece in pieces]
    return out


# ---------------------------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------------------------

def test_no_field_of_the_nic_map_straddles_a_word(regmap):
    for name, entry in regmap.to_dict().items():
        for part in ("request", "response", "fields"):
            for path, offset, width in entry.get(part, ()):
                if width > WORD_BITS:
                    assert offset % WORD_BITS == 0, (name, path)
                else:
                    assert offset // WORD_BITS == (offset + width - 1) // WORD_BITS, (name, path)


# ---------------------------------------------------------------------------------------------
# C header
# ---------------------------------------------------------------------------------------------

def c_checks(regmap):
    """A C file that includes the header and checks its macros with static asserts."""
    lines = ['#include "mrc_nic_regs.h"', ""]

    def check(expression, value):
        lines.append(f"_Static_assert(({expression}) == {value}u, \"{expression}\");")

    to_dict = regmap.to_dict()
    for name, entry in to_dict.items():
        block = f"MRC_{name.upper()}"
        check(f"{block}_BASE", entry["base"] * WORD_BYTES)
        if entry["kind"] == "CommandBlock":
            check(f"{block}_STATUS_ADDR", entry["base"] * WORD_BYTES)
            check(f"{block}_GO_ADDR", (entry["base"] + 1) * WORD_BYTES)
            check(f"{block}_ARGS0_ADDR", (entry["base"] + entry["args"]) * WORD_BYTES)
            check(f"{block}_RESULT0_ADDR", (entry["base"] + entry["response_base"]) * WORD_BYTES)
            check(f"{block}_ARGS_COUNT", entry["request_words"])
            check(f"{block}_RESULT_COUNT", entry["response_words"])
            for member, code in (entry["commands"] or {}).items():
                field = "CMD" if any(p == "cmd" for p, _, _ in entry["request"]) else "OP"
                check(f"{block}_ARGS0_{field}_{member}", code)
    for name, register, field, bit, width, reset in expected_fields(regmap):
        macro = f"MRC_{name.upper()}_{register}_{field.upper()}"
        mask = ((1 << width) - 1) << bit
        check(f"{macro}_SHIFT", bit)
        check(f"{macro}_WIDTH", width)
        check(f"{macro}_MASK", mask)
        check(f"{macro}_RESET", reset)
        # The accessors put a value in place and take it out again.
        check(f"MRC_SET({macro}, 0xFFFFFFFFu, 0)", 0xFFFFFFFF & ~mask)
        check(f"MRC_GET({macro}, MRC_SET({macro}, 0u, {(1 << width) - 1}u))", (1 << width) - 1)
    settings = regmap.registers("settings")[0]
    check("MRC_SETTINGS_WORD0_RESET", regmap.reset_value("settings") & 0xFFFFFFFF)
    check("MRC_SETTINGS_WORD0_ADDR", settings.word * WORD_BYTES)
    lines += ["", "int main(void)", "{",
              "    return (int)MRC_GET(MRC_SETTINGS_WORD0_TRIM_DSCP, MRC_SETTINGS_WORD0_RESET) "
              f"- {int(regmap.block('settings').init['trim_dscp'])};",
              "}", ""]
    return "\n".join(lines)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: run make setup")
def test_c_header_compiles_and_its_macros_are_the_map(regmap, tmp_path):
    (tmp_path / "mrc_nic_regs.h").write_text(to_c_header(regmap))
    (tmp_path / "check.c").write_text(c_checks(regmap))
    result = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                             "-o", str(tmp_path / "check"), str(tmp_path / "check.c")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[:4000]
    # The reset value read back through MRC_GET is the configured DSCP.
    assert subprocess.run([str(tmp_path / "check")], timeout=60).returncode == 0


def test_c_header_has_an_include_guard_and_the_prefix():
    text = to_c_header(nic_register_map(NicConfig()))
    assert text.splitlines()[text.splitlines().index("#ifndef MRC_NIC_REGS_H") + 1] == \
        "#define MRC_NIC_REGS_H"
    assert text.rstrip().endswith("#endif /* MRC_NIC_REGS_H */")
    defines = [line.split()[1] for line in text.splitlines() if line.startswith("#define ")]
    assert all(name.startswith("MRC_") for name in defines)
    assert len(set(defines)) == len(defines)


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------

def normalized(value):
    return json.loads(json.dumps(value))


def test_json_round_trips_to_the_map(regmap):
    document = json.loads(to_json(regmap))
    assert document["format"] == JSON_FORMAT and document["version"] == JSON_VERSION
    assert document["word_bits"] == WORD_BITS and document["address_unit_bits"] == 8
    assert document["block_words"] == regmap.block_words
    assert document["address_bits"] == regmap.address_bits
    assert list(document["blocks"]) == [block.name for block in regmap.blocks]
    assert document["blocks"] == normalized(regmap.to_dict())
    for block in regmap.blocks:
        entry = document["blocks"][block.name]
        assert entry["base"] == regmap.base(block.name) and entry["words"] == block.words
        parts = ([("request", block.request_fields), ("response", block.response_fields)]
                 if isinstance(block, CommandBlock) else [("fields", block.fields)])
        for part, fields in parts:
            assert entry[part] == [[f.path, f.offset, f.width] for f in fields]
    # The word-level view agrees with the field positions.
    seen = [(name, register["name"], field["name"], field["bit"], field["width"], field["reset"])
            for name, entry in document["blocks"].items() for register in entry["registers"]
            for field in register["fields"]
            if register["name"] not in ("STATUS", "GO", "POP")]
    assert sorted(seen) == sorted(expected_fields(regmap))


def test_json_is_stable():
    assert to_json(nic_register_map(NicConfig())) == to_json(nic_register_map(NicConfig()))


# ---------------------------------------------------------------------------------------------
# SVD
# ---------------------------------------------------------------------------------------------

def test_svd_validates_against_the_cmsis_svd_1_3_schemas(regmap):
    from cmsis_svd.parser import SVD_SCHEMA_VERSIONS, SVDParser
    text = to_svd(regmap).encode()
    versions = sorted(v for v in SVD_SCHEMA_VERSIONS if v.startswith("1.3"))
    assert versions
    for version in versions:
        valid, errors = SVDParser.validate_xml_str(text, schema_version=version,
                                                   schema_version_detection=False)
        assert valid, errors[:2000]


def test_svd_fields_are_the_map(regmap, tmp_path):
    from cmsis_svd.parser import SVDParser
    path = tmp_path / "mrc_nic.svd"
    path.write_text(to_svd(regmap))
    device = SVDParser.for_xml_file(path).get_device()
    assert device.address_unit_bits == 8 and device.width == 32
    access = {"R": "read-only", "W": "write-only", "RW": "read-write"}
    assert [p.name for p in device.peripherals] == [b.name.upper() for b in regmap.blocks]
    found = []
    for peripheral, block in zip(device.peripherals, regmap.blocks, strict=True):
        assert peripheral.base_address == regmap.base(block.name) * WORD_BYTES
        for svd, register in zip(peripheral.registers, regmap.registers(block.name),
                                 strict=True):
            assert (svd.name, svd.address_offset, svd.size, svd.access.value,
                    svd.reset_value) == (register.name, register.word * WORD_BYTES, 32,
                                         access[register.access], register.reset)
            for field in svd.fields:
                assert field.bit_offset + field.bit_width <= WORD_BITS
                if register.name not in ("STATUS",):
                    found.append((block.name, svd.name, field.name.lower(), field.bit_offset,
                                  field.bit_width))
                if field.enumerated_values:
                    enum = {e.name: e.value for e in field.enumerated_values[0]
                            .enumerated_values}
                    piece = next(p for p in register.fields if p.name.upper() == field.name)
                    assert enum == {m.name: int(m.value) for m in piece.enum}
    assert sorted(found) == sorted((name, register, field.lower(), bit, width) for
                                   name, register, field, bit, width, _ in
                                   expected_fields(regmap))


# ---------------------------------------------------------------------------------------------
# mrc-nic registers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, render", [
    ("md", lambda m: m.markdown()), ("json", to_json), ("c", to_c_header), ("svd", to_svd)])
def test_registers_command_writes_each_format(fmt, render, tmp_path, capsys):
    config = tmp_path / "nic.json"
    config.write_text(json.dumps(CONFIGS["small"].to_dict()))
    out = tmp_path / f"regs.{fmt}"
    assert main(["registers", "--format", fmt, "--config", str(config), "--out", str(out)]) == 0
    assert out.read_text() == render(nic_register_map(CONFIGS["small"]))
    assert main(["registers", "--format", fmt]) == 0
    assert capsys.readouterr().out.endswith(render(nic_register_map(NicConfig())))


def test_registers_default_format_is_the_docs_page(capsys):
    assert main(["registers"]) == 0
    assert capsys.readouterr().out == nic_register_map(NicConfig()).markdown()


def _bad_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"qps": 4')
    return path


def _bad_value(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"qps": 3}')
    return path


@pytest.mark.parametrize("args, flag, message", [
    (lambda tmp: ["--format", "xml"], "--format", "must be one of md, json, c, svd, not 'xml'"),
    (lambda tmp: ["--config", str(tmp / "missing.json")], "--config", "cannot read"),
    (lambda tmp: ["--config", str(_bad_json(tmp))], "--config", "not valid JSON"),
    (lambda tmp: ["--config", str(_bad_value(tmp))], "--config", "qps"),
    (lambda tmp: ["--out", str(tmp / "no" / "such" / "dir.h")], "--out", "cannot write"),
])
def test_registers_command_errors_are_one_line(args, flag, message, tmp_path, capsys):
    assert main(["registers", *args(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"mrc-nic registers: {flag}: ") and message in err


def test_docs_page_has_the_export_commands():
    text = (Path(__file__).resolve().parents[2] / "docs" / "registers.md").read_text()
    for fmt in ("md", "json", "c", "svd"):
        assert f"mrc-nic registers --format {fmt}" in text
