"""A whole NIC at frame level, built from the reference models: the model endpoint of the
network simulations.

:class:`ModelNic` joins :class:`~sim.model.requester.RequesterModel`,
:class:`~sim.model.responder.ResponderModel` and :class:`~sim.model.path.PathModel` the way
:class:`hdl.nic.MrcNic` joins the gateware blocks, and puts on the wire the frames the RTL
NIC puts there: data headers are formed field by field as
:class:`hdl.transport.txformer.TxFormer` forms them, and every frame is serialized by
:func:`sim.rtlpackets.packet_from_header` (the frame :class:`hdl.packet.builder.HeaderBuilder`
emits). Received frames go through the parser's checks (drop reasons of
:class:`hdl.packet.headers.DropReason`), then to the responder (DATA, reliability probes) or
the requester (SACK, NACK, AETH NAK); EV probes (ENDPOINT_REQUEST/RESPONSE) are counted and
ignored (the network simulations model probes at the pair level).

Time is simulated nanoseconds, given by the caller and never going back. The NIC's pipeline
latency is not modelled (a received frame is handled at its arrival time); the one shared
transmit engine is: a frame occupies ``ceil(len / (data_width / 8))`` clock cycles of it, ACKs
go before data (the RTL's transmit arbiter gives the responder priority), and a data packet is
decided (path selection, the TSETH timestamp) when the engine starts it. ``docs/model.md`` has
the rest.
"""

import heapq
import math
from collections import deque

from scapy.compat import raw
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.control.nicmap import TX_COUNTERS
from hdl.packet.headers import DropReason, PacketKind
from hdl.path.ev import EvProfile, generate_entries
from hdl.path.select import PathCommand, ProbeRecovery
from hdl.path.watch import WATCH_WINDOW_BITS
from hdl.transport.req_defs import INFER_K_DEFAULT, TIME_SHIFT, RequesterCommand
from hdl.transport.resp_defs import GAP_DEPTH_BITS
from hdl.transport.txformer import DATA_HOP_LIMIT, DATA_TCLASS
from sim import packets as pk
from sim.driver.core import DriverError
from sim.rtlpackets import header_from_scapy, packet_from_header

from .path import PathModel, ReferenceExpander, command
from .requester import RequesterModel
from .responder import ResponderModel, full_header
from .watch import PortWatchModel

__all__ = ["ModelNic", "RegionMemory", "MODEL_COUNTERS", "MAX_FRAME_OVERHEAD"]

#: Longest legal frame is this many bytes plus the MTU (the parser's ``max_frame_bytes``).
MAX_FRAME_OVERHEAD = 174
#: Counters of what only the model does (not RTL names): see ``docs/model.md``.
MODEL_COUNTERS = ("probes_ignored", "fetch_unmapped", "place_unmapped", "frames_sent",
                  "bytes_sent")
_MIN_FRAME = 60                 # Ethernet minimum without FCS: a MAC may pad up to it
_DEFAULT_CAPS = int(P.QpCapability.TRIM_NACK | P.QpCapability.SVC_TIME)


class RegionMemory:
    """Host memory as a few regions, one ``bytearray`` each.

    The responder places payloads with :meth:`write`; the transmit side fetches payloads with
    :meth:`read`. An access outside every region is refused (``None`` / ``False``) so the NIC
    can count it instead of corrupting anything.
    """

    def __init__(self):
        self.regions = []           # [(base, bytearray)], sorted by base

    def add(self, base, length):
        """A new zeroed region ``[base, base + length)`` (or the existing one covering it)."""
        found = self._find(base, length)
        if found is not None:
            return found[1]
        if any(b < base + length and base < b + len(buf) for b, buf in self.regions):
            raise ValueError(f"region {base:#x}+{length:#x} overlaps a region")
        buf = bytearray(length)
        self.regions.append((base, buf))
        self.regions.sort(key=lambda region: region[0])
        return buf

    def _find(self, addr, length):
        for base, buf in self.regions:
            if base <= addr and addr + length <= base + len(buf):
                return base, buf
        return None

    def read(self, addr, length):
        """``length`` bytes at ``addr``, or ``None`` when they are not inside one region."""
        found = self._find(addr, length)
        if found is None:
            return None
        base, buf = found
        return bytes(buf[addr - base:addr - base + length])

    def write(self, addr, data):
        """Write ``data`` at ``addr``; ``False`` (nothing written) outside every region."""
        data = bytes(data)
        found = self._find(addr, len(data))
        if found is None:
            return False
        base, buf = found
        buf[addr - base:addr - base + len(data)] = data
        return True


class _PlacementMemory:
    """The responder's memory view: counts placements outside the host regions."""

    def __init__(self, nic):
        self._nic = nic

    def write(self, addr, data):
        if not self._nic.memory.write(addr, data):
            self._nic.counters["model"]["place_unmapped"] += 1


class ModelNic:
    """One MRC NIC at frame level: requester, responder and path selection reference models
    behind the RTL NIC's wire format, one shared transmit engine and the NIC's control calls.

    Parameters
    ----------
    config : NicConfig
    name : str
        A label (``"a"``, ``"b"``) for reports.
    mr_slots, ack_timers : int
        MR table entries and ACK-delay timers of the responder model.
    event_depth, hash_seed : int
        As :class:`~hdl.path.select.PathSelect` (``hash_seed`` picks the AUTO-mode EV).

    Members
    -------
    memory : RegionMemory
        Host memory: payloads are fetched from it and placed into it.
    completions : list of dict
        :func:`~hdl.interfaces.completion_layout` dicts (requester and responder), in the
        order the NIC produced them; ``completion_times`` holds the time (ns) of each.
    ev_events : list of dict
        ``{"time_ns", "profile", "index", "port", "state"}`` per GOOD <-> ASSUMED_BAD change
        (``port`` 1-based, ``state`` an :class:`~hdl.protocol.EvState` value).
    counters : dict
        ``{block: {name: value}}`` with the RTL's block and counter names
        (:meth:`~sim.driver.nic.NicDriver.counters`) plus a ``model`` block.
    requester, responder, path : the reference models (read their state freely).

    Control calls mirror :class:`~sim.driver.nic.NicDriver` (synchronous here) and raise
    :class:`~sim.driver.DriverError` with the errno the models answer.
    """

    def __init__(self, config, *, name="nic", mr_slots=16, ack_timers=16, event_depth=16,
                 hash_seed=0):
        if not isinstance(config, NicConfig):
            raise TypeError(f"config must be a NicConfig, not {config!r}")
        self.config = config
        self.name = name
        self.period_ns = 1e9 / config.clock_hz
        self.memory = RegionMemory()
        self.requester = RequesterModel(config)
        self.responder = ResponderModel(config, mr_slots=mr_slots, timers=ack_timers,
                                        memory=_PlacementMemory(self))
        self.expander = ReferenceExpander()
        self.path = PathModel(config=config, expander=self.expander, event_depth=event_depth,
                              hash_seed=hash_seed)
        self.local = {"mac": 0, "ip": 0, "ipv6": int(config.ip_version == 6)}
        self.connections = {}           # qpn -> (dqpn, mac, ip): the TxFormer's table
        self.connected = set()          # QPs brought up with connect_qp
        self.completions = []
        self.completion_times = []
        self.ev_events = []
        self.counters = {
            "rx_counters": dict.fromkeys((r.name.lower() for r in DropReason), 0),
            "tx_counters": dict.fromkeys(TX_COUNTERS, 0),
            "requester_counters": self.requester.counters,
            "responder_counters": self.responder.counters,
            "path_counters": self.path.counters,
            "model": dict.fromkeys(MODEL_COUNTERS, 0),
        }
        self.watch = PortWatchModel(config.ports, counters=self.counters["tx_counters"])
        # Event state: time of the last event applied, the engine, pending ACKs, timers.
        self._time = 0.0
        self._engine_free = 0.0
        self._idle = True               # nothing to send until an input changes the state
        self._acks = deque()            # ACK/NAK header dicts waiting for the engine
        self._wire = []                 # heap of (done_ns, serial, plane, frame)
        self._serial = 0
        self._ack_deadlines = deque()   # mirror of the responder's ACK-delay timers (cycles)
        self._req_completions = 0       # requester.completions already collected
        self._req_feedback = 0          # requester.feedback already forwarded
        self._timer_due = None          # next retransmit timer expiry (ns), when known
        self._timer_dirty = False       # requester state changed: recompute _timer_due

    # -- control (NicDriver's calls) ---------------------------------------------------------

    @staticmethod
    def _check(errno, block, request):
        if errno != P.Errno.OK:
            raise DriverError(errno, block, request)

    def _path(self, **fields):
        errno, data = self.path.command(command(**fields))
        self._check(errno, "path", fields)
        self._collect_events()
        return data

    def set_local(self, *, mac, ip, ipv6=None):
        """The NIC's own MAC and IP (TxCommand.LOCAL_WRITE)."""
        self.local = {"mac": mac, "ip": ip,
                      "ipv6": int(self.config.ip_version == 6) if ipv6 is None else int(ipv6)}

    def register_mr(self, *, slot, rkey, pd, base, length):
        """An MR in the responder's table; the host gets a region of memory behind it."""
        self._check(self.responder.mr_write(slot, valid=1, rkey=rkey, pd=pd, base=base,
                                            length=length), "responder",
                    {"slot": slot, "rkey": rkey})
        self.memory.add(base, length)

    def deregister_mr(self, *, slot):
        self._check(self.responder.mr_write(slot, valid=0), "responder", {"slot": slot})

    def configure_acks(self, *, ack_every=4, ack_delay=128, nak_interval=1024,
                       coalesce_gaps=False, gap_depth=0, ack_new_holes=False):
        if not 0 <= gap_depth < 1 << GAP_DEPTH_BITS:
            raise DriverError(P.Errno.EINVAL, "responder", {"gap_depth": gap_depth})
        self._check(self.responder.configure(ack_every=ack_every, ack_delay=ack_delay,
                                             nak_interval=nak_interval,
                                             coalesce_gaps=coalesce_gaps,
                                             gap_depth=gap_depth,
                                             ack_new_holes=ack_new_holes), "responder",
                    {"ack_every": ack_every})

    def ev_profile_online(self, profile_id, profile, *, num_evs, min_active=1, adaptive=False,
                          recovery=ProbeRecovery.AUTO, fate=False, evs=None, mode=None):
        """Define, fill and take ONLINE an EV profile, as the driver does: GENERATED
        profiles generate their entries; EXPLICIT and AUTO ones get ``evs`` ((bytes, port)
        pairs; default: the generated entries written explicitly)."""
        if not isinstance(profile, EvProfile):
            raise TypeError(f"profile must be an EvProfile, not {profile!r}")
        mode = profile.mode if mode is None else P.EvMode(mode)
        self.expander.profiles[profile_id] = profile
        self._path(cmd=PathCommand.PROFILE_SET, profile=profile_id, mode=mode, num_evs=num_evs,
                   min_active=min_active, adaptive=int(adaptive), recovery=recovery,
                   fate=int(fate))
        self._path(cmd=PathCommand.PROFILE_STATE, profile=profile_id,
                   state=P.ProfileState.OFFLINE)
        if mode != P.EvMode.GENERATED:
            if evs is None:
                evs = generate_entries(profile, num_evs, num_ports=self.config.ports)
            for index, (ev, port) in enumerate(evs):
                value = int.from_bytes(bytes(ev).ljust(P.EV_MAX_BYTES, b"\0"), "big")
                self._path(cmd=PathCommand.ENTRY_WRITE, profile=profile_id, index=index,
                           value=value, port=port, state=P.EvState.GOOD)
        self._path(cmd=PathCommand.PROFILE_STATE, profile=profile_id,
                   state=P.ProfileState.ONLINE)

    def set_ev_state(self, profile_id, index, state):
        self._path(cmd=PathCommand.ENTRY_STATE, profile=profile_id, index=index, state=state)

    def read_ev(self, profile_id, index):
        return self._path(cmd=PathCommand.ENTRY_READ, profile=profile_id, index=index)

    def connect_qp(self, qpn, *, ev_profile, remote_qpn, remote_mac, remote_ip, psn,
                   remote_psn, mpr, max_wimm, pd, ev_offset=0, caps=_DEFAULT_CAPS, timeout=14,
                   retry_linear=P.RETRY_LINEAR_MAX, retry_exponential=0):
        """RESET -> INIT -> RTR -> RTS in one call, writing each block as the driver does
        (``psn``: ours; ``remote_psn``: the peer's first PSN, which our responder expects;
        ``timeout``, ``retry_linear``, ``retry_exponential``: the retransmit timer's local ACK
        timeout exponent and retry counts, as :class:`~sim.driver.nic.QpAttributes`)."""
        if not 0 <= qpn < self.config.qps:
            raise DriverError(P.Errno.ENOENT, "qp", {"qpn": qpn})
        if not 0 <= timeout <= P.LOCAL_ACK_TIMEOUT_MAX or \
                not 0 <= retry_linear <= P.RETRY_LINEAR_MAX or \
                not 0 <= retry_exponential <= P.RETRY_EXPONENTIAL_MAX:
            raise DriverError(P.Errno.EINVAL, "qp", {"qpn": qpn, "timeout": timeout,
                                                     "retries": (retry_linear,
                                                                 retry_exponential)})
        self._path(cmd=PathCommand.QP_PROFILE, qpn=qpn, profile=ev_profile, offset=ev_offset)
        common = {"remote_qpn": remote_qpn, "pd": pd, "mpr": mpr, "caps": caps,
                  "max_wimm": max_wimm}
        steps = ((P.QpState.INIT, False), (P.QpState.RTR, True), (P.QpState.RTS, False))
        for state, set_psn in steps:
            if state == P.QpState.RTR:
                self.connections[qpn] = (remote_qpn, remote_mac, remote_ip)
            self._check(self.responder.qp_write(qpn, state=state, psn=remote_psn,
                                                set_psn=set_psn, **common),
                        "responder", {"qpn": qpn, "state": state.name})
            if state != P.QpState.RTR:
                errno, _ = self.requester.control(
                    RequesterCommand.QP_WRITE, qpn=qpn, state=state, psn=psn, mpr=mpr,
                    max_wimm=max_wimm, timeout=timeout, retry_linear=retry_linear,
                    retry_exp=retry_exponential)
                self._check(errno, "requester", {"qpn": qpn, "state": state.name})
        self.connected.add(qpn)
        self._timer_dirty = True

    def configure_requester(self, *, ackreq_every=0, infer_k=INFER_K_DEFAULT, cc=False,
                            reo_wnd=0, cc_algorithm="ecn", nscc=None):
        """The requester's CONFIG: an ACK request every ``ackreq_every`` packets (0: only on
        the last of a message), SACK loss inference after ``infer_k`` later PSNs (0: off),
        a congestion window (``cc``) and time-based inference after a reorder window of
        ``reo_wnd`` units (0: off). ``cc_algorithm``: the window's algorithm, ``"ecn"`` (the
        ECN window, as the RTL after reset) or ``"nscc"`` (with the
        :class:`~sim.model.nscc.NsccSetting` ``nscc``; the RTL's in a build with the engine,
        the main job's default); set before the QPs are connected.
        """
        errno, _ = self.requester.control(RequesterCommand.CONFIG, ackreq_every=ackreq_every,
                                          infer_k=infer_k, cc=int(cc), reo_wnd=reo_wnd)
        self._check(errno, "requester", {"ackreq_every": ackreq_every, "infer_k": infer_k,
                                         "reo_wnd": reo_wnd})
        self.requester.set_cc_algorithm(cc_algorithm, nscc)

    def set_port_watch(self, window, quiet=0):
        """The port watch's window and quiet time (1.024 us units; window 0: off;
        ``docs/recovery.md``, "Port watch")."""
        for name, value in (("port_wnd", window), ("port_quiet", quiet)):
            if not 0 <= value < 1 << WATCH_WINDOW_BITS:
                raise DriverError(P.Errno.EINVAL, "settings", {name: value})
        self.watch.window, self.watch.quiet = window, quiet

    def counters_snapshot(self):
        """A copy of :attr:`counters`."""
        return {block: dict(values) for block, values in self.counters.items()}

    # -- host side ---------------------------------------------------------------------------

    def post(self, wr, now_ns=None):
        """Post a work request (a :func:`~hdl.interfaces.work_request_layout` dict)."""
        if now_ns is not None:
            self._run_until(now_ns, inclusive=False)
            self._time = max(self._time, now_ns)
        self.requester.post({k: v for k, v in wr.items() if k != "data"})
        self._collect_requester()
        self._idle = False

    # -- network side ------------------------------------------------------------------------

    def receive(self, plane, frame, now_ns):
        """A frame (bytes, no FCS) arrived on ``plane`` (0-based) at ``now_ns``."""
        self._run_until(now_ns, inclusive=False)
        self._time = max(self._time, now_ns)
        parsed = self._parse(plane, bytes(frame))
        if parsed is None:
            return
        header, payload = parsed
        kind = header["kind"] = PacketKind(header["kind"])   # the models compare enums
        self.watch.arrived(plane, now_ns)
        if kind == PacketKind.RPROBE:
            reply = self.responder.probe(header)
            if reply is not None:
                self._acks.append(reply)
        elif kind == PacketKind.DATA:
            cycles = self._cycles(now_ns)
            pending = self.responder.timers_pending
            result = self.responder.receive(header, payload, now_ns=int(now_ns),
                                            now_cycles=cycles)
            if self.responder.timers_pending > pending:
                self._ack_deadlines.append(cycles + self.responder.ack_delay)
            self._acks.extend(result.replies)
            for completion in result.completions:
                self._complete(completion, now_ns)
        elif kind in (PacketKind.SACK, PacketKind.NACK, PacketKind.AETH):
            if kind == PacketKind.SACK:
                echo = header["ctl"]["sack"]["cc_state"]["tx_timestamp"]
                self._port_watch(self.watch.ack(plane, echo, now_ns))
            elif kind == PacketKind.NACK:
                echo = header["ctl"]["neth"]["tx_timestamp"]
                self._port_watch(self.watch.ack(plane, echo, now_ns))
            self.requester.receive(header, self._units(now_ns), now_ns=now_ns)
            self._timer_dirty = True
            self._collect_requester()
        else:
            # The RTL's probe requester/responder have no reference model yet.
            self.counters["model"]["probes_ignored"] += 1
        self._idle = False

    def transmit(self, now_ns):
        """Frames whose transmission completes by ``now_ns``: ``[(plane, frame bytes)]``."""
        self._run_until(now_ns, inclusive=True)
        out = []
        while self._wire and self._wire[0][0] <= now_ns:
            _, _, plane, frame = heapq.heappop(self._wire)
            out.append((plane, frame))
        return out

    def next_event_ns(self):
        """The earliest time something happens without new input, or ``None``."""
        times = []
        if self._wire:
            times.append(self._wire[0][0])
        if not self._idle:
            times.append(max(self._engine_free, self._time))
        if self._ack_deadlines:
            times.append(self._ack_deadlines[0] * self.period_ns)
        if (due := self._next_timer()) is not None:
            times.append(due)
        if (due := self.watch.due(self._time)) is not None:
            times.append(due)
        return min(times) if times else None

    @property
    def busy(self):
        """Frames being serialized, ACKs waiting or ACK timers running."""
        return bool(self._wire or self._acks or self._ack_deadlines)

    # -- internals: the event loop -----------------------------------------------------------

    def _cycles(self, now_ns):
        return int(now_ns / self.period_ns + 1e-9)

    def _run_until(self, now_ns, *, inclusive):
        """Apply every internal event (engine starts, ACK timers, retransmit timer) due
        before ``now_ns`` (or at it, with ``inclusive``), in time order."""
        if now_ns < self._time:
            raise ValueError(f"time must not go back: {now_ns} < {self._time}")
        while True:
            candidates = []
            if not self._idle:
                candidates.append((max(self._engine_free, self._time), 2))
            if self._ack_deadlines:
                candidates.append((self._ack_deadlines[0] * self.period_ns, 0))
            if (due := self._next_timer()) is not None:
                candidates.append((due, 1))
            if (due := self.watch.due(self._time)) is not None:
                candidates.append((due, 3))
            if not candidates:
                break
            when, what = min(candidates)
            if when > now_ns or (when == now_ns and not inclusive):
                break
            self._time = max(self._time, when)
            if what == 0:
                self._fire_ack_timers(when)
            elif what == 3:
                self._port_watch(self.watch.poll(when))
            elif what == 1:
                self._drive_timers(when)
            else:
                self._start_frame(when)

    def _port_watch(self, down):
        """Sweep the ports (1-based) the port watch found down."""
        self.path.advance_to(self._cycles(self._time))
        for port in down:
            self.path.port_down(port)
        self._collect_events()

    def _fire_ack_timers(self, when):
        replies = self.responder.expire(self._cycles(when), now_ns=int(when))
        while len(self._ack_deadlines) > self.responder.timers_pending:
            self._ack_deadlines.popleft()
        if replies:
            self._acks.extend(replies)
            self._idle = False

    def _start_frame(self, when):
        """The engine is free at ``when``: start the next frame (ACKs first) or go idle."""
        if self._acks:
            header = self._acks.popleft()
            self._emit(when, header["port"], raw(packet_from_header(header, b"", self.config)))
            return
        self.path.advance_to(self._cycles(when))
        while (request := self.requester.pull(self._units(when))) is not None:
            self._timer_dirty = True
            # A resend's LOST feedback reaches path select before the resend does (RTL).
            self._collect_requester()
            decision = self.path.select(request["qpn"], avoid_ev=request["avoid_ev"]
                                        if request["avoid_ev_valid"] else None,
                                        context=request["context"])
            if decision.no_path:
                # Not sent: the requester's loss recovery resends it (as in the RTL).
                self.counters["tx_counters"]["no_path"] += 1
                continue
            send = request["context"]
            qpn, psn = request["qpn"], send["psn"]
            self.requester.sent(qpn, psn, decision.ev)
            payload = b""
            if send["dma_len"]:
                payload = self.memory.read(send["local_addr"], send["dma_len"])
                if payload is None:
                    self.counters["model"]["fetch_unmapped"] += 1
                    payload = bytes(send["dma_len"])
            header = self.data_header(decision, send, when)
            self.watch.sent(decision.port, int(when))
            self._emit(when, decision.port, raw(packet_from_header(header, payload,
                                                                   self.config)))
            return
        self._idle = True

    def _emit(self, when, plane, frame):
        beats = math.ceil(len(frame) / self.config.bytes_per_beat)
        done = when + beats * self.period_ns
        self._engine_free = done
        self._serial += 1
        heapq.heappush(self._wire, (done, self._serial, plane, frame))
        self.counters["model"]["frames_sent"] += 1
        self.counters["model"]["bytes_sent"] += len(frame)

    def data_header(self, decision, send, now_ns):
        """The packet header dict of a data packet, field by field as
        :class:`~hdl.transport.txformer.TxFormer` forms it from a path decision
        (:class:`~sim.model.path.Decision`) and a send context."""
        dqpn, eth_dst, ip_dst = self.connections.get(decision.qpn, (0, 0, 0))
        fields = decision.fields
        return full_header({
            "kind": PacketKind.DATA, "port": decision.port, "payload_len": send["dma_len"],
            "eth_dst": eth_dst, "eth_src": self.local["mac"], "ipv6": self.local["ipv6"],
            "ip_src": self.local["ip"], "ip_dst": ip_dst, "tclass": DATA_TCLASS,
            "flow_label": fields["flow_label"], "hop_limit": DATA_HOP_LIMIT,
            "srv6_valid": fields["srv6_valid"], "srv6_src": self.local["ip"],
            "srv6_dst": fields["srv6_dst"], "srh_valid": fields["srh_valid"],
            "srh_segment": fields["srh_segment"], "udp_sport": fields["udp_sport"],
            "bth": {"opcode": send["opcode"], "pkey": P.BTH_DEFAULT_PKEY, "dqpn": dqpn,
                    "ackreq": send["ackreq"], "rtx": send["retransmission"], "ts": 1,
                    "psn": send["psn"]},
            "meth": {"msn": send["msn"], "rqmsn": send["rqmsn"]},
            "tseth": {"tx_timestamp": P.wire_timestamp(int(now_ns)), "ftype": P.Ftype.TIMESTAMP},
            "reth": {"va": send["va"], "rkey": send["rkey"], "dma_len": send["dma_len"]},
            "immdt": {"imm": send["imm"]},
        }, self.config)

    # -- internals: the retransmit timer -------------------------------------------------------

    @staticmethod
    def _units(now_ns):
        """The requester's time: 1.024 us units (``req_defs.TIME_SHIFT``)."""
        return int(now_ns) >> TIME_SHIFT

    def _next_timer(self):
        """When the next QP's retransmit timer or reorder window expires (ns), or ``None``:
        QPs with PSNs outstanding whose timer is not armed yet are armed at the next unit."""
        if not self._timer_dirty:
            return self._timer_due
        self._timer_dirty = False
        due = None
        for qpn in self.connected:
            state = self.requester.qp(qpn)
            if state["state"] != P.QpState.RTS or state["una"] == state["next_psn"]:
                continue
            timer = self.requester.timer(qpn)
            units = timer["start"] + timer["wait"] if timer["armed"] \
                else self._units(self._time) + 1
            reorder = self.requester.reorder_due(qpn)
            if reorder is not None:
                units = min(units, reorder)
            due = units if due is None else min(due, units)
        self._timer_due = None if due is None else float(due << TIME_SHIFT)
        return self._timer_due

    def _drive_timers(self, when):
        """THE place where the requester's retransmit timer is driven: at each expiry
        :meth:`RequesterModel.poll_timers` times QPs out (a TIMEOUT walk of retransmissions
        with LOST feedback, or ERROR once the retries are exhausted). The gateware's scanner
        notices an expiry up to one scan period later; here it is exact."""
        self.requester.poll_timers(self._units(when))
        self._timer_dirty = True
        self._collect_requester()
        self._idle = False

    # -- internals: collection -----------------------------------------------------------------

    def _complete(self, completion, when):
        self.completions.append({k: int(v) for k, v in completion.items()})
        self.completion_times.append(when)

    def _collect_requester(self):
        done = self.requester.completions
        while self._req_completions < len(done):
            self._complete(done[self._req_completions], self._time)
            self._req_completions += 1
        feedback = self.requester.feedback
        self.path.advance_to(self._cycles(self._time))
        while self._req_feedback < len(feedback):
            item = feedback[self._req_feedback]
            self._req_feedback += 1
            self.path.feedback(item["qpn"], item["ev"], item["kind"])
        self._collect_events()

    def assumed_bad(self, profile_id=0):
        """``[(index, port)]`` of the profile's ASSUMED_BAD EVs (what a controller probes)."""
        profile = self.path.profiles[profile_id]
        return [(index, entry.port) for index, entry in enumerate(profile.entries[
            :profile.num_evs]) if entry.written and entry.state == P.EvState.ASSUMED_BAD]

    def probe_answered(self, qpn, ev, now_ns):
        """A probe on EV ``ev`` (bound through ``qpn``) was answered at ``now_ns``: PROBE_OK
        feedback, as the RTL's probe requester gives it (the model has no probe frames)."""
        self._run_until(now_ns, inclusive=False)
        self._time = max(self._time, now_ns)
        self.path.advance_to(self._cycles(self._time))
        self.path.feedback(qpn, ev, P.FeedbackKind.PROBE_OK)
        self._collect_events()
        self._idle = False

    def _collect_events(self):
        for event in self.path.pop_events():
            self.ev_events.append({"time_ns": self._time, "profile": event.profile,
                                   "index": event.index, "port": event.port,
                                   "state": int(event.state)})

    # -- internals: the parser's checks --------------------------------------------------------

    def _drop(self, reason):
        self.counters["rx_counters"][reason.name.lower()] += 1
        return None

    def _parse(self, plane, frame):
        """``(header dict, payload)`` of an accepted frame, or ``None`` (counted by reason,
        the parser's checks in its order, ``docs/parser.md``)."""
        config = self.config
        frame, reason = _outer_checks(frame, config.mtu)
        if reason is not None:
            return self._drop(reason)
        try:
            pkt = Ether(frame)
        except Exception:   # Scapy raises many kinds on garbage
            return self._drop(DropReason.RUNT)
        if UDP not in pkt:
            return self._drop(DropReason.RUNT if pkt.haslayer(Raw) else
                              DropReason.BAD_IP_PROTOCOL)
        udp = pkt[UDP]
        if udp.dport != P.ROCEV2_UDP_PORT:
            return self._drop(DropReason.BAD_UDP_PORT)
        if udp.len != len(raw(udp)):
            return self._drop(DropReason.BAD_UDP_LENGTH)
        if pk.BTH not in pkt:
            return self._drop(DropReason.RUNT)
        bth = pkt[pk.BTH]
        if bth.version != P.BTH_VERSION or bth.padcount != 0:
            return self._drop(DropReason.BAD_BTH)
        if bth.opcode not in P.SUPPORTED_OPCODES:
            return self._drop(DropReason.UNSUPPORTED_OPCODE)
        try:
            header = header_from_scapy(pkt, config, port=plane)
        except ValueError:
            return self._drop(DropReason.BAD_LENGTH)
        except Exception:   # truncated transport headers
            return self._drop(DropReason.RUNT)
        payload = b""
        if header["kind"] == PacketKind.DATA:
            payload = pk.transport_payload(pkt)
            if len(payload) > config.mtu:
                return self._drop(DropReason.OVERSIZE)
            if header["trimmed"]:
                payload = b""
                header["payload_len"] = 0
            elif header["reth"]["dma_len"] != len(payload):
                return self._drop(DropReason.BAD_LENGTH)
        if not header["trimmed"] and not pk.icrc_ok(frame):
            return self._drop(DropReason.BAD_ICRC)
        self.counters["rx_counters"]["none"] += 1
        return full_header(header, config), payload


def _ipv4_checksum_ok(header):
    total = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, 20, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def _outer_checks(frame, mtu):
    """The parser's checks up to the first IP header's protocol (checks 1 to 7 of
    ``docs/parser.md``), on the bytes: ``(frame without MAC padding, reason or None)``."""
    n = len(frame)
    if n > MAX_FRAME_OVERHEAD + mtu:
        return frame, DropReason.OVERSIZE
    if n < 14:
        return frame, DropReason.RUNT
    offset, ethertype = 14, int.from_bytes(frame[12:14], "big")
    if ethertype == P.ETHERTYPE_VLAN:
        if n < 18:
            return frame, DropReason.RUNT
        offset, ethertype = 18, int.from_bytes(frame[16:18], "big")
    if ethertype not in (P.ETHERTYPE_IPV4, P.ETHERTYPE_IPV6):
        return frame, DropReason.BAD_ETHERTYPE
    ipv6 = ethertype == P.ETHERTYPE_IPV6
    if n - offset < (40 if ipv6 else 20):
        return frame, DropReason.RUNT
    ip = frame[offset:]
    if ip[0] >> 4 != (6 if ipv6 else 4):
        return frame, DropReason.BAD_IP_HEADER
    if ipv6:
        length, protocol = 40 + int.from_bytes(ip[4:6], "big"), ip[6]
        protocol_ok = protocol in (P.IP_PROTO_UDP, P.IP_PROTO_IPV6, P.IP_PROTO_IPV4,
                                   P.IP_PROTO_ROUTING)
    else:
        flags_fragment = int.from_bytes(ip[6:8], "big")
        if ip[0] & 0xF != 5 or flags_fragment & 0x3FFF or not _ipv4_checksum_ok(ip[:20]):
            return frame, DropReason.BAD_IP_HEADER
        length, protocol = int.from_bytes(ip[2:4], "big"), ip[9]
        protocol_ok = protocol == P.IP_PROTO_UDP
    if n == _MIN_FRAME and length < n - offset:
        frame = frame[:offset + length]         # MAC padding of a minimum-size frame
    elif length != n - offset:
        return frame, DropReason.BAD_IP_LENGTH
    if not protocol_ok:
        return frame, DropReason.BAD_IP_PROTOCOL
    return frame, None
