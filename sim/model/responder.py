"""Reference model of the MRC responder: classification, placement, ACK/NACK, completions.

Packet level and pure Python: feed one received data packet (its header as the
:func:`hdl.packet.headers.packet_header_layout` dict that :func:`sim.rtlpackets.header_from_scapy`
returns, plus its payload) and get back what the responder does with it: a
:class:`ResponderVerdict`, the memory writes, the ACK/NACK headers to send (dicts of the same
layout, ready for :func:`sim.rtlpackets.packet_from_header`) and the completions released.
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
    DEFAULT_NAK_INTERVAL,
    GAP_DEPTH_BITS,
    RESPONDER_COUNTERS,
    VERDICT_NAK,
    ResponderCommand,
    ResponderVerdict,
)

from .memory import Memory

__all__ = ["ResponderModel", "ResponderResult", "zero_header", "full_header", "DEFAULT_TIMERS"]

DEFAULT_TIMERS = 16             #: ACK-delay timer entries (the gateware's ``timers``)
_RESPONDING_STATES = (P.QpState.RTR, P.QpState.RTS)


def _zero(layout):
    if isinstance(layout, data.StructLayout):
        return {name: _zero(member.shape) for name, member in layout}
    return 0


def zero_header(config):
    """A :func:`~hdl.packet.headers.packet_header_layout` dict with every field 0."""
    return _zero(packet_header_layout(config))


def full_header(header, config):
    """``header`` with every missing field of the layout filled with 0 (nested dicts)."""
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
    return merge(zero_header(config), header)


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
    last_nak: int = 0               #: cycle of the last out-of-window NAK
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
        self.coalesce_gaps = False
        self.gap_depth = 0
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
            qp.epsn, qp.msn, qp.ack_count, qp.nak_armed = psn, 0, 0, False
            qp.received, qp.last, qp.wimm = set(), set(), {}
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
                  gap_depth=0):
        if not 1 <= ack_every <= 255:
            return P.Errno.EINVAL
        self.ack_every, self.ack_delay, self.nak_interval = ack_every, ack_delay, nak_interval
        self.coalesce_gaps = bool(coalesce_gaps)
        self.gap_depth = gap_depth % (1 << GAP_DEPTH_BITS)      # the field's width
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
                              gap_depth=get("gap_depth", 0)), 0

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
            self._nak(result, h, None, VERDICT_NAK[verdict], dqpn=bth["dqpn"], now_ns=now_ns)
            return result
        if verdict == ResponderVerdict.DUPLICATE:
            qp.ack_count = 0
            result.replies.append(self._reply(h, qp, P.AETH_ACK, now_ns, now_ns))
            self.counters["acks"] += 1
            return result
        if verdict == ResponderVerdict.OUT_OF_WINDOW:
            elapsed = (now_cycles - qp.last_nak) % (1 << 32)
            if self.nak_interval and qp.nak_armed and elapsed < self.nak_interval:
                result.nak_suppressed = True
                self.counters["naks_suppressed"] += 1
                return result
            qp.nak_armed, qp.last_nak = True, now_cycles % (1 << 32)
            self._nak(result, h, qp, VERDICT_NAK[verdict], now_ns=now_ns)
            return result
        if verdict == ResponderVerdict.TRIMMED:
            if qp.caps & P.QpCapability.TRIM_NACK:
                self._nak(result, h, qp, VERDICT_NAK[verdict], now_ns=now_ns)
            return result
        if verdict != ResponderVerdict.PLACED:
            self._nak(result, h, qp, VERDICT_NAK[verdict], now_ns=now_ns)
            return result

        # Placed: write, mark, advance the cumulative PSN, release completions, maybe ACK.
        opcode = bth["opcode"]
        payload = bytes(payload)
        if payload:
            self.memory.write(h["reth"]["va"], payload)
            result.writes.append((h["reth"]["va"], payload))
        qp.received.add(psn)
        distance = (psn - qp.epsn) % P.PSN_MODULUS
        # Placed above a hole as the gap_depth-th (or later) PSN received above it.
        deep = bool(self.gap_depth) and distance != 0 and len(qp.received) >= self.gap_depth
        if opcode in P.LAST_OPCODES:
            qp.last.add(psn)
        if opcode in P.IMMEDIATE_OPCODES:
            qp.wimm[psn] = h["immdt"]["imm"]
        moved, more = self._step(qp, bth["dqpn"], result)
        gap = distance != 0 or moved > 1 or more
        while more:
            _, more = self._step(qp, bth["dqpn"], result)

        immediate = (bool(bth["ackreq"]) or (h["tclass"] & 3) == P.ECN_CE
                     or (gap and not self.coalesce_gaps) or deep)
        if not immediate:
            if qp.ack_count + 1 >= self.ack_every:
                immediate = True
            elif qp.ack_count == 0 and len(self._timers) >= self.timers:
                immediate = True
        if immediate:
            qp.ack_count = 0
            result.replies.append(self._reply(h, qp, P.AETH_ACK, now_ns, now_ns))
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
                replies.append(self._reply(h, qp, P.AETH_ACK, now_ns, arrival))
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

    def _sack(self, qp):
        return sum(1 << i for i in range(self.config.sack_bits)
                   if P.psn_add(qp.epsn, i) in qp.received)

    def _nak(self, result, h, qp, code, *, now_ns, dqpn=None):
        result.replies.append(self._reply(h, qp, P.nak_syndrome(code), now_ns, now_ns,
                                          dqpn=dqpn))
        self.counters["naks"] += 1

    def _reply(self, h, qp, syndrome, now_ns, arrival_ns, *, dqpn=None):
        """The ACK/NACK answering packet header ``h`` with QP ``qp``'s current state (``qp``
        None: unknown QP, echo ``dqpn``, nothing received)."""
        bth = h["bth"]
        flags = 0
        if (h["tclass"] & 3) == P.ECN_CE:
            flags |= P.AckFlags.ECN_ECHO
        if h["mdeth"]["flags"] & P.DataFlags.RETRANSMISSION:
            flags |= P.AckFlags.TRIGGER_RETRANSMISSION
        svc_time = 0
        if qp is not None and qp.caps & P.QpCapability.SVC_TIME:
            flags |= P.AckFlags.SERVICE_TIME
            svc_time = (now_ns - arrival_ns) % (1 << 32)
        if qp is None:
            cum_psn, msn, sack, dqpn = P.psn_add(bth["psn"], -1), 0, 0, dqpn
        else:
            cum_psn, msn, sack, dqpn = P.psn_add(qp.epsn, -1), qp.msn, self._sack(qp), \
                qp.remote_qpn
        return full_header({
            "kind": PacketKind.ACK, "port": h["port"], "payload_len": 0,
            "eth_dst": h["eth_src"], "eth_src": h["eth_dst"],
            "vlan_valid": h["vlan_valid"], "vlan_tci": h["vlan_tci"],
            "ipv6": h["ipv6"], "ip_src": h["ip_dst"], "ip_dst": h["ip_src"],
            "tclass": ACK_TCLASS, "flow_label": h["flow_label"], "hop_limit": ACK_HOP_LIMIT,
            "udp_sport": h["udp_sport"],
            "bth": {"opcode": P.Opcode.ACKNOWLEDGE, "pkey": P.BTH_DEFAULT_PKEY, "dqpn": dqpn,
                    "psn": bth["psn"]},
            "aeth": {"syndrome": syndrome, "msn": msn},
            "macketh": {"ev_index": h["mdeth"]["ev_index"], "flags": int(flags),
                        "sack_bytes": self.config.sack_bytes, "cum_psn": cum_psn,
                        "ts_echo": h["mdeth"]["tx_ts"], "svc_time": svc_time},
            "sack": sack,
        }, self.config)
