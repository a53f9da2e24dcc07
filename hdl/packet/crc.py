"""Parallel CRC-32 over network beats, for the RoCEv2 invariant CRC (ICRC).

The CRC is the one of Ethernet and :func:`zlib.crc32`: reflected polynomial ``0xEDB88320``,
initial value ``0xFFFFFFFF``, final XOR ``0xFFFFFFFF``. The RoCEv2 ICRC is that value sent as
four bytes, least significant byte first (:func:`icrc_bytes`).

The gateware never iterates over bytes. At elaboration time the bitwise CRC is run
symbolically: every state bit is tracked as the set (a bit mask) of input bits whose XOR it
is, so advancing over ``n`` bytes becomes one matrix over GF(2), and each output bit one XOR
tree.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CRC32", "icrc_bytes"]


_POLYNOMIAL = 0xEDB88320    # x^32 + x^26 + ... + 1, bit-reversed
_STATE_BITS = 32
_STATE_MASK = (1 << _STATE_BITS) - 1


def icrc_bytes(crc_value):
    """The ICRC field of a RoCEv2 packet, in wire order, for a finalized CRC.

    RoCEv2 sends the ICRC least significant byte first, as Ethernet sends its FCS (this is
    Scapy's ``BTH.pack_icrc``).

    Parameters
    ----------
    crc_value : int
        The finalized CRC, as :func:`zlib.crc32` or :attr:`CRC32.crc` give it.

    Returns
    -------
    bytes
        Four bytes, little-endian.
    """
    if not isinstance(crc_value, int) or isinstance(crc_value, bool) or \
            not 0 <= crc_value <= _STATE_MASK:
        raise ValueError(f"CRC value must be an integer from 0 to 0xFFFFFFFF, not {crc_value!r}")
    return crc_value.to_bytes(4, "little")


# --- Symbolic CRC ----------------------------------------------------------------------------
#
# A "row" is a bit mask over the vector Cat(state[0:32], data[0:W]): bit k set means input bit
# k is one of the terms XORed together to form that state bit. A list of 32 rows is a matrix.

def _advance_byte(rows, lane):
    """Rows after feeding the data byte in ``lane`` (the bitwise algorithm, run on masks)."""
    rows = list(rows)
    for bit in range(8):
        rows[bit] ^= 1 << (_STATE_BITS + 8 * lane + bit)
    for _ in range(8):
        shifted_out = rows[0]
        rows = rows[1:] + [0]
        for bit in range(_STATE_BITS):
            if _POLYNOMIAL >> bit & 1:
                rows[bit] ^= shifted_out
    return rows


def _update_matrices(lanes):
    """Matrices that advance the state over data lanes ``0 .. n-1``, for ``n`` = 0 .. lanes."""
    rows = [1 << bit for bit in range(_STATE_BITS)]
    matrices = [rows]
    for lane in range(lanes):
        rows = _advance_byte(rows, lane)
        matrices.append(rows)
    return matrices


def _apply(rows, vector):
    """Evaluate a matrix on a concrete input vector."""
    return sum((bin(row & vector).count("1") & 1) << bit for bit, row in enumerate(rows))


def _advance_state(state, data):
    """Concrete unfinalized state after feeding ``data``, using the same symbolic model."""
    one_byte = _update_matrices(1)[1]
    for byte in data:
        state = _apply(one_byte, state | byte << _STATE_BITS)
    return state


def _zero_advance(count):
    """State-only matrix (32 rows over the state bits) advancing over ``count`` zero bytes."""
    return [row & _STATE_MASK for row in _update_matrices(count)[count]]


def _invert(rows):
    """Inverse of a 32 x 32 matrix over GF(2) (rows as bit masks), by Gauss-Jordan."""
    # Augmented rows: the matrix in the low 32 bits, the identity above them.
    work = [row | 1 << (_STATE_BITS + bit) for bit, row in enumerate(rows)]
    for col in range(_STATE_BITS):
        pivot = next(r for r in range(col, _STATE_BITS) if work[r] >> col & 1)
        work[col], work[pivot] = work[pivot], work[col]
        for r in range(_STATE_BITS):
            if r != col and work[r] >> col & 1:
                work[r] ^= work[col]
    return [row >> _STATE_BITS for row in work]


# --- Gateware --------------------------------------------------------------------------------

class CRC32(wiring.Component):
    """CRC-32 (as :func:`zlib.crc32`) over network beats, one beat per cycle, pipelined.

    A message starts on a beat with ``first`` set and continues over the following valid beats.
    ``crc`` is the finalized CRC of ``init_bytes`` followed by every valid byte of the message
    so far, so it equals ``zlib.crc32(init_bytes + message)``.

    Lanes: wire byte ``i`` of a beat is ``data[8*i:8*i+8]`` (lane 0 is first on the wire) and
    ``keep[i]`` marks it valid. ``keep`` must be one contiguous run of ones:

    * on a ``first`` beat the run may start and end at any lane (a parser can start the CRC
      at a header that begins mid-beat); an all-zero ``keep`` starts an empty message;
    * on any other beat the run must start at lane 0 and may end at any lane (a partial last
      beat); an all-zero ``keep`` leaves the CRC unchanged;
    * a beat whose run ends before the last lane ends the message: until the next ``first``
      beat, only beats with an all-zero ``keep`` may follow.

    Any other ``keep`` pattern leaves ``crc`` undefined until the next ``first`` beat. Data in
    lanes that are not kept is ignored.

    Timing: one beat per cycle (II = 1), no stalls, three pipeline stages that move on every
    cycle with ``en`` high (``en`` is a clock enable for the whole unit, so a stalling pipeline
    can keep it in step with its own stages; tie it high otherwise). A beat taken in an
    enabled cycle (``valid`` and ``en``) shows in ``match`` after the second enabled clock edge
    from that cycle on (counting the one that takes it) and in ``crc`` after the third: with
    ``en`` always high, ``match`` two cycles and ``crc`` three cycles after the beat is at the
    inputs. Both hold while no beat is taken. After reset, ``crc`` is the CRC of the empty
    message, ``zlib.crc32(init_bytes)``.

    Implementation (``L = W/8`` lanes, ``Z`` the GF(2) matrix advancing the CRC state over one
    zero byte, ``B`` the data matrix of a full beat):

    1. *Data stage*, no feedback: ``term = B * (data with the lanes outside the run zeroed)``,
       and on a ``first`` beat whose run starts at lane ``s`` also ``xor Z^(L-s) * init``. Only
       the full-beat data matrix is needed: a partial beat is a full beat with zero bytes
       after its end, to be undone in stage 3.
    2. *Loop*: ``T = Z^L * T xor term`` (``T = term`` on a ``first`` beat): one fixed 32 x 32
       matrix and one XOR per bit, whatever the byte count, so the state feedback is two or
       three LUT levels.
    3. *Fold*: ``crc = ~(Z^-k * T)``, where ``k`` is the number of lanes after the run's end
       in the last beat (0 for a full beat): the zero bytes stage 1 added are taken back out.
       ``match`` compares ``T`` with the constant ``Z^k * ~residue`` instead, which needs no
       fold (a parser checking an ICRC residue gets its answer a cycle earlier).

    Cost grows with ``W**2`` in the data stage and with ``W`` in the fold (``L - 1`` state
    matrices). Figures: ``docs/boards.md``.

    Parameters
    ----------
    data_width : int
        Width ``W`` of ``data`` in bits: a multiple of 8, from 8 to 512.
    init_bytes : bytes
        Constant prefix folded into the initial state at elaboration time, costing no cycles.
        The RoCEv2 ICRC uses eight ``0xFF`` bytes (standing in for the InfiniBand LRH).
    residue : int or None
        The finalized CRC ``match`` looks for (a receiver's check of a message followed by its
        own CRC); ``None``: ``match`` stays 0.

    Members
    -------
    valid : ``In(1)``
        A beat is present. No backpressure: every valid beat is taken (when ``en`` is high).
    first : ``In(1)``
        This beat starts a new message (the CRC restarts from ``init_bytes``).
    data : ``In(data_width)``
        Beat data, lane 0 in the least significant byte.
    keep : ``In(data_width // 8)``
        Valid lanes of the beat; see above.
    en : ``In(1, init=1)``
        Clock enable of every stage.
    crc : ``Out(32)``
        Finalized CRC of the message so far (registered, three stages).
    state : ``Out(32)``
        The CRC register before the final XOR, ``crc ^ 0xFFFFFFFF``.
    match : ``Out(1)``
        ``crc`` will equal ``residue`` once the fold stage has moved (combinational from the
        loop register; two stages).
    """

    #: Enabled cycles from a beat at the inputs to ``crc`` (``match``: one fewer).
    LATENCY = 3

    def __init__(self, *, data_width=64, init_bytes=b"", residue=None):
        if not isinstance(data_width, int) or isinstance(data_width, bool):
            raise TypeError(f"Data width must be an integer, not {data_width!r}")
        if not 8 <= data_width <= 512 or data_width % 8 != 0:
            raise ValueError(f"Data width must be a multiple of 8 from 8 to 512, "
                             f"not {data_width!r}")
        if not isinstance(init_bytes, bytes | bytearray):
            raise TypeError(f"Initial bytes must be a bytes object, not {init_bytes!r}")
        if residue is not None and (not isinstance(residue, int) or isinstance(residue, bool)
                                    or not 0 <= residue <= _STATE_MASK):
            raise ValueError(f"Residue must be None or an integer from 0 to 0xFFFFFFFF, "
                             f"not {residue!r}")
        self._data_width = data_width
        self._init_bytes = bytes(init_bytes)
        self._init_state = _advance_state(_STATE_MASK, self._init_bytes)
        self._residue = residue

        super().__init__({
            "valid": In(1),
            "first": In(1),
            "data":  In(data_width),
            "keep":  In(data_width // 8),
            "en":    In(1, init=1),
            "crc":   Out(32, init=self._init_state ^ _STATE_MASK),
            "state": Out(32),
            "match": Out(1),
        })

    @property
    def data_width(self):
        return self._data_width

    @property
    def init_bytes(self):
        return self._init_bytes

    @property
    def residue(self):
        return self._residue

    def elaborate(self, platform):
        m = Module()

        lanes = self._data_width // 8
        full = _update_matrices(lanes)[lanes]
        loop_rows = [row & _STATE_MASK for row in full]           # Z^L
        data_rows = [row >> _STATE_BITS for row in full]          # B
        zero = [_zero_advance(count) for count in range(lanes + 1)]
        # Z^(L-s) * init for a first beat's run starting at lane s (s = L: an empty run).
        first_init = [_apply(zero[lanes - start], self._init_state) for start in range(lanes + 1)]

        m.d.comb += self.state.eq(~self.crc)

        # Start and end of the `keep` run (the later assignment wins, so `run_end` is one past
        # the highest set lane and `run_start` the lowest); both `lanes` for an empty run.
        run_end = Signal(range(lanes + 1), init=lanes)
        run_start = Signal(range(lanes + 1), init=lanes)
        for lane in range(lanes):
            with m.If(self.keep[lane]):
                m.d.comb += run_end.eq(lane + 1)
        for lane in reversed(range(lanes)):
            with m.If(self.keep[lane]):
                m.d.comb += run_start.eq(lane)

        kept_data = Signal(self._data_width)
        m.d.comb += kept_data.eq(Cat(self.data.word_select(lane, 8) &
                                     self.keep[lane].replicate(8) for lane in range(lanes)))

        # --- Stage 1: the data term (no feedback) --------------------------------------------
        # Its registers load on every enabled cycle; only `p_valid` says whether they hold a
        # beat, so the wide registers have no enable but `en`.
        p_valid = Signal()
        p_first = Signal()
        p_tail = Signal(range(lanes))       # lanes after the run's end (0: the beat was full)
        p_term = Signal(_STATE_BITS)
        start_term = Signal(_STATE_BITS)
        with m.If(self.first):
            m.d.comb += start_term.eq(Array(C(v, _STATE_BITS) for v in first_init)[run_start])
        with m.If(self.en):
            m.d.sync += [
                p_valid.eq(self.valid & (self.first | self.keep.any())),
                p_first.eq(self.first),
                p_tail.eq(lanes - run_end),
                p_term.eq(Cat((kept_data & row).xor() for row in data_rows) ^ start_term),
            ]

        # --- Stage 2: the loop ---------------------------------------------------------------
        loop = Signal(_STATE_BITS, init=self._init_state)
        tail = Signal(range(lanes))
        advanced = Signal(_STATE_BITS)
        m.d.comb += advanced.eq(Cat((loop & row).xor() for row in loop_rows))
        with m.If(self.en & p_valid):
            m.d.sync += [
                loop.eq(Mux(p_first, 0, advanced) ^ p_term),
                tail.eq(p_tail),
            ]

        # --- Stage 3: fold (take the zero bytes after a partial beat back out) ----------------
        folded = Signal(_STATE_BITS)
        # A switch rather than a mux so that the simulator only evaluates the selected matrix.
        with m.Switch(tail):
            for count in range(lanes):
                with m.Case(count):
                    if count == 0:
                        m.d.comb += folded.eq(loop)
                    else:
                        rows = _invert(zero[count])
                        m.d.comb += folded.eq(Cat((loop & row).xor() for row in rows))
        with m.If(self.en):
            m.d.sync += self.crc.eq(~folded)

        if self._residue is not None:
            # crc == residue  <=>  Z^-k * T == ~residue  <=>  T == Z^k * ~residue.
            target = self._residue ^ _STATE_MASK
            expected = Array(C(_apply(zero[count], target), _STATE_BITS)
                             for count in range(lanes))
            m.d.comb += self.match.eq(loop == expected[tail])

        return m
