"""Formal properties of the responder's sequence tracking (``hdl/transport/responder.py``).

:class:`ResponderProperties` wraps a :class:`~hdl.transport.responder.Responder` whose every
input is free (``AnySeq``: packets, commands, time, and the ``ready`` of every output), and
checks over its ports only:

``cum_psn``
    For one QP (any: ``watch_qpn`` is an ``AnyConst``), the ``cack_psn`` of its successive
    SACKs never moves backwards in 24-bit serial arithmetic, except across a ``QP_WRITE``
    with ``set_psn`` that the responder accepts.
``placed_once``
    For one QP and one PSN (both ``AnyConst``), at most one packet gets the verdict PLACED
    between two accepted ``QP_WRITE set_psn`` commands of that QP; and every verdict strobe
    answers exactly one packet taken (no verdict without a packet, none lost).
``never_placed``
    A deliberately wrong property ("nothing is ever placed"): the harness must FAIL it, which
    shows that placement is reachable within the depth and that the checks can fail.
``cover``
    ``Cover`` statements for the events the properties talk about (a placement, a duplicate
    of a placed PSN, an ACK that advances the cumulative PSN, a restart), so a PASS of the
    asserts is not vacuous.

Assumptions, all of them:

- no reset during the check (the initial state is the reset state);
- *tagging*: a received packet carries the low 16 bits of its BTH ``dqpn`` in its TSETH
  ``tx_timestamp``. The responder only echoes the timestamp (as the SACK's CC_STATE
  ``tx_timestamp``), never decides on it; the tag tells the wrapper which QP a SACK belongs to
  (the SACK's ``dqpn`` is the QP's remote QPN, which the control plane may give two QPs alike;
  a SACK only ever answers a QP that exists, whose number the 16 bits hold);
- fields the responder only copies into replies, memory writes or completions (addresses,
  flow label, UDP port, EV index, payload bytes, immediate, ``now_ns``) are 0.

Everything else is free: valid, the deciding header fields and the commands may change at
any cycle (the stream rules are not even needed), every command kind and field value is
allowed, and every output may be backpressured.

The wrapper relates events to each other by the orders ``docs/responder.md`` documents:
verdict strobes come in packet order, a command takes effect between two packets, and a
restart (QP_WRITE with ``set_psn``) is taken only when no reply older than it is held (the
wrapper also allows one still waiting on ``ack``).
"""

from amaranth import *
from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume, Cover

from .. import protocol as P
from ..config import NicConfig
from ..packet.headers import PacketKind
from ..transport.resp_defs import ResponderCommand, ResponderVerdict
from ..transport.responder import Responder
from ..util import validating
from .common import check_wrapper, drive_free, psn_ge, stream_xfer

__all__ = ["ResponderProperties", "formal_config", "drive_inputs", "CHECKS"]

CHECKS = ("all", "cum_psn", "placed_once", "never_placed", "cover")

#: Packets taken whose verdict has not been strobed yet: at most three (one in the read stage,
#: one in the execute stage, one whose strobe is registered); one more entry to catch a
#: pipeline that holds more.
_QUEUE_DEPTH = 4


def formal_config():
    """The smallest configuration: 2 QPs, a 128-PSN window, 64-bit datapath."""
    return NicConfig(qps=2, mpr_units=1, data_width=64, ports=1,
                     evs_per_profile=4, ev_profiles=1, max_wimm=2, wr_slots=2)


def drive_inputs(m, dut):
    """Free inputs and the wrapper's assumptions (the module docstring lists them) for a
    :class:`Responder` ``dut``; return nothing."""
    m.d.comb += Assume(~ResetSignal())
    drive_free(m, dut.i.valid, dut.ctl.valid, dut.ctl.payload, dut.place.ready,
               dut.ack.ready, dut.completion.ready, dut.ctl_resp.ready)
    # Packet fields the responder decides on are free; those it only copies into replies,
    # memory writes or completions (addresses, payload bytes, EV, timestamps, immediate,
    # time) are held at 0: they cannot change a verdict or a PSN, and free they would
    # only make the model bigger.
    beat = dut.i.payload
    header = beat.header
    m.d.comb += [beat.eq(0), dut.now_ns.eq(0)]
    drive_free(m, beat.last, header.trimmed, header.tclass[:2], header.bth.opcode,
               header.bth.psn, header.bth.dqpn, header.bth.ackreq, header.reth.dma_len,
               header.reth.va, header.reth.rkey)
    # Payload: only whether a beat carries bytes matters (keep != 0 needs `place`).
    m.d.comb += beat.keep.eq(Mux(AnySeq(1), 0xFF, 0))
    # The tag: a SACK echoes the TSETH timestamp, which names the QP it belongs to.
    m.d.comb += header.tseth.tx_timestamp.eq(header.bth.dqpn[:P.TIMESTAMP_BITS])


class ResponderProperties(Elaboratable):
    """A :class:`Responder` with free inputs and the properties named by ``check``.

    Parameters
    ----------
    config : NicConfig
    check : str
        One of :data:`CHECKS`.
    mr_slots, timers, completions : int
        The responder's own parameters, smallest by default (smaller model, faster proofs).
    """

    def __init__(self, *, config, check, mr_slots=1, timers=1, completions=2):
        with validating(self):
            check_wrapper(config, check, CHECKS)
        self.config = config
        self.check = check
        self.dut = Responder(config=config, mr_slots=mr_slots, timers=timers,
                             completions=completions)

    def elaborate(self, platform):
        m = Module()
        config = self.config
        m.submodules.dut = dut = self.dut
        check = self.check

        drive_inputs(m, dut)
        header = dut.i.payload.header

        watch_qpn = Signal(config.qpn_bits)
        watch_psn = Signal(P.PSN_BITS)
        m.d.comb += [watch_qpn.eq(AnyConst(config.qpn_bits)), watch_psn.eq(AnyConst(P.PSN_BITS)),
                     Assume(watch_qpn < config.qps)]

        # A QP_WRITE with set_psn that the responder accepts (same rule as its errno check)
        # restarts the watched QP's receive state.
        cmd = dut.ctl.payload
        accepted = (cmd.cmd == ResponderCommand.QP_WRITE) & (cmd.qpn == watch_qpn) & \
            Cat(cmd.state == int(s) for s in P.QpState).any() & \
            (cmd.mpr != 0) & (cmd.mpr <= config.mpr_units) & \
            (cmd.max_wimm != 0) & (cmd.max_wimm <= config.max_wimm)
        restart = Signal()
        m.d.comb += restart.eq(stream_xfer(dut.ctl) & accepted & cmd.set_psn)

        # --- Property 1: the cumulative PSN in the watched QP's replies ----------------------
        ack = dut.ack.payload.header
        ack_xfer = stream_xfer(dut.ack)
        ack_mine = Signal()
        m.d.comb += ack_mine.eq(ack_xfer & (ack.kind == PacketKind.SACK)
                                & (ack.ctl.sack.cc_state.tx_timestamp == watch_qpn))
        cum = ack.ctl.sack.seth.cack_psn
        have_cum = Signal()             # a reply of this epoch has been seen ...
        last_cum = Signal(P.PSN_BITS)   # ... and this was its cum_psn
        restarted = Signal()            # a restart was taken in the previous cycle
        clear_after_ack = Signal()      # the reply waiting on `ack` predates a restart
        m.d.sync += restarted.eq(restart)
        if check in ("all", "cum_psn"):
            with m.If(ack_mine & have_cum):
                m.d.comb += Assert(psn_ge(cum, last_cum), "cum_psn moved backwards")
        with m.If(ack_mine):
            m.d.sync += [have_cum.eq(1), last_cum.eq(cum)]
        # The reply held on `ack` in the cycle after a restart is taken was made before the
        # command executed (a command takes effect between packets and `ack` holds one
        # reply): it still belongs to the old epoch, and every later one to the new.
        old_waiting = restarted & dut.ack.valid
        with m.If((restarted & ~dut.ack.valid) | ((old_waiting | clear_after_ack) & ack_xfer)):
            m.d.sync += have_cum.eq(0)
        with m.If(ack_xfer):
            m.d.sync += clear_after_ack.eq(0)
        with m.Elif(old_waiting):
            m.d.sync += clear_after_ack.eq(1)

        # --- Property 2: a PSN is placed at most once ----------------------------------------
        # A queue of the packets taken (is it the watched QP and PSN? does a restart follow
        # it?), popped by the verdict strobes, which come in packet order.
        in_packet = Signal()
        i_xfer = stream_xfer(dut.i)
        with m.If(i_xfer):
            m.d.sync += in_packet.eq(~dut.i.payload.last)
        push = i_xfer & ~in_packet
        push_watched = (header.bth.dqpn == watch_qpn) & (header.bth.psn == watch_psn)
        pop = dut.verdict_valid
        count = Signal(range(_QUEUE_DEPTH + 1))
        watched = [Signal(name=f"q_watched{k}") for k in range(_QUEUE_DEPTH)]
        clear_after = [Signal(name=f"q_clear_after{k}") for k in range(_QUEUE_DEPTH)]
        m.d.comb += [
            Assert(~pop | (count != 0), "a verdict without a packet"),
            Assert(~push | pop | (count != _QUEUE_DEPTH), "more packets in flight than expected"),
        ]
        # Shift on pop, then append at the first free entry.
        remaining = count - pop
        for k in range(_QUEUE_DEPTH):
            src_w = watched[k + 1] if k + 1 < _QUEUE_DEPTH else C(0)
            src_c = clear_after[k + 1] if k + 1 < _QUEUE_DEPTH else C(0)
            new_w = Mux(pop, src_w, watched[k])
            new_c = Mux(pop, src_c, clear_after[k])
            with m.If(push & (remaining == k)):
                m.d.sync += [watched[k].eq(push_watched), clear_after[k].eq(0)]
            with m.Else():
                m.d.sync += [watched[k].eq(new_w),
                             clear_after[k].eq(new_c | (restart & (remaining == k + 1)))]
        m.d.sync += count.eq(remaining + push)

        placed_flag = Signal()          # the watched PSN was placed in this epoch
        placed_now = pop & (dut.verdict == ResponderVerdict.PLACED) & watched[0]
        if check in ("all", "placed_once"):
            m.d.comb += Assert(~placed_now | ~placed_flag, "a PSN placed twice")
        if check == "never_placed":
            m.d.comb += Assert(~placed_now, "deliberately wrong: nothing is ever placed")
        with m.If(placed_now):
            m.d.sync += placed_flag.eq(1)
        # A restart with no packet older than it pending clears at once; otherwise after the
        # verdict of the last packet older than it.
        with m.If((restart & (remaining == 0)) | (pop & clear_after[0])):
            m.d.sync += placed_flag.eq(0)

        if check == "cover":
            duplicate_now = pop & (dut.verdict == ResponderVerdict.DUPLICATE) & watched[0]
            m.d.comb += [
                Cover(placed_now),
                Cover(duplicate_now & placed_flag),
                Cover(ack_mine & have_cum & (cum != last_cum)),
                Cover(restart & placed_flag),
            ]
        return m
