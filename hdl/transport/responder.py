"""The responder: receive window, validation, placement, SACK/NACK/NAK generation, completions.

One :class:`Responder` serves every QP of the NIC. Per-QP state lives in block RAM tables
indexed by the QP number. A pipeline (issue: the tables are addressed; read: their data is
registered; execute: the packet is classified and the QP's entry written back; reply: the SACK
bitmap is cut and the reply registered) takes one packet per cycle, including packets of the
same QP back to back: the two writes a read cannot see yet are forwarded (the write of the
previous cycle from a register, the write of this cycle from the execute stage). This module
is the execute stage and the top; the other stages are components of their own
(``resp_admit``, ``resp_complete``, ``resp_reply``). ``docs/responder.md`` explains the
rules, the tables and their cost.
"""

from types import SimpleNamespace

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import completion_layout, place_beat_layout
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import as_signal, onehot, shift_right, validating
from .resp_admit import (
    Admission,
    checks_layout,
    distance_checks,
    distance_layout,
    header_checks,
    qp_write_checks,
)
from .resp_bits import lowest_set, prefix_counts, select_sum
from .resp_complete import CompletionReorder
from .resp_defs import (
    DEFAULT_ACK_DELAY,
    DEFAULT_ACK_EVERY,
    DEFAULT_ACK_NEW_HOLES,
    DEFAULT_COALESCE_GAPS,
    DEFAULT_GAP_DEPTH,
    DEFAULT_NAK_INTERVAL,
    GAP_DEPTH_BITS,
    OOO_COUNT_MAX,
    RCVD_BYTES_BITS,
    RESPONDER_COUNTERS,
    VERDICT_NACK,
    VERDICT_NAK,
    ResponderCommand,
    ResponderVerdict,
    responder_command_layout,
    responder_response_layout,
)
from .resp_layouts import (
    CHUNK,
    OP_BEAT,
    OP_CONT,
    OP_CTL,
    OP_FIRST,
    OP_TIMER,
    op_layout,
    reply_layout,
    responder_layouts,
)
from .resp_reply import ReplyStage, reply_beat

__all__ = ["Responder", "ResponderVerdict", "ResponderCommand", "responder_command_layout",
           "responder_response_layout", "responder_counters_layout", "responder_tables"]


def responder_counters_layout():
    return data.StructLayout({name: unsigned(32) for name in RESPONDER_COUNTERS})


def responder_tables(config, *, mr_slots=16, timers=16, completions=8):
    """``{name: (width_bits, depth)}`` of every RAM and FIFO of a :class:`Responder`, for the
    block RAM budget (``docs/responder.md``)."""
    layouts = responder_layouts(config)
    return {
        "qp_table": (layouts.qp.size, config.qps),
        "bitmaps": (layouts.bitmaps.size, config.qps),
        "wimm_table": (layouts.wimm_row.size, config.qps),
        "mr_table": (layouts.mr.size, mr_slots),
        "ack_timers": (layouts.timer.size, timers + 1),
        "completion_fifo": (completion_layout(config).size, completions),
    }


def _observation_layout(config, mr_slots):
    """What ``Responder(observe=True)`` shows on ``obs`` (for the formal proofs)."""
    layouts = responder_layouts(config)
    state, mr = layouts.state, layouts.mr
    return data.StructLayout({
        "row": state,               # the tables' row of `obs_qpn` (asynchronous read)
        "mr_row": mr,               # the MR table's entry of `obs_slot` (asynchronous read)
        "e_row": 1,                 # S2 holds an operation on a row (not a payload beat) ...
        "e_qpn": config.qpn_bits,   # ... of this QP
        "e_psn": 24, "e_fire": 1,
        "st": state,                # the row S2 decides on (forwarded)
        "new_state": state,         # the row S2 writes back ...
        "table_write": 1,           # ... when this is set
        "placed": 1, "set_rx": 1,
        # Payload placement: the beats in S1 and S2, S2's MR entry and va + dma_len, the
        # packet being placed, and whether S0 is between a packet's first and last beat.
        "s1_first": 1, "s1_more": 1, "s1_beat": packet_beat_layout(config),
        "e_first": 1, "e_more": 1, "e_beat": packet_beat_layout(config),
        "mr": mr, "va_end": 65, "pkt_place": 1, "pkt_addr": 64, "in_packet": 1,
        # Replies: the one S2 hands to S3 (taken when `reply_taken`), the one S3 holds
        # before its output register (`ack`), S2's owed ACK, the restarts in S1 and S2.
        "reply_taken": 1, "reply": packet_beat_layout(config),
        "held_valid": 1, "held": packet_beat_layout(config),
        "e_cont": 1, "ack_want": 1, "ack_every": 8, "s1_restart": 1, "e_restart": 1,
        "s1_issued": 1,             # S1 is empty or holds an operation S0 issues (not CONT)
        # S1 holds an operation on a row (not a payload beat) of this QP; the entry and the
        # MR entry it starts from before S2's write of this cycle (the tables' data with
        # `prev` and `prev2`, or what it captured while it waited).
        "s1_row_op": 1, "s1_qpn": config.qpn_bits, "s1_older": state, "s1_mr_older": mr,
        # The registered checks (the QP_WRITE one too) and S1's va + dma_len agree with the
        # operations they belong to.
        "checks_ok": 1,
        # S2's registered distance agrees with its packet and the row it decides on (what
        # its verdict reads of it: the receive bits only inside the window).
        "dist_ok": 1,
    })


class Responder(wiring.Component):
    """The responder of every QP: classifies each received data packet, writes accepted
    payloads to memory, answers with MRC 1.0 SACKs (SETH + CC_STATE), NETH NACKs (trimmed, PSN
    out of the window) and AETH NAKs (fatal errors), answers reliability probes (PETH) with
    pr = 1 SACKs, and releases WRITE WITH IMMEDIATE completions in message order.

    Pipeline: S0 issue and S1 read (:class:`~hdl.transport.resp_admit.Admission`: choose the
    operation, read and forward the tables, check the header and MR entry), S2 execute (this
    component: classify, advance, write back, emit; the WRITE_IMM entries and completions in
    :class:`~hdl.transport.resp_complete.CompletionReorder`), S3 reply
    (:class:`~hdl.transport.resp_reply.ReplyStage`: the header and the SACK bitmap). A table
    read misses the writes of the two operations ahead of it; S1 takes them from registers of
    S2's write-backs and the write of the current cycle from S2, so the only loop left in one
    cycle is S2's decision on its own QP entry.

    Throughput: one packet per cycle (II = 1) in the steady state, back-to-back packets of the
    same QP included, and one beat per cycle for payload. Latency: first beat in -> first place
    beat registered: 3 cycles; -> SACK, NACK or NAK on ``ack``: 5 cycles. Cycles are taken
    from the packet stream only by control commands (one each; a restart, QP_WRITE with
    ``set_psn``, first waits until the pipeline and the reply stage are empty), ACK-delay
    timers that fire, and cumulative advances longer than one step: one more step for each further
    completed WRITE WITH IMMEDIATE and for each further ``CHUNK`` PSNs (the step after an
    in-order packet that may need one leaves a bubble whether or not it does).

    Backpressure, never a drop: an operation executes only when every output its kind can use
    has room (``i.ready`` low meanwhile). Bad packets are never written: each gets a
    :class:`ResponderVerdict`, a counter and (mostly) a NACK or NAK. A probe of an unknown or
    not responding QP is dropped and counted (``probes_dropped``).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
    mr_slots : int
        MR table entries, a power of two from 1 to 4096. An rkey's low ``log2(mr_slots)`` bits
        select its slot and the whole rkey must match the slot's.
    timers : int
        ACK-delay timer entries (1 to 1024). When all are in use, a packet that would start
        one is ACKed at once instead.
    completions : int
        Completion FIFO entries (2 to 1024).
    observe : bool
        Add the observation ports ``obs_qpn``, ``obs_slot`` and ``obs`` (off by default): an
        asynchronous read of every table at a chosen row and the state of S1, S2 and S3 the
        formal proofs by induction state their invariants on
        (``hdl/formal/responder_invariants.py``). Nothing else changes.

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
        Received data packets (kind DATA, trimmed ones included) and reliability probes
        (kind RPROBE).
    place : ``Out(stream.Signature(place_beat_layout(config)))``
        Memory writes of accepted packets.
    ack : ``Out(stream.Signature(packet_beat_layout(config)))``
        SACK, NACK and NAK packets for the header builder: one beat, ``keep`` 0.
    completion : ``Out(stream.Signature(completion_layout(config)))``
        WRITE WITH IMMEDIATE completions, per QP in message order.
    now_ns : ``In(32)``
        Unused (replies echo the sender's timestamps); kept so the NIC's wiring holds.
    ctl : ``In(stream.Signature(responder_command_layout(config)))``
    ctl_resp : ``Out(stream.Signature(responder_response_layout(config)))``
        One response per command, in order.
    counters : ``Out(responder_counters_layout())``
        32-bit event counters (wrap), two cycles behind the events.
    verdict_valid, verdict : ``Out(1)``, ``Out(ResponderVerdict)``
        A one-cycle strobe per classified packet, one cycle after classification.
    """

    def __init__(self, *, config, mr_slots=16, timers=16, completions=8, observe=False):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
            if not isinstance(mr_slots, int) or not 1 <= mr_slots <= 4096 or \
                    mr_slots & (mr_slots - 1):
                raise ValueError(f"MR slot count must be a power of two from 1 to 4096, "
                                 f"not {mr_slots!r}")
            if not isinstance(timers, int) or not 1 <= timers <= 1024:
                raise ValueError(f"Timer count must be an integer from 1 to 1024, "
                                 f"not {timers!r}")
            if not isinstance(completions, int) or not 2 <= completions <= 1024:
                raise ValueError(f"Completion FIFO depth must be an integer from 2 to 1024, "
                                 f"not {completions!r}")
            if not isinstance(observe, bool):
                raise TypeError(f"Observe must be a bool, not {observe!r}")
        self._config = config
        self._mr_slots = mr_slots
        self._timers = timers
        self._completions = completions
        self._observe = observe
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout(config))),
            "place": Out(stream.Signature(place_beat_layout(config))),
            "ack": Out(stream.Signature(packet_beat_layout(config))),
            "completion": Out(stream.Signature(completion_layout(config))),
            "now_ns": In(32),
            "ctl": In(stream.Signature(responder_command_layout(config))),
            "ctl_resp": Out(stream.Signature(responder_response_layout(config))),
            "counters": Out(responder_counters_layout()),
            "verdict_valid": Out(1),
            "verdict": Out(ResponderVerdict),
            **(self._observation_members() if observe else {}),
        })

    @property
    def config(self):
        return self._config

    @property
    def mr_slots(self):
        return self._mr_slots

    # The stages share one namespace (``s``): each method below builds one stage or one part
    # of S2 and leaves its results there for the next.

    def elaborate(self, platform):
        m = Module()
        config = self._config
        s = SimpleNamespace()
        s.layouts = layouts = responder_layouts(config)
        timer_layout = layouts.timer
        s.state_layout = layouts.state
        s.op_layout = op_layout(config)
        # S0 issue and S1 read, with the tables.
        m.submodules.admission = s.admit = Admission(config=config, mr_slots=self._mr_slots,
                                                     observe=self._observe)
        wiring.connect(m, wiring.flipped(self.i), s.admit.i)
        wiring.connect(m, wiring.flipped(self.ctl), s.admit.ctl)

        # One spare entry: `timers_used` (exact, unlike the FIFO's inner level while an entry
        # moves to its output register) decides whether a timer can start.
        m.submodules.timer_fifo = s.tfifo = SyncFIFOBuffered(width=timer_layout.size,
                                                             depth=self._timers + 1)
        s.timers_used = Signal(range(self._timers + 1))
        m.submodules.completions = s.reorder = CompletionReorder(
            config=config, completions=self._completions)
        wiring.connect(m, s.reorder.completion, wiring.flipped(self.completion))
        m.submodules.sack_stage = s.sack_stage = ReplyStage(config=config)
        wiring.connect(m, s.sack_stage.o, wiring.flipped(self.ack))

        s.cycles = Signal(32)
        m.d.sync += s.cycles.eq(s.cycles + 1)
        s.ack_every = Signal(8, init=DEFAULT_ACK_EVERY)
        s.ack_delay = Signal(32, init=DEFAULT_ACK_DELAY)
        s.nak_interval = Signal(32, init=DEFAULT_NAK_INTERVAL)
        s.coalesce_gaps = Signal(init=DEFAULT_COALESCE_GAPS)
        s.gap_depth = Signal(GAP_DEPTH_BITS, init=DEFAULT_GAP_DEPTH)
        s.ack_new_holes = Signal(init=DEFAULT_ACK_NEW_HOLES)

        self._stages(m, s)
        self._classify(m, s)
        self._advance(m, s)
        self._acknowledge(m, s)
        self._reply(m, s)
        self._control(m, s)
        self._outputs(m, s)
        if self._observe:
            self._observation(m, s)
        return m

    # --- S0 issue and S1 read --------------------------------------------------------------

    def _stages(self, m, s):
        # The execute stage's registers, loaded from admission (S1) or, for a continued
        # step, from S2's own write-back.
        admit = s.admit
        e = s.e = Signal(s.op_layout, reset_less=True)
        e_valid = s.e_valid = Signal()
        s.st = Signal(s.state_layout, reset_less=True)  # S2's QP entry, forwarded
        s.mr = Signal(s.layouts.mr, reset_less=True)    # S2's MR entry
        s.va_end = Signal(65, reset_less=True)      # S2's va + dma_len
        s.checks = Signal(checks_layout(), reset_less=True)     # S2's header and MR checks
        # Where S2's packet lies against its row (made in S1; a continued step, which starts
        # from its own write-back, does not read it).
        s.dist = Signal(distance_layout(self._config), reset_less=True)
        s.nak_since = Signal(32, reset_less=True)   # S2: cycles - its row's last_nak
        s.nak_set = Signal()                        # S2 sends an out-of-window NACK
        s.cmd_limit = Signal(65, reset_less=True)   # S2's command's base + length
        s.qp_write_ok = Signal(reset_less=True)     # S2's command: a QP_WRITE that passes
        s.e_fire = Signal()                         # S2 executes this cycle
        s.e_cont = Signal()                         # ... and its operation takes another step
        s.may_cont = Signal()                       # ... or might (S1 waits either way)
        s.new_state = Signal(s.state_layout)        # the entry S2 writes back
        s.table_write = Signal()
        s.row_write = Signal()                      # S2's operation writes its row if it fires
        s.mr_write = admit.mr_write                 # S2's MR table write (MR_WRITE)
        s.FIRST, s.BEAT, s.CONT, s.TIMER, s.CTL = OP_FIRST, OP_BEAT, OP_CONT, OP_TIMER, OP_CTL

        timer_head = s.layouts.timer(s.tfifo.r_data)
        s.take_timer = admit.timer.ready
        m.d.comb += [
            admit.o.ready.eq(~e_valid | (s.e_fire & ~s.may_cont)),
            # A restart waits until S2 and the reply stage are empty (and S1, in admission).
            admit.drained.eq(~e_valid & ~s.sack_stage.busy),
            admit.cycles.eq(s.cycles),
            admit.timer.valid.eq(s.tfifo.r_rdy & ~(s.cycles - timer_head.deadline)[31]),
            admit.timer.payload.eq(timer_head),
            s.tfifo.r_en.eq(admit.timer.ready),
            admit.wb.row_write.eq(s.row_write), admit.wb.fire.eq(s.table_write),
            admit.wb.qpn.eq(e.qpn), admit.wb.state.eq(s.new_state),
        ]
        # S2's `nak_since` = cycles - its row's last_nak, kept up to date by counting, so the
        # out-of-window NACK rate limit compares a register (no subtract in S2's loop). S2
        # writes last_nak = cycles only for a NACK it sends (`nak_set`): 1 cycle ago next.
        since_now = Mux(s.nak_set, 1, s.nak_since + 1)
        a = admit.o.payload
        m.d.sync += s.nak_since.eq(s.nak_since + 1)
        with m.If(s.e_fire & s.e_cont):
            m.d.sync += [e.kind.eq(s.CONT), s.st.eq(s.new_state), s.nak_since.eq(since_now)]
        with m.Elif(admit.o.valid & admit.o.ready):
            m.d.sync += [
                s.nak_since.eq(Mux(a.same_now, since_now, a.since_older)),
                e_valid.eq(1), e.eq(a.op),
                s.mr.eq(a.mr), s.va_end.eq(a.va_end), s.cmd_limit.eq(a.cmd_limit),
                s.qp_write_ok.eq(a.qp_write_ok),
                s.checks.eq(a.checks), s.dist.eq(a.dist), s.st.eq(a.row),
            ]
        with m.Elif(s.e_fire):
            m.d.sync += e_valid.eq(0)

    # --- S2: classify ----------------------------------------------------------------------

    def _classify(self, m, s):
        e, qp, bm, mr = s.e, s.st.qp, s.st.bm, s.mr
        s.is_packet = s.e_valid & (e.kind == s.FIRST)
        # A reliability probe (PETH) is a one-beat packet that consumes no PSN: it is answered
        # with a pr = 1 SACK and changes nothing.
        s.is_probe = s.is_packet & s.checks.probe
        s.is_first = s.is_packet & ~s.is_probe
        s.is_beat = s.e_valid & (e.kind == s.BEAT)
        s.is_cont = s.e_valid & (e.kind == s.CONT)
        s.is_timer = s.e_valid & (e.kind == s.TIMER)
        s.is_ctl = s.e_valid & (e.kind == s.CTL)

        h = s.h = e.beat.header

        checks = s.checks
        s.is_last_op = checks.last_op
        s.is_imm_op = checks.imm_op
        s.known = checks.known
        s.responding = (qp.state == int(P.QpState.RTR)) | (qp.state == int(P.QpState.RTS))
        bad_seq = checks.bad_seq
        # The PSN against the row, from S1's registers (no subtract in S2's loop).
        dist = s.dist
        s.d0 = dist.d0
        below = dist.below
        in_window = dist.in_window          # 0 <= PSN - epsn < mpr x 128
        s.offset = dist.offset
        marked = dist.marked
        mr_ok = checks.mr_hit & (mr.pd == qp.pd)
        in_bounds = checks.in_bounds
        wimm_full = s.is_imm_op & (qp.wimm_count >= qp.max_wimm)

        verdict = s.verdict = Signal(ResponderVerdict)
        V = ResponderVerdict
        with m.If(~s.known):
            m.d.comb += verdict.eq(V.BAD_QP)
        with m.Elif(~s.responding):
            m.d.comb += verdict.eq(V.BAD_STATE)
        with m.Elif(bad_seq):
            m.d.comb += verdict.eq(V.BAD_SEQUENCE)
        with m.Elif(below):
            m.d.comb += verdict.eq(V.DUPLICATE)
        with m.Elif(~in_window):
            m.d.comb += verdict.eq(V.OUT_OF_WINDOW)
        with m.Elif(marked):
            m.d.comb += verdict.eq(V.DUPLICATE)
        with m.Elif(h.trimmed):
            m.d.comb += verdict.eq(V.TRIMMED)
        with m.Elif(~mr_ok):
            m.d.comb += verdict.eq(V.BAD_RKEY)
        with m.Elif(~in_bounds):
            m.d.comb += verdict.eq(V.OUT_OF_BOUNDS)
        with m.Elif(wimm_full):
            m.d.comb += verdict.eq(V.WIMM_OVERFLOW)
        with m.Else():
            m.d.comb += verdict.eq(V.PLACED)
        # PLACED is every check passed: an AND, not the priority chain, and most of it made
        # in S1 (`static_ok`).
        common = as_signal(m, s.is_first & checks.static_ok & s.responding & (mr.pd == qp.pd) &
                           ~wimm_full, "placed_common")
        s.placed = as_signal(m, common & in_window & ~marked, "placed")
        # The same, for the packet at the expected PSN only (at distance 0 the PSN is not
        # below, in the window when mpr != 0, and marked only if bit 0 is set): the advance
        # waits on this one, not on the distance.
        s.placed_d0 = as_signal(m, common & s.d0 & (qp.mpr != 0) & ~bm.rcv[0], "placed_d0")

    # --- S2: mark, advance the cumulative PSN ------------------------------------------------

    def _advance(self, m, s):
        # Bit i of the bitmaps is PSN epsn + i. A packet placed above epsn sets its bit; one
        # placed at epsn (or a continued step) advances epsn over the run of received PSNs, at
        # most CHUNK at a time, and stops just before a second WRITE_IMM end on the way, so a
        # step releases at most one completion. The search and the shift use only the low
        # CHUNK + 1 bits, known before the verdict, which only selects the result.
        config = self._config
        window = config.window_psns
        qp, bm, wt, h = s.st.qp, s.st.bm, s.st.wt, s.h
        chunk = s.chunk = min(CHUNK, window - 1)
        adding = ~s.is_cont                 # an in-order packet sets bit 0 before the search
        rcv_x = as_signal(m, bm.rcv | adding, "rcv_x")
        last_x = as_signal(m, bm.last | (adding & s.is_last_op), "last_x")
        wimm_x = as_signal(m, bm.wimm | (adding & s.is_imm_op), "wimm_x")
        run_end = lowest_set(m, ~rcv_x[:chunk + 1], "run_end")   # first PSN not received
        run = Signal(range(chunk + 1))
        m.d.comb += run.eq(Mux(run_end > chunk, chunk, run_end))
        wimm_at = lowest_set(m, wimm_x[:chunk], "wimm_at")
        wimm_at_bit = onehot(m, wimm_at, chunk, name="wimm_at_bit")
        wimm_next = lowest_set(m, wimm_x[:chunk] & ~wimm_at_bit, "wimm_next")
        # Whether a WRITE_IMM completes in this step (stop: wimm_at < run), another one after
        # it too (more: wimm_next < run) and whether the step continues, from masks rather
        # than from the indices: S1's stall waits on `may_cont`, so it must come early. For
        # `may_cont` the two cases (a continued step, an in-order packet that adds bit 0)
        # are decided in parallel, before the operation's kind selects one.
        stop, more, cont = self._run_flags(m, rcv_x, wimm_x, chunk, "run")
        s.step_cont = cont
        _, _, cont_step = self._run_flags(m, bm.rcv, bm.wimm, chunk, "run_step")
        _, _, cont_add = self._run_flags(m, bm.rcv | 1, bm.wimm | s.is_imm_op, chunk, "run_add")
        step = s.step = Signal(range(chunk + 1))
        m.d.comb += step.eq(Mux(more, wimm_next, run))

        s.advancing = as_signal(m, s.placed_d0 | s.is_cont, "advancing")
        s.advance = Signal(range(chunk + 1))
        m.d.comb += [
            s.advance.eq(Mux(s.advancing, step, 0)),
            s.e_cont.eq(s.advancing & cont),
            s.may_cont.eq(Mux(s.is_cont, cont_step, s.is_first & s.d0 & cont_add)),
        ]
        s.stop = as_signal(m, s.advancing & stop, "stop")

        set_bit = Signal(window)
        m.d.comb += set_bit.eq(Mux(s.placed, onehot(m, s.offset, window, name="set_bit"), 0))
        s.rcv1 = as_signal(m, bm.rcv | set_bit, "rcv1")      # for the SACK bitmap
        s.new_bm = Signal(s.layouts.bitmaps)
        for name, advanced, placed in (
                ("rcv", rcv_x, s.rcv1),
                ("last", last_x, bm.last | Mux(s.is_last_op, set_bit, 0)),
                ("wimm", wimm_x, bm.wimm | Mux(s.is_imm_op, set_bit, 0))):
            shifted = shift_right(m, advanced, step, name=f"{name}_shift")
            m.d.comb += s.new_bm[name].eq(Mux(s.advancing, shifted, placed))

        # The sums over the step are made for every step length from S2's registers, in
        # parallel with the search: the step only selects one (no count or carry chain after
        # it), and `advancing` (which waits on the verdict) selects the result.
        # ends[k]: message ends among the first k PSNs (the MSN advance of a step of k).
        ends = prefix_counts(m, last_x[:chunk], "msn_ends")
        epos_after = [as_signal(m, Mux(qp.epos + k >= window, qp.epos + k - window, qp.epos + k),
                                f"epos_after{k}") for k in range(chunk + 1)]
        s.new_epsn = Signal(24)
        s.new_epos = Signal.like(qp.epos)
        s.new_msn = Signal(24)
        s.wimm_msn = Signal(24)             # MSN of the completed WRITE_IMM's message
        # The step that completes a WRITE_IMM passes its PSN (wimm_at + 1 PSNs).
        upto_wimm = Mux(wimm_at >= chunk, chunk, wimm_at + 1)
        m.d.comb += [
            s.new_epsn.eq(Mux(s.advancing,
                              select_sum(m, qp.epsn, [C(k, ceil_log2(chunk + 1))
                                                      for k in range(chunk + 1)],
                                         step, "epsn_after"),
                              qp.epsn)),
            s.new_epos.eq(Mux(s.advancing, Array(epos_after)[step], qp.epos)),
            s.new_msn.eq(Mux(s.advancing, select_sum(m, qp.msn, ends, step, "msn_after"),
                             qp.msn)),
            s.wimm_msn.eq(select_sum(m, qp.msn, ends, upto_wimm, "wimm_msn")),
        ]

        # WRITE_IMM entries (`CompletionReorder`): a placed one takes the first free slot,
        # unless it completes at once (an in-order WRITE_IMM: the step stops at it, bit 0); the
        # one a step passes leaves with its completion.
        reorder = s.reorder
        m.d.comb += [
            reorder.entries.eq(wt), reorder.count.eq(qp.wimm_count), reorder.epos.eq(qp.epos),
            reorder.offset.eq(s.offset), reorder.wimm_at.eq(wimm_at), reorder.stop.eq(s.stop),
            reorder.placed.eq(s.placed), reorder.placed_d0.eq(s.placed_d0),
            reorder.at_epsn.eq(s.d0),
            reorder.imm_op.eq(s.is_imm_op), reorder.imm.eq(h.immdt.imm),
        ]
        s.new_wt = reorder.new_entries
        s.new_wimm_count = reorder.new_count

    @staticmethod
    def _run_flags(m, rcv, wimm, chunk, name):
        """(stop, more, cont) of a step over the bitmaps ``rcv`` and ``wimm`` (bit 0 at the
        expected PSN): a WRITE_IMM end lies in the run of received PSNs from bit 0 (capped at
        ``chunk``), two of them do, or the step continues (two of them, or the run is longer
        than ``chunk``). Prefix ANDs and a two-level count, no adders."""
        in_run = [as_signal(m, wimm[i] & Cat(rcv[:i + 1]).all(), f"{name}_in{i}")
                  for i in range(chunk)]
        nodes = [(bit, C(0, 1)) for bit in in_run]          # (any set, two or more set)
        while len(nodes) > 1:
            merged = []
            for k in range(0, len(nodes), 2):
                if k + 1 == len(nodes):
                    merged.append(nodes[k])
                    continue
                (any_lo, two_lo), (any_hi, two_hi) = nodes[k], nodes[k + 1]
                merged.append((as_signal(m, any_lo | any_hi, f"{name}_any{len(nodes)}_{k}"),
                               as_signal(m, two_lo | two_hi | (any_lo & any_hi),
                                         f"{name}_two{len(nodes)}_{k}")))
            nodes = merged
        stop, more = nodes[0]
        full = Cat(rcv[:chunk + 1]).all()
        return stop, more, as_signal(m, more | full, f"{name}_cont")

    # --- S2: ACK decision ------------------------------------------------------------------

    def _acknowledge(self, m, s):
        qp, h, verdict = s.st.qp, s.h, s.verdict
        V = ResponderVerdict
        s.ce = h.tclass[:2] == P.ECN_CE
        # A gap: the packet lies above the expected PSN, or its step passes more than itself
        # or continues. `ack_now` counts only for a placed packet, which at the expected PSN
        # always advances: the step's own figures, not the advance the verdict selects.
        gap = ~s.d0 | (s.step > 1) | s.step_cont
        s.count_next = qp.ack_count + 1
        s.ack_now = Signal()
        timer_room = s.timers_used < self._timers
        # A packet placed above a hole as the gap_depth-th PSN received above it (once per
        # hole: the ones after it wait for the count or the timer).
        deep = (s.gap_depth != 0) & ~s.d0 & (qp.above + 1 == s.gap_depth)
        # A packet that opens a new hole: placed above the expected PSN while the PSN just
        # below it has not arrived (one arrival above a hole that was already reported is not).
        new_hole = as_signal(m, s.ack_new_holes & ~s.d0 & ~s.dist.below_marked, "new_hole")
        m.d.comb += s.ack_now.eq(h.bth.ackreq | s.ce | (gap & ~s.coalesce_gaps) | deep |
                                 new_hole |
                                 (s.count_next >= s.ack_every) |
                                 ((qp.ack_count == 0) & ~timer_room))
        s.start_timer = s.placed & ~s.ack_now & (qp.ack_count == 0)

        nak_quiet = (s.nak_interval != 0) & qp.nak_armed & (s.nak_since < s.nak_interval)
        s.nak_code = Signal(5)
        with m.Switch(verdict):
            for v, code in VERDICT_NAK.items():
                with m.Case(v):
                    m.d.comb += s.nak_code.eq(int(code))
        s.nack_reason = Signal(8)
        s.is_nack = Signal()            # a recoverable refusal: NETH NACK (else AETH NAK)
        with m.Switch(verdict):
            for v, reason in VERDICT_NACK.items():
                with m.Case(v):
                    m.d.comb += [s.nack_reason.eq(int(reason)), s.is_nack.eq(1)]
        s.suppressed = s.is_first & (verdict == V.OUT_OF_WINDOW) & nak_quiet
        m.d.comb += s.nak_set.eq(s.is_first & (verdict == V.OUT_OF_WINDOW) & ~nak_quiet)
        s.send_nak = s.is_first & (verdict != V.PLACED) & (verdict != V.DUPLICATE) & \
            ~s.suppressed & \
            ((verdict != V.TRIMMED) | (qp.caps & int(P.QpCapability.TRIM_NACK)).any())
        s.e_ack_want = Signal()         # a continued packet owes an ACK at its last step
        s.send_ack = Signal()
        m.d.comb += s.send_ack.eq((s.placed & s.ack_now & ~s.e_cont) |
                                  (s.is_cont & s.e_ack_want & ~s.e_cont) |
                                  (s.is_first & (verdict == V.DUPLICATE)) |
                                  (s.is_timer & (qp.ack_count != 0)))
        # A probe of a QP that exists and responds is answered; any other is dropped (counted).
        s.send_probe_ack = s.is_probe & s.known & s.responding
        s.new_above = Signal.like(qp.above)
        # above + placed - advance, the sums made for every step length before the step
        # selects one and the verdict the result.
        above_after = [as_signal(m, (qp.above + ~s.is_cont - k)[:len(qp.above)],
                                 f"above_after{k}") for k in range(s.chunk + 1)]
        m.d.comb += s.new_above.eq(Mux(s.advancing, Array(above_after)[s.step],
                                       Mux(s.placed, qp.above + 1, qp.above)))
        s.new_rcvd = Signal(RCVD_BYTES_BITS)
        # The sum is made before the verdict, which only selects it.
        m.d.comb += s.new_rcvd.eq(Mux(s.placed, qp.rcvd_bytes + h.reth.dma_len, qp.rcvd_bytes))

    # --- S2: the reply (its SACK bitmap is cut in S3) -----------------------------------------

    def _reply(self, m, s):
        config = self._config
        qp, h = s.st.qp, s.h
        # The packet the reply answers: this one, or for a timer the one that started it, with
        # the timestamp of the last packet placed (so that the round trip the requester measures
        # from the echo holds at most the time since the last arrival, not the ACK delay).
        s.tmpl = tmpl = Signal(s.layouts.template)
        with m.If(s.is_timer):
            m.d.comb += [tmpl.eq(s.e.timer.template), tmpl.tx_ts.eq(qp.last_ts)]
        with m.Else():
            m.d.comb += [
                tmpl.port.eq(h.port), tmpl.eth_src.eq(h.eth_src), tmpl.eth_dst.eq(h.eth_dst),
                tmpl.vlan_valid.eq(h.vlan_valid), tmpl.vlan_tci.eq(h.vlan_tci),
                tmpl.ipv6.eq(h.ipv6), tmpl.ip_src.eq(h.ip_src), tmpl.ip_dst.eq(h.ip_dst),
                tmpl.flow_label.eq(h.flow_label), tmpl.udp_sport.eq(h.udp_sport),
                tmpl.psn.eq(h.bth.psn),
                tmpl.tx_ts.eq(Mux(s.is_probe, h.ctl.peth.tx_timestamp, h.tseth.tx_timestamp)),
                tmpl.ce.eq(s.ce & ~s.is_probe),
            ]

        # SACK bitmap: 64 PSNs from cack_psn + 1, or, when the trigger lies more than 64 PSNs
        # above cack_psn, from the start of the trigger's 64-aligned block (so a SACK reports
        # the holes around a late arrival anywhere in the window). Bit i of `rcv1` is PSN
        # epsn + i (before this step's advance). What needs the advance is finished in the
        # reply stage (`_reply_fields`); here only what the entry and the trigger decide:
        # with dist = trigger - epsn and cack_psn = epsn + advance - 1, the trigger lies
        # dist + 1 - advance above cack_psn, and advance is at most CHUNK.
        bitmap_bits = P.SACK_BITMAP_BITS
        sign = 1 << (P.PSN_BITS - 1)
        dist = Signal(24)
        m.d.comb += dist.eq(tmpl.psn - qp.epsn)
        far = (dist >= bitmap_bits + CHUNK + 1) & (dist <= sign - 2)
        near_lo = (dist >= bitmap_bits) & (dist <= bitmap_bits + CHUNK)
        near_hi = (dist >= sign - 1) & (dist <= sign + CHUNK - 1)
        lo_max = (dist - bitmap_bits)[:ceil_log2(CHUNK + 1)]
        hi_min = (dist + 2 - sign)[:5]
        block_shift = (Cat(C(0, 6), tmpl.psn[6:16]) - qp.epsn[:16])[:16]

        bad_qp = s.is_first & ~s.known
        s.reply = reply = Signal(reply_layout(config))
        # Only `kind`, `nack_reason` and `nak_code` wait on the verdict; the header is built
        # from these registers in the reply stage.
        with m.If(s.send_nak & s.is_nack):
            m.d.comb += reply.kind.eq(PacketKind.NACK)
        with m.Elif(s.send_nak):
            m.d.comb += reply.kind.eq(PacketKind.AETH)
        with m.Else():
            m.d.comb += reply.kind.eq(PacketKind.SACK)
        m.d.comb += [
            reply.tmpl.eq(tmpl),
            reply.dqpn.eq(Mux(bad_qp, h.bth.dqpn, qp.remote_qpn)),
            reply.nack_reason.eq(s.nack_reason), reply.nak_code.eq(s.nak_code),
            reply.msn.eq(Mux(bad_qp, 0, s.new_msn)),
            reply.probe.eq(s.is_probe), reply.probe_id.eq(h.ctl.peth.probe_id),
            reply.epsn.eq(qp.epsn), reply.advance.eq(s.advance), reply.dist.eq(dist),
            reply.block_shift.eq(block_shift),
            reply.far.eq(far), reply.near_lo.eq(near_lo), reply.lo_max.eq(lo_max),
            reply.near_hi.eq(near_hi), reply.hi_min.eq(hi_min),
            reply.mpr.eq(qp.mpr),
            reply.ooo_count.eq(Mux(s.new_above > OOO_COUNT_MAX, OOO_COUNT_MAX, s.new_above)),
            reply.rcvd_bytes.eq(s.new_rcvd),
            reply.rcv.eq(s.rcv1),
        ]

    # --- S2: control commands --------------------------------------------------------------

    def _control(self, m, s):
        config = self._config
        mr_bits = ceil_log2(self._mr_slots)
        cmd, qp, is_ctl = s.e.cmd, s.st.qp, s.is_ctl
        C_ = ResponderCommand
        s.resp = resp = Signal(responder_response_layout(config))
        s.qp_cmd_ok = Signal()
        s.set_rx = Signal()
        # Whether a QP_WRITE is taken comes registered from S1 (`qp_write_ok`): a restart's
        # write-back, which S1 forwards, waits on no compare; the errno is picked from the
        # same checks here.
        qp_write = qp_write_checks(config, cmd)
        cmd_qpn_ok = qp_write["qpn_ok"]
        m.d.comb += [s.qp_cmd_ok.eq(is_ctl & s.qp_write_ok),
                     s.set_rx.eq(is_ctl & s.qp_write_ok & cmd.set_psn)]
        with m.Switch(cmd.cmd):
            with m.Case(C_.QP_WRITE):
                with m.If(~cmd_qpn_ok):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Elif(~qp_write["fields_ok"]):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
            with m.Case(C_.QP_READ):
                with m.If(~cmd_qpn_ok):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Else():
                    m.d.comb += resp.data.eq(Cat(qp.state, C(0, 5), qp.epsn, qp.msn,
                                                 qp.wimm_count))
            with m.Case(C_.MR_WRITE):
                with m.If(cmd.slot >= self._mr_slots):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Elif(cmd.valid & (cmd.rkey[:mr_bits] != cmd.slot[:mr_bits])):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
                with m.Else():
                    m.d.comb += s.mr_write.en.eq(is_ctl & s.e_fire)
            with m.Case(C_.CONFIG):
                with m.If(cmd.ack_every == 0):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
                with m.Elif(is_ctl & s.e_fire):
                    m.d.sync += [s.ack_every.eq(cmd.ack_every), s.ack_delay.eq(cmd.ack_delay),
                                 s.nak_interval.eq(cmd.nak_interval),
                                 s.coalesce_gaps.eq(cmd.coalesce_gaps),
                                 s.gap_depth.eq(cmd.gap_depth),
                                 s.ack_new_holes.eq(cmd.ack_new_holes)]
        m.d.comb += [
            s.mr_write.slot.eq(cmd.slot[:mr_bits]),
            s.mr_write.entry.valid.eq(cmd.valid), s.mr_write.entry.rkey.eq(cmd.rkey),
            s.mr_write.entry.pd.eq(cmd.pd), s.mr_write.entry.base.eq(cmd.base),
            s.mr_write.entry.limit.eq(s.cmd_limit),
        ]

    # --- S2: outputs and table writes ----------------------------------------------------------

    def _outputs(self, m, s):
        config = self._config
        lanes = config.bytes_per_beat
        e, h, qp = s.e, s.h, s.st.qp

        # An operation executes when every output its kind can use has room (not only the
        # ones it turns out to need: the decision stays out of the ready path).
        place_valid = Signal()
        resp_valid = Signal()
        place_room = ~place_valid | self.place.ready
        reply_room = s.sack_stage.i.ready
        resp_room = ~resp_valid | self.ctl_resp.ready
        # Completions and timers reach their FIFOs a cycle later, from a register (no decision
        # logic in front of a FIFO); the completion FIFO's room counts the one on its way.
        completion_room = s.reorder.room
        room = Signal()
        with m.Switch(e.kind):
            with m.Case(s.FIRST):
                m.d.comb += room.eq(place_room & reply_room & completion_room)
            with m.Case(s.BEAT):
                m.d.comb += room.eq(place_room)
            with m.Case(s.CONT):
                m.d.comb += room.eq(reply_room & completion_room)
            with m.Case(s.TIMER):
                m.d.comb += room.eq(reply_room)
            with m.Case(s.CTL):
                m.d.comb += room.eq(resp_room)
        m.d.comb += s.e_fire.eq(s.e_valid & room)

        pkt_place = s.pkt_place = Signal()      # the packet in flight is being placed
        pkt_addr = s.pkt_addr = Signal(64)      # address of its next payload beat
        need_place = (s.placed | (s.is_beat & pkt_place)) & (e.beat.keep != 0)
        need_ack = s.send_ack | s.send_nak | s.send_probe_ack
        need_completion = (s.placed | s.is_cont) & s.stop

        # The output registers' payloads load whenever they may change, whether or not an
        # operation fills them: their enables do not wait on the verdict. No reset: a payload
        # means nothing while its valid is low.
        place_payload = Signal(place_beat_layout(config), reset_less=True)
        resp_payload = Signal(responder_response_layout(config), reset_less=True)
        m.d.comb += [self.place.valid.eq(place_valid), self.ctl_resp.valid.eq(resp_valid),
                     self.place.payload.eq(place_payload), self.ctl_resp.payload.eq(resp_payload)]
        with m.If(self.place.ready):
            m.d.sync += place_valid.eq(0)
        with m.If(self.ctl_resp.ready):
            m.d.sync += resp_valid.eq(0)
        with m.If(place_room):
            m.d.sync += [
                place_payload.addr.eq(Mux(s.is_first, h.reth.va, pkt_addr)),
                place_payload.data.eq(e.beat.data),
                place_payload.keep.eq(e.beat.keep),
                place_payload.last.eq(e.beat.last),
            ]
        with m.If(resp_room):
            m.d.sync += resp_payload.eq(s.resp)
        with m.If(s.e_fire & need_place):
            m.d.sync += place_valid.eq(1)
        with m.If(s.e_fire & s.is_first):
            m.d.sync += [pkt_place.eq(s.placed), pkt_addr.eq(h.reth.va + lanes),
                         s.e_ack_want.eq(s.ack_now)]
        with m.Elif(s.e_fire & s.is_beat):
            m.d.sync += pkt_addr.eq(pkt_addr + lanes)
        m.d.comb += [s.sack_stage.i.valid.eq(s.e_fire & need_ack),
                     s.sack_stage.i.payload.eq(s.reply)]
        with m.If(s.e_fire & s.is_ctl):
            m.d.sync += resp_valid.eq(1)

        m.d.comb += [s.reorder.push.eq(s.e_fire & need_completion), s.reorder.qpn.eq(e.qpn),
                     s.reorder.wr_id.eq(s.wimm_msn)]
        timer_entry = Signal(s.layouts.timer)
        m.d.comb += [
            timer_entry.deadline.eq(s.cycles + s.ack_delay), timer_entry.qpn.eq(e.qpn),
            timer_entry.template.eq(s.tmpl),
        ]
        timer_req = Signal(s.layouts.timer, reset_less=True)
        timer_pending = Signal()
        timer_start = s.e_fire & s.start_timer
        m.d.sync += [
            timer_pending.eq(timer_start), timer_req.eq(timer_entry),
            s.timers_used.eq(s.timers_used + timer_start - s.take_timer),
        ]
        m.d.comb += [s.tfifo.w_en.eq(timer_pending), s.tfifo.w_data.eq(timer_req)]

        # The QP's entry (never for an unknown QPN: its low bits name another QP).
        new_qp = s.new_state.qp
        m.d.comb += [
            new_qp.eq(qp), new_qp.epsn.eq(s.new_epsn), new_qp.epos.eq(s.new_epos),
            new_qp.msn.eq(s.new_msn), new_qp.rcvd_bytes.eq(s.new_rcvd),
            new_qp.above.eq(s.new_above), new_qp.wimm_count.eq(s.new_wimm_count),
        ]
        with m.If(s.placed):
            m.d.comb += [new_qp.ack_count.eq(Mux(s.ack_now, 0, s.count_next)),
                         new_qp.last_ts.eq(h.tseth.tx_timestamp)]
        with m.If(s.send_ack):
            m.d.comb += new_qp.ack_count.eq(0)
        with m.If(s.nak_set):
            m.d.comb += [new_qp.nak_armed.eq(1), new_qp.last_nak.eq(s.cycles)]
        cmd = e.cmd
        with m.If(s.is_ctl):
            m.d.comb += [
                new_qp.state.eq(cmd.state), new_qp.remote_qpn.eq(cmd.remote_qpn),
                new_qp.pd.eq(cmd.pd), new_qp.mpr.eq(cmd.mpr), new_qp.caps.eq(cmd.caps),
                new_qp.max_wimm.eq(cmd.max_wimm),
            ]
            with m.If(cmd.set_psn):
                m.d.comb += [
                    new_qp.epsn.eq(cmd.psn), new_qp.epos.eq(0), new_qp.msn.eq(0),
                    new_qp.ack_count.eq(0), new_qp.nak_armed.eq(0), new_qp.last_nak.eq(0),
                    new_qp.above.eq(0), new_qp.rcvd_bytes.eq(0), new_qp.wimm_count.eq(0),
                    new_qp.last_ts.eq(0),
                ]
        # What S1 derives the next packet's distance from when it is of this QP.
        m.d.comb += [
            s.admit.wb.epsn.eq(Mux(s.set_rx, cmd.psn, qp.epsn)),
            s.admit.wb.advance.eq(s.advance),
            s.admit.wb.rcv.eq(Mux(s.set_rx, 0, s.st.bm.rcv)),
            s.admit.wb.placed.eq(s.placed),
            s.admit.wb.psn_low.eq(h.bth.psn[:self._config.window_bits]),
        ]
        m.d.comb += [
            s.new_state.bm.eq(Mux(s.set_rx, 0, s.new_bm)),
            s.new_state.wt.eq(Mux(s.set_rx, 0, s.new_wt)),
            s.row_write.eq((s.is_first & s.known) | s.is_cont | s.is_timer | s.qp_cmd_ok),
            s.table_write.eq(s.e_fire & s.row_write),
        ]

        # Verdict strobe and counters (the counters from registered events).
        m.d.sync += [self.verdict_valid.eq(s.e_fire & s.is_first), self.verdict.eq(s.verdict)]
        events = {v.name.lower(): s.is_first & (s.verdict == v) for v in ResponderVerdict}
        events.update(acks=s.send_ack, naks=s.send_nak, naks_suppressed=s.suppressed,
                      probes=s.send_probe_ack, probes_dropped=s.is_probe & ~s.send_probe_ack,
                      completions=need_completion)
        assert set(events) == set(RESPONDER_COUNTERS)
        for name, event in events.items():
            seen = Signal(name=f"event_{name}")
            counter = self.counters[name]
            m.d.sync += [seen.eq(s.e_fire & event), counter.eq(counter + seen)]

    # --- Observation ports (observe=True only) ---------------------------------------------

    def _observation_members(self):
        mr_bits = ceil_log2(self._mr_slots)
        return {
            "obs_qpn": In(self._config.qpn_bits),
            "obs_slot": In(max(1, mr_bits)),
            "obs": Out(_observation_layout(self._config, self._mr_slots)),
        }

    def _observation(self, m, s):
        obs, a_obs = self.obs, s.admit.obs
        s1, s1_valid = a_obs.s1, a_obs.s1_valid
        m.d.comb += [
            s.admit.obs_qpn.eq(self.obs_qpn), s.admit.obs_slot.eq(self.obs_slot),
            obs.row.eq(a_obs.row), obs.mr_row.eq(a_obs.mr_row),
            obs.e_row.eq(s.is_packet | s.is_cont | s.is_timer | s.is_ctl), obs.e_qpn.eq(s.e.qpn),
            obs.e_psn.eq(s.h.bth.psn), obs.e_fire.eq(s.e_fire),
            obs.st.eq(s.st), obs.new_state.eq(s.new_state), obs.table_write.eq(s.table_write),
            obs.placed.eq(s.placed), obs.set_rx.eq(s.set_rx),
            obs.s1_first.eq(s1_valid & (s1.kind == s.FIRST)),
            obs.s1_more.eq(s1_valid & (s1.kind == s.BEAT)), obs.s1_beat.eq(s1.beat),
            obs.e_first.eq(s.is_packet), obs.e_more.eq(s.is_beat), obs.e_beat.eq(s.e.beat),
            obs.mr.eq(s.mr), obs.va_end.eq(s.va_end), obs.pkt_place.eq(s.pkt_place),
            obs.pkt_addr.eq(s.pkt_addr), obs.in_packet.eq(a_obs.in_packet),
            obs.reply_taken.eq(s.sack_stage.i.valid & s.sack_stage.i.ready),
            obs.reply.eq(reply_beat(m, self._config, s.sack_stage.i.payload, name="obs_reply")),
            obs.held_valid.eq(s.sack_stage.held_valid),
            obs.held.eq(reply_beat(m, self._config, s.sack_stage.held, name="obs_held")),
            obs.e_cont.eq(s.is_cont), obs.ack_want.eq(s.e_ack_want),
            obs.ack_every.eq(s.ack_every),
            obs.s1_issued.eq(~s1_valid | Cat(s1.kind == k
                                             for k in (s.FIRST, s.BEAT, s.TIMER, s.CTL)).any()),
            obs.s1_row_op.eq(s1_valid & (s1.kind != s.BEAT)),
            obs.s1_qpn.eq(s1.qpn), obs.s1_older.eq(a_obs.s1_older),
            obs.s1_mr_older.eq(a_obs.s1_mr_older),
        ]
        e_checks = header_checks(self._config, s.e.beat.header, s.mr, s.va_end)
        m.d.comb += obs.checks_ok.eq(
            (~s.e_valid | (s.checks.as_value() ==
                           Cat(e_checks[name] for name in checks_layout().members))) &
            (~s.is_ctl | (s.qp_write_ok == ((s.e.cmd.cmd == ResponderCommand.QP_WRITE) &
                                            Cat(qp_write_checks(self._config,
                                                                s.e.cmd).values()).all()))) &
            a_obs.s1_va_end_ok)
        st, dist = s.st, s.dist
        e_dist = distance_checks(self._config, s.h.bth.psn, st.qp.epsn, st.qp.mpr, st.bm.rcv)
        same = {name: dist[name] == e_dist[name] for name in e_dist}
        m.d.comb += obs.dist_ok.eq(
            ~s.is_packet |
            (same["offset"] & same["d0"] & same["below"] & same["in_window"] &
             (~dist.in_window | (same["marked"] & (dist.d0 | same["below_marked"])))))
        for op, valid, name in ((s1, s1_valid, "s1_restart"), (s.e, s.e_valid, "e_restart")):
            m.d.comb += obs[name].eq(valid & (op.kind == s.CTL) &
                                     (op.cmd.cmd == ResponderCommand.QP_WRITE) & op.cmd.set_psn)
