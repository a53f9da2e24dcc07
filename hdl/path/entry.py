"""The entry update of path select: feedback, control operations and the background sweeps,
applied to the EV entries by a pipelined read, decide, write-back.

::

    EntrySources:  f1 feedback registered, binding RAM addressed
                   f2 binding data registered; arbitration: command > feedback > fate > decay
                   e1 the chosen operation (registered): addresses the entry RAM
    EntryUpdate:   e2 entry RAM data and the entry's bitmap bits registered; forwarding matches
                   e3 forward, decide, write back (entry RAM, profile bitmaps), events

Each stage takes one operation per cycle; nothing in the pipeline ever waits.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..interfaces import feedback_layout
from ..protocol import EvState, FeedbackKind, ProfileState
from ..util import validating
from .pathdefs import (
    COUNT_BITS,
    EV_PORT_BITS,
    PENALTY_ACKED,
    PENALTY_BITS,
    PENALTY_ECN,
    PENALTY_HIGH,
    PENALTY_LOST,
    PENALTY_MAX,
    PENALTY_TRIMMED,
    EntryOp,
    ProbeRecovery,
    binding_layout,
    choose,
    entry_commit_layout,
    entry_op_layout,
    entry_word_layout,
    entry_words,
    first_set,
    path_event_layout,
    profile_params_layout,
)

__all__ = ["EntrySources", "EntryUpdate", "ENTRY_COUNTERS"]

#: The counters :class:`EntryUpdate` keeps.
ENTRY_COUNTERS = ("feedback_acked", "feedback_ecn", "feedback_trimmed", "feedback_lost",
                  "feedback_probe_ok", "feedback_ignored", "state_changes", "events_dropped",
                  "fate_marked", "skips", "skip_recoveries")


#: The operation flags e2 decodes for e3.
_KINDS = ("acked", "ecn", "trimmed", "lost", "probe_ok", "decay", "write", "set_state",
          "bad_kind", "fate", "recover", "feedback", "control")


def _is_hold_op(op):
    # Operations that selection must wait for: a LOST may take an EV out, a fate sweep a port.
    return (op == EntryOp.LOST) | (op == EntryOp.FATE)


class EntrySources(wiring.Component):
    """Issue one entry operation per cycle: the control's, else a feedback, else a fate-sweep
    visit, else a SKIP-recovery-sweep visit, else a decay-sweep visit.

    Latency: a feedback accepted in cycle t is issued on ``o`` (registered) in cycle t + 3 when
    nothing of higher priority is pending. Throughput: one feedback per cycle while the control
    is idle (``ctl_busy`` low); while it is busy, feedback waits in f1/f2 (``feedback.ready``
    low), never dropped. The control's operation (``ctl_op``, only while ``ctl_busy``) is issued
    in the next cycle.

    Port fate sharing: ``fate_trigger`` (from the entry update) and ``port_down`` mark a port
    pending; pending ports are swept one after the other, one entry per free slot (a FATE
    operation carries its sweep's port in ``port``).

    SKIP recovery: every ``2**skip_shift`` cycles a sweep starts (once the previous one is
    done) by advancing ``skip_epoch`` (2 bits), then visits every entry (RECOVER), one per
    free slot. A mark set in epoch e ends in epoch e + 2 (modulo 4): the sweep of that epoch
    clears it, so a mark lasts from one to two sweep periods (more while feedback keeps the
    slots busy).

    Hazards: ``hold`` is set while a LOST is in f1, f2 or ``o`` and while a fate sweep is
    pending or running: selection must not decide a request before they are applied.

    Members
    -------
    feedback : ``In(stream.Signature(feedback_layout(config)))``
    binding_rd : the binding RAM's feedback read port
    ctl_busy : ``In(1)``; ctl_op : ``In(stream.Signature(entry_op_layout, always_ready=True))``
    o : ``Out(stream.Signature(entry_op_layout(config), always_ready=True))``
    fate_trigger_valid, fate_trigger_port, port_down_valid, port_down_port : ``In``
    hold : ``Out(1)``
    fate_sweeps : ``Out(32)``
    skip_epoch : ``Out(2)``, the SKIP recovery epoch (to the entry update)
    """

    def __init__(self, *, config, decay_shift=16, skip_shift=10):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        self._decay_shift = decay_shift
        self._skip_shift = skip_shift
        super().__init__({
            "feedback": In(stream.Signature(feedback_layout(config))),
            "binding_rd": Out(ReadPort.Signature(addr_width=config.qpn_bits,
                                                 shape=binding_layout(config))),
            "ctl_busy": In(1),
            "ctl_op": In(stream.Signature(entry_op_layout(config), always_ready=True)),
            "o": Out(stream.Signature(entry_op_layout(config), always_ready=True)),
            "fate_trigger_valid": In(1),
            "fate_trigger_port": In(EV_PORT_BITS),
            "port_down_valid": In(1),
            "port_down_port": In(EV_PORT_BITS),
            "hold": Out(1),
            "fate_sweeps": Out(32),
            "skip_epoch": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        index_bits = cfg.ev_index_bits
        words = entry_words(cfg)

        # -- feedback front end: f1 (payload, binding read) -> f2 (binding data) -------------
        f1_valid, f2_valid = Signal(), Signal()
        f1 = Signal(feedback_layout(cfg))
        f2 = Signal(feedback_layout(cfg))
        f2_binding = Signal(binding_layout(cfg))
        f2_grant = Signal()
        move = Signal()
        m.d.comb += [
            move.eq(~f2_valid | f2_grant),
            self.feedback.ready.eq(move),
            self.binding_rd.addr.eq(self.feedback.payload.qpn),
            self.binding_rd.en.eq(move),
        ]
        with m.If(move):
            m.d.sync += [f1_valid.eq(self.feedback.valid), f1.eq(self.feedback.payload),
                         f2_valid.eq(f1_valid), f2.eq(f1), f2_binding.eq(self.binding_rd.data)]

        # -- decay sweep: every 2**decay_shift cycles, halve every entry's penalty ------------
        sweep_active = Signal()
        sweep_index = Signal(range(words))
        sweep_grant = Signal()
        if self._decay_shift is not None:
            timer = Signal(self._decay_shift)
            m.d.sync += timer.eq(timer + 1)
            with m.If(sweep_grant):
                m.d.sync += sweep_index.eq(sweep_index + 1)
                with m.If(sweep_index == words - 1):
                    m.d.sync += [sweep_active.eq(0), sweep_index.eq(0)]
            with m.If(timer == (1 << self._decay_shift) - 1):
                m.d.sync += sweep_active.eq(1)

        # -- SKIP recovery sweep: every 2**skip_shift cycles, the next epoch and a visit of
        # every entry (the visit clears the SKIP marks that end in this epoch) ---------------
        recover_active = Signal()
        recover_pending = Signal()
        recover_index = Signal(range(words))
        recover_grant = Signal()
        if self._skip_shift is not None:
            recover_timer = Signal(self._skip_shift)
            m.d.sync += recover_timer.eq(recover_timer + 1)
            with m.If(recover_timer == (1 << self._skip_shift) - 1):
                m.d.sync += recover_pending.eq(1)
            with m.If(recover_grant):
                m.d.sync += recover_index.eq(recover_index + 1)
                with m.If(recover_index == words - 1):
                    m.d.sync += [recover_active.eq(0), recover_index.eq(0)]
            with m.If(recover_pending & ~recover_active):
                m.d.sync += [recover_active.eq(1), recover_pending.eq(0),
                             self.skip_epoch.eq(self.skip_epoch + 1)]

        # -- port fate sharing: pending ports, one sweep at a time ----------------------------
        fate_ports = cfg.ports + 1             # ports count from 1 (bit 0 stays clear)
        fate_pending = Signal(fate_ports)
        fate_active = Signal()
        fate_port = Signal(EV_PORT_BITS)
        fate_index = Signal(range(words))
        fate_grant = Signal()
        with m.If(fate_grant):
            m.d.sync += fate_index.eq(fate_index + 1)
            with m.If(fate_index == words - 1):
                m.d.sync += [fate_active.eq(0), fate_index.eq(0)]
        next_found, next_port = first_set(fate_pending, fate_ports)
        cleared = Signal.like(fate_pending)
        m.d.comb += cleared.eq(fate_pending)
        with m.If(~fate_active & next_found):
            m.d.comb += cleared.bit_select(next_port, 1).eq(0)
            m.d.sync += [fate_active.eq(1), fate_port.eq(next_port), fate_index.eq(0),
                         self.fate_sweeps.eq(self.fate_sweeps + 1)]
        m.d.sync += fate_pending.eq(
            cleared
            | Mux(self.fate_trigger_valid,
                  (C(1, fate_ports) << self.fate_trigger_port)[:fate_ports], 0)
            | Mux(self.port_down_valid & (self.port_down_port != 0),
                  (C(1, fate_ports) << self.port_down_port)[:fate_ports], 0))

        # -- arbitration: command > feedback > fate sweep > SKIP recovery > decay sweep ------
        op = Signal(entry_op_layout(cfg))
        op_valid = Signal()
        with m.If(self.ctl_busy):
            m.d.comb += [op_valid.eq(self.ctl_op.valid), op.eq(self.ctl_op.payload)]
        with m.Elif(f2_valid):
            m.d.comb += [
                f2_grant.eq(1), op_valid.eq(1),
                op.op.eq(Mux(f2.kind <= FeedbackKind.PROBE_OK, f2.kind, EntryOp.BAD_KIND)),
                op.profile.eq(f2_binding.profile), op.index.eq(f2.ev),
                op.bound.eq(f2_binding.bound),
            ]
        with m.Elif(fate_active):
            m.d.comb += [
                fate_grant.eq(1), op_valid.eq(1), op.op.eq(EntryOp.FATE), op.bound.eq(1),
                op.port.eq(fate_port),
                op.profile.eq(fate_index[index_bits:]), op.index.eq(fate_index[:index_bits]),
            ]
        with m.Elif(recover_active):
            m.d.comb += [
                recover_grant.eq(1), op_valid.eq(1), op.op.eq(EntryOp.RECOVER),
                op.profile.eq(recover_index[index_bits:]), op.index.eq(recover_index[:index_bits]),
            ]
        with m.Elif(sweep_active):
            m.d.comb += [
                sweep_grant.eq(1), op_valid.eq(1), op.op.eq(EntryOp.DECAY),
                op.profile.eq(sweep_index[index_bits:]), op.index.eq(sweep_index[:index_bits]),
            ]
        m.d.sync += [self.o.valid.eq(op_valid), self.o.payload.eq(op)]

        m.d.comb += self.hold.eq(
            (f1_valid & (f1.kind == FeedbackKind.LOST))
            | (f2_valid & (f2.kind == FeedbackKind.LOST))
            | (self.o.valid & _is_hold_op(self.o.payload.op))
            | fate_active | fate_pending.any())
        return m


class EntryUpdate(wiring.Component):
    """Apply entry operations: read an EV's entry, decide, write it back, raise events.

    Throughput: one operation per cycle (always ready), any mix of entries, including the same
    entry on consecutive cycles. Latency: an operation taken on ``i`` in cycle t is decided in
    cycle t + 2 (``result`` then holds the entry as read, for ENTRY_READ) and its writes commit
    at the end of that cycle.

    Hazards: the entry RAM read (t) misses the write-backs of the two operations ahead, and the
    entry's bitmap bits (read from the profile table in t + 1, which applies a commit a cycle
    after it is made) miss them too: the entry record (state bits, port, penalty) of those two
    is forwarded, newest first. The usable count is read in t + 1, corrected there by the
    change of the operation two ahead and compared with the floor for each change the
    operation just ahead may make; the deciding stage picks the comparison that applies.
    Events enter the event queue, the fate trigger leaves and the counters count one cycle
    after the decision (registered, so no queue or adder hangs off the decision logic).
    ``hold`` is set while a LOST or a fate-sweep visit is in the pipeline; ``busy`` while any
    operation is in it or in the forwarding history (the control clears a profile only when
    it is low).

    Members
    -------
    i : ``In(stream.Signature(entry_op_layout(config), always_ready=True))``
    entry_rd, entry_wr : the entry RAM's ports
    state, params, good, written, denied, high, skip, good_count : ``In``, the profile table
    skip_epoch : ``In(2)``, the SKIP recovery epoch (from the sources)
    commit : ``Out(entry_commit_layout(config))``, to the profile table
    events : ``Out(stream.Signature(path_event_layout(config)))``
    fate_trigger_valid, fate_trigger_port : ``Out``, a LOST's second strike on a port
    result : ``Out(entry_word_layout(config))``, result_skip, result_valid : ``Out(1)``
        The entry of a control operation in the deciding stage, and its SKIP mark.
    hold, busy : ``Out(1)``
    feedback_acked, ..., fate_marked : ``Out(32)`` counters (``ENTRY_COUNTERS``)
    """

    def __init__(self, *, config, event_depth=16):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        self._event_depth = event_depth
        n, evs = config.ev_profiles, config.evs_per_profile
        addr_bits = (entry_words(config) - 1).bit_length()
        members = {
            "i": In(stream.Signature(entry_op_layout(config), always_ready=True)),
            "entry_rd": Out(ReadPort.Signature(addr_width=addr_bits,
                                               shape=entry_word_layout(config))),
            "entry_wr": Out(WritePort.Signature(addr_width=addr_bits,
                                                shape=entry_word_layout(config))),
            "state": In(data.ArrayLayout(unsigned(2), n)),
            "params": In(data.ArrayLayout(profile_params_layout(config), n)),
            "good": In(data.ArrayLayout(unsigned(evs), n)),
            "written": In(data.ArrayLayout(unsigned(evs), n)),
            "denied": In(data.ArrayLayout(unsigned(evs), n)),
            "high": In(data.ArrayLayout(unsigned(evs), n)),
            "skip": In(data.ArrayLayout(unsigned(evs), n)),
            "skip_epoch": In(2),
            "good_count": In(data.ArrayLayout(unsigned(COUNT_BITS), n)),
            "commit": Out(entry_commit_layout(config)),
            "events": Out(stream.Signature(path_event_layout(config))),
            "fate_trigger_valid": Out(1),
            "fate_trigger_port": Out(EV_PORT_BITS),
            "result": Out(entry_word_layout(config)),
            "result_skip": Out(1),
            "result_valid": Out(1),
            "hold": Out(1),
            "busy": Out(1),
        }
        members.update({name: Out(32) for name in ENTRY_COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n_profiles = cfg.ev_profiles
        profile_bits, index_bits = cfg.profile_bits, cfg.ev_index_bits
        record = data.StructLayout({
            "good": 1, "denied": 1, "written": 1, "high": 1, "skip": 1,
            "port": EV_PORT_BITS, "penalty": PENALTY_BITS, "skip_epoch": 2})
        key = {"profile": profile_bits, "index": index_bits}
        history = data.StructLayout({"valid": 1, **key, "record": record})
        # The operation decoded in e2, so that e3 only combines registered flags with the
        # forwarded entry.
        kinds = data.StructLayout({name: 1 for name in _KINDS})
        # Whether the usable count stays above the floor after a loss, for each change the
        # operation just ahead may make to it (it reaches the profile table too late for e2).
        floor = data.StructLayout({"if_ahead_lost_one": 1, "if_ahead_gained_one": 1,
                                   "if_ahead_kept": 1})
        e2 = Signal(data.StructLayout({"valid": 1, "op": entry_op_layout(cfg)}))
        e3 = Signal(data.StructLayout({
            "valid": 1, "op": entry_op_layout(cfg), "stored": record,
            "from_prev": 1, "from_prev2": 1, "kind": kinds, "applies": 1,
            "increment": PENALTY_BITS, "floor": floor, "recovery": 1, "fate": 1,
            "state_good": 1, "state_denied": 1, "state_assumed_bad": 1}))
        prev = Signal(history)
        prev2 = Signal(history)
        # The commit made in the previous cycle (the profile table applies it in this one).
        last = Signal(entry_commit_layout(cfg))
        m.d.sync += last.eq(self.commit)

        m.submodules.event_fifo = event_fifo = fifo.SyncFIFOBuffered(
            width=path_event_layout(cfg).size, depth=self._event_depth)
        m.d.comb += [
            self.events.valid.eq(event_fifo.r_rdy),
            self.events.payload.eq(event_fifo.r_data),
            event_fifo.r_en.eq(self.events.ready),
        ]

        # -- e1: address the entry RAM --------------------------------------------------------
        m.d.comb += [self.entry_rd.addr.eq(Cat(self.i.payload.index, self.i.payload.profile)),
                     self.entry_rd.en.eq(1)]
        m.d.sync += [e2.valid.eq(self.i.valid), e2.op.eq(self.i.payload)]

        # -- e2: register the entry, its bitmap bits, its profile and the decoded operation ---
        profile, index, op = e2.op.profile, e2.op.index, e2.op.op
        bits = {name: choose(m, [getattr(self, name)[p] for p in range(n_profiles)], profile,
                             f"e2_{name}").bit_select(index, 1)
                for name in ("good", "denied", "written", "high", "skip")}
        state = choose(m, [self.state[p] for p in range(n_profiles)], profile, "e2_state")
        num_evs = choose(m, [self.params[p].num_evs for p in range(n_profiles)], profile,
                         "e2_num_evs")
        min_active = choose(m, [self.params[p].min_active for p in range(n_profiles)],
                            profile, "e2_min_active")
        recovery = choose(m, [self.params[p].recovery for p in range(n_profiles)], profile,
                          "e2_recovery")
        fate = choose(m, [self.params[p].fate for p in range(n_profiles)], profile, "e2_fate")
        good_count = choose(m, [self.good_count[p] for p in range(n_profiles)], profile,
                            "e2_good_count")
        # The usable count as the profile table will hold it once it has applied ``last``
        # (one change of -1, 0 or +1), against the floor: one subtraction, then comparisons
        # of the difference with small constants, chosen by that change.
        last_here = last.valid & (last.profile == profile)
        last_lost = last_here & last.was_good & ~last.good
        last_gained = last_here & ~last.was_good & last.good
        margin = Signal(signed(COUNT_BITS + 2))       # good_count - min_active
        m.d.comb += margin.eq(good_count - min_active)

        def usable_above(k):
            """The corrected usable count exceeds min_active + k (k = -1 .. 1)."""
            return Mux(last_lost, margin > k + 1, Mux(last_gained, margin > k - 1, margin > k))
        decoded = {
            "acked": op == EntryOp.ACKED, "ecn": op == EntryOp.ECN,
            "trimmed": op == EntryOp.TRIMMED, "lost": op == EntryOp.LOST,
            "probe_ok": op == EntryOp.PROBE_OK, "decay": op == EntryOp.DECAY,
            "write": op == EntryOp.WRITE, "set_state": op == EntryOp.SET_STATE,
            "bad_kind": op == EntryOp.BAD_KIND, "fate": op == EntryOp.FATE,
            "recover": op == EntryOp.RECOVER,
            "feedback": op <= EntryOp.PROBE_OK,
            "control": (op >= EntryOp.WRITE) & (op <= EntryOp.READ),
        }
        m.d.sync += [
            e3.valid.eq(e2.valid), e3.op.eq(e2.op),
            e3.stored.port.eq(self.entry_rd.data.port),
            e3.stored.penalty.eq(self.entry_rd.data.penalty),
            e3.stored.skip_epoch.eq(self.entry_rd.data.skip_epoch),
            *(getattr(e3.stored, name).eq(bit) for name, bit in bits.items()),
            e3.from_prev.eq(e3.valid & (e3.op.profile == profile) & (e3.op.index == index)),
            e3.from_prev2.eq(prev.valid & (prev.profile == profile) & (prev.index == index)),
            *(getattr(e3.kind, name).eq(value) for name, value in decoded.items()),
            e3.applies.eq(e2.op.bound & (state == ProfileState.ONLINE) & (index < num_evs)),
            e3.increment.eq(Mux(op == EntryOp.ECN, PENALTY_ECN,
                                Mux(op == EntryOp.TRIMMED, PENALTY_TRIMMED, PENALTY_LOST))),
            e3.floor.if_ahead_lost_one.eq(usable_above(1)),
            e3.floor.if_ahead_gained_one.eq(usable_above(-1)),
            e3.floor.if_ahead_kept.eq(usable_above(0)),
            e3.recovery.eq(recovery), e3.fate.eq(fate),
            e3.state_good.eq(e2.op.state == EvState.GOOD),
            e3.state_denied.eq(e2.op.state == EvState.DENIED),
            e3.state_assumed_bad.eq(e2.op.state == EvState.ASSUMED_BAD),
        ]

        # -- e3: forward, decide, write back --------------------------------------------------
        cur = Signal(record)
        m.d.comb += cur.eq(Mux(e3.from_prev, prev.record,
                               Mux(e3.from_prev2, prev2.record, e3.stored)))
        new = Signal(record)
        commit = Signal()
        event_valid = Signal()
        event = Signal(path_event_layout(cfg))
        m.d.comb += [event.profile.eq(e3.op.profile), event.index.eq(e3.op.index),
                     event.port.eq(cur.port)]
        self._decide(m, e3, last, cur, new, commit, event_valid, event)

        m.d.comb += [
            self.entry_wr.en.eq(commit),
            self.entry_wr.addr.eq(Cat(e3.op.index, e3.op.profile)),
            self.entry_wr.data.penalty.eq(new.penalty),
            self.entry_wr.data.port.eq(new.port),
            self.entry_wr.data.skip_epoch.eq(new.skip_epoch),
            self.commit.valid.eq(commit), self.commit.profile.eq(e3.op.profile),
            self.commit.index.eq(e3.op.index),
            self.commit.good.eq(new.good), self.commit.denied.eq(new.denied),
            self.commit.written.eq(new.written), self.commit.high.eq(new.high),
            self.commit.skip.eq(new.skip),
            self.commit.was_good.eq(cur.good),
            self.commit.was_fresh.eq(cur.good & ~cur.skip),
            self.commit.was_low.eq(cur.good & ~cur.high & ~cur.skip),
            self.result.port.eq(cur.port), self.result.penalty.eq(cur.penalty),
            self.result.skip_epoch.eq(cur.skip_epoch), self.result_skip.eq(cur.skip),
            self.result_valid.eq(e3.valid & e3.kind.control),
        ]
        m.d.sync += [prev.valid.eq(e3.valid), prev.profile.eq(e3.op.profile),
                     prev.index.eq(e3.op.index), prev.record.eq(new), prev2.eq(prev)]

        # Events enter the queue a cycle after the decision, from a register, so that the
        # queue's level logic does not hang off the decision.
        staged_valid = Signal()
        staged = Signal(path_event_layout(cfg))
        m.d.sync += [staged_valid.eq(event_valid), staged.eq(event)]
        m.d.comb += [event_fifo.w_en.eq(staged_valid), event_fifo.w_data.eq(staged)]
        with m.If(staged_valid & ~event_fifo.w_rdy):
            m.d.sync += self.events_dropped.eq(self.events_dropped + 1)

        m.d.comb += [
            # A registered fate trigger reaches the fate sweep's pending ports a cycle after
            # the LOST left e3: selection is held meanwhile too.
            self.hold.eq((e2.valid & _is_hold_op(e2.op.op)) | (e3.valid & _is_hold_op(e3.op.op))
                         | self.fate_trigger_valid),
            self.busy.eq(self.i.valid | e2.valid | e3.valid | prev.valid | prev2.valid),
        ]
        return m

    def _decide(self, m, e3, last, cur, new, commit, event_valid, event):
        """The rules: what each operation does to the entry ``cur``. Every counter counts a
        registered pulse (a cycle after the decision), so no adder hangs off the decision."""
        kind, valid = e3.kind, e3.valid
        # The profile table applies a commit a cycle after it leaves here: the usable count
        # e2 read misses the change of the operation just ahead, chosen here.
        last_here = last.valid & (last.profile == e3.op.profile)
        above_floor = Mux(last_here & last.was_good & ~last.good, e3.floor.if_ahead_lost_one,
                          Mux(last_here & ~last.was_good & last.good,
                              e3.floor.if_ahead_gained_one, e3.floor.if_ahead_kept))
        applies = Signal()
        m.d.comb += applies.eq(e3.applies & cur.written)
        assumed_bad = cur.written & ~cur.good & ~cur.denied
        auto_recovery = e3.recovery == ProbeRecovery.AUTO

        lost_takes = Signal()           # a LOST turns a GOOD EV ASSUMED_BAD
        lost_penalised = Signal()       # the floor turns it into a penalty instead
        fate_takes = Signal()           # the fate sweep turns a GOOD EV of its port bad
        probe_answered = Signal()       # a PROBE_OK on an ASSUMED_BAD EV
        recovers = Signal()             # ... that brings it back (AUTO recovery)
        skip_marks = Signal()           # ECN or a trim on a GOOD EV: SKIP (MRC 1.0)
        skip_ends = Signal()            # the recovery sweep clears a mark that ends now
        stores = kind.write | kind.set_state
        m.d.comb += [
            lost_takes.eq(valid & kind.lost & applies & cur.good & above_floor),
            lost_penalised.eq(valid & kind.lost & applies & cur.good & ~above_floor),
            fate_takes.eq(valid & kind.fate & applies & e3.fate & cur.good
                          & (cur.port == e3.op.port) & above_floor),
            probe_answered.eq(valid & kind.probe_ok & applies & assumed_bad),
            recovers.eq(probe_answered & auto_recovery),
            skip_marks.eq(valid & (kind.ecn | kind.trimmed) & applies & cur.good),
            skip_ends.eq(valid & kind.recover & cur.skip & (cur.skip_epoch == self.skip_epoch)),
            commit.eq(valid & (((kind.acked | kind.ecn | kind.trimmed) & applies)
                               | (kind.lost & applies & cur.good) | fate_takes | recovers
                               | kind.decay | stores) | skip_ends),
        ]

        # The penalty: a saturating add (ECN, TRIMMED, a LOST the floor keeps), a saturating
        # decrement (ACKED), a halving (DECAY), zero (WRITE), or unchanged.
        total = Signal(PENALTY_BITS + 1)
        m.d.comb += total.eq(cur.penalty + e3.increment)
        added = Mux(total[PENALTY_BITS], PENALTY_MAX, total[:PENALTY_BITS])
        decremented = Mux(cur.penalty > PENALTY_ACKED, cur.penalty - PENALTY_ACKED, 0)
        adds = ((kind.ecn | kind.trimmed) & applies) | lost_penalised
        m.d.comb += [
            new.penalty.eq(Mux(adds, added,
                               Mux(kind.acked & applies, decremented,
                                   Mux(kind.decay, cur.penalty >> 1,
                                       Mux(kind.write, 0, cur.penalty))))),
            new.port.eq(Mux(kind.write, e3.op.port, cur.port)),
            new.written.eq(cur.written | kind.write),
            new.denied.eq(Mux(stores, e3.state_denied, cur.denied)),
            new.good.eq(Mux(stores, e3.state_good,
                            Mux(lost_takes | fate_takes, 0, Mux(recovers, 1, cur.good)))),
            # Only a commit changes the table: otherwise the record forwarded is the one read.
            new.high.eq(Mux(commit, new.penalty >= PENALTY_HIGH, cur.high)),
            # SKIP is a mark on a GOOD EV: set by ECN or a trim (to end two epochs on), cleared
            # by the recovery sweep of that epoch and whenever the EV's state is written or it
            # leaves GOOD.
            new.skip.eq(Mux(stores | lost_takes | fate_takes | skip_ends, 0,
                            Mux(skip_marks, 1, cur.skip))),
            new.skip_epoch.eq(Mux(skip_marks, (self.skip_epoch + 2)[:2], cur.skip_epoch)),
        ]

        m.d.comb += [
            event_valid.eq(lost_takes | fate_takes | probe_answered
                           | (valid & kind.set_state
                              & ((cur.good & e3.state_assumed_bad)
                                 | (assumed_bad & e3.state_good)))),
            event.state.eq(Mux(kind.set_state, e3.op.state,
                               Mux(recovers, EvState.GOOD, EvState.ASSUMED_BAD))),
            event.probe_ok.eq(probe_answered & ~auto_recovery),
        ]

        # Port fate sharing: a LOST that takes an EV out strikes its port; a second one while
        # the strike stands triggers the sweep (registered: the sweep starts a cycle later,
        # and ``hold`` covers that cycle); an EV of the port brought back clears the strike.
        fate_ports = self._config.ports + 1
        fate_strike = Signal(fate_ports)
        strike_onehot = (C(1, fate_ports) << cur.port)[:fate_ports]
        strike_hit = (fate_strike & strike_onehot).any()
        strike_set = lost_takes & e3.fate & ~strike_hit
        strike_clear = (lost_takes & e3.fate & strike_hit) | recovers
        m.d.sync += fate_strike.eq(Mux(strike_set, fate_strike | strike_onehot,
                                       Mux(strike_clear, fate_strike & ~strike_onehot,
                                           fate_strike)))
        m.d.sync += [self.fate_trigger_valid.eq(lost_takes & e3.fate & strike_hit),
                     self.fate_trigger_port.eq(cur.port)]

        # Counters, from registered pulses.
        state_changed = commit & cur.written & ~kind.write & (
            (new.good != cur.good) | (new.denied != cur.denied))
        pulses = [
            ("feedback_acked", valid & kind.acked),
            ("feedback_ecn", valid & kind.ecn),
            ("feedback_trimmed", valid & kind.trimmed),
            ("feedback_lost", valid & kind.lost),
            ("feedback_probe_ok", valid & kind.probe_ok),
            ("feedback_ignored", valid & ((kind.feedback & ~applies) | kind.bad_kind)),
            ("fate_marked", fate_takes),
            ("state_changes", state_changed),
            ("skips", skip_marks & ~cur.skip),
            ("skip_recoveries", skip_ends),
        ]
        for name, pulse in pulses:
            counter = getattr(self, name)
            counted = Signal(name=f"{name}_pulse")
            m.d.sync += [counted.eq(pulse), counter.eq(counter + counted)]
