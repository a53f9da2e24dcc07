"""Register-level driver: command blocks, status blocks and event queues."""

from hdl import protocol as P
from hdl.control.regmap import WORD_BITS, CommandBlock, QueueBlock

__all__ = ["RegisterDriver", "DriverError", "AmaranthBus"]

_MASK = (1 << WORD_BITS) - 1


class DriverError(OSError):
    """A control operation the NIC refused. ``errno_name`` is ``EINVAL``, ``EBUSY``,
    ``E2BIG`` or ``ENOENT`` as in ``mrc_ctl.h``; ``block`` and ``request`` say what was
    asked."""

    def __init__(self, errno, block, request):
        self.errno_name = P.Errno(errno).name
        self.block = block
        self.request = request
        super().__init__(int(errno), f"{block} {request}: {self.errno_name}")


class AmaranthBus:
    """Bus access from an Amaranth testbench (``ctx``) on a ``bus_signature`` port."""

    def __init__(self, ctx, bus):
        self.ctx, self.bus = ctx, bus

    async def write(self, address, value):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.addr, address)
        ctx.set(bus.w_data, value & _MASK)
        ctx.set(bus.w_en, 1)
        await ctx.tick()
        ctx.set(bus.w_en, 0)

    async def read(self, address):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.addr, address)
        ctx.set(bus.r_en, 1)
        await ctx.tick()
        ctx.set(bus.r_en, 0)
        return ctx.get(bus.r_data)


def _pack(fields, values, what):
    known = {path: (offset, width) for path, offset, width in fields}
    unknown = set(values) - set(known)
    if unknown:
        raise KeyError(f"{what} has no field(s) {sorted(unknown)}; fields: {sorted(known)}")
    word = 0
    for path, value in values.items():
        offset, width = known[path]
        value = int(getattr(value, "value", value))    # enum members of any enum class
        if not 0 <= value < (1 << width):
            raise ValueError(f"{what}.{path} must be from 0 to {(1 << width) - 1}, "
                             f"not {value!r}")
        word |= value << offset
    return word


def _unpack(fields, word):
    return {path: (word >> offset) & ((1 << width) - 1) for path, offset, width in fields}


class RegisterDriver:
    """Commands, status reads and queue pops over a register map.

    Parameters
    ----------
    regmap : RegisterMap
    bus : object with ``async read(address)`` and ``async write(address, value)``
    timeout : int
        Status polls before a command is declared hung (an error, never a silent wait).
    """

    def __init__(self, regmap, bus, *, timeout=10_000):
        self.regmap = regmap
        self.layout = regmap.to_dict()
        self.bus = bus
        self.timeout = timeout

    async def _write_words(self, base, word, count):
        for index in range(count):
            await self.bus.write(base + index, (word >> (index * WORD_BITS)) & _MASK)

    async def _read_words(self, base, count):
        word = 0
        for index in range(count):
            word |= (await self.bus.read(base + index)) << (index * WORD_BITS)
        return word

    async def command(self, block, *, check=True, **values):
        """Issue one command; return the response fields. Raises :class:`DriverError` when the
        response's ``errno`` is not OK (unless ``check=False``)."""
        spec = self.regmap.block(block)
        if not isinstance(spec, CommandBlock):
            raise TypeError(f"{block} is not a command block")
        base = self.regmap.base(block)
        entry = self.layout[block]
        word = _pack(entry["request"], values, block)
        await self._write_words(base + spec.ARGS, word, spec.request_words)
        await self.bus.write(base + spec.GO, 1)
        for _ in range(self.timeout):
            if not (await self.bus.read(base + spec.STATUS)) & 1:
                break
        else:
            raise TimeoutError(f"{block} {values}: no response after {self.timeout} polls")
        response = _unpack(entry["response"],
                           await self._read_words(base + spec.response_base,
                                                  spec.response_words))
        if check and response.get("errno", 0):
            raise DriverError(response["errno"], block, values)
        return response

    async def status(self, block):
        spec = self.regmap.block(block)
        base = self.regmap.base(block)
        return _unpack(self.layout[block]["fields"], await self._read_words(base, spec.words))

    async def configure(self, block, **values):
        """Read-modify-write fields of a control block."""
        spec = self.regmap.block(block)
        base = self.regmap.base(block)
        fields = self.layout[block]["fields"]
        word = await self._read_words(base, spec.words)
        known = {path: (offset, width) for path, offset, width in fields}
        for path in values:
            if path not in known:
                raise KeyError(f"{block} has no field {path!r}; fields: {sorted(known)}")
            offset, width = known[path]
            word &= ~(((1 << width) - 1) << offset)
        word |= _pack(fields, values, block)
        await self._write_words(base, word, spec.words)

    async def pop(self, block):
        """The head entry of a queue block, removed; ``None`` when the queue is empty."""
        spec = self.regmap.block(block)
        if not isinstance(spec, QueueBlock):
            raise TypeError(f"{block} is not a queue block")
        base = self.regmap.base(block)
        if not (await self.bus.read(base + spec.STATUS)) & 1:
            return None
        entry = _unpack(self.layout[block]["fields"],
                        await self._read_words(base + spec.DATA, spec.words - spec.DATA))
        await self.bus.write(base + spec.POP, 1)
        return entry
