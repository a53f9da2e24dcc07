"""A register map built from one description: the bus decoder, the driver's addresses and the
docs all come from the same :class:`RegisterMap`.

Blocks keep plain control ports (a command stream and its response stream, status and counter
signals, event streams); this module maps them onto one 32-bit register bus. Three kinds of
block exist:

``CommandBlock``
    Argument words (read/write), a ``GO`` word and a ``STATUS`` word, response words
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

Word addresses: block ``k`` starts at ``k * block_words``. The bus is word-addressed.
"""

from dataclasses import dataclass

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import validating

__all__ = ["CommandBlock", "StatusBlock", "ControlBlock", "QueueBlock", "RegisterMap",
           "RegisterBus", "bus_signature", "flatten"]

WORD_BITS = 32


def flatten(layout, prefix=""):
    """``[(path, offset, width)]`` of every leaf field of a layout, in offset order.

    Struct members are joined with ``.``, array elements with ``[i]``; an enum-shaped field
    is a leaf.
    """
    out = []
    if isinstance(layout, data.ArrayLayout):
        element = layout.elem_shape
        size = Shape.cast(element).width if not isinstance(element, data.Layout) else element.size
        for index in range(layout.length):
            for path, offset, width in flatten(element, f"{prefix}[{index}]"):
                out.append((path, index * size + offset, width))
        return out
    if isinstance(layout, data.StructLayout):
        for name, field in layout:
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(field.shape, data.Layout):
                for sub, offset, width in flatten(field.shape, path):
                    out.append((sub, field.offset + offset, width))
            else:
                out.append((path, field.offset, Shape.cast(field.shape).width))
        return sorted(out, key=lambda item: item[1])
    width = layout.size if isinstance(layout, data.Layout) else Shape.cast(layout).width
    return [(prefix or "value", 0, width)]


def _words(bits):
    return max(1, -(-bits // WORD_BITS))


@dataclass(frozen=True)
class CommandBlock:
    name: str
    request: data.Layout
    response: data.Layout
    doc: str
    commands: type | None = None        #: the enum of the request's ``op`` field, for docs

    STATUS = 0
    GO = 1
    ARGS = 2

    @property
    def request_words(self):
        return _words(self.request.size)

    @property
    def response_words(self):
        return _words(self.response.size)

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

    @property
    def words(self):
        return _words(self.layout.size)


@dataclass(frozen=True)
class ControlBlock:
    name: str
    layout: data.Layout
    doc: str
    init: dict | None = None            #: reset values by field name (a layout's const init)

    @property
    def words(self):
        return _words(self.layout.size)


@dataclass(frozen=True)
class QueueBlock:
    name: str
    layout: data.Layout
    doc: str

    STATUS = 0
    POP = 1
    DATA = 2

    @property
    def words(self):
        return self.DATA + _words(self.layout.size)


class RegisterMap:
    """Blocks in address order. ``block_words`` is the address stride between blocks."""

    def __init__(self, blocks, *, block_words=256, title="Register map"):
        names = [block.name for block in blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"Block names must be unique, not {names!r}")
        for block in blocks:
            if block.words > block_words:
                raise ValueError(f"Block {block.name} needs {block.words} words, more than "
                                 f"the stride of {block_words}")
        self.blocks = tuple(blocks)
        self.block_words = block_words
        self.title = title
        self.address_bits = max(1, (len(blocks) * block_words - 1).bit_length())

    def base(self, name):
        for index, block in enumerate(self.blocks):
            if block.name == name:
                return index * self.block_words
        raise KeyError(f"No register block named {name!r}")

    def block(self, name):
        return self.blocks[self.base(name) // self.block_words]

    def to_dict(self):
        """Everything a driver needs: per block its kind, base and field positions."""
        out = {}
        for block in self.blocks:
            entry = {"base": self.base(block.name), "kind": type(block).__name__}
            if isinstance(block, CommandBlock):
                entry["request"] = flatten(block.request)
                entry["response"] = flatten(block.response)
                entry["response_base"] = block.response_base
            else:
                entry["fields"] = flatten(block.layout)
            out[block.name] = entry
        return out

    def markdown(self):
        """The register map as ``docs/registers.md`` shows it (a test compares)."""
        lines = [f"# {self.title}", "",
                 "Generated from `hdl/control/nicmap.py` by `mrc-nic registers`; do not edit.",
                 "", "The bus is word-addressed (32-bit words). Field positions are bit offsets "
                 "in the block's word range (word = offset // 32, bit = offset % 32).", ""]
        for block in self.blocks:
            base = self.base(block.name)
            lines += [f"## `{block.name}` at word 0x{base:04x} "
                      f"({type(block).__name__})", "", block.doc, ""]
            if isinstance(block, CommandBlock):
                lines += ["| word | name | access | meaning |", "| ---: | --- | --- | --- |",
                          f"| 0x{base + block.STATUS:04x} | STATUS | R | bit 0 busy, "
                          f"bits 16-31 GO writes ignored while busy |",
                          f"| 0x{base + block.GO:04x} | GO | W | issue the command |",
                          f"| 0x{base + block.ARGS:04x} | ARGS[{block.request_words}] | W | "
                          f"request fields below (write-only: reads return 0) |",
                          f"| 0x{base + block.response_base:04x} | "
                          f"RESULT[{block.response_words}] | R | response fields below |", ""]
                lines += self._field_table("request", block.request, base + block.ARGS)
                lines += self._field_table("response", block.response,
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
                lines += self._field_table("entry", block.layout, base + block.DATA)
            elif isinstance(block, ControlBlock):
                lines += self._field_table("read/write words", block.layout, base)
                if block.init:
                    lines += ["Reset values: " + ", ".join(
                        f"`{k}` = {v}" for k, v in block.init.items()), ""]
            else:
                lines += self._field_table("read-only words", block.layout, base)
        return "\n".join(lines).rstrip() + "\n"

    @staticmethod
    def _field_table(title, layout, base):
        lines = [f"{title.capitalize()}:", "", "| word | bit | bits | field |",
                 "| ---: | ---: | ---: | --- |"]
        for path, offset, width in flatten(layout):
            lines.append(f"| 0x{base + offset // WORD_BITS:04x} | {offset % WORD_BITS} | "
                         f"{width} | `{path}` |")
        lines.append("")
        return lines


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


class RegisterBus(wiring.Component):
    """The decoder of a :class:`RegisterMap`: the bus on one side, the blocks' plain control
    ports on the other (named after the blocks: ``<name>_req``/``<name>_resp`` for command
    blocks, ``<name>`` for status and queue blocks).

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

        def words_of(value, count):
            bits = Value.cast(value)
            bits = Cat(bits, Const(0, count * WORD_BITS - len(bits)))
            return [bits[i * WORD_BITS:(i + 1) * WORD_BITS] for i in range(count)]

        for block in self._map.blocks:
            base = self._map.base(block.name)
            if isinstance(block, CommandBlock):
                req = getattr(self, f"{block.name}_req")
                resp = getattr(self, f"{block.name}_resp")
                args = Signal(block.request_words * WORD_BITS, name=f"{block.name}_args")
                result = Signal(block.response_words * WORD_BITS, name=f"{block.name}_result")
                busy = Signal(name=f"{block.name}_busy")
                issued = Signal(name=f"{block.name}_issued")   # request accepted
                overruns = Signal(16, name=f"{block.name}_overruns")
                m.d.comb += [
                    req.payload.eq(args[:block.request.size]),
                    req.valid.eq(busy & ~issued),
                    resp.ready.eq(busy & issued),
                ]
                with m.If(req.valid & req.ready):
                    m.d.sync += issued.eq(1)
                with m.If(resp.valid & resp.ready):
                    m.d.sync += [busy.eq(0), issued.eq(0),
                                 result.eq(Value.cast(resp.payload))]
                for index in range(block.request_words):
                    with m.If(bus.w_en & (bus.addr == base + block.ARGS + index) & ~busy):
                        m.d.sync += args[index * WORD_BITS:(index + 1) * WORD_BITS].eq(
                            bus.w_data)
                with m.If(bus.w_en & (bus.addr == base + block.GO)):
                    with m.If(busy):
                        m.d.sync += overruns.eq(overruns + 1)
                    with m.Else():
                        m.d.sync += busy.eq(1)
                read_words[base + block.STATUS] = Cat(busy, Const(0, 15), overruns)
                # ARGS are write-only (read as 0): read back, every argument flip-flop also
                # fed the read multiplexer, and with the results and counters that hub was the
                # transport self-test's worst routing congestion (docs/boards.md).
                for index, word in enumerate(words_of(result, block.response_words)):
                    read_words[base + block.response_base + index] = word
            elif isinstance(block, StatusBlock):
                for index, word in enumerate(words_of(getattr(self, block.name),
                                                      block.words)):
                    read_words[base + index] = word
            elif isinstance(block, ControlBlock):
                value = Value.cast(getattr(self, block.name))
                for index, word in enumerate(words_of(value, block.words)):
                    read_words[base + index] = word
                    top = min(len(value), (index + 1) * WORD_BITS)
                    with m.If(bus.w_en & (bus.addr == base + index)):
                        m.d.sync += value[index * WORD_BITS:top].eq(
                            bus.w_data[:top - index * WORD_BITS])
            else:
                queue = getattr(self, block.name)
                m.d.comb += queue.ready.eq(bus.w_en & (bus.addr == base + block.POP))
                read_words[base + block.STATUS] = queue.valid
                for index, word in enumerate(words_of(queue.payload, block.words - block.DATA)):
                    read_words[base + block.DATA + index] = word

        with m.If(bus.r_en):
            m.d.sync += bus.r_data.eq(0)
            with m.Switch(bus.addr):
                for address, value in read_words.items():
                    with m.Case(address):
                        m.d.sync += bus.r_data.eq(value)
        return m
