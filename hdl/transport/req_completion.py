"""The requester's completion engine (:class:`CompletionEngine`)."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import WritePort
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..interfaces import CompletionSide, completion_layout
from ..util import validating
from .req_common import (
    PSN,
    WIMM_BITS,
    ControlSignature,
    check_config,
    check_observe,
    events_layout,
    log2,
    psn_ge,
    psn_gt,
)
from .req_defs import pool_index_bits, slot_depth
from .req_psnpool import release_layout
from .req_tables import requester_tables, table_access_signature, with_write

__all__ = ["ack_trigger_layout", "completion_observation_layout", "CompletionEngine"]


def ack_trigger_layout(config):
    """A completion trigger from ACK processing: QP ``qpn`` may complete WRs; ``bit`` is the
    value its ``trig_set`` entry took (the engine copies it to ``trig_seen``)."""
    return data.StructLayout({"qpn": config.qpn_bits, "bit": 1})


def completion_observation_layout(config):
    """What ``CompletionEngine(observe=True)`` shows on ``obs``: whether it is in LOAD, RING
    or CHECK, the QP it visits, and what CHECK decides on: the ring position it checks
    (``head``) and that WR's pool entry (``entry``, latched in RING and on each completion),
    the ``wr_ring`` read port's data (``ring_read``: in RING the entry at ``head``, in CHECK
    the one after it), the ring's end latched in LOAD (``tail``), and the QP's ``una`` and
    ``error`` latched there."""
    sb = log2(slot_depth(config))
    return data.StructLayout({"load": 1, "ring": 1, "check": 1, "qpn": config.qpn_bits,
                              "head": sb + 1, "entry": pool_index_bits(config),
                              "ring_read": pool_index_bits(config),
                              "tail": sb + 1, "una": PSN, "error": 1})


class CompletionEngine(wiring.Component):
    """Complete a QP's WRs in order, from the oldest WR slot, when a trigger names the QP,
    and return each completed WR's pool entry to the intake's free list.

    A trigger from ACK processing (una advanced, or the QP failed) goes before one from the
    intake (a refused WR). IDLE takes a trigger and reads the QP's ``cq``, ``ack`` and ``sq``
    entries; LOAD latches them and reads the oldest ring position's ``wr_ring`` entry (the
    WR's pool entry); RING reads that pool entry's ``wr_done`` and the next ring position;
    CHECK offers the WR's completion when it is due (acknowledged, refused, or the QP failed)
    and, while the completion is taken, one per cycle, reads the next WR's ``wr_done`` (its
    pool entry read a cycle ahead) and the ring position after it. A WR not yet due, or the
    ring's end, returns the engine to IDLE: 4 cycles per QP visited, then one completion per
    cycle. The pool entry of each completion taken goes out on ``free`` in the same cycle.
    Statuses: SUCCESS, the WR's refusal, and after an error the QP's error status for the WR
    holding the error PSN, RETRY_EXC_ERR for all after exhausted retries, WR_FLUSH_ERR for
    the others.

    Hazards: the engine reads the QP's state once per visit (LOAD), its ``ack`` entry with
    the write of LOAD's own cycle (``ack_write``, the table's write port: ACK processing
    writes it from a register a cycle after deciding, so an ACK decided as the engine took
    the QP's trigger, which queued none, is seen); an ACK applied later queues another
    trigger (ACK processing queues at most one per QP: ``trig_set`` differs from
    ``trig_seen`` while one waits). No trigger is taken while the control holds.
    A QP_WRITE resets ``cq`` (``control.write``; the control waits for IDLE first).

    Members
    -------
    tables : ``In(table_access_signature(config, "completion"))``
    control : ``In(ControlSignature(config))``
    ack_write : ``In(WritePort.Signature(...))``
        The ``ack`` table's write port (ACK processing's), tracked in LOAD.
    ack_trigger : ``In(stream.Signature(ack_trigger_layout(config)))``
    wr_trigger : ``In(stream.Signature(config.qpn_bits))``
    completion : ``Out(stream.Signature(completion_layout(config)))``
    free : ``Out(stream.Signature(pool_index_bits(config)))``
        The pool entry of each completion taken (the intake's free list, always ready).
    release : ``Out(stream.Signature(release_layout(config)))``
        The QP and the una LOAD read, once per visit, for the PSN pool
        (:class:`~.req_psnpool.PsnPool`) to take back the QP's chunks below una; LOAD
        waits while it is not ready.
    busy : ``Out(1)``
        Not idle.
    events : ``Out(events_layout(COUNTERS))``
    obs : ``Out(completion_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.
    """

    COUNTERS = ("completions", "error_completions")

    def __init__(self, *, config, observe=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
        self._config = config
        self._observe = observe
        super().__init__({
            "tables": In(table_access_signature(config, "completion")),
            "control": In(ControlSignature(config)),
            "ack_write": In(WritePort.Signature(addr_width=config.qpn_bits,
                                                shape=requester_tables(config)["ack"][0])),
            "ack_trigger": In(stream.Signature(ack_trigger_layout(config))),
            "wr_trigger": In(stream.Signature(config.qpn_bits)),
            "completion": Out(stream.Signature(completion_layout(config))),
            "free": Out(stream.Signature(pool_index_bits(config))),
            "release": Out(stream.Signature(release_layout(config))),
            "busy": Out(1),
            "events": Out(events_layout(self.COUNTERS)),
            **({"obs": Out(completion_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        qb = self._config.qpn_bits
        sb = log2(slot_depth(self._config))
        ctl = self.control
        wps = {"trig_seen": self.tables.write.trig_seen, "cq": self.tables.write.cq}

        def ring_addr(qpn, position):
            return Cat(position[:sb], qpn)

        E_IDLE, E_LOAD, E_RING, E_CHECK = range(4)
        e_state = Signal(2)
        e_qpn = Signal(qb)
        e_head = Signal(sb + 1)
        e_entry = Signal(pool_index_bits(self._config))     # the pool entry of the WR at e_head
        e_tail = Signal(sb + 1)
        e_wimm = Signal(WIMM_BITS)
        e_err_done = Signal()
        e_una = Signal(PSN)
        e_error = Signal()
        e_err_psn = Signal(PSN)
        e_err_status = Signal(P.CompletionStatus)
        e_pick = Signal()
        ack_trigger, wr_trigger = self.ack_trigger, self.wr_trigger
        e_pick_qpn = Mux(ack_trigger.valid, ack_trigger.payload.qpn, wr_trigger.payload)
        m.d.comb += [
            wps["trig_seen"].addr.eq(ack_trigger.payload.qpn),
            wps["trig_seen"].data.eq(ack_trigger.payload.bit),
            wps["trig_seen"].en.eq(e_pick & ack_trigger.valid),
            e_pick.eq((e_state == E_IDLE) & ~ctl.hold & (ack_trigger.valid | wr_trigger.valid)),
            ack_trigger.ready.eq(e_pick),
            wr_trigger.ready.eq(e_pick & ~ack_trigger.valid),
            self.busy.eq(e_state != E_IDLE),
        ]
        reads = self.tables.read
        for port in (reads.cq, reads.ack, reads.sq):
            m.d.comb += port.addr.eq(Mux(e_pick, e_pick_qpn, e_qpn))
        # LOAD takes the ``ack`` entry with the write of its own cycle (ACK processing writes
        # it a cycle after deciding, and queues no trigger while one waits: the ACK whose
        # write lands in the cycle after the engine took the trigger is seen here).
        e_cq, e_sq = reads.cq.data, reads.sq.data
        e_ack = Signal.like(reads.ack.data, name="e_ack")
        m.d.comb += e_ack.eq(with_write(self.ack_write, e_qpn, reads.ack.data))
        wr_done_port, ring_port = reads.wr_done, reads.wr_ring
        done = wr_done_port.data
        e_transfer = self.completion.valid & self.completion.ready
        e_next_head = (e_head + 1)[:sb + 1]
        # The ring is read a position ahead of `wr_done`: in RING and CHECK its data is the
        # pool entry of the WR after e_head (used only when that WR is before e_tail).
        with m.Switch(e_state):
            with m.Case(E_LOAD):
                m.d.comb += ring_port.addr.eq(ring_addr(e_qpn, e_cq.head))
            with m.Case(E_RING):
                m.d.comb += [ring_port.addr.eq(ring_addr(e_qpn, e_next_head)),
                             wr_done_port.addr.eq(ring_port.data)]
            with m.Default():
                m.d.comb += [
                    ring_port.addr.eq(ring_addr(e_qpn, Mux(e_transfer, e_head + 2, e_next_head))),
                    wr_done_port.addr.eq(Mux(e_transfer, ring_port.data, e_entry)),
                ]
        acked_wr = psn_ge(e_una, done.end)
        e_status = Signal(P.CompletionStatus)
        e_complete = Signal()
        e_takes_error = Signal()
        with m.If((Value.cast(done.refused) != 0) & (acked_wr | e_error)):
            m.d.comb += [e_complete.eq(1), e_status.eq(done.refused)]
        with m.Elif(acked_wr):
            m.d.comb += [e_complete.eq(1), e_status.eq(P.CompletionStatus.SUCCESS)]
        with m.Elif(e_error):
            m.d.comb += e_complete.eq(1)
            with m.If(e_err_status == P.CompletionStatus.RETRY_EXC_ERR):
                m.d.comb += e_status.eq(P.CompletionStatus.RETRY_EXC_ERR)
            with m.Elif(~e_err_done & psn_gt(done.end, e_err_psn)):
                m.d.comb += [e_status.eq(e_err_status), e_takes_error.eq(1)]
            with m.Else():
                m.d.comb += e_status.eq(P.CompletionStatus.WR_FLUSH_ERR)
        comp = self.completion.payload
        m.d.comb += [
            self.completion.valid.eq((e_state == E_CHECK) & e_complete),
            comp.qpn.eq(e_qpn), comp.side.eq(CompletionSide.REQUESTER),
            comp.wr_id.eq(done.wr_id), comp.status.eq(e_status),
            comp.opcode.eq(P.WcOpcode.RDMA_WRITE), comp.byte_len.eq(done.length),
            comp.imm_valid.eq(0), comp.imm.eq(0),
        ]
        with m.Switch(e_state):
            with m.Case(E_IDLE):
                with m.If(e_pick):
                    m.d.sync += [e_qpn.eq(e_pick_qpn), e_state.eq(E_LOAD)]
            with m.Case(E_LOAD):
                with m.If(self.release.ready):
                    m.d.sync += [
                        e_head.eq(e_cq.head), e_wimm.eq(e_cq.wimm), e_err_done.eq(e_cq.err_done),
                        e_tail.eq(e_sq.tail), e_una.eq(e_ack.una),
                        e_error.eq(e_ack.error), e_err_psn.eq(e_ack.err_psn),
                        e_err_status.eq(e_ack.err_status),
                        e_state.eq(Mux(e_cq.head == e_sq.tail, E_IDLE, E_RING)),
                    ]
            with m.Case(E_RING):
                m.d.sync += [e_entry.eq(ring_port.data), e_state.eq(E_CHECK)]
            with m.Case(E_CHECK):
                with m.If(~e_complete):
                    m.d.sync += e_state.eq(E_IDLE)
                with m.Elif(e_transfer):
                    m.d.sync += [
                        e_head.eq(e_next_head), e_entry.eq(ring_port.data),
                        e_wimm.eq(e_wimm + done.is_imm),
                        e_err_done.eq(e_err_done | e_takes_error),
                    ]
                    with m.If(e_next_head == e_tail):
                        m.d.sync += e_state.eq(E_IDLE)
        with m.If(ctl.write):
            m.d.comb += [wps["cq"].addr.eq(ctl.qpn), wps["cq"].en.eq(1), wps["cq"].data.eq(0)]
        with m.Else():
            m.d.comb += [
                wps["cq"].addr.eq(e_qpn), wps["cq"].en.eq(e_transfer),
                wps["cq"].data.head.eq(e_next_head),
                wps["cq"].data.wimm.eq(e_wimm + done.is_imm),
                wps["cq"].data.err_done.eq(e_err_done | e_takes_error),
            ]
        m.d.comb += [self.free.valid.eq(e_transfer), self.free.payload.eq(e_entry),
                     self.release.valid.eq(e_state == E_LOAD),
                     self.release.payload.qpn.eq(e_qpn), self.release.payload.una.eq(e_ack.una)]
        ok = e_status == P.CompletionStatus.SUCCESS
        m.d.comb += [self.events.completions.eq(e_transfer & ok),
                     self.events.error_completions.eq(e_transfer & ~ok)]
        if self._observe:
            obs = self.obs
            m.d.comb += [obs.load.eq(e_state == E_LOAD), obs.ring.eq(e_state == E_RING),
                         obs.check.eq(e_state == E_CHECK),
                         obs.qpn.eq(e_qpn), obs.head.eq(e_head), obs.entry.eq(e_entry),
                         obs.ring_read.eq(ring_port.data),
                         obs.tail.eq(e_tail),
                         obs.una.eq(e_una), obs.error.eq(e_error)]
        return m
