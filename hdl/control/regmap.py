"""A register map built from one description: the bus decoder, the driver's addresses, the docs
and the exports (C header, JSON, SVD: ``hdl/control/export.py``) all come from the same
:class:`RegisterMap`.

Blocks keep plain control ports (a command stream and its response stream, status and counter
signals, event streams); this module maps them onto one 32-bit register bus. Four kinds of
block exist:

``CommandBlock``
    Argument words (write-only), a ``GO`` word and a ``STATUS`` word, response words
    (read-only). Writing ``GO`` issues the argument words as one command on the block's
    request stream; ``STATUS.busy`` stays set until the response arrives in the response
    words. A ``GO`` while busy is ignored and counted in ``STATUS.overruns``.
``StatusBlock``
    Read-only words showing a signal (counters, states).
``ControlBlock``
    Read/write words driving a signal (configuration registers), with reset values.
``QueueBlock``
    The head entry of an event stream in read-only words, ``STATUS.valid`` when there is
    one; writing ``POP`` removes it.

Word addresses: block ``k`` starts at ``k * block_words``. The bus is word-addressed; a CPU
bridge puts word ``w`` at byte offset ``4 * w``, which is what the exports show.

Field placement
---------------
A port's layout is packed for the datapath, so its fields may cross 32-bit word boundaries.
The bus shows each field at its own *register position* instead (:func:`place`): the fields in
layout order, each right after the previous one, except that a field of up to 32 bits that
would cross a word boundary starts the next word, and a field wider than 32 bits starts on a
word boundary. The decoder only rewires bits between register positions and the port's own
layout, so the datapath's layouts stay packed. A block may name fields in ``straddle`` to keep
them packed (crossing a word). :class:`RegisterMap` checks every block's placement, including a
block that places its own fields, and refuses any other field that crosses a word with an error
naming it.
"""

from dataclasses import dataclass
from functools import cached_property

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib import enum as amaranth_enum
from amaranth.lib.wiring import In, Out

from ..util import validating

__all__ = ["CommandBlock", "StatusBlock", "ControlBlock", "QueueBlock", "RegisterMap",
           "RegisterBus", "bus_signature", "flatten", "place", "Field", "Register",
           "RegisterField", "WORD_BITS", "WORD_BYTES"]

WORD_BITS = 32
WORD_BYTES = WORD_BITS // 8


def _leaves(layout, prefix=""):
    """``[(path, offset, width, shape)]`` of every leaf field of a layout, in offset order."""
    out = []
    if isinstance(layout, data.ArrayLayout):
        element = layout.elem_shape
        size = Shape.cast(element).width if not isinstance(element, data.Layout) else element.size
        for index in range(layout.length):
            for path, offset, width, shape in _leaves(element, f"{prefix}[{index}]"):
                out.append((path, index * size + offset, width, shape))
        return out
    if isinstance(layout, data.StructLayout):
        for name, field in layout:
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(field.shape, data.Layout):
                for sub, offset, width, shape in _leaves(field.shape, path):
                    out.append((sub, field.offset + offset, width, shape))
            else:
                out.append((path, field.offset, Shape.cast(field.shape).width, field.shape))
        return sorted(out, key=lambda item: item[1])
    width = layout.size if isinstance(layout, data.Layout) else Shape.cast(layout).width
    return [(prefix or "value", 0, width, layout)]


def flatten(layout, prefix=""):
    """``[(path, offset, width)]`` of every leaf field of a layout, in offset order.

    Struct members are joined with ``.``, array elements with ``[i]``; an enum-shaped field
    is a leaf. Offsets are the layout's own (the port's bits), not register positions.
    """
    return [(path, offset, width) for path, offset, width, _ in _leaves(layout, prefix)]


def _is_enum(shape):
    return isinstance(shape, type) and issubclass(shape, amaranth_enum.Enum)


@dataclass(frozen=True)
class Field:
    """One leaf field of a block part as the bus shows it.

    ``offset`` is the bit position in the part's words (word ``offset // 32``, bit
    ``offset % 32``); ``source`` is the bit position in the port's value; ``enum`` the field's
    enum class, if it has one.
    """
    path: str
    offset: int
    width: int
    source: int
    enum: type | None = None

    @property
    def word(self):
        return self.offset // WORD_BITS

    @property
    def bit(self):
        return self.offset % WORD_BITS

    @property
    def straddles(self):
        """A field of up to 32 bits that crosses a word boundary, or a wider field that does
        not start on one."""
        if self.width > WORD_BITS:
            return self.bit != 0
        return self.bit + self.width > WORD_BITS

    def pieces(self):
        """``[(word, bit, lsb, length)]``: the field cut at word boundaries; ``lsb`` is the
        piece's first bit within the field."""
        out, lsb = [], 0
        while lsb < self.width:
            position = self.offset + lsb
            length = min(self.width - lsb, WORD_BITS - position % WORD_BITS)
            out.append((position // WORD_BITS, position % WORD_BITS, lsb, length))
            lsb += length
        return out


def place(layout, *, straddle=(), enums=None):
    """Register positions of ``layout``'s leaf fields (see the module docstring), as a tuple
    of :class:`Field`. Fields whose path is in ``straddle`` stay packed. ``enums`` maps paths
    to an enum class for fields whose shape is a plain integer (a block's command codes)."""
    fields, cursor = [], 0
    for path, source, width, shape in _leaves(layout):
        if path not in straddle:
            bit = cursor % WORD_BITS
            if (width > WORD_BITS and bit) or (width <= WORD_BITS and bit + width > WORD_BITS):
                cursor += WORD_BITS - bit
        enum_type = shape if _is_enum(shape) else (enums or {}).get(path)
        fields.append(Field(path, cursor, width, source, enum_type))
        cursor += width
    return tuple(fields)


def _words(fields):
    return max(1, -(-max((f.offset + f.width for f in fields), default=0) // WORD_BITS))


def _command_enums(block):
    return {"cmd": block.commands, "op": block.commands} if block.commands else None


@dataclass(frozen=True)
class CommandBlock:
    name: str
    request: data.Layout
    response: data.Layout
    doc: str
    commands: type | None = None        #: the enum of the request's ``op`` field, for docs
    straddle: tuple = ()                #: fields allowed to cross a word boundary

    STATUS = 0
    GO = 1
    ARGS = 2

    @cached_property
    def request_fields(self):
        return place(self.request, straddle=self.straddle, enums=_command_enums(self))

    @cached_property
    def response_fields(self):
        return place(self.response, straddle=self.straddle)

    @property
    def request_words(self):
        return _words(self.request_fields)

    @property
    def response_words(self):
        return _words(self.response_fields)

    @property
    def response_base(self):
        return self.ARGS + self.request_words

    @property
    def words(self):
        return self.response_base + self.response_words


@dataclass(frozen=True)
class StatusBlock:
    name: str
    layout: data.Layout
    doc: str
    straddle: tuple = ()

    @cached_property
    def fields(self):
        return place(self.layout, straddle=self.straddle)

    @property
    def words(self):
        return _words(self.fields)


@dataclass(frozen=True)
class ControlBlock:
    name: str
    layout: data.Layout
    doc: str
    init: dict | None = None            #: reset values by field name (a layout's const init)
    straddle: tuple = ()

    @cached_property
    def fields(self):
        return place(self.layout, straddle=self.straddle)

    @property
    def words(self):
        return _words(self.fields)


@dataclass(frozen=True)
class QueueBlock:
    name: str
    layout: data.Layout
    doc: str
    straddle: tuple = ()

    STATUS = 0
    POP = 1
    DATA = 2

    @cached_property
    def fields(self):
        return place(self.layout, straddle=self.straddle)

    @property
    def words(self):
        return self.DATA + _words(self.fields)


def _parts(block):
    """``[(part name, fields)]`` of a block: a command block's request and response, the
    layout of the others."""
    if isinstance(block, CommandBlock):
        return [("request", block.request_fields), ("response", block.response_fields)]
    return [("fields", block.fields)]


# ---------------------------------------------------------------------------------------------
# The word-level view (what the C header and the SVD show)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RegisterField:
    """A field, or the piece of a field wider than a word, in one register.

    ``name`` is an identifier (``widths[3]`` becomes ``widths_3``; the pieces of a wide
    field are ``<name>_w0``, ``<name>_w1``, ... from its least significant word); ``path`` the
    layout field; ``lsb`` the piece's first bit within that field.
    """
    name: str
    path: str
    bit: int
    width: int
    lsb: int
    field_width: int
    access: str
    reset: int
    enum: type | None


@dataclass(frozen=True)
class Register:
    """One 32-bit word of a block: ``word`` is its offset in the block, in words."""
    name: str
    word: int
    access: str
    reset: int
    doc: str
    fields: tuple


def _identifier(path):
    return path.replace("[", "_").replace("]", "").replace(".", "_")


def _field_registers(prefix, fields, first_word, access, doc, *, init=None, count=None,
                     single_names=False):
    """Registers for a part's words: named ``<prefix><k>``, or after the one field piece the
    word holds when ``single_names``."""
    by_word = {}
    for field in fields:
        reset = (init or {}).get(field.path, 0)
        for word, bit, lsb, length in field.pieces():
            name = _identifier(field.path)
            if field.width > WORD_BITS:
                name += f"_w{lsb // WORD_BITS}"
            piece_reset = (int(getattr(reset, "value", reset)) >> lsb) & ((1 << length) - 1)
            by_word.setdefault(word, []).append(RegisterField(
                name, field.path, bit, length, lsb, field.width, access, piece_reset,
                field.enum))
    count = _words(fields) if count is None else count
    out = []
    for index in range(count):
        pieces = tuple(sorted(by_word.get(index, []), key=lambda piece: piece.bit))
        name = (pieces[0].name.upper() if single_names and len(pieces) == 1
                else f"{prefix}{index}")
        reset = sum(piece.reset << piece.bit for piece in pieces)
        out.append(Register(name, first_word + index, access, reset,
                            doc.format(index=index), pieces))
    return out


class RegisterMap:
    """Blocks in address order. ``block_words`` is the address stride between blocks.

    Refuses a field that crosses a 32-bit word boundary (or a field wider than 32 bits that
    does not start on one) unless its block names it in ``straddle``.
    """

    def __init__(self, blocks, *, block_words=256, title="Register map"):
        names = [block.name for block in blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"Block names must be unique, not {names!r}")
        for block in blocks:
            self._check_placement(block)
            if block.words > block_words:
                raise ValueError(f"Block {block.name} needs {block.words} words, more than "
                                 f"the stride of {block_words}")
        self.blocks = tuple(blocks)
        self.block_words = block_words
        self.title = title
        self.address_bits = max(1, (len(blocks) * block_words - 1).bit_length())

    @staticmethod
    def _check_placement(block):
        paths = {field.path for _, fields in _parts(block) for field in fields}
        unknown = sorted(set(block.straddle) - paths)
        if unknown:
            raise ValueError(f"Block {block.name}: straddle names no field(s) {unknown}; "
                             f"fields: {sorted(paths)}")
        for part, fields in _parts(block):
            for field in fields:
                if field.straddles and field.path not in block.straddle:
                    raise ValueError(
                        f"Block {block.name} {part} field {field.path!r} ({field.width} bits "
                        f"at word {field.word} bit {field.bit}) straddles a 32-bit word: a "
                        f"field must fit in one word, or start on a word boundary when it is "
                        f"wider; list it in the block's straddle=(...) to allow it")

    def base(self, name):
        for index, block in enumerate(self.blocks):
            if block.name == name:
                return index * self.block_words
        raise KeyError(f"No register block named {name!r}")

    def block(self, name):
        return self.blocks[self.base(name) // self.block_words]

    def reset_value(self, name):
        """A control block's words at reset, as one integer (word ``k`` in bits
        ``32k..32k+31``); 0 for the other kinds."""
        return sum(register.reset << (WORD_BITS * index)
                   for index, register in enumerate(self.registers(name)))

    def registers(self, name):
        """The block's 32-bit words as :class:`Register` s, in address order."""
        block = self.block(name)
        if isinstance(block, CommandBlock):
            status = Register("STATUS", block.STATUS, "R", 0,
                              "bit 0 busy; bits 16-31 GO writes ignored while busy", (
                                  RegisterField("busy", "busy", 0, 1, 0, 1, "R", 0, None),
                                  RegisterField("overruns", "overruns", 16, 16, 0, 16, "R", 0,
                                                None)))
            go = Register("GO", block.GO, "W", 0, "write (any value): issue the command", ())
            return tuple([status, go] + _field_registers(
                "ARGS", block.request_fields, block.ARGS, "W",
                "request word {index} (write-only: reads return 0)",
                count=block.request_words) + _field_registers(
                "RESULT", block.response_fields, block.response_base, "R",
                "response word {index}", count=block.response_words))
        if isinstance(block, QueueBlock):
            status = Register("STATUS", block.STATUS, "R", 0, "bit 0: an entry is waiting", (
                RegisterField("valid", "valid", 0, 1, 0, 1, "R", 0, None),))
            pop = Register("POP", block.POP, "W", 0, "write (any value): remove the head entry",
                           ())
            return tuple([status, pop] + _field_registers(
                "DATA", block.fields, block.DATA, "R", "head entry word {index}"))
        if isinstance(block, ControlBlock):
            registers = _field_registers("WORD", block.fields, 0, "RW", "read/write word {index}",
                                         init=block.init, single_names=True)
        else:
            registers = _field_registers("WORD", block.fields, 0, "R", "read-only word {index}",
                                         single_names=True)
        names = [register.name for register in registers]
        if len(set(names)) != len(names):
            raise ValueError(f"Block {block.name}: register names clash: {names}")
        return tuple(registers)

    def to_dict(self):
        """Everything a driver needs: per block its kind, base word, words, field register
        positions (``[path, offset, width]``, offset in bits from the part's first word) and
        the word-level registers. ``hdl/control/export.py`` documents the keys."""
        out = {}
        for block in self.blocks:
            entry = {"base": self.base(block.name), "kind": type(block).__name__,
                     "doc": block.doc, "words": block.words}
            if isinstance(block, CommandBlock):
                entry["request"] = [(f.path, f.offset, f.width) for f in block.request_fields]
                entry["response"] = [(f.path, f.offset, f.width)
                                     for f in block.response_fields]
                entry["args"] = block.ARGS
                entry["request_words"] = block.request_words
                entry["response_base"] = block.response_base
                entry["response_words"] = block.response_words
                entry["commands"] = ({member.name: member.value for member in block.commands}
                                     if block.commands else None)
            else:
                entry["fields"] = [(f.path, f.offset, f.width) for f in block.fields]
                if isinstance(block, QueueBlock):
                    entry["data"] = block.DATA
            if isinstance(block, ControlBlock):
                entry["init"] = {path: int(getattr(value, "value", value))
                                 for path, value in (block.init or {}).items()}
            entry["registers"] = [{
                "name": register.name, "word": register.word,
                "byte_offset": register.word * WORD_BYTES, "access": register.access,
                "reset": register.reset, "doc": register.doc,
                "fields": [{
                    "name": piece.name, "path": piece.path, "bit": piece.bit,
                    "width": piece.width, "lsb": piece.lsb, "field_width": piece.field_width,
                    "access": piece.access, "reset": piece.reset,
                    "enum": ({member.name: member.value for member in piece.enum}
                             if piece.enum else None),
                } for piece in register.fields],
            } for register in self.registers(block.name)]
            out[block.name] = entry
        return out

    def markdown(self):
        """The register map as ``docs/registers.md`` shows it (a test compares)."""
        lines = [f"# {self.title}", "",
                 "Generated from `hdl/control/nicmap.py` by `mrc-nic registers`; do not edit.",
                 "", "The bus is word-addressed (32-bit words); a CPU bridge puts word `w` at "
                 "byte offset `4 * w`. Field positions are bit offsets in the block's word "
                 "range (word = offset // 32, bit = offset % 32). No field crosses a word "
                 "boundary; a field wider than 32 bits starts on one and fills whole words "
                 "from its least significant bits.", "",
                 "## Exports", "",
                 "The same description as a C header, JSON and CMSIS-SVD 1.3, for drivers "
                 "and register viewers (addresses in bytes; `--config NicConfig.json` for "
                 "another configuration, `--out FILE` to write a file):", "",
                 "```sh",
                 "mrc-nic registers --format md   --out docs/registers.md   # this page",
                 "mrc-nic registers --format c    --out mrc_nic_regs.h      # #defines, "
                 "MRC_GET/MRC_SET",
                 "mrc-nic registers --format json --out mrc_nic_regs.json   # to_dict(), "
                 "versioned",
                 "mrc-nic registers --format svd  --out mrc_nic.svd         # CMSIS-SVD 1.3",
                 "```", "",
                 "The C header names every word `MRC_<BLOCK>_<REGISTER>` (`_ADDR`, `_OFFSET`, "
                 "`_RESET`) and every field `MRC_<BLOCK>_<REGISTER>_<FIELD>` (`_SHIFT`, "
                 "`_WIDTH`, `_MASK`, `_RESET`, and one `#define` per enum value); a field "
                 "wider than 32 bits appears as pieces `<FIELD>_W0`, `<FIELD>_W1`, ... from "
                 "its least significant word. `MRC_BASE` (default 0) is the NIC's byte "
                 "address. The JSON's keys are documented in `hdl/control/export.py`.", ""]
        for block in self.blocks:
            base = self.base(block.name)
            lines += [f"## `{block.name}` at word 0x{base:04x} (byte 0x{base * WORD_BYTES:04x}, "
                      f"{type(block).__name__})", "", block.doc, ""]
            if isinstance(block, CommandBlock):
                lines += ["| word | name | access | meaning |", "| ---: | --- | --- | --- |",
                          f"| 0x{base + block.STATUS:04x} | STATUS | R | bit 0 busy, "
                          f"bits 16-31 GO writes ignored while busy |",
                          f"| 0x{base + block.GO:04x} | GO | W | issue the command |",
                          f"| 0x{base + block.ARGS:04x} | ARGS[{block.request_words}] | W | "
                          f"request fields below (write-only: reads return 0) |",
                          f"| 0x{base + block.response_base:04x} | "
                          f"RESULT[{block.response_words}] | R | response fields below |", ""]
                lines += self._field_table("request", block.request_fields, base + block.ARGS)
                lines += self._field_table("response", block.response_fields,
                                           base + block.response_base)
                if block.commands is not None:
                    lines += ["Command codes (the `cmd`/`op` field):", ""]
                    lines += [f"- {member.value}: `{member.name}`" +
                              (f": {member.__doc__}" if member.__doc__ and
                               member.__doc__ != type(member).__doc__ else "")
                              for member in block.commands]
                    lines.append("")
            elif isinstance(block, QueueBlock):
                lines += ["| word | name | access | meaning |", "| ---: | --- | --- | --- |",
                          f"| 0x{base + block.STATUS:04x} | STATUS | R | bit 0: an entry "
                          f"is waiting |",
                          f"| 0x{base + block.POP:04x} | POP | W | remove the head entry |",
                          f"| 0x{base + block.DATA:04x} | DATA | R | head entry, below |", ""]
                lines += self._field_table("entry", block.fields, base + block.DATA)
            elif isinstance(block, ControlBlock):
                lines += self._field_table("read/write words", block.fields, base)
                if block.init:
                    lines += ["Reset values: " + ", ".join(
                        f"`{k}` = {v}" for k, v in block.init.items()), ""]
            else:
                lines += self._field_table("read-only words", block.fields, base)
        return "\n".join(lines).rstrip() + "\n"

    @staticmethod
    def _field_table(title, fields, base):
        lines = [f"{title.capitalize()}:", "", "| word | bit | bits | field |",
                 "| ---: | ---: | ---: | --- |"]
        for field in fields:
            lines.append(f"| 0x{base + field.word:04x} | {field.bit} | {field.width} | "
                         f"`{field.path}` |")
        lines.append("")
        return lines


# ---------------------------------------------------------------------------------------------
# The decoder
# ---------------------------------------------------------------------------------------------

def bus_signature(address_bits):
    """The register bus, from the master's side: a read returns ``r_data`` one cycle after
    ``r_en``; writes take effect at once."""
    return wiring.Signature({
        "addr": Out(address_bits),
        "w_data": Out(WORD_BITS),
        "w_en": Out(1),
        "r_en": Out(1),
        "r_data": In(WORD_BITS),
    })


def _word_pieces(fields):
    """``{word: [(bit, source, length)]}``: which port bits each word of a part holds."""
    out = {}
    for field in fields:
        for word, bit, lsb, length in field.pieces():
            out.setdefault(word, []).append((bit, field.source + lsb, length))
    return out


def _read_word(value, pieces):
    """The 32-bit word holding ``pieces`` of ``value``, zeros elsewhere."""
    parts, at = [], 0
    for bit, source, length in sorted(pieces):
        if bit > at:
            parts.append(Const(0, bit - at))
        parts.append(value[source:source + length])
        at = bit + length
    if at < WORD_BITS:
        parts.append(Const(0, WORD_BITS - at))
    return Cat(*parts)


class RegisterBus(wiring.Component):
    """The decoder of a :class:`RegisterMap`: the bus on one side, the blocks' plain control
    ports on the other (named after the blocks: ``<name>_req``/``<name>_resp`` for command
    blocks, ``<name>`` for status and queue blocks). Fields sit at their register positions
    on the bus and at their layout positions on the ports: only wiring between the two.

    Members
    -------
    bus : ``In(bus_signature(regmap.address_bits))``
    """

    def __init__(self, regmap):
        with validating(self):
            if not isinstance(regmap, RegisterMap):
                raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        self._map = regmap
        members = {"bus": In(bus_signature(regmap.address_bits))}
        for block in regmap.blocks:
            if isinstance(block, CommandBlock):
                members[f"{block.name}_req"] = Out(stream.Signature(block.request))
                members[f"{block.name}_resp"] = In(stream.Signature(block.response))
            elif isinstance(block, StatusBlock):
                members[block.name] = In(block.layout)
            elif isinstance(block, ControlBlock):
                members[block.name] = Out(block.layout, init=block.init or {})
            else:
                members[block.name] = In(stream.Signature(block.layout))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        read_words = {}                 # absolute word address -> value to read

        def write_pieces(target, pieces):
            for bit, source, length in pieces:
                m.d.sync += target[source:source + length].eq(bus.w_data[bit:bit + length])

        for block in self._map.blocks:
            base = self._map.base(block.name)
            if isinstance(block, CommandBlock):
                req = getattr(self, f"{block.name}_req")
                resp = getattr(self, f"{block.name}_resp")
                args = Signal(block.request.size, name=f"{block.name}_args")
                result = Signal(block.response.size, name=f"{block.name}_result")
                busy = Signal(name=f"{block.name}_busy")
                issued = Signal(name=f"{block.name}_issued")   # request accepted
                overruns = Signal(16, name=f"{block.name}_overruns")
                m.d.comb += [
                    req.payload.eq(args),
                    req.valid.eq(busy & ~issued),
                    resp.ready.eq(busy & issued),
                ]
                with m.If(req.valid & req.ready):
                    m.d.sync += issued.eq(1)
                with m.If(resp.valid & resp.ready):
                    m.d.sync += [busy.eq(0), issued.eq(0),
                                 result.eq(Value.cast(resp.payload))]
                for index, pieces in _word_pieces(block.request_fields).items():
                    with m.If(bus.w_en & (bus.addr == base + block.ARGS + index) & ~busy):
                        write_pieces(args, pieces)
                with m.If(bus.w_en & (bus.addr == base + block.GO)):
                    with m.If(busy):
                        m.d.sync += overruns.eq(overruns + 1)
                    with m.Else():
                        m.d.sync += busy.eq(1)
                read_words[base + block.STATUS] = Cat(busy, Const(0, 15), overruns)
                # ARGS are write-only (read as 0): read back, every argument flip-flop also
                # fed the read multiplexer, and with the results and counters that hub was the
                # transport self-test's worst routing congestion (docs/boards.md).
                for index, pieces in _word_pieces(block.response_fields).items():
                    read_words[base + block.response_base + index] = _read_word(result, pieces)
            elif isinstance(block, StatusBlock):
                value = Value.cast(getattr(self, block.name))
                for index, pieces in _word_pieces(block.fields).items():
                    read_words[base + index] = _read_word(value, pieces)
            elif isinstance(block, ControlBlock):
                value = Value.cast(getattr(self, block.name))
                for index, pieces in _word_pieces(block.fields).items():
                    read_words[base + index] = _read_word(value, pieces)
                    with m.If(bus.w_en & (bus.addr == base + index)):
                        write_pieces(value, pieces)
            else:
                queue = getattr(self, block.name)
                m.d.comb += queue.ready.eq(bus.w_en & (bus.addr == base + block.POP))
                read_words[base + block.STATUS] = queue.valid
                payload = Value.cast(queue.payload)
                for index, pieces in _word_pieces(block.fields).items():
                    read_words[base + block.DATA + index] = _read_word(payload, pieces)

        with m.If(bus.r_en):
            m.d.sync += bus.r_data.eq(0)
            with m.Switch(bus.addr):
                for address, value in read_words.items():
                    with m.Case(address):
                        m.d.sync += bus.r_data.eq(value)
        return m
