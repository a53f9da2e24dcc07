"""The reference EV expansion (hdl/path/ev.py), rule by rule, with hand-worked examples.

The worked examples are the ones in docs/ev-expansion.md; the numbers must stay the same in
both places.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdl.path.ev import (
    EvField,
    EvFormat,
    EvProfile,
    EvProfileError,
    expand,
    field_values,
    generate,
    generate_entries,
    header_fields,
    load_profile_json,
    pdep,
)
from hdl.protocol import (
    EV_FORMAT_CAPACITY_BITS,
    EV_FORMAT_MAX_FIELDS,
    EV_MAX_BYTES,
    EvFormatMode,
    EvMode,
)


def image(hex_prefix):
    """A 32-byte expanded image from its leading hex digits (the rest zero)."""
    return bytes.fromhex(hex_prefix.ljust(2 * EV_MAX_BYTES, "0"))


# ---------------------------------------------------------------------------------------------
# Worked examples
# ---------------------------------------------------------------------------------------------

# UDP, format widths [8, 8].
#   field 0: width 8, init_val 0xa5 = 1010_0101, mask 0x63 = 0110_0011 (bits 6, 5, 1, 0: four
#            EV bits, not contiguous)
#   field 1: width 4, init_val 0x9, mask 0 (fixed: takes no EV bits)
UDP_PROFILE = EvProfile(
    format=EvFormat(mode=EvFormatMode.UDP, widths=[8, 8]),
    mode=EvMode.EXPLICIT,
    fields=[EvField(width=8, init_val=0xA5, min_val=0, max_val=15, mask=0x63),
            EvField(width=4, init_val=0x9, mask=0)],
)


def test_udp_example_noncontiguous_mask_and_fixed_field():
    # EV b0 = 1011_0000. Field 0 takes the first popcount(0x63) = 4 bits, 1011 = 11.
    # pdep(1011, 0110_0011): integer bit 0 (1) -> mask bit 0, bit 1 (1) -> bit 1,
    #   bit 2 (0) -> bit 5, bit 3 (1) -> bit 6: deposited 0100_0011 = 0x43.
    #   (The first EV bit taken, the 1 at the top of 1011, lands in the highest mask bit, 6.)
    # init_val & ~mask = 1010_0101 & 1001_1100 = 1000_0100 = 0x84; 0x84 | 0x43 = 0xc7.
    # Field 1 is fixed: 0x9, right-aligned in its 8-bit format field: 0x09.
    # The last 4 EV bits (0000) are unused and zero. Image: c7 09 then zeros.
    ev = bytes.fromhex("b0")
    assert pdep(0b1011, 0x63) == 0x43
    assert field_values(UDP_PROFILE, ev) == (0xC7, 0x9)
    expanded = expand(UDP_PROFILE, ev)
    assert expanded == image("c709")
    assert header_fields(UDP_PROFILE.format, expanded) == {"udp_sport": 0xC709}


# STEV, format widths [20, 16]: the flow label, then the UDP source port.
#   field 0: width 20, init_val 0xabc00, mask 0x000ff (8 EV bits)
#   field 1: width 16, init_val 0xc000, mask 0x0fff (12 EV bits): a port in 0xc000-0xcfff
STEV_PROFILE = EvProfile(
    format=EvFormat(mode=EvFormatMode.STEV, widths=[20, 16]),
    mode=EvMode.EXPLICIT,
    fields=[EvField(width=20, init_val=0xABC00, mask=0x000FF),
            EvField(width=16, init_val=0xC000, mask=0x0FFF)],
)


def test_stev_example():
    # EV 5a 12 30 = 0101_1010 0001_0010 0011 | 0000 (20 bits used, 4 zero).
    # Field 0 takes 0101_1010 = 0x5a; mask 0xff is contiguous, so deposited 0x0005a;
    #   0xabc00 | 0x5a = 0xabc5a.
    # Field 1 takes 0001_0010_0011 = 0x123; 0xc000 | 0x123 = 0xc123.
    # Image: 20 bits abc5a then 16 bits c123 = 36 bits = 9 hex digits "abc5ac123", then zeros.
    expanded = expand(STEV_PROFILE, bytes.fromhex("5a1230"))
    assert expanded == image("abc5ac123")
    assert header_fields(STEV_PROFILE.format, expanded) == {
        "flow_label": 0xABC5A, "udp_sport": 0xC123}


# SRv6 without SRH, format widths [48, 16, 16] = 80 bits <= 128.
#   field 0: width 48, init_val 0xfc00_0000_0001 (locator fc00:0:1::/48), mask 0: fixed
#   field 1: width 16, init_val 0xe100, mask 0x000f (4 EV bits), min 1, max 8: first uSID
#   field 2: width 16, init_val 0xe200, mask 0x000f (4 EV bits): second uSID
SRV6_PROFILE = EvProfile(
    format=EvFormat(mode=EvFormatMode.SRV6, widths=[48, 16, 16]),
    mode=EvMode.EXPLICIT,
    fields=[EvField(width=48, init_val=0xFC00_0000_0001, mask=0),
            EvField(width=16, init_val=0xE100, min_val=1, max_val=8, mask=0x000F),
            EvField(width=16, init_val=0xE200, mask=0x000F)],
)


def test_srv6_example_without_srh():
    # EV 35 = 0011_0101. The fixed locator takes no bits. Field 1 takes 0011 = 3: 0xe103;
    # field 2 takes 0101 = 5: 0xe205.
    # Image: fc00_0000_0001 e103 e205, zeros: destination fc00:0:1:e103:e205::, no segment.
    expanded = expand(SRV6_PROFILE, bytes.fromhex("35"))
    assert expanded == image("fc0000000001e103e205")
    assert header_fields(SRV6_PROFILE.format, expanded) == {
        "srv6_dst": bytes.fromhex("fc0000000001e103e205000000000000"),
        "srv6_segment": None,
    }


# SRv6 with SRH, format widths [32, 16, 16, 64, 32, 16] = 176 bits > 128.
#   field 0: width 32, init_val 0xfc00_0000, mask 0: the uSID block of the destination, fixed
#   field 1: width 16, init_val 0xe000, mask 0x0007 (3 EV bits): first uSID
#   field 2: width 16, init_val 0xe100, mask 0x0030 (2 EV bits): second uSID
#   field 3: width 64, init_val 0, mask 0: the rest of the destination address, fixed zero
#   field 4: width 32, init_val 0xfc00_0000, mask 0: the uSID block of the segment, fixed
#   field 5: width 16, init_val 0xe200, mask 0x00ff (8 EV bits): uSID in the segment
SRV6_SRH_PROFILE = EvProfile(
    format=EvFormat(mode=EvFormatMode.SRV6, widths=[32, 16, 16, 64, 32, 16]),
    mode=EvMode.EXPLICIT,
    fields=[EvField(width=32, init_val=0xFC00_0000),
            EvField(width=16, init_val=0xE000, mask=0x0007),
            EvField(width=16, init_val=0xE100, mask=0x0030),
            EvField(width=64, init_val=0),
            EvField(width=32, init_val=0xFC00_0000),
            EvField(width=16, init_val=0xE200, mask=0x00FF)],
)


def test_srv6_example_with_srh():
    # EV b3 38 = 1011_0011 0011_1000: 3 + 2 + 8 = 13 bits used, then 000.
    # Field 1 takes 101 = 5: 0xe000 | 0x5 = 0xe005.
    # Field 2 takes 10 = 2: pdep(10, 0x30) puts 0 in bit 4 and 1 in bit 5: 0x20;
    #   0xe100 | 0x20 = 0xe120.
    # Field 5 takes 0110_0111 = 0x67: 0xe267.
    # Bytes 0-15:  fc000000 e005 e120 0000000000000000  -> fc00:0:e005:e120::
    # Bytes 16-31: fc000000 e267 then zeros              -> fc00:0:e267::
    expanded = expand(SRV6_SRH_PROFILE, bytes.fromhex("b338"))
    assert expanded == image("fc000000e005e1200000000000000000" "fc000000e267")
    assert header_fields(SRV6_SRH_PROFILE.format, expanded) == {
        "srv6_dst": bytes.fromhex("fc000000e005e1200000000000000000"),
        "srv6_segment": bytes.fromhex("fc000000e26700000000000000000000"),
    }


def test_unfilled_format_fields_are_zero():
    # One profile field for a two-field format: format field 1 (8 bits) stays zero, and the
    # profile's 4-bit value is right-aligned in format field 0: 0xb -> 0x0b.
    profile = EvProfile(format=EvFormat(mode=EvFormatMode.UDP, widths=[8, 8]),
                        mode=EvMode.EXPLICIT, fields=[EvField(width=4, mask=0xF)])
    assert expand(profile, bytes.fromhex("b0")) == image("0b00")


def test_short_ev_reads_as_zero_padded():
    # The STEV profile takes 20 bits; a 1-byte EV 5a reads as 5a 00 00.
    assert expand(STEV_PROFILE, bytes.fromhex("5a")) == expand(STEV_PROFILE,
                                                               bytes.fromhex("5a0000"))


def test_32_byte_ev_with_zero_tail():
    ev = bytes.fromhex("b0") + bytes(EV_MAX_BYTES - 1)
    assert expand(UDP_PROFILE, ev) == image("c709")


# GENERATED, UDP, format widths [8, 8].
#   field 0: width 8, init_val 0xc0, mask 0x03 (2 EV bits), values 1..3
#   field 1: width 8, init_val 0x10, mask 0x0f (4 EV bits), values 0..1
# 3 x 2 = 6 distinct EVs; each EV is 2 + 4 = 6 bits, padded to 1 byte.
GENERATED_PROFILE = EvProfile(
    format=EvFormat(mode=EvFormatMode.UDP, widths=[8, 8]),
    mode=EvMode.GENERATED,
    fields=[EvField(width=8, init_val=0xC0, min_val=1, max_val=3, mask=0x03),
            EvField(width=8, init_val=0x10, min_val=0, max_val=1, mask=0x0F)],
)


def test_generated_example_odometer_order():
    # The last field varies fastest: (1,0) (1,1) (2,0) (2,1).
    #   (1,0): 01 0000 00 = 0x40   (1,1): 01 0001 00 = 0x44
    #   (2,0): 10 0000 00 = 0x80   (2,1): 10 0001 00 = 0x84
    # Expanded: field 0 = 0xc0 | v0, field 1 = 0x10 | v1: c110 c111 c210 c211.
    evs = generate(GENERATED_PROFILE, 4)
    assert evs == [bytes([0x40]), bytes([0x44]), bytes([0x80]), bytes([0x84])]
    assert [expand(GENERATED_PROFILE, ev) for ev in evs] == [
        image("c110"), image("c111"), image("c210"), image("c211")]


def test_generated_ports_take_turns():
    # EV k goes out of port k % num_ports + 1.
    entries = generate_entries(GENERATED_PROFILE, 4, num_ports=3)
    assert [port for _, port in entries] == [1, 2, 3, 1]
    assert [ev for ev, _ in entries] == generate(GENERATED_PROFILE, 4)
    assert [port for _, port in generate_entries(GENERATED_PROFILE, 2)] == [1, 1]


def test_generated_all_fixed_fields_make_one_zero_byte_ev():
    profile = EvProfile(format=EvFormat(mode=EvFormatMode.UDP, widths=[16]),
                        mode=EvMode.GENERATED, fields=[EvField(width=16, init_val=0xC0DE)])
    assert profile.distinct_evs == 1
    assert generate(profile, 1) == [b"\x00"]
    assert expand(profile, b"\x00") == image("c0de")


def test_generated_count_over_distinct_evs_is_e2big():
    with pytest.raises(EvProfileError, match="only 6 distinct EVs") as info:
        generate(GENERATED_PROFILE, 7)
    assert info.value.errno_name == "E2BIG"
    assert info.value.field == "count"


def test_generated_count_below_one_is_einval():
    with pytest.raises(EvProfileError) as info:
        generate(GENERATED_PROFILE, 0)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "count")


def test_explicit_profile_does_not_generate():
    with pytest.raises(EvProfileError) as info:
        generate(UDP_PROFILE, 1)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "mode")


def test_num_ports_must_be_positive():
    with pytest.raises(EvProfileError) as info:
        generate_entries(GENERATED_PROFILE, 1, num_ports=0)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "num_ports")


# ---------------------------------------------------------------------------------------------
# EV errors
# ---------------------------------------------------------------------------------------------

def test_nonzero_bit_after_consumed_bits_is_rejected():
    # The UDP profile consumes 4 bits; b8 = 1011_1000 has a 1 at bit 4 (bit 0 = MSB of byte 0).
    with pytest.raises(EvProfileError, match="bit 4 is 1") as info:
        expand(UDP_PROFILE, bytes.fromhex("b8"), index=3)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "evs[3]")


def test_nonzero_bit_in_a_later_byte_is_rejected():
    # The STEV profile consumes 20 bits; bit 8 * 31 + 7 = 255, the last bit, is set.
    ev = bytes.fromhex("5a1230") + bytes(28) + b"\x01"
    with pytest.raises(EvProfileError, match="bit 255 is 1") as info:
        expand(STEV_PROFILE, ev)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "ev")


def test_ev_longer_than_32_bytes_is_e2big():
    with pytest.raises(EvProfileError, match="33 bytes") as info:
        expand(UDP_PROFILE, bytes(33))
    assert (info.value.errno_name, info.value.field) == ("E2BIG", "ev")


def test_empty_ev_is_rejected():
    with pytest.raises(EvProfileError) as info:
        expand(UDP_PROFILE, b"")
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "ev")


# ---------------------------------------------------------------------------------------------
# Profile validation: one test per rule, through the JSON loader so paths are complete
# ---------------------------------------------------------------------------------------------

def document(widths=(8, 8), fields=None, mode="udp", profile_mode="explicit", **profile_extra):
    """A profile document; by default the UDP worked example with one EV."""
    if fields is None:
        fields = [{"width": 8, "init_val": "0xa5", "min_val": 0, "max_val": 15, "mask": "0x63"},
                  {"width": 4, "init_val": 9, "min_val": 0, "max_val": 0, "mask": 0}]
    profile = {"mode": profile_mode, "fields": fields}
    profile.update(profile_extra if profile_extra else {"evs": ["b0"]})
    return {"format": {"mode": mode, "widths": list(widths)}, "profile": profile}


def rejected(doc):
    with pytest.raises(EvProfileError) as info:
        load_profile_json(doc)
    error = info.value
    assert str(error).startswith(f"{error.field}: ")
    assert str(error).endswith(f"({error.errno_name})")
    assert "\n" not in str(error)
    return error


def test_document_loads():
    spec = load_profile_json(document())
    assert spec.profile == UDP_PROFILE
    assert spec.evs == (bytes.fromhex("b0"),)
    assert spec.count is None


def test_more_profile_fields_than_format_fields_is_e2big():
    error = rejected(document(widths=[16], fields=[{"width": 4}, {"width": 4}]))
    assert (error.errno_name, error.field) == ("E2BIG", "profile.fields")
    assert "more than the format's 1" in str(error)


def test_profile_widths_over_format_sum_is_e2big():
    error = rejected(document(fields=[{"width": 9}, {"width": 9}]))
    assert (error.errno_name, error.field) == ("E2BIG", "profile.fields")
    assert "18 bits, more than the format's 16" in str(error)


def test_profile_field_wider_than_its_format_field_is_e2big():
    # 12 + 1 fits the format's 16 bits in total, but 12 bits do not fit format field 0's 8.
    error = rejected(document(fields=[{"width": 12}, {"width": 1}]))
    assert (error.errno_name, error.field) == ("E2BIG", "profile.fields[0].width")
    assert "wider than format field 0 (8 bits)" in str(error)


def test_profile_field_width_below_one_is_einval():
    error = rejected(document(fields=[{"width": 8}, {"width": 0}]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields[1].width")


def test_init_val_wider_than_field_is_einval():
    error = rejected(document(fields=[{"width": 8, "init_val": "0x100"}]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields[0].init_val")
    assert "0x100 is wider than the field's 8-bit width" in str(error)


def test_mask_outside_field_is_einval():
    error = rejected(document(fields=[{"width": 8, "mask": "0x100"}]))
    assert str(error) == ("profile.fields[0].mask: 0x100 has bits outside the field's 8-bit "
                          "width (EINVAL)")


def test_max_val_wider_than_mask_bits_is_einval():
    # mask 0x0b has 3 set bits, so max_val can be at most 7.
    error = rejected(document(fields=[{"width": 8, "mask": "0x0b", "max_val": 8}]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields[0].max_val")
    assert "wider than the mask's 3 bits" in str(error)


def test_min_val_over_max_val_is_einval():
    error = rejected(document(fields=[{"width": 8, "mask": "0x0f", "min_val": 5, "max_val": 3}]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields[0].min_val")


@pytest.mark.parametrize("key", ["width", "init_val", "min_val", "max_val", "mask"])
def test_negative_value_is_einval(key):
    field = {"width": 8, "mask": 0x0F, key: -1}
    error = rejected(document(fields=[field]))
    assert (error.errno_name, error.field) == ("EINVAL", f"profile.fields[0].{key}")


def test_direct_construction_names_the_attribute():
    with pytest.raises(EvProfileError) as info:
        EvField(width=8, mask=0x1FF)
    assert (info.value.errno_name, info.value.field) == ("EINVAL", "mask")


def test_format_with_too_many_fields_is_e2big():
    error = rejected(document(mode="srv6", widths=[1] * (EV_FORMAT_MAX_FIELDS + 1)))
    assert (error.errno_name, error.field) == ("E2BIG", "format.widths")


@pytest.mark.parametrize("mode", list(EvFormatMode))
def test_format_over_capacity_is_e2big(mode):
    capacity = EV_FORMAT_CAPACITY_BITS[mode]
    error = rejected(document(mode=mode.name.lower(), widths=[8, capacity - 7]))
    assert (error.errno_name, error.field) == ("E2BIG", "format.widths")
    assert f"more than the {capacity}" in str(error)


def test_format_width_below_one_is_einval():
    error = rejected(document(widths=[8, 0]))
    assert (error.errno_name, error.field) == ("EINVAL", "format.widths[1]")


def test_format_without_fields_is_einval():
    error = rejected(document(widths=[]))
    assert (error.errno_name, error.field) == ("EINVAL", "format.widths")


def test_profile_without_fields_is_einval():
    error = rejected(document(fields=[]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields")


# ---------------------------------------------------------------------------------------------
# JSON document rules
# ---------------------------------------------------------------------------------------------

def test_generated_document_with_count():
    doc = document(fields=[{"width": 8, "init_val": "0xc0", "min_val": 1, "max_val": 3,
                            "mask": "0x03"},
                           {"width": 8, "init_val": "0x10", "max_val": "1", "mask": "15"}],
                   profile_mode="generated", count=4)
    spec = load_profile_json(doc)
    assert spec.profile == GENERATED_PROFILE
    assert spec.count == 4
    assert spec.evs == tuple(generate(GENERATED_PROFILE, 4))


def test_generated_document_count_too_big_is_e2big():
    doc = document(fields=[{"width": 8, "mask": 3}], profile_mode="generated", count=5)
    error = rejected(doc)
    assert (error.errno_name, error.field) == ("E2BIG", "profile.count")
    assert "only 4 distinct EVs" in str(error)


def test_generated_document_may_list_evs():
    doc = document(fields=[{"width": 8, "mask": 3}], profile_mode="generated", evs=["c0"])
    assert load_profile_json(doc).evs == (b"\xc0",)


def test_explicit_document_with_count_is_rejected():
    error = rejected(document(count=1))
    assert error.field == "profile.count"


def test_document_with_evs_and_count_is_rejected():
    error = rejected(document(profile_mode="generated", evs=["00"], count=1))
    assert error.field == "profile.count"


def test_document_without_evs_or_count_is_rejected():
    doc = document()
    del doc["profile"]["evs"]
    assert rejected(doc).field == "profile.evs"


@pytest.mark.parametrize("where, path", [
    (lambda doc: doc, "document.extra"),
    (lambda doc: doc["format"], "format.extra"),
    (lambda doc: doc["profile"], "profile.extra"),
    (lambda doc: doc["profile"]["fields"][1], "profile.fields[1].extra"),
])
def test_unknown_key_is_rejected(where, path):
    doc = document()
    where(doc)["extra"] = 1
    error = rejected(doc)
    assert (error.errno_name, error.field) == ("EINVAL", path)
    assert "unknown key" in str(error)


@pytest.mark.parametrize("ev", ["b", "zz", "0xb0", "b0 00", "", 176])
def test_bad_hex_ev_is_rejected(ev):
    error = rejected(document(evs=[ev]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.evs[0]")


def test_hex_ev_longer_than_32_bytes_is_e2big():
    error = rejected(document(evs=["b0", "00" * 33]))
    assert (error.errno_name, error.field) == ("E2BIG", "profile.evs[1]")


@pytest.mark.parametrize("value", ["0x", "-1", "1.5", 1.5, True, None, "ff"])
def test_bad_integer_is_rejected(value):
    error = rejected(document(fields=[{"width": 8, "init_val": value}]))
    assert (error.errno_name, error.field) == ("EINVAL", "profile.fields[0].init_val")


@pytest.mark.parametrize("section, value, path", [
    ("format", "ipv4", "format.mode"),
    ("profile", "auto", "profile.mode"),
])
def test_unknown_mode_is_rejected(section, value, path):
    doc = document()
    doc[section]["mode"] = value
    assert rejected(doc).field == path


# ---------------------------------------------------------------------------------------------
# Properties: against an independent bit-list implementation
# ---------------------------------------------------------------------------------------------

@st.composite
def profiles(draw, profile_mode=EvMode.EXPLICIT):
    mode = draw(st.sampled_from(list(EvFormatMode)))
    capacity = EV_FORMAT_CAPACITY_BITS[mode]
    format_count = draw(st.integers(1, min(EV_FORMAT_MAX_FIELDS, capacity)))
    widths, remaining = [], capacity
    for index in range(format_count):
        # Leave at least a bit for each later field; cap so that SRv6 fields vary in size.
        widths.append(draw(st.integers(1, min(64, remaining - (format_count - index - 1)))))
        remaining -= widths[-1]
    fields = []
    for format_width in widths[:draw(st.integers(1, format_count))]:
        width = draw(st.integers(1, format_width))
        mask = draw(st.integers(0, (1 << width) - 1))
        max_val = draw(st.integers(0, (1 << mask.bit_count()) - 1))
        fields.append(EvField(width=width, init_val=draw(st.integers(0, (1 << width) - 1)),
                              min_val=draw(st.integers(0, max_val)), max_val=max_val, mask=mask))
    return EvProfile(format=EvFormat(mode=mode, widths=widths), mode=profile_mode, fields=fields)


def bit_list(value, width):
    return [(value >> (width - 1 - position)) & 1 for position in range(width)]


def expand_bit_by_bit(profile, ev):
    """The rules read literally, one bit at a time, on lists of bits (MSB first)."""
    stream = [bit for byte in ev for bit in bit_list(byte, 8)]
    stream += [0] * (8 * EV_MAX_BYTES - len(stream))
    out = []
    for index, format_width in enumerate(profile.format.widths):
        if index >= len(profile.fields):
            out += [0] * format_width
            continue
        ev_field = profile.fields[index]
        value = bit_list(ev_field.init_val, ev_field.width)
        mask = bit_list(ev_field.mask, ev_field.width)
        # Walking the mask from its most significant set bit down, each takes the next stream
        # bit: the first bit taken lands in the highest set bit.
        for position in range(ev_field.width):
            if mask[position]:
                value[position] = stream.pop(0)
        out += [0] * (format_width - ev_field.width) + value
    assert not any(stream), "the EV has 1s after the consumed bits"
    out += [0] * (8 * EV_MAX_BYTES - len(out))
    return bytes(int("".join(map(str, out[i:i + 8])), 2) for i in range(0, len(out), 8))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_expand_matches_bit_by_bit_model(data):
    profile = data.draw(profiles())
    consumed = profile.ev_bits
    stream = data.draw(st.integers(0, (1 << consumed) - 1))
    length = data.draw(st.integers(max(1, -(-consumed // 8)), EV_MAX_BYTES))
    ev = (stream << (8 * length - consumed)).to_bytes(length, "big")
    assert expand(profile, ev) == expand_bit_by_bit(profile, ev)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_trailing_one_is_always_rejected(data):
    profile = data.draw(profiles())
    length = EV_MAX_BYTES
    bad_bit = data.draw(st.integers(profile.ev_bits, 8 * length - 1))
    ev = (1 << (8 * length - 1 - bad_bit)).to_bytes(length, "big")
    with pytest.raises(EvProfileError, match=f"bit {bad_bit} is 1"):
        expand(profile, ev)


def read_back(profile, ev):
    """Each field's EV integer, read back from a generated EV's bit list."""
    stream = [bit for byte in ev for bit in bit_list(byte, 8)]
    values = []
    for ev_field in profile.fields:
        taken, stream = stream[:ev_field.ev_bits], stream[ev_field.ev_bits:]
        values.append(int("".join(map(str, taken)) or "0", 2))
    assert not any(stream), "generated EVs are zero after the fields' bits"
    return tuple(values)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_generate_walks_the_ranges_in_odometer_order(data):
    profile = data.draw(profiles(EvMode.GENERATED))
    count = data.draw(st.integers(1, min(profile.distinct_evs, 64)))
    evs = generate(profile, count)
    assert len(evs) == count
    assert len(set(evs)) == count
    assert all(len(ev) == max(1, -(-profile.ev_bits // 8)) for ev in evs)
    values = [read_back(profile, ev) for ev in evs]
    for value in values:
        for ev_field, field_value in zip(profile.fields, value, strict=True):
            assert ev_field.min_val <= field_value <= ev_field.max_val
    # itertools.product varies its last iterable fastest: the order the rules ask for.
    ranges = [range(f.min_val, f.max_val + 1) for f in profile.fields]
    assert values == list(itertools.islice(itertools.product(*ranges), count))
    for ev in evs:
        expand(profile, ev)                 # every generated EV expands without error
