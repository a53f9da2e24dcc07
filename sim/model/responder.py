"""Reference model of the MRC responder: classification, placement, ACK/NACK, completions.

Packet level and pure Python: feed one received data packet (its header as the
:func:`hdl.packet.headers.packet_header_layout` dict that :func:`sim.rtlpackets.header_from_scapy`
returns, plus its payload) and get back what the responder does with it: a
:class:`ResponderVerdict`, the memory writes, the ACK/NACK headers to send (dicts of the same
layout, ready for :func:`sim.rtlpackets.packet_from_header`: MRC 1.0 SACKs, NACKs and AETH
NAKs) and the completions released; :meth:`ResponderModel.probe` answers a reliability probe.
The gateware (:class:`hdl.transport.responder.Responder`) is checked against it packet by
packet; the model NIC of the network simulations uses it as its responder.

The rules, in the order they are checked, are in ``docs/responder.md``. Two things depend on
time: the ACK delay timer (``ack_delay`` cycles; call :meth:`ResponderModel.expire`) and the
out-of-window NAK rate limit (``nak_interval`` cycles, against ``now_cycles``).
"""

from collections import deque
from dataclasses import dataclass, field

from amaranth.lib import data

from hdl import protocol as P
from hdl.interfaces import CompletionSide
from hdl.packet.headers import PacketKind, packet_header_layout
from hdl.transport.resp_defs import (
    ACK_HOP_LIMIT,
    ACK_TCLASS,
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
)

from .memory import Memory

__all__ = ["ResponderModel", "ResponderResult", "zero_header", "full_header", "canonical_header",
           "DEFAULT_TIMERS", "CTL_MEMBERS", "signed16"]

DEFAULT_TIMERS = 16             #: ACK-delay timer entries (the gateware's ``timers``)
_RESPONDING_STATES = (P.QpState.RTR, P.QpState.RTS)


#: The ``ctl`` union member each control packet kind fills (the other kinds fill none).
CTL_MEMBERS = {PacketKind.SACK: "sack", PacketKind.NACK: "neth", PacketKind.RPROBE: "peth",
               PacketKind.EP_REQUEST: "erth", PacketKind.EP_RESPONSE: "eeth"}


def signed16(value):
    """``value`` modulo 2**16 as a two's complement 16-bit number (SETH offsets)."""
    value &= 0xFFFF
    return value - (1 << 16) if value & 0x8000 else value


def _zero(layout):
    if isinstance(layout, data.StructLayout):
        return {name: _zero(member.shape) for name, member in layout}
    if isinstance(layout, data.UnionLayout):
        return {}                   # filled with the kind's member by full_header
    return 0


def zero_header(config):
    """A :func:`~hdl.packet.headers.packet_header_layout` dict with every field 0 (``ctl``
    empty: a DATA packet's)."""
    return _zero(packet_header_layout(config))


def _ctl_zero(config, kind):
    member = CTL_MEMBERS.get(PacketKind(kind))
    if member is None:
        return {}
    union = packet_header_layout(config)["ctl"].shape
    return {member: _zero(union[member].shape)}


def full_header(header, config):
    """``header`` with every missing field of the layout filled with 0 (nested dicts); ``ctl``
    holds the member of the header's kind only (:data:`CTL_MEMBERS`)."""
    def merge(base, values):
        out = dict(base)
        for key, value in values.items():
            if key not in base:
                raise KeyError(f"packet header has no field {key!r}")
            if isinstance(base[key], dict):
                out[key] = merge(base[key], value)
            else:
                out[key] = int(getattr(value, "value", value))
        return out
    base = zero_header(config)
    base["ctl"] = _ctl_zero(config, header.get("kind", PacketKind.DATA))
    return merge(base, header)


def canonical_header(header):
    """A header dict with every ``ctl`` union member but the kind's removed: the view to
    compare a gateware header (all members of the union) with a model one."""
    out = dict(header)
    member = CTL_MEMBERS.get(PacketKind(header["kind"]))
    ctl = header.get("ctl", {})
    out["ctl"] = {} if member is None else {member: ctl[member]}
    return out


@dataclass
class ResponderResult:
    """What the responder did with one packet."""
    verdict: ResponderVerdict
    writes: list = field(default_factory=list)          #: ``(addr, bytes)``
    replies: list = field(default_factory=list)         #: ACK/NACK header dicts
    completions: list = field(default_factory=list)     #: completion_layout dicts
    nak_suppressed: bool = False


@dataclass
class _Qp:
    state: int = P.QpState.RESET
    remote_qpn: int = 0
    pd: int = 0
    mpr: int = 1
    caps: int = 0
    max_wimm: int = 1
    epsn: int = 0                   #: expected PSN: cumulative PSN + 1
    msn: int = 0
    ack_count: int = 0              #: placed packets not yet ACKed
    nak_armed: bool = False
    last_nak: int = 0               #: cycle of the last out-of-window NACK
    rcvd_bytes: int = 0             #: payload bytes placed, modulo 2**24 (CC_STATE)
    last_ts: int = 0                #: TSETH timestamp of the last packet placed
    received: set = field(default_factory=set)      #: PSNs received above epsn
    last: set = field(default_factory=set)          #: ... that end a message
    wimm: dict = field(default_factory=dict)        #: ... that end a WRITE_IMM: psn -> imm


@dataclass
class _Mr:
    valid: int = 0
    rkey: int = 0
    pd: int = 0
    base: int = 0
    length: int = 0


class ResponderModel:
    """The responder of one NIC: QP table, MR table, receive windows, ACK timers, counters.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
    mr_slots : int
        Entries of the MR table (a power of two); an rkey's low bits select its slot.
    timers : int
        ACK-delay timer entries; when all are in use a packet that would start one is ACKed at
        once instead.
    memory : :class:`~sim.model.memory.Memory`, optional
        Where placed payloads are written (a new one by default).
    """

    def __init__(self, config, *, mr_slots=16, timers=DEFAULT_TIMERS, memory=None):
        self.config = config
        self.mr_slots = mr_slots
        self.timers = timers
        self.memory = Memory() if memory is None else memory
        self.window = config.window_psns
        self.qps = [_Qp() for _ in range(config.qps)]
        self.mrs = [_Mr() for _ in range(mr_slots)]
        self.ack_every = DEFAULT_ACK_EVERY
        self.ack_delay = DEFAULT_ACK_DELAY
        self.nak_interval = DEFAULT_NAK_INTERVAL
        self.coalesce_gaps = bool(DEFAULT_COALESCE_GAPS)
        self.gap_depth = DEFAULT_GAP_DEPTH
        self.ack_new_holes = bool(DEFAULT_ACK_NEW_HOLES)
        self.counters = dict.fromkeys(RESPONDER_COUNTERS, 0)
        self._timers = deque()      # (deadline_cycle, qpn, header, arrival_ns), FIFO order

    # -- control ---------------------------------------------------------------------------------

    def qp_write(self, qpn, *, state, remote_qpn=0, pd=0, psn=0, set_psn=True, mpr=1, caps=0,
                 max_wimm=1):
        """Write a QP's attributes. With ``set_psn`` the receive state restarts at ``psn``:
        MSN 0, nothing received, no WRITE_IMM pending, no ACK owed."""
        if not 0 <= qpn < self.config.qps:
            return P.Errno.ENOENT
        if state not in set(P.QpState) or not 1 <= mpr <= self.config.mpr_units \
                or not 1 <= max_wimm <= self.config.max_wimm:
            return P.Errno.EINVAL
        qp = self.qps[qpn]
        qp.state, qp.remote_qpn, qp.pd, qp.mpr, qp.caps, qp.max_wimm = \
            P.QpState(state), remote_qpn, pd, mpr, caps, max_wimm
        if set_psn:
            qp.epsn, qp.msn, qp.ack_count, qp.nak_armed, qp.rcvd_bytes = psn, 0, 0, False, 0
            qp.received, qp.last, qp.wimm, qp.last_ts = set(), set(), {}, 0
        return P.Errno.OK

    def qp_read(self, qpn):
        """``(errno, data)``: data = state | expected PSN << 8 | MSN << 32 | pending << 56."""
        if not 0 <= qpn < self.config.qps:
            return P.Errno.ENOENT, 0
        qp = self.qps[qpn]
        return P.Errno.OK, (int(qp.state) | qp.epsn << 8 | qp.msn << 32 | len(qp.wimm) << 56)

    def mr_write(self, slot, *, valid, rkey=0, pd=0, base=0, length=0):
        if not 0 <= slot < self.mr_slots:
            return P.Errno.ENOENT
        if valid and rkey % self.mr_slots != slot:
            return P.Errno.EINVAL
        self.mrs[slot] = _Mr(int(bool(valid)), rkey, pd, base, length)
        return P.Errno.OK

    def configure(self, *, ack_every, ack_delay, nak_interval, coalesce_gaps=False,
                  gap_depth=0, ack_new_holes=False):
        if not 1 <= ack_every <= 255:
            return P.Errno.EINVAL
        self.ack_every, self.ack_delay, self.nak_interval = ack_every, ack_delay, nak_interval
        self.coalesce_gaps = bool(coalesce_gaps)
        self.gap_depth = gap_depth % (1 << GAP_DEPTH_BITS)      # the field's width
        self.ack_new_holes = bool(ack_new_holes)
        return P.Errno.OK

    def command(self, cmd):
        """Execute a :func:`~hdl.transport.resp_defs.responder_command_layout` dict (missing
        fields 0); returns ``(errno, data)`` as the gateware's ``ctl_resp``."""
        get = cmd.get
        kind = ResponderCommand(get("cmd", 0))
        if kind == ResponderCommand.QP_WRITE:
            errno = self.qp_write(get("qpn", 0), state=get("state", 0),
                                  remote_qpn=get("remote_qpn", 0), pd=get("pd", 0),
                                  psn=get("psn", 0), set_psn=bool(get("set_psn", 0)),
                                  mpr=get("mpr", 0), caps=get("caps", 0),
                                  max_wimm=get("max_wimm", 0))
            return errno, 0
        if kind == ResponderCommand.QP_READ:
            return self.qp_read(get("qpn", 0))
        if kind == ResponderCommand.MR_WRITE:
            return self.mr_write(get("slot", 0), valid=get("valid", 0), rkey=get("rkey", 0),
                                 pd=get("pd", 0), base=get("base", 0),
                                 length=get("length", 0)), 0
        return self.configure(ack_every=get("ack_every", 0), ack_delay=get("ack_delay", 0),
                              nak_interval=get("nak_interval", 0),
                              coalesce_gaps=get("coalesce_gaps", 0),
                              gap_depth=get("gap_depth", 0),
                              ack_new_holes=get("ack_new_holes", 0)), 0

    # -- packets ---------------------------------------------------------------------------------

    def receive(self, header, payload=b"", *, now_ns=0, now_cycles=0):
        """Process one received data packet; ``now_ns`` is its arrival time (service time
        counts from it), ``now_cycles`` the cycle it is classified (for the NAK rate limit and
        the ACK delay). Returns a :class:`ResponderResult`."""
        h = full_header(header, self.config)
        verdict, qp = self._classify(h)
        result = ResponderResult(verdict)
        bth = h["bth"]
        psn = bth["psn"]
        name = verdict.name.lower()
        self.counters[name] += 1

        if verdict == ResponderVerdict.BAD_QP:
            self._nak(result, h, None, verdict)
            return result
        if verdict == ResponderVerdict.DUPLICATE:
            qp.ack_count = 0
            result.replies.append(self._sack(h, qp))
            self.counters["acks"] += 1
            return result
        if verdict == ResponderVerdict.OUT_OF_WINDOW:
            elapsed = (now_cycles - qp.last_nak) % (1 << 32)
            if self.nak_interval and qp.nak_armed and elapsed < self.nak_interval:
                result.nak_suppressed = True
                self.counters["naks_suppressed"] += 1
                return result
            qp.nak_armed, qp.last_nak = True, now_cycles % (1 << 32)
            self._nak(result, h, qp, verdict)
            return result
        if verdict == ResponderVerdict.TRIMMED:
            if qp.caps & P.QpCapability.TRIM_NACK:
                self._nak(result, h, qp, verdict)
            return result
        if verdict != ResponderVerdict.PLACED:
            self._nak(result, h, qp, verdict)
            return result

        # Placed: write, mark, advance the cumulative PSN, release completions, maybe ACK.
        opcode = bth["opcode"]
        payload = bytes(payload)
        if payload:
            self.memory.write(h["reth"]["va"], payload)
            result.writes.append((h["reth"]["va"], payload))
        qp.rcvd_bytes = (qp.rcvd_bytes + h["reth"]["dma_len"]) % (1 << RCVD_BYTES_BITS)
        qp.last_ts = h["tseth"]["tx_timestamp"]
        distance = (psn - qp.epsn) % P.PSN_MODULUS
        # Opens a new hole: above the expected PSN, and the PSN just below it has not arrived.
        new_hole = self.ack_new_holes and distance != 0 and \
            P.psn_add(psn, -1) not in qp.received
        qp.received.add(psn)
        # Placed above a hole as the gap_depth-th PSN received above it (once per hole).
        deep = bool(self.gap_depth) and distance != 0 and len(qp.received) == self.gap_depth
        if opcode in P.LAST_OPCODES:
            qp.last.add(psn)
        if opcode in P.IMMEDIATE_OPCODES:
            qp.wimm[psn] = h["immdt"]["imm"]
        moved, more = self._step(qp, bth["dqpn"], result)
        gap = distance != 0 or moved > 1 or more
        while more:
            _, more = self._step(qp, bth["dqpn"], result)

        immediate = (bool(bth["ackreq"]) or (h["tclass"] & 3) == P.ECN_CE
                     or (gap and not self.coalesce_gaps) or deep or new_hole)
        if not immediate:
            if qp.ack_count + 1 >= self.ack_every:
                immediate = True
            elif qp.ack_count == 0 and len(self._timers) >= self.timers:
                immediate = True
        if immediate:
            qp.ack_count = 0
            result.replies.append(self._sack(h, qp))
            self.counters["acks"] += 1
        else:
            if qp.ack_count == 0:
                deadline = (now_cycles + self.ack_delay) % (1 << 32)
                self._timers.append((deadline, bth["dqpn"], h, now_ns))
            qp.ack_count += 1
        return result

    def expire(self, now_cycles, *, now_ns=0, count=None):
        """Fire the ACK timers whose deadline has passed at ``now_cycles`` (at most ``count``),
        oldest first; returns the delayed ACKs. A timer whose QP owes no ACK any more (an ACK
        went out since) sends nothing."""
        replies = []
        while self._timers and (count is None or count > 0):
            deadline, qpn, h, arrival = self._timers[0]
            if (now_cycles - deadline) % (1 << 32) >= 1 << 31:
                break
            self._timers.popleft()
            if count is not None:
                count -= 1
            qp = self.qps[qpn]
            if qp.ack_count:
                qp.ack_count = 0
                # The packet that started the timer, with the last placed packet's timestamp.
                replies.append(self._sack(h, qp, tx_timestamp=qp.last_ts))
                self.counters["acks"] += 1
        return replies

    @property
    def timers_pending(self):
        return len(self._timers)

    # -- internals -------------------------------------------------------------------------------

    def _classify(self, h):
        bth, reth = h["bth"], h["reth"]
        if bth["dqpn"] >= self.config.qps:
            return ResponderVerdict.BAD_QP, None
        qp = self.qps[bth["dqpn"]]
        if qp.state not in _RESPONDING_STATES:
            return ResponderVerdict.BAD_STATE, qp
        opcode = bth["opcode"]
        if opcode not in P.DATA_OPCODES or reth["dma_len"] > self.config.mtu or \
                (opcode not in P.LAST_OPCODES and reth["dma_len"] != self.config.mtu):
            return ResponderVerdict.BAD_SEQUENCE, qp
        distance = (bth["psn"] - qp.epsn) % P.PSN_MODULUS
        if distance >= P.PSN_MODULUS // 2:
            return ResponderVerdict.DUPLICATE, qp
        if distance >= qp.mpr * P.MPR_UNIT_PSNS:
            return ResponderVerdict.OUT_OF_WINDOW, qp
        if bth["psn"] in qp.received:
            return ResponderVerdict.DUPLICATE, qp
        if h["trimmed"]:
            return ResponderVerdict.TRIMMED, qp
        mr = self.mrs[reth["rkey"] % self.mr_slots]
        if not mr.valid or mr.rkey != reth["rkey"] or mr.pd != qp.pd:
            return ResponderVerdict.BAD_RKEY, qp
        if reth["va"] < mr.base or reth["va"] + reth["dma_len"] > mr.base + mr.length:
            return ResponderVerdict.OUT_OF_BOUNDS, qp
        if opcode in P.IMMEDIATE_OPCODES and len(qp.wimm) >= qp.max_wimm:
            return ResponderVerdict.WIMM_OVERFLOW, qp
        return ResponderVerdict.PLACED, qp

    def _step(self, qp, qpn, result):
        """One cumulative advance: up to the first PSN not received, but stopping just before
        a second WRITE_IMM end on the way (one completion per step, as the gateware).
        Returns ``(PSNs advanced, another step needed)``."""
        run = 0
        while run < self.window and P.psn_add(qp.epsn, run) in qp.received:
            run += 1
        ends = [i for i in range(run) if P.psn_add(qp.epsn, i) in qp.wimm]
        more = len(ends) > 1
        advance = ends[1] if more else run
        for i in range(advance):
            psn = P.psn_add(qp.epsn, i)
            qp.received.discard(psn)
            if psn in qp.last:
                qp.last.discard(psn)
                qp.msn = (qp.msn + 1) % P.PSN_MODULUS
            if psn in qp.wimm:
                result.completions.append({
                    "qpn": qpn, "side": CompletionSide.RESPONDER, "wr_id": qp.msn,
                    "status": P.CompletionStatus.SUCCESS, "opcode": P.WcOpcode.RECV_RDMA_WITH_IMM,
                    "byte_len": 0, "imm_valid": 1, "imm": qp.wimm.pop(psn)})
                self.counters["completions"] += 1
        qp.epsn = P.psn_add(qp.epsn, advance)
        return advance, more

    def _sack(self, h, qp, *, probe_id=None, tx_timestamp=None):
        """The SACK answering packet header ``h`` (the trigger) with QP ``qp``'s current state,
        or, with ``probe_id``, the pr = 1 SACK answering reliability probe ``h``.
        ``tx_timestamp``: the CC_STATE echo, if not the trigger's."""
        cack = P.psn_add(qp.epsn, -1)
        trigger = h["bth"]["psn"]
        distance = P.psn_diff(trigger, cack)
        if probe_id is None and distance > P.SACK_BITMAP_BITS:
            # The trigger's 64-aligned block: the holes around a late arrival.
            base = trigger & ~(P.SACK_BITMAP_BITS - 1)
        else:
            base = P.psn_add(cack, 1)
        bitmap = sum(1 << i for i in range(P.SACK_BITMAP_BITS)
                     if P.psn_add(base, i) in qp.received)
        if probe_id is None:
            mark = P.SackMark.SKIP_ONCE if (h["tclass"] & 3) == P.ECN_CE else P.SackMark.NONE
            if tx_timestamp is None:
                tx_timestamp = h["tseth"]["tx_timestamp"]
        else:
            mark, tx_timestamp = P.SackMark.NONE, h["ctl"]["peth"]["tx_timestamp"]
        return self._header(h, P.Opcode.RELIABILITY_SACK, qp.remote_qpn, cack, ctl={"sack": {
            "seth": {"m": mark, "pr": int(probe_id is not None),
                     "ack_psn_offset": signed16(distance if probe_id is None else probe_id),
                     "entropy": _entropy(h), "cack_psn": cack, "mpr": qp.mpr,
                     "sack_psn_offset": signed16(P.psn_diff(base, cack)),
                     "sack_bitmap": bitmap},
            "cc_state": {"tx_timestamp": tx_timestamp,
                         "ooo_count": min(len(qp.received), OOO_COUNT_MAX),
                         "rcvd_bytes": qp.rcvd_bytes}}})

    def probe(self, header):
        """Answer one reliability probe (PETH): the pr = 1 SACK header, or ``None`` when its QP
        does not exist or does not respond (dropped, counted in ``probes_dropped``). A probe
        consumes no PSN and changes nothing."""
        h = full_header(header, self.config)
        qpn = h["bth"]["dqpn"]
        if qpn >= self.config.qps or self.qps[qpn].state not in _RESPONDING_STATES:
            self.counters["probes_dropped"] += 1
            return None
        self.counters["probes"] += 1
        return self._sack(h, self.qps[qpn], probe_id=h["ctl"]["peth"]["probe_id"])

    def _nak(self, result, h, qp, verdict):
        """A NETH NACK (trimmed, out of window) or an AETH NAK (fatal) refusing ``h`` (``qp``
        None: unknown QP, echo its ``dqpn``, MSN 0)."""
        psn = h["bth"]["psn"]
        if verdict in VERDICT_NACK:
            reply = self._header(h, P.Opcode.RELIABILITY_NACK, qp.remote_qpn, psn, ctl={"neth": {
                "nack_reason": VERDICT_NACK[verdict], "entropy": _entropy(h), "nack_psn": psn,
                "tx_timestamp": h["tseth"]["tx_timestamp"]}})
        else:
            dqpn, msn = (h["bth"]["dqpn"], 0) if qp is None else (qp.remote_qpn, qp.msn)
            reply = self._header(h, P.Opcode.ACKNOWLEDGE, dqpn, psn, aeth={
                "syndrome": P.nak_syndrome(VERDICT_NAK[verdict]), "msn": msn})
        result.replies.append(reply)
        self.counters["naks"] += 1

    def _header(self, h, opcode, dqpn, psn, **transport):
        """A reply to ``h``: back to where it came from, on the port and EV it arrived on."""
        kinds = {P.Opcode.RELIABILITY_SACK: PacketKind.SACK,
                 P.Opcode.RELIABILITY_NACK: PacketKind.NACK,
                 P.Opcode.ACKNOWLEDGE: PacketKind.AETH}
        return full_header({
            "kind": kinds[opcode], "port": h["port"], "payload_len": 0,
            "eth_dst": h["eth_src"], "eth_src": h["eth_dst"],
            "vlan_valid": h["vlan_valid"], "vlan_tci": h["vlan_tci"],
            "ipv6": h["ipv6"], "ip_src": h["ip_dst"], "ip_dst": h["ip_src"],
            "tclass": ACK_TCLASS, "flow_label": h["flow_label"], "hop_limit": ACK_HOP_LIMIT,
            "udp_sport": h["udp_sport"],
            "bth": {"opcode": opcode, "pkey": P.BTH_DEFAULT_PKEY, "dqpn": dqpn, "psn": psn},
            **transport,
        }, self.config)


def _entropy(h):
    """The EV packet ``h`` arrived with: UDP source port, IPv6 flow label's low 16 bits."""
    return h["udp_sport"] | ((h["flow_label"] & 0xFFFF) << 16 if h["ipv6"] else 0)
