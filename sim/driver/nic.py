"""The NIC driver: ``mrc.h`` / ``mrc_ctl.h`` semantics over the register bus.

:class:`NicDriver` is what every bench uses to bring a NIC up: its own addresses, memory
regions, EV format and EV profiles through their state machines, and QPs through
RESET -> INIT -> RTR -> RTS with the attributes each step requires. A refused operation raises
:class:`~sim.driver.DriverError` carrying the errno name (EINVAL, EBUSY, E2BIG, ENOENT), whether
the hardware refused it or the driver did (an illegal QP transition, a missing attribute).
"""

from dataclasses import dataclass, field

from hdl import protocol as P
from hdl.path.ev import EvProfile, generate_entries
from hdl.path.expand import DefineOp
from hdl.path.select import PathCommand, ProbeRecovery
from hdl.path.watch import WATCH_WINDOW_BITS
from hdl.transport.req_defs import INFER_K_BITS, REO_WND_BITS, RequesterCommand
from hdl.transport.resp_defs import GAP_DEPTH_BITS, ResponderCommand
from hdl.transport.txformer import TxCommand

from .core import DriverError, RegisterDriver

__all__ = ["NicDriver", "QpAttributes", "QP_TRANSITIONS"]

#: Legal QP state transitions (ibverbs); any state may also go to RESET or ERROR.
QP_TRANSITIONS = {
    P.QpState.RESET: {P.QpState.INIT},
    P.QpState.INIT: {P.QpState.INIT, P.QpState.RTR},
    P.QpState.RTR: {P.QpState.RTS},
    P.QpState.RTS: {P.QpState.RTS},
    P.QpState.ERROR: set(),
}

#: Attributes each transition requires (mrc.h).
REQUIRED = {
    P.QpState.INIT: ("ev_profile",),
    P.QpState.RTR: ("remote_qpn", "remote_mac", "remote_ip", "rq_psn", "mpr", "pd"),
    P.QpState.RTS: ("sq_psn", "max_wimm"),
}


@dataclass
class QpAttributes:
    """What the driver knows of a QP (the hardware tables hold the same, split by block)."""
    state: P.QpState = P.QpState.RESET
    ev_profile: int | None = None
    ev_offset: int = 0
    cc_profile: int = 0
    remote_qpn: int | None = None
    remote_mac: int | None = None
    remote_ip: int | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    mpr: int | None = None
    max_wimm: int | None = None
    pd: int | None = None
    caps: int = int(P.QpCapability.TRIM_NACK | P.QpCapability.SVC_TIME)
    timeout: int = 14
    retry_linear: int = P.RETRY_LINEAR_MAX
    retry_exponential: int = 0
    extra: dict = field(default_factory=dict)


class NicDriver(RegisterDriver):
    """Bring-up and control of one :class:`hdl.nic.MrcNic`.

    Parameters
    ----------
    nic_or_map : MrcNic or RegisterMap
    bus : the bus adapter (:class:`~sim.driver.AmaranthBus`, ``sim.tb.cocotb_host.CocotbBus``)
    config : NicConfig
    """

    def __init__(self, regmap, bus, config, **kwargs):
        super().__init__(regmap, bus, **kwargs)
        self.config = config
        self.qps = {}

    def _error(self, errno, what, request):
        raise DriverError(errno, what, request)

    # -- the NIC's own addresses and memory regions -------------------------------------------

    async def set_local(self, *, mac, ip, ipv6=None):
        ipv6 = int(self.config.ip_version == 6) if ipv6 is None else int(ipv6)
        await self.command("tx", op=TxCommand.LOCAL_WRITE, eth=mac, ip=ip, ipv6=ipv6)

    async def register_mr(self, *, slot, rkey, pd, base, length):
        await self.command("responder", cmd=ResponderCommand.MR_WRITE, slot=slot, valid=1,
                           rkey=rkey, pd=pd, base=base, length=length)

    async def deregister_mr(self, *, slot):
        await self.command("responder", cmd=ResponderCommand.MR_WRITE, slot=slot, valid=0)

    async def set_trim_dscp(self, dscp):
        await self.configure("settings", trim_dscp=dscp)

    async def set_port_watch(self, window, quiet=0):
        """The port watch (``docs/recovery.md``, "Port watch"), both in 1.024 us units: a port
        whose oldest data packet no ACK on it has covered lags the newest echo on any port by
        ``window`` (0: off), while no ACK arrived on it for ``quiet``, is swept."""
        for name, value in (("port_wnd", window), ("port_quiet", quiet)):
            if not 0 <= value < 1 << WATCH_WINDOW_BITS:
                self._error(P.Errno.EINVAL, "settings", {name: value})
        await self.configure("settings", port_wnd=window, port_quiet=quiet)

    async def configure_acks(self, *, ack_every=4, ack_delay=128, nak_interval=1024,
                             coalesce_gaps=False, gap_depth=0, ack_new_holes=False):
        if not 0 <= gap_depth < 1 << GAP_DEPTH_BITS:
            self._error(P.Errno.EINVAL, "responder", {"gap_depth": gap_depth})
        await self.command("responder", cmd=ResponderCommand.CONFIG, ack_every=ack_every,
                           ack_delay=ack_delay, nak_interval=nak_interval,
                           coalesce_gaps=int(coalesce_gaps), gap_depth=gap_depth,
                           ack_new_holes=int(ack_new_holes))

    # -- EV profiles --------------------------------------------------------------------------

    async def define_ev_profile(self, profile_id, profile):
        """Load an :class:`~hdl.path.ev.EvProfile`'s format and fields into the expander."""
        if not isinstance(profile, EvProfile):
            raise TypeError(f"profile must be an EvProfile, not {profile!r}")
        widths = list(profile.format.widths)
        await self.command("ev_define", op=DefineOp.SET_FORMAT, profile=profile_id,
                           format_mode=profile.format.mode, count=len(widths),
                           **{f"widths[{i}]": w for i, w in enumerate(widths)})
        for index, ev_field in enumerate(profile.fields):
            await self.command("ev_define", op=DefineOp.SET_FIELD, profile=profile_id,
                               index=index, width=ev_field.width, init_val=ev_field.init_val,
                               mask=ev_field.mask, min_val=ev_field.min_val,
                               max_val=ev_field.max_val)
        await self.command("ev_define", op=DefineOp.COMMIT, profile=profile_id,
                           ev_mode=profile.mode)

    async def ev_profile_online(self, profile_id, profile, *, num_evs, min_active=1,
                                adaptive=False, recovery=ProbeRecovery.AUTO, fate=False,
                                evs=None, mode=None):
        """Define, fill and take ONLINE an EV profile: GENERATED profiles generate their
        ``num_evs`` entries in hardware; EXPLICIT ones get ``evs`` ((bytes, port) pairs;
        default: the generated entries written explicitly). ``fate``: port fate sharing (a
        loss that turns one EV ASSUMED_BAD turns every GOOD EV on its port ASSUMED_BAD,
        floor permitting; docs/path-select.md)."""
        mode = profile.mode if mode is None else mode
        await self.define_ev_profile(profile_id, profile)
        await self.command("path", cmd=PathCommand.PROFILE_SET, profile=profile_id, mode=mode,
                           num_evs=num_evs, min_active=min_active, adaptive=int(adaptive),
                           recovery=recovery, fate=int(fate))
        await self.command("path", cmd=PathCommand.PROFILE_STATE, profile=profile_id,
                           state=P.ProfileState.OFFLINE)
        if mode != P.EvMode.GENERATED:
            if evs is None:
                evs = generate_entries(profile, num_evs, num_ports=self.config.ports)
            for index, (ev, port) in enumerate(evs):
                value = int.from_bytes(ev.ljust(P.EV_MAX_BYTES, b"\0"), "big")
                await self.command("path", cmd=PathCommand.ENTRY_WRITE, profile=profile_id,
                                   index=index, value=value, port=port, state=P.EvState.GOOD)
        await self.command("path", cmd=PathCommand.PROFILE_STATE, profile=profile_id,
                           state=P.ProfileState.ONLINE)

    async def ev_profile_offline(self, profile_id):
        await self.command("path", cmd=PathCommand.PROFILE_STATE, profile=profile_id,
                           state=P.ProfileState.OFFLINE)

    async def set_ev_state(self, profile_id, index, state):
        await self.command("path", cmd=PathCommand.ENTRY_STATE, profile=profile_id,
                           index=index, state=state)

    async def read_ev(self, profile_id, index):
        data = (await self.command("path", cmd=PathCommand.ENTRY_READ, profile=profile_id,
                                   index=index))["data"]
        return data

    async def poll_ev_events(self):
        """Every EV event waiting, oldest first."""
        events = []
        while (event := await self.pop("ev_events")) is not None:
            events.append(event)
        return events

    # -- probes -------------------------------------------------------------------------------

    async def send_probe(self, *, qpn, ev, probe_id):
        await self.command("probe", qpn=qpn, ev=ev, probe_id=probe_id)

    async def poll_probe_results(self):
        results = []
        while (result := await self.pop("probe_results")) is not None:
            results.append(result)
        return results

    # -- QPs ----------------------------------------------------------------------------------

    def _qp(self, qpn):
        if not isinstance(qpn, int) or not 0 <= qpn < self.config.qps:
            self._error(P.Errno.ENOENT, "qp", {"qpn": qpn})
        return self.qps.setdefault(qpn, QpAttributes())

    async def modify_qp(self, qpn, state, **attributes):
        """Move QP ``qpn`` to ``state`` with ``attributes`` (names of :class:`QpAttributes`),
        checking the transition and the attributes it requires, then write the hardware.

        ERROR is written to the requester too: its outstanding WRs complete with
        WR_FLUSH_ERR and nothing more is sent. Any other state with WRs outstanding is
        refused by the requester (EBUSY): wait for their completions (after ERROR, for the
        flush) before RESET."""
        qp = self._qp(qpn)
        state = P.QpState(state)
        unknown = set(attributes) - set(QpAttributes.__dataclass_fields__)
        if unknown:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "unknown": sorted(unknown)})
        if state not in (P.QpState.RESET, P.QpState.ERROR) and \
                state not in QP_TRANSITIONS[qp.state]:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "from": qp.state.name,
                                               "to": state.name})
        merged = {**qp.__dict__, **attributes}
        for name in REQUIRED.get(state, ()):
            if merged.get(name) is None:
                self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "to": state.name,
                                                   "missing": name})
        if merged.get("mpr") is not None and not 1 <= merged["mpr"] <= self.config.mpr_units:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "mpr": merged["mpr"]})
        if merged.get("max_wimm") is not None and \
                not 1 <= merged["max_wimm"] <= self.config.max_wimm:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "max_wimm": merged["max_wimm"]})
        if not 0 <= merged["timeout"] <= P.LOCAL_ACK_TIMEOUT_MAX:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "timeout": merged["timeout"]})
        if not 0 <= merged["retry_linear"] <= P.RETRY_LINEAR_MAX or \
                not 0 <= merged["retry_exponential"] <= P.RETRY_EXPONENTIAL_MAX:
            self._error(P.Errno.EINVAL, "qp", {"qpn": qpn, "retries": (
                merged["retry_linear"], merged["retry_exponential"])})
        previous = qp.state
        for name, value in attributes.items():
            setattr(qp, name, value)

        if state == P.QpState.INIT:
            await self.command("path", cmd=PathCommand.QP_PROFILE, qpn=qpn,
                               profile=qp.ev_profile, offset=qp.ev_offset)
        if state == P.QpState.RTR:
            await self.command("tx", op=TxCommand.CONN_WRITE, qpn=qpn, dqpn=qp.remote_qpn,
                               eth=qp.remote_mac, ip=qp.remote_ip)
        await self._write_responder(qpn, qp, state, set_psn=state == P.QpState.RTR)
        if state in (P.QpState.RTS, P.QpState.RESET, P.QpState.INIT, P.QpState.ERROR) or \
                previous == P.QpState.RESET:
            await self._write_requester(qpn, qp, state)
        qp.state = state

    async def _write_responder(self, qpn, qp, state, *, set_psn):
        await self.command("responder", cmd=ResponderCommand.QP_WRITE, qpn=qpn, state=state,
                           remote_qpn=qp.remote_qpn or 0, pd=qp.pd or 0,
                           psn=qp.rq_psn or 0, set_psn=int(set_psn), mpr=qp.mpr or 1,
                           caps=qp.caps, max_wimm=qp.max_wimm or 1)

    async def _write_requester(self, qpn, qp, state):
        await self.command("requester", cmd=RequesterCommand.QP_WRITE, qpn=qpn, state=state,
                           psn=qp.sq_psn or 0, mpr=qp.mpr or 1, max_wimm=qp.max_wimm or 1,
                           timeout=qp.timeout, retry_linear=qp.retry_linear,
                           retry_exp=qp.retry_exponential)

    async def configure_requester(self, *, ackreq_every=0, infer_k=3, cc=False, reo_wnd=0,
                                  cc_nscc=False):
        """Requester settings (docs/requester.md, docs/recovery.md): ACK request every N
        packets of a message (0: message ends only), the SACK loss-inference threshold K
        (0: off; a hole with K later PSNs acknowledged is resent at once), the ECN
        congestion window (``cc``: off = only MPR limits a QP's PSN range) and the reorder
        window of time-based inference (``reo_wnd``, 1.024 us units, 0: off; a hole still
        not SACKed that long after a later PSN was is resent). ``cc_nscc``: the window ``cc``
        turns on is NSCC's (a build with NSCC, docs/congestion.md), not the ECN window."""
        if not 0 <= infer_k < 1 << INFER_K_BITS:
            self._error(P.Errno.EINVAL, "requester", {"infer_k": infer_k})
        if not 0 <= reo_wnd < 1 << REO_WND_BITS:
            self._error(P.Errno.EINVAL, "requester", {"reo_wnd": reo_wnd})
        await self.command("requester", cmd=RequesterCommand.CONFIG, ackreq_every=ackreq_every,
                           infer_k=infer_k, cc=int(bool(cc)), reo_wnd=reo_wnd,
                           cc_nscc=int(bool(cc_nscc)))

    async def connect_qp(self, qpn, *, ev_profile, remote_qpn, remote_mac, remote_ip, psn,
                         remote_psn, mpr, max_wimm, pd, ev_offset=0, **extra):
        """RESET -> INIT -> RTR -> RTS in one call (``psn``: ours, ``remote_psn``: the
        peer's first PSN, which our responder expects)."""
        await self.modify_qp(qpn, P.QpState.INIT, ev_profile=ev_profile, ev_offset=ev_offset)
        await self.modify_qp(qpn, P.QpState.RTR, remote_qpn=remote_qpn, remote_mac=remote_mac,
                             remote_ip=remote_ip, rq_psn=remote_psn, mpr=mpr, pd=pd,
                             max_wimm=max_wimm, **extra)
        await self.modify_qp(qpn, P.QpState.RTS, sq_psn=psn)

    async def qp_errors(self):
        """QPs the requester moved to ERROR since the last call; the driver records it."""
        errors = []
        while (entry := await self.pop("qp_errors")) is not None:
            errors.append(entry)
            if entry["qpn"] in self.qps:
                self.qps[entry["qpn"]].state = P.QpState.ERROR
        return errors

    async def counters(self):
        """Every counter block as ``{block: {name: value}}``."""
        return {name: await self.status(name) for name in
                ("rx_counters", "tx_counters", "requester_counters", "responder_counters",
                 "path_counters")}
