"""The requester: work requests in, data-packet send requests out, SACK/NACK/NAK in, completions
out. Per-QP send state, the per-QP WR rings and chunk maps, the shared WR pool and the
shared per-PSN state live in block RAM.

:class:`Requester` is the top: it instantiates the engines below and the FIFOs between them
and wires them; it has no logic of its own beyond the counters. Each engine is a component
of its own, with its latency, throughput and hazards in its docstring:

* **tables** (:class:`~.req_tables.RequesterTables`, ``req_tables.py``): the block RAM
  tables, one write port each (its owner's) and one transparent read port per reader;
* **control** (:class:`~.req_control.RequesterControl`, ``req_control.py``): commands,
  with the engines held; its QP reset goes through each table owner's write port;
* **WR intake** (:class:`~.req_intake.WrIntake`, S1) reads the QP's state, refuses bad WRs
  (an error completion through the WR ring, so completions stay in order) and claims a WR
  slot of its QP's ring and an entry of the shared WR pool (its free list);
* **segmenter** (:class:`~.req_intake.Segmenter`, S2) cuts the WR into MTU packets, one per
  cycle, each checked against the window (``next_psn - una < mpr * 128``); with
  ``NicConfig.segmenters`` above 1, several of them (:class:`~.req_segbank.SegmenterBank`)
  cut WRs of different QPs side by side and take turns on the output;
* **walker** (:class:`~.req_retransmit.Walker`) turns PSN ranges (timeout and inferred
  losses) into single PSNs for the retransmitter;
* **retransmitter** (:class:`~.req_retransmit.Retransmitter`, R0, RM, R1, RC, R2, R3) rebuilds a
  PSN's packet from its metadata and WR slot;
* **send register** (:class:`~.req_send.SendRegister`) registers ``send``, resends first,
  and writes each PSN's metadata;
* **ACK processing** (:class:`~.req_ack.AckProcessor`, A0-A3) applies one MRC 1.0 SACK, NACK
  or AETH NAK per cycle: cumulative advance, SACK bitmap merge (any ``sack_psn_offset``)
  into the acked bitmap, feedback for the EV the named PSN went out on, NACK TRIMMED ->
  trim queue, fatal NAK -> QP ERROR;
* **inference unit** (:class:`~.req_infer.InferenceUnit`, I0-I3) finds the holes with K
  later PSNs SACKed in each applied ACK, and expires reorder windows;
* **timer scanner** (:class:`~.req_timer.TimerScanner`, V0-V1) visits one QP per cycle and
  expires its retransmit timer (``docs/recovery.md``);
* **completion engine** (:class:`~.req_completion.CompletionEngine`) walks a QP's WR ring
  from the oldest slot, completes WRs in order and returns their pool entries;
* **PSN pool** (:class:`~.req_psnpool.PsnPool`): the free list of the chunks of the shared
  per-PSN state (``meta``, ``ev``; ``psn_pool`` PSNs in chunks of ``PSN_CHUNK``) that the
  segmenter takes as it sends, and the reclaimer that returns a QP's chunks once una passes
  them (a release per completion-engine visit) or its QP_WRITE;
* **feedback merge** (:class:`~.req_send.FeedbackMerge`) queues the ACK side's and the
  retransmitter's feedback into ``feedback``;
* **NSCC** (:class:`~.req_nscc.NsccEngine`, in a build with ``nscc``) keeps UET's NSCC
  window per QP from ACK processing's events; the segmenter reads it with CONFIG
  ``cc_nscc``.

Every read port is transparent for its table's write port, so a read sees every write of the
same cycle and earlier. Three engines forward what a read cannot see yet: ACK processing,
which decides an ACK a cycle after its tables' data is registered and writes ``ack``,
``acked`` and ``cc`` from registers a cycle after that, takes the decision of the ACK ahead
and the write of the one two ahead; the intake keeps the next PSN of the QP the segmenter
works on (a register: the WR being segmented has not written it yet); the segmenter keeps the
PSN pool chunk of the QP it last worked on, and tracks its QP's ``ack``, ``cc``,
``nscc_window`` and ``pool_lo`` entries from the intake's reads and the tables' write ports,
so it checks each packet a cycle ahead, from registers; the completion engine takes a QP's
``ack`` entry with the write of the cycle it loads it.
"""


from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import (
    completion_layout,
    feedback_layout,
    path_request_layout,
    work_request_layout,
)
from ..packet.headers import packet_beat_layout
from ..util import validating
from .req_ack import AckProcessor, ack_observation_layout
from .req_common import PSN, check_observe, log2
from .req_completion import CompletionEngine, completion_observation_layout
from .req_control import RequesterControl, control_observation_layout
from .req_defs import (
    PSN_CHUNK,
    REQUESTER_COUNTERS,
    chunk_map_slots,
    pool_entries,
    psn_chunks,
    qp_error_layout,
    requester_command_layout,
    requester_response_layout,
    retx_layout,
    segmenter_contexts,
    send_context_layout,
    sent_layout,
    slot_depth,
    walk_layout,
)
from .req_infer import InferenceUnit
from .req_intake import (
    INTAKE_READS,
    Segmenter,
    WrIntake,
    intake_observation_layout,
    segmenter_observation_layout,
)
from .req_nscc import NSCC_TIME_BITS, NsccEngine, nscc_constants
from .req_psnpool import PsnPool
from .req_retransmit import Retransmitter, Walker
from .req_segbank import SegmenterBank
from .req_send import FeedbackMerge, SendRegister
from .req_tables import (
    TABLE_ACCESS,
    RequesterTables,
    block_ram_bits,
    observed_row_layout,
    requester_tables,
)
from .req_timer import TimerScanner, retry_expiry_gateware

__all__ = ["Requester", "send_context_layout", "requester_tables", "block_ram_bits",
           "retry_expiry_gateware", "requester_observation_layout"]


def requester_observation_layout(config):
    """What ``Requester(observe=True)`` shows on ``obs`` (for the formal proofs): the QP's
    ``cfg``, ``next_psn``, ``ack``, ``sq`` and ``cq`` entries, its ``wr_ring`` entry at the
    segmenter's ring position and the ``wr_done`` entry of the segmenter's pool entry
    (``row``), the command the control holds (``command``) and its QP
    reset (``control``),
    and the in-flight state that can change those entries or decide on them: the intake's
    forwarding register, the segmenter's WR and window check, ACK processing's A1 and A2, the
    completion engine's LOAD and CHECK, and the retransmitter's output."""
    return data.StructLayout({
        "row": observed_row_layout(config),
        "command": control_observation_layout(config),
        "control": data.StructLayout({"hold": 1, "write": 1, "qpn": config.qpn_bits,
                                      "psn": PSN, "mpr": 4}),
        "intake": intake_observation_layout(config),
        "segmenter": segmenter_observation_layout(config),
        "ack": ack_observation_layout(config),
        "completion": completion_observation_layout(config),
        # The retransmitter's output register: a resend is marked as one.
        "resend": data.StructLayout({"valid": 1, "retransmission": 1}),
    })


class Requester(wiring.Component):
    """The MRC requester. One send request and one ACK per cycle (II = 1), also back to back
    on one QP.

    Latencies: a WR's first send request leaves 3 cycles after the WR is taken (intake, then
    the segmenter, then the output register; 4 with several segmenter contexts, whose
    hand-off register is a cycle more); an ACK updates the QP 3 cycles after it is
    taken; a retransmit request leaves 6 cycles after it is taken; a completion leaves a few
    cycles after the ACK that allows it (4 cycles per QP the completion engine visits), then
    one per cycle for the same QP.

    Bad input never hangs the block: a WR it will not send completes with an error status
    (after a QP fails, by a fatal NAK, exhausted retries or software, every outstanding WR
    completes, in order, and nothing is sent or resent for it beyond what was already under
    way);
    a SACK/NACK/NAK it cannot apply is dropped and counted in ``bad_acks``; a retransmit request
    for a PSN no longer outstanding is dropped and counted in ``retx_ignored``; feedback that
    finds its output full is dropped and counted in ``feedback_dropped``. ``docs/requester.md``
    has every rule.

    Loss recovery (``docs/recovery.md``): a per-QP retransmit timer, kept in block
    RAM and visited by a scanner one QP per cycle (accurate to one scan period, ``qps``
    cycles plus arm events), resends the oldest unacknowledged PSN and the old holes after it
    on expiry, with the retry policy of :func:`~hdl.transport.req_defs.retry_expiry`; when
    the retries are exhausted the QP goes to ERROR and every outstanding WR completes with
    RETRY_EXC_ERR. A hole with ``infer_k`` later PSNs SACKed is resent at once. Each PSN
    resent for a timeout or an inferred loss gives LOST feedback for the EV it went out on.

    Parameters
    ----------
    config : NicConfig
    nscc : NsccSetting or None
        Build the NSCC engine (:mod:`~hdl.transport.req_nscc`) with this setting: CONFIG
        ``cc_nscc`` then selects its window. ``None`` (the default): the ECN window only.
    observe : bool
        Add the observation ports ``obs_qpn`` and ``obs`` (off by default): an asynchronous
        read of the ``cfg``, ``next_psn``, ``ack``, ``sq`` and ``cq`` entries of QP
        ``obs_qpn`` and of its ``wr_done`` entry of the segmenter's WR slot, and the
        registers of the intake, the segmenter, ACK processing and the completion engine
        that the formal proof by induction states its invariants on
        (``hdl/formal/requester_invariants.py``). Nothing else changes.

    Members
    -------
    wr : ``In(stream.Signature(work_request_layout(config)))``
        Work requests. Taken in order over all QPs (a WR that must wait blocks the ones
        behind it).
    send : ``Out(stream.Signature(path_request_layout(config, send_context_layout(config))))``
        One request per data packet, to path selection. Retransmissions go first.
    sent : ``In(stream.Signature(sent_layout(config)))``
        The EV each PSN went out on. Always ready.
    rx : ``In(stream.Signature(packet_beat_layout(config)))``
        Received SACKs, NACKs and AETH NAKs (single beats).
    feedback : ``Out(stream.Signature(feedback_layout(config)))``
        Path feedback per applied SACK (ACKED, ECN for SKIP_ONCE, LOST for ALWAYS_SKIP; none for a
        probe answer), NACK TRIMMED (TRIMMED) and PSN resent for a
        timeout or an inferred loss (LOST); dropped, not stalled, when full.
    retx : ``In(stream.Signature(retx_layout(config)))``
        Requests to retransmit a PSN (the retransmit timer).
    completion : ``Out(stream.Signature(completion_layout(config)))``
        Requester completions, in WR order per QP. Never dropped.
    qp_error : ``Out(stream.Signature(qp_error_layout(config)))``
        A QP moved to ERROR by a fatal NAK or by exhausted retries (RETRY_EXC_ERR); a
        software ERROR gives none.
    ctl : ``In(stream.Signature(requester_command_layout(config)))``
        Control commands, one at a time. QP_WRITE ERROR on a QP with WRs outstanding fails it
        at once and flushes them (WR_FLUSH_ERR); any other state then is EBUSY. A QP_WRITE
        answers only after every send request already decided (queued resends, the QP's
        packet in the ``send`` register) has left.
    ctl_resp : ``Out(stream.Signature(requester_response_layout(config)))``
    now_ns : ``In(32)``
        The time in ns: NSCC's clock and round trips (a build with NSCC; else unused).
    now_units : ``In(32)``
        The time in 1.024 us units (:attr:`Timebase.units <hdl.timebase.Timebase.units>`):
        the retransmit timers and the per-PSN send time.
    counters : ``Out(data.StructLayout({name: 32 for name in REQUESTER_COUNTERS}))``
        Each counts its engines' events two cycles after they happen (the events are
        registered first, so no engine's decision runs into a counter's carry chain).
    wr_pool_free : ``Out(range(pool_entries(config) + 1))``
        Free entries of the shared WR pool (:func:`~.req_defs.pool_entries`): a status for
        tests and debugging.
    psn_pool_free : ``Out(range(psn_chunks(config) + 1))``
        Free chunks of the shared per-PSN state (:func:`~.req_defs.psn_chunks`): a status
        for tests and debugging.
    obs_qpn : ``In(config.qpn_bits)`` (``observe`` only)
    obs : ``Out(requester_observation_layout(config))`` (``observe`` only)
    """

    TRIM_QUEUE_DEPTH = 16
    FEEDBACK_DEPTH = 4
    QP_ERROR_DEPTH = 4
    ARM_DEPTH = 4           #: segmenter -> scanner: "the oldest PSN was just sent"
    WALK_DEPTH = 4          #: per walk kind, scanner/inference -> walker
    EXCEED_DEPTH = 4        #: scanner -> ACK processing: retries exhausted
    LOST_DEPTH = 4          #: walker -> feedback merge

    def __init__(self, *, config, nscc=None, observe=False):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
            check_observe(observe)
            if observe and segmenter_contexts(config) != 1:
                raise ValueError(f"observe=True (the formal proofs) needs a single segmenter "
                                 f"context: NicConfig.segmenters must be 1, not "
                                 f"{config.segmenters!r}")
            if nscc is not None:
                nscc_constants(nscc, mtu=config.mtu)
        self._config = config
        self._nscc = nscc
        self._observe = observe
        super().__init__({
            "wr": In(stream.Signature(work_request_layout(config))),
            "send": Out(stream.Signature(path_request_layout(
                config, context=send_context_layout(config)))),
            "sent": In(stream.Signature(sent_layout(config))),
            "rx": In(stream.Signature(packet_beat_layout(config))),
            "feedback": Out(stream.Signature(feedback_layout(config))),
            "retx": In(stream.Signature(retx_layout(config))),
            "completion": Out(stream.Signature(completion_layout(config))),
            "qp_error": Out(stream.Signature(qp_error_layout(config))),
            "ctl": In(stream.Signature(requester_command_layout(config))),
            "ctl_resp": Out(stream.Signature(requester_response_layout(config))),
            "now_ns": In(32),
            "now_units": In(32),
            "counters": Out(data.StructLayout({name: 32 for name in REQUESTER_COUNTERS})),
            "wr_pool_free": Out(range(pool_entries(config) + 1)),
            "psn_pool_free": Out(range(psn_chunks(config) + 1)),
            **({"obs_qpn": In(config.qpn_bits),
                "obs": Out(requester_observation_layout(config))} if observe else {}),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        now = self.now_units

        observe = self._observe
        m.submodules.tables = tables = RequesterTables(config=cfg, observe=observe)
        m.submodules.control = control = RequesterControl(config=cfg,
                                                           nscc=self._nscc is not None,
                                                           observe=observe)
        m.submodules.intake = intake = WrIntake(config=cfg, observe=observe)
        if segmenter_contexts(cfg) == 1:
            m.submodules.segmenter = segmenter = Segmenter(config=cfg, observe=observe)
        else:
            m.submodules.segmenter = segmenter = SegmenterBank(config=cfg)
        m.submodules.walker = walker = Walker(config=cfg)
        m.submodules.retransmitter = retransmitter = Retransmitter(config=cfg)
        m.submodules.sender = sender = SendRegister(config=cfg)
        m.submodules.ack = ack = AckProcessor(config=cfg, trim_depth=self.TRIM_QUEUE_DEPTH,
                                              qp_error_depth=self.QP_ERROR_DEPTH,
                                              observe=observe)
        m.submodules.inference = inference = InferenceUnit(config=cfg)
        m.submodules.scanner = scanner = TimerScanner(config=cfg)
        m.submodules.completion = completion = CompletionEngine(config=cfg, observe=observe)
        m.submodules.psnpool = psnpool = PsnPool(config=cfg, observe=observe)
        m.submodules.feedback = feedback = FeedbackMerge(
            config=cfg, feedback_depth=self.FEEDBACK_DEPTH, lost_depth=self.LOST_DEPTH)

        # -- tables, control, time ---------------------------------------------------------
        engines = {"control": control, "intake": intake, "segmenter": segmenter,
                   "retransmitter": retransmitter, "send": sender, "ack": ack,
                   "inference": inference, "scanner": scanner, "completion": completion}
        for name, engine in engines.items():
            wiring.connect(m, getattr(tables, name), engine.tables)
        wiring.connect(m, tables.psn_pool, psnpool.tables)
        # The `ev` table's writer: the EV each PSN went out on, written the cycle after its
        # report, in the chunk the QP's chunk map names.
        cb = log2(PSN_CHUNK)
        ev_map, ev_write = tables.ev_reports.read.chunk_map, tables.ev_reports.write.ev
        sent = self.sent.payload
        sent_valid = Signal()
        sent_psn = Signal(cb)
        sent_ev = Signal.like(sent.ev)
        m.d.comb += [
            self.sent.ready.eq(1),
            ev_map.addr.eq(Cat(sent.psn[cb:cb + log2(chunk_map_slots(cfg))], sent.qpn)),
            ev_map.en.eq(self.sent.valid),
            ev_write.addr.eq(Cat(sent_psn, ev_map.data)),
            ev_write.data.eq(sent_ev),
            ev_write.en.eq(sent_valid),
        ]
        m.d.sync += [sent_valid.eq(self.sent.valid), sent_psn.eq(sent.psn[:cb]),
                     sent_ev.eq(sent.ev)]
        wiring.connect(m, control.control, intake.control, segmenter.control,
                       retransmitter.control, ack.control, inference.control, scanner.control,
                       completion.control, psnpool.control)
        for engine in (segmenter, retransmitter, sender, ack, inference, scanner):
            m.d.comb += engine.now.eq(now)

        # -- FIFOs between the engines ------------------------------------------------------
        m.submodules.trim_queue = trim_queue = SyncFIFOBuffered(
            width=qb + P.PSN_BITS, depth=self.TRIM_QUEUE_DEPTH)
        # At most one trigger per QP is queued, so this queue never fills: ACK processing
        # never waits for the completion engine.
        m.submodules.ack_triggers = ack_triggers = SyncFIFOBuffered(
            width=qb + 1, depth=max(2, cfg.qps))
        m.submodules.wr_triggers = wr_triggers = SyncFIFOBuffered(width=qb, depth=4)
        m.submodules.qp_error_fifo = qp_error_fifo = SyncFIFOBuffered(
            width=qp_error_layout(cfg).size, depth=self.QP_ERROR_DEPTH)
        # Loss recovery: arm events (segmenter -> scanner), walk requests per kind (scanner,
        # inference unit -> walker), retry-exceeded QPs (scanner -> ACK processing).
        walk_bits = walk_layout(cfg).size
        m.submodules.arm_fifo = arm_fifo = SyncFIFOBuffered(width=qb + 32,
                                                            depth=self.ARM_DEPTH)
        m.submodules.timeout_walks = timeout_walks = SyncFIFOBuffered(
            width=walk_bits, depth=self.WALK_DEPTH)
        m.submodules.infer_walks = infer_walks = SyncFIFOBuffered(
            width=walk_bits, depth=self.WALK_DEPTH)
        m.submodules.exceed_fifo = exceed_fifo = SyncFIFOBuffered(width=qb,
                                                                  depth=self.EXCEED_DEPTH)

        def fifo_in(fifo, port):
            """A producer's stream into ``fifo``."""
            m.d.comb += [fifo.w_data.eq(port.payload), fifo.w_en.eq(port.valid),
                         port.ready.eq(fifo.w_rdy)]

        def fifo_out(fifo, port):
            """``fifo`` into a consumer's stream."""
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]

        # -- NSCC: ACK processing's events in, each QP's window in PSNs to the segmenter -------
        if self._nscc is not None:
            m.submodules.nscc = nscc = NsccEngine(config=cfg, setting=self._nscc)
            wiring.connect(m, control.control, nscc.control)
            window = tables.nscc.write.nscc_window
            m.d.comb += [
                nscc.now.eq(self.now_ns[P.TIMESTAMP_SHIFT:P.TIMESTAMP_SHIFT + NSCC_TIME_BITS]),
                nscc.i.valid.eq(ack.nscc.valid), nscc.i.payload.eq(ack.nscc.payload),
                nscc.o.ready.eq(1),
                window.addr.eq(nscc.o.payload.qpn), window.data.eq(nscc.o.payload.window),
                window.en.eq(nscc.o.valid),
            ]

        # -- control ------------------------------------------------------------------------
        wiring.connect(m, wiring.flipped(self.ctl), control.cmd)
        wiring.connect(m, control.resp, wiring.flipped(self.ctl_resp))
        busy = ack.busy | completion.busy | inference.busy | scanner.busy | psnpool.busy
        if self._nscc is not None:
            busy |= nscc.busy
        m.d.comb += [
            control.busy.eq(busy),
            control.resends_pending.eq(
                (trim_queue.level != 0) | (timeout_walks.level != 0)
                | (infer_walks.level != 0) | walker.o.valid | retransmitter.busy),
            control.sending.eq(self.send.valid), control.sending_qpn.eq(self.send.payload.qpn),
        ]

        # -- new packets: WR intake -> segmenter -> send register ---------------------------
        wiring.connect(m, wiring.flipped(self.wr), intake.wr)
        fifo_in(wr_triggers, intake.wr_trigger)
        wiring.connect(m, intake.o, segmenter.i)
        if segmenter_contexts(cfg) > 1:
            m.d.comb += [intake.contexts.eq(segmenter.contexts),
                         intake.handoff.eq(segmenter.handoff)]
        fifo_in(arm_fifo, segmenter.arm)
        wiring.connect(m, segmenter.o, sender.new)
        wiring.connect(m, psnpool.alloc, segmenter.alloc)
        # The intake (for a WR that waits), the segmenter (for its WR's QP) and the
        # completion engine (LOAD's ack entry) track table entries from their owners' write
        # ports.
        def table_write(name):
            owner = next(engine for engine, (_, writes) in TABLE_ACCESS.items()
                         if name in writes)
            return getattr(getattr(tables, owner).write, name)

        tracked = [(getattr(intake.writes, name), name) for name in INTAKE_READS]
        tracked += [(segmenter.ack_write, "ack"), (completion.ack_write, "ack"),
                    (segmenter.cc_write, "cc"),
                    (segmenter.nscc_write, "nscc_window"), (segmenter.pool_lo_write, "pool_lo")]
        for port, name in tracked:
            owner = table_write(name)
            m.d.comb += [port.addr.eq(owner.addr), port.data.eq(owner.data),
                         port.en.eq(owner.en)]

        # -- resends: trim queue, walker, retx -> retransmitter -> send register -----------
        fifo_out(timeout_walks, walker.timeout)
        fifo_out(infer_walks, walker.infer)
        fifo_out(trim_queue, retransmitter.trim)
        wiring.connect(m, walker.o, retransmitter.walk)
        wiring.connect(m, wiring.flipped(self.retx), retransmitter.retx)
        wiring.connect(m, retransmitter.lost, feedback.lost)
        wiring.connect(m, retransmitter.o, sender.resend)
        m.d.comb += sender.lost_pending.eq(feedback.lost_pending)
        wiring.connect(m, sender.o, wiring.flipped(self.send))

        # -- ACK processing, inference, timers, completions ---------------------------------
        wiring.connect(m, wiring.flipped(self.rx), ack.rx)
        fifo_out(exceed_fifo, ack.exceed)
        m.d.comb += [ack.trim_level.eq(trim_queue.level),
                     ack.qp_error_level.eq(qp_error_fifo.level)]
        fifo_in(trim_queue, ack.trim)
        fifo_in(ack_triggers, ack.trigger)
        fifo_in(qp_error_fifo, ack.qp_error)
        wiring.connect(m, ack.feedback, feedback.ack)
        wiring.connect(m, ack.infer, inference.ack)
        fifo_in(infer_walks, inference.walk)
        fifo_out(arm_fifo, scanner.arm)
        fifo_in(timeout_walks, scanner.timeout)
        fifo_in(exceed_fifo, scanner.exceed)
        wiring.connect(m, scanner.poll, inference.poll)
        fifo_out(ack_triggers, completion.ack_trigger)
        fifo_out(wr_triggers, completion.wr_trigger)
        wiring.connect(m, completion.free, intake.free)
        m.d.comb += [self.wr_pool_free.eq(intake.pool_free),
                     self.psn_pool_free.eq(psnpool.free_chunks)]
        wiring.connect(m, completion.release, psnpool.release)
        wiring.connect(m, psnpool.map_read, ack.map_lend)
        wiring.connect(m, completion.completion, wiring.flipped(self.completion))
        wiring.connect(m, feedback.o, wiring.flipped(self.feedback))
        fifo_out(qp_error_fifo, self.qp_error)

        # -- counters: each adds its engines' events ----------------------------------------
        events = {name: [] for name in REQUESTER_COUNTERS}
        for engine in (intake, segmenter, retransmitter, sender, ack, inference, scanner,
                       completion):
            for name in engine.COUNTERS:
                events[name].append(engine.events[name])
        events["feedback_dropped"].append(retransmitter.events.lost_dropped)
        for name in REQUESTER_COUNTERS:
            counter = Signal(32, name=f"count_{name}")
            step = Signal(range(len(events[name]) + 1), name=f"count_{name}_step")
            m.d.comb += self.counters[name].eq(counter)
            m.d.sync += [step.eq(sum(events[name])), counter.eq(counter + step)]

        if observe:
            obs, ctl = self.obs, control.control
            m.d.comb += [
                tables.obs_qpn.eq(self.obs_qpn), tables.obs_slot.eq(segmenter.obs.slot),
                tables.obs_pos.eq(segmenter.obs.pos),
                tables.obs_head.eq(completion.obs.head[:log2(slot_depth(cfg))]),
                obs.row.eq(tables.obs), obs.completion.eq(completion.obs),
                obs.command.eq(control.obs),
                obs.control.hold.eq(ctl.hold), obs.control.write.eq(ctl.write),
                obs.control.qpn.eq(ctl.qpn), obs.control.psn.eq(ctl.psn),
                obs.control.mpr.eq(ctl.mpr),
                obs.intake.eq(intake.obs), obs.segmenter.eq(segmenter.obs), obs.ack.eq(ack.obs),
                obs.resend.valid.eq(retransmitter.o.valid),
                obs.resend.retransmission.eq(
                    retransmitter.o.payload.request.context.retransmission),
            ]
        return m
