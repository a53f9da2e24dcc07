"""The requester's control FSM (:class:`RequesterControl`): commands in, responses out."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import validating
from .req_common import ControlSignature, check_config, check_observe, log2
from .req_defs import (
    ACKREQ_EVERY_BITS,
    INFER_K_BITS,
    INFER_K_DEFAULT,
    REO_WND_BITS,
    RequesterCommand,
    cc_page,
    requester_command_layout,
    requester_response_layout,
    slot_depth,
    timer_page,
)
from .req_tables import table_access_signature

__all__ = ["control_observation_layout", "RequesterControl"]


def control_observation_layout(config):
    """What ``RequesterControl(observe=True)`` shows on ``obs``: whether it holds a command
    (``busy``), and answers it (``resp``), and that command's kind and QP."""
    return data.StructLayout({"busy": 1, "resp": 1, "cmd": RequesterCommand, "qpn": 24})


class RequesterControl(wiring.Component):
    """Decide control commands, one at a time, with the engines held.

    A command is taken (IDLE), then the engines are held (``control.hold``) until the ones
    that write QP tables are idle (``busy`` low) and, for a QP_WRITE, every send request
    already decided has left (``resends_pending`` low and no packet of the QP in the
    ``send`` register); then it is decided (DECIDE, one cycle: CONFIG sets the settings;
    QP_READ reads a page of the QP's tables; QP_WRITE checks its fields, resets the QP in
    every table (``control.write``: each table's owner muxes it into its own write port) or,
    for ERROR with WRs outstanding, fails the QP and flushes them (``control.flush``)); the
    response is offered (RESP) until taken. The only writer of ``cfg``.

    Hazards: the QP's entries are read through transparent ports while the engines are held,
    so the decision sees every write before it.

    Members
    -------
    tables : ``In(table_access_signature(config, "control"))``
    cmd : ``In(stream.Signature(requester_command_layout(config)))``
    resp : ``Out(stream.Signature(requester_response_layout(config)))``
    control : ``Out(ControlSignature(config))``
        To every engine.
    busy : ``In(1)``
        An engine that writes QP tables is not idle (ACK processing's A1 and A2, the completion
        engine, the inference unit, the timer scanner's V1).
    resends_pending : ``In(1)``
        Resends are queued or under way (trim and walk queues, walker, retransmitter).
    sending, sending_qpn : ``In(1)``, ``In(config.qpn_bits)``
        The ``send`` register holds a packet, of this QP.
    obs : ``Out(control_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.

    Parameters
    ----------
    config : NicConfig
    nscc : bool
        The build has NSCC: CONFIG ``cc_nscc`` is kept (else it reads as 0).
    observe : bool
        Observation ports for the formal proofs.
    """

    def __init__(self, *, config, nscc=False, observe=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
            if not isinstance(nscc, bool):
                raise TypeError(f"nscc must be a bool, not {nscc!r}")
        self._config = config
        self._nscc = nscc
        self._observe = observe
        super().__init__({
            "tables": In(table_access_signature(config, "control")),
            "cmd": In(stream.Signature(requester_command_layout(config))),
            "resp": Out(stream.Signature(requester_response_layout(config))),
            "control": Out(ControlSignature(config)),
            "busy": In(1),
            "resends_pending": In(1),
            "sending": In(1),
            "sending_qpn": In(config.qpn_bits),
            **({"obs": Out(control_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        sb = log2(slot_depth(cfg))
        reads = self.tables.read
        wp = self.tables.write.cfg

        CTL_IDLE, CTL_HOLD, CTL_DECIDE, CTL_RESP = range(4)
        ctl_state = Signal(2)
        ctl_req = Signal(requester_command_layout(cfg))
        ctl_errno = Signal(P.Errno)
        ctl_data = Signal(64)
        ackreq_every = Signal(ACKREQ_EVERY_BITS)
        infer_k = Signal(INFER_K_BITS, init=INFER_K_DEFAULT)
        reo_wnd = Signal(REO_WND_BITS)
        cc_on = Signal()
        cc_nscc = Signal()
        ctl_write = Signal()            # this cycle: QP_WRITE writes every QP table
        # This cycle: QP_WRITE ERROR on a QP with outstanding WRs moves it to ERROR and wakes
        # the completion engine, which flushes them (the fatal-NAK flush, WR_FLUSH_ERR).
        ctl_flush = Signal()
        ctl_qpn = ctl_req.qpn[:qb]
        ctl_ports = {name: getattr(reads, name) for name in (
            "cfg", "sq", "next_psn", "ack", "cq", "tmr", "cc", "trig_set", "trig_seen")}
        for port in ctl_ports.values():
            m.d.comb += port.addr.eq(ctl_qpn)
        c_ack = ctl_ports["ack"].data
        out = self.control
        m.d.comb += [
            out.hold.eq((ctl_state == CTL_HOLD) | (ctl_state == CTL_DECIDE)),
            out.write.eq(ctl_write), out.flush.eq(ctl_flush), out.qpn.eq(ctl_qpn),
            out.psn.eq(ctl_req.psn), out.mpr.eq(ctl_req.mpr),
            out.flush_una.eq(c_ack.una),
            # The flush queues a completion trigger unless one is queued for the QP.
            out.flush_trigger.eq(ctl_flush & (ctl_ports["trig_set"].data
                                              == ctl_ports["trig_seen"].data)),
            out.flush_trigger_bit.eq(~ctl_ports["trig_seen"].data),
            out.ackreq_every.eq(ackreq_every), out.infer_k.eq(infer_k),
            out.reo_wnd.eq(reo_wnd), out.cc_on.eq(cc_on), out.cc_nscc.eq(cc_nscc),
        ]
        c_cfg, c_sq, c_cq = (ctl_ports[n].data for n in ("cfg", "sq", "cq"))
        c_next = ctl_ports["next_psn"].data
        state_ok = Signal()
        with m.Switch(ctl_req.state):
            with m.Case(*(int(s) for s in P.QpState)):
                m.d.comb += state_ok.eq(1)
        bad_qp_write = (~state_ok | (ctl_req.mpr == 0) | (ctl_req.mpr > cfg.mpr_units)
                        | (ctl_req.max_wimm == 0) | (ctl_req.max_wimm > cfg.max_wimm)
                        | (ctl_req.timeout > P.LOCAL_ACK_TIMEOUT_MAX)
                        | (ctl_req.retry_exp > P.RETRY_EXPONENTIAL_MAX))
        c_outstanding = (c_sq.tail - c_cq.head)[:sb + 1]
        # A QP_WRITE first lets every send request already decided leave: the TRIM and walk
        # queues, the walker and R1-R3 run dry (nothing refills them while the engines are
        # held and `retx` waits) and the `send` register holds no packet of the QP. Nothing
        # decided under the QP's old state leaves `send` after the response, neither after an
        # ERROR nor after a re-initialisation with a new PSN.
        ctl_drain_wait = Signal()
        m.d.comb += ctl_drain_wait.eq(
            (ctl_req.cmd == RequesterCommand.QP_WRITE)
            & (self.resends_pending | (self.sending & (self.sending_qpn == ctl_qpn))))
        m.d.comb += [
            self.cmd.ready.eq(ctl_state == CTL_IDLE),
            self.resp.valid.eq(ctl_state == CTL_RESP),
            self.resp.payload.errno.eq(ctl_errno),
            self.resp.payload.data.eq(ctl_data),
        ]
        with m.If(ctl_write):
            m.d.comb += [
                wp.addr.eq(ctl_qpn), wp.en.eq(1),
                wp.data.state.eq(ctl_req.state), wp.data.mpr.eq(ctl_req.mpr),
                wp.data.max_wimm.eq(ctl_req.max_wimm),
                wp.data.timeout.eq(ctl_req.timeout),
                wp.data.retry_linear.eq(ctl_req.retry_linear),
                wp.data.retry_exp.eq(ctl_req.retry_exp),
            ]
        with m.Switch(ctl_state):
            with m.Case(CTL_IDLE):
                with m.If(self.cmd.valid):
                    m.d.sync += [ctl_req.eq(self.cmd.payload), ctl_state.eq(CTL_HOLD)]
            with m.Case(CTL_HOLD):
                with m.If(~self.busy & ~ctl_drain_wait):
                    m.d.sync += ctl_state.eq(CTL_DECIDE)
            with m.Case(CTL_DECIDE):
                m.d.sync += [ctl_state.eq(CTL_RESP), ctl_errno.eq(P.Errno.OK), ctl_data.eq(0)]
                with m.Switch(ctl_req.cmd):
                    with m.Case(RequesterCommand.CONFIG):
                        m.d.sync += [ackreq_every.eq(ctl_req.ackreq_every),
                                     infer_k.eq(ctl_req.infer_k), cc_on.eq(ctl_req.cc),
                                     reo_wnd.eq(ctl_req.reo_wnd),
                                     cc_nscc.eq(ctl_req.cc_nscc & self._nscc)]
                    with m.Case(RequesterCommand.QP_READ):
                        with m.If(ctl_req.qpn >= cfg.qps):
                            m.d.sync += ctl_errno.eq(P.Errno.ENOENT)
                        with m.Elif(ctl_req.page == 0):
                            m.d.sync += ctl_data.eq(Cat(
                                Mux(c_ack.error, int(P.QpState.ERROR), c_cfg.state)[:3],
                                C(0, 5), c_next, c_ack.una))
                        with m.Elif(ctl_req.page == 1):
                            m.d.sync += ctl_data.eq(Cat(
                                c_outstanding, C(0, 7 - sb),
                                (c_sq.wimm - c_cq.wimm)[:8], c_cfg.mpr, C(0, 4),
                                c_cfg.max_wimm, Value.cast(c_ack.err_status),
                                C(0, 3), c_ack.err_psn))
                        with m.Elif(ctl_req.page == 2):
                            c_tmr = ctl_ports["tmr"].data
                            m.d.sync += ctl_data.eq(timer_page(
                                armed=c_tmr.armed, retries=c_tmr.retries, start=c_tmr.start))
                        with m.Else():
                            c_cc = ctl_ports["cc"].data
                            m.d.sync += ctl_data.eq(cc_page(
                                cwnd=c_cc.cwnd, acc=c_cc.acc, recover=c_cc.recover))
                    with m.Case(RequesterCommand.QP_WRITE):
                        with m.If(ctl_req.qpn >= cfg.qps):
                            m.d.sync += ctl_errno.eq(P.Errno.ENOENT)
                        with m.Elif(bad_qp_write):
                            m.d.sync += ctl_errno.eq(P.Errno.EINVAL)
                        with m.Elif(c_outstanding != 0):
                            # ERROR flushes the outstanding WRs (a QP already in ERROR keeps
                            # its flush and statuses); any other state waits for them.
                            with m.If(ctl_req.state == P.QpState.ERROR):
                                m.d.comb += ctl_flush.eq(~c_ack.error)
                            with m.Else():
                                m.d.sync += ctl_errno.eq(P.Errno.EBUSY)
                        with m.Else():
                            m.d.comb += ctl_write.eq(1)
                    with m.Default():
                        m.d.sync += ctl_errno.eq(P.Errno.EINVAL)
            with m.Case(CTL_RESP):
                with m.If(self.resp.ready):
                    m.d.sync += ctl_state.eq(CTL_IDLE)
        if self._observe:
            m.d.comb += [self.obs.busy.eq(ctl_state != CTL_IDLE),
                         self.obs.resp.eq(ctl_state == CTL_RESP),
                         self.obs.cmd.eq(ctl_req.cmd), self.obs.qpn.eq(ctl_req.qpn)]
        return m
