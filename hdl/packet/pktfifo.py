"""Block-RAM beat FIFO for store-and-forward packet processing: commit, rollback and seek.

A writer stores the beats of a frame as they arrive and decides afterwards what becomes of
them: :class:`PacketFifo` keeps the beats written since the last *commit* invisible to the
reader, so a frame can be *rolled back* (its beats forgotten, their space reused) while it is
still being written. The reader streams committed beats in order and may *seek* forward to
any committed beat, releasing every beat before it: that is how a parser skips a frame's
header bytes, or whole frames it dropped after they were committed.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

__all__ = ["PacketFifo"]


class PacketFifo(wiring.Component):
    """A FIFO of ``width``-bit beats in one block RAM, with commit/rollback and a seekable reader.

    Pointers (``w_ptr``, ``r_seek_ptr``, ...) count beats modulo ``2 * depth``: the extra top
    bit tells a full FIFO from an empty one, and a pointer's low bits are the RAM address.

    Writing: ``w_en`` writes ``w_data`` at ``w_ptr`` and advances it; a write when
    ``w_space`` is 0 is ignored. ``w_commit`` makes every beat written so far, including one
    written in the same cycle, visible to the reader. ``w_rollback`` forgets every uncommitted
    beat, including one written in the same cycle (``w_ptr`` returns to the last commit);
    ``w_commit`` and ``w_rollback`` must not be asserted together.

    Reading: ``r`` presents committed beats in order, one per cycle while ``r.ready`` is high
    (the RAM's read latency is hidden by reading ahead). ``r_seek`` moves the reader to
    ``r_seek_ptr`` and releases every beat before it; the beat ``r`` presents in that cycle is
    discarded (even if ``r.ready`` is high), and the beat at ``r_seek_ptr`` is presented as
    soon as it is committed and read (see Timing).
    ``r_seek_ptr`` must lie between the release point (``r_ptr``) and the last commit.

    Space: a beat is released when ``r`` transfers it or a seek passes it; ``w_space`` counts
    free beats. Rollback releases the rolled-back beats at once.

    Timing: one write and one read per cycle. With ``registered_read`` (the default) the RAM's
    output goes into a 2-entry buffer and ``r.payload`` is a register: a beat is presented two
    cycles after it is committed or sought at the earliest. Without it, ``r.payload`` is the
    RAM's output (one cycle, but the RAM's clock-to-out then starts the consumer's paths).

    Parameters
    ----------
    width : int
        Bits per beat.
    depth : int
        Beats of storage, a power of two of at least 2.
    registered_read : bool
        Register the RAM output before presenting it (see Timing).

    Members
    -------
    w_en, w_data, w_commit, w_rollback : ``In``
        Write side, see above.
    w_ptr : ``Out(ptr_bits)``
        Where the next beat will be written.
    w_space : ``Out(range(depth + 1))``
        Free beats.
    r : ``Out(stream.Signature(width))``
        Committed beats, in order.
    r_seek, r_seek_ptr : ``In``
        Reader seek, see above.
    r_ptr : ``Out(ptr_bits)``
        The release point: the pointer of the beat ``r`` presents, or of the next beat to read.
    """

    def __init__(self, *, width, depth, registered_read=True):
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"Width must be a positive integer, not {width!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2 or \
                depth & (depth - 1):
            raise ValueError(f"Depth must be a power of two of at least 2, not {depth!r}")
        self._width = width
        self._depth = depth
        self._registered_read = bool(registered_read)
        ptr_bits = exact_log2(depth) + 1
        super().__init__({
            "w_en": In(1),
            "w_data": In(width),
            "w_commit": In(1),
            "w_rollback": In(1),
            "w_ptr": Out(ptr_bits),
            "w_space": Out(range(depth + 1)),
            "r": Out(stream.Signature(width)),
            "r_seek": In(1),
            "r_seek_ptr": In(ptr_bits),
            "r_ptr": Out(ptr_bits),
        })

    @property
    def width(self):
        return self._width

    @property
    def depth(self):
        return self._depth

    @property
    def ptr_bits(self):
        return exact_log2(self._depth) + 1

    def elaborate(self, platform):
        m = Module()
        addr_bits = exact_log2(self._depth)

        m.submodules.storage = storage = Memory(shape=self._width, depth=self._depth, init=[])
        write = storage.write_port()
        read = storage.read_port(domain="sync")

        wr_ptr = self.w_ptr
        commit_ptr = Signal(self.ptr_bits)
        rd_ptr = Signal(self.ptr_bits)          # next beat to fetch from the RAM
        release_ptr = self.r_ptr

        # --- write side ---
        do_write = Signal()
        m.d.comb += [
            do_write.eq(self.w_en & (self.w_space != 0)),
            write.addr.eq(wr_ptr[:addr_bits]),
            write.data.eq(self.w_data),
            write.en.eq(do_write & ~self.w_rollback),
        ]
        wr_next = Signal(self.ptr_bits)
        m.d.comb += wr_next.eq(wr_ptr + do_write)
        with m.If(self.w_rollback):
            m.d.sync += wr_ptr.eq(commit_ptr)
        with m.Else():
            m.d.sync += wr_ptr.eq(wr_next)
        with m.If(self.w_commit & ~self.w_rollback):
            m.d.sync += commit_ptr.eq(wr_next)

        # --- read side ---
        # Reads run ahead of the consumer into a small buffer that presents `r`. With
        # `registered_read` the RAM output is registered first (a 2-entry buffer behind the RAM,
        # nothing but a register after the RAM's slow clock-to-out); otherwise `r.payload` is
        # the RAM read port's output, which holds while the port is disabled. The late inputs
        # (`r.ready`, `r_seek`) only select between values computed from registers.
        take = Signal()
        seek_fetch = Signal()
        run_fetch = Signal()
        fetch = Signal()
        rd_inc = Signal(self.ptr_bits)
        seek_inc = Signal(self.ptr_bits)
        m.d.comb += [
            take.eq(self.r.valid & self.r.ready),
            seek_fetch.eq(self.r_seek_ptr != commit_ptr),
            fetch.eq(Mux(self.r_seek, seek_fetch, run_fetch)),
            rd_inc.eq(rd_ptr + 1),
            seek_inc.eq(self.r_seek_ptr + 1),
            read.addr.eq(Mux(self.r_seek, self.r_seek_ptr, rd_ptr)[:addr_bits]),
            read.en.eq(fetch),
        ]
        with m.If(self.r_seek):
            m.d.sync += rd_ptr.eq(Mux(seek_fetch, seek_inc, self.r_seek_ptr))
        with m.Elif(run_fetch):
            m.d.sync += rd_ptr.eq(rd_inc)

        if not self._registered_read:
            m.d.comb += [
                run_fetch.eq((rd_ptr != commit_ptr) & (~self.r.valid | self.r.ready)),
                self.r.payload.eq(read.data),
            ]
            with m.If(fetch):
                m.d.sync += self.r.valid.eq(1)
            with m.Elif(self.r_seek | self.r.ready):
                m.d.sync += self.r.valid.eq(0)
        else:
            in_flight = Signal()                # a read issued last cycle: its data is here now
            count = Signal(range(3))            # beats in the buffer
            buffer = [Signal(self._width, name=f"rbuf{k}") for k in range(2)]
            m.d.comb += [
                # Room for the read in flight and one more, counting the beat leaving now.
                run_fetch.eq((rd_ptr != commit_ptr) &
                             (count + in_flight < 2 + take)),
                self.r.valid.eq(count != 0),
                self.r.payload.eq(buffer[0]),
            ]
            m.d.sync += in_flight.eq(fetch)
            with m.If(self.r_seek):
                m.d.sync += count.eq(0)         # the read in flight was for the old position
            with m.Else():
                # Shift out the taken beat, append the arriving one.
                with m.Switch(Cat(take, in_flight)):
                    with m.Case(0b01):          # take only
                        m.d.sync += [buffer[0].eq(buffer[1]), count.eq(count - 1)]
                    with m.Case(0b10):          # arrival only
                        with m.If(count == 0):
                            m.d.sync += buffer[0].eq(read.data)
                        with m.Else():
                            m.d.sync += buffer[1].eq(read.data)
                        m.d.sync += count.eq(count + 1)
                    with m.Case(0b11):          # both
                        with m.If(count == 1):
                            m.d.sync += buffer[0].eq(read.data)
                        with m.Else():
                            m.d.sync += [buffer[0].eq(buffer[1]), buffer[1].eq(read.data)]

        # Release point: the presented beat, or the next one to fetch.
        with m.If(self.r_seek):
            m.d.sync += release_ptr.eq(self.r_seek_ptr)
        with m.Elif(self.r.valid & self.r.ready):
            m.d.sync += release_ptr.eq(release_ptr + 1)
        m.d.comb += self.w_space.eq(self._depth - (wr_ptr - release_ptr)[:addr_bits + 1])
        return m
