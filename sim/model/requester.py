"""Reference model of the MRC requester: segmentation, send state, SACK/NACK/NAK, completions.

Packet level and pure Python. Post work requests, pull the packets to send (path-select
request dicts, exactly as the gateware's ``send`` stream carries them), report the EV each
packet went out on, feed received SACK, NACK and AETH NAK headers
(:func:`hdl.packet.headers.packet_header_layout`
dicts, as :class:`sim.model.responder.ResponderModel` produces them), and read back
completions, path feedback, QP error events and counters. The gateware
(:class:`hdl.transport.requester.Requester`) is checked against it; the model NIC of the
network simulations uses it as its requester.

Timing is not modelled: the gateware does the same things in the same order per stream, but
interleaves the streams in time. The rules are in ``docs/requester.md``.

The retransmit timer (``docs/recovery.md``) is modelled as an ideal timer: time is
:attr:`RequesterModel.now_units` (set it, or pass ``now_units`` to :meth:`~RequesterModel.pull`
and :meth:`~RequesterModel.poll_timers`), and :meth:`~RequesterModel.poll_timers` expires every
QP whose wait has passed at once, where the gateware's scanner notices it up to one scan
period later. Timeout and inference walks are processed when the model is pulled, after the
trims and ``retx`` requests queued before them.
"""

from collections import deque
from dataclasses import dataclass, field

from hdl import protocol as P
from hdl.interfaces import CompletionSide
from hdl.packet.headers import PacketKind
from hdl.transport.req_defs import (
    CC_DECREASE_SHIFT,
    CC_INCREASE_SHIFT,
    CC_MAX_STEPS,
    CC_MIN_WINDOW,
    FATAL_NAK_STATUS,
    HANDOFF_ENTRIES,
    INFER_K_DEFAULT,
    MSN_BITS,
    NACK_COUNTERS,
    NAK_COUNTERS,
    PSN_CHUNK,
    QP_WRITE_STATES,
    REQUESTER_COUNTERS,
    RETRY_COUNT_BITS,
    TIME_BITS,
    TIME_SHIFT,
    YOUNG_CAP_LOG2,
    RequesterCommand,
    WalkKind,
    bitmap_psns,
    cc_page,
    psn_chunks,
    retry_expiry,
    segmenter_contexts,
    timer_page,
    wr_packets,
    wr_refusal,
)

from .nscc import CC_ALGORITHMS, Nscc, NsccSetting

__all__ = ["RequesterModel", "WorkRequest"]

_WR_FIELDS = ("qpn", "opcode", "wr_id", "local_addr", "remote_addr", "rkey", "length", "imm")


@dataclass(frozen=True)
class WorkRequest:
    """A work request, the fields of :func:`hdl.interfaces.work_request_layout`."""
    qpn: int
    opcode: int = P.WrOpcode.RDMA_WRITE
    wr_id: int = 0
    local_addr: int = 0
    remote_addr: int = 0
    rkey: int = 0
    length: int = 0
    imm: int = 0

    @classmethod
    def from_dict(cls, values):
        return cls(**{name: int(values.get(name, 0)) for name in _WR_FIELDS})

    def to_dict(self):
        return {name: int(getattr(self, name)) for name in _WR_FIELDS}


@dataclass
class _Slot:
    wr: WorkRequest
    first: int                  #: first PSN
    end: int                    #: PSN after the last one
    refused: int | None         #: refusal status, or None for a WR that is sent
    is_imm: bool
    msn: int = 0                #: METH msn: messages the QP started before this one
    rqmsn: int = 0              #: METH rqmsn: WRITE_IMM messages the QP started before it


@dataclass
class _Qp:
    state: int = P.QpState.RESET
    mpr: int = 0
    max_wimm: int = 0
    next_psn: int = 0           #: next new PSN to send
    alloc_psn: int = 0          #: PSN after the last accepted WR
    una: int = 0                #: oldest unacknowledged PSN
    error: bool = False
    err_psn: int = 0
    err_status: int = 0
    err_done: bool = False      #: the error status has been given to its WR
    wimm_in_flight: int = 0
    msgs: int = 0               #: messages started, modulo 2**16 (METH msn)
    imm_msgs: int = 0           #: WRITE_IMM messages started, modulo 2**16 (METH rqmsn)
    slots: deque = field(default_factory=deque)
    acked: set = field(default_factory=set)       #: SACKed PSNs in [una, next_psn)
    timeout: int = 0            #: t: base timeout 1.024 us x 2**t
    retry_linear: int = 0
    retry_exp: int = 0
    armed: bool = False         #: the retransmit timer runs
    start: int = 0              #: its start time (units)
    retries: int = 0            #: retries done since the last progress
    infer_to: int = 0           #: PSNs before this were already inferred lost
    reo_armed: bool = False     #: the reorder window runs (time-based inference)
    reo_end: int = 0            #: ... for the holes before this PSN
    reo_at: int = 0             #: ... since this time (units, TIME_BITS bits)
    cwnd: int = 0               #: congestion window, PSNs from una (CONFIG ``cc``)
    cc_acc: int = 0             #: PSNs acknowledged (unmarked) since the window last widened
    cc_recover: int = 0         #: marks on PSNs before this were already answered
    nscc: Nscc | None = None    #: NSCC's state (``cc_algorithm`` "nscc")

    @property
    def effective_state(self):
        return P.QpState.ERROR if self.error else self.state


class RequesterModel:
    """The requester of one NIC.

    Parameters
    ----------
    config : NicConfig

    Attributes
    ----------
    completions : list of dict
        :func:`~hdl.interfaces.completion_layout` dicts, in the order they were made (per QP
        in WR order).
    feedback : list of dict
        :func:`~hdl.interfaces.feedback_layout` dicts, one per applied ACK and TRIM NAK.
    qp_errors : list of dict
        ``{"qpn", "status"}`` for each QP moved to ERROR.
    counters : dict
        The counters of :data:`~hdl.transport.req_defs.REQUESTER_COUNTERS`, except
        ``wr_pool_waits`` (0 here: when a freed WR pool entry is back in the gateware's free
        list is a matter of cycles; the limit itself, ``wr_pool`` WRs outstanding over all
        QPs, is modelled) and ``psn_pool_waits`` (0 here, likewise: the gateware returns a
        chunk a few cycles after una passes it; the limit itself is modelled, see
        :meth:`psn_chunks_used`).
    """

    def __init__(self, config):
        self.config = config
        self.window = bitmap_psns(config)
        self._qps = [_Qp() for _ in range(config.qps)]
        self._queue = deque()           # posted WRs not yet taken (one queue: HOL blocking)
        self._pool_used = 0             # WRs outstanding over all QPs (the shared WR pool)
        self._chunks = psn_chunks(config)   # chunks of the shared per-PSN state (psn_pool)
        # The segmenter's contexts: each None or the WR it cuts, [qpn, slot, psn, remaining,
        # packets sent]; new packets go from them in turn, from context ``_turn`` on.
        self._contexts = [None] * segmenter_contexts(config)
        self._turn = 0
        # With several contexts a WR the intake accepts waits in the two-entry hand-off
        # register (its context entries, oldest first) until a context takes it: a WR of a
        # QP a context holds waits there for that context, one more WR behind it, and the
        # WRs behind those in the queue.
        self._handoff = deque()
        self._retx = deque()            # (qpn, psn) waiting to be resent
        self._walks = deque()           # [kind, qpn, psn, count, first] ranges to walk
        self._drained = deque()         # resends decided before a QP_WRITE, not pulled yet
        self.now_units = 0              #: the time, in 1.024 us units
        self._ev = {}                   # (qpn, psn % window) -> EV it last went out on
        self.meta = {}                  # (qpn, psn % window) -> (send time, retransmitted)
        self.ackreq_every = 0
        self.infer_k = INFER_K_DEFAULT
        self.reo_wnd = 0
        self.cc = False
        self.cc_algorithm = "ecn"
        self._nscc_setting = None
        self.completions = []
        self.feedback = []
        self.qp_errors = []
        self.counters = dict.fromkeys(REQUESTER_COUNTERS, 0)

    # -- control -----------------------------------------------------------------------------

    def control(self, cmd, **fields):
        """Run one command (:class:`~hdl.transport.req_defs.RequesterCommand`); fields as in
        :func:`~hdl.transport.req_defs.requester_command_layout`. Returns ``(errno, data)``."""
        get = lambda name: int(fields.get(name, 0))     # noqa: E731
        try:
            cmd = RequesterCommand(cmd)
        except ValueError:
            return P.Errno.EINVAL, 0
        if cmd == RequesterCommand.QP_WRITE:
            # The gateware lets every resend already queued leave before a QP_WRITE acts (any
            # QP_WRITE, refused ones too): they are decided under the state before it.
            self._drain()
        if cmd == RequesterCommand.CONFIG:
            self.ackreq_every = get("ackreq_every")
            self.infer_k = get("infer_k")
            self.reo_wnd = get("reo_wnd")
            self.cc = bool(get("cc"))
            return P.Errno.OK, 0
        qpn = get("qpn")
        if qpn >= self.config.qps:
            return P.Errno.ENOENT, 0
        qp = self._qps[qpn]
        if cmd == RequesterCommand.QP_READ:
            page = get("page")
            if page == 0:
                return P.Errno.OK, (qp.effective_state | qp.next_psn << 8 | qp.una << 32)
            if page == 2:
                return P.Errno.OK, timer_page(armed=qp.armed, retries=qp.retries,
                                              start=qp.start)
            if page == 3:
                return P.Errno.OK, cc_page(cwnd=qp.cwnd, acc=qp.cc_acc, recover=qp.cc_recover)
            if page != 1:                       # pages are 2 bits: 0-3 all exist
                return P.Errno.EINVAL, 0
            return P.Errno.OK, (len(qp.slots) | qp.wimm_in_flight << 8 | qp.mpr << 16
                                | qp.max_wimm << 24 | qp.err_status << 32 | qp.err_psn << 40)
        state, mpr, max_wimm, psn = get("state"), get("mpr"), get("max_wimm"), get("psn")
        timeout, linear, exp = get("timeout"), get("retry_linear"), get("retry_exp")
        if (state not in QP_WRITE_STATES or not 1 <= mpr <= self.config.mpr_units
                or not 1 <= max_wimm <= self.config.max_wimm
                or timeout > P.LOCAL_ACK_TIMEOUT_MAX or linear > P.RETRY_LINEAR_MAX
                or exp > P.RETRY_EXPONENTIAL_MAX):
            return P.Errno.EINVAL, 0
        if qp.slots:
            if state != P.QpState.ERROR:
                return P.Errno.EBUSY, 0
            if not qp.error:                    # (one already in ERROR keeps its flush)
                qp.error, qp.err_psn = True, qp.una
                qp.err_status = P.CompletionStatus.WR_FLUSH_ERR
                self._complete(qpn)
                self._admit()
            return P.Errno.OK, 0
        self._qps[qpn] = _Qp(state=state, mpr=mpr, max_wimm=max_wimm, next_psn=psn,
                             alloc_psn=psn, una=psn, timeout=timeout, retry_linear=linear,
                             retry_exp=exp, infer_to=psn, cwnd=mpr * P.MPR_UNIT_PSNS,
                             cc_recover=psn,
                             nscc=Nscc(self._nscc_setting, self.now_units << TIME_SHIFT)
                             if self.cc_algorithm == "nscc" else None)
        self._admit()
        return P.Errno.OK, 0

    def set_cc_algorithm(self, algorithm, setting=None):
        """The congestion window's algorithm (it limits sending only with CONFIG ``cc``):
        ``"ecn"``, the ECN window (the default, as the RTL's CONFIG ``cc_nscc`` after reset),
        or ``"nscc"`` (:mod:`sim.model.nscc`, with its :class:`NsccSetting`; the main job's
        default). QPs written afterwards use it."""
        if algorithm not in CC_ALGORITHMS:
            raise ValueError(f"cc algorithm must be one of {', '.join(CC_ALGORITHMS)}, "
                             f"not {algorithm!r}")
        if algorithm == "nscc" and not isinstance(setting, NsccSetting):
            raise ValueError(f"nscc needs an NsccSetting, not {setting!r}")
        self.cc_algorithm, self._nscc_setting = algorithm, setting

    def qp_write(self, qpn, *, state=P.QpState.RTS, psn=0, mpr=1, max_wimm=1, timeout=0,
                 retry_linear=0, retry_exp=0):
        return self.control(RequesterCommand.QP_WRITE, qpn=qpn, state=state, psn=psn, mpr=mpr,
                            max_wimm=max_wimm, timeout=timeout, retry_linear=retry_linear,
                            retry_exp=retry_exp)

    # -- work requests and sending -----------------------------------------------------------

    def post(self, wr):
        """Queue a work request (a :class:`WorkRequest` or a dict of its fields)."""
        if isinstance(wr, dict):
            wr = WorkRequest.from_dict(wr)
        if not 0 <= wr.qpn < self.config.qps:
            raise ValueError(f"WR qpn must be from 0 to {self.config.qps - 1}, not {wr.qpn!r}")
        self._queue.append(wr)
        self._admit()

    @property
    def pending_wrs(self):
        """WRs posted but not yet taken (waiting for a slot, a WR pool entry, WIMM credit or the
        segmenter)."""
        return len(self._queue)

    def pull(self, now_units=None):
        """The next send request (a path-select request dict), or ``None`` if nothing can be
        sent now. Retransmissions go first: trims and ``retx`` requests, then walks."""
        if now_units is not None:
            self.now_units = now_units
        self._admit()
        if self._drained:
            return self._drained.popleft()
        while self._retx:
            qpn, psn = self._retx.popleft()
            request = self._retransmission(qpn, psn)
            if request is not None:
                return request
            self.counters["retx_ignored"] += 1
        while self._walks:
            request = self._walk_step()
            if request is not None:
                return request
        contexts = len(self._contexts)
        for turn in range(contexts):
            index = (self._turn + turn) % contexts
            request = self._segment(index)
            if request is not None:
                self._turn = (index + 1) % contexts
                return request
        return None

    def _segment(self, index):
        """The next packet of the WR segmenter context ``index`` holds, or ``None``."""
        while self._contexts[index] is not None:
            qpn, slot, psn, remaining, count = self._contexts[index]
            qp = self._qps[qpn]
            if qp.error:
                self._contexts[index] = None    # the QP failed: the rest is never sent
                self._admit()
                continue
            ahead, window = P.psn_diff(psn, qp.una), qp.mpr * P.MPR_UNIT_PSNS
            if self.cc:                         # the congestion window
                window = min(window, qp.cwnd if qp.nscc is None else qp.nscc.window_psns())
            if ahead >= window:
                return None                     # window full: wait for ACKs
            if ((psn % PSN_CHUNK == 0 or qp.una == psn)
                    and self.psn_chunks_used() >= self._chunks):
                return None                     # no free chunk in the PSN pool: wait
            dma_len = min(self.config.mtu, remaining)
            last = remaining <= self.config.mtu
            every = self.ackreq_every
            # The packet that fills the window asks for an ACK (no wait for coalescing).
            ackreq = (last or ahead + 1 >= window
                      or (every != 0 and count % every == every - 1))
            request = self._packet(qpn, slot, psn, ackreq=ackreq, retransmission=False)
            if psn == qp.una:               # the oldest outstanding PSN: start the timer
                qp.armed, qp.start, qp.retries = True, self.now_units, 0
            qp.next_psn = P.psn_add(psn, 1)
            self.meta[(qpn, psn % self.window)] = (self._time(), False)
            self.counters["packets"] += 1
            if last:
                self._contexts[index] = None
                self._admit()
            else:
                self._contexts[index] = [qpn, slot, P.psn_add(psn, 1), remaining - dma_len,
                                         count + 1]
            return request
        return None

    def pull_all(self, now_units=None):
        """Every send request that can go now."""
        out = []
        while (request := self.pull(now_units)) is not None:
            out.append(request)
        return out

    def sent(self, qpn, psn, ev):
        """The transmit side reports that PSN ``psn`` of QP ``qpn`` went out on EV ``ev``."""
        self._ev[(qpn, psn % self.window)] = ev

    def last_ev(self, qpn, psn):
        """The EV the transmit side last reported for PSN ``psn``'s window position."""
        return self._ev.get((qpn, psn % self.window), 0)

    def retransmit(self, qpn, psn):
        """Ask for PSN ``psn`` of QP ``qpn`` to be resent (the retransmit timer's input)."""
        self._retx.append((qpn, psn))

    # -- retransmit timer ----------------------------------------------------------------------

    def timer(self, qpn):
        """QP ``qpn``'s timer: ``{"armed", "start", "retries", "wait", "exhausted"}`` where
        ``wait``/``exhausted`` describe its next expiry (:func:`retry_expiry`)."""
        qp = self._qps[qpn]
        wait, exhausted = retry_expiry(qp.timeout, qp.retry_linear, qp.retry_exp, qp.retries)
        return {"armed": qp.armed, "start": qp.start, "retries": qp.retries, "wait": wait,
                "exhausted": exhausted}

    def reorder_due(self, qpn):
        """When QP ``qpn``'s reorder window expires (units), or ``None`` if it does not run:
        the gateware's scanner polls every QP each scan period, so a model NIC must poll by
        then (:meth:`poll_reorder`)."""
        qp = self._qps[qpn]
        if not self._waiting(qp):
            return None
        _, running, _ = self._reorder_window(qp)
        if not running:
            return None
        # reo_at is kept in TIME_BITS like the gateware's; count from now_units so the due
        # time stays right across the wrap of that field.
        elapsed = (self._time() - qp.reo_at) % (1 << TIME_BITS)
        return self.now_units + max(0, self.reo_wnd - elapsed)

    def poll_timers(self, now_units=None):
        """Expire every armed QP whose wait has passed (at most once each), and every
        reorder window that has run ``reo_wnd`` (:meth:`poll_reorder`). Returns
        ``[(qpn, "timeout" | "exceeded")]`` (timer expiries only)."""
        if now_units is not None:
            self.now_units = now_units
        out = []
        for qpn, qp in enumerate(self._qps):
            if self.reo_wnd:
                self.poll_reorder(qpn)
            if not self._waiting(qp):
                qp.armed, qp.retries = False, 0
                continue
            if not qp.armed:
                qp.armed, qp.start, qp.retries = True, self.now_units, 0
                continue
            wait, _ = retry_expiry(qp.timeout, qp.retry_linear, qp.retry_exp, qp.retries)
            if (self.now_units - qp.start) % (1 << 32) >= wait:
                out.append((qpn, self.expire(qpn)))
        return out

    def expire(self, qpn):
        """One expiry of QP ``qpn``'s timer, as the scanner applies it: a TIMEOUT walk over
        ``[una, next_psn)`` and one more retry, or, when the retries are exhausted, the QP goes
        to ERROR with RETRY_EXC_ERR. Returns ``"timeout"``, ``"exceeded"`` or ``None`` (nothing
        outstanding)."""
        qp = self._qps[qpn]
        if not self._waiting(qp):
            return None
        _, exhausted = retry_expiry(qp.timeout, qp.retry_linear, qp.retry_exp, qp.retries)
        qp.armed, qp.start = True, self.now_units
        if exhausted:
            qp.error, qp.err_psn = True, qp.una
            qp.err_status = P.CompletionStatus.RETRY_EXC_ERR
            self.qp_errors.append({"qpn": qpn, "status": qp.err_status})
            self.counters["retry_exceeded"] += 1
            self._complete(qpn)
            self._admit()
            return "exceeded"
        self._walks.append([WalkKind.TIMEOUT, qpn, qp.una,
                            P.psn_diff(qp.next_psn, qp.una), True])
        qp.retries = min(qp.retries + 1, (1 << RETRY_COUNT_BITS) - 1)
        self.counters["timeouts"] += 1
        return "timeout"

    # -- received ACKs and NAKs --------------------------------------------------------------

    def receive(self, header, now_units=None, *, now_ns=None):
        """Apply one received SACK, NACK or AETH NAK (a packet header dict) at time
        ``now_units`` (default: the time already set). Returns ``"applied"`` or
        ``"dropped"``.

        A SACK acknowledges every PSN up to its ``cack_psn`` and the PSNs its bitmap marks (bit
        i: PSN ``cack_psn + sack_psn_offset + i``, applied wherever it overlaps the window);
        the PSN it names (``cack_psn + ack_psn_offset``; a probe answer, ``pr = 1``, names
        none) gives path feedback for the EV that PSN last went out on. A NACK refuses one
        PSN (TRIMMED: resend it; PSN_OOR_WINDOW: counted); an AETH NAK is fatal.
        ``now_ns``: the time in ns, for NSCC's round trips (default: ``now_units``')."""
        if now_units is not None:
            self.now_units = now_units
        if now_ns is None:
            now_ns = self.now_units << TIME_SHIFT
        h = header
        bth = h["bth"]
        qpn = bth["dqpn"]
        kind = PacketKind(h.get("kind", PacketKind.DATA))
        if kind not in (PacketKind.SACK, PacketKind.NACK, PacketKind.AETH) \
                or qpn >= self.config.qps:
            return self._bad()
        qp = self._qps[qpn]
        if qp.state != P.QpState.RTS or qp.error:
            return self._bad()
        code = reason = None
        probe_answer, mark, base, bitmap = False, P.SackMark.NONE, qp.una, 0
        if kind == PacketKind.SACK:
            seth = h["ctl"]["sack"]["seth"]
            if seth["cack_psn"] != bth["psn"]:
                return self._bad()              # malformed: the two cack_psn differ
            probe_answer = bool(seth["pr"])
            mark = P.SackMark(seth["m"]) if seth["m"] in set(P.SackMark) else P.SackMark.NONE
            psn = bth["psn"] if probe_answer else P.psn_add(bth["psn"], seth["ack_psn_offset"])
            base = P.psn_add(bth["psn"], seth["sack_psn_offset"])
            bitmap = seth["sack_bitmap"]
            cand = P.psn_add(bth["psn"], 1)
        elif kind == PacketKind.NACK:
            reason = h["ctl"]["neth"]["nack_reason"]
            if reason not in NACK_COUNTERS:
                return self._bad()
            psn, cand = bth["psn"], qp.una
        else:
            syndrome = h["aeth"]["syndrome"]
            if (syndrome >> 5) & 3 != 3 or (syndrome & 0x1F) not in NAK_COUNTERS:
                return self._bad()              # MRC acknowledges with SACKs
            code = P.NakCode(syndrome & 0x1F)
            psn, cand = bth["psn"], qp.una
        advance = P.psn_diff(cand, qp.una) > 0
        if advance and P.psn_diff(qp.next_psn, cand) < 0:
            return self._bad()                  # acknowledges PSNs never sent
        new_una = cand if advance else qp.una
        advanced = P.psn_diff(new_una, qp.una)    # PSNs this SACK acknowledges cumulatively
        flight = P.psn_diff(qp.next_psn, qp.una)  # PSNs in flight before it
        psn_outstanding = (P.psn_diff(psn, new_una) >= 0
                           and P.psn_diff(qp.next_psn, psn) > 0)
        # The PSN is outstanding before this packet applies: its EV entry holds it (a PSN's
        # chunk of the PSN pool goes back once una passes it).
        psn_sent = P.psn_diff(qp.next_psn, psn) > 0 and P.psn_diff(psn, qp.una) >= 0
        fatal = code is not None
        if fatal and not psn_outstanding:
            return self._bad()
        # Cumulative part, then bitmap bits for PSNs in [max(una, base), next_psn).
        if advance:
            qp.acked = {p for p in qp.acked if P.psn_diff(p, new_una) >= 0}
            qp.una = new_una
            qp.start, qp.retries = self.now_units, 0        # progress restarts the timer
        new_bits = 0
        width = P.SACK_BITMAP_BITS
        lo = min(width, max(0, P.psn_diff(qp.una, base)))
        hi = min(width, max(0, P.psn_diff(qp.next_psn, base)))
        sacked = [i for i in range(lo, hi) if bitmap >> i & 1]
        if sacked and (self.infer_k or self.reo_wnd):
            self._infer(qpn, base, sacked)
        for i in sacked:
            p = P.psn_add(base, i)
            if p not in qp.acked:
                qp.acked.add(p)
                new_bits += 1
        ev = self._ev.get((qpn, psn % self.window), 0)
        if kind == PacketKind.SACK:
            self.counters["acks"] += 1
            if not advance and not new_bits:
                self.counters["duplicate_acks"] += 1
            ecn = mark == P.SackMark.SKIP_ONCE and not probe_answer
            if qp.nscc is None:
                self._congestion(qp, psn, ecn, advanced, flight)
            elif not probe_answer and (advanced or new_bits or ecn):
                echo = h["ctl"]["sack"]["cc_state"]["tx_timestamp"]
                qp.nscc.on_ack(now_ns, (advanced + new_bits) * self.config.mtu,
                               P.timestamp_age_ns(int(now_ns), echo), ecn)
            if psn_sent and not probe_answer:
                feedback = {P.SackMark.SKIP_ONCE: P.FeedbackKind.ECN,
                            P.SackMark.ALWAYS_SKIP: P.FeedbackKind.LOST}.get(
                                mark, P.FeedbackKind.ACKED)
                self.feedback.append({"qpn": qpn, "ev": ev, "kind": feedback})
        elif kind == PacketKind.NACK:
            self.counters[NACK_COUNTERS[reason]] += 1
            if reason == P.NackReason.TRIMMED:
                if psn_sent:
                    self.feedback.append({"qpn": qpn, "ev": ev,
                                          "kind": P.FeedbackKind.TRIMMED})
                if psn_outstanding and psn not in qp.acked:
                    self._retx.append((qpn, psn))
                if qp.nscc is not None:
                    qp.nscc.on_nack(now_ns, self.config.mtu)
        else:
            self.counters[NAK_COUNTERS[code]] += 1
            qp.error, qp.err_psn, qp.err_status = True, psn, FATAL_NAK_STATUS[code]
            self.qp_errors.append({"qpn": qpn, "status": qp.err_status})
        if advance or fatal:
            self._complete(qpn)
        self._admit()
        return "applied"

    # -- state inspection --------------------------------------------------------------------

    def qp(self, qpn):
        """A read-only summary of QP ``qpn``'s state (for tests and the network simulator)."""
        qp = self._qps[qpn]
        return {"state": qp.effective_state, "next_psn": qp.next_psn, "una": qp.una,
                "outstanding_wrs": len(qp.slots), "wimm_in_flight": qp.wimm_in_flight,
                "acked": sorted(qp.acked, key=lambda p: P.psn_diff(p, qp.una))}

    def outstanding(self, qpn):
        """PSNs of QP ``qpn`` sent and not yet cumulatively acknowledged, oldest first."""
        qp = self._qps[qpn]
        return [P.psn_add(qp.una, i) for i in range(P.psn_diff(qp.next_psn, qp.una))]

    def psn_chunks_used(self):
        """Chunks of the PSN pool the QPs hold: each QP holds the chunks (``PSN_CHUNK``
        aligned PSNs each) of its outstanding PSNs, from una to its last PSN sent, so at most
        ``psn_pool`` PSNs are ever in flight over all QPs, in whole chunks. A new PSN that
        starts a chunk, or is its QP's only outstanding one, waits while all are held. The
        gateware returns a chunk a few cycles after una passes it, so it may send such a PSN
        a few cycles later than the model; what it sends, and in what order, is the same."""
        used = 0
        for qp in self._qps:
            if qp.una != qp.next_psn:
                last = P.psn_add(qp.next_psn, -1) // PSN_CHUNK
                used += (last - qp.una // PSN_CHUNK + 1) % (P.PSN_MODULUS // PSN_CHUNK)
        return used

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _live(qp):
        return qp.state == P.QpState.RTS and not qp.error

    @classmethod
    def _waiting(cls, qp):
        """Live with PSNs outstanding: what the timer and the reorder window act on."""
        return cls._live(qp) and qp.una != qp.next_psn

    def _congestion(self, qp, psn, ecn, advanced, flight):
        """The ECN window (``docs/requester.md``; it limits sending only with CONFIG ``cc``):
        an ACK echoing CE for a PSN sent after the last decrease takes 1/8 (at least one) off
        the window the QP used: the larger of the PSNs in flight before it (``flight``) and
        the PSNs sent since the last decrease, at most ``cwnd`` (floor :data:`CC_MIN_WINDOW`);
        every ``cwnd >> CC_INCREASE_SHIFT`` (at least one) PSNs counted widen it by one PSN, at most
        :data:`CC_MAX_STEPS` per ACK (byte counting with a limit), up to MPR; an unmarked ACK
        counts the PSNs it acknowledges cumulatively (``advanced``), at least one."""
        if ecn:
            if P.psn_diff(psn, qp.cc_recover) >= 0:
                used = max(flight, P.psn_diff(qp.next_psn, qp.cc_recover))
                base = min(qp.cwnd, used)
                qp.cwnd = max(base - max(base >> CC_DECREASE_SHIFT, 1), CC_MIN_WINDOW)
                qp.cc_acc, qp.cc_recover = 0, qp.next_psn
            return
        threshold = max(qp.cwnd >> CC_INCREASE_SHIFT, 1)
        total = qp.cc_acc + max(advanced, 1)
        steps = min(total // threshold, CC_MAX_STEPS)
        qp.cwnd = min(qp.cwnd + steps, qp.mpr * P.MPR_UNIT_PSNS)
        qp.cc_acc = min(total - steps * threshold, threshold - 1)

    def _infer(self, qpn, cand, sacked):
        """Inference for one ACK whose SACK bits ``sacked`` (offsets from ``cand``, ascending,
        inside ``[una, next_psn)``) are not empty. The region of inferred losses ends at the
        later of: the K-th highest SACKed PSN (count rule, ``infer_k``) and, when the QP's
        reorder window armed ``reo_wnd`` units ago or more, the end it armed with (time
        rule). Each PSN is inferred at most once (``infer_to``). Then the window re-arms
        from now for the holes below the highest SACKed PSN, unless it still runs."""
        qp = self._qps[qpn]
        lower, running, expired = self._reorder_window(qp)
        # Only a bitmap that starts at or below `lower` reports every hole of the region (one
        # placed higher says nothing about the PSNs below its base).
        base_ok = P.psn_diff(lower, cand) >= 0
        end = lower
        if self.infer_k and len(sacked) >= self.infer_k and base_ok:
            end = P.psn_add(cand, sacked[-self.infer_k])
        kind = WalkKind.INFER if P.psn_diff(end, lower) > 0 else WalkKind.REORDER
        if expired:
            self.counters["reorder_expiries"] += 1
            if P.psn_diff(qp.reo_end, end) > 0:
                end = qp.reo_end
        if P.psn_diff(end, lower) > 0:
            self._walks.append([kind, qpn, lower, P.psn_diff(end, lower), True])
            qp.infer_to = lower = end
        top = P.psn_add(cand, sacked[-1] + 1)
        if self.reo_wnd and base_ok and (expired or not running) and P.psn_diff(top, lower) > 0:
            qp.reo_armed, qp.reo_end, qp.reo_at = True, top, self._time()
        else:
            qp.reo_armed = running and not expired

    def _reorder_window(self, qp):
        """``(lower, running, expired)``: where the next inferred region starts (``infer_to``
        when it lies in ``[una, next_psn]``, else ``una``), whether the QP's reorder window
        runs, and whether it has run ``reo_wnd`` units."""
        lower = qp.una
        if (P.psn_diff(qp.infer_to, qp.una) >= 0
                and P.psn_diff(qp.next_psn, qp.infer_to) >= 0):
            lower = qp.infer_to
        running = (self.reo_wnd != 0 and qp.reo_armed and P.psn_diff(qp.reo_end, lower) > 0
                   and P.psn_diff(qp.next_psn, qp.reo_end) >= 0)
        expired = running and (self._time() - qp.reo_at) % (1 << TIME_BITS) >= self.reo_wnd
        return lower, running, expired

    def poll_reorder(self, qpn):
        """The timer scanner's visit to QP ``qpn``'s reorder window (``docs/recovery.md``):
        a window that has run ``reo_wnd`` units expires without waiting for an ACK; its holes
        are resent (a REORDER walk up to the PSN it armed with: no LOST feedback) and it
        stops. Returns whether it expired."""
        qp = self._qps[qpn]
        if not self._waiting(qp):
            return False
        lower, running, expired = self._reorder_window(qp)
        qp.reo_armed = running and not expired
        if not expired:
            return False
        self.counters["reorder_expiries"] += 1
        self._walks.append([WalkKind.REORDER, qpn, lower, P.psn_diff(qp.reo_end, lower), True])
        qp.infer_to = qp.reo_end
        return True

    def _walk_step(self):
        """One PSN of the oldest walk: a retransmission (with LOST feedback for every PSN of
        an INFER walk and the first of a TIMEOUT walk unless that one was resent less than the
        base timeout ago), or ``None`` (skipped and counted)."""
        walk = self._walks[0]
        kind, qpn, psn, count, first = walk
        walk[2:5] = [P.psn_add(psn, 1), count - 1, False]
        if count <= 1:
            self._walks.popleft()
        qp = self._qps[qpn]
        key = (qpn, psn % self.window)
        sent_time, retransmitted = self.meta.get(key, (0, False))
        age = (self.now_units - sent_time) % (1 << TIME_BITS)
        young = age < 1 << min(qp.timeout, YOUNG_CAP_LOG2)
        if (kind == WalkKind.TIMEOUT and not first and young) or (
                kind != WalkKind.TIMEOUT and retransmitted):
            request = None
        else:
            request = self._retransmission(qpn, psn)
        if request is None:
            self.counters["walk_skipped"] += 1
            return None
        self.counters["timeout_retransmissions" if kind == WalkKind.TIMEOUT
                      else "inferred_losses"] += 1
        # A TIMEOUT walk's older holes and a REORDER walk's holes give no LOST; nor does the
        # oldest PSN of a TIMEOUT walk when it was resent less than the base timeout ago.
        if kind == WalkKind.INFER or (kind == WalkKind.TIMEOUT and first and not young):
            self.counters["lost_feedback"] += 1
            self.feedback.append({"qpn": qpn, "ev": self._ev.get(key, 0),
                                  "kind": P.FeedbackKind.LOST})
        return request

    def _drain(self):
        """Decide every queued resend now (trims, ``retx`` requests, walks), as the gateware
        does before a QP_WRITE acts; :meth:`pull` hands them out first."""
        while self._retx:
            qpn, psn = self._retx.popleft()
            request = self._retransmission(qpn, psn)
            if request is None:
                self.counters["retx_ignored"] += 1
            else:
                self._drained.append(request)
        while self._walks:
            request = self._walk_step()
            if request is not None:
                self._drained.append(request)

    def _bad(self):
        self.counters["bad_acks"] += 1
        return "dropped"

    def _time(self):
        return self.now_units & ((1 << TIME_BITS) - 1)

    def _hand_on(self):
        """The WRs in the hand-off register to contexts, oldest first, while one may take
        the oldest. A context (or hand-off entry) whose QP failed sends nothing more and is
        free."""
        for index, context in enumerate(self._contexts):
            if context is not None and self._qps[context[0]].error:
                self._contexts[index] = None
        self._handoff = deque(e for e in self._handoff if not self._qps[e[0]].error)
        while self._handoff:
            entry = self._handoff[0]
            if any(c is not None and c[0] == entry[0] for c in self._contexts):
                return
            if None not in self._contexts:
                return
            self._contexts[self._contexts.index(None)] = self._handoff.popleft()

    def _admit(self):
        """Take WRs from the head of the queue while they fit (head-of-line blocking)."""
        handoff = len(self._contexts) > 1
        while True:
            if handoff:
                self._hand_on()
            if not self._queue:
                return
            wr = self._queue[0]
            qp = self._qps[wr.qpn]
            if len(qp.slots) >= self.config.wr_slots or self._pool_used >= self.config.wr_pool:
                return
            refused = wr_refusal(self.config, wr.opcode, wr.length, qp.effective_state)
            if refused is not None:
                qp.slots.append(_Slot(wr, qp.alloc_psn, qp.alloc_psn, refused, False))
                self._pool_used += 1
                self._queue.popleft()
                self.counters["wrs"] += 1
                self.counters["wr_refused"] += 1
                self._complete(wr.qpn)
                continue
            is_imm = wr.opcode == P.WrOpcode.RDMA_WRITE_WITH_IMM
            if is_imm and qp.wimm_in_flight >= qp.max_wimm:
                return
            if handoff:
                if len(self._handoff) == HANDOFF_ENTRIES:
                    return                      # the hand-off register is full
            elif self._contexts[0] is not None:
                return                          # the segmenter is busy
            first = qp.alloc_psn
            qp.alloc_psn = P.psn_add(first, wr_packets(self.config, wr.length))
            slot = _Slot(wr, first, qp.alloc_psn, None, is_imm, qp.msgs, qp.imm_msgs)
            qp.msgs = (qp.msgs + 1) % (1 << MSN_BITS)
            qp.imm_msgs = (qp.imm_msgs + is_imm) % (1 << MSN_BITS)
            qp.slots.append(slot)
            self._pool_used += 1
            qp.wimm_in_flight += is_imm
            entry = [wr.qpn, slot, first, wr.length, 0]
            if handoff:
                self._handoff.append(entry)
            else:
                self._contexts[0] = entry
            self._queue.popleft()
            self.counters["wrs"] += 1

    def _packet(self, qpn, slot, psn, *, ackreq, retransmission, avoid_ev=None):
        wr, mtu = slot.wr, self.config.mtu
        offset = P.psn_diff(psn, slot.first) * mtu
        remaining = wr.length - offset
        last = remaining <= mtu
        immediate = slot.is_imm and last
        opcode = P.write_opcode(first=offset == 0, last=last, immediate=immediate)
        return {
            "qpn": qpn, "avoid_ev_valid": int(avoid_ev is not None),
            "avoid_ev": avoid_ev or 0, "probe": 0, "ev": 0,
            "context": {
                "psn": psn, "opcode": int(opcode), "ackreq": int(ackreq),
                "va": (wr.remote_addr + offset) % (1 << 64), "rkey": wr.rkey,
                "dma_len": min(mtu, remaining), "imm": wr.imm if immediate else 0,
                "local_addr": (wr.local_addr + offset) % (1 << 64),
                "retransmission": int(retransmission),
                "msn": slot.msn, "rqmsn": slot.rqmsn,
            },
        }

    def _retransmission(self, qpn, psn):
        qp = self._qps[qpn]
        if (qp.state != P.QpState.RTS or qp.error or P.psn_diff(psn, qp.una) < 0
                or P.psn_diff(qp.next_psn, psn) <= 0 or psn in qp.acked):
            return None
        slot = next(s for s in qp.slots if s.refused is None
                    and P.psn_diff(psn, s.first) >= 0 and P.psn_diff(s.end, psn) > 0)
        key = (qpn, psn % self.window)
        self.meta[key] = (self._time(), True)
        self.counters["retransmissions"] += 1
        return self._packet(qpn, slot, psn, ackreq=True, retransmission=True,
                            avoid_ev=self._ev.get(key, 0))

    def _complete(self, qpn):
        """Complete the QP's WRs from the oldest, in order, while they are done."""
        qp = self._qps[qpn]
        while qp.slots:
            slot = qp.slots[0]
            acked = P.psn_diff(qp.una, slot.end) >= 0
            if slot.refused is not None and (acked or qp.error):
                status = slot.refused
            elif acked:
                status = P.CompletionStatus.SUCCESS
            elif not qp.error:
                return
            elif qp.err_status == P.CompletionStatus.RETRY_EXC_ERR:
                status = qp.err_status          # every outstanding WR
            elif not qp.err_done and P.psn_diff(slot.end, qp.err_psn) > 0:
                status, qp.err_done = qp.err_status, True
            else:
                status = P.CompletionStatus.WR_FLUSH_ERR
            qp.slots.popleft()
            self._pool_used -= 1
            qp.wimm_in_flight -= slot.is_imm
            self.counters["completions" if status == P.CompletionStatus.SUCCESS
                          else "error_completions"] += 1
            self.completions.append({
                "qpn": qpn, "side": CompletionSide.REQUESTER, "wr_id": slot.wr.wr_id,
                "status": int(status), "opcode": int(P.WcOpcode.RDMA_WRITE),
                "byte_len": slot.wr.length, "imm_valid": 0, "imm": 0,
            })
