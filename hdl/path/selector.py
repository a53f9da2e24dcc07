"""The selector: one send request per cycle, pipelined read, decide, write-back of the QP's
rotation pointer.

::

    S0 accept (a credit for the output queue), address the binding RAM (qpn)
    S1 binding RAM data lands in a register (no logic on the RAM's clock-to-out); the probe's
       EV is looked up in every profile's written and denied bitmaps; avoid_ev decoded
    S2 profile state and mode, the profile's candidate set, the avoid mask, probe check
    S3 eligible set (avoid applied), "above the first eligible" (the wrap-around pick),
       forwarding matches and the forwarded pointer mask of the ops 2..5 ahead
    S4 the pick: first eligible at or after the pointer mask, wrapping; next pointer mask
    S5 encode the pick, write the pointer back; the decision enters the output queue
    S6 queue head addresses the fields RAM; output register (the only stage ``o`` stalls)

The rotation pointer travels as a thermometer mask (the EVs at or after it), so S4, the only
loop (pointer of one request -> pick -> pointer of the next request of the same QP), is an
AND, one carry chain (``x - 1`` gives the bits above the lowest set bit) and a mux, with no
priority encoder: the bits strictly above the pick are the next pointer mask.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..interfaces import path_decision_layout, path_request_layout
from ..protocol import EvMode, ProfileState
from ..util import as_signal, validating
from .pathdefs import (
    binding_layout,
    choose,
    entry_words,
    fields_word_layout,
    profile_params_layout,
)

__all__ = ["Selector"]


def _above_lowest(m, value, name):
    """(above, none): the bits strictly above the lowest set bit of ``value`` and whether no
    bit is set, from ``value - 1`` (a carry chain, the fastest wide logic on an FPGA):
    subtracting 1 flips the lowest set bit and every bit below it, and borrows out only
    from zero."""
    width = len(value)
    minus_one = Signal(width + 1, name=f"{name}_minus_one")
    m.d.comb += minus_one.eq(Cat(value, C(0, 1)) - 1)
    above = Signal(width, name=f"{name}_above")
    m.d.comb += above.eq(~(value ^ minus_one[:width]))
    return above, minus_one[width]

#: Ops ahead of a request whose pointer write-back its binding read can miss (S1 .. S5).
FORWARD_DEPTH = 5
#: Cycles from accepting a request to its decision on ``o`` (with ``o`` ready).
SELECT_LATENCY = 7
#: Decisions the output queue holds: enough for one request per cycle with ``o`` ready.
QUEUE_DEPTH = 12


class Selector(wiring.Component):
    """Pick an EV for each send request: rotation over the usable EVs of the QP's profile.

    Throughput: one request per cycle, sustained, with any mix of QPs, including the same QP
    on consecutive cycles. Latency: the decision is on ``o`` seven cycles after the request
    is accepted (``SELECT_LATENCY``). S0..S5 never stall: ``i.ready`` is a free place in the
    output queue (``QUEUE_DEPTH`` credits, enough for full rate) and not ``hold``; ``o``
    backpressure stalls only the output stage. Decisions are made late: while ``o`` is
    stalled (it was not ready in the previous cycle) a request is accepted only when no
    decision is in S0..S5 or the queue, so at most two decisions wait for a busy consumer and
    neither goes out long after the EV states it was made against changed.

    Hazards: a request's binding read (S0) misses the pointer write-backs (S5) of the up to
    five requests ahead of it; S3 and S4 forward their pointer masks (newest first), so
    back-to-back requests of one QP get successive rotation positions. The candidate sets are
    read in S2 (the written and denied bitmaps in S1, a cycle before the candidate sets that
    are registered from them): a request accepted in cycle t sees every entry update that
    reached the profile table's candidate sets by cycle t + 2. The binding write port is
    shared with the
    control (QP_PROFILE), which writes only while ``hold`` is set and ``idle`` (nothing in
    S1..S5 nor in the forwarding history), so no forwarded mask can be stale.

    Parameters
    ----------
    config : NicConfig
    context : shape-castable or None
        Carried from a request to its decision unchanged.

    Members
    -------
    i : ``In(stream.Signature(path_request_layout(config, context)))``
    o : ``Out(stream.Signature(path_decision_layout(config, context)))``
    hold : ``In(1)``, no new requests (control, LOST and fate-sweep ordering)
    idle : ``Out(1)``, no request before S6 nor in the forwarding history
    binding_rd, binding_wr : the binding RAM's selection read port and write-back port
    fields_rd : the fields RAM's read port
    state, params, written, denied, candidates, candidates_any : ``In``, the profile table
    decisions, no_path : ``Out(32)`` counters
    """

    def __init__(self, *, config, context=None):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        self._context = context
        n, evs = config.ev_profiles, config.evs_per_profile
        entry_addr_bits = (entry_words(config) - 1).bit_length()
        super().__init__({
            "i": In(stream.Signature(path_request_layout(config, context))),
            "o": Out(stream.Signature(path_decision_layout(config, context))),
            "hold": In(1),
            "idle": Out(1),
            "binding_rd": Out(ReadPort.Signature(addr_width=config.qpn_bits,
                                                 shape=binding_layout(config))),
            "binding_wr": Out(WritePort.Signature(addr_width=config.qpn_bits,
                                                  shape=binding_layout(config))),
            "fields_rd": Out(ReadPort.Signature(addr_width=entry_addr_bits,
                                                shape=fields_word_layout(config))),
            "state": In(data.ArrayLayout(unsigned(2), n)),
            "params": In(data.ArrayLayout(profile_params_layout(config), n)),
            "written": In(data.ArrayLayout(unsigned(evs), n)),
            "denied": In(data.ArrayLayout(unsigned(evs), n)),
            "candidates": In(data.ArrayLayout(unsigned(evs), n)),
            "candidates_any": In(n),
            "decisions": Out(32),
            "no_path": Out(32),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n_evs, n_profiles = cfg.evs_per_profile, cfg.ev_profiles
        index_bits, qpn_bits, profile_bits = cfg.ev_index_bits, cfg.qpn_bits, cfg.profile_bits
        ctx_shape = self._context

        def stage(name, fields):
            layout = {"valid": 1, "qpn": qpn_bits, **fields}
            if ctx_shape is not None:
                layout["context"] = ctx_shape
            return Signal(data.StructLayout(layout), name=name)

        request = {"avoid_ev_valid": 1, "avoid_ev": index_bits, "probe": 1, "ev": index_bits}
        s1 = stage("s1", request)
        s2 = stage("s2", {**request, "binding": binding_layout(cfg),
                          "probe_usable": n_profiles, "avoid_onehot": n_evs})
        decided = {"probe": 1, "ev": index_bits, "profile": profile_bits, "no_path": 1,
                   "advances": 1}
        s3 = stage("s3", {**decided, "avoid_ev_valid": 1, "candidates": n_evs,
                          "avoided": n_evs, "stored_mask": n_evs})
        s4 = stage("s4", {**decided, "eligible": n_evs, "wrap_above": n_evs,
                          "from_prev": 1, "forwarded_mask": n_evs})
        s5 = stage("s5", {**decided, "above": n_evs, "mask": n_evs})
        queued = data.StructLayout({"qpn": qpn_bits, "ev": index_bits, "no_path": 1,
                                    "profile": profile_bits,
                                    **({"context": ctx_shape} if ctx_shape is not None else {})})
        s6 = Signal(data.StructLayout({"valid": 1, "decision": queued}), name="s6")
        # The pointer masks of the ops that left S5, newest first (the writes a read misses).
        history_layout = data.StructLayout({"valid": 1, "qpn": qpn_bits, "mask": n_evs})
        history = [Signal(history_layout, name=f"history{k}")
                   for k in range(1, FORWARD_DEPTH - 1)]

        # S0..S5 never stall: a request is accepted only with a place for its decision in
        # the queue (a credit), so backpressure on ``o`` stops at the queue and the output
        # stage instead of fanning out to every pipeline register.
        # Decide late while ``o`` waits: a decision is made against the EV states of the cycle
        # it is decided in, and one that waits in the queue for a busy consumer (a transmitter
        # streaming a frame) goes out with states that may have changed since (an EV taken out
        # by a LOST or a port sweep). So the queue fills only while ``o`` flows (it took, or
        # could take, a decision in the previous cycle): then one request per cycle needs the
        # credits. While ``o`` is stalled a request is accepted only when no decision is in
        # S0..S5 or in the queue, so at most two wait for the consumer (S6 and one behind).
        m.submodules.queue = queue = fifo.SyncFIFO(width=queued.size, depth=QUEUE_DEPTH)
        credits = Signal(range(QUEUE_DEPTH + 1), init=QUEUE_DEPTH)
        flowing = Signal(init=1)
        m.d.sync += flowing.eq(self.o.ready)
        take = Signal()
        m.d.comb += [
            self.i.ready.eq((credits != 0) & (flowing | (credits == QUEUE_DEPTH))
                            & ~self.hold),
            # S6 has written its pointer back already: it may wait for ``o``.
            self.idle.eq(~Cat(s1.valid, s2.valid, s3.valid, s4.valid, s5.valid,
                              *(h.valid for h in history)).any()),
        ]

        def carry(dst, src):
            statements = [dst.qpn.eq(src.qpn)]
            if ctx_shape is not None:
                statements.append(dst.context.eq(src.context))
            return statements

        # -- S0: accept, address the binding RAM ---------------------------------------------
        m.d.comb += self.binding_rd.addr.eq(self.i.payload.qpn)
        m.d.sync += [s1.valid.eq(self.i.valid & self.i.ready)] + carry(s1, self.i.payload)
        m.d.sync += [getattr(s1, f).eq(getattr(self.i.payload, f)) for f in request]

        # -- S1: register the binding; the probe's EV in every profile, the avoided EV ---------
        # (Read a cycle before the candidate sets, the written and denied bitmaps are as old
        # as the candidate sets S2 reads: those are registered from the bitmaps.)
        m.d.sync += [s2.valid.eq(s1.valid), s2.binding.eq(self.binding_rd.data)]
        m.d.sync += carry(s2, s1) + [getattr(s2, f).eq(getattr(s1, f)) for f in request]
        m.d.sync += [
            s2.probe_usable.eq(Cat(*(self.written[p].bit_select(s1.ev, 1)
                                     & ~self.denied[p].bit_select(s1.ev, 1)
                                     for p in range(n_profiles)))),
            s2.avoid_onehot.eq((C(1, n_evs) << s1.avoid_ev)[:n_evs]),
        ]

        # -- S2: profile, candidates, probe check ---------------------------------------------
        binding = s2.binding
        profile = binding.profile
        profile_state = choose(m, [self.state[p] for p in range(n_profiles)], profile,
                               "sel_state")
        mode = choose(m, [self.params[p].mode for p in range(n_profiles)], profile,
                      "sel_mode")
        candidates = choose(m, [self.candidates[p] for p in range(n_profiles)], profile,
                            "sel_candidates")
        candidates_any = self.candidates_any.bit_select(profile, 1)
        probe_ok = s2.probe_usable.bit_select(profile, 1)
        no_path = Signal()
        m.d.comb += no_path.eq(~binding.bound | (profile_state != ProfileState.ONLINE)
                               | Mux(s2.probe, ~probe_ok, ~candidates_any))
        m.d.sync += carry(s3, s2) + [
            s3.valid.eq(s2.valid), s3.probe.eq(s2.probe), s3.ev.eq(s2.ev),
            s3.profile.eq(profile), s3.no_path.eq(no_path),
            s3.advances.eq(~s2.probe & ~no_path & (mode != EvMode.AUTO)),
            s3.avoid_ev_valid.eq(s2.avoid_ev_valid),
            s3.candidates.eq(candidates),
            s3.avoided.eq(candidates & ~s2.avoid_onehot),
            # The EVs at or after the pointer: a comparison with a constant per EV (a
            # shifter would be six levels of multiplexers).
            s3.stored_mask.eq(Cat(*(binding.pointer <= i for i in range(n_evs)))),
        ]

        # -- S3: eligible set, wrap-around pick, forwarding -----------------------------------
        avoided_above, avoided_none = _above_lowest(m, s3.avoided, "avoided")
        candidates_above, _ = _above_lowest(m, s3.candidates, "candidates")
        use_avoided = s3.avoid_ev_valid & ~avoided_none
        # When this op reaches S4, the op now in S4 is in S5 (``from_prev``); the ops now in
        # S5 and the history are one further along: their masks are final, so they are
        # chosen here, newest first.
        forwarded = s3.stored_mask
        for older in reversed([s5, *history]):
            forwarded = Mux(older.valid & (older.qpn == s3.qpn), older.mask, forwarded)
        m.d.sync += carry(s4, s3) + [
            s4.valid.eq(s3.valid), s4.probe.eq(s3.probe), s4.ev.eq(s3.ev),
            s4.profile.eq(s3.profile), s4.no_path.eq(s3.no_path),
            s4.advances.eq(s3.advances),
            s4.eligible.eq(Mux(use_avoided, s3.avoided, s3.candidates)),
            s4.wrap_above.eq(Mux(use_avoided, avoided_above, candidates_above)),
            s4.from_prev.eq(s4.valid & (s4.qpn == s3.qpn)),
            s4.forwarded_mask.eq(forwarded),
        ]

        # -- S4: the pick (the loop: mask -> pick -> next mask) -------------------------------
        mask = Mux(s4.from_prev, s5.mask, s4.forwarded_mask)
        at_or_after = Signal(n_evs)
        m.d.comb += at_or_after.eq(s4.eligible & mask)
        after_above, none_after = _above_lowest(m, at_or_after, "after")
        # The EVs strictly above the pick: above the first eligible at or after the pointer,
        # or, when there is none, above the first eligible (the rotation wraps).
        above = Signal(n_evs)
        m.d.comb += above.eq(after_above | Mux(none_after, s4.wrap_above, 0))
        m.d.sync += carry(s5, s4) + [
            s5.valid.eq(s4.valid), s5.probe.eq(s4.probe), s5.ev.eq(s4.ev),
            s5.profile.eq(s4.profile), s5.no_path.eq(s4.no_path),
            s5.advances.eq(s4.advances), s5.above.eq(above),
            s5.mask.eq(Mux(s4.advances, above, mask)),
        ]
        m.d.sync += history[0].eq(Cat(s5.valid, s5.qpn, s5.mask))
        for newer, older in zip(history, history[1:], strict=False):
            m.d.sync += older.eq(newer)

        # -- S5: encode the pick, write the pointer back, address the fields RAM -------------
        # The pick is the highest EV not above it; the pointer moves one past it (wrapping at
        # 2**index_bits as the index does).
        pick_onehot = as_signal(m, Cat(*(~s5.above[i] & (s5.above[i + 1] if i + 1 < n_evs else 1)
                                         for i in range(n_evs))), "pick_onehot")
        pick = Signal(index_bits)
        next_pointer = Signal(index_bits)
        m.d.comb += [
            pick.eq(Cat(*(Cat(*(pick_onehot[i] for i in range(n_evs) if i >> b & 1)).any()
                          for b in range(index_bits)))),
            next_pointer.eq(Cat(*(Cat(*(pick_onehot[i] for i in range(n_evs)
                                        if (i + 1) >> b & 1 and i + 1 < 1 << index_bits)).any()
                                  for b in range(index_bits)))),
        ]
        chosen = Signal(index_bits)
        m.d.comb += chosen.eq(Mux(s5.probe, s5.ev, Mux(s5.no_path, 0, pick)))
        m.d.comb += [
            self.binding_wr.en.eq(s5.valid & s5.advances),
            self.binding_wr.addr.eq(s5.qpn),
            self.binding_wr.data.bound.eq(1),
            self.binding_wr.data.profile.eq(s5.profile),
            self.binding_wr.data.pointer.eq(next_pointer),
        ]
        m.d.comb += [
            queue.w_en.eq(s5.valid),
            queue.w_data.eq(Cat(s5.qpn, chosen, s5.no_path, s5.profile,
                                *([s5.context] if ctx_shape is not None else []))),
        ]
        with m.If(s5.valid):
            m.d.sync += [self.decisions.eq(self.decisions + 1),
                         self.no_path.eq(self.no_path + s5.no_path)]

        # -- S6: read the fields RAM, output register -----------------------------------------
        head = Signal(queued)
        m.d.comb += [
            head.eq(queue.r_data),
            take.eq(~s6.valid | self.o.ready),
            queue.r_en.eq(take),
            self.fields_rd.addr.eq(Cat(head.ev, head.profile)),
            self.fields_rd.en.eq(take),
        ]
        with m.If(take):
            m.d.sync += [s6.valid.eq(queue.r_rdy), s6.decision.eq(head)]
        m.d.sync += credits.eq(credits - (self.i.valid & self.i.ready)
                               + (take & queue.r_rdy))
        decision = s6.decision
        m.d.comb += [
            self.o.valid.eq(s6.valid),
            self.o.payload.qpn.eq(decision.qpn),
            self.o.payload.no_path.eq(decision.no_path),
            self.o.payload.ev.eq(decision.ev),
        ]
        with m.If(~decision.no_path):
            m.d.comb += [
                self.o.payload.port.eq(self.fields_rd.data.port),
                self.o.payload.fields.eq(self.fields_rd.data.fields),
            ]
        if ctx_shape is not None:
            m.d.comb += self.o.payload.context.eq(decision.context)
        return m
