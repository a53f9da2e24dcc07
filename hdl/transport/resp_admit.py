"""The responder's admission: S0 issue and S1 read, with the per-QP tables and forwarding.

:class:`Admission` chooses the next operation (a packet's first beat, a payload beat, a
control command, a due ACK-delay timer), reads the QP's row and the packet's MR entry from the
block RAM tables, forwards the write-backs a read cannot see yet, makes the checks that need
only the header and the MR entry, and hands the operation to the execute stage
(:class:`~hdl.transport.responder.Responder`) with everything it decides on.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import as_signal, validating
from .resp_defs import ResponderCommand, responder_command_layout
from .resp_layouts import (
    CHUNK,
    OP_BEAT,
    OP_CTL,
    OP_FIRST,
    OP_TIMER,
    op_layout,
    responder_layouts,
)

__all__ = ["Admission", "checks_layout", "header_checks", "qp_write_checks", "distance_layout",
           "distance_checks", "distance_after_step", "admitted_layout",
           "admission_observation_layout"]


def checks_layout():
    """The checks that depend only on a packet's header and its MR entry, made in S1 and
    registered for S2 (out of S2's loop on the QP entry)."""
    return data.StructLayout({"known": 1, "bad_seq": 1, "last_op": 1, "imm_op": 1,
                              "mr_hit": 1, "in_bounds": 1, "probe": 1, "static_ok": 1})


def header_checks(config, header, mr, va_end):
    """``checks_layout`` values of a packet ``header`` against ``mr``, its MR entry, with
    ``va_end`` = va + dma_len."""
    opcode, dma_len = header.bth.opcode, header.reth.dma_len

    def opcode_in(opcodes):
        return Cat(opcode == int(op) for op in sorted(opcodes)).any()

    last_op = opcode_in(P.LAST_OPCODES)
    known = header.bth.dqpn < config.qps
    bad_seq = ~opcode_in(P.DATA_OPCODES) | (dma_len > config.mtu) | \
        (~last_op & (dma_len != config.mtu))
    mr_hit = mr.valid & (mr.rkey == header.reth.rkey)
    in_bounds = (header.reth.va >= mr.base) & (va_end <= mr.limit)
    return {
        "known": known, "bad_seq": bad_seq, "last_op": last_op,
        "imm_op": opcode_in(P.IMMEDIATE_OPCODES), "mr_hit": mr_hit, "in_bounds": in_bounds,
        "probe": header.kind == PacketKind.RPROBE,
        # Every check of a PLACED verdict that needs neither the QP entry nor the MR's PD.
        "static_ok": known & ~bad_seq & ~header.trimmed & mr_hit & in_bounds,
    }


def qp_write_checks(config, cmd):
    """A QP_WRITE command's checks: its QP exists (``qpn_ok``, else ENOENT) and its fields are
    in range (``fields_ok``, else EINVAL). The one definition: S1 registers their AND for S2
    (a restart's write-back then waits on no compare), S2 picks the errno from them."""
    state_ok = Cat(cmd.state == int(st) for st in P.QpState).any()
    return {
        "qpn_ok": cmd.qpn < config.qps,
        "fields_ok": state_ok & (cmd.mpr != 0) & (cmd.mpr <= config.mpr_units) &
        (cmd.max_wimm != 0) & (cmd.max_wimm <= config.max_wimm),
    }


def distance_layout(config):
    """Where a packet's PSN lies against the row S2 starts from, made in S1 and registered for
    S2 (out of S2's loop on its own row): ``offset`` = (PSN - expected PSN) modulo 2**pos_bits,
    at the expected PSN (``d0``), below it, inside the window (mpr x 128 PSNs from it), its
    receive bit set (``marked``) and the receive bit of the PSN just below it
    (``below_marked``). The last two mean something only inside the window (and
    ``below_marked`` only above the expected PSN)."""
    return data.StructLayout({"offset": config.window_bits, "d0": 1, "below": 1,
                              "in_window": 1, "marked": 1, "below_marked": 1})


def distance_checks(config, psn, epsn, mpr, rcv):
    """``distance_layout`` values of PSN ``psn`` against a row with expected PSN ``epsn``, MPR
    ``mpr`` and receive bitmap ``rcv``: what S2 decides on, the one definition (S1's
    candidate for a row read from the tables, the observation ports' check of S2)."""
    pos_bits = config.window_bits
    distance = (psn - epsn)[:P.PSN_BITS]
    offset = distance[:pos_bits]
    below = distance[P.PSN_BITS - 1]
    unit_bits = (P.MPR_UNIT_PSNS - 1).bit_length()
    return {
        "offset": offset, "d0": distance == 0, "below": below,
        "in_window": ~below & (distance[unit_bits:] < mpr),
        "marked": rcv.bit_select(offset, 1),
        "below_marked": rcv.bit_select((offset - 1)[:pos_bits], 1),
    }


def distance_after_step(m, config, psn, wb):
    """``distance_checks`` of PSN ``psn`` against the row S2 writes back (``wb``), from S2's
    row before its step: the expected PSN moves on by ``wb.advance`` (0 to CHUNK), the
    receive bitmap is the one before the step with the packet's bit set, shifted down by the
    advance. Only the advance and the placement come late; they meet small compares, not a
    carry chain across the PSN."""
    pos_bits = config.window_bits
    window = config.window_psns
    adv = wb.advance
    adv_bits = len(adv)
    unit_bits = (P.MPR_UNIT_PSNS - 1).bit_length()
    # From registers: the distance from S2's expected PSN before the step (`base`).
    base = as_signal(m, (psn - wb.epsn)[:P.PSN_BITS], "wb_dist_base")
    # distance = base - adv. Below: bit 23 of the difference (the borrow out of the low
    # bits flips it only when the bits between are all zero).
    borrow = base[:adv_bits] < adv
    below = base[P.PSN_BITS - 1] ^ (borrow & (base[adv_bits:P.PSN_BITS - 1] == 0))
    d0 = (base[adv_bits:] == 0) & (base[:adv_bits] == adv)
    # In the window: adv <= base < adv + mpr x 128 (no wrap: both bounds are small).
    span = Cat(C(0, unit_bits), wb.state.qp.mpr)
    low_bits = ((2**len(wb.state.qp.mpr) - 1) * P.MPR_UNIT_PSNS + CHUNK).bit_length()
    low = base[:low_bits]
    low_fits = as_signal(m, base[low_bits:] == 0, "wb_dist_fits")
    under_span = as_signal(m, low < span, "wb_dist_under_span")
    over = as_signal(m, (low - span)[:low_bits], "wb_dist_over")    # base - span, if >= 0
    at_least_adv = (low[adv_bits:] != 0) | (low[:adv_bits] >= adv)
    in_window = low_fits & at_least_adv & \
        (under_span | ((over[adv_bits:] == 0) & (over[:adv_bits] < adv)))
    # The receive bits: bit `base` (and `base - 1`) of the bitmap before the shift, the
    # packet S2 places included (its PSN has the same low bits).
    rcv = wb.rcv
    psn_low = psn[:pos_bits]
    under = (base - 1)[:P.PSN_BITS]
    marked = (base < window) & (rcv.bit_select(base[:pos_bits], 1) |
                                (wb.placed & (psn_low == wb.psn_low)))
    below_marked = (under < window) & (rcv.bit_select(under[:pos_bits], 1) |
                                       (wb.placed & ((psn - 1)[:pos_bits] == wb.psn_low)))
    return {
        "offset": (base[:pos_bits] - adv)[:pos_bits], "d0": d0, "below": below,
        "in_window": in_window, "marked": marked, "below_marked": below_marked,
    }


def admitted_layout(config):
    """An operation leaving S1 for the execute stage: the operation, the row it starts from
    (S2's write-back of the cycle included), its MR entry, va + dma_len, the header and MR
    checks, where its PSN lies against the row (`dist`), a command's base + length, whether
    it is a QP_WRITE that passes its checks (`qp_write_ok`: ``qp_write_checks``), and for
    the rate limit the cycles since the row's last NACK (`since_older`, valid unless
    `same_now`: the row is S2's write-back of the cycle)."""
    layouts = responder_layouts(config)
    return data.StructLayout({
        "op": op_layout(config), "row": layouts.state, "mr": layouts.mr, "va_end": 65,
        "checks": checks_layout(), "dist": distance_layout(config), "cmd_limit": 65,
        "qp_write_ok": 1,
        "same_now": 1, "since_older": 32,
    })


def writeback_layout(config):
    """S2's write-back of the cycle: its row would be written if S2 fires (`row_write`), it
    is (`fire`), the QP and the row; and what S1 derives the next packet's distance from
    (`distance_after_step`): S2's expected PSN before its step (`epsn`, the restart's PSN for
    a restart), the step's `advance`, the receive bitmap before the step (`rcv`, cleared for
    a restart), whether S2 places its packet (`placed`) and that packet's PSN's low bits."""
    return data.StructLayout({"row_write": 1, "fire": 1, "qpn": config.qpn_bits,
                              "state": responder_layouts(config).state,
                              "epsn": P.PSN_BITS, "advance": range(CHUNK + 1),
                              "rcv": config.window_psns, "placed": 1,
                              "psn_low": config.window_bits})


def mr_write_layout(mr_slots, config):
    return data.StructLayout({"en": 1, "slot": max(1, ceil_log2(mr_slots)),
                              "entry": responder_layouts(config).mr})


def admission_observation_layout(config, mr_slots):
    """What ``Admission(observe=True)`` shows on ``obs`` (for the formal proofs)."""
    layouts = responder_layouts(config)
    return data.StructLayout({
        "row": layouts.state,       # the tables' row of `obs_qpn` (asynchronous read)
        "mr_row": layouts.mr,       # the MR table's entry of `obs_slot` (asynchronous read)
        "s1_valid": 1, "s1": op_layout(config), "in_packet": 1,
        "s1_va_end_ok": 1,          # S1's registered va + dma_len is its beat's
        "s1_older": layouts.state, "s1_mr_older": layouts.mr,
    })


class Admission(wiring.Component):
    """S0 issue and S1 read of the responder, and its per-QP tables.

    S0 takes one operation per cycle when S1 is free, in this priority: the next beat of the
    packet in progress, a control command (a restart, QP_WRITE with ``set_psn``, only when
    ``drained`` and S1 are empty), a due ACK-delay timer (``timer``), a packet's first beat. The
    tables (QP row, bitmaps, WRITE_IMM entries: ``qps`` deep; MR entries) are addressed for the
    operation an issue would take, whether or not S1 is free, and their data lands in S1 a
    cycle later.

    Latency one cycle (taken -> ``o.valid``); throughput one operation per cycle while
    ``o.ready`` is high. Hazards: the read ports are not transparent, so an operation in its
    first S1 cycle misses the write-backs of the last two cycles: it takes them from ``prev``
    and ``prev2`` (S2's write-backs, written to the tables from ``prev`` a cycle later), and
    S2's write-back of the current cycle (``wb``) from the port; an operation that waits in S1
    captures that row (and its MR entry, forwarded the same way from ``mr_write``) every cycle
    it waits, so S1's stall steers no read address. ``o.payload.row`` is the row the operation
    starts from, S2's write-back of the cycle included: the execute stage's only loop is its
    own decision.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
    mr_slots : int
        MR table entries (a power of two, checked by the responder).
    observe : bool
        Add ``obs_qpn``, ``obs_slot`` and ``obs`` (asynchronous reads of the tables, S1's
        state) for the formal proofs.

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
    ctl : ``In(stream.Signature(responder_command_layout(config)))``
    timer : ``In(stream.Signature(timer layout))``
        The ACK-delay timer FIFO's head; ``valid`` while it is due.
    o : ``Out(stream.Signature(admitted_layout(config)))``
        To the execute stage; ``ready``: S2 is free (empty, or fires and does not continue).
    drained : ``In(1)``
        S2 and the reply stage hold nothing (a restart waits for it).
    cycles : ``In(32)``
        The responder's cycle counter (for ``since_older``).
    wb : ``In(writeback_layout(config))``
        S2's write-back of the cycle.
    mr_write : ``In(mr_write_layout(mr_slots, config))``
        The MR table's write (MR_WRITE commands in S2).
    """

    def __init__(self, *, config, mr_slots, observe=False):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
        self._config = config
        self._mr_slots = mr_slots
        self._observe = observe
        layouts = responder_layouts(config)
        members = {
            "i": In(stream.Signature(packet_beat_layout(config))),
            "ctl": In(stream.Signature(responder_command_layout(config))),
            "timer": In(stream.Signature(layouts.timer)),
            "o": Out(stream.Signature(admitted_layout(config))),
            "drained": In(1),
            "cycles": In(32),
            "wb": In(writeback_layout(config)),
            "mr_write": In(mr_write_layout(mr_slots, config)),
        }
        if observe:
            members.update(obs_qpn=In(config.qpn_bits),
                           obs_slot=In(max(1, ceil_log2(mr_slots))),
                           obs=Out(admission_observation_layout(config, mr_slots)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        config = self._config
        layouts = responder_layouts(config)
        mr_bits = ceil_log2(self._mr_slots)
        wb, mr_write = self.wb, self.mr_write

        # Tables: one write port each (from `prev`) and one read port (S0 addresses, S1
        # data), not transparent: the forwarding below covers what a read cannot see yet.
        def table(name, layout, depth):
            mem = Memory(shape=layout, depth=depth, init=[])
            m.submodules[name] = mem
            return mem, mem.read_port(), mem.write_port()

        qp_mem, qp_rp, qp_wp = table("qp_table", layouts.qp, config.qps)
        bm_mem, bm_rp, bm_wp = table("bitmaps", layouts.bitmaps, config.qps)
        wt_mem, wt_rp, wt_wp = table("wimm_table", layouts.wimm_row, config.qps)
        mr_mem, mr_rp, mr_wp = table("mr_table", layouts.mr, self._mr_slots)
        m.d.comb += [mr_wp.en.eq(mr_write.en), mr_wp.addr.eq(mr_write.slot[:mr_bits]),
                     mr_wp.data.eq(mr_write.entry)]

        s1 = Signal(op_layout(config), reset_less=True)
        s1_valid = Signal()
        s1_move = Signal()
        s1_free = Signal()
        m.d.comb += [
            self.o.valid.eq(s1_valid),
            s1_move.eq(s1_valid & self.o.ready),
            s1_free.eq(~s1_valid | s1_move),
        ]
        # A restart (QP_WRITE with set_psn) waits for an empty pipeline and reply stage: every
        # reply of the old epoch has left before it executes. Other commands are ordinary
        # operations: what they write reaches later packets by the forwarding below.
        empty = ~s1_valid & self.drained
        restart = (self.ctl.payload.cmd == ResponderCommand.QP_WRITE) & self.ctl.payload.set_psn
        timer_head, timer_due = self.timer.payload, self.timer.valid
        can_issue = s1_free
        in_packet = Signal()                # between a packet's first and last beat
        take_beat = can_issue & in_packet & self.i.valid
        take_ctl = can_issue & ~in_packet & self.ctl.valid & (~restart | empty)
        take_timer = can_issue & ~in_packet & ~self.ctl.valid & timer_due
        take_first = can_issue & ~in_packet & ~self.ctl.valid & ~timer_due & self.i.valid
        m.d.comb += [
            self.i.ready.eq(can_issue & (in_packet | (~self.ctl.valid & ~timer_due))),
            self.ctl.ready.eq(take_ctl),
            self.timer.ready.eq(take_timer),
        ]
        in_hdr = self.i.payload.header
        # The QP an issue would address, chosen without waiting on whether S1 is free (the
        # stall comes late, from S2's decision): it matters only when S1 is.
        issue_qpn = Signal(config.qpn_bits)
        with m.If(~in_packet & self.ctl.valid & (~restart | empty)):
            m.d.comb += issue_qpn.eq(self.ctl.payload.qpn[:config.qpn_bits])
        with m.Elif(~in_packet & ~self.ctl.valid & timer_due):
            m.d.comb += issue_qpn.eq(timer_head.qpn)
        with m.Else():
            m.d.comb += issue_qpn.eq(in_hdr.bth.dqpn[:config.qpn_bits])

        # The tables are addressed for the operation an issue would take, whether or not S1
        # is free: S1's stall (which waits on S2's decision) steers no read address. An
        # operation that waits in S1 keeps its row in a register instead (`s1_row`, below).
        for rp in (qp_rp, bm_rp, wt_rp):
            m.d.comb += rp.addr.eq(issue_qpn)
        m.d.comb += mr_rp.addr.eq(in_hdr.reth.rkey[:mr_bits])

        with m.If(s1_move):
            m.d.sync += s1_valid.eq(0)
        s1_va_end = Signal(65, reset_less=True)     # S1's va + dma_len
        with m.If(take_beat | take_first):
            m.d.sync += [s1_valid.eq(1), s1.kind.eq(Mux(take_first, OP_FIRST, OP_BEAT)),
                         s1.beat.eq(self.i.payload), in_packet.eq(~self.i.payload.last),
                         s1_va_end.eq(in_hdr.reth.va + in_hdr.reth.dma_len)]
        with m.If(take_first):
            m.d.sync += s1.qpn.eq(issue_qpn)
        with m.If(take_ctl):
            m.d.sync += [s1_valid.eq(1), s1.kind.eq(OP_CTL), s1.cmd.eq(self.ctl.payload),
                         s1.qpn.eq(issue_qpn)]
        with m.If(take_timer):
            m.d.sync += [s1_valid.eq(1), s1.kind.eq(OP_TIMER), s1.timer.eq(timer_head),
                         s1.qpn.eq(issue_qpn)]
        # S2's write-backs reach the tables a cycle later, from a register (`prev`), so no
        # logic sits in front of the block RAM's write port. S1 -> S2: the entry S2 starts
        # from is this cycle's write-back of the same QP, else the last cycle's (`prev`, not
        # in the table yet), else the one before (`prev2`, written while the table was
        # read), else the table's data. An operation that waits in S1 captures that entry
        # every cycle it waits (`s1_row`, with S2's write of the cycle if it fires), and
        # from its second cycle on starts from it: only S2's write of the cycle is newer.
        # Only the valid bits are reset: the rest means nothing while they are low.
        written = data.StructLayout({"qpn": config.qpn_bits, "state": layouts.state})
        prev = Signal(written, reset_less=True)
        prev2 = Signal(written, reset_less=True)
        prev_valid = Signal()
        prev2_valid = Signal()
        m.d.sync += [prev_valid.eq(wb.fire), prev.qpn.eq(wb.qpn),
                     prev.state.eq(wb.state), prev2_valid.eq(prev_valid), prev2.eq(prev)]
        for wp, part in ((qp_wp, prev.state.qp), (bm_wp, prev.state.bm),
                         (wt_wp, prev.state.wt)):
            m.d.comb += [wp.addr.eq(prev.qpn), wp.data.eq(part), wp.en.eq(prev_valid)]
        stored = Signal(layouts.state)
        m.d.comb += [stored.qp.eq(qp_rp.data), stored.bm.eq(bm_rp.data),
                     stored.wt.eq(wt_rp.data)]
        # S1 waited last cycle: its entry and MR entry are the captured ones, not the tables'.
        s1_held = Signal()
        s1_row = Signal(layouts.state, reset_less=True)
        s1_mr = Signal(layouts.mr, reset_less=True)
        m.d.sync += s1_held.eq(s1_valid & ~s1_move)
        # S1 moves on only when S2 executes (or is empty): the match need not wait on S2
        # firing.
        same_qpn = wb.qpn == s1.qpn
        same_now = wb.row_write & same_qpn
        same_prev = prev_valid & (prev.qpn == s1.qpn)
        same_prev2 = prev2_valid & (prev2.qpn == s1.qpn)
        older = Signal(layouts.state)       # the entry before S2's write of this cycle
        m.d.comb += older.eq(Mux(s1_held, s1_row,
                                 Mux(same_prev, prev.state, Mux(same_prev2, prev2.state,
                                                                stored))))
        m.d.sync += s1_row.eq(Mux(wb.fire & same_qpn, wb.state, older))
        # The MR table likewise (written by MR_WRITE commands).
        mr_prev = Signal(data.StructLayout({"valid": 1, "slot": max(1, mr_bits),
                                            "entry": layouts.mr}))
        m.d.sync += [mr_prev.valid.eq(mr_wp.en), mr_prev.slot.eq(mr_wp.addr),
                     mr_prev.entry.eq(mr_wp.data)]
        s1_slot = s1.beat.header.reth.rkey[:mr_bits]
        mr_now = mr_wp.en & (mr_wp.addr == s1_slot)
        mr_same_prev = mr_prev.valid & (mr_prev.slot == s1_slot)
        # S1 checks the packet against its MR entry (forwarded like the QP entry) and decodes
        # its header; S2 finds the results in `checks`.
        mr_entry = Signal(layouts.mr)
        mr_older = Signal(layouts.mr)
        m.d.comb += [
            mr_older.eq(Mux(s1_held, s1_mr, Mux(mr_same_prev, mr_prev.entry, mr_rp.data))),
            mr_entry.eq(Mux(mr_now, mr_wp.data, mr_older)),
        ]
        m.d.sync += s1_mr.eq(mr_entry)
        s1_checks = header_checks(config, s1.beat.header, mr_entry, s1_va_end)
        # Where the packet's PSN lies, against each candidate for the row S2 will start from
        # (the row before S2's write of the cycle, and that write), selected with the row:
        # S2 decides from registers, without a carry chain across the PSN in its loop.
        s1_psn = s1.beat.header.bth.psn
        dist_older = distance_checks(config, s1_psn, older.qp.epsn, older.qp.mpr,
                                     older.bm.rcv)
        dist_now = distance_after_step(m, config, s1_psn, wb)
        out = self.o.payload
        m.d.comb += [
            *(out.dist[name].eq(Mux(same_now, dist_now[name], dist_older[name]))
              for name in distance_layout(config).members),
            out.op.eq(s1), out.mr.eq(mr_entry), out.va_end.eq(s1_va_end),
            out.cmd_limit.eq(s1.cmd.base + s1.cmd.length),
            out.qp_write_ok.eq((s1.cmd.cmd == ResponderCommand.QP_WRITE) &
                               Cat(qp_write_checks(config, s1.cmd).values()).all()),
            *(out.checks[name].eq(value) for name, value in s1_checks.items()),
            out.row.eq(Mux(same_now, wb.state, older)),
            out.same_now.eq(same_now),
            # S2 writes last_nak = cycles only for a NACK it sends: then same_now, and the
            # execute stage counts from its own register.
            out.since_older.eq((self.cycles + 1 - older.qp.last_nak)[:32]),
        ]

        if self._observe:
            obs = self.obs
            for mem, part in ((qp_mem, obs.row.qp), (bm_mem, obs.row.bm), (wt_mem, obs.row.wt)):
                port = mem.read_port(domain="comb")
                m.d.comb += [port.addr.eq(self.obs_qpn), part.eq(port.data)]
            mr_port = mr_mem.read_port(domain="comb")
            s1_hdr = s1.beat.header
            m.d.comb += [
                mr_port.addr.eq(self.obs_slot[:mr_bits]), obs.mr_row.eq(mr_port.data),
                obs.s1_valid.eq(s1_valid), obs.s1.eq(s1), obs.in_packet.eq(in_packet),
                obs.s1_va_end_ok.eq(
                    ~(s1_valid & ((s1.kind == OP_FIRST) | (s1.kind == OP_BEAT))) |
                    (s1_va_end == s1_hdr.reth.va + s1_hdr.reth.dma_len)),
                obs.s1_older.eq(older), obs.s1_mr_older.eq(mr_older),
            ]
        return m
