"""The requester's shared per-PSN state (:class:`PsnPool`): the free list of its chunks and the
reclaimer that returns a QP's chunks to it."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..util import validating
from .req_common import PSN, ControlSignature, check_config, check_observe, log2
from .req_defs import PSN_CHUNK, chunk_map_slots, psn_chunk_bits, psn_chunks
from .req_tables import table_access_signature

__all__ = ["release_layout", "chunk_alloc_signature", "chunk_map_lend_signature",
           "psn_pool_observation_layout", "PsnPool"]

#: Bits of a chunk number (a PSN's chunk: ``psn // PSN_CHUNK``, modulo the 24-bit wrap).
CHUNK_NUMBER_BITS = PSN - log2(PSN_CHUNK)


def release_layout(config):
    """QP ``qpn``'s una, as the completion engine read it: its chunks wholly below it may go
    back to the pool."""
    return data.StructLayout({"qpn": config.qpn_bits, "una": PSN})


def chunk_alloc_signature(config):
    """The segmenter's side of the free list, from the pool's side: ``available`` (a chunk is
    free), ``chunk`` (the one the segmenter gets), ``take`` (the segmenter takes it this
    cycle), and the reclaimer's hold on QP ``hold_qpn``: ``hold`` (it is returning the QP's
    last chunk, or may be: the segmenter sends nothing of that QP this cycle) and
    ``hold_at`` (it decides on a release whose una is ``hold_psn``: the QP's last chunk
    goes back if that is the QP's next PSN, so the segmenter does not send that PSN this
    cycle)."""
    return wiring.Signature({
        "available": Out(1),
        "chunk": Out(psn_chunk_bits(config)),
        "take": In(1),
        "hold": Out(1),
        "hold_at": Out(1),
        "hold_psn": Out(PSN),
        "hold_qpn": Out(config.qpn_bits),
    })


def chunk_map_lend_signature(config):
    """The chunk map read port ACK processing lends the PSN pool, from the pool's side:
    ``req`` with ``addr`` (an entry: ``Cat(chunk number % chunk_map_slots, qpn)``) asks for a
    read, ``grant`` says it is done this cycle (ACK processing takes no packet), ``data`` is
    the entry of the last granted read from the cycle after it until the next read."""
    return wiring.Signature({
        "req": Out(1),
        "addr": Out(ceil_log2(config.qps * chunk_map_slots(config))),
        "grant": In(1),
        "data": In(psn_chunk_bits(config)),
    })


def psn_pool_observation_layout(config):
    """What ``PsnPool(observe=True)`` shows on ``obs``: the free list (the chunks never
    handed out, ``fresh`` and up; the FIFO's storage, oldest position, next write position
    and fill) and the reclaimer (walking, the QP, the chunk number whose map entry it reads
    next and the one it stops at)."""
    chunks = psn_chunks(config)
    bits = psn_chunk_bits(config)
    return data.StructLayout({"fresh": range(chunks + 1),
                              "free_entries": data.ArrayLayout(bits, chunks),
                              "free_rd": range(chunks), "free_wr": range(chunks),
                              "free_count": range(chunks + 1),
                              "walk": 1, "qpn": config.qpn_bits,
                              "cur": CHUNK_NUMBER_BITS, "end": CHUNK_NUMBER_BITS})


class PsnPool(wiring.Component):
    """The free list of the shared per-PSN state's chunks, and their reclaimer.

    The per-PSN tables (``meta``, ``ev``) hold :func:`~.req_defs.psn_chunks` chunks of
    ``PSN_CHUNK`` PSNs. A QP holds the chunks of its PSNs from its ``pool_lo`` up to its next
    PSN (none when the two are equal), each named by its chunk map entry. The segmenter
    takes a chunk (``alloc``) when it sends the first PSN of a chunk, or a PSN while the QP
    holds none, and writes it into the QP's chunk map. Free chunks: those never handed out
    first, in index order (a counter, so a reset needs no table initialised), then a FIFO as
    deep as the pool (one block RAM, its registered read addressed a cycle ahead and
    transparent for the write, so the oldest chunk is ready whenever the FIFO is not empty).
    ``alloc.available`` and whether the counter's chunks are used up are registers, made a
    cycle ahead from the cycle's take and return.

    The reclaimer returns chunks, one job at a time, reading the QP's chunk map through ACK
    processing's read port (``map_read``), lent in the cycles ACK processing takes no
    packet. A ``release`` (QP, una; the completion engine sends one per visit, so after
    every advance of una) returns the QP's chunks
    wholly below una, and its last one too when una is its next PSN (nothing in flight);
    ``pool_lo`` becomes una. A QP_WRITE (``control.write``) returns all the QP's chunks (its
    next PSN read in that cycle, before the write: the engines are held) and sets
    ``pool_lo`` to the QP_WRITE's PSN. A job reads the QP's ``pool_lo`` and next PSN (IDLE),
    decides (LOAD), then reads the chunk map entries of the chunks it returns, one per cycle
    ACK processing lends the port, returns each the cycle after its read (WALK), and writes
    ``pool_lo`` from a register the cycle after the decision or the last return: 3 cycles
    plus one per chunk while no ACK arrives (the next job may start in the write's cycle).
    Releases wait in a small queue (``release`` not ready while it is full). A chunk is in
    exactly one place: never handed out, in the FIFO, or in one QP's chunk map, so the FIFO
    always has room.

    Hazards: whether the segmenter's next PSN of a QP needs a chunk depends on the QP's
    ``pool_lo``: while a QP_WRITE's job decides (LOAD) and while a job returns the QP's last
    chunk, up to the cycle ``pool_lo`` is written, the segmenter sends nothing of that QP
    (``alloc.hold``); while a release's job decides, it does not send the PSN equal to the
    release's una (``alloc.hold_at``: the last chunk goes back when that PSN is the QP's
    next); both from registers. It sees ``pool_lo``'s write a cycle later through its
    transparent port (and forwards the write into a WR it takes in that cycle). The
    segmenter keeps a QP's chunks within :func:`~.req_defs.chunk_map_slots` chunk numbers of
    its ``pool_lo``, so a chunk map entry is never overwritten before its chunk is returned.
    The control waits for the reclaimer to be idle and its queue empty (``busy``) before a
    command.

    Members
    -------
    tables : ``In(table_access_signature(config, "psn_pool"))``
    control : ``In(ControlSignature(config))``
    release : ``In(stream.Signature(release_layout(config)))``
    alloc : ``Out(chunk_alloc_signature(config))``
    map_read : ``Out(chunk_map_lend_signature(config))``
    free_chunks : ``Out(range(psn_chunks(config) + 1))``
        Free chunks: a status for tests and debugging.
    busy : ``Out(1)``
        A job is under way or queued.
    obs : ``Out(psn_pool_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.
    """

    RELEASE_DEPTH = 4

    def __init__(self, *, config, observe=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
        self._config = config
        self._observe = observe
        super().__init__({
            "tables": In(table_access_signature(config, "psn_pool")),
            "control": In(ControlSignature(config)),
            "release": In(stream.Signature(release_layout(config))),
            "alloc": Out(chunk_alloc_signature(config)),
            "map_read": Out(chunk_map_lend_signature(config)),
            "free_chunks": Out(range(psn_chunks(config) + 1)),
            "busy": Out(1),
            **({"obs": Out(psn_pool_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        chunks = psn_chunks(cfg)
        bits = psn_chunk_bits(cfg)
        slot_bits = log2(chunk_map_slots(cfg))
        cb = log2(PSN_CHUNK)
        ctl = self.control
        reads, lo_write = self.tables.read, self.tables.write.pool_lo
        alloc = self.alloc

        # -- the free list --------------------------------------------------------------------
        fresh = Signal(range(chunks + 1))
        m.submodules.free_list = free_list = Memory(shape=bits, depth=chunks, init=[])
        free_write = free_list.write_port()
        free_read = free_list.read_port(transparent_for=(free_write,))
        free_rd = Signal(range(chunks))
        free_wr = Signal(range(chunks))
        free_count = Signal(range(chunks + 1))
        free_pop = Signal()
        free_push = Signal()
        free_chunk = Signal(bits)

        def free_next(position):
            return Mux(position == chunks - 1, 0, position + 1)

        # Whether a chunk was never handed out, and whether one is available at all, are
        # registers (the segmenter's packet valid starts at them): each is made for the next
        # cycle from this cycle's take and return, the compares made from the registers.
        has_fresh = Signal(init=1)      # fresh != chunks
        available = Signal(init=1)
        has_fresh_next = Mux(alloc.take & has_fresh, fresh != chunks - 1, has_fresh)
        queued_next = Mux(free_push == free_pop, free_count != 0,
                          Mux(free_push, 1, free_count != 1))
        m.d.sync += [has_fresh.eq(has_fresh_next), available.eq(has_fresh_next | queued_next)]
        m.d.comb += [
            free_write.addr.eq(free_wr), free_write.data.eq(free_chunk),
            free_write.en.eq(free_push),
            free_read.addr.eq(Mux(free_pop, free_next(free_rd), free_rd)),
            alloc.available.eq(available),
            alloc.chunk.eq(Mux(has_fresh, fresh, free_read.data)[:bits]),
            free_pop.eq(alloc.take & ~has_fresh),
            self.free_chunks.eq(chunks - fresh + free_count),
        ]
        with m.If(alloc.take & has_fresh):
            m.d.sync += fresh.eq(fresh + 1)
        with m.If(free_push):
            m.d.sync += free_wr.eq(free_next(free_wr))
        with m.If(free_pop):
            m.d.sync += free_rd.eq(free_next(free_rd))
        m.d.sync += free_count.eq(free_count + free_push - free_pop)

        # -- the reclaimer --------------------------------------------------------------------
        m.submodules.releases = releases = SyncFIFOBuffered(
            width=release_layout(cfg).size, depth=self.RELEASE_DEPTH)
        m.d.comb += [releases.w_data.eq(self.release.payload),
                     releases.w_en.eq(self.release.valid),
                     self.release.ready.eq(releases.w_rdy)]
        queued = Signal(release_layout(cfg))
        m.d.comb += queued.eq(releases.r_data)

        W_IDLE, W_LOAD, W_WALK = range(3)
        w_state = Signal(2)
        w_qpn = Signal(qb)
        w_reset = Signal()              # a QP_WRITE's job: w_next is the QP's next PSN before it
        w_next = Signal(PSN)
        w_una = Signal(PSN)             # a release's una
        w_tail = Signal()               # the job returns the QP's last chunk too
        w_end = Signal(CHUNK_NUMBER_BITS)   # the first chunk number not returned
        w_new_lo = Signal(PSN)
        w_rd = Signal(CHUNK_NUMBER_BITS)    # the chunk number whose map entry is read next
        w_pend = Signal()               # a read was granted last cycle: its chunk is in
        idle = w_state == W_IDLE
        take_release = idle & ~ctl.write & releases.r_rdy
        qpn = Mux(idle, Mux(take_release, queued.qpn, ctl.qpn), w_qpn)
        m.d.comb += [
            releases.r_en.eq(take_release),
            self.busy.eq(~idle | releases.r_rdy | lo_write.en),
            # While idle and no release is taken, the QP of the command the control holds: in
            # a QP_WRITE's cycle `next_psn` shows the QP's entry before it.
            reads.next_psn.addr.eq(qpn), reads.pool_lo.addr.eq(qpn),
        ]
        with m.If(idle & ctl.write):
            m.d.sync += [w_state.eq(W_LOAD), w_qpn.eq(ctl.qpn), w_reset.eq(1),
                         w_next.eq(reads.next_psn.data), w_new_lo.eq(ctl.psn)]
        with m.Elif(take_release):
            m.d.sync += [w_state.eq(W_LOAD), w_qpn.eq(queued.qpn), w_reset.eq(0),
                         w_una.eq(queued.una), w_new_lo.eq(queued.una)]

        # LOAD: the QP's pool_lo and next PSN are in. It holds the chunks of the PSNs from
        # pool_lo up to its next PSN. A release returns those wholly below una, and the last
        # one too when una is the next PSN (nothing in flight); a QP_WRITE returns all.
        lo = reads.pool_lo.data
        next_psn = Mux(w_reset, w_next, reads.next_psn.data)
        una = Mux(w_reset, w_next, w_una)
        load_tail = una == next_psn
        end = Mux(load_tail, (next_psn + PSN_CHUNK - 1)[cb:PSN], una[cb:])
        count = (end - lo[cb:])[:CHUNK_NUMBER_BITS]
        # A QP never holds more chunks than its chunk map has entries: a count beyond that
        # (una behind pool_lo) returns nothing.
        load_walk = (lo != next_psn) & (count != 0) & (count <= chunk_map_slots(cfg))
        walking = w_state == W_WALK
        read_left = w_rd != w_end
        map_read = self.map_read
        granted = map_read.req & map_read.grant
        walk_done = walking & ~read_left & ~w_pend
        m.d.comb += [
            map_read.req.eq(walking & read_left),
            map_read.addr.eq(Cat(w_rd[:slot_bits], w_qpn)),
            free_push.eq(walking & w_pend), free_chunk.eq(map_read.data),
            # The segmenter sends nothing of a QP whose last chunk is being returned, until
            # the new pool_lo is written: whether its next PSN needs a chunk depends on it.
            # In LOAD the hold comes from registers, not from the table read's compare: a
            # QP_WRITE's job holds the QP; a release's holds the PSN equal to its una (the
            # last chunk goes back when that is the QP's next PSN, the PSN the segmenter
            # would send).
            alloc.hold.eq(((w_state == W_LOAD) & w_reset)
                          | ((walking | lo_write.en) & w_tail)),
            alloc.hold_at.eq((w_state == W_LOAD) & ~w_reset),
            alloc.hold_psn.eq(w_una),
            alloc.hold_qpn.eq(w_qpn),
        ]
        # pool_lo is written the cycle after the decision (or the walk's last return), from
        # registers, so the tables' readers that track the write (the intake, the hand-off
        # register, the segmenter) start from flip-flops, not from this job's compares.
        m.d.sync += [lo_write.addr.eq(w_qpn), lo_write.data.eq(w_new_lo),
                     lo_write.en.eq(((w_state == W_LOAD) & ~load_walk) | walk_done)]
        m.d.sync += w_pend.eq(granted)
        with m.If(granted):
            m.d.sync += w_rd.eq(w_rd + 1)
        with m.If(w_state == W_LOAD):
            m.d.sync += [w_rd.eq(lo[cb:]), w_end.eq(end), w_tail.eq(w_reset | load_tail),
                         w_state.eq(Mux(load_walk, W_WALK, W_IDLE))]
        with m.If(walk_done):
            m.d.sync += w_state.eq(W_IDLE)

        if self._observe:
            obs = self.obs
            m.d.comb += [obs.fresh.eq(fresh), obs.free_rd.eq(free_rd), obs.free_wr.eq(free_wr),
                         obs.free_count.eq(free_count), obs.walk.eq(w_state == W_WALK),
                         obs.qpn.eq(w_qpn), obs.cur.eq(w_rd), obs.end.eq(w_end)]
            for index in range(chunks):
                port = free_list.read_port(domain="comb")
                m.d.comb += [port.addr.eq(index), obs.free_entries[index].eq(port.data)]
        return m
