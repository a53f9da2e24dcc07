"""The requester's retransmit timer scanner (:class:`TimerScanner`) and its retry policy as
logic (:func:`retry_expiry_gateware`). ``docs/recovery.md`` has the rules."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import validating
from .req_common import PSN, ControlSignature, check_config, events_layout, psn_sub
from .req_defs import RETRY_COUNT_BITS, RETRY_EXPONENT_MAX, WalkKind, walk_layout
from .req_tables import table_access_signature

__all__ = ["retry_expiry_gateware", "arm_layout", "poll_layout", "TimerScanner"]


def retry_expiry_gateware(t, linear, exponential, retries):
    """:func:`~hdl.transport.req_defs.retry_expiry` as logic: ``(exponent, exhausted)`` with
    ``wait_units = 2**exponent`` (``tests/hdl/test_recovery.py`` checks it against the Python
    function)."""
    beyond = Mux(retries > linear, retries - linear, 0)
    exponent = t + beyond
    exponent = Mux(exponent > RETRY_EXPONENT_MAX, RETRY_EXPONENT_MAX, exponent)
    exhausted = (exponential != P.RETRY_INFINITE) & (retries >= linear + exponential)
    return exponent[:5], exhausted


def arm_layout(config):
    """An arm event (segmenter -> scanner): QP ``qpn`` sent its oldest outstanding PSN at
    ``time``."""
    return data.StructLayout({"qpn": config.qpn_bits, "time": 32})


def poll_layout(config):
    """A reorder-window poll (scanner -> inference unit): a live QP with PSNs outstanding."""
    return data.StructLayout({"qpn": config.qpn_bits, "una": PSN, "next": PSN})


class TimerScanner(wiring.Component):
    """Per-QP retransmit timers in the ``tmr`` table, visited one QP per cycle.

    V0 picks the QP (an arm event first, else the next QP of the scan) and reads its tables; V1
    registers their data; V2 decides and writes ``tmr``. One visit per cycle while the control
    does not hold; a scan period is ``qps`` cycles plus the arm events. On each visit of a live
    QP with PSNs outstanding: an arm event starts the timer at the event's time; an unarmed
    timer starts now; una moved since the last visit restarts it at the time una last advanced
    (``progress``); an expired timer asks ACK processing to fail the QP (retries exhausted) or
    asks the walker to resend ``[una, next_psn)`` (a TIMEOUT walk) and counts a retry. A request
    whose queue is full changes nothing: the next visit asks again. Other QPs are disarmed.

    Hazards: reads ``cfg``, ``ack``, ``next_psn`` and ``progress`` of the other engines
    through transparent ports, two cycles before deciding: a write after the read is seen at
    the next visit. The ``tmr`` write of the visit ahead (in V2 while this one is in V1) is
    registered with its select and picked in V2, so visits of one QP on consecutive cycles
    see each other. A QP_WRITE resets the QP's entry (``control.write``).

    Members
    -------
    tables : ``In(table_access_signature(config, "scanner"))``
    control : ``In(ControlSignature(config))``
    now : ``In(32)``
        The time in 1.024 us units.
    arm : ``In(stream.Signature(arm_layout(config)))``
        Arm events from the segmenter; taken whenever the control does not hold.
    poll : ``Out(stream.Signature(poll_layout(config), always_ready=True))``
        Reorder-window polls for the inference unit (when CONFIG reo_wnd is on).
    timeout : ``Out(stream.Signature(walk_layout(config)))``
        TIMEOUT walks for the walker.
    exceed : ``Out(stream.Signature(config.qpn_bits))``
        QPs whose retries are exhausted, for ACK processing.
    busy : ``Out(1)``
        A visit is in V1 or V2.
    events : ``Out(events_layout(COUNTERS))``
    """

    COUNTERS = ("timeouts",)

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            "tables": In(table_access_signature(config, "scanner")),
            "control": In(ControlSignature(config)),
            "now": In(32),
            "arm": In(stream.Signature(arm_layout(config))),
            "poll": Out(stream.Signature(poll_layout(config), always_ready=True)),
            "timeout": Out(stream.Signature(walk_layout(config))),
            "exceed": Out(stream.Signature(config.qpn_bits)),
            "busy": Out(1),
            "events": Out(events_layout(self.COUNTERS)),
        })

    def elaborate(self, platform):
        m = Module()
        qb = self._config.qpn_bits
        ctl = self.control
        now = self.now
        reads = self.tables.read

        # V0: pick the QP, read its tables.
        scan_qpn = Signal(qb)           # qps is a power of two: wraps by itself
        v0_go = ~ctl.hold
        v0_event = self.arm.valid
        v0_qpn = Mux(v0_event, self.arm.payload.qpn, scan_qpn)
        m.d.comb += self.arm.ready.eq(v0_go)
        with m.If(v0_go & ~v0_event):
            m.d.sync += scan_qpn.eq(scan_qpn + 1)
        for name in ("cfg", "ack", "next_psn", "tmr", "progress"):
            port = getattr(reads, name)
            m.d.comb += [port.addr.eq(v0_qpn), port.en.eq(v0_go)]

        # V1: the tables' data lands in registers, with what V2 needs of it computed (the
        # per-QP facts the timer's own entry does not change). The write of the visit
        # ahead, in V2 now, is the one the read missed: its select and data are registered
        # and V2 picks (the read ports see every earlier write).
        tw = self.tables.write.tmr
        v1_valid = Signal()
        v1_event = Signal()
        v1_qpn = Signal(qb)
        v1_time = Signal(32)
        m.d.sync += [v1_valid.eq(v0_go), v1_event.eq(v0_event), v1_qpn.eq(v0_qpn),
                     v1_time.eq(self.arm.payload.time)]
        v1_cfg, v1_ack, v1_next = reads.cfg.data, reads.ack.data, reads.next_psn.data
        v2_valid = Signal()
        v2_event = Signal()
        v2_qpn = Signal(qb)
        v2_time = Signal(32)
        v2_live = Signal()
        v2_outstanding = Signal()
        v2_una = Signal(PSN)
        v2_next = Signal(PSN)
        v2_count = Signal(PSN)
        v2_progress = Signal(32)
        v2_cfg = Signal.like(v1_cfg)
        v2_tmr_read = Signal.like(reads.tmr.data)
        v2_tmr_prev = Signal.like(reads.tmr.data)
        v2_from_prev = Signal()
        m.d.sync += [
            v2_valid.eq(v1_valid), v2_event.eq(v1_event), v2_qpn.eq(v1_qpn),
            v2_time.eq(v1_time),
            v2_live.eq((v1_cfg.state == P.QpState.RTS) & ~v1_ack.error),
            v2_outstanding.eq(v1_ack.una != v1_next),
            v2_una.eq(v1_ack.una), v2_next.eq(v1_next),
            v2_count.eq(psn_sub(v1_next, v1_ack.una)),
            v2_progress.eq(reads.progress.data), v2_cfg.eq(v1_cfg),
            v2_tmr_read.eq(reads.tmr.data), v2_tmr_prev.eq(tw.data),
            v2_from_prev.eq(tw.en & (tw.addr == v1_qpn)),
        ]
        m.d.comb += self.busy.eq(v1_valid | v2_valid)

        # V2: decide and write `tmr`.
        v_tmr = Signal.like(reads.tmr.data)
        m.d.comb += v_tmr.eq(Mux(v2_from_prev, v2_tmr_prev, v2_tmr_read))
        v_live, v_outstanding = v2_live, v2_outstanding
        v_exponent, v_exhausted = retry_expiry_gateware(
            v2_cfg.timeout, v2_cfg.retry_linear, v2_cfg.retry_exp, v_tmr.retries)
        # (now - start) >> exponent != 0: a bit of the difference at or above the exponent.
        elapsed = (now - v_tmr.start)[:32]
        v_expired = Cat(*(elapsed[k] & (v_exponent <= k) for k in range(32))).any()
        # Every visit of a live QP with PSNs outstanding also polls its reorder window
        # (inference unit, I0), so a window expires reo_wnd after it armed (within a scan
        # period) even when no later ACK of the QP arrives to find it expired.
        m.d.comb += [
            self.poll.valid.eq(v2_valid & ~v2_event & v_live & v_outstanding
                               & (ctl.reo_wnd != 0)),
            self.poll.payload.qpn.eq(v2_qpn), self.poll.payload.una.eq(v2_una),
            self.poll.payload.next.eq(v2_next),
        ]
        timeout_walk = self.timeout.payload
        m.d.comb += [
            timeout_walk.qpn.eq(v2_qpn), timeout_walk.psn.eq(v2_una),
            timeout_walk.count.eq(v2_count),
            timeout_walk.kind.eq(WalkKind.TIMEOUT),
            self.exceed.payload.eq(v2_qpn),
        ]
        retries_max = (1 << RETRY_COUNT_BITS) - 1
        with m.If(ctl.write):
            m.d.comb += [tw.addr.eq(ctl.qpn), tw.en.eq(1), tw.data.eq(0),
                         tw.data.una_seen.eq(ctl.psn)]
        with m.Else():
            m.d.comb += [tw.addr.eq(v2_qpn), tw.data.eq(v_tmr), tw.data.una_seen.eq(v2_una)]

            def restart(start):
                return [tw.en.eq(1), tw.data.armed.eq(1), tw.data.retries.eq(0),
                        tw.data.start.eq(start)]

            with m.If(~v2_valid):
                pass
            with m.Elif(~v_live | ~v_outstanding):
                m.d.comb += [tw.en.eq(1), tw.data.armed.eq(0), tw.data.retries.eq(0)]
            with m.Elif(v2_event):
                m.d.comb += restart(v2_time)
            with m.Elif(~v_tmr.armed):
                m.d.comb += restart(now)
            with m.Elif(v2_una != v_tmr.una_seen):
                m.d.comb += restart(v2_progress)
            with m.Elif(v_expired & v_exhausted):
                # Until ACK processing applies it, a repeat ask is harmless (it checks).
                m.d.comb += [self.exceed.valid.eq(1), tw.en.eq(self.exceed.ready),
                             tw.data.start.eq(now)]
            with m.Elif(v_expired):
                # A full queue: nothing changes, the next visit asks again.
                m.d.comb += [
                    self.timeout.valid.eq(1), tw.en.eq(self.timeout.ready),
                    tw.data.start.eq(now),
                    tw.data.retries.eq(Mux(v_tmr.retries == retries_max, retries_max,
                                           v_tmr.retries + 1)),
                    self.events.timeouts.eq(self.timeout.ready),
                ]
        return m
