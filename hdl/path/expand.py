"""EV expansion and generation in hardware: the gateware form of :mod:`hdl.path.ev`.

:class:`EvExpander` holds every EV profile's definitions (format and fields) in block RAM and
serves three control-path services, one request at a time:

- ``define``: set a profile's format and fields, validated with the same rules and errnos as
  :class:`~hdl.path.ev.EvFormat`, :class:`~hdl.path.ev.EvField` and
  :class:`~hdl.path.ev.EvProfile`;
- ``exp_req``: expand an EV into the 256-bit image of :func:`hdl.path.ev.expand` and the header
  fields of :func:`hdl.path.ev.header_fields`;
- ``gen_req``: make EV number ``index`` of a GENERATED profile, as
  :func:`hdl.path.ev.generate`.

Expansion and generation run when an EV is written or a profile generated, never per packet
(the per-packet path reads the stored expanded fields), so everything is serial: one image bit
per cycle, a few hundred cycles per request, and the 256-bit operands are only ever indexed a
bit or a byte at a time. ``docs/ev-expansion.md`` ("In hardware") documents the
ops, their errnos, the cycle counts and the storage.
"""

from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import (
    EV_VALUE_BITS,
    expand_request_layout,
    expand_response_layout,
    generate_request_layout,
    generate_response_layout,
)
from ..util import validating

__all__ = [
    "EvExpander", "DefineOp", "define_request_layout", "define_response_layout",
    "DEFINE_PROFILE_BITS", "WIDTH_BITS", "RANGE_SATURATION",
]

#: Bits of the profile id in a define request: enough for the largest build (16 profiles), so
#: an id the build does not hold can be named and answered with ENOENT.
DEFINE_PROFILE_BITS = 4
#: Bits of a width in a define request (0 .. 511; valid widths are 1 .. 256).
WIDTH_BITS = 9
#: Generation stores a field's range (``max_val - min_val + 1``) saturated here: an EV index is
#: 9 bits (below 512), so a range of 512 or more never wraps its odometer digit.
RANGE_SATURATION = 512

_FIELD_BITS = 8 * P.EV_MAX_BYTES                # an init_val/mask/min_val/max_val word
_MAX_FIELDS = P.EV_FORMAT_MAX_FIELDS
_FIELD_INDEX_BITS = 4                           # 0 .. 15 inside the tables
_GEN_INDEX_BITS = 9                             # generate_request_layout's index


class DefineOp(enum.Enum, shape=2):
    """Operations of :class:`EvExpander`'s ``define`` port."""
    CLEAR = 0       #: forget the profile's format and fields (uncommitted, no format)
    SET_FORMAT = 1  #: start a new definition: format mode and widths, no fields, uncommitted
    SET_FIELD = 2   #: set (overwrite or append) profile field ``index``; uncommits
    COMMIT = 3      #: validate the whole profile and make it usable with mode ``ev_mode``


def define_request_layout(config):
    """A define operation. Which members matter depends on ``op``:

    - every op: ``profile``;
    - SET_FORMAT: ``format_mode`` (:class:`~hdl.protocol.EvFormatMode`; 3 is EINVAL),
      ``count`` (format fields, 1 .. 16) and ``widths[0 .. count-1]``;
    - SET_FIELD: ``index`` and the field's ``width``, ``init_val``, ``mask``, ``min_val``,
      ``max_val`` (no default: ``max_val`` is given explicitly);
    - COMMIT: ``ev_mode`` (:class:`~hdl.protocol.EvMode`; 3 is EINVAL).
    """
    return data.StructLayout({
        "op": DefineOp,
        "profile": unsigned(DEFINE_PROFILE_BITS),
        "format_mode": unsigned(2),
        "count": unsigned(5),
        "widths": data.ArrayLayout(unsigned(WIDTH_BITS), _MAX_FIELDS),
        "ev_mode": unsigned(2),
        "index": unsigned(5),
        "width": unsigned(WIDTH_BITS),
        "init_val": unsigned(_FIELD_BITS),
        "mask": unsigned(_FIELD_BITS),
        "min_val": unsigned(_FIELD_BITS),
        "max_val": unsigned(_FIELD_BITS),
    })


def define_response_layout(config):
    """The result of a define operation: :class:`~hdl.protocol.Errno` (OK: done)."""
    return data.StructLayout({"errno": P.Errno})


# Per-profile descriptor: one word per profile.
_PROFILE_DESC = data.StructLayout({
    "fcount": unsigned(5),          # format fields; 0: no format
    "fmode": unsigned(2),           # EvFormatMode
    "total": unsigned(9),           # sum of the format widths (<= 256)
    "nfields": unsigned(5),         # profile fields defined (fields 0 .. nfields-1)
    "ev_bits": unsigned(9),         # EV bits an expansion consumes: sum of popcount(mask)
    "ev_mode": unsigned(2),         # EvMode, valid when committed
    "committed": unsigned(1),
})

# Per-field descriptor: one word per (profile, field).
_FIELD_DESC = data.StructLayout({
    "fmt_width": unsigned(WIDTH_BITS),  # width of format field i (0 beyond fcount)
    "ev_bits": unsigned(9),             # popcount(mask)
    "range": unsigned(10),              # max_val - min_val + 1, saturated at 512
})

_CAPACITY = {mode: bits for mode, bits in P.EV_FORMAT_CAPACITY_BITS.items()}


class _Owner(enum.Enum, shape=2):
    DEFINE = 0
    EXPAND = 1
    GENERATE = 2


class EvExpander(wiring.Component):
    """EV profile definitions in block RAM; EV expansion and generation, bit-serially.

    Requests on the three input streams are served one at a time (``define`` first, then
    ``exp_req``, then ``gen_req`` when several wait), each stream in order. A request is held
    (``ready`` low) while it is worked on, the payload being stable as the stream rules require,
    and accepted in the cycle its response is loaded; a new request starts once every response
    has been taken.

    Latency, from the cycle a request is offered (nothing else waiting) to its response being
    valid; ``T`` is the sum of the format widths, ``F`` the format fields, ``N`` the profile
    fields, ``B`` the EV bits the profile consumes (sum of ``popcount(mask)``):

    - expansion: ``T + F + 36`` cycles (a 32-cycle check of the EV's tail, then one cycle per
      format bit and one per format field): 74 for a full STEV format of two fields, 308 at
      most (16 fields, 256 bits); an EV with a stray 1 is refused after at most 36;
    - generation: ``11 * N + B + 4`` cycles (a 9-cycle division per field, one cycle per EV
      bit): 436 at most;
    - SET_FIELD 39 cycles (the four values scanned a byte per cycle), SET_FORMAT 37, CLEAR and
      COMMIT 4.

    Bad input: every define rule of :mod:`hdl.path.ev` is checked in hardware with the same
    errno; a refused operation changes nothing. A profile id at or above ``ev_profiles`` is
    ENOENT on every port. A define operation on a profile whose ``locked`` bit is set is EBUSY.

    Parameters
    ----------
    config : NicConfig
        ``ev_profiles`` sets the number of profiles held.

    Members
    -------
    define : ``In(stream.Signature(define_request_layout(config)))``
    define_resp : ``Out(stream.Signature(define_response_layout(config)))``
        One response (the errno) per define request, in order.
    locked : ``In(config.ev_profiles)``
        Bit ``p`` set: profile ``p`` is ONLINE in path selection; define operations on it are
        EBUSY. Expansion and generation are not affected.
    exp_req : ``In(stream.Signature(expand_request_layout(config)))``
    exp_resp : ``Out(stream.Signature(expand_response_layout(config)))``
        OK with the image and header fields; EINVAL when the profile is not committed or the EV
        has a 1 after the bits its profile consumes (image and fields are then 0); ENOENT for a
        profile id the build does not hold.
    gen_req : ``In(stream.Signature(generate_request_layout(config)))``
    gen_resp : ``Out(stream.Signature(generate_response_layout(config)))``
        OK with the EV; E2BIG when the profile makes at most ``index`` distinct EVs; EINVAL when
        the profile is not committed as GENERATED; ENOENT as above (the value is then 0).
    """

    def __init__(self, *, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
        self._config = config
        super().__init__({
            "define": In(stream.Signature(define_request_layout(config))),
            "define_resp": Out(stream.Signature(define_response_layout(config))),
            "locked": In(config.ev_profiles),
            "exp_req": In(stream.Signature(expand_request_layout(config))),
            "exp_resp": Out(stream.Signature(expand_response_layout(config))),
            "gen_req": In(stream.Signature(generate_request_layout(config))),
            "gen_resp": Out(stream.Signature(generate_response_layout(config))),
        })

    @property
    def config(self):
        return self._config

    @property
    def storage_bits(self):
        """Bits of RAM the definitions take: ``{"values": ..., "field_desc": ...,
        "profile_desc": ...}``."""
        profiles = self._config.ev_profiles
        return {
            "values": 2 * profiles * _MAX_FIELDS * 2 * _FIELD_BITS,
            "field_desc": profiles * _MAX_FIELDS * _FIELD_DESC.size,
            "profile_desc": profiles * _PROFILE_DESC.size,
        }

    def elaborate(self, platform):
        m = Module()
        config = self._config
        m.submodules.tables = tables = EvTables(config=config)
        m.submodules.definer = definer = EvDefine(config=config)
        m.submodules.expansion = expansion = EvExpand(config=config)
        m.submodules.generation = generation = EvGenerate(config=config)
        engines = {_Owner.DEFINE: definer, _Owner.EXPAND: expansion,
                   _Owner.GENERATE: generation}

        wiring.connect(m, wiring.flipped(self.define), definer.req)
        wiring.connect(m, definer.resp, wiring.flipped(self.define_resp))
        wiring.connect(m, wiring.flipped(self.exp_req), expansion.req)
        wiring.connect(m, expansion.resp, wiring.flipped(self.exp_resp))
        wiring.connect(m, wiring.flipped(self.gen_req), generation.req)
        wiring.connect(m, generation.resp, wiring.flipped(self.gen_resp))
        m.d.comb += definer.locked.eq(self.locked)

        # One request at a time: a new one starts once every engine is idle and every response
        # has been taken; define first, then expansion, then generation.
        owner = Signal(_Owner)
        idle = ~definer.busy & ~expansion.busy & ~generation.busy
        answered = ~self.define_resp.valid & ~self.exp_resp.valid & ~self.gen_resp.valid
        with m.If(idle & answered):
            with m.If(self.define.valid):
                m.d.comb += definer.go.eq(1)
                m.d.sync += owner.eq(_Owner.DEFINE)
            with m.Elif(self.exp_req.valid):
                m.d.comb += expansion.go.eq(1)
                m.d.sync += owner.eq(_Owner.EXPAND)
            with m.Elif(self.gen_req.valid):
                m.d.comb += generation.go.eq(1)
                m.d.sync += owner.eq(_Owner.GENERATE)

        # The tables' port follows the engine that owns it; every engine sees the read data.
        with m.Switch(owner):
            for name, engine in engines.items():
                with m.Case(name):
                    m.d.comb += [tables.access.slot.eq(engine.tables.slot),
                                 tables.access.field.eq(engine.tables.field),
                                 tables.access.sel.eq(engine.tables.sel)]
                    for port in ("low", "high", "fdesc", "pdesc"):
                        m.d.comb += [
                            getattr(tables.access, f"{port}_we").eq(
                                getattr(engine.tables, f"{port}_we")),
                            getattr(tables.access, f"{port}_wdata").eq(
                                getattr(engine.tables, f"{port}_wdata")),
                        ]
        for engine in engines.values():
            m.d.comb += [engine.tables.pd.eq(tables.access.pd),
                         engine.tables.fd.eq(tables.access.fd),
                         engine.tables.low.eq(tables.access.low),
                         engine.tables.high.eq(tables.access.high)]
        return m


def table_access_signature(config):
    """An engine's port on :class:`EvTables` (the engine's side): the address (profile
    ``slot``, ``field``, word ``sel``), one write enable and data per table, and the read data
    of the address of the previous cycle (``pd`` profile descriptor, ``fd`` field descriptor,
    ``low`` init_val/min_val word, ``high`` mask/max_val word)."""
    return wiring.Signature({
        "slot": Out(config.profile_bits),
        "field": Out(_FIELD_INDEX_BITS),
        "sel": Out(1),
        "pd": In(_PROFILE_DESC),
        "fd": In(_FIELD_DESC),
        "low": In(_FIELD_BITS),
        "high": In(_FIELD_BITS),
        "low_we": Out(1), "low_wdata": Out(_FIELD_BITS),
        "high_we": Out(1), "high_wdata": Out(_FIELD_BITS),
        "fdesc_we": Out(1), "fdesc_wdata": Out(_FIELD_DESC),
        "pdesc_we": Out(1), "pdesc_wdata": Out(_PROFILE_DESC),
    })


class EvTables(wiring.Component):
    """The EV profile definitions in block RAM, one read and one write address for all.

    - ``profile_desc``: one :data:`_PROFILE_DESC` word per profile;
    - ``field_desc``: one :data:`_FIELD_DESC` word per (profile, field);
    - ``low_words`` / ``high_words``: two 256-bit words per (profile, field): word 0 holds
      init_val (low) and mask (high), word 1 min_val (low) and max_val (high), so expansion
      reads a field's init_val and mask and generation its min_val in one cycle.

    Latency: read data one cycle after the address; reads are transparent (a write and a read
    of one entry in one cycle read the new value; no engine relies on it).

    Members
    -------
    access : ``In(table_access_signature(config))``
    """

    def __init__(self, *, config):
        self._config = config
        super().__init__({"access": In(table_access_signature(config))})

    def elaborate(self, platform):
        m = Module()
        profiles = self._config.ev_profiles
        access = self.access
        words = profiles * _MAX_FIELDS * 2
        m.submodules.low_words = low_words = Memory(shape=_FIELD_BITS, depth=words, init=[])
        m.submodules.high_words = high_words = Memory(shape=_FIELD_BITS, depth=words, init=[])
        m.submodules.field_desc = field_desc = Memory(
            shape=_FIELD_DESC, depth=profiles * _MAX_FIELDS, init=[])
        m.submodules.profile_desc = profile_desc = Memory(
            shape=_PROFILE_DESC, depth=profiles, init=[])
        # No op reads an entry in the cycle after writing it, so transparency changes nothing
        # here; it lets Yosys map the 256-bit memories onto ECP5 block RAM with half the
        # flip-flops it adds around a non-transparent read port.
        low_wr, high_wr = low_words.write_port(), high_words.write_port()
        fdesc_wr, pdesc_wr = field_desc.write_port(), profile_desc.write_port()
        low_rd = low_words.read_port(transparent_for=[low_wr])
        high_rd = high_words.read_port(transparent_for=[high_wr])
        fdesc_rd = field_desc.read_port(transparent_for=[fdesc_wr])
        pdesc_rd = profile_desc.read_port(transparent_for=[pdesc_wr])

        word = Cat(access.sel, access.field, access.slot)
        entry = Cat(access.field, access.slot)
        m.d.comb += [
            pdesc_rd.addr.eq(access.slot), pdesc_wr.addr.eq(access.slot),
            fdesc_rd.addr.eq(entry), fdesc_wr.addr.eq(entry),
            low_rd.addr.eq(word), high_rd.addr.eq(word),
            low_wr.addr.eq(word), high_wr.addr.eq(word),
            low_wr.en.eq(access.low_we), low_wr.data.eq(access.low_wdata),
            high_wr.en.eq(access.high_we), high_wr.data.eq(access.high_wdata),
            fdesc_wr.en.eq(access.fdesc_we), fdesc_wr.data.eq(access.fdesc_wdata),
            pdesc_wr.en.eq(access.pdesc_we), pdesc_wr.data.eq(access.pdesc_wdata),
            access.pd.eq(pdesc_rd.data), access.fd.eq(fdesc_rd.data),
            access.low.eq(low_rd.data), access.high.eq(high_rd.data),
        ]
        return m


def _engine_members(config, request, response):
    return {
        "req": In(stream.Signature(request)),
        "resp": Out(stream.Signature(response)),
        "go": In(1),
        "busy": Out(1),
        "tables": Out(table_access_signature(config)),
    }


class EvDefine(wiring.Component):
    """The ``define`` service: validates and applies one define operation at a time.

    Starts when :class:`EvExpander` raises ``go`` (the request is valid, every engine idle and
    every response taken): START (the descriptors are read), CHECK, the op's scan and write
    states, then the response, loaded in the cycle the request is accepted. ``busy`` is high
    from the cycle after ``go`` to the response's cycle. Cycles: SET_FIELD 39, SET_FORMAT 37,
    CLEAR and COMMIT 4 (from ``go`` to the response being valid).

    Bad input: every define rule of :mod:`hdl.path.ev` with its errno, checked before anything
    is written; a refused op changes nothing. ENOENT for a profile the build does not hold,
    EBUSY for a ``locked`` one.

    Members
    -------
    req : ``In(stream.Signature(define_request_layout(config)))``
    resp : ``Out(stream.Signature(define_response_layout(config)))``
    locked : ``In(config.ev_profiles)``
    go : ``In(1)``
    busy : ``Out(1)``
    tables : ``Out(table_access_signature(config))``
    """

    def __init__(self, *, config):
        self._config = config
        super().__init__(_engine_members(config, define_request_layout(config),
                                         define_response_layout(config))
                         | {"locked": In(config.ev_profiles)})

    def elaborate(self, platform):
        m = Module()
        profiles = self._config.ev_profiles
        dreq, tables = self.req.p, self.tables
        pd, fd = tables.pd, tables.fd
        prof_bad = dreq.profile >= profiles
        slot = dreq.profile[:self._config.profile_bits]
        locked = self.locked.bit_select(slot, 1) if profiles > 1 else self.locked[0]

        field = Signal(5)
        sel = Signal()
        bit = Signal(9)
        m.d.comb += [tables.slot.eq(slot), tables.field.eq(field[:_FIELD_INDEX_BITS]),
                     tables.sel.eq(sel)]

        valid, errno = Signal(), Signal(P.Errno)
        m.d.comb += [self.resp.valid.eq(valid), self.resp.p.errno.eq(errno)]
        with m.If(self.resp.ready):
            m.d.sync += valid.eq(0)

        total = Signal(13)              # SET_FORMAT: sum of the widths
        zero_width = Signal()
        # SET_FIELD scan
        ones = Signal(9)                # popcount(mask), 0 .. 256
        outside = Signal()              # init_val or mask has a 1 at or above width
        max_top = Signal(8)             # highest set bit of max_val
        max_nonzero = Signal()
        min_greater = Signal()
        borrow = Signal()
        diff_low = Signal(9)            # low bits of max_val - min_val
        diff_big = Signal()             # max_val - min_val >= 512
        scan_regs = [total, zero_width, ones, outside, max_top, max_nonzero, min_greater,
                     borrow, diff_low, diff_big]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.go):
                    m.d.sync += [bit.eq(0), sel.eq(0), field.eq(dreq.index)]
                    m.next = "START"

            with m.State("START"):      # the descriptors of the chosen profile are read
                m.next = "CHECK"

            with m.State("CHECK"):
                _define_check(m, dreq, pd, prof_bad, locked, errno, tables, field, scan_regs)

            with m.State("FMT_SCAN"):
                width = dreq.widths[field[:_FIELD_INDEX_BITS]]
                with m.If(field < dreq.count):
                    m.d.sync += total.eq(total + width)
                    with m.If(width == 0):
                        m.d.sync += zero_width.eq(1)
                m.d.sync += field.eq(field + 1)
                with m.If(field == _MAX_FIELDS - 1):
                    m.next = "FMT_DECIDE"

            with m.State("FMT_DECIDE"):
                capacity = Signal(9)
                with m.Switch(dreq.format_mode):
                    for mode, bits in _CAPACITY.items():
                        with m.Case(mode):
                            m.d.comb += capacity.eq(bits)
                m.d.sync += field.eq(0)
                with m.If(zero_width):
                    m.d.sync += errno.eq(P.Errno.EINVAL)
                    m.next = "REPLY"
                with m.Elif(total > capacity):
                    m.d.sync += errno.eq(P.Errno.E2BIG)
                    m.next = "REPLY"
                with m.Else():
                    m.next = "FMT_WRITE"

            with m.State("FMT_WRITE"):
                m.d.comb += [
                    tables.fdesc_we.eq(1),
                    tables.fdesc_wdata.fmt_width.eq(
                        Mux(field < dreq.count, dreq.widths[field[:_FIELD_INDEX_BITS]], 0)),
                    tables.fdesc_wdata.range.eq(1),
                ]
                m.d.sync += field.eq(field + 1)
                with m.If(field == _MAX_FIELDS - 1):
                    m.d.comb += [
                        tables.pdesc_we.eq(1),
                        tables.pdesc_wdata.fcount.eq(dreq.count),
                        tables.pdesc_wdata.fmode.eq(dreq.format_mode),
                        tables.pdesc_wdata.total.eq(total),
                    ]
                    m.d.sync += errno.eq(P.Errno.OK)
                    m.next = "REPLY"

            with m.State("FIELD_SCAN"):
                # One byte of each of the four values per cycle, least significant first: a
                # byte multiplexer costs what a bit multiplexer does, for an eighth of the time.
                chunk = bit[:5]
                init_byte = dreq.init_val.word_select(chunk, 8)
                mask_byte = dreq.mask.word_select(chunk, 8)
                min_byte = dreq.min_val.word_select(chunk, 8)
                max_byte = dreq.max_val.word_select(chunk, 8)
                above = Cat(Cat(C(j, 3), chunk) >= dreq.width for j in range(8))
                difference = Signal(9)      # max - min - borrow, bit 8 the borrow out
                m.d.comb += difference.eq(max_byte - min_byte - borrow)
                m.d.sync += [
                    ones.eq(ones + sum(mask_byte[j] for j in range(8))),
                    borrow.eq(difference[8]),
                    bit.eq(bit + 1),
                ]
                with m.If(((init_byte | mask_byte) & above).any()):
                    m.d.sync += outside.eq(1)
                for j in range(8):          # the last set bit wins: the highest
                    with m.If(max_byte[j]):
                        m.d.sync += [max_top.eq(Cat(C(j, 3), chunk)), max_nonzero.eq(1)]
                with m.If(min_byte != max_byte):
                    m.d.sync += min_greater.eq(min_byte > max_byte)
                with m.If(chunk == 0):
                    m.d.sync += diff_low[:8].eq(difference[:8])
                with m.Elif(chunk == 1):
                    m.d.sync += [diff_low[8].eq(difference[0]),
                                 diff_big.eq(difference[1:8].any())]
                with m.Elif(difference[:8].any()):
                    m.d.sync += diff_big.eq(1)
                with m.If(chunk == _FIELD_BITS // 8 - 1):
                    m.next = "FIELD_DECIDE"

            with m.State("FIELD_DECIDE"):
                # EvField's rules (EINVAL) before EvProfile's (E2BIG), as the reference builds
                # the field before the profile.
                field_invalid = ((dreq.width == 0) | outside | min_greater
                                 | (max_nonzero & (max_top >= ones)))
                with m.If(field_invalid | (pd.fcount == 0)):
                    m.d.sync += errno.eq(P.Errno.EINVAL)
                    m.next = "REPLY"
                with m.Elif(dreq.index >= pd.fcount):
                    m.d.sync += errno.eq(P.Errno.E2BIG)
                    m.next = "REPLY"
                with m.Elif(dreq.index > pd.nfields):
                    m.d.sync += errno.eq(P.Errno.EINVAL)   # fields are contiguous
                    m.next = "REPLY"
                with m.Elif(dreq.width > fd.fmt_width):
                    m.d.sync += errno.eq(P.Errno.E2BIG)
                    m.next = "REPLY"
                with m.Else():
                    m.next = "FIELD_WRITE_VALUES"

            with m.State("FIELD_WRITE_VALUES"):
                m.d.comb += [tables.low_we.eq(1), tables.low_wdata.eq(dreq.init_val),
                             tables.high_we.eq(1), tables.high_wdata.eq(dreq.mask)]
                m.d.sync += sel.eq(1)
                m.next = "FIELD_WRITE_RANGE"

            with m.State("FIELD_WRITE_RANGE"):
                saturated = diff_big | (diff_low == RANGE_SATURATION - 1)
                m.d.comb += [
                    tables.low_we.eq(1), tables.low_wdata.eq(dreq.min_val),
                    tables.high_we.eq(1), tables.high_wdata.eq(dreq.max_val),
                    tables.fdesc_we.eq(1),
                    tables.fdesc_wdata.fmt_width.eq(fd.fmt_width),
                    tables.fdesc_wdata.ev_bits.eq(ones),
                    tables.fdesc_wdata.range.eq(Mux(saturated, RANGE_SATURATION, diff_low + 1)),
                    tables.pdesc_we.eq(1),
                    tables.pdesc_wdata.eq(pd),
                    tables.pdesc_wdata.committed.eq(0),
                ]
                m.d.comb += tables.pdesc_wdata.ev_bits.eq(pd.ev_bits - fd.ev_bits + ones)
                with m.If(dreq.index == pd.nfields):
                    m.d.comb += tables.pdesc_wdata.nfields.eq(pd.nfields + 1)
                m.d.sync += errno.eq(P.Errno.OK)
                m.next = "REPLY"

            with m.State("REPLY"):
                m.d.comb += self.req.ready.eq(1)
                m.d.sync += valid.eq(1)
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m


def _define_check(m, dreq, pd, prof_bad, locked, errno, tables, field, scan_regs):
    with m.If(prof_bad):
        m.d.sync += errno.eq(P.Errno.ENOENT)
        m.next = "REPLY"
    with m.Elif(locked):
        m.d.sync += errno.eq(P.Errno.EBUSY)
        m.next = "REPLY"
    with m.Else():
        m.d.sync += [reg.eq(0) for reg in scan_regs]
        with m.Switch(dreq.op):
            with m.Case(DefineOp.CLEAR):
                m.d.comb += [tables.pdesc_we.eq(1), tables.pdesc_wdata.eq(0)]
                m.d.sync += errno.eq(P.Errno.OK)
                m.next = "REPLY"
            with m.Case(DefineOp.SET_FORMAT):
                # EvFormat's order: the mode, no fields, too many fields, then the widths.
                with m.If((dreq.format_mode > P.EvFormatMode.SRV6) | (dreq.count == 0)):
                    m.d.sync += errno.eq(P.Errno.EINVAL)
                    m.next = "REPLY"
                with m.Elif(dreq.count > _MAX_FIELDS):
                    m.d.sync += errno.eq(P.Errno.E2BIG)
                    m.next = "REPLY"
                with m.Else():
                    m.d.sync += field.eq(0)
                    m.next = "FMT_SCAN"
            with m.Case(DefineOp.SET_FIELD):
                m.next = "FIELD_SCAN"
            with m.Case(DefineOp.COMMIT):
                with m.If((dreq.ev_mode > P.EvMode.AUTO) | (pd.fcount == 0)
                          | (pd.nfields == 0)):
                    m.d.sync += errno.eq(P.Errno.EINVAL)
                with m.Else():
                    m.d.comb += [tables.pdesc_we.eq(1), tables.pdesc_wdata.eq(pd),
                                 tables.pdesc_wdata.ev_mode.eq(dreq.ev_mode),
                                 tables.pdesc_wdata.committed.eq(1)]
                    m.d.sync += errno.eq(P.Errno.OK)
                m.next = "REPLY"


class EvExpand(wiring.Component):
    """The ``exp_req`` service: expands one EV at a time into its 256-bit image and header
    fields.

    Starts on ``go`` as :class:`EvDefine`; ``busy`` likewise. First the EV's tail is checked, a
    byte per cycle; then the format fields are walked last to first, one image bit per cycle.
    Cycles from ``go`` to the response: ``T + F + 36`` (``T`` the sum of the format widths,
    ``F`` the format fields); an EV with a stray 1 is refused after at most 36.

    Bad input: EINVAL (image and fields 0) when the profile is not committed or the EV has a 1
    after the bits its profile consumes; ENOENT for a profile the build does not hold.

    Members
    -------
    req : ``In(stream.Signature(expand_request_layout(config)))``
    resp : ``Out(stream.Signature(expand_response_layout(config)))``
    go : ``In(1)``
    busy : ``Out(1)``
    tables : ``Out(table_access_signature(config))``
    """

    def __init__(self, *, config):
        self._config = config
        super().__init__(_engine_members(config, expand_request_layout(config),
                                         expand_response_layout(config)))

    def elaborate(self, platform):
        m = Module()
        ereq, tables = self.req.p, self.tables
        pd, fd = tables.pd, tables.fd
        prof_bad = ereq.profile >= self._config.ev_profiles

        field = Signal(5)
        bit = Signal(9)
        taken = Signal(9)               # EV bits still to be used
        m.d.comb += [tables.slot.eq(ereq.profile[:self._config.profile_bits]),
                     tables.field.eq(field[:_FIELD_INDEX_BITS]), tables.sel.eq(0)]

        valid, errno = Signal(), Signal(P.Errno)
        tag, out_fmode, out_srh = Signal(9), Signal(2), Signal()
        image = Signal(EV_VALUE_BITS)
        m.d.comb += [self.resp.valid.eq(valid), self.resp.p.errno.eq(errno),
                     self.resp.p.tag.eq(tag), self.resp.p.image.eq(image)]
        with m.If(self.resp.ready):
            m.d.sync += valid.eq(0)

        fields = self.resp.p.fields
        with m.If(errno == P.Errno.OK):
            with m.Switch(out_fmode):
                with m.Case(P.EvFormatMode.STEV):
                    m.d.comb += [fields.flow_label.eq(image[-20:]),
                                 fields.udp_sport.eq(image[-36:-20])]
                with m.Case(P.EvFormatMode.UDP):
                    m.d.comb += fields.udp_sport.eq(image[-16:])
                with m.Case(P.EvFormatMode.SRV6):
                    # A format of 128 bits or fewer leaves the low half of the image zero.
                    m.d.comb += [fields.srv6_valid.eq(1), fields.srv6_dst.eq(image[128:]),
                                 fields.srh_valid.eq(out_srh), fields.srh_segment.eq(image[:128])]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.go):
                    m.d.sync += [bit.eq(0), field.eq(0)]
                    m.next = "START"

            with m.State("START"):      # the descriptors of the chosen profile are read
                m.next = "CHECK"

            with m.State("CHECK"):
                with m.If(prof_bad):
                    m.d.sync += [errno.eq(P.Errno.ENOENT), image.eq(0)]
                    m.next = "REPLY"
                with m.Elif(~pd.committed):
                    m.d.sync += [errno.eq(P.Errno.EINVAL), image.eq(0)]
                    m.next = "REPLY"
                with m.Else():
                    m.d.sync += [image.eq(0), bit.eq(0)]
                    m.next = "TAIL"

            # First the EV's tail is checked, a byte per cycle: every bit after the `ev_bits`
            # the profile consumes must be 0. Then the format fields are walked last to first,
            # each from its least significant bit, and every bit is shifted into the top of
            # `image`: when the first field's top bit goes in, the image is left-aligned
            # with no further shifting. A mask bit takes the EV bit at `taken - 1` (counted
            # from the top, where `taken` EV bits are still to be used), so each field's EV
            # integer is read from its last bit up and its lowest bit lands in the lowest set
            # mask bit, as pdep does; any other bit is init_val's, and format fields without
            # a profile field are 0.
            with m.State("TAIL"):
                chunk = bit[:5]
                value_byte = ereq.value.word_select(chunk, 8)
                limit = _FIELD_BITS - pd.ev_bits    # bits below it (from the bottom) must be 0
                tail = Cat(Cat(C(j, 3), chunk) < limit for j in range(8))
                m.d.sync += bit.eq(bit + 1)
                with m.If((value_byte & tail).any()):
                    m.d.sync += errno.eq(P.Errno.EINVAL)
                    m.next = "REPLY"
                with m.Elif(chunk == _FIELD_BITS // 8 - 1):
                    m.d.sync += [bit.eq(0), field.eq(pd.fcount - 1), taken.eq(pd.ev_bits),
                                 errno.eq(P.Errno.OK)]
                    m.next = "LOAD"

            with m.State("LOAD"):       # field descriptor and init_val/mask words are read
                m.next = "SHIFT"

            with m.State("SHIFT"):
                has_field = field < pd.nfields
                mask_bit = tables.high.bit_select(bit[:8], 1)
                init_bit = tables.low.bit_select(bit[:8], 1)
                ev_bit = ereq.value.bit_select((_FIELD_BITS - taken)[:8], 1)
                m.d.sync += [
                    image.eq(Cat(image[1:], has_field & Mux(mask_bit, ev_bit, init_bit))),
                    bit.eq(bit + 1),
                ]
                with m.If(has_field & mask_bit):
                    m.d.sync += taken.eq(taken - 1)
                with m.If(bit == fd.fmt_width - 1):
                    m.d.sync += [bit.eq(0), field.eq(field - 1)]
                    with m.If(field == 0):
                        m.next = "REPLY"
                    with m.Else():
                        m.next = "LOAD"

            with m.State("REPLY"):
                m.d.comb += self.req.ready.eq(1)
                m.d.sync += [valid.eq(1), tag.eq(ereq.tag), out_fmode.eq(pd.fmode),
                             out_srh.eq(pd.total > 128)]
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m


class EvGenerate(wiring.Component):
    """The ``gen_req`` service: makes EV number ``index`` of a GENERATED profile.

    Starts on ``go`` as :class:`EvDefine`; ``busy`` likewise. Fields last to first (the last
    field is the fastest odometer digit): the digit's offset from min_val is the index modulo
    the field's range (a 9-cycle restoring division), and the index goes on divided by it; each
    digit (min_val + offset) is written least significant bit first into the top of the value,
    shifting right, so the first field ends on top. Cycles from ``go`` to the response:
    ``11 * N + B + 4`` (``N`` profile fields, ``B`` EV bits the profile consumes).

    Bad input: E2BIG (value 0) when the profile makes at most ``index`` distinct EVs; EINVAL
    when it is not committed as GENERATED; ENOENT for a profile the build does not hold.

    Members
    -------
    req : ``In(stream.Signature(generate_request_layout(config)))``
    resp : ``Out(stream.Signature(generate_response_layout(config)))``
    go : ``In(1)``
    busy : ``Out(1)``
    tables : ``Out(table_access_signature(config))``
    """

    def __init__(self, *, config):
        self._config = config
        super().__init__(_engine_members(config, generate_request_layout(config),
                                         generate_response_layout(config)))

    def elaborate(self, platform):
        m = Module()
        greq, tables = self.req.p, self.tables
        pd, fd = tables.pd, tables.fd
        prof_bad = greq.profile >= self._config.ev_profiles

        field = Signal(5)
        sel = Signal()
        bit = Signal(9)
        m.d.comb += [tables.slot.eq(greq.profile[:self._config.profile_bits]),
                     tables.field.eq(field[:_FIELD_INDEX_BITS]), tables.sel.eq(sel)]

        valid, errno = Signal(), Signal(P.Errno)
        value = Signal(EV_VALUE_BITS)
        m.d.comb += [self.resp.valid.eq(valid), self.resp.p.errno.eq(errno),
                     self.resp.p.value.eq(value)]
        with m.If(self.resp.ready):
            m.d.sync += valid.eq(0)

        quotient = Signal(_GEN_INDEX_BITS)  # index, divided by the ranges of later fields
        remainder = Signal(10)          # this field's odometer digit (offset from min_val)
        carry = Signal()

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.go):
                    m.d.sync += [bit.eq(0), sel.eq(0), field.eq(0)]
                    m.next = "START"

            with m.State("START"):      # the descriptors of the chosen profile are read
                m.next = "CHECK"

            with m.State("CHECK"):
                with m.If(prof_bad):
                    m.d.sync += [errno.eq(P.Errno.ENOENT), value.eq(0)]
                    m.next = "REPLY"
                with m.Elif(~pd.committed | (pd.ev_mode != P.EvMode.GENERATED)):
                    m.d.sync += [errno.eq(P.Errno.EINVAL), value.eq(0)]
                    m.next = "REPLY"
                with m.Else():
                    m.d.sync += [value.eq(0), quotient.eq(greq.index), sel.eq(1),
                                 field.eq(pd.nfields - 1)]
                    m.next = "LOAD"

            with m.State("LOAD"):       # field descriptor and min_val word are read
                m.d.sync += [remainder.eq(0), bit.eq(0)]
                m.next = "DIVIDE"

            with m.State("DIVIDE"):     # restoring division, one quotient bit per cycle
                trial = Cat(quotient[-1], remainder)
                fits = trial >= fd.range
                m.d.sync += [
                    remainder.eq(Mux(fits, trial - fd.range, trial)),
                    quotient.eq(Cat(fits, quotient[:-1])),
                    bit.eq(bit + 1),
                ]
                with m.If(bit == _GEN_INDEX_BITS - 1):
                    m.d.sync += [bit.eq(0), carry.eq(0)]
                    m.next = "EMIT"

            with m.State("EMIT"):
                with m.If(bit == fd.ev_bits):
                    with m.If(field == 0):
                        with m.If(quotient == 0):
                            m.d.sync += errno.eq(P.Errno.OK)
                        with m.Else():      # the index is past the last combination
                            m.d.sync += [errno.eq(P.Errno.E2BIG), value.eq(0)]
                        m.next = "REPLY"
                    with m.Else():
                        m.d.sync += field.eq(field - 1)
                        m.next = "LOAD"
                with m.Else():
                    min_bit = tables.low.bit_select(bit[:8], 1)
                    offset_bit = (remainder >> bit)[0]
                    m.d.sync += [
                        value.eq(Cat(value[1:], min_bit ^ offset_bit ^ carry)),
                        carry.eq((min_bit & offset_bit) | (carry & (min_bit | offset_bit))),
                        bit.eq(bit + 1),
                    ]

            with m.State("REPLY"):
                m.d.comb += self.req.ready.eq(1)
                m.d.sync += valid.eq(1)
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m
