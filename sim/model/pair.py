"""Two model NICs over a network: a :class:`~sim.scenario.Scenario` run in pure Python.

:func:`run_model` brings up NIC ``a`` and NIC ``b`` (:class:`~sim.model.nic.ModelNic`) as the
RTL bench brings up its two RTL NICs (``sim/tb/cocotb_fabric.py``: addresses of
:mod:`sim.defaults`, one memory region each, the GENERATED EV profile of
``sim/data/default-ev-profile.json``, QP q of ``a`` connected to QP q of ``b``), posts the
scenario's traffic and runs both NICs and the network event by event in simulated time. It
returns the raw result dict the RTL bench also produces (keys in :func:`run_model`).

The network is anything with the fabric's API (``send(src, plane, frame, now)``,
``deliver(now) -> [(dst, plane, frame)]``, ``next_arrival()``; endpoints ``"a"`` and ``"b"``,
times in ns). :class:`DelayNetwork` is a small stand-in: a fixed delay per plane, an optional
failed plane and an optional trimming plane.
"""

import heapq
import time

from hdl import protocol as P
from sim import packets as pk
from sim.defaults import (
    DEFAULT_PROFILE_JSON,
    MR_BASE,
    MR_LENGTH,
    NIC_A,
    NIC_B,
    default_profile_spec,
    ip_int,
    mac_int,
)
from sim.probing import ProbeBackoff
from sim.scenario import Scenario, nic_config_for
from sim.workload import fabric_config_for
from sim.workload import make_work as shared_make_work

from .nic import ModelNic
from .nscc import setting_for

__all__ = ["run_model", "make_work", "bring_up", "DelayNetwork", "SIDES", "SRC_BASE",
           "PSN_BASE", "PD", "default_network", "fabric_config"]

SIDES = ("a", "b")
ENDPOINTS = {"a": NIC_A, "b": NIC_B}
MR_SLOTS = {"a": 1, "b": 2}
SRC_BASE = 0x2000_0000          #: where each host keeps the bytes it sends
PSN_BASE = 0xFFFF80             #: first PSN of QP q is PSN_BASE + q: runs wrap the 24-bit PSN
PD = 1
PROFILE_JSON = DEFAULT_PROFILE_JSON
_PROGRESS_EVERY_NS = 50_000.0


def rkey_of(side):
    return 0xBEE0 | MR_SLOTS[side]


def peer_of(side):
    return "b" if side == "a" else "a"


# ---------------------------------------------------------------------------------------------
# A stand-in network
# ---------------------------------------------------------------------------------------------

class DelayNetwork:
    """Frames from one endpoint to the other after a fixed delay per plane.

    Parameters
    ----------
    planes : int
    delay_ns : float or list of float
        One delay for every plane, or one per plane.
    fail_plane : int or None
        A plane that drops every frame crossing it while it is down: from ``fail_at_ns`` to
        ``recover_ns`` (``None``: forever); with ``flap_period_ns`` it is down only the first
        half of each period in that interval. A frame is lost if the plane is down when it is
        sent or when it would arrive.
    trim_plane : int or None
        A plane whose switch trims every ``trim_every``-th data frame (``sim.packets.trim``).

    Members
    -------
    capture : list of ``(time_ns, src, plane, frame)``
        Every frame handed to the network, dropped or not.
    dropped, trimmed : int
    """

    def __init__(self, *, planes, delay_ns=1000.0, fail_plane=None, fail_at_ns=0.0,
                 recover_ns=None, flap_period_ns=None, trim_plane=None, trim_every=1):
        self.planes = planes
        self.delays = list(delay_ns) if isinstance(delay_ns, (list, tuple)) \
            else [float(delay_ns)] * planes
        if len(self.delays) != planes:
            raise ValueError(f"delay_ns must have {planes} entries, not {len(self.delays)}")
        self.fail_plane, self.fail_at_ns, self.recover_ns = fail_plane, fail_at_ns, recover_ns
        self.flap_period_ns = flap_period_ns
        self.trim_plane, self.trim_every = trim_plane, trim_every
        self.capture = []
        self.dropped = 0
        self.trimmed = 0
        self._data_on_trim_plane = 0
        self._queue = []
        self._serial = 0

    @classmethod
    def from_scenario(cls, scn):
        """The scenario's latency and plane failure (no loss, no queues, no trimming)."""
        failure = scn.failure
        kw = {}
        if failure is not None:
            kw = {"fail_plane": failure["plane"], "fail_at_ns": failure["at_us"] * 1e3,
                  "recover_ns": None if failure["recover_at_us"] is None
                  else failure["recover_at_us"] * 1e3,
                  "flap_period_ns": None if failure["flap_period_us"] is None
                  else failure["flap_period_us"] * 1e3}
        return cls(planes=scn.planes, delay_ns=scn.latency_us * 1e3, **kw)

    def _down(self, plane, t):
        if plane != self.fail_plane or t < self.fail_at_ns:
            return False
        if self.recover_ns is not None and t >= self.recover_ns:
            return False
        if self.flap_period_ns:
            return (t - self.fail_at_ns) % self.flap_period_ns < self.flap_period_ns / 2
        return True

    def plane_up(self, plane, start_ns, end_ns):
        return not (self._down(plane, start_ns) or self._down(plane, end_ns))

    def send(self, src, plane, frame, now):
        self.capture.append((now, src, plane, frame))
        arrival = now + self.delays[plane]
        if self._down(plane, now) or self._down(plane, arrival):
            self.dropped += 1
            return
        if plane == self.trim_plane:
            packet = pk.Ether(frame)
            if pk.METH in packet:
                self._data_on_trim_plane += 1
                if self._data_on_trim_plane % self.trim_every == 0:
                    frame = bytes(pk.trim(packet))
                    self.trimmed += 1
        self._serial += 1
        heapq.heappush(self._queue, (arrival, self._serial, peer_of(src), plane, frame))

    def deliver(self, now):
        out = []
        while self._queue and self._queue[0][0] <= now:
            _, _, dst, plane, frame = heapq.heappop(self._queue)
            out.append((dst, plane, frame))
        return out

    def next_arrival(self):
        return self._queue[0][0] if self._queue else None


def default_network(scn):
    """The network of a run when none is given: ``sim.fabric.fabric_for_scenario(scn)`` if
    the fabric package offers it, else a :class:`~sim.fabric.Fabric` configured here from the
    scenario (:func:`fabric_config`), else :meth:`DelayNetwork.from_scenario`."""
    try:
        import sim.fabric as fabric
    except ImportError:
        return DelayNetwork.from_scenario(scn)
    if hasattr(fabric, "fabric_for_scenario"):
        return fabric.fabric_for_scenario(scn)
    return fabric.Fabric(fabric_config(scn))


def fabric_config(scn):
    """The :class:`~sim.fabric.FabricConfig` of a scenario (:func:`sim.workload.fabric_config_for`,
    shared with the RTL bench)."""
    return fabric_config_for(scn, nic_config_for(scn))


# ---------------------------------------------------------------------------------------------
# Bring-up and traffic
# ---------------------------------------------------------------------------------------------

def make_work(scn):
    """The work requests of a scenario: ``{side: [wr dict with "data" bytes]}``, from
    :func:`sim.workload.make_work` (the RTL bench posts the same): ``scn.bytes`` from each side
    when ``both_ways``, else from ``a`` only."""
    return {side: shared_make_work(scn, side, rkey_of(peer_of(side)), SRC_BASE, MR_BASE)
            if side == "a" or scn.both_ways else [] for side in SIDES}


def configure_engines(nic, scn, config, spec):
    """Give ``nic`` the scenario's requester, port watch, acknowledgement and EV profile
    settings (every NIC of a run, pair or group, as the RTL benches configure theirs)."""
    extra = scn.extra
    nic.configure_requester(infer_k=scn.infer_k, cc=bool(scn.cc), reo_wnd=scn.reo_wnd,
                            cc_algorithm=scn.cc_algorithm, nscc=setting_for(scn, config))
    nic.set_port_watch(scn.port_wnd, scn.port_quiet)
    nic.configure_acks(ack_every=scn.ack_every, ack_delay=scn.ack_delay,
                       nak_interval=extra.get("nak_interval", 1024),
                       coalesce_gaps=bool(scn.coalesce_gaps), gap_depth=scn.gap_depth,
                       ack_new_holes=bool(scn.ack_new_holes))
    nic.ev_profile_online(0, spec.profile, num_evs=scn.evs,
                          min_active=extra.get("min_active", min(2, scn.evs)),
                          fate=bool(scn.fate),
                          mode=P.EvMode.AUTO if scn.baseline == "ecmp" else None)


def bring_up(scn, config, work):
    """Two :class:`ModelNic` configured for ``scn`` as the RTL bench configures its NICs."""
    spec = default_profile_spec()
    nics = {side: ModelNic(config, name=side) for side in SIDES}
    for side, nic in nics.items():
        peer = peer_of(side)
        received = sum(wr["length"] for wr in work[peer])
        sent = sum(wr["length"] for wr in work[side])
        nic.set_local(mac=mac_int(ENDPOINTS[side].mac),
                      ip=ip_int(ENDPOINTS[side], config.ip_version))
        nic.register_mr(slot=MR_SLOTS[side], rkey=rkey_of(side), pd=PD, base=MR_BASE,
                        length=max(MR_LENGTH, received))
        nic.memory.add(SRC_BASE, max(1, sent))
        for wr in work[side]:
            nic.memory.write(wr["local_addr"], wr["data"])
        configure_engines(nic, scn, config, spec)
        for qpn in range(scn.qps):
            nic.connect_qp(qpn, ev_profile=0, ev_offset=qpn, remote_qpn=qpn,
                           remote_mac=mac_int(ENDPOINTS[peer].mac),
                           remote_ip=ip_int(ENDPOINTS[peer], config.ip_version),
                           psn=PSN_BASE + qpn,
                           remote_psn=PSN_BASE + qpn, mpr=config.mpr_units,
                           max_wimm=min(4, config.max_wimm), pd=PD, timeout=scn.timeout,
                           retry_linear=scn.retry_linear,
                           retry_exponential=scn.retry_exponential)
    return nics


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def _expected(work):
    """Completions each side must see: its own WRs plus the peer's WRITE_IMMs."""
    return {side: len(work[side]) + sum(
        wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM for wr in work[peer_of(side)])
        for side in SIDES}


def _mismatches(nics, work):
    out = []
    for side in SIDES:
        memory = nics[peer_of(side)].memory
        for wr in work[side]:
            got = memory.read(wr["remote_addr"], wr["length"])
            if got == wr["data"]:
                continue
            bad = 0 if got is None else next(
                i for i, (x, y) in enumerate(zip(got, wr["data"], strict=True)) if x != y)
            out.append({"side": side, "wr_id": wr["wr_id"], "first_bad_offset": bad})
    return out


def run_model(scenario, *, network=None, progress=None):
    """Run ``scenario`` on two model NICs; return the raw result dict.

    Parameters
    ----------
    scenario : Scenario
    network : object with the fabric's API, optional
        Every frame either NIC transmits goes through ``network.send`` (so its capture holds
        the traffic). Default: :func:`default_network`.
    progress : callable, optional
        Called about every 50 us of simulated time with ``{"sim_us", "completions",
        "expected"}`` (per-side counts).

    Returns
    -------
    dict
        ``backend`` ("model"), ``sim_us``, ``cycles``, ``wall_s``, ``finished``,
        ``completions`` ``{side: [completion dicts in arrival order]}``, ``work`` ``{side:
        [wr dicts without data]}``, ``memory_mismatches`` ``[{side, wr_id,
        first_bad_offset}]``, ``counters`` ``{side: {block: {name: value}}}``, ``ev_events``
        ``[{time_us, nic, profile, index, port, state}]``, ``first_send_us``, ``done_us``.
    """
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be a Scenario, not {scenario!r}")
    started = time.monotonic()
    config = nic_config_for(scenario)
    work = make_work(scenario)
    nics = bring_up(scenario, config, work)
    network = default_network(scenario) if network is None else network
    expected = _expected(work)
    max_ns = scenario.max_us * 1e3
    now = 0.0
    first_send = None
    next_progress = _PROGRESS_EVERY_NS

    for side in SIDES:
        for wr in work[side]:
            nics[side].post(wr, now)

    def finished():
        return all(len(nics[s].completions) >= expected[s] for s in SIDES)

    # The control plane stand-in: each side probes its ASSUMED_BAD EVs on a per-EV backoff
    # (sim.probing, as the RTL bench); a probe is answered one base round trip later if its
    # plane stayed up meanwhile (the RTL bench sends real probe frames; the model has none).
    probe_rtt = 2 * scenario.latency_us * 1e3 + 2000.0
    probing = {side: ProbeBackoff() for side in SIDES}
    answers = []                        # (time, side, ev)

    def next_probe():
        due = [t for t in (p.next_due_us() for p in probing.values()) if t is not None]
        return min(due) * 1e3 if due else None

    def control_plane(now):
        for item in [a for a in answers if a[0] <= now]:
            answers.remove(item)
            nics[item[1]].probe_answered(0, item[2], item[0])
        for side in SIDES:
            ports = dict(nics[side].assumed_bad())
            probing[side].track(ports, now / 1e3)
            for index in probing[side].due(now / 1e3):
                if network.plane_up(ports[index] - 1, now, now + probe_rtt):
                    answers.append((now + probe_rtt, side, index))

    while not finished():
        times = [t for t in (nics["a"].next_event_ns(), nics["b"].next_event_ns(),
                             network.next_arrival(), next_probe(),
                             *(a[0] for a in answers)) if t is not None]
        if not times:
            break
        now = max(now, min(times))
        if now > max_ns:
            now = max_ns
            break
        control_plane(now)
        for dst, plane, frame in network.deliver(now):
            nics[dst].receive(plane, frame, now)
        for side in SIDES:
            for plane, frame in nics[side].transmit(now):
                if first_send is None:
                    first_send = now
                network.send(side, plane, frame, now)
        if progress is not None and now >= next_progress:
            next_progress = now + _PROGRESS_EVERY_NS
            progress({"sim_us": now / 1e3, "expected": dict(expected),
                      "completions": {s: len(nics[s].completions) for s in SIDES}})

    done = finished()
    times = [t for s in SIDES for t in nics[s].completion_times]
    done_ns = max(times) if done and times else now
    sim_ns = done_ns if done else now
    events = sorted(({"time_us": e["time_ns"] / 1e3, "nic": side, "profile": e["profile"],
                      "index": e["index"], "port": e["port"], "state": e["state"]}
                     for side in SIDES for e in nics[side].ev_events),
                    key=lambda e: (e["time_us"], e["nic"]))
    return {
        "backend": "model",
        "sim_us": sim_ns / 1e3,
        "probes_sent": {side: probing[side].sent for side in SIDES},
        "cycles": int(sim_ns * config.clock_hz / 1e9),
        "wall_s": time.monotonic() - started,
        "finished": done,
        "completions": {s: list(nics[s].completions) for s in SIDES},
        "completion_times_us": {s: [t / 1e3 for t in nics[s].completion_times] for s in SIDES},
        "work": {s: [{k: v for k, v in wr.items() if k != "data"} for wr in work[s]]
                 for s in SIDES},
        "memory_mismatches": _mismatches(nics, work),
        "counters": {s: nics[s].counters_snapshot() for s in SIDES},
        "ev_events": events,
        "first_send_us": (first_send if first_send is not None else 0.0) / 1e3,
        "done_us": done_ns / 1e3,
    }
