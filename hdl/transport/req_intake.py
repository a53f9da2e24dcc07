"""The requester's new-packet path: the WR intake (:class:`WrIntake`) checks a WR and claims
its WR slot and WR pool entry, the segmenter (:class:`Segmenter`) cuts it into packets."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory, WritePort
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..interfaces import work_request_layout
from ..util import validating
from .req_common import (
    PSN,
    WIMM_BITS,
    ControlSignature,
    check_config,
    check_observe,
    data_opcode,
    events_layout,
    log2,
    psn_sub,
)
from .req_defs import (
    ACKREQ_EVERY_BITS,
    CWND_BITS,
    MAX_WR_PACKETS,
    MSN_BITS,
    PSN_CHUNK,
    chunk_map_slots,
    pool_entries,
    pool_index_bits,
    psn_chunk_bits,
    segmenter_contexts,
    slot_depth,
)
from .req_psnpool import chunk_alloc_signature
from .req_send import send_item_layout
from .req_tables import (
    TABLE_ACCESS,
    requester_tables,
    table_access_signature,
    table_writes_signature,
    with_write,
)
from .req_timer import arm_layout

__all__ = ["INTAKE_READS", "segment_job_layout", "context_state_layout",
           "intake_observation_layout",
           "segment_check_layout", "segmenter_observation_layout", "segmenter_members",
           "WrIntake", "Segmenter"]

#: The tables the intake reads, each for the WR it checks.
INTAKE_READS = TABLE_ACCESS["intake"][0]


def segment_job_layout(config):
    """An accepted WR for the segmenter: its QP, first PSN, end PSN (the QP's next PSN once
    the WR is sent), WR pool entry (``slot``) and ring position (``pos``), length,
    addresses, immediate data, METH numbers, and the QP's MPR, una, ``tail_chunk``
    (``chunk``), ``pool_lo`` (``lo``), ECN window (``cwnd``) and NSCC window
    (``nscc_window``) entries when it was checked, and whether the QP has failed since
    (``error``: the intake hands over none, a register between it and the segmenters may
    see the failure)."""
    return data.StructLayout({
        "qpn": config.qpn_bits, "psn": PSN, "end": PSN, "slot": pool_index_bits(config),
        "pos": log2(slot_depth(config)), "length": 32,
        "va": 64, "local": 64, "rkey": 32, "imm": 32, "is_imm": 1, "msn": MSN_BITS,
        "rqmsn": MSN_BITS, "mpr": 4, "una": PSN,
        "chunk": psn_chunk_bits(config), "lo": PSN,
        "cwnd": CWND_BITS, "nscc_window": CWND_BITS, "error": 1,
    })


def context_state_layout(config):
    """What each of several segmenter contexts tells the WR intake: it holds a WR
    (``busy``) of this QP, whose end PSN is ``end`` (the QP's next PSN once the WR is
    sent)."""
    return data.StructLayout({"busy": 1, "qpn": config.qpn_bits, "end": PSN})


def intake_observation_layout(config):
    """What ``WrIntake(observe=True)`` shows on ``obs``: its forwarding register (the QP and
    end PSN of the WR last handed to the segmenter), the WR in S1 (``s1_valid``, ``s1_qpn``)
    and the entries of its QP it decides on (``s1_cfg``, ``s1_sq``, ``s1_ack``, ``s1_cq``,
    ``s1_next_psn``: the table's, before the forwarding register), the WR pool entry it
    takes this cycle (``alloc``: a WR is accepted; ``alloc_entry``: its entry), and the free
    list: the entries never handed out (``fresh`` and up), the FIFO's storage
    (``free_entries``, an asynchronous read), its oldest position (``free_rd``) and entry
    (``free_head``), its next write position (``free_wr``) and its fill (``free_count``)."""
    pool = pool_entries(config)
    tables = requester_tables(config)
    return data.StructLayout({"fwd_valid": 1, "fwd_qpn": config.qpn_bits, "fwd_end": PSN,
                              "s1_valid": 1, "s1_qpn": config.qpn_bits,
                              **{f"s1_{name}": tables[name][0]
                                 for name in ("cfg", "sq", "ack", "cq", "next_psn")},
                              "alloc": 1, "alloc_entry": pool_index_bits(config),
                              "fresh": range(pool + 1),
                              "free_entries": data.ArrayLayout(pool_index_bits(config), pool),
                              "free_rd": range(pool), "free_head": pool_index_bits(config),
                              "free_wr": range(pool), "free_count": range(pool + 1)})


def segment_check_layout():
    """The segmenter's checks of a packet, made the cycle before it is offered (from the
    registered PSN and the QP's tracked entries) and registered: inside the MPR window
    (``window_ok``), inside the ECN and the NSCC windows (``ecn_ok``, ``nscc_ok``: false for
    the WR's first packet, whose windows are not read yet), the packet fills the MPR, the ECN
    or the NSCC window (``closes_*``), it is the QP's oldest outstanding PSN (``at_una``),
    the QP failed (``error``), it needs a new PSN pool chunk (``need_chunk``) and the QP's
    chunks would stay within the chunk map's span (``span_ok``)."""
    return data.StructLayout({"window_ok": 1, "ecn_ok": 1, "nscc_ok": 1, "closes_mpr": 1,
                              "closes_ecn": 1, "closes_nscc": 1, "at_una": 1, "error": 1,
                              "need_chunk": 1, "span_ok": 1})


def segmenter_observation_layout(config):
    """What ``Segmenter(observe=True)`` shows on ``obs``: the WR it holds (QP, next PSN, WR
    pool entry, ring position, bytes left and whether they fit one packet, the MPR it came
    with), the una its window check uses this cycle, whether that is the tracked ``ack``
    entry (``fresh``), the tracked ``ack`` entry's una and error flag (``una_seen``,
    ``error_seen``), this cycle's registered checks (``check``) and whether a packet is
    taken (``emit``)."""
    return data.StructLayout({"active": 1, "qpn": config.qpn_bits, "psn": PSN,
                              "slot": pool_index_bits(config), "pos": log2(slot_depth(config)),
                              "remaining": 32, "last": 1, "mpr": 4,
                              "una": PSN, "fresh": 1, "una_seen": PSN, "error_seen": 1,
                              "check": segment_check_layout(), "emit": 1})


def segmenter_members(config):
    """The ports of a segmenter, as :class:`Segmenter` and
    :class:`~.req_segbank.SegmenterBank` both have them (see :class:`Segmenter`)."""
    tables = requester_tables(config)

    def tracked(name):
        return In(WritePort.Signature(addr_width=config.qpn_bits, shape=tables[name][0]))

    return {
        "tables": In(table_access_signature(config, "segmenter")),
        "control": In(ControlSignature(config)),
        "now": In(32),
        "i": In(stream.Signature(segment_job_layout(config))),
        "o": Out(stream.Signature(send_item_layout(config))),
        "alloc": In(chunk_alloc_signature(config)),
        "ack_write": tracked("ack"),
        "cc_write": tracked("cc"),
        "nscc_write": tracked("nscc_window"),
        "pool_lo_write": tracked("pool_lo"),
        "arm": Out(stream.Signature(arm_layout(config))),
        "events": Out(events_layout(Segmenter.COUNTERS)),
    }


class WrIntake(wiring.Component):
    """Take work requests, refuse the bad ones, claim a WR slot and a WR pool entry for
    each (S1).

    A WR taken is checked the next cycle against its QP's tables: refused (an error
    completion through the WR ring, so completions stay in order: WR_FLUSH_ERR for a QP in
    ERROR, LOC_QP_OP_ERR for a bad opcode or a QP not in RTS, LOC_LEN_ERR for a WR over
    ``MAX_WR_PACKETS`` packets), or handed to the segmenter. Either way it waits for a free
    WR slot of its QP (``wr_slots``) and a free entry of the shared WR pool
    (:func:`~.req_defs.pool_entries`: ``wr_pool``;
    the first cycle a WR finds the pool empty counts ``wr_pool_waits``), and a refused one
    for room in the completion engine's queue, a WRITE WITH IMMEDIATE for the QP's
    ``max_wimm``, a sent one for the segmenter. Accepting writes the pool entry
    (``wr_done``, ``wr_send``), appends it to the QP's ring (``wr_ring`` at ``sq.tail``) and
    advances ``sq``. One WR per cycle when nothing waits.

    The free list: entries never used are handed out first, in index order (a counter, so a
    reset needs no table initialised); the completion engine returns each entry as it
    completes the WR (``free``) into a FIFO as deep as the pool, from which the intake
    takes once the counter is spent (one block RAM, its registered read, transparent for
    the write, fetching the entry after the oldest, and the oldest in a head register, so it
    is ready whenever the FIFO is not empty and taking it steers no read address). An entry
    is in at most one place (the counter's range, the FIFO, a QP's ring;
    ``hdl/formal/requester_invariants.py`` proves it), so ``free`` always finds room. A QP's
    WRs all complete (flushed, after an error) before the control may reset it, so a reset
    frees nothing by itself.

    Hazards: the QP the segmenter works on (or last worked on) has not written its final
    next PSN yet: the intake keeps the end PSN of the last WR it handed over and takes it
    from there (a QP_WRITE of that QP clears it). With several segmenter contexts
    (:class:`~.req_segbank.SegmenterBank`), a QP's last WR may be in a context while WRs of
    other QPs were handed over since, or in the older entry of the bank's hand-off register:
    each context and that entry tell their QP and WR's end PSN (``contexts``, ``handoff``),
    and the intake takes the QP's next PSN from there (the hand-off's first).
    Every other table read is transparent. The tables are read for the WR on ``wr`` whether
    or not S1 takes it, so S1's stall steers no read address: a WR that waits captures its
    QP's entries each cycle, with the tables' writes of the cycle (``writes``), as the
    transparent read would give them. Nothing is taken or accepted while the control
    holds; a QP_WRITE resets ``sq`` (``control.write``).

    Members
    -------
    tables : ``In(table_access_signature(config, "intake"))``
    writes : ``In(table_writes_signature(config, INTAKE_READS))``
        The write ports of the tables the intake reads (their owners'), for the entries of
        a WR that waits.
    control : ``In(ControlSignature(config))``
    wr : ``In(stream.Signature(work_request_layout(config)))``
    free : ``In(stream.Signature(pool_index_bits(config)))``
        WR pool entries the completion engine is done with. Always ready.
    pool_free : ``Out(range(pool_entries(config) + 1))``
        Free WR pool entries (not counting one arriving on ``free`` this cycle).
    o : ``Out(stream.Signature(segment_job_layout(config)))``
        WRs to send, to the segmenter.
    wr_trigger : ``Out(stream.Signature(config.qpn_bits))``
        The QP of a refused WR, for the completion engine.
    contexts : ``In(data.ArrayLayout(context_state_layout(config), contexts))``
        Only with several segmenter contexts (:func:`~.req_defs.segmenter_contexts`): the
        WR each holds.
    handoff : ``In(context_state_layout(config))``
        Only with several segmenter contexts: the WR in the older entry of the bank's
        hand-off register.
    events : ``Out(events_layout(COUNTERS))``
    obs : ``Out(intake_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.
    """

    COUNTERS = ("wrs", "wr_refused", "wr_pool_waits")

    def __init__(self, *, config, observe=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
        self._config = config
        self._observe = observe
        super().__init__({
            "tables": In(table_access_signature(config, "intake")),
            "writes": In(table_writes_signature(config, INTAKE_READS)),
            "control": In(ControlSignature(config)),
            "wr": In(stream.Signature(work_request_layout(config))),
            "free": In(stream.Signature(pool_index_bits(config))),
            "pool_free": Out(range(pool_entries(config) + 1)),
            "o": Out(stream.Signature(segment_job_layout(config))),
            "wr_trigger": Out(stream.Signature(config.qpn_bits)),
            **({"contexts": In(data.ArrayLayout(context_state_layout(config),
                                                segmenter_contexts(config))),
                "handoff": In(context_state_layout(config))}
               if segmenter_contexts(config) > 1 else {}),
            "events": Out(events_layout(self.COUNTERS)),
            **({"obs": Out(intake_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        sb = log2(slot_depth(cfg))
        mtu_bits = log2(cfg.mtu)
        ctl = self.control
        hold = ctl.hold
        reads, wps = self.tables.read, self.tables.write

        s1_valid = Signal()
        s1 = Signal(work_request_layout(cfg))
        s1_take = Signal()
        s1_accept = Signal()
        # The tables are read for the WR on `wr`, whether or not S1 takes it: S1's stall
        # (which waits on the segmenter) steers no read address. A WR that waits in S1
        # captures its QP's entries every cycle it waits, with the write of the cycle taken
        # from the table's write port (`writes`), and from its second cycle on decides on
        # them: what the transparent read, addressed last cycle, would give.
        s1_held = Signal()              # S1's WR waited last cycle
        m.d.sync += s1_held.eq(s1_valid & ~s1_accept)
        s1_entries = {}
        for name in INTAKE_READS:
            port, written = getattr(reads, name), getattr(self.writes, name)
            captured = Signal.like(port.data, name=f"s1_{name}_held")
            entry = Signal.like(port.data, name=f"s1_{name}")
            m.d.comb += [port.addr.eq(self.wr.payload.qpn),
                         entry.eq(Mux(s1_held, captured, port.data))]
            m.d.sync += captured.eq(with_write(written, s1.qpn, entry))
            s1_entries[name] = entry
        s1_cfg, s1_sq, s1_ack, s1_cq = (s1_entries[n] for n in ("cfg", "sq", "ack", "cq"))

        # The WR last handed to the segmenter: its QP's next PSN is its end PSN.
        fwd_valid = Signal()
        fwd_qpn = Signal(qb)
        fwd_end = Signal(PSN)
        # With several segmenter contexts the QP's last WR may be in the hand-off register's
        # older entry or in a context (handed over before the last one): its end PSN (the
        # hand-off's is the newer; one context at most holds the QP).
        s1_next_psn_table = s1_entries["next_psn"]
        if segmenter_contexts(cfg) > 1:
            held = Cat(c.busy & (c.qpn == s1.qpn) for c in self.contexts)
            held_end = 0
            for index, c in enumerate(self.contexts):
                held_end = held_end | Mux(held[index], c.end, 0)
            s1_next_psn_table = Mux(held.any(), held_end, s1_next_psn_table)
            h = self.handoff
            s1_next_psn_table = Mux(h.busy & (h.qpn == s1.qpn), h.end, s1_next_psn_table)
        s1_next_psn = Mux(fwd_valid & (fwd_qpn == s1.qpn), fwd_end, s1_next_psn_table)

        s1_state = Mux(s1_ack.error, P.QpState.ERROR, s1_cfg.state)
        s1_op_ok = ((s1.opcode == P.WrOpcode.RDMA_WRITE)
                    | (s1.opcode == P.WrOpcode.RDMA_WRITE_WITH_IMM))
        s1_is_imm = s1.opcode == P.WrOpcode.RDMA_WRITE_WITH_IMM
        max_length = MAX_WR_PACKETS << mtu_bits
        s1_too_long = (s1.length > max_length) if max_length < (1 << 32) else C(0)
        s1_refused_status = Signal(P.CompletionStatus)
        s1_refused = Value.cast(s1_refused_status)
        with m.If(s1_state == P.QpState.ERROR):
            m.d.comb += s1_refused_status.eq(P.CompletionStatus.WR_FLUSH_ERR)
        with m.Elif(~s1_op_ok | (s1_state != P.QpState.RTS)):
            m.d.comb += s1_refused_status.eq(P.CompletionStatus.LOC_QP_OP_ERR)
        with m.Elif(s1_too_long):
            m.d.comb += s1_refused_status.eq(P.CompletionStatus.LOC_LEN_ERR)
        s1_packets = Mux(s1.length == 0, 1, ((s1.length - 1) >> mtu_bits) + 1)
        s1_slots_used = (s1_sq.tail - s1_cq.head)[:sb + 1]
        s1_wimm_used = (s1_sq.wimm - s1_cq.wimm)[:WIMM_BITS]
        s1_wimm_ok = ~s1_is_imm | (s1_wimm_used < s1_cfg.max_wimm)

        # The WR pool's free list: entries `fresh` and up were never handed out; the others
        # come back through `free` into the FIFO.
        pool = pool_entries(cfg)
        pool_fresh = Signal(range(pool + 1))
        # The FIFO: block RAM with a registered read of the entry after the oldest
        # (transparent for the write), and the oldest in a register (`free_head`, valid
        # whenever `free_count` is not 0): the read lands there the cycle after one is
        # taken, and an entry written into an empty FIFO goes there too. Taking an entry
        # steers no read address.
        m.submodules.free_list = free_list = Memory(shape=pool_index_bits(cfg), depth=pool,
                                                    init=[])
        free_write = free_list.write_port()
        free_read = free_list.read_port(transparent_for=(free_write,))
        free_rd = Signal(range(pool))
        free_wr = Signal(range(pool))
        free_count = Signal(range(pool + 1))
        free_pop = Signal()

        def free_next(position):
            return Mux(position == pool - 1, 0, position + 1)

        m.d.comb += [
            free_write.addr.eq(free_wr), free_write.data.eq(self.free.payload),
            free_write.en.eq(self.free.valid & self.free.ready),
            free_read.addr.eq(free_next(free_rd)),
            self.free.ready.eq(free_count != pool),
            self.pool_free.eq(pool - pool_fresh + free_count),
        ]
        with m.If(free_write.en):
            m.d.sync += free_wr.eq(free_next(free_wr))
        with m.If(free_pop):
            m.d.sync += free_rd.eq(free_next(free_rd))
        m.d.sync += free_count.eq(free_count + free_write.en - free_pop)
        free_popped = Signal()          # an entry was taken last cycle: the read is the oldest
        free_held = Signal(pool_index_bits(cfg))
        free_head = Signal(pool_index_bits(cfg))
        m.d.comb += free_head.eq(Mux(free_popped, free_read.data, free_held))
        m.d.sync += [free_popped.eq(free_pop),
                     free_held.eq(Mux(free_write.en & (free_wr == free_rd), self.free.payload,
                                      free_head))]
        s1_fresh = pool_fresh != pool
        s1_pool_ok = s1_fresh | (free_count != 0)
        s1_entry = Mux(s1_fresh, pool_fresh, free_head)[:pool_index_bits(cfg)]
        s1_slot_free = (s1_slots_used < cfg.wr_slots) & s1_pool_ok
        s1_pool_waited = Signal()       # this WR has counted its wait for the pool
        m.d.comb += [
            self.wr_trigger.valid.eq(s1_valid & (s1_refused != 0) & s1_slot_free & ~hold),
            self.wr_trigger.payload.eq(s1.qpn),
            self.o.valid.eq(s1_valid & (s1_refused == 0) & s1_slot_free & s1_wimm_ok & ~hold),
            self.events.wr_pool_waits.eq(s1_valid & ~s1_pool_ok & ~s1_pool_waited),
        ]
        s1_accept_refused = self.wr_trigger.valid & self.wr_trigger.ready
        s1_accept_send = self.o.valid & self.o.ready
        m.d.comb += [
            s1_accept.eq(s1_accept_refused | s1_accept_send),
            self.wr.ready.eq((~s1_valid | s1_accept) & ~hold),
            s1_take.eq(self.wr.valid & self.wr.ready),
            self.events.wrs.eq(s1_take),
            self.events.wr_refused.eq(s1_accept & (s1_refused != 0)),
        ]
        with m.If(s1_take):
            m.d.sync += [s1_valid.eq(1), s1.eq(self.wr.payload), s1_pool_waited.eq(0)]
        with m.Elif(s1_accept):
            m.d.sync += s1_valid.eq(0)
        with m.Elif(self.events.wr_pool_waits):
            m.d.sync += s1_pool_waited.eq(1)
        with m.If(s1_accept):
            with m.If(s1_fresh):
                m.d.sync += pool_fresh.eq(pool_fresh + 1)
            with m.Else():
                m.d.comb += free_pop.eq(1)

        s1_end = (s1_next_psn + Mux(s1_refused != 0, 0, s1_packets))[:PSN]
        m.d.comb += [
            wps.wr_ring.addr.eq(Cat(s1_sq.tail[:sb], s1.qpn)),
            wps.wr_ring.en.eq(s1_accept),
            wps.wr_ring.data.eq(s1_entry),
            wps.wr_done.addr.eq(s1_entry),
            wps.wr_done.en.eq(s1_accept),
            wps.wr_done.data.wr_id.eq(s1.wr_id),
            wps.wr_done.data.end.eq(s1_end),
            wps.wr_done.data.length.eq(s1.length),
            wps.wr_done.data.is_imm.eq(s1_is_imm & (s1_refused == 0)),
            wps.wr_done.data.refused.eq(s1_refused_status),
            wps.wr_send.addr.eq(s1_entry),
            wps.wr_send.en.eq(s1_accept & (s1_refused == 0)),
            wps.wr_send.data.va.eq(s1.remote_addr),
            wps.wr_send.data.local.eq(s1.local_addr),
            wps.wr_send.data.rkey.eq(s1.rkey),
            wps.wr_send.data.imm.eq(s1.imm),
            wps.wr_send.data.first.eq(s1_next_psn),
            wps.wr_send.data.length.eq(s1.length),
            wps.wr_send.data.is_imm.eq(s1_is_imm),
            wps.wr_send.data.msn.eq(s1_sq.msgs),
            wps.wr_send.data.rqmsn.eq(s1_sq.imm_msgs),
        ]
        with m.If(ctl.write):
            m.d.comb += [wps.sq.addr.eq(ctl.qpn), wps.sq.en.eq(1), wps.sq.data.eq(0)]
        with m.Else():
            m.d.comb += [
                wps.sq.addr.eq(s1.qpn),
                wps.sq.en.eq(s1_accept),
                wps.sq.data.tail.eq(s1_sq.tail + 1),
                wps.sq.data.wimm.eq(s1_sq.wimm + (s1_is_imm & (s1_refused == 0))),
                wps.sq.data.msgs.eq(s1_sq.msgs + (s1_refused == 0)),
                wps.sq.data.imm_msgs.eq(s1_sq.imm_msgs + (s1_is_imm & (s1_refused == 0))),
            ]

        job = self.o.payload
        m.d.comb += [
            job.qpn.eq(s1.qpn), job.psn.eq(s1_next_psn), job.end.eq(s1_end),
            job.slot.eq(s1_entry),
            job.pos.eq(s1_sq.tail[:sb]),
            job.length.eq(s1.length), job.va.eq(s1.remote_addr), job.local.eq(s1.local_addr),
            job.rkey.eq(s1.rkey), job.imm.eq(s1.imm), job.is_imm.eq(s1_is_imm),
            job.msn.eq(s1_sq.msgs), job.rqmsn.eq(s1_sq.imm_msgs), job.mpr.eq(s1_cfg.mpr),
            job.una.eq(s1_ack.una), job.chunk.eq(s1_entries["tail_chunk"]),
            job.lo.eq(s1_entries["pool_lo"]), job.cwnd.eq(s1_entries["cc"].cwnd),
            job.nscc_window.eq(s1_entries["nscc_window"]),
        ]
        with m.If(s1_accept_send):
            m.d.sync += [fwd_valid.eq(1), fwd_qpn.eq(s1.qpn), fwd_end.eq(s1_end)]
        with m.If(ctl.write & (fwd_qpn == ctl.qpn)):
            m.d.sync += fwd_valid.eq(0)
        if self._observe:
            m.d.comb += [self.obs.fwd_valid.eq(fwd_valid), self.obs.fwd_qpn.eq(fwd_qpn),
                         self.obs.fwd_end.eq(fwd_end), self.obs.alloc.eq(s1_accept),
                         self.obs.alloc_entry.eq(s1_entry), self.obs.fresh.eq(pool_fresh),
                         self.obs.free_rd.eq(free_rd), self.obs.free_head.eq(free_head),
                         self.obs.free_wr.eq(free_wr),
                         self.obs.s1_valid.eq(s1_valid), self.obs.s1_qpn.eq(s1.qpn),
                         *[self.obs[f"s1_{name}"].eq(s1_entries[name])
                           for name in ("cfg", "sq", "ack", "cq", "next_psn")],
                         self.obs.free_count.eq(free_count)]
            for index in range(pool):
                port = free_list.read_port(domain="comb")
                m.d.comb += [port.addr.eq(index), self.obs.free_entries[index].eq(port.data)]
        return m


class Segmenter(wiring.Component):
    """Cut a WR into MTU packets, one per cycle (S2).

    Each packet is checked against the QP's window (``psn - una < mpr x 128``) and, with
    CONFIG ``cc``, its congestion window (``psn - una < cwnd``: the ECN window, or NSCC's
    with CONFIG ``cc_nscc``); it asks for an ACK when it is the
    WR's last, fills a window, or is the ``ackreq_every``-th. A packet taken by the send
    register advances ``next_psn``; one that is the QP's oldest outstanding PSN arms the
    retransmit timer (``arm``; dropped and counted when the queue is full). The segmenter
    takes the next WR in the cycle it offers the current one's last packet, so back-to-back
    WRs leave back to back.

    Each packet's per-PSN state is in a chunk of the shared PSN pool
    (:class:`~.req_psnpool.PsnPool`): the QP holds the chunks of its PSNs from its
    ``pool_lo`` up to its next PSN. A packet that starts a chunk, or finds the QP holding
    none (``pool_lo`` is its PSN: nothing in flight), takes a free chunk (``alloc``) and
    writes it into the QP's chunk map and ``tail_chunk``; the others use the chunk of the
    PSN before. A packet that needs a chunk waits while none is free, or while the QP's
    chunks would span more than :func:`~.req_defs.chunk_map_slots` chunk numbers from its
    ``pool_lo`` (its chunks below una are not back in the pool yet); the first cycle of
    each such wait counts ``psn_pool_waits``. No packet of a QP goes while the PSN pool
    returns its last chunk (``alloc.hold``), nor the PSN whose chunk a release's decision
    may return (``alloc.hold_at``). The chunk goes to the send register with the
    packet (``chunk``).

    Timing: the checks (:func:`segment_check_layout`) are made a cycle ahead and
    registered, for both PSNs the next cycle may offer (this one again, or the next after
    it is taken) and for a WR taken this cycle, and picked by registered selects, so the
    packet's ``valid`` starts at registers, no table's data runs into it and the packet
    taken ends at flip-flops. The segmenter reads no table: the QP's
    ``ack`` (una, error), ``cc`` (ECN window), ``nscc_window`` and ``pool_lo`` entries come
    with the WR and are kept up to date from their owners' write ports (``ack_write``,
    ``cc_write``, ``nscc_write``, ``pool_lo_write``): the tracked entries are what a
    transparent read of the last cycle would give.

    Hazards: una and the error flag come with the WR, with the write of the cycle the WR is
    taken; the ECN and NSCC windows count from the second cycle (with CONFIG ``cc`` the
    first cycle sends nothing). ACK processing writes a QP's una and ECN window in the same
    cycle, from registers (its A3), so each cycle's checks pair entries of one time.
    ``pool_lo`` comes with the WR, with the PSN pool's write of the cycle the WR is taken;
    a later write in that first cycle only moves it towards una (the PSN pool holds the QP
    while a write changes whether it holds any chunk), so the span check errs on the side of
    waiting. The QP's ``tail_chunk`` comes with the WR too, but a WR of the QP the segmenter
    last worked on takes the chunk from the segmenter's own register (its last write may not
    be in yet; a QP_WRITE of that QP clears it). A QP that fails (``ack.error``) sends
    nothing from the cycle its failure is written (that cycle by a compare with the write
    port's registers, then by the checks) and stops the WR the cycle after. Nothing is offered while
    the control holds; a QP_WRITE resets ``next_psn`` (``control.write``).

    Members
    -------
    tables : ``In(table_access_signature(config, "segmenter"))``
    control : ``In(ControlSignature(config))``
    now : ``In(32)``
        The time in 1.024 us units (the arm event's time).
    i : ``In(stream.Signature(segment_job_layout(config)))``
    o : ``Out(stream.Signature(send_item_layout(config)))``
        New packets, to the send register.
    alloc : ``In(chunk_alloc_signature(config))``
        The PSN pool's free list (:class:`~.req_psnpool.PsnPool`).
    ack_write, cc_write, nscc_write, pool_lo_write : ``In(WritePort.Signature(...))``
        The write ports of the ``ack``, ``cc``, ``nscc_window`` and ``pool_lo`` tables (ACK
        processing's, the NSCC engine's, the PSN pool's), tracked into the WR's entries.
    arm : ``Out(stream.Signature(arm_layout(config)))``
    events : ``Out(events_layout(COUNTERS))``
    busy, qpn, end : ``Out(1)``, ``Out(config.qpn_bits)``, ``Out(PSN)``
        Only with ``shared=True`` (a context of :class:`~.req_segbank.SegmenterBank`): a WR
        is held, its QP and its end PSN.
    continues : ``In(1)``
        Only with ``shared=True``: the WR taken continues the QP of the one held, so the
        context keeps its own chunk register.
    obs : ``Out(segmenter_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.
    """

    COUNTERS = ("arm_dropped", "psn_pool_waits")

    def __init__(self, *, config, observe=False, shared=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
        self._config = config
        self._observe = observe
        self._shared = bool(shared)
        super().__init__({
            **segmenter_members(config),
            **({"busy": Out(1), "qpn": Out(config.qpn_bits), "end": Out(PSN),
                "continues": In(1)}
               if shared else {}),
            **({"obs": Out(segmenter_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        sb = log2(slot_depth(cfg))
        pb = pool_index_bits(cfg)
        ctl = self.control
        ackreq_every, cc_on = ctl.ackreq_every, ctl.cc_on
        job = self.i.payload
        take = Signal()                 # a WR is taken this cycle
        emit = Signal()                 # a packet is taken this cycle

        s2_active = Signal()
        s2_qpn = Signal(qb)
        s2_psn = Signal(PSN)
        s2_slot = Signal(pb)
        s2_pos = Signal(sb)
        s2_remaining = Signal(32)
        s2_last = Signal()              # s2_remaining <= MTU
        s2_va = Signal(64)
        s2_local = Signal(64)
        s2_rkey = Signal(32)
        s2_imm = Signal(32)
        s2_is_imm = Signal()
        s2_msn = Signal(MSN_BITS)
        s2_rqmsn = Signal(MSN_BITS)
        s2_first = Signal()
        s2_mpr = Signal(4)
        s2_una = Signal(PSN)            # una at hand-off: the first cycle's check
        s2_fresh = Signal()             # from the WR's second cycle: the tracked entries
        s2_ackcnt = Signal(ACKREQ_EVERY_BITS)
        s2_check = Signal(segment_check_layout())

        # -- the QP's entries, tracked from their owners' write ports ---------------------
        # Each holds what the table's transparent read, addressed last cycle, would give
        # now: the intake's read at hand-off with the write of that cycle, then every write
        # to the QP.
        una_seen = Signal(PSN)
        error_seen = Signal()
        ecn_seen = Signal(CWND_BITS)
        nscc_seen = Signal(CWND_BITS)
        lo_seen = Signal(PSN)

        ack_w, cc_w, nscc_w, lo_w = (self.ack_write, self.cc_write, self.nscc_write,
                                     self.pool_lo_write)
        # Next cycle's entries: the WR's (taken now) or the QP's with this cycle's write.
        una_next = with_write(ack_w, s2_qpn, una_seen, "una")
        error_next = with_write(ack_w, s2_qpn, error_seen, "error")
        ecn_next = with_write(cc_w, s2_qpn, ecn_seen, "cwnd")
        nscc_next = with_write(nscc_w, s2_qpn, nscc_seen)
        lo_next = with_write(lo_w, s2_qpn, lo_seen)
        # The intake hands over no WR of a QP in ERROR (a register between may have seen it
        # fail, ``job.error``); else only this cycle's write can fail it.
        job_lo = with_write(lo_w, job.qpn, job.lo)
        # ACK processing writes the ack entry from a register: the WR's una and error flag
        # with this cycle's write are at hand for the first cycle's checks.
        job_una = with_write(ack_w, job.qpn, job.una, "una")
        job_error = with_write(ack_w, job.qpn, job.error, "error")
        m.d.sync += [
            una_seen.eq(Mux(take, job_una, una_next)),
            error_seen.eq(Mux(take, job_error, error_next)),
            ecn_seen.eq(Mux(take, with_write(cc_w, job.qpn, job.cwnd, "cwnd"), ecn_next)),
            nscc_seen.eq(Mux(take, with_write(nscc_w, job.qpn, job.nscc_window), nscc_next)),
            lo_seen.eq(Mux(take, job_lo, lo_next)),
        ]

        # -- the checks, a cycle ahead ----------------------------------------------------
        cb = log2(PSN_CHUNK)
        slots = chunk_map_slots(cfg)

        def checks(psn, una, mpr, ecn, nscc, lo, *, windows, error):
            """The checks of PSN ``psn`` against these entries (``windows``: the ECN and
            NSCC windows count)."""
            ahead = psn_sub(psn, una)
            limit = Cat(C(0, 7), mpr)
            check = Signal(segment_check_layout())
            m.d.comb += [
                check.window_ok.eq(ahead < limit),
                check.ecn_ok.eq(windows & (ahead < ecn)),
                check.nscc_ok.eq(windows & (ahead < nscc)),
                check.closes_mpr.eq((ahead + 1) >= limit),
                check.closes_ecn.eq((ahead + 1) >= ecn),
                check.closes_nscc.eq((ahead + 1) >= nscc),
                check.at_una.eq(ahead == 0),
                check.error.eq(error),
                check.need_chunk.eq((psn[:cb] == 0) | (lo == psn)),
                check.span_ok.eq((psn[cb:] - lo[cb:])[:PSN - cb] < slots),
            ]
            return check

        # The next cycle offers this PSN again, the one after it (this one taken), or a new
        # WR's first (its una as the intake read it; its windows not counted yet).
        stay = checks(s2_psn, una_next, s2_mpr, ecn_next, nscc_next, lo_next,
                      windows=1, error=error_next)
        step = checks((s2_psn + 1)[:PSN], una_next, s2_mpr, ecn_next, nscc_next, lo_next,
                      windows=1, error=error_next)
        start = checks(job.psn, job_una, job.mpr, job.cwnd, job.nscc_window, job_lo,
                       windows=0, error=job_error)
        # All three are registered; the choice among them is registered too, so this cycle's
        # packet taken (late in the cycle) ends at a flip-flop, not at the checks' registers.
        checks_made = {name: Signal(segment_check_layout(), name=f"s2_check_{name}")
                       for name in ("start", "step", "stay")}
        s2_took, s2_emitted = Signal(), Signal()
        m.d.sync += [checks_made["start"].eq(start), checks_made["step"].eq(step),
                     checks_made["stay"].eq(stay), s2_took.eq(take), s2_emitted.eq(emit)]
        m.d.comb += s2_check.eq(Mux(s2_took, checks_made["start"],
                                    Mux(s2_emitted, checks_made["step"], checks_made["stay"])))

        # -- this cycle's packet ----------------------------------------------------------
        check = s2_check
        s2_abort = s2_active & check.error
        s2_cc_ok = ~cc_on | Mux(ctl.cc_nscc, check.nscc_ok, check.ecn_ok)
        # This packet fills the QP's window (MPR, or the ECN window when on): it asks for an
        # ACK, so a window-limited QP never waits for the responder's coalescing timer.
        s2_closes = check.closes_mpr | (cc_on & Mux(ctl.cc_nscc, check.closes_nscc,
                                                    check.closes_ecn))
        s2_dma_len = Mux(s2_last, s2_remaining, cfg.mtu)
        s2_ackreq = (s2_last | s2_closes
                     | ((ackreq_every != 0) & (s2_ackcnt == ackreq_every - 1)))
        # The PSN pool: the QP holds the chunks of its PSNs from pool_lo up to this one. This
        # packet takes a chunk when it starts one, or when the QP holds none (pool_lo is this
        # PSN), within the chunk map's span of pool_lo.
        alloc = self.alloc
        s2_chunk = Signal(psn_chunk_bits(cfg))  # the chunk of the QP's last PSN sent
        s2_seen = Signal()              # s2_chunk is the QP s2_qpn's
        s2_pool_waited = Signal()       # this packet has counted its wait for a chunk
        s2_need_chunk = check.need_chunk
        s2_chunk_ok = ~s2_need_chunk | (alloc.available & check.span_ok)
        s2_pool_hold = ((alloc.hold_qpn == s2_qpn)
                        & (alloc.hold | (alloc.hold_at & (alloc.hold_psn == s2_psn))))
        # The cycle a failure of the QP is written (a register in ACK processing, the cycle
        # after its decision), this cycle's checks could not see it: the packet waits.
        s2_ack_hold = (self.ack_write.en & (self.ack_write.addr == s2_qpn)
                       & self.ack_write.data.error)
        s2_go = (s2_active & ~s2_abort & check.window_ok & s2_cc_ok & ~ctl.hold
                 & ~s2_pool_hold & ~s2_ack_hold)
        m.d.comb += [
            self.o.valid.eq(s2_go & s2_chunk_ok),
            emit.eq(self.o.valid & self.o.ready),
            self.i.ready.eq(~s2_active | s2_abort | (emit & s2_last)),
            take.eq(self.i.valid & self.i.ready),
            self.events.psn_pool_waits.eq(s2_go & ~s2_chunk_ok & ~s2_pool_waited),
            alloc.take.eq(emit & s2_need_chunk),
        ]
        s2_cur_chunk = Mux(s2_need_chunk, alloc.chunk, s2_chunk)
        with m.If(emit):
            m.d.sync += [s2_chunk.eq(s2_cur_chunk), s2_pool_waited.eq(0)]
        with m.Elif(self.events.psn_pool_waits):
            m.d.sync += s2_pool_waited.eq(1)
        map_wp, tail_wp = self.tables.write.chunk_map, self.tables.write.tail_chunk
        m.d.comb += [map_wp.addr.eq(Cat(s2_psn[cb:cb + log2(slots)], s2_qpn)),
                     map_wp.data.eq(alloc.chunk), map_wp.en.eq(alloc.take),
                     tail_wp.addr.eq(s2_qpn), tail_wp.data.eq(alloc.chunk),
                     tail_wp.en.eq(alloc.take)]
        with m.If(ctl.write & (ctl.qpn == s2_qpn)):
            m.d.sync += s2_seen.eq(0)
        # s2_last for the next cycle: the bytes left after this packet (a packet that is not
        # the last takes an MTU), or the bytes left now.
        with m.If(emit):
            m.d.sync += [
                s2_psn.eq(s2_psn + 1),
                s2_va.eq(s2_va + s2_dma_len),
                s2_local.eq(s2_local + s2_dma_len),
                s2_remaining.eq(s2_remaining - s2_dma_len),
                s2_last.eq(s2_remaining <= 2 * cfg.mtu),
                s2_first.eq(0),
                s2_ackcnt.eq(Mux(s2_ackcnt == ackreq_every - 1, 0, s2_ackcnt + 1)),
            ]
            with m.If(s2_last):
                m.d.sync += s2_active.eq(0)
        with m.Else():
            m.d.sync += s2_last.eq(s2_remaining <= cfg.mtu)
        with m.If(s2_abort):
            m.d.sync += s2_active.eq(0)
        m.d.sync += s2_fresh.eq(1)
        with m.If(take):
            m.d.sync += [
                s2_active.eq(1), s2_qpn.eq(job.qpn), s2_psn.eq(job.psn),
                s2_slot.eq(job.slot), s2_pos.eq(job.pos), s2_remaining.eq(job.length),
                s2_last.eq(job.length <= cfg.mtu),
                s2_va.eq(job.va), s2_local.eq(job.local), s2_rkey.eq(job.rkey),
                s2_imm.eq(job.imm), s2_is_imm.eq(job.is_imm), s2_first.eq(1),
                s2_msn.eq(job.msn), s2_rqmsn.eq(job.rqmsn),
                s2_mpr.eq(job.mpr), s2_una.eq(job_una), s2_fresh.eq(0),
                s2_ackcnt.eq(0),
                s2_seen.eq(1), s2_pool_waited.eq(0),
            ]
            # The QP the segmenter last worked on: its own register, with this cycle's packet.
            # One of several contexts keeps it only for a WR that continues its QP (another
            # context may have worked on the QP since).
            own = self.continues if self._shared else s2_seen & (job.qpn == s2_qpn)
            with m.If(~own):
                m.d.sync += s2_chunk.eq(job.chunk)
        if self._shared:
            s2_end = Signal(PSN)
            with m.If(take):
                m.d.sync += s2_end.eq(job.end)
            m.d.comb += [self.busy.eq(s2_active), self.qpn.eq(s2_qpn), self.end.eq(s2_end)]

        wp = self.tables.write.next_psn
        with m.If(ctl.write):
            m.d.comb += [wp.addr.eq(ctl.qpn), wp.en.eq(1), wp.data.eq(ctl.psn)]
        with m.Else():
            m.d.comb += [wp.addr.eq(s2_qpn), wp.en.eq(emit), wp.data.eq(s2_psn + 1)]

        # The segmenter sent the oldest outstanding PSN: the timer starts at that exact time.
        m.d.comb += [
            self.arm.valid.eq(emit & check.at_una),
            self.arm.payload.qpn.eq(s2_qpn), self.arm.payload.time.eq(self.now),
            self.events.arm_dropped.eq(self.arm.valid & ~self.arm.ready),
        ]

        s2_imm_now = s2_is_imm & s2_last
        item = self.o.payload
        request, ctx = item.request, item.request.context
        m.d.comb += [
            item.slot.eq(s2_slot), item.chunk.eq(s2_cur_chunk), item.walk.eq(0),
            request.qpn.eq(s2_qpn), request.avoid_ev_valid.eq(0), request.avoid_ev.eq(0),
            request.probe.eq(0), request.ev.eq(0),
            ctx.psn.eq(s2_psn), ctx.opcode.eq(data_opcode(s2_first, s2_last, s2_imm_now)),
            ctx.ackreq.eq(s2_ackreq), ctx.va.eq(s2_va), ctx.rkey.eq(s2_rkey),
            ctx.dma_len.eq(s2_dma_len), ctx.imm.eq(Mux(s2_imm_now, s2_imm, 0)),
            ctx.local_addr.eq(s2_local), ctx.retransmission.eq(0),
            ctx.msn.eq(s2_msn), ctx.rqmsn.eq(s2_rqmsn),
        ]
        if self._observe:
            obs = self.obs
            m.d.comb += [obs.active.eq(s2_active), obs.qpn.eq(s2_qpn), obs.psn.eq(s2_psn),
                         obs.slot.eq(s2_slot), obs.pos.eq(s2_pos),
                         obs.remaining.eq(s2_remaining), obs.last.eq(s2_last),
                         obs.mpr.eq(s2_mpr),
                         obs.una.eq(Mux(s2_fresh, una_seen, s2_una)), obs.fresh.eq(s2_fresh),
                         obs.una_seen.eq(una_seen), obs.error_seen.eq(error_seen),
                         obs.check.eq(s2_check), obs.emit.eq(emit)]
        return m
