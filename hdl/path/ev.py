"""Reference EV expansion: what an EV profile turns an Entropy Value into, bit for bit.

This module is plain Python, not gateware. It is the executable form of the rules in
``docs/ev-expansion.md``: the expansion hardware must match it, the register map validates
profiles with it, and the benches use it as their scoreboard.

An EV is a byte string of 1 to :data:`~hdl.protocol.EV_MAX_BYTES` bytes read as one bit stream,
the most significant bit of byte 0 first. An *EV format* splits the header bits the EV lands
in into fields; an *EV profile* says, for each format field, which bits are fixed (``init_val``)
and which the EV supplies (``mask``). Expanding an EV gives a 256-bit image of those header
bits, left-aligned (*project choice*); :func:`header_fields` places it in named header fields.

Errors a user can cause raise :class:`EvProfileError`, which names the offending field and
carries the errno (``EINVAL`` or ``E2BIG``) the control interface reports for it.
"""

import math
import re
from dataclasses import dataclass

from ..protocol import (
    EV_FORMAT_CAPACITY_BITS,
    EV_FORMAT_MAX_FIELDS,
    EV_MAX_BYTES,
    EvFormatMode,
    EvMode,
)

__all__ = [
    "EXPANDED_EV_BITS", "EXPANDED_EV_BYTES",
    "EvProfileError", "EvFormat", "EvField", "EvProfile", "EvProfileSpec",
    "pdep", "field_values", "expand", "header_fields",
    "generate", "generate_entries", "load_profile_json",
]

#: Width of the expanded-EV image: the largest format (SRv6 destination + one SRH segment).
EXPANDED_EV_BITS = 8 * EV_MAX_BYTES
EXPANDED_EV_BYTES = EV_MAX_BYTES

# Bit positions of the header fields inside the left-aligned expanded image (*project choice*:
# in STEV the flow label takes the first 20 bits, the UDP source port the next 16).
FLOW_LABEL_BITS = 20
UDP_SPORT_BITS = 16
SRV6_ADDRESS_BYTES = 16


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

class EvProfileError(ValueError):
    """A profile, format or EV that breaks one of the expansion rules.

    Parameters
    ----------
    field : str
        Path of the offending value, relative to the object being checked (``"mask"`` when an
        :class:`EvField` is built directly; ``"profile.fields[2].mask"`` from
        :func:`load_profile_json`).
    reason : str
        The broken rule, stated with the offending value.
    errno_name : str
        ``"EINVAL"`` for a malformed value, ``"E2BIG"`` for too many fields, too wide a field
        or too many EVs.

    The message reads ``"<field>: <reason> (<errno_name>)"`` and is always one line.
    """

    def __init__(self, field, reason, errno_name="EINVAL"):
        if errno_name not in ("EINVAL", "E2BIG"):
            raise ValueError(f"errno_name must be 'EINVAL' or 'E2BIG', not {errno_name!r}")
        self.field = field
        self.reason = reason
        self.errno_name = errno_name
        super().__init__(f"{field}: {reason} ({errno_name})")

    def within(self, prefix):
        """The same error with its field path placed under ``prefix``.

        ``EvProfileError("mask", ...).within("profile.fields[2]")`` names
        ``profile.fields[2].mask``.
        """
        separator = "" if self.field.startswith("[") else "."
        return EvProfileError(f"{prefix}{separator}{self.field}", self.reason, self.errno_name)


def _check_uint(value, field):
    # bool is an int subclass; True as a mask is a mistake, not the value 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise EvProfileError(field, f"must be an integer, not {value!r}")
    if value < 0:
        raise EvProfileError(field, f"must not be negative, not {value}")


def _popcount(value):
    return value.bit_count()


# ---------------------------------------------------------------------------------------------
# Format, field and profile
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EvFormat:
    """An EV format profile: where the expanded EV goes, split into fields.

    Parameters
    ----------
    mode : EvFormatMode
        Which header bits the expanded EV lands in.
    widths : sequence of int
        Widths of the format's fields in bits, first field first: 1 to
        :data:`~hdl.protocol.EV_FORMAT_MAX_FIELDS` fields, each at least 1 bit, summing to at
        most ``EV_FORMAT_CAPACITY_BITS[mode]`` (STEV 36, UDP 16, SRv6 256). Stored as a tuple.

    Raises
    ------
    EvProfileError
        ``E2BIG`` for too many fields or widths over the mode's capacity; ``EINVAL`` otherwise.
    """

    mode: EvFormatMode
    widths: tuple[int, ...]

    def __post_init__(self):
        try:
            mode = EvFormatMode(self.mode)
        except (ValueError, TypeError):
            raise EvProfileError(
                "mode", f"must be an EvFormatMode (STEV, UDP or SRV6), not {self.mode!r}"
            ) from None
        object.__setattr__(self, "mode", mode)

        if isinstance(self.widths, (str, bytes)) or not hasattr(self.widths, "__iter__"):
            raise EvProfileError("widths", f"must be a list of integers, not {self.widths!r}")
        widths = tuple(self.widths)
        if not widths:
            raise EvProfileError("widths", "must list at least one field width")
        if len(widths) > EV_FORMAT_MAX_FIELDS:
            raise EvProfileError(
                "widths", f"{len(widths)} fields, more than the {EV_FORMAT_MAX_FIELDS} an EV "
                f"format may have", "E2BIG")
        for index, width in enumerate(widths):
            _check_uint(width, f"widths[{index}]")
            if width < 1:
                raise EvProfileError(f"widths[{index}]", f"must be at least 1 bit, not {width}")
        capacity = EV_FORMAT_CAPACITY_BITS[mode]
        if sum(widths) > capacity:
            raise EvProfileError(
                "widths", f"the widths sum to {sum(widths)} bits, more than the {capacity} "
                f"a {mode.name} format holds", "E2BIG")
        object.__setattr__(self, "widths", widths)

    @property
    def total_width(self):
        """Sum of the field widths: the bits of the expanded image this format uses."""
        return sum(self.widths)

    @property
    def capacity(self):
        """Bits the format's mode can carry."""
        return EV_FORMAT_CAPACITY_BITS[self.mode]


@dataclass(frozen=True, kw_only=True)
class EvField:
    """One field of an EV profile: a value of ``width`` bits, some of whose bits come from the EV.

    Parameters
    ----------
    width : int
        Width of the field's value in bits, at least 1. The value is right-aligned in its format
        field, which must be at least this wide.
    init_val : int
        The field's value before the EV's bits are deposited: its fixed bits. Fits ``width``.
    mask : int
        The bits the EV supplies. ``popcount(mask)`` EV bits are consumed; 0 makes a fixed
        field that consumes none. No bits outside ``width``.
    min_val, max_val : int
        The range of the EV-supplied integer (before it is deposited) that generation walks.
        ``max_val`` must fit in ``popcount(mask)`` bits and defaults to the largest value that
        does; ``min_val`` must not exceed it. Expansion of a given EV does not check the range.

    Raises
    ------
    EvProfileError
        ``EINVAL``, naming the attribute (``"width"``, ``"mask"``, ...).
    """

    width: int
    init_val: int = 0
    min_val: int = 0
    max_val: int | None = None
    mask: int = 0

    def __post_init__(self):
        _check_uint(self.width, "width")
        if self.width < 1:
            raise EvProfileError("width", f"must be at least 1 bit, not {self.width}")
        for name in ("init_val", "mask", "min_val"):
            _check_uint(getattr(self, name), name)
        if self.init_val >> self.width:
            raise EvProfileError(
                "init_val", f"{self.init_val:#x} is wider than the field's {self.width}-bit width")
        if self.mask >> self.width:
            raise EvProfileError(
                "mask", f"{self.mask:#x} has bits outside the field's {self.width}-bit width")
        ev_bits = _popcount(self.mask)
        if self.max_val is None:
            object.__setattr__(self, "max_val", (1 << ev_bits) - 1)
        _check_uint(self.max_val, "max_val")
        if self.max_val >> ev_bits:
            raise EvProfileError(
                "max_val", f"{self.max_val:#x} is wider than the mask's {ev_bits} bits "
                f"(mask {self.mask:#x})")
        if self.min_val > self.max_val:
            raise EvProfileError(
                "min_val", f"{self.min_val:#x} is greater than max_val {self.max_val:#x}")

    @property
    def ev_bits(self):
        """EV bits the field consumes: ``popcount(mask)``."""
        return _popcount(self.mask)

    @property
    def value_count(self):
        """How many values generation walks for this field: ``max_val - min_val + 1``."""
        return self.max_val - self.min_val + 1


@dataclass(frozen=True, kw_only=True)
class EvProfile:
    """An EV profile: the fields that turn an EV into header bits of a given format.

    Parameters
    ----------
    format : EvFormat
        The format the expanded EV is laid out in.
    mode : EvMode
        ``EXPLICIT`` (the controller gives the EVs) or ``GENERATED`` (:func:`generate` makes
        them). ``AUTO`` is vendor-managed and has no reference expansion.
    fields : sequence of EvField
        1 to ``len(format.widths)`` fields; field ``i`` fills format field ``i``. Format fields
        without a profile field are zero. Stored as a tuple.

    Raises
    ------
    EvProfileError
        ``E2BIG`` for more fields than the format has, widths summing over the format's, or a
        field wider than its format field; ``EINVAL`` otherwise.
    """

    format: EvFormat
    mode: EvMode
    fields: tuple[EvField, ...]

    def __post_init__(self):
        if not isinstance(self.format, EvFormat):
            raise EvProfileError("format", f"must be an EvFormat, not {self.format!r}")
        try:
            mode = EvMode(self.mode)
        except (ValueError, TypeError):
            raise EvProfileError(
                "mode", f"must be EXPLICIT or GENERATED, not {self.mode!r}") from None
        if mode == EvMode.AUTO:
            raise EvProfileError(
                "mode", "AUTO is vendor-managed; only EXPLICIT and GENERATED profiles expand")
        object.__setattr__(self, "mode", mode)

        if isinstance(self.fields, (str, bytes)) or not hasattr(self.fields, "__iter__"):
            raise EvProfileError("fields", f"must be a list of EvField, not {self.fields!r}")
        fields = tuple(self.fields)
        for index, ev_field in enumerate(fields):
            if not isinstance(ev_field, EvField):
                raise EvProfileError(f"fields[{index}]", f"must be an EvField, not {ev_field!r}")
        if not fields:
            raise EvProfileError("fields", "must list at least one field")
        format_widths = self.format.widths
        if len(fields) > len(format_widths):
            raise EvProfileError(
                "fields", f"{len(fields)} fields, more than the format's {len(format_widths)}",
                "E2BIG")
        # Checked before the per-field rule so that each rule has its own error; with every
        # field within its format field the sum cannot exceed the format's anyway.
        total = sum(ev_field.width for ev_field in fields)
        if total > self.format.total_width:
            raise EvProfileError(
                "fields", f"the field widths sum to {total} bits, more than the format's "
                f"{self.format.total_width}", "E2BIG")
        for index, ev_field in enumerate(fields):
            format_width = format_widths[index]
            if ev_field.width > format_width:
                raise EvProfileError(
                    f"fields[{index}].width", f"{ev_field.width} bits is wider than format "
                    f"field {index} ({format_width} bits), in which the value is right-aligned",
                    "E2BIG")
        object.__setattr__(self, "fields", fields)

    @property
    def ev_bits(self):
        """EV bits an expansion consumes: the sum of the fields' ``popcount(mask)``."""
        return sum(ev_field.ev_bits for ev_field in self.fields)

    @property
    def ev_length(self):
        """Length in bytes of a generated EV: ``ceil(ev_bits / 8)``, at least 1."""
        return max(1, -(-self.ev_bits // 8))

    @property
    def distinct_evs(self):
        """How many distinct EVs generation can make: the product of the fields' ranges."""
        return math.prod(ev_field.value_count for ev_field in self.fields)


# ---------------------------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------------------------

def pdep(value, mask):
    """Parallel bit deposit: the low bits of ``value`` into the set bits of ``mask``.

    Bit 0 of ``value`` goes to the lowest set bit of ``mask``, bit 1 to the next, and so on;
    bits of ``value`` beyond ``popcount(mask)`` are dropped.
    """
    result = 0
    while mask:
        lowest = mask & -mask
        if value & 1:
            result |= lowest
        value >>= 1
        mask ^= lowest
    return result


def _check_ev(ev, field):
    if not isinstance(ev, (bytes, bytearray)):
        raise EvProfileError(field, f"must be bytes, not {type(ev).__name__}")
    if not ev:
        raise EvProfileError(field, f"must be 1 to {EV_MAX_BYTES} bytes, not empty")
    if len(ev) > EV_MAX_BYTES:
        raise EvProfileError(
            field, f"{len(ev)} bytes, longer than the {EV_MAX_BYTES} an EV may have", "E2BIG")


def field_values(profile, ev, *, index=None):
    """The value of each profile field after depositing the EV's bits.

    Parameters
    ----------
    profile : EvProfile
    ev : bytes
        1 to 32 bytes; missing bytes read as zero. Bits after the ``profile.ev_bits`` consumed
        must be zero.
    index : int or None
        Position of the EV in its profile's array, used to name it in errors (``evs[index]``
        rather than ``ev``).

    Returns
    -------
    tuple of int
        One value per profile field, each ``width`` bits.

    Raises
    ------
    EvProfileError
        ``E2BIG`` for an EV longer than 32 bytes; ``EINVAL`` for a non-bytes or empty EV, or a
        1 after the consumed bits (the message gives its bit position, 0 being the most
        significant bit of byte 0).
    """
    name = "ev" if index is None else f"evs[{index}]"
    _check_ev(ev, name)
    stream_bits = 8 * len(ev)
    stream = int.from_bytes(ev, "big")
    consumed = profile.ev_bits
    if consumed < stream_bits:
        rest = stream & ((1 << (stream_bits - consumed)) - 1)
        if rest:
            first_one = stream_bits - rest.bit_length()
            raise EvProfileError(
                name, f"bit {first_one} is 1, but the profile consumes only {consumed} bits "
                f"and the bits after them must be zero")
    # An EV shorter than the bits consumed reads as if zero-padded on the right, as it is
    # stored in a 32-byte EV table entry.
    if consumed > stream_bits:
        stream <<= consumed - stream_bits
        stream_bits = consumed

    values = []
    position = stream_bits                      # bits of the stream not yet taken, from the end
    for ev_field in profile.fields:
        taken_bits = ev_field.ev_bits
        position -= taken_bits
        taken = (stream >> position) & ((1 << taken_bits) - 1)
        values.append((ev_field.init_val & ~ev_field.mask) | pdep(taken, ev_field.mask))
    return tuple(values)


def expand(profile, ev, *, index=None):
    """Expand one EV into the 256-bit (32-byte) image of the header bits it selects.

    Each profile field's value (see :func:`field_values`) is right-aligned in its format field;
    format fields without a profile field are zero; the format fields are concatenated with the
    first at the most significant bits of byte 0, and the image is zero after
    ``profile.format.total_width`` bits (*project choice*: left-aligned).

    Parameters
    ----------
    profile : EvProfile
    ev : bytes
        1 to 32 bytes, most significant bit of byte 0 first.
    index : int or None
        Position of the EV in its profile's array, for error messages.

    Returns
    -------
    bytes
        32 bytes.

    Raises
    ------
    EvProfileError
        As :func:`field_values`.
    """
    values = field_values(profile, ev, index=index)
    image = 0
    position = EXPANDED_EV_BITS
    for field_index, format_width in enumerate(profile.format.widths):
        position -= format_width
        if field_index < len(values):
            image |= values[field_index] << position
    return image.to_bytes(EXPANDED_EV_BYTES, "big")


def header_fields(fmt, expanded):
    """Place an expanded EV into the header fields of its format's mode.

    Parameters
    ----------
    fmt : EvFormat
    expanded : bytes
        32 bytes, as returned by :func:`expand`.

    Returns
    -------
    dict
        STEV: ``{"flow_label": int (first 20 bits), "udp_sport": int (next 16 bits)}``.
        UDP: ``{"udp_sport": int (first 16 bits)}``.
        SRV6: ``{"srv6_dst": bytes 0-15, "srv6_segment": bytes 16-31}``, the segment ``None``
        when the format's fields total 128 bits or fewer (no SRH).
    """
    if not isinstance(fmt, EvFormat):
        raise EvProfileError("format", f"must be an EvFormat, not {fmt!r}")
    if not isinstance(expanded, (bytes, bytearray)) or len(expanded) != EXPANDED_EV_BYTES:
        raise EvProfileError(
            "expanded", f"must be {EXPANDED_EV_BYTES} bytes, as expand() returns, not "
            f"{expanded!r}")
    image = int.from_bytes(expanded, "big")
    if fmt.mode == EvFormatMode.STEV:
        return {
            "flow_label": image >> (EXPANDED_EV_BITS - FLOW_LABEL_BITS),
            "udp_sport": (image >> (EXPANDED_EV_BITS - FLOW_LABEL_BITS - UDP_SPORT_BITS))
                         & ((1 << UDP_SPORT_BITS) - 1),
        }
    if fmt.mode == EvFormatMode.UDP:
        return {"udp_sport": image >> (EXPANDED_EV_BITS - UDP_SPORT_BITS)}
    has_segment = fmt.total_width > 8 * SRV6_ADDRESS_BYTES
    return {
        "srv6_dst": bytes(expanded[:SRV6_ADDRESS_BYTES]),
        "srv6_segment": bytes(expanded[SRV6_ADDRESS_BYTES:]) if has_segment else None,
    }


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def _check_count(profile, count):
    if not isinstance(profile, EvProfile):
        raise EvProfileError("profile", f"must be an EvProfile, not {profile!r}")
    if profile.mode != EvMode.GENERATED:
        raise EvProfileError(
            "mode", f"generation needs a GENERATED profile, not {profile.mode.name}")
    if isinstance(count, bool) or not isinstance(count, int):
        raise EvProfileError("count", f"must be an integer, not {count!r}")
    if count < 1:
        raise EvProfileError("count", f"must be at least 1, not {count}")
    if count > profile.distinct_evs:
        raise EvProfileError(
            "count", f"{count} EVs requested, but the profile can make only "
            f"{profile.distinct_evs} distinct EVs", "E2BIG")


def generate(profile, count):
    """The first ``count`` EVs of a GENERATED profile.

    The EVs walk every combination of the fields' ``[min_val, max_val]`` ranges like an
    odometer: the last field varies fastest (*project choice*). EV ``k`` is each field's value
    as ``popcount(mask)`` bits, most significant first, concatenated in field order,
    left-aligned and zero-padded to ``profile.ev_length`` bytes. Fixed fields (mask 0) have the
    single value 0 and contribute no bits.

    Parameters
    ----------
    profile : EvProfile
        A GENERATED profile.
    count : int
        1 to ``profile.distinct_evs``.

    Returns
    -------
    list of bytes

    Raises
    ------
    EvProfileError
        ``E2BIG`` if ``count`` exceeds the distinct EVs the profile can make (the message says
        how many); ``EINVAL`` for a count below 1 or a profile that is not GENERATED.
    """
    _check_count(profile, count)
    fields = profile.fields
    pad_bits = 8 * profile.ev_length - profile.ev_bits
    digits = [ev_field.min_val for ev_field in fields]
    evs = []
    for _ in range(count):
        stream = 0
        for ev_field, digit in zip(fields, digits, strict=True):
            stream = (stream << ev_field.ev_bits) | digit
        evs.append((stream << pad_bits).to_bytes(profile.ev_length, "big"))
        # Advance the odometer; the last field is the fastest digit.
        for position in reversed(range(len(fields))):
            if digits[position] < fields[position].max_val:
                digits[position] += 1
                break
            digits[position] = fields[position].min_val
    return evs


def generate_entries(profile, count, *, num_ports=1):
    """The first ``count`` entries of a GENERATED profile's EV array: ``(ev, port)`` pairs.

    EV ``k`` is ``generate(profile, count)[k]``; its egress port is ``k % num_ports + 1``
    (ports are 1-based; *project choice*: the planes are taken in turn).

    Parameters
    ----------
    profile : EvProfile
    count : int
    num_ports : int
        Number of egress ports (network planes), at least 1.

    Returns
    -------
    list of (bytes, int)
    """
    if isinstance(num_ports, bool) or not isinstance(num_ports, int) or num_ports < 1:
        raise EvProfileError("num_ports", f"must be an integer of at least 1, not {num_ports!r}")
    return [(ev, index % num_ports + 1) for index, ev in enumerate(generate(profile, count))]


# ---------------------------------------------------------------------------------------------
# JSON profile documents
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EvProfileSpec:
    """A profile document as read by :func:`load_profile_json`.

    Parameters
    ----------
    profile : EvProfile
    evs : tuple of bytes
        The EVs to expand: the document's ``"evs"``, or the first ``count`` generated ones.
    count : int or None
        The document's ``"count"``, or ``None`` when it listed the EVs.
    """

    profile: EvProfile
    evs: tuple[bytes, ...] = ()
    count: int | None = None

    def __post_init__(self):
        if not isinstance(self.profile, EvProfile):
            raise EvProfileError("profile", f"must be an EvProfile, not {self.profile!r}")
        evs = tuple(self.evs)
        for index, ev in enumerate(evs):
            _check_ev(ev, f"evs[{index}]")
        object.__setattr__(self, "evs", evs)


_FORMAT_MODES = {"stev": EvFormatMode.STEV, "udp": EvFormatMode.UDP, "srv6": EvFormatMode.SRV6}
_PROFILE_MODES = {"explicit": EvMode.EXPLICIT, "generated": EvMode.GENERATED}
_HEX_INT = re.compile(r"0[xX][0-9a-fA-F]+")
_DEC_INT = re.compile(r"[0-9]+")
_HEX_BYTES = re.compile(r"(?:[0-9a-fA-F]{2})+")


def _json_object(value, path, required, optional=()):
    if not isinstance(value, dict):
        raise EvProfileError(path, f"must be a JSON object, not {value!r}")
    for key in value:
        if key not in required and key not in optional:
            allowed = ", ".join(list(required) + list(optional))
            raise EvProfileError(f"{path}.{key}", f"unknown key (allowed: {allowed})")
    for key in required:
        if key not in value:
            raise EvProfileError(f"{path}.{key}", "missing")
    return value


def _json_int(value, path):
    # Integers may be written as strings so that 256-bit masks and hex values stay readable.
    if isinstance(value, str):
        if _HEX_INT.fullmatch(value):
            return int(value, 16)
        if _DEC_INT.fullmatch(value):
            return int(value, 10)
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EvProfileError(
        path, f"must be an integer, or a string of \"0x\" and hex digits or of decimal "
        f"digits, not {value!r}")


def _json_mode(value, path, modes):
    if isinstance(value, str) and value.lower() in modes:
        return modes[value.lower()]
    raise EvProfileError(path, f"must be one of {', '.join(modes)}, not {value!r}")


def _json_list(value, path):
    if not isinstance(value, list):
        raise EvProfileError(path, f"must be a JSON list, not {value!r}")
    return value


def _json_ev(value, path):
    if not isinstance(value, str):
        raise EvProfileError(path, f"must be a string of hex digits, not {value!r}")
    if value[:2] in ("0x", "0X"):
        raise EvProfileError(
            path, f"{value!r}: write the EV's bytes as bare hex digits, byte 0 first, "
            f"without 0x (it is a byte string, not an integer)")
    if not _HEX_BYTES.fullmatch(value):
        raise EvProfileError(
            path, f"{value!r} is not whole bytes of hex digits (two digits per byte, "
            f"1 to {EV_MAX_BYTES} bytes)")
    ev = bytes.fromhex(value)
    if len(ev) > EV_MAX_BYTES:
        raise EvProfileError(
            path, f"{len(ev)} bytes, longer than the {EV_MAX_BYTES} an EV may have", "E2BIG")
    return ev


def load_profile_json(obj):
    """Read a profile document (already parsed from JSON) into an :class:`EvProfileSpec`.

    The document is::

        {"format": {"mode": "stev" | "udp" | "srv6", "widths": [...]},
         "profile": {"mode": "explicit" | "generated",
                     "fields": [{"width": .., "init_val": .., "min_val": .., "max_val": ..,
                                 "mask": ..}, ...],
                     "evs": ["<hex bytes, byte 0 first>", ...]  # or, if generated, "count": N
        }}

    Integers are JSON integers or strings (``"0x1ff"``, ``"511"``). Of a field only ``width``
    is required: ``init_val``, ``min_val`` and ``mask`` default to 0 and ``max_val`` to the
    largest value the mask's bits hold. An EV is 1 to 32 bytes of hex; a short EV reads as if
    zero-padded on the right. ``count`` (GENERATED only) generates that many EVs.

    Raises
    ------
    EvProfileError
        For anything malformed, naming its path in the document (``profile.fields[2].mask``).
    """
    _json_object(obj, "document", required=("format", "profile"))
    format_json = _json_object(obj["format"], "format", required=("mode", "widths"))
    format_mode = _json_mode(format_json["mode"], "format.mode", _FORMAT_MODES)
    widths = [_json_int(width, f"format.widths[{index}]")
              for index, width in enumerate(_json_list(format_json["widths"], "format.widths"))]
    try:
        fmt = EvFormat(mode=format_mode, widths=widths)
    except EvProfileError as error:
        raise error.within("format") from None

    profile_json = _json_object(
        obj["profile"], "profile", required=("mode", "fields"), optional=("evs", "count"))
    profile_mode = _json_mode(profile_json["mode"], "profile.mode", _PROFILE_MODES)
    fields = []
    for index, field_json in enumerate(_json_list(profile_json["fields"], "profile.fields")):
        path = f"profile.fields[{index}]"
        _json_object(field_json, path, required=("width",),
                     optional=("init_val", "min_val", "max_val", "mask"))
        arguments = {key: _json_int(value, f"{path}.{key}") for key, value in field_json.items()}
        try:
            fields.append(EvField(**arguments))
        except EvProfileError as error:
            raise error.within(path) from None
    try:
        profile = EvProfile(format=fmt, mode=profile_mode, fields=fields)
    except EvProfileError as error:
        raise error.within("profile") from None

    has_evs, has_count = "evs" in profile_json, "count" in profile_json
    if has_evs and has_count:
        raise EvProfileError("profile.count", "give either \"evs\" or \"count\", not both")
    if has_count:
        if profile_mode != EvMode.GENERATED:
            raise EvProfileError(
                "profile.count", "only a generated profile can generate EVs; an explicit "
                "profile lists them in \"evs\"")
        count = _json_int(profile_json["count"], "profile.count")
        try:
            evs = generate(profile, count)
        except EvProfileError as error:
            raise error.within("profile") from None
        return EvProfileSpec(profile=profile, evs=evs, count=count)
    if not has_evs:
        raise EvProfileError(
            "profile.evs", "missing: list the EVs (or, in a generated profile, give \"count\")")
    ev_list = _json_list(profile_json["evs"], "profile.evs")
    if not ev_list:
        raise EvProfileError("profile.evs", "must list at least one EV")
    evs = [_json_ev(ev, f"profile.evs[{index}]") for index, ev in enumerate(ev_list)]
    return EvProfileSpec(profile=profile, evs=evs)
