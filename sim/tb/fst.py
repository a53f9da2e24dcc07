"""Read what the project needs from an FST waveform file: its time range and its signal names.

FST (GTKWave's Fast Signal Trace format, written by Verilator and Icarus) is a sequence of
blocks, each a type byte and a big-endian 64-bit length. The header block carries the first
and last time stamp and the time scale; the hierarchy block, compressed with gzip or LZ4,
carries the scopes and variables. Value changes are not decoded here. GTKWave's ``fst2vcd``
(Debian package ``gtkwave``) reads everything.
"""

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FstHeader", "read_header", "signal_names", "FstError"]

_HEADER = 0
_HIERARCHY_GZIP = 4
_HIERARCHY_LZ4 = 6
_HIERARCHY_LZ4_TWICE = 7
_SCOPE = 254
_UPSCOPE = 255
_ATTRIBUTE_BEGIN = 252
_ATTRIBUTE_END = 253


class FstError(ValueError):
    pass


@dataclass(frozen=True)
class FstHeader:
    """``start``/``end``: first and last time stamp, in units of ``10 ** timescale`` s."""
    start: int
    end: int
    timescale: int
    scopes: int
    variables: int

    def seconds(self, stamp):
        return stamp * 10.0 ** self.timescale


def _blocks(data):
    at = 0
    while at + 9 <= len(data):
        kind = data[at]
        length, = struct.unpack_from(">Q", data, at + 1)
        if length < 8 or at + 1 + length > len(data):
            raise FstError(f"block of type {kind} at byte {at} runs past the end of the file")
        yield kind, data[at + 9:at + 1 + length]
        at += 1 + length


def read_header(path):
    """The :class:`FstHeader` of the FST file at ``path``. Raises :class:`FstError`."""
    data = Path(path).read_bytes()
    for kind, body in _blocks(data):
        if kind == _HEADER:
            start, end, _endian, _memory, scopes, variables = struct.unpack_from(">QQdQQQ", body)
            timescale, = struct.unpack_from(">b", body, 64)
            return FstHeader(start, end, timescale, scopes, variables)
    raise FstError(f"{path}: no FST header block")


def _lz4_block(source, size):
    """Decompress one raw LZ4 block (what ``LZ4_compress_default`` writes)."""
    out = bytearray()
    at = 0
    while at < len(source):
        token = source[at]
        at += 1
        literals = token >> 4
        if literals == 15:
            while True:
                extra = source[at]
                at += 1
                literals += extra
                if extra != 255:
                    break
        out += source[at:at + literals]
        at += literals
        if at >= len(source):
            break
        offset = source[at] | source[at + 1] << 8
        at += 2
        match = (token & 15) + 4
        if match == 19:
            while True:
                extra = source[at]
                at += 1
                match += extra
                if extra != 255:
                    break
        start = len(out) - offset
        if offset >= match:
            out += out[start:start + match]
        else:
            for index in range(match):
                out.append(out[start + index])
    if len(out) != size:
        raise FstError(f"LZ4 block decompressed to {len(out)} bytes, not {size}")
    return bytes(out)


def _hierarchy(data):
    for kind, body in _blocks(data):
        if kind == _HIERARCHY_GZIP:
            return gzip.decompress(body[8:]) if body[8:10] == b"\x1f\x8b" else zlib.decompress(
                body[8:])
        if kind == _HIERARCHY_LZ4:
            size, = struct.unpack_from(">Q", body)
            return _lz4_block(body[8:], size)
        if kind == _HIERARCHY_LZ4_TWICE:
            size, = struct.unpack_from(">Q", body)
            middle, at = _varint(body, 8)
            return _lz4_block(_lz4_block(body[at:], middle), size)
    raise FstError("no hierarchy block")


def _varint(data, at):
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _string(data, at):
    end = data.index(0, at)
    return data[at:end].decode("latin-1"), end + 1


def signal_names(path):
    """Every variable of the FST file at ``path`` as ``(dotted name, width in bits)``, in the
    file's order (scopes joined with ``.``, as GTKWave shows them)."""
    text = _hierarchy(Path(path).read_bytes())
    scopes = []
    names = []
    at = 0
    while at < len(text):
        tag = text[at]
        at += 1
        if tag == _SCOPE:
            at += 1                                 # scope type
            name, at = _string(text, at)
            _component, at = _string(text, at)
            scopes.append(name)
        elif tag == _UPSCOPE:
            scopes.pop()
        elif tag == _ATTRIBUTE_BEGIN:
            at += 2                                 # attribute type and subtype
            _name, at = _string(text, at)
            _argument, at = _varint(text, at)
        elif tag == _ATTRIBUTE_END:
            pass
        else:                                       # a variable: tag is its type
            at += 1                                 # direction
            name, at = _string(text, at)
            width, at = _varint(text, at)
            _alias, at = _varint(text, at)
            names.append((".".join([*scopes, name]), width))
    return names
