"""NicConfig: defaults are the flagship configuration; every bad value names its field."""

import json

import pytest

from hdl.config import ConfigError, NicConfig
from hdl.protocol import local_ack_timeout_ns, psn_add, psn_diff, psn_lt


def test_defaults_are_the_flagship_configuration():
    config = NicConfig()
    assert (config.data_width, config.ports, config.qps) == (64, 8, 256)
    assert config.window_psns == 256
    assert config.line_rate_bps == 64 * 125_000_000


@pytest.mark.parametrize("field, value, message", [
    ("data_width", 32, "must be one of 64, 128, 256, not 32"),
    ("ports", 0, "must be an integer from 1 to 16, not 0"),
    ("ports", 17, "must be an integer from 1 to 16, not 17"),
    ("qps", 300, "must be one of 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, not 300"),
    ("mpr_units", 9, "must be an integer from 1 to 8, not 9"),
    ("evs_per_profile", 257, "must be an integer from 1 to 256, not 257"),
    ("mtu", 1500, "must be one of 256, 512, 1024, 2048, 4096, not 1500"),
    ("trim_dscp", 64, "must be an integer from 0 to 63, not 64"),
    ("wr_pool", 1, "must be an integer from 2 to 16384, not 1"),
    ("wr_pool", 16385, "must be an integer from 2 to 16384, not 16385"),
    ("wr_pool", 8, "must be at least wr_slots (16), not 8"),
    ("psn_pool", 16, "must be an integer from 32 to 262144, not 16"),
    ("psn_pool", 262160, "must be an integer from 32 to 262144, not 262160"),
    ("psn_pool", 100, "must be a multiple of 16 (the PSNs of a chunk), not 100"),
    ("ports", "8", "must be an integer, not '8'"),
    ("ports", True, "must be an integer, not True"),
])
def test_bad_value_names_field_and_range(field, value, message):
    with pytest.raises(ConfigError) as info:
        NicConfig(**{field: value})
    assert str(info.value) == f"NicConfig.{field} {message}"
    assert info.value.field == field


def test_sack_bitmap_width_is_not_a_parameter():
    """The wire bitmap is MRC 1.0's 64 bits (hdl.protocol.SACK_BITMAP_BITS)."""
    with pytest.raises(TypeError):
        NicConfig(sack_bits=64)
    assert "sack_bits" not in NicConfig().to_dict()


def test_config_is_frozen_and_replace_validates():
    config = NicConfig()
    with pytest.raises(AttributeError):
        config.ports = 4
    assert config.replace(ports=4).ports == 4
    with pytest.raises(ConfigError, match=r"NicConfig.portz is not a parameter"):
        config.replace(portz=4)


def test_from_json(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"data_width": 128, "qps": 1024}))
    config = NicConfig.from_json(path)
    assert (config.data_width, config.qps, config.ports) == (128, 1024, 8)
    assert NicConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="must be a JSON object"):
        NicConfig.from_dict([1, 2])


def test_configuration_doc_lists_every_parameter():
    from sim.env import REPO
    doc = (REPO / "docs" / "configuration.md").read_text()
    for name, default, allowed, _ in NicConfig.describe():
        assert f"| `{name}` | {default} | {allowed} |" in doc, name


def test_local_ack_timeout():
    assert local_ack_timeout_ns(0) == 1024
    assert local_ack_timeout_ns(24) == 1024 * 2**24
    with pytest.raises(ValueError, match="from 0 to 24, not 25"):
        local_ack_timeout_ns(25)


def test_psn_serial_arithmetic_wraps():
    assert psn_add(0xFFFFFF, 2) == 1
    assert psn_diff(1, 0xFFFFFF) == 2 and psn_diff(0xFFFFFF, 1) == -2
    assert psn_lt(0xFFFFF0, 0x10) and not psn_lt(0x10, 0xFFFFF0)


def test_psn_pool_builds_at_most_what_the_qps_chunk_maps_can_hold():
    """The requester builds psn_pool / 16 chunks, but no more than every QP's chunk map holds
    (2 x window / 16 each): a larger psn_pool is not built."""
    from hdl.transport.req_defs import chunk_map_slots, psn_chunk_bits, psn_chunks
    config = NicConfig()
    assert (psn_chunks(config), psn_chunk_bits(config), chunk_map_slots(config)) == (256, 8, 32)
    assert psn_chunks(NicConfig(qps=2, mpr_units=1)) == 2 * 16
    assert psn_chunks(NicConfig(qps=1024, psn_pool=262144)) == 16384
