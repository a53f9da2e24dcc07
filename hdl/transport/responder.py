"""The responder: receive window, validation, placement, SACK/NACK/NAK generation, completions.

One :class:`Responder` serves every QP of the NIC. Per-QP state lives in block RAM tables
indexed by the QP number; a two-stage pipeline (issue: the tables are read; execute: the
packet is classified, the tables are written) takes one packet per cycle, including packets of
the same QP back to back: every table read port is transparent to its write port, which is
the forwarding of the pending write around the one-cycle read latency. ``docs/responder.md``
explains the rules, the tables and their cost.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import CompletionSide, completion_layout, place_beat_layout
from ..packet.headers import PORT_BITS, PacketKind, packet_beat_layout
from ..util import as_signal, below_mask, onehot, shift_left, shift_right, validating
from .resp_defs import (
    ACK_HOP_LIMIT,
    ACK_TCLASS,
    DEFAULT_ACK_DELAY,
    DEFAULT_ACK_EVERY,
    DEFAULT_NAK_INTERVAL,
    GAP_DEPTH_BITS,
    OOO_COUNT_MAX,
    PD_BITS,
    RCVD_BYTES_BITS,
    RESPONDER_COUNTERS,
    VERDICT_NACK,
    VERDICT_NAK,
    ResponderCommand,
    ResponderVerdict,
    responder_command_layout,
    responder_response_layout,
)

__all__ = ["Responder", "ResponderVerdict", "ResponderCommand", "responder_command_layout",
           "responder_response_layout", "responder_counters_layout", "responder_tables"]


def responder_counters_layout():
    return data.StructLayout({name: unsigned(32) for name in RESPONDER_COUNTERS})


def _layouts(config, mr_slots):
    window = config.window_psns
    pos_bits = max(1, ceil_log2(window))
    qp = data.StructLayout({
        "state": 3, "remote_qpn": 24, "pd": PD_BITS, "mpr": 4, "caps": 3, "max_wimm": 8,
        "epsn": 24,                 # expected PSN: cumulative PSN + 1
        "epos": pos_bits,           # where epsn sits in the circular bitmaps
        "msn": 24, "ack_count": 8, "nak_armed": 1, "last_nak": 32,
        "above": range(window + 1),  # PSNs received above the expected one (set rcv bits)
        "rcvd_bytes": RCVD_BYTES_BITS,  # payload bytes placed, modulo 2**24 (CC_STATE)
    })
    bitmaps = data.StructLayout({"rcv": window, "last": window, "wimm": window})
    wimm_entry = data.StructLayout({"valid": 1, "pos": pos_bits, "imm": 32})
    wimm_row = data.ArrayLayout(wimm_entry, config.max_wimm)
    mr = data.StructLayout({"valid": 1, "rkey": 32, "pd": PD_BITS, "base": 64, "length": 64})
    template = data.StructLayout({
        "port": PORT_BITS, "eth_src": 48, "eth_dst": 48, "vlan_valid": 1, "vlan_tci": 16,
        "ipv6": 1, "ip_src": 128, "ip_dst": 128, "flow_label": 20, "udp_sport": 16,
        "psn": 24, "tx_ts": P.TIMESTAMP_BITS, "ce": 1,
    })
    timer = data.StructLayout({"deadline": 32, "qpn": config.qpn_bits, "template": template})
    return qp, bitmaps, wimm_row, mr, template, timer


def responder_tables(config, *, mr_slots=16, timers=16, completions=8):
    """``{name: (width_bits, depth)}`` of every RAM and FIFO of a :class:`Responder`, for the
    block RAM budget (``docs/responder.md``)."""
    qp, bitmaps, wimm_row, mr, _template, timer = _layouts(config, mr_slots)
    return {
        "qp_table": (qp.size, config.qps),
        "bitmaps": (bitmaps.size, config.qps),
        "wimm_table": (wimm_row.size, config.qps),
        "mr_table": (mr.size, mr_slots),
        "ack_timers": (timer.size, timers + 1),
        "completion_fifo": (completion_layout(config).size, completions),
    }


def _popcount(bits):
    values = [bits[i] for i in range(len(bits))]
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def _or_all(values):
    result = values[0]
    for value in values[1:]:
        result = result | value
    return result


def _lowest_set(m, bits, name):
    """Index of the lowest set bit of ``bits``, or ``len(bits)`` when none is.

    A log-depth tree of (found, index) pairs: no carry chain (``x & -x`` would be one wide
    adder, slow to place and slow to elaborate)."""
    width = len(bits)
    index_bits = max(1, ceil_log2(width + 1))
    if not isinstance(bits, Signal):
        bits = as_signal(m, bits, f"{name}_bits")       # each bit is read below
    nodes = [(bits[i], C(0, index_bits)) for i in range(width)]
    span = 1
    while len(nodes) > 1:
        merged = []
        for k in range(0, len(nodes), 2):
            if k + 1 == len(nodes):
                merged.append(nodes[k])
                continue
            (found_lo, index_lo), (found_hi, index_hi) = nodes[k], nodes[k + 1]
            # Signals, not expressions: each is read twice by the next level, and an
            # expression would be lowered once per read (doubling per level).
            found = Signal(name=f"{name}_f{span}_{k}")
            index = Signal(index_bits, name=f"{name}_i{span}_{k}")
            m.d.comb += [found.eq(found_lo | found_hi),
                         index.eq(Mux(found_lo, index_lo, index_hi | C(span, index_bits)))]
            merged.append((found, index))
        nodes = merged
        span *= 2
    found, lowest = nodes[0]
    index = Signal(range(width + 1), name=name)
    m.d.comb += index.eq(Mux(found, lowest, width))
    return index


class Responder(wiring.Component):
    """The responder of every QP: classifies each received data packet, writes accepted
    payloads to memory, answers with MRC 1.0 SACKs (SETH + CC_STATE), NETH NACKs (trimmed, PSN
    out of the window) and AETH NAKs (fatal errors), answers reliability probes (PETH) with
    pr = 1 SACKs, and releases WRITE WITH IMMEDIATE completions in message order.

    Throughput: one packet per cycle (II = 1) in the steady state, back-to-back packets of the
    same QP included, and one beat per cycle for payload. A packet's header is classified in
    the cycle after its first beat is taken (latency: first beat in -> first place beat,
    SACK, NACK or NAK registered: 2 cycles). Cycles are taken from the packet stream only by
    control commands, ACK-delay timers that fire, and the cumulative advance across more than
    one completed WRITE WITH IMMEDIATE (one extra cycle per further completion, the rate the
    completion output runs at anyway).

    Backpressure, never a drop: when ``place``, ``ack``, ``completion`` or ``ctl_resp`` is not
    ready for what a packet needs, the pipeline waits (``i.ready`` low). Bad packets are
    never written: each gets a :class:`ResponderVerdict`, a counter and (mostly) a NACK or
    NAK. A probe of an unknown or not responding QP is dropped and counted
    (``probes_dropped``).

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
        32-bit event counters (wrap).
    verdict_valid, verdict : ``Out(1)``, ``Out(ResponderVerdict)``
        A one-cycle strobe per classified packet, one cycle after classification.
    """

    def __init__(self, *, config, mr_slots=16, timers=16, completions=8):
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
        self._config = config
        self._mr_slots = mr_slots
        self._timers = timers
        self._completions = completions
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
        })

    @property
    def config(self):
        return self._config

    @property
    def mr_slots(self):
        return self._mr_slots

    def elaborate(self, platform):
        m = Module()
        config = self._config
        window = config.window_psns
        lanes = config.bytes_per_beat
        qp_layout, bm_layout, wt_layout, mr_layout, tmpl_layout, timer_layout = \
            _layouts(config, self._mr_slots)
        cmd_layout = responder_command_layout(config)
        mr_bits = ceil_log2(self._mr_slots)

        # --- Tables ---------------------------------------------------------------------------
        # Each has one write port (the execute stage) and one read port (the issue stage),
        # transparent so that an entry written in the cycle it is read arrives updated.

        def table(name, layout, depth):
            mem = Memory(shape=layout, depth=depth, init=[])
            m.submodules[name] = mem
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=(wp,))
            return rp, wp

        qp_rp, qp_wp = table("qp_table", qp_layout, config.qps)
        bm_rp, bm_wp = table("bitmaps", bm_layout, config.qps)
        wt_rp, wt_wp = table("wimm_table", wt_layout, config.qps)
        mr_rp, mr_wp = table("mr_table", mr_layout, self._mr_slots)

        # One spare entry: `timers_used` (exact, unlike the FIFO's inner level while an entry
        # moves to its output register) decides whether a timer can start.
        m.submodules.timer_fifo = tfifo = SyncFIFOBuffered(width=timer_layout.size,
                                                           depth=self._timers + 1)
        timers_used = Signal(range(self._timers + 1))
        timer_room = timers_used < self._timers
        m.submodules.completion_fifo = cfifo = SyncFIFOBuffered(
            width=completion_layout(config).size, depth=self._completions)
        timer_head = timer_layout(tfifo.r_data)

        # --- Registers ------------------------------------------------------------------------

        cycles = Signal(32)
        m.d.sync += cycles.eq(cycles + 1)
        ack_every = Signal(8, init=DEFAULT_ACK_EVERY)
        ack_delay = Signal(32, init=DEFAULT_ACK_DELAY)
        nak_interval = Signal(32, init=DEFAULT_NAK_INTERVAL)
        coalesce_gaps = Signal()
        gap_depth = Signal(GAP_DEPTH_BITS)

        FIRST, BEAT, CONT, TIMER, CTL = range(5)
        e_valid = Signal()
        e_kind = Signal(range(5))
        e_beat = Signal(packet_beat_layout(config))
        e_qpn = Signal(config.qpn_bits)
        e_cmd = Signal(cmd_layout)
        e_timer = Signal(timer_layout)
        e_ack_want = Signal()           # a continued packet owes an ACK at its last step
        pkt_place = Signal()            # the packet in flight is being placed
        pkt_addr = Signal(64)           # address of its next payload beat
        in_packet = Signal()            # between a packet's first and last input beat

        # --- Issue stage: choose what enters execute, read the tables --------------------------

        e_fire = Signal()
        e_cont = Signal()
        e_free = Signal()
        m.d.comb += e_free.eq(~e_valid | (e_fire & ~e_cont))
        timer_due = Signal()
        m.d.comb += timer_due.eq(tfifo.r_rdy & ~(cycles - timer_head.deadline)[31])

        issue_cont = e_fire & e_cont
        take_beat = e_free & in_packet & self.i.valid
        take_ctl = e_free & ~in_packet & self.ctl.valid
        take_timer = e_free & ~in_packet & ~self.ctl.valid & timer_due
        take_first = e_free & ~in_packet & ~self.ctl.valid & ~timer_due & self.i.valid
        m.d.comb += [
            self.i.ready.eq(e_free & (in_packet | (~self.ctl.valid & ~timer_due))),
            self.ctl.ready.eq(take_ctl),
            tfifo.r_en.eq(take_timer),
        ]
        in_hdr = self.i.payload.header
        issue_qpn = Signal(config.qpn_bits)
        with m.If(issue_cont):
            m.d.comb += issue_qpn.eq(e_qpn)
        with m.Elif(take_ctl):
            m.d.comb += issue_qpn.eq(self.ctl.payload.qpn[:config.qpn_bits])
        with m.Elif(take_timer):
            m.d.comb += issue_qpn.eq(timer_head.qpn)
        with m.Else():
            m.d.comb += issue_qpn.eq(in_hdr.bth.dqpn[:config.qpn_bits])
        issue = issue_cont | take_ctl | take_timer | take_first
        for rp in (qp_rp, bm_rp, wt_rp):
            m.d.comb += [rp.addr.eq(issue_qpn), rp.en.eq(issue)]
        m.d.comb += [mr_rp.addr.eq(in_hdr.reth.rkey[:mr_bits]), mr_rp.en.eq(take_first)]

        with m.If(e_fire):
            m.d.sync += e_valid.eq(0)
        with m.If(issue_cont):
            m.d.sync += [e_valid.eq(1), e_kind.eq(CONT)]
        with m.If(take_beat | take_first):
            m.d.sync += [e_valid.eq(1), e_kind.eq(Mux(take_first, FIRST, BEAT)),
                         e_beat.eq(self.i.payload)]
            m.d.sync += in_packet.eq(~self.i.payload.last)
        with m.If(take_first):
            m.d.sync += e_qpn.eq(issue_qpn)
        with m.If(take_ctl):
            m.d.sync += [e_valid.eq(1), e_kind.eq(CTL), e_cmd.eq(self.ctl.payload),
                         e_qpn.eq(issue_qpn)]
        with m.If(take_timer):
            m.d.sync += [e_valid.eq(1), e_kind.eq(TIMER), e_timer.eq(timer_head),
                         e_qpn.eq(issue_qpn)]

        # --- Execute stage: classify -----------------------------------------------------------

        is_packet = e_valid & (e_kind == FIRST)
        # A reliability probe (PETH) is a one-beat packet that consumes no PSN: it is answered
        # with a pr = 1 SACK and changes nothing.
        is_probe = is_packet & (e_beat.header.kind == PacketKind.RPROBE)
        is_first = is_packet & ~is_probe
        is_beat = e_valid & (e_kind == BEAT)
        is_cont = e_valid & (e_kind == CONT)
        is_timer = e_valid & (e_kind == TIMER)
        is_ctl = e_valid & (e_kind == CTL)

        h = e_beat.header
        qp = qp_rp.data
        bm = bm_rp.data
        wt = wt_rp.data
        mr = mr_rp.data
        opcode = h.bth.opcode
        psn = h.bth.psn
        dma_len = h.reth.dma_len

        def opcode_in(opcodes):
            return Cat(opcode == int(op) for op in sorted(opcodes)).any()

        is_last_op = opcode_in(P.LAST_OPCODES)
        is_imm_op = opcode_in(P.IMMEDIATE_OPCODES)
        known = h.bth.dqpn < config.qps
        responding = (qp.state == int(P.QpState.RTR)) | (qp.state == int(P.QpState.RTS))
        bad_seq = ~opcode_in(P.DATA_OPCODES) | (dma_len > config.mtu) | \
            (~is_last_op & (dma_len != config.mtu))
        distance = Signal(24)
        m.d.comb += distance.eq(psn - qp.epsn)
        below = distance[23]
        in_window = ~below & (distance < (qp.mpr << 7))
        offset = distance[:max(1, ceil_log2(window))]   # == distance inside the window

        def rotate(bits, amount):       # bit i of the result: position amount + i
            return shift_right(m, Cat(bits, bits), amount, name="rot")[:window]

        def unrotate(bits, amount):
            return shift_left(m, Cat(bits, bits), amount, name="unrot")[window:2 * window]

        rcv_rot = Signal(window)
        m.d.comb += rcv_rot.eq(rotate(bm.rcv, qp.epos))
        marked = in_window & rcv_rot.bit_select(offset, 1)
        mr_ok = mr.valid & (mr.rkey == h.reth.rkey) & (mr.pd == qp.pd)
        in_bounds = (h.reth.va >= mr.base) & \
            ((h.reth.va + dma_len) <= (mr.base + mr.length))
        wimm_used = _popcount(Cat(wt[k].valid for k in range(config.max_wimm)))
        wimm_full = is_imm_op & (wimm_used >= qp.max_wimm)

        verdict = Signal(ResponderVerdict)
        V = ResponderVerdict
        with m.If(~known):
            m.d.comb += verdict.eq(V.BAD_QP)
        with m.Elif(~responding):
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
        placed = is_first & (verdict == V.PLACED)

        # --- Execute stage: mark and advance the cumulative PSN --------------------------------
        # In the rotated view bit i is PSN epsn + i. One step advances to the first PSN not
        # received, but stops just before a second WRITE_IMM end on the way, so that a step
        # releases at most one completion; the next step (CONT) follows at once.

        set_bit = Signal(window)
        m.d.comb += set_bit.eq(Mux(placed, onehot(m, offset, window, name="set_bit"), 0))
        rcv1 = Signal(window)
        last1 = Signal(window)
        wimm1 = Signal(window)
        m.d.comb += [
            rcv1.eq(rcv_rot | set_bit),
            last1.eq(rotate(bm.last, qp.epos) | Mux(is_last_op, set_bit, 0)),
            wimm1.eq(rotate(bm.wimm, qp.epos) | Mux(is_imm_op, set_bit, 0)),
        ]
        run = _lowest_set(m, ~rcv1, "run")
        wimm_at = _lowest_set(m, wimm1, "wimm_at")
        wimm_at_bit = onehot(m, wimm_at, window, name="wimm_at_bit")
        wimm_next = _lowest_set(m, wimm1 & ~wimm_at_bit, "wimm_next")
        stop = wimm_at < run                # a WRITE_IMM completes in this step
        more = wimm_next < run              # and another one after it: continue
        advance = Signal(range(window + 1))
        m.d.comb += [
            advance.eq(Mux(more, wimm_next, run)),
            e_cont.eq((placed | is_cont) & more),
        ]
        passed = Signal(window)
        m.d.comb += passed.eq(below_mask(m, advance, window, name="passed"))
        new_epsn = Signal(24)
        new_epos = Signal.like(qp.epos)
        new_msn = Signal(24)
        wimm_msn = Signal(24)              # MSN of the completed WRITE_IMM's message
        epos_sum = qp.epos + advance
        m.d.comb += [
            new_epsn.eq(qp.epsn + advance),
            new_epos.eq(Mux(epos_sum >= window, epos_sum - window, epos_sum)),
            new_msn.eq(qp.msn + _popcount(last1 & passed)),
            wimm_msn.eq(qp.msn + _popcount(
                last1 & below_mask(m, wimm_at + 1, window, name="upto_wimm"))),
        ]
        new_bm = Signal(bm_layout)
        m.d.comb += [
            new_bm.rcv.eq(unrotate(rcv1 & ~passed, qp.epos)),
            new_bm.last.eq(unrotate(last1 & ~passed, qp.epos)),
            new_bm.wimm.eq(unrotate(wimm1 & ~passed, qp.epos)),
        ]

        # WRITE_IMM entries: a placed one takes the first free slot; the one the step passes
        # leaves with its completion (possibly the same, for an in-order WRITE_IMM).
        pkt_pos = Signal.like(qp.epos)
        wimm_pos = Signal.like(qp.epos)
        pkt_pos_sum = qp.epos + offset
        wimm_pos_sum = qp.epos + wimm_at
        m.d.comb += [
            pkt_pos.eq(Mux(pkt_pos_sum >= window, pkt_pos_sum - window, pkt_pos_sum)),
            wimm_pos.eq(Mux(wimm_pos_sum >= window, wimm_pos_sum - window, wimm_pos_sum)),
        ]
        free_slot = _lowest_set(m, ~Cat(wt[k].valid for k in range(config.max_wimm)), "free_slot")
        new_wt = Signal(wt_layout)
        completed_imm = Signal(32)
        hit_imms = []
        for k in range(config.max_wimm):
            entry = Signal(wt_layout.elem_shape, name=f"wimm_entry{k}")
            m.d.comb += entry.eq(wt[k])
            with m.If(placed & is_imm_op & (free_slot == k)):
                m.d.comb += [entry.valid.eq(1), entry.pos.eq(pkt_pos), entry.imm.eq(h.immdt.imm)]
            hit = entry.valid & (entry.pos == wimm_pos) & stop
            hit_imms.append(Mux(hit, entry.imm, 0))
            m.d.comb += [new_wt[k].eq(entry), new_wt[k].valid.eq(entry.valid & ~hit)]
        # One entry at most holds the passed position; OR is the cheapest select.
        m.d.comb += completed_imm.eq(_or_all(hit_imms))

        # --- Execute stage: ACK decision ---------------------------------------------------------

        ce = h.tclass[:2] == P.ECN_CE
        gap = (distance != 0) | (advance > 1) | e_cont
        count_next = qp.ack_count + 1
        ack_now = Signal()
        # A packet placed above a hole as the gap_depth-th (or later) PSN received above it.
        deep = (gap_depth != 0) & (distance != 0) & (qp.above + 1 >= gap_depth)
        m.d.comb += ack_now.eq(h.bth.ackreq | ce | (gap & ~coalesce_gaps) | deep |
                               (count_next >= ack_every) |
                               ((qp.ack_count == 0) & ~timer_room))
        start_timer = placed & ~ack_now & (qp.ack_count == 0)

        nak_quiet = (nak_interval != 0) & qp.nak_armed & \
            ((cycles - qp.last_nak)[:32] < nak_interval)
        nak_code = Signal(5)
        with m.Switch(verdict):
            for v, code in VERDICT_NAK.items():
                with m.Case(v):
                    m.d.comb += nak_code.eq(int(code))
        nack_reason = Signal(8)
        is_nack = Signal()              # a recoverable refusal: NETH NACK (else AETH NAK)
        with m.Switch(verdict):
            for v, reason in VERDICT_NACK.items():
                with m.Case(v):
                    m.d.comb += [nack_reason.eq(int(reason)), is_nack.eq(1)]
        suppressed = is_first & (verdict == V.OUT_OF_WINDOW) & nak_quiet
        send_nak = is_first & (verdict != V.PLACED) & (verdict != V.DUPLICATE) & ~suppressed & \
            ((verdict != V.TRIMMED) | (qp.caps & int(P.QpCapability.TRIM_NACK)).any())
        send_ack = Signal()
        m.d.comb += send_ack.eq((placed & ack_now & ~e_cont) |
                                (is_cont & e_ack_want & ~e_cont) |
                                (is_first & (verdict == V.DUPLICATE)) |
                                (is_timer & (qp.ack_count != 0)))
        # A probe of a QP that exists and responds is answered; any other is dropped (counted).
        send_probe_ack = is_probe & known & responding

        # The packet the reply answers: this one, or for a timer the one that started it.
        tmpl = Signal(tmpl_layout)
        with m.If(is_timer):
            m.d.comb += tmpl.eq(e_timer.template)
        with m.Else():
            m.d.comb += [
                tmpl.port.eq(h.port), tmpl.eth_src.eq(h.eth_src), tmpl.eth_dst.eq(h.eth_dst),
                tmpl.vlan_valid.eq(h.vlan_valid), tmpl.vlan_tci.eq(h.vlan_tci),
                tmpl.ipv6.eq(h.ipv6), tmpl.ip_src.eq(h.ip_src), tmpl.ip_dst.eq(h.ip_dst),
                tmpl.flow_label.eq(h.flow_label), tmpl.udp_sport.eq(h.udp_sport),
                tmpl.psn.eq(psn),
                tmpl.tx_ts.eq(Mux(is_probe, h.ctl.peth.tx_timestamp, h.tseth.tx_timestamp)),
                tmpl.ce.eq(ce & ~is_probe),
            ]

        # SACK bitmap: 64 PSNs from cack_psn + 1, or, when the trigger lies more than 64 PSNs
        # above cack_psn, from the start of the trigger's 64-aligned block (so a SACK reports
        # the holes around a late arrival anywhere in the window). In the rotated view bit i
        # is PSN epsn + i (before this step's advance).
        bitmap_bits = P.SACK_BITMAP_BITS
        cack = Signal(24)
        trig_dist = Signal(24)          # trigger - cack_psn
        aligned = Signal()
        aligned_base = Signal(24)
        m.d.comb += [
            cack.eq(new_epsn - 1),
            trig_dist.eq(tmpl.psn - cack),
            aligned.eq(~is_probe & ~trig_dist[23] & (trig_dist > bitmap_bits)),
            aligned_base.eq(Cat(C(0, 6), tmpl.psn[6:])),
        ]
        shift_bits = ceil_log2(window + 1)
        sack_shift = Signal(shift_bits)
        m.d.comb += sack_shift.eq(Mux(aligned, (aligned_base - qp.epsn)[:shift_bits], advance))
        sack_bitmap = Signal(bitmap_bits)
        m.d.comb += sack_bitmap.eq(shift_right(m, rcv1, sack_shift, name="sack")[:bitmap_bits])
        new_above = Signal.like(qp.above)
        m.d.comb += new_above.eq(Mux(placed | is_cont, qp.above + placed - advance, qp.above))
        new_rcvd = Signal(RCVD_BYTES_BITS)
        m.d.comb += new_rcvd.eq(qp.rcvd_bytes + Mux(placed, dma_len, 0))

        bad_qp = is_first & ~known
        reply = Signal(packet_beat_layout(config))
        r = reply.header
        seth, cc_state, neth = r.ctl.sack.seth, r.ctl.sack.cc_state, r.ctl.neth
        # The EV the trigger arrived with: UDP source port, IPv6 flow label (low 16 bits).
        entropy = Cat(tmpl.udp_sport, Mux(tmpl.ipv6, tmpl.flow_label[:16], 0))
        m.d.comb += [
            reply.first.eq(1), reply.last.eq(1),
            r.port.eq(tmpl.port),
            r.eth_dst.eq(tmpl.eth_src), r.eth_src.eq(tmpl.eth_dst),
            r.vlan_valid.eq(tmpl.vlan_valid), r.vlan_tci.eq(tmpl.vlan_tci),
            r.ipv6.eq(tmpl.ipv6), r.ip_src.eq(tmpl.ip_dst), r.ip_dst.eq(tmpl.ip_src),
            r.tclass.eq(ACK_TCLASS), r.flow_label.eq(tmpl.flow_label),
            r.hop_limit.eq(ACK_HOP_LIMIT), r.udp_sport.eq(tmpl.udp_sport),
            r.bth.pkey.eq(P.BTH_DEFAULT_PKEY),
            r.bth.dqpn.eq(Mux(bad_qp, h.bth.dqpn, qp.remote_qpn)),
        ]
        with m.If(send_nak & is_nack):
            m.d.comb += [
                r.kind.eq(PacketKind.NACK),
                r.bth.opcode.eq(int(P.Opcode.RELIABILITY_NACK)),
                r.bth.psn.eq(tmpl.psn),
                neth.nack_reason.eq(nack_reason), neth.entropy.eq(entropy),
                neth.nack_psn.eq(tmpl.psn), neth.tx_timestamp.eq(tmpl.tx_ts),
            ]
        with m.Elif(send_nak):
            m.d.comb += [
                r.kind.eq(PacketKind.AETH),
                r.bth.opcode.eq(int(P.Opcode.ACKNOWLEDGE)),
                r.bth.psn.eq(tmpl.psn),
                r.aeth.syndrome.eq(P.AETH_NAK_BASE | nak_code),
                r.aeth.msn.eq(Mux(bad_qp, 0, new_msn)),
            ]
        with m.Else():
            m.d.comb += [
                r.kind.eq(PacketKind.SACK),
                r.bth.opcode.eq(int(P.Opcode.RELIABILITY_SACK)),
                r.bth.psn.eq(cack),
                seth.m.eq(Mux(tmpl.ce, P.SackMark.SKIP_ONCE, P.SackMark.NONE)),
                seth.pr.eq(is_probe),
                seth.ack_psn_offset.eq(Mux(is_probe, h.ctl.peth.probe_id, trig_dist[:16])),
                seth.entropy.eq(entropy),
                seth.cack_psn.eq(cack),
                seth.mpr.eq(qp.mpr),
                seth.sack_psn_offset.eq(Mux(aligned, (aligned_base - cack)[:16], 1)),
                seth.sack_bitmap.eq(sack_bitmap),
                cc_state.tx_timestamp.eq(tmpl.tx_ts),
                cc_state.ooo_count.eq(Mux(new_above > OOO_COUNT_MAX, OOO_COUNT_MAX, new_above)),
                cc_state.rcvd_bytes.eq(new_rcvd),
            ]

        # --- Execute stage: control commands -----------------------------------------------------

        cmd = e_cmd
        C_ = ResponderCommand
        resp = Signal(responder_response_layout(config))
        qp_cmd_ok = Signal()
        set_rx = Signal()
        state_ok = Cat(cmd.state == int(s) for s in P.QpState).any()
        cmd_qpn_ok = cmd.qpn < config.qps
        with m.Switch(cmd.cmd):
            with m.Case(C_.QP_WRITE):
                with m.If(~cmd_qpn_ok):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Elif(~state_ok | (cmd.mpr == 0) | (cmd.mpr > config.mpr_units) |
                            (cmd.max_wimm == 0) | (cmd.max_wimm > config.max_wimm)):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
                with m.Else():
                    m.d.comb += [qp_cmd_ok.eq(is_ctl), set_rx.eq(is_ctl & cmd.set_psn)]
            with m.Case(C_.QP_READ):
                with m.If(~cmd_qpn_ok):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Else():
                    m.d.comb += resp.data.eq(Cat(qp.state, C(0, 5), qp.epsn, qp.msn,
                                                 wimm_used))
            with m.Case(C_.MR_WRITE):
                with m.If(cmd.slot >= self._mr_slots):
                    m.d.comb += resp.errno.eq(P.Errno.ENOENT)
                with m.Elif(cmd.valid & (cmd.rkey[:mr_bits] != cmd.slot[:mr_bits])):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
                with m.Else():
                    m.d.comb += mr_wp.en.eq(is_ctl & e_fire)
            with m.Case(C_.CONFIG):
                with m.If(cmd.ack_every == 0):
                    m.d.comb += resp.errno.eq(P.Errno.EINVAL)
                with m.Elif(is_ctl & e_fire):
                    m.d.sync += [ack_every.eq(cmd.ack_every), ack_delay.eq(cmd.ack_delay),
                                 nak_interval.eq(cmd.nak_interval),
                                 coalesce_gaps.eq(cmd.coalesce_gaps),
                                 gap_depth.eq(cmd.gap_depth)]
        m.d.comb += [
            mr_wp.addr.eq(cmd.slot[:mr_bits]),
            mr_wp.data.valid.eq(cmd.valid), mr_wp.data.rkey.eq(cmd.rkey),
            mr_wp.data.pd.eq(cmd.pd), mr_wp.data.base.eq(cmd.base),
            mr_wp.data.length.eq(cmd.length),
        ]

        # --- Execute stage: outputs and table writes ---------------------------------------------

        need_place = (placed | (is_beat & pkt_place)) & (e_beat.keep != 0)
        need_ack = send_ack | send_nak | send_probe_ack
        need_completion = (placed | is_cont) & stop
        need_timer = start_timer

        place_valid = Signal()
        ack_valid = Signal()
        resp_valid = Signal()
        place_room = ~place_valid | self.place.ready
        ack_room = ~ack_valid | self.ack.ready
        resp_room = ~resp_valid | self.ctl_resp.ready
        m.d.comb += e_fire.eq(e_valid & (~need_place | place_room) & (~need_ack | ack_room) &
                              (~need_completion | cfifo.w_rdy) & (~is_ctl | resp_room))

        m.d.comb += [
            self.place.valid.eq(place_valid), self.ack.valid.eq(ack_valid),
            self.ctl_resp.valid.eq(resp_valid),
        ]
        with m.If(self.place.ready):
            m.d.sync += place_valid.eq(0)
        with m.If(self.ack.ready):
            m.d.sync += ack_valid.eq(0)
        with m.If(self.ctl_resp.ready):
            m.d.sync += resp_valid.eq(0)
        with m.If(e_fire & need_place):
            m.d.sync += [
                place_valid.eq(1),
                self.place.payload.addr.eq(Mux(is_first, h.reth.va, pkt_addr)),
                self.place.payload.data.eq(e_beat.data),
                self.place.payload.keep.eq(e_beat.keep),
                self.place.payload.last.eq(e_beat.last),
            ]
        with m.If(e_fire & is_first):
            m.d.sync += [pkt_place.eq(placed), pkt_addr.eq(h.reth.va + lanes),
                         e_ack_want.eq(ack_now)]
        with m.Elif(e_fire & is_beat):
            m.d.sync += pkt_addr.eq(pkt_addr + lanes)
        with m.If(e_fire & need_ack):
            m.d.sync += [ack_valid.eq(1), self.ack.payload.eq(reply)]
        with m.If(e_fire & is_ctl):
            m.d.sync += [resp_valid.eq(1), self.ctl_resp.payload.eq(resp)]

        completion = Signal(completion_layout(config))
        m.d.comb += [
            completion.qpn.eq(e_qpn), completion.side.eq(CompletionSide.RESPONDER),
            completion.wr_id.eq(wimm_msn), completion.status.eq(P.CompletionStatus.SUCCESS),
            completion.opcode.eq(P.WcOpcode.RECV_RDMA_WITH_IMM), completion.imm_valid.eq(1),
            completion.imm.eq(completed_imm),
            cfifo.w_en.eq(e_fire & need_completion), cfifo.w_data.eq(completion),
            self.completion.valid.eq(cfifo.r_rdy), self.completion.payload.eq(cfifo.r_data),
            cfifo.r_en.eq(self.completion.ready),
        ]
        timer_entry = Signal(timer_layout)
        m.d.comb += [
            timer_entry.deadline.eq(cycles + ack_delay), timer_entry.qpn.eq(e_qpn),
            timer_entry.template.eq(tmpl),
            tfifo.w_en.eq(e_fire & need_timer), tfifo.w_data.eq(timer_entry),
        ]
        m.d.sync += timers_used.eq(timers_used + tfifo.w_en - take_timer)

        # QP table: the packet's QP (never for an unknown QPN: its low bits name another QP).
        new_qp = Signal(qp_layout)
        m.d.comb += [
            new_qp.eq(qp), new_qp.epsn.eq(new_epsn), new_qp.epos.eq(new_epos),
            new_qp.msn.eq(new_msn), new_qp.rcvd_bytes.eq(new_rcvd),
        ]
        with m.If(placed):
            m.d.comb += new_qp.ack_count.eq(Mux(ack_now, 0, count_next))
        with m.If(placed | is_cont):
            # Every step sets one bit (a placed packet) and passes `advance` set bits.
            m.d.comb += new_qp.above.eq(qp.above + placed - advance)
        with m.If(send_ack):
            m.d.comb += new_qp.ack_count.eq(0)
        with m.If(is_first & (verdict == V.OUT_OF_WINDOW) & ~suppressed):
            m.d.comb += [new_qp.nak_armed.eq(1), new_qp.last_nak.eq(cycles)]
        with m.If(is_ctl):
            m.d.comb += [
                new_qp.state.eq(cmd.state), new_qp.remote_qpn.eq(cmd.remote_qpn),
                new_qp.pd.eq(cmd.pd), new_qp.mpr.eq(cmd.mpr), new_qp.caps.eq(cmd.caps),
                new_qp.max_wimm.eq(cmd.max_wimm),
            ]
            with m.If(cmd.set_psn):
                m.d.comb += [
                    new_qp.epsn.eq(cmd.psn), new_qp.epos.eq(0), new_qp.msn.eq(0),
                    new_qp.ack_count.eq(0), new_qp.nak_armed.eq(0), new_qp.last_nak.eq(0),
                    new_qp.above.eq(0), new_qp.rcvd_bytes.eq(0),
                ]
        rx_write = placed | is_cont | set_rx
        m.d.comb += [
            qp_wp.addr.eq(e_qpn), qp_wp.data.eq(new_qp),
            qp_wp.en.eq(e_fire & ((is_first & known) | is_cont | is_timer | qp_cmd_ok)),
            bm_wp.addr.eq(e_qpn), bm_wp.data.eq(Mux(is_ctl, 0, new_bm)),
            bm_wp.en.eq(e_fire & rx_write),
            wt_wp.addr.eq(e_qpn), wt_wp.data.eq(Mux(is_ctl, 0, new_wt)),
            wt_wp.en.eq(e_fire & rx_write),
        ]

        # --- Verdict strobe and counters ---------------------------------------------------------

        m.d.sync += [self.verdict_valid.eq(e_fire & is_first), self.verdict.eq(verdict)]
        counts = {name: C(0) for name in RESPONDER_COUNTERS}
        for v in ResponderVerdict:
            counts[v.name.lower()] = is_first & (verdict == v)
        counts.update(acks=send_ack, naks=send_nak, naks_suppressed=suppressed,
                      probes=send_probe_ack, probes_dropped=is_probe & ~send_probe_ack,
                      completions=need_completion)
        with m.If(e_fire):
            for name, event in counts.items():
                counter = self.counters[name]
                m.d.sync += counter.eq(counter + event)
        return m
