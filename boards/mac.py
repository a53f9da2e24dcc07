"""A 1 Gb/s Ethernet MAC at the GMII byte level: one byte per cycle of a 125 MHz domain.

::

    frames (beats) ─► MacTx ─► txd, tx_en, tx_er ─► (RGMII adapter, PHY)
    frames (beats) ◄─ MacRx ◄─ rxd, rx_dv, rx_er ◄─ (RGMII adapter, PHY)

Frames on the NIC side are streams of :func:`~hdl.packet.headers.net_beat_layout` beats
without FCS. Both directions are store-and-forward through a
:class:`~hdl.packet.pktfifo.PacketFifo` in block RAM: the transmitter starts a frame on the
wire only once the whole frame is buffered, so input bubbles can never underrun the wire; the
receiver makes a frame visible only once its FCS and length are checked, and drops bad frames
whole. The FCS is computed by :class:`~hdl.packet.crc.CRC32`, the unit that computes the ICRC.

Both components run in their ``sync`` domain (apply a ``DomainRenamer`` for the GMII clock
domains); they contain no clock-domain crossing and no I/O primitives.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.packet.crc import CRC32
from hdl.packet.headers import net_beat_layout
from hdl.packet.parser import ICRC_RESIDUE
from hdl.packet.pktfifo import PacketFifo
from hdl.util import validating

__all__ = [
    "PREAMBLE_BYTES", "PREAMBLE", "SFD", "FCS_BYTES", "MIN_FRAME", "FCS_RESIDUE",
    "MacTx", "MacRx",
]


#: Preamble bytes a transmitter sends before the SFD (a receiver accepts any number).
PREAMBLE_BYTES = 7
PREAMBLE = 0x55
#: Start-of-frame delimiter.
SFD = 0xD5
FCS_BYTES = 4
#: Shortest frame on the wire, FCS included; shorter frames are padded with zeros.
MIN_FRAME = 64
#: The CRC of a frame followed by its FCS. Ethernet's FCS and RoCEv2's ICRC are the same CRC-32
#: sent least significant byte first, so they leave the same residue.
FCS_RESIDUE = ICRC_RESIDUE

_MAX_FRAME_LIMIT = 16384


def _check_data_width(data_width):
    if not isinstance(data_width, int) or isinstance(data_width, bool) or \
            not 8 <= data_width <= 512 or data_width % 8:
        raise ValueError(f"data_width must be a multiple of 8 from 8 to 512, "
                         f"not {data_width!r}")


def _check_max_frame(max_frame):
    if not isinstance(max_frame, int) or isinstance(max_frame, bool) or \
            not MIN_FRAME <= max_frame <= _MAX_FRAME_LIMIT:
        raise ValueError(f"max_frame must be an integer from {MIN_FRAME} to "
                         f"{_MAX_FRAME_LIMIT} (bytes, FCS included), not {max_frame!r}")


def _frame_beats(max_frame, data_width):
    """Beats of the longest frame without its FCS."""
    return -(-(max_frame - FCS_BYTES) // (data_width // 8))


def _power_of_two_at_least(n):
    return 1 << max(n - 1, 1).bit_length()


def _saturating_increment(m, counter):
    with m.If(counter != (1 << len(counter)) - 1):
        m.d.sync += counter.eq(counter + 1)


# ---------------------------------------------------------------------------------------------
# Transmit
# ---------------------------------------------------------------------------------------------

class MacTx(wiring.Component):
    """Send frames on GMII: preamble, SFD, frame, zero padding to 60 bytes, FCS, gap.

    Each frame from ``i`` is stored in a block-RAM FIFO and starts on the wire only once its
    last beat is stored (store-and-forward), so the bytes of a frame leave back to back
    whatever bubbles ``i`` has. On the wire, a frame is ``PREAMBLE_BYTES`` x ``0x55``, ``0xD5``,
    the frame's bytes, zeros up to 60 bytes if it is shorter, and the FCS
    (``zlib.crc32`` of frame and padding, least significant byte first); ``tx_en`` then stays
    low for at least ``ifg`` cycles, and for exactly ``ifg`` when the next frame is already
    stored (line rate whenever ``i`` brings more than one byte per cycle).

    The FIFO holds two frames of ``max_frame`` bytes, so the next frame is stored while one is
    on the wire. A frame longer than ``max_frame - 4`` bytes (counted in whole beats: its beat
    count exceeds ``ceil((max_frame - 4) / (W / 8))``) is dropped whole and counted in
    ``oversize``, as nothing could ever store it.

    Every beat must keep at least lane 0 (a beat with ``keep == 0`` is sent as if lane 0 were
    kept); ``first`` is ignored: a frame starts after the previous ``last``.

    Latency: the first preamble byte is on ``txd`` six cycles after the frame's last beat is
    taken (when the wire is idle and the gap has passed); ``txd`` and ``tx_en`` are
    registers.

    Parameters
    ----------
    data_width : int
        Width ``W`` of the beats' ``data``: a multiple of 8 from 8 to 512.
    ifg : int
        Idle cycles (bytes) between frames, 1 to 255; Ethernet's inter-frame gap is 12.
    max_frame : int
        Longest frame in bytes, FCS included, 64 to 16384 (sizes the FIFO).

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(W)))``
        Frames to send, without FCS.
    txd : ``Out(8)``
        GMII transmit data, one byte per cycle.
    tx_en : ``Out(1)``
        GMII transmit enable: high from the first preamble byte to the last FCS byte.
    tx_er : ``Out(1)``
        GMII transmit error: always 0.
    frames : ``Out(32)``
        Frames sent (counted as the last FCS byte leaves).
    oversize : ``Out(32)``
        Frames dropped for being longer than ``max_frame``.
    """

    def __init__(self, *, data_width=64, ifg=12, max_frame=1522):
        with validating(self):
            _check_data_width(data_width)
            if not isinstance(ifg, int) or isinstance(ifg, bool) or not 1 <= ifg <= 255:
                raise ValueError(f"ifg must be an integer from 1 to 255, not {ifg!r}")
            _check_max_frame(max_frame)
        self._data_width = data_width
        self._ifg = ifg
        self._max_frame = max_frame
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(data_width))),
            "txd": Out(8),
            "tx_en": Out(1),
            "tx_er": Out(1),
            "frames": Out(32),
            "oversize": Out(32),
        })

    @property
    def data_width(self):
        return self._data_width

    @property
    def ifg(self):
        return self._ifg

    @property
    def max_frame(self):
        return self._max_frame

    @property
    def buffer_beats(self):
        """Beats of FIFO storage: two of the longest frames, rounded up to a power of two."""
        return _power_of_two_at_least(2 * _frame_beats(self._max_frame, self._data_width))

    def elaborate(self, platform):
        m = Module()
        lanes = self._data_width // 8
        layout = net_beat_layout(self._data_width)
        max_beats = _frame_beats(self._max_frame, self._data_width)

        m.submodules.fifo = fifo = PacketFifo(width=layout.size, depth=self.buffer_beats)
        m.submodules.crc = crc = CRC32(data_width=8)

        # --- Write side: store frames, commit each on its last beat ---------------------------
        beats = Signal(range(max_beats + 1))        # beats of the frame stored so far
        dropping = Signal()                         # the rest of an oversize frame
        too_long = Signal()
        m.d.comb += [
            too_long.eq(beats == max_beats),
            self.i.ready.eq(dropping | (fifo.w_space != 0)),
            fifo.w_data.eq(self.i.payload),
        ]
        with m.If(self.i.valid & self.i.ready):
            with m.If(dropping):
                m.d.sync += dropping.eq(~self.i.payload.last)
            with m.Elif(too_long):
                m.d.comb += fifo.w_rollback.eq(1)
                m.d.sync += [
                    dropping.eq(~self.i.payload.last),
                    beats.eq(0),
                    self.oversize.eq(self.oversize + 1),
                ]
            with m.Else():
                m.d.comb += [
                    fifo.w_en.eq(1),
                    fifo.w_commit.eq(self.i.payload.last),
                ]
                m.d.sync += beats.eq(Mux(self.i.payload.last, 0, beats + 1))

        # --- Read side: one wire symbol per cycle ---------------------------------------------
        # The FSM makes one wire byte per cycle and feeds frame and padding bytes to the CRC
        # unit as it makes them. The FCS bytes are placeholders, filled in at the output
        # register once the CRC has come out of the unit's pipeline (see the delay line).
        beat = data.View(layout, fifo.r.payload)
        lane = Signal(range(lanes))
        sent = Signal(range(MIN_FRAME - FCS_BYTES + 1))     # frame + pad bytes, saturating
        step = Signal(range(PREAMBLE_BYTES + 1))            # within the preamble or the FCS
        gap = Signal(range(self._ifg), init=self._ifg - 1)  # idle cycles so far, minus one

        sym_en = Signal()
        sym_byte = Signal(8)
        sym_fcs = Signal()          # an FCS byte: number `step`, filled in later
        sym_end = Signal()          # the frame's last byte

        # Lanes are contiguous from lane 0, so the beat ends where the next lane is not kept.
        beat_ends = Signal()
        next_kept = Cat(beat.keep[1:], C(0, 1))
        m.d.comb += beat_ends.eq(~next_kept.bit_select(lane, 1))

        with m.FSM():
            with m.State("IDLE"):
                with m.If(gap != self._ifg - 1):
                    m.d.sync += gap.eq(gap + 1)
                with m.Elif(fifo.r.valid):
                    m.d.sync += step.eq(0)
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.comb += [
                    sym_en.eq(1),
                    sym_byte.eq(Mux(step == PREAMBLE_BYTES, SFD, PREAMBLE)),
                ]
                m.d.sync += step.eq(step + 1)
                with m.If(step == PREAMBLE_BYTES):
                    m.d.sync += [lane.eq(0), sent.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [
                    sym_en.eq(1),
                    sym_byte.eq(beat.data.word_select(lane, 8)),
                    crc.valid.eq(1),
                    crc.first.eq(sent == 0),
                ]
                _saturating_increment(m, sent)
                m.d.sync += lane.eq(lane + 1)
                with m.If(beat_ends):
                    # The whole frame is committed, so the next beat is already there.
                    m.d.comb += fifo.r.ready.eq(1)
                    m.d.sync += [lane.eq(0), step.eq(0)]
                    with m.If(beat.last):
                        with m.If(sent < MIN_FRAME - FCS_BYTES - 1):
                            m.next = "PAD"
                        with m.Else():
                            m.next = "FCS"
            with m.State("PAD"):
                m.d.comb += [sym_en.eq(1), crc.valid.eq(1)]
                m.d.sync += sent.eq(sent + 1)
                with m.If(sent == MIN_FRAME - FCS_BYTES - 1):
                    m.next = "FCS"
            with m.State("FCS"):
                m.d.comb += [
                    sym_en.eq(1),
                    sym_fcs.eq(1),
                    sym_end.eq(step == FCS_BYTES - 1),
                ]
                m.d.sync += step.eq(step + 1)
                with m.If(step == FCS_BYTES - 1):
                    m.d.sync += gap.eq(0)
                    m.next = "IDLE"

        m.d.comb += [
            crc.data.eq(sym_byte),
            crc.keep.eq(1),
        ]

        # --- Delay line and output register ---------------------------------------------------
        # A byte at the CRC unit's inputs in cycle t is in `crc.crc` from cycle t + 3. The last
        # padded byte is made in cycle t, the first FCS placeholder in t + 1; two delay stages
        # put the placeholder at the output register's input in cycle t + 3.
        symbol = data.StructLayout({"en": 1, "byte": 8, "fcs": 1, "index": 2, "end": 1})
        stages = [Signal(symbol, name=f"delay{k}") for k in range(CRC32.LATENCY - 1)]
        m.d.sync += stages[0].eq(Cat(sym_en, sym_byte, sym_fcs, step[:2], sym_end))
        for prev, stage in zip(stages, stages[1:], strict=False):
            m.d.sync += stage.eq(prev)
        out = stages[-1]
        m.d.sync += [
            self.tx_en.eq(out.en),
            self.txd.eq(Mux(out.fcs, crc.crc.word_select(out.index, 8), out.byte)),
        ]
        with m.If(out.end):
            m.d.sync += self.frames.eq(self.frames + 1)
        return m


# ---------------------------------------------------------------------------------------------
# Receive
# ---------------------------------------------------------------------------------------------

class MacRx(wiring.Component):
    """Receive frames from GMII: find the SFD, check the frame, strip the FCS, deliver it whole.

    A frame starts after any number of ``0x55`` bytes (none, or fewer or more than seven)
    followed by ``0xD5``; any other byte before the SFD discards the carrier event until
    ``rx_dv`` falls (counted in ``preamble_errors``). The frame ends when ``rx_dv`` falls. Its
    bytes, except the last four (the FCS), are packed into beats (wire byte ``i`` of a beat in
    ``data[8*i:8*i+8]``, ``first`` on the first beat, ``keep`` all ones except on the ``last``
    beat) and stored in a block-RAM FIFO; the frame becomes visible on ``o`` only once it has
    passed every check, and is otherwise dropped whole and counted under one reason, the first
    that applies:

    1. ``rx_errors``: ``rx_er`` was high with ``rx_dv`` during the preamble or the frame;
    2. ``runts``: shorter than 64 bytes, FCS included;
    3. ``oversize``: longer than ``max_frame`` bytes, FCS included;
    4. ``fcs_errors``: the FCS is not the CRC-32 of the bytes before it;
    5. ``overflows``: the FIFO had no room for one of its beats (``o`` is not drained fast
       enough).

    A frame that passes is counted in ``frames``. Frames shorter than 64 bytes are not
    un-padded: the padding of a short frame is delivered with it, as Ethernet MACs do.

    Timing: the GMII inputs are registered; a frame's verdict is taken two cycles after
    ``rx_dv`` falls, and its first beat is on ``o`` two cycles after that at the earliest.
    Frames may follow each other after a single idle cycle, even without a preamble: the next
    frame's bytes reach the FIFO only after the previous verdict.

    Parameters
    ----------
    data_width : int
        Width ``W`` of the beats' ``data``: a multiple of 8 from 8 to 512.
    max_frame : int
        Longest accepted frame in bytes, FCS included, 64 to 16384 (1518, or 1522 with a VLAN
        tag, for standard Ethernet).
    buffer_beats : int or None
        Beats of FIFO storage, a power of two of at least 2; ``None``: two of the longest
        frames, rounded up to a power of two. Frames that do not fit count as overflows.

    Members
    -------
    rxd : ``In(8)``
        GMII receive data.
    rx_dv : ``In(1)``
        GMII receive data valid.
    rx_er : ``In(1)``
        GMII receive error.
    o : ``Out(stream.Signature(net_beat_layout(W)))``
        Good frames, without preamble, SFD and FCS.
    frames, fcs_errors, runts, oversize, rx_errors, overflows, preamble_errors : ``Out(32)``
        Frames delivered, and carrier events dropped for each reason (see above).
    """

    def __init__(self, *, data_width=64, max_frame=1522, buffer_beats=None):
        with validating(self):
            _check_data_width(data_width)
            _check_max_frame(max_frame)
            if buffer_beats is None:
                buffer_beats = _power_of_two_at_least(2 * _frame_beats(max_frame, data_width))
            elif (not isinstance(buffer_beats, int) or isinstance(buffer_beats, bool) or
                    buffer_beats < 2 or buffer_beats & (buffer_beats - 1)):
                raise ValueError(f"buffer_beats must be None or a power of two of at least 2, "
                                 f"not {buffer_beats!r}")
        self._data_width = data_width
        self._max_frame = max_frame
        self._buffer_beats = buffer_beats
        super().__init__({
            "rxd": In(8),
            "rx_dv": In(1),
            "rx_er": In(1),
            "o": Out(stream.Signature(net_beat_layout(data_width))),
            "frames": Out(32),
            "fcs_errors": Out(32),
            "runts": Out(32),
            "oversize": Out(32),
            "rx_errors": Out(32),
            "overflows": Out(32),
            "preamble_errors": Out(32),
        })

    @property
    def data_width(self):
        return self._data_width

    @property
    def max_frame(self):
        return self._max_frame

    @property
    def buffer_beats(self):
        return self._buffer_beats

    def elaborate(self, platform):
        m = Module()
        lanes = self._data_width // 8
        layout = net_beat_layout(self._data_width)

        m.submodules.fifo = fifo = PacketFifo(width=layout.size, depth=self._buffer_beats)
        m.submodules.crc = crc = CRC32(data_width=8, residue=FCS_RESIDUE)

        m.d.comb += [
            self.o.valid.eq(fifo.r.valid),
            self.o.payload.eq(fifo.r.payload),
            fifo.r.ready.eq(self.o.ready),
        ]

        rxd = Signal(8)
        rx_dv = Signal()
        rx_er = Signal()
        m.d.sync += [rxd.eq(self.rxd), rx_dv.eq(self.rx_dv), rx_er.eq(self.rx_er)]

        # --- Per-frame state ------------------------------------------------------------------
        received = Signal(range(self._max_frame + 2))   # bytes, FCS included, saturating
        error = Signal()                                # rx_er seen in the frame
        overflow = Signal()                             # a beat did not fit the FIFO
        held = Signal(8 * FCS_BYTES)                    # the last four bytes: maybe the FCS
        held_count = Signal(range(FCS_BYTES + 1))
        beat = Signal(layout)                           # beat being packed
        beat_count = Signal(range(lanes + 1))           # bytes in it

        start = Signal()            # SFD seen: the next byte is the frame's first
        byte_in = Signal()          # a frame byte is in `rxd`
        end = Signal()              # rx_dv fell after frame bytes

        with m.FSM():
            with m.State("IDLE"):
                with m.If(rx_dv & rx_er):
                    m.d.sync += self.rx_errors.eq(self.rx_errors + 1)
                    m.next = "DISCARD"
                with m.Elif(rx_dv & (rxd == SFD)):
                    m.d.comb += start.eq(1)
                    m.next = "DATA"
                with m.Elif(rx_dv & (rxd == PREAMBLE)):
                    m.next = "PREAMBLE"
                with m.Elif(rx_dv):
                    m.d.sync += self.preamble_errors.eq(self.preamble_errors + 1)
                    m.next = "DISCARD"
            with m.State("PREAMBLE"):
                with m.If(~rx_dv):
                    m.d.sync += self.preamble_errors.eq(self.preamble_errors + 1)
                    m.next = "IDLE"
                with m.Elif(rx_er):
                    m.d.sync += self.rx_errors.eq(self.rx_errors + 1)
                    m.next = "DISCARD"
                with m.Elif(rxd == SFD):
                    m.d.comb += start.eq(1)
                    m.next = "DATA"
                with m.Elif(rxd != PREAMBLE):
                    m.d.sync += self.preamble_errors.eq(self.preamble_errors + 1)
                    m.next = "DISCARD"
            with m.State("DATA"):
                with m.If(rx_dv):
                    m.d.comb += byte_in.eq(1)
                with m.Else():
                    m.d.comb += end.eq(1)
                    m.next = "IDLE"
            with m.State("DISCARD"):
                with m.If(~rx_dv):
                    m.next = "IDLE"

        m.d.comb += [
            crc.valid.eq(byte_in),
            crc.first.eq(received == 0),
            crc.data.eq(rxd),
            crc.keep.eq(1),
        ]

        # Bytes leave the hold-back register for the packer once four newer ones are in it;
        # a full beat is written when the byte after it arrives (or at the verdict, as the last).
        write_full_beat = Signal()
        with m.If(start):
            m.d.sync += [
                received.eq(0),
                error.eq(0),
                overflow.eq(0),
                held_count.eq(0),
                beat_count.eq(0),
                beat.first.eq(1),
            ]
        with m.Elif(byte_in):
            with m.If(received != self._max_frame + 1):
                m.d.sync += received.eq(received + 1)
            m.d.sync += [
                error.eq(error | rx_er),
                held.eq(Cat(held[8:], rxd)),
            ]
            with m.If(held_count != FCS_BYTES):
                m.d.sync += held_count.eq(held_count + 1)
            with m.Else():
                leaving = held[:8]
                with m.If(beat_count == lanes):
                    m.d.comb += write_full_beat.eq(1)
                    m.d.sync += [
                        beat.data.eq(leaving),
                        beat.first.eq(0),
                        beat_count.eq(1),
                    ]
                with m.Else():
                    m.d.sync += [
                        beat.data.word_select(beat_count, 8).eq(leaving),
                        beat_count.eq(beat_count + 1),
                    ]

        # --- Verdict --------------------------------------------------------------------------
        # The CRC unit's `match` is for the last byte (fed in the cycle before `end`) two cycles
        # after it was fed: one cycle after `end`. The frame's state holds until then: a new
        # frame's `start` comes in that cycle at the earliest and its writes land later still.
        verdict = Signal()
        m.d.sync += verdict.eq(end)
        write_last_beat = Signal()
        m.d.comb += write_last_beat.eq(verdict & (beat_count != 0))

        full_keep = (1 << lanes) - 1
        last_keep = Signal(lanes)
        with m.Switch(beat_count):
            for count in range(lanes + 1):
                with m.Case(count):
                    m.d.comb += last_keep.eq((1 << count) - 1)
        stored = Signal(layout)
        m.d.comb += [
            stored.data.eq(beat.data),
            stored.keep.eq(Mux(verdict, last_keep, full_keep)),
            stored.first.eq(beat.first),
            stored.last.eq(verdict),
            fifo.w_data.eq(stored),
            fifo.w_en.eq(write_full_beat | write_last_beat),
        ]
        with m.If(write_full_beat & (fifo.w_space == 0)):
            m.d.sync += overflow.eq(1)

        runt = received < MIN_FRAME
        too_long = received > self._max_frame
        lost = overflow | (write_last_beat & (fifo.w_space == 0))
        with m.If(verdict):
            with m.If(error):
                m.d.sync += self.rx_errors.eq(self.rx_errors + 1)
            with m.Elif(runt):
                m.d.sync += self.runts.eq(self.runts + 1)
            with m.Elif(too_long):
                m.d.sync += self.oversize.eq(self.oversize + 1)
            with m.Elif(~crc.match):
                m.d.sync += self.fcs_errors.eq(self.fcs_errors + 1)
            with m.Elif(lost):
                m.d.sync += self.overflows.eq(self.overflows + 1)
            with m.Else():
                m.d.comb += fifo.w_commit.eq(1)
                m.d.sync += self.frames.eq(self.frames + 1)
            m.d.comb += fifo.w_rollback.eq(~fifo.w_commit)
        return m
