"""Formal properties of the requester's send window (``hdl/transport/requester.py``).

:class:`RequesterProperties` wraps a :class:`~hdl.transport.requester.Requester` with free
inputs and checks, for one QP (any: ``watch_qpn`` is an ``AnyConst``), over its ports only:

``window``
    Every new (not retransmitted) data packet of the QP on ``send`` carries the next PSN:
    new PSNs are consecutive, none is sent twice and none skipped; and it lies inside the
    window, ``psn - una < mpr x 128`` (24-bit serial arithmetic), so the outstanding range
    ``next_psn - una`` never exceeds the QP's ``mpr x 128``. ``una`` is the highest
    ``cack_psn + 1`` (BTH.psn of a SACK) fed on ``rx`` for the QP, ``mpr`` the one of the last
    accepted ``QP_WRITE``; both restart (with ``next_psn``) at an accepted ``QP_WRITE``.
``cover``
    ``Cover`` statements: a new packet of the QP is sent, an ACK moves ``una``, a second
    packet follows.

Assumptions, all of them:

- no reset during the check;
- *honest ACKs*: a SACK on ``rx`` naming the watched QP acknowledges only PSNs already
  sent: ``cack_psn + 1`` is not beyond the wrapper's next PSN. (An ACK for a PSN never sent
  cannot come from a real responder; the requester drops one beyond its own next PSN, but
  the wrapper's ``una`` must not move on it either.)
- inputs the requester only stores and copies (addresses, rkey, immediate, wr_id, time,
  the ``sent`` EV reports, and header fields other than the kind, the BTH QP and PSN, the
  AETH syndrome and the SETH fields the requester reads, which alias the NETH reason) are
  held at 0 or idle: they cannot move a PSN.

Taking ``una`` at the moment an ACK is taken (the requester applies it a cycle later), and
counting ACKs the requester may drop, only makes the wrapper's ``una`` larger or equal, so the
window check it makes is never stricter than the requester's own rule.
"""

from amaranth import *
from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Assume, Cover

from .. import protocol as P
from ..config import PSN_CHUNK, NicConfig
from ..packet.headers import PacketKind
from ..transport.req_defs import RequesterCommand
from ..transport.requester import Requester
from ..util import validating
from .common import check_wrapper, drive_free, psn_ge, psn_gt, stream_xfer

__all__ = ["RequesterProperties", "formal_config", "drive_inputs", "CHECKS"]

CHECKS = ("window", "cover")


def formal_config():
    """The smallest configuration: 2 QPs, a 128-PSN window, 2 WR slots, a WR pool of 4
    entries (every value of its 2-bit index an entry), a PSN pool of 2 chunks (every value
    of its 1-bit index a chunk: fewer than one QP's window needs, so packets wait for one),
    one segmenter context (the invariants observe one), 64-bit datapath."""
    return NicConfig(qps=2, mpr_units=1, data_width=64, ports=1,
                     evs_per_profile=4, ev_profiles=1, max_wimm=1, wr_slots=2, wr_pool=4,
                     psn_pool=2 * PSN_CHUNK, segmenters=1)


def drive_inputs(m, dut):
    """Free inputs and the assumption of no reset for a :class:`Requester` ``dut``: every
    input the requester decides on is free, the ones it only stores and copies are 0 or
    idle (the module docstring lists them)."""
    m.d.comb += Assume(~ResetSignal())
    wr = dut.wr.payload
    rx = dut.rx.payload.header
    m.d.comb += [dut.wr.payload.eq(0), dut.rx.payload.eq(0), dut.sent.valid.eq(0),
                 dut.sent.payload.eq(0), dut.now_ns.eq(0)]
    seth = rx.ctl.sack.seth
    drive_free(m, dut.wr.valid, wr.qpn, wr.opcode, wr.length,
               dut.rx.valid, rx.kind, rx.bth.dqpn, rx.bth.psn, rx.aeth.syndrome,
               seth.m, seth.pr, seth.ack_psn_offset, seth.cack_psn, seth.sack_psn_offset,
               seth.sack_bitmap,
               dut.retx.valid, dut.retx.payload, dut.ctl.valid, dut.ctl.payload,
               dut.send.ready, dut.feedback.ready, dut.completion.ready,
               dut.qp_error.ready, dut.ctl_resp.ready)


class RequesterProperties(Elaboratable):
    """A :class:`Requester` with free inputs and the properties named by ``check``.

    Parameters
    ----------
    config : NicConfig
    check : str
        One of :data:`CHECKS`.
    """

    def __init__(self, *, config, check):
        with validating(self):
            check_wrapper(config, check, CHECKS)
        self.config = config
        self.check = check
        self.dut = Requester(config=config)

    def elaborate(self, platform):
        m = Module()
        config = self.config
        m.submodules.dut = dut = self.dut

        drive_inputs(m, dut)
        rx = dut.rx.payload.header

        watch_qpn = Signal(config.qpn_bits)
        m.d.comb += [watch_qpn.eq(AnyConst(config.qpn_bits)), Assume(watch_qpn < config.qps)]

        # The wrapper's view of the QP: next new PSN, una, mpr (reset: all 0, like the tables).
        next_psn = Signal(P.PSN_BITS)
        una = Signal(P.PSN_BITS)
        mpr = Signal(4)

        # Honest ACKs, and una from them.
        cum_next = (rx.bth.psn + 1)[:P.PSN_BITS]
        rx_mine = (rx.bth.dqpn == watch_qpn) & (rx.kind == PacketKind.SACK)
        m.d.comb += Assume(~dut.rx.valid | ~rx_mine | psn_ge(next_psn, cum_next))
        rx_moves = stream_xfer(dut.rx) & rx_mine & psn_gt(cum_next, una)
        with m.If(rx_moves):
            m.d.sync += una.eq(cum_next)

        # New packets of the QP.
        ctx = dut.send.payload.context
        sent_new = Signal()
        m.d.comb += sent_new.eq(stream_xfer(dut.send) & (dut.send.payload.qpn == watch_qpn) &
                                ~ctx.retransmission)
        if self.check == "window":
            with m.If(sent_new):
                m.d.comb += [
                    Assert(ctx.psn == next_psn, "new PSNs not consecutive"),
                    Assert((ctx.psn - una)[:P.PSN_BITS] < (mpr << 7), "window exceeded"),
                ]
        with m.If(sent_new):
            m.d.sync += next_psn.eq(ctx.psn + 1)

        # An accepted QP_WRITE of the QP restarts next_psn = una = psn, with its mpr. It is
        # written in the cycle before its response appears; new packets of the QP cannot be
        # on `send` then (a QP_WRITE waits until the `send` register holds none of the QP), so
        # the wrapper applies it when the response rises. One accepted with WRs outstanding
        # (state ERROR) restarts nothing, but the QP sends no new packet until the next.
        cmd = dut.ctl.payload
        pending_write = Signal()
        pending_psn = Signal(P.PSN_BITS)
        pending_mpr = Signal(4)
        with m.If(stream_xfer(dut.ctl)):
            m.d.sync += [
                pending_write.eq((cmd.cmd == RequesterCommand.QP_WRITE) & (cmd.qpn == watch_qpn)),
                pending_psn.eq(cmd.psn), pending_mpr.eq(cmd.mpr),
            ]
        resp_valid_before = Signal()
        m.d.sync += resp_valid_before.eq(dut.ctl_resp.valid)
        written = dut.ctl_resp.valid & ~resp_valid_before & pending_write & \
            (dut.ctl_resp.payload.errno == P.Errno.OK)
        with m.If(written):
            m.d.sync += [next_psn.eq(pending_psn), una.eq(pending_psn), mpr.eq(pending_mpr)]

        if self.check == "cover":
            started = Signal()
            with m.If(sent_new):
                m.d.sync += started.eq(1)
            m.d.comb += [Cover(sent_new), Cover(sent_new & started), Cover(rx_moves & started)]
        return m
