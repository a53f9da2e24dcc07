"""Reference model of path selection (:class:`hdl.path.select.PathSelect`), decision by decision.

The model holds the same state as the hardware (profiles, EV entries, QP bindings, rotation
pointers, the event queue, counters) and applies the same rules in the same order, so an RTL
test can compare every decision, response and event with it, and network simulations can run
model NICs. It has no notion of cycles: each call is one request, one feedback, one command
or one penalty-decay or SKIP-recovery tick, applied completely before the next. (The hardware's
sweeps walk the table over many cycles, so tests align them only where nothing else happens
during a sweep.)

EV expansion and generation are delegated to an *expander*, an object with
``expand(profile, value) -> (errno, fields)`` and ``generate(profile, index) -> (errno,
value)``, as the hardware's ``exp_*``/``gen_*`` ports are; :class:`ReferenceExpander` serves
them from :mod:`hdl.path.ev` definitions, and the RTL tests answer the hardware ports with it.
"""

from collections import deque
from dataclasses import dataclass, field

from hdl.config import NicConfig
from hdl.path import ev as evlib
from hdl.path.select import (
    COUNTERS,
    PENALTY_ACKED,
    PENALTY_ECN,
    PENALTY_HIGH,
    PENALTY_LOST,
    PENALTY_MAX,
    PENALTY_TRIMMED,
    PathCommand,
    ProbeRecovery,
    auto_index,
    entry_read_data,
    profile_read_data,
)
from hdl.protocol import Errno, EvFormatMode, EvMode, EvState, FeedbackKind, ProfileState

__all__ = [
    "PathModel", "ReferenceExpander", "Decision", "Event", "command", "ev_value",
    "fields_of_image", "udp_profile", "udp_ev", "bring_up_commands", "ZERO_FIELDS",
]

ZERO_FIELDS = {"flow_label": 0, "udp_sport": 0, "srv6_valid": 0, "srv6_dst": 0,
               "srh_valid": 0, "srh_segment": 0}


def ev_value(ev_bytes):
    """An EV (1 to 32 bytes) as the 256-bit command/expander value: byte 0 in the top bits."""
    return int.from_bytes(bytes(ev_bytes).ljust(evlib.EXPANDED_EV_BYTES, b"\0"), "big")


def fields_of_image(fmt, image):
    """``ev_fields_layout`` values of an expanded image (bytes), per :func:`ev.header_fields`."""
    placed = evlib.header_fields(fmt, image)
    fields = dict(ZERO_FIELDS)
    if fmt.mode == EvFormatMode.SRV6:
        fields["srv6_valid"] = 1
        fields["srv6_dst"] = int.from_bytes(placed["srv6_dst"], "big")
        if placed["srv6_segment"] is not None:
            fields["srh_valid"] = 1
            fields["srh_segment"] = int.from_bytes(placed["srv6_segment"], "big")
    else:
        fields.update(placed)
    return fields


class ReferenceExpander:
    """Expansion and generation from :mod:`hdl.path.ev` profiles, keyed by profile id.

    ``profiles[p]`` is an :class:`~hdl.path.ev.EvProfile`; a missing profile answers EINVAL
    (not defined), as the hardware expander does for an uncommitted profile.
    """

    def __init__(self, profiles=None):
        self.profiles = dict(profiles or {})
        self.expansions = 0
        self.generations = 0

    def expand(self, profile, value):
        self.expansions += 1
        definition = self.profiles.get(profile)
        if definition is None:
            return Errno.EINVAL, dict(ZERO_FIELDS)
        raw = value.to_bytes(evlib.EXPANDED_EV_BYTES, "big")
        try:
            image = evlib.expand(definition, raw)
        except evlib.EvProfileError:
            return Errno.EINVAL, dict(ZERO_FIELDS)
        return Errno.OK, fields_of_image(definition.format, image)

    def generate(self, profile, index):
        self.generations += 1
        definition = self.profiles.get(profile)
        if definition is None or definition.mode != EvMode.GENERATED:
            return Errno.EINVAL, 0
        if index >= definition.distinct_evs:
            return Errno.E2BIG, 0
        return Errno.OK, ev_value(evlib.generate(definition, index + 1)[index])


@dataclass
class _Entry:
    written: bool = False
    state: EvState = EvState.GOOD
    port: int = 1
    penalty: int = 0
    skip: bool = False          #: MRC 1.0's SKIP: a GOOD EV passed over until recovery
    skip_epoch: int = 0
    fields: dict = field(default_factory=lambda: dict(ZERO_FIELDS))

    @property
    def good(self):
        return self.written and self.state == EvState.GOOD

    @property
    def high(self):
        return self.penalty >= PENALTY_HIGH


class _Profile:
    def __init__(self, evs):
        self.state = ProfileState.INIT
        self.mode = EvMode.EXPLICIT
        self.num_evs = 0
        self.min_active = 0
        self.adaptive = False
        self.recovery = ProbeRecovery.AUTO
        self.fate = False
        self.entries = [_Entry() for _ in range(evs)]

    def clear(self):
        # Penalties survive in the hardware's RAM, but only "high" matters and is cleared.
        for entry in self.entries:
            entry.written = False
            entry.penalty = 0
            entry.skip = False

    @property
    def usable(self):
        return sum(entry.good for entry in self.entries)

    @property
    def low(self):
        return sum(entry.good and not entry.high and not entry.skip for entry in self.entries)

    @property
    def populated(self):
        return all(entry.written for entry in self.entries[:self.num_evs])


@dataclass
class Decision:
    qpn: int
    no_path: int
    ev: int
    port: int                   # 0-based
    fields: dict
    context: object = None

    def as_dict(self):
        out = {"qpn": self.qpn, "no_path": self.no_path, "ev": self.ev, "port": self.port,
               "fields": dict(self.fields)}
        if self.context is not None:
            out["context"] = self.context
        return out


@dataclass
class Event:
    profile: int
    index: int
    port: int                   # 1-based, as stored
    state: EvState
    probe_ok: int = 0

    def as_dict(self):
        return {"profile": self.profile, "index": self.index, "port": self.port,
                "state": int(self.state), "probe_ok": self.probe_ok}


COMMAND_FIELDS = ("cmd", "profile", "index", "mode", "num_evs", "min_active", "adaptive",
                  "recovery", "fate", "state", "port", "qpn", "offset", "value")


def command(cmd, **fields):
    """A command as a dict of every ``path_command_layout`` field (unnamed fields 0)."""
    unknown = set(fields) - set(COMMAND_FIELDS)
    if unknown:
        raise ValueError(f"Unknown command field(s): {', '.join(sorted(unknown))}")
    out = dict.fromkeys(COMMAND_FIELDS, 0)
    out.update(fields, cmd=int(cmd))
    return {key: int(value) for key, value in out.items()}


class PathModel:
    """Decision-level model of :class:`~hdl.path.select.PathSelect` with the same parameters.

    Parameters
    ----------
    config : NicConfig
    expander : object with ``expand`` and ``generate`` (see the module docstring)
    event_depth, modify_online, hash_seed, skip_shift
        As :class:`~hdl.path.select.PathSelect`; ``skip_shift`` is used only by
        :meth:`advance_to` (callers without a clock call :meth:`skip_tick` themselves).
    """

    def __init__(self, *, config, expander, event_depth=16, modify_online=False, hash_seed=0,
                 skip_shift=10):
        if not isinstance(config, NicConfig):
            raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self.config = config
        self.expander = expander
        self.event_depth = event_depth
        self.modify_online = modify_online
        self.hash_seed = hash_seed
        self.profiles = [_Profile(config.evs_per_profile) for _ in range(config.ev_profiles)]
        self.bindings = {}                      # qpn -> [profile, pointer]
        self.events = deque()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.strikes = set()        #: ports with one fate-sharing loss standing
        self.skip_epoch = 0         #: advanced (modulo 4) by each SKIP recovery sweep
        self.skip_shift = skip_shift
        self._skip_sweeps = 0       #: recovery sweeps applied by advance_to

    # -- events ------------------------------------------------------------------------------

    def _event(self, profile, index, state, probe_ok=0):
        entry = self.profiles[profile].entries[index]
        if len(self.events) >= self.event_depth:
            self.counters["events_dropped"] += 1
        else:
            self.events.append(Event(profile, index, entry.port, EvState(state), probe_ok))

    def pop_events(self, count=None):
        """Take ``count`` (default: all) events from the head of the queue."""
        count = len(self.events) if count is None else count
        return [self.events.popleft() for _ in range(count)]

    def _set_state(self, profile, index, state):
        entry = self.profiles[profile].entries[index]
        old = entry.state
        if {old, state} == {EvState.GOOD, EvState.ASSUMED_BAD}:
            self._event(profile, index, state)
        if old != state:
            self.counters["state_changes"] += 1
        entry.state = state
        entry.skip = False

    # -- selection ---------------------------------------------------------------------------

    def _candidates(self, profile):
        entries = profile.entries
        good = [i for i, entry in enumerate(entries) if entry.good]
        if profile.adaptive:
            low = [i for i in good if not entries[i].high and not entries[i].skip]
            if low and len(low) >= profile.min_active and len(low) >= (len(good) + 1) // 2:
                return low
        if profile.mode != EvMode.AUTO:
            fresh = [i for i in good if not entries[i].skip]
            if fresh and len(fresh) >= profile.min_active and len(fresh) >= (len(good) + 1) // 2:
                return fresh
        return good

    def select(self, qpn, *, avoid_ev=None, probe=False, ev=0, context=None):
        """The decision for one send request; advances the QP's rotation pointer."""
        self.counters["decisions"] += 1
        binding = self.bindings.get(qpn)
        no_path = Decision(qpn, 1, ev if probe else 0, 0, dict(ZERO_FIELDS), context)
        if binding is None:
            self.counters["no_path"] += 1
            return no_path
        number, pointer = binding
        profile = self.profiles[number]
        if profile.state != ProfileState.ONLINE:
            self.counters["no_path"] += 1
            return no_path
        if probe:
            entry = profile.entries[ev] if ev < len(profile.entries) else None
            if entry is None or not entry.written or entry.state == EvState.DENIED:
                self.counters["no_path"] += 1
                return no_path
            return Decision(qpn, 0, ev, entry.port - 1, dict(entry.fields), context)
        candidates = self._candidates(profile)
        if avoid_ev is not None and any(i != avoid_ev for i in candidates):
            candidates = [i for i in candidates if i != avoid_ev]
        if not candidates:
            self.counters["no_path"] += 1
            return no_path
        after = [i for i in candidates if i >= pointer]
        pick = after[0] if after else candidates[0]
        if profile.mode != EvMode.AUTO:
            binding[1] = (pick + 1) % (1 << self.config.ev_index_bits)
        entry = profile.entries[pick]
        return Decision(qpn, 0, pick, entry.port - 1, dict(entry.fields), context)

    # -- feedback ----------------------------------------------------------------------------

    def feedback(self, qpn, ev, kind):
        """Apply one feedback (qpn, EV index, :class:`~hdl.protocol.FeedbackKind`)."""
        try:
            kind = FeedbackKind(kind)
        except ValueError:
            self.counters["feedback_ignored"] += 1
            return
        self.counters[f"feedback_{kind.name.lower()}"] += 1
        binding = self.bindings.get(qpn)
        if binding is None:
            self.counters["feedback_ignored"] += 1
            return
        number = binding[0]
        profile = self.profiles[number]
        if (profile.state != ProfileState.ONLINE or ev >= profile.num_evs
                or not profile.entries[ev].written):
            self.counters["feedback_ignored"] += 1
            return
        entry = profile.entries[ev]
        if kind in (FeedbackKind.ECN, FeedbackKind.TRIMMED) and entry.good:
            if not entry.skip:
                self.counters["skips"] += 1
            entry.skip = True
            entry.skip_epoch = (self.skip_epoch + 2) % 4      # the sweep it ends in
        if kind == FeedbackKind.ACKED:
            entry.penalty = max(0, entry.penalty - PENALTY_ACKED)
        elif kind == FeedbackKind.ECN:
            entry.penalty = min(PENALTY_MAX, entry.penalty + PENALTY_ECN)
        elif kind == FeedbackKind.TRIMMED:
            entry.penalty = min(PENALTY_MAX, entry.penalty + PENALTY_TRIMMED)
        elif kind == FeedbackKind.LOST:
            if entry.state == EvState.GOOD:
                if profile.usable > profile.min_active:
                    self._set_state(number, ev, EvState.ASSUMED_BAD)
                    if profile.fate:
                        if entry.port in self.strikes:      # the second strike: sweep
                            self.strikes.discard(entry.port)
                            self.fate_sweep(entry.port)
                        else:
                            self.strikes.add(entry.port)
                else:
                    entry.penalty = min(PENALTY_MAX, entry.penalty + PENALTY_LOST)
        elif kind == FeedbackKind.PROBE_OK:
            if entry.state == EvState.ASSUMED_BAD:
                if profile.recovery == ProbeRecovery.AUTO:
                    self._set_state(number, ev, EvState.GOOD)
                    self.strikes.discard(entry.port)
                else:
                    self._event(number, ev, EvState.ASSUMED_BAD, probe_ok=1)

    def fate_sweep(self, port):
        """Port fate sharing (on the second LOST of a port while its first stands, see
        :meth:`feedback`): every GOOD EV on ``port`` in every ONLINE profile that shares
        fate goes ASSUMED_BAD, floor permitting, in (profile, index) order, as the hardware's
        sweep visits them."""
        self.counters["fate_sweeps"] += 1
        for number, profile in enumerate(self.profiles):
            if not profile.fate or profile.state != ProfileState.ONLINE:
                continue
            for index, entry in enumerate(profile.entries[:profile.num_evs]):
                if (entry.written and entry.state == EvState.GOOD and entry.port == port
                        and profile.usable > profile.min_active):
                    self._set_state(number, index, EvState.ASSUMED_BAD)
                    self.counters["fate_marked"] += 1

    def port_down(self, port):
        """The port watch found ``port`` (1..P) down: sweep it as a second fate-sharing strike
        does (the strike, if any, stands)."""
        if 1 <= port <= self.config.ports:
            self.fate_sweep(port)

    def advance_to(self, cycle):
        """Apply the SKIP recovery sweeps the hardware starts up to clock ``cycle`` (one every
        ``2**skip_shift`` cycles; each takes effect at once here)."""
        if self.skip_shift is None:
            return
        due = int(cycle) >> self.skip_shift
        pending, self._skip_sweeps = due - self._skip_sweeps, max(due, self._skip_sweeps)
        for _ in range(min(pending, 2)):
            self.skip_tick()
        if pending > 2:                 # no mark is left: only the epoch moves on
            self.skip_epoch = (self.skip_epoch + pending - 2) % 4

    def skip_tick(self):
        """One SKIP recovery sweep: the next epoch, then every SKIP mark that ends in it is
        cleared (a mark set in epoch e ends in e + 2: it lasts from one sweep period to two)."""
        self.skip_epoch = (self.skip_epoch + 1) % 4
        for profile in self.profiles:
            for entry in profile.entries:
                if entry.skip and entry.skip_epoch == self.skip_epoch:
                    entry.skip = False
                    self.counters["skip_recoveries"] += 1

    def decay_tick(self):
        """One decay sweep: every penalty halves."""
        for profile in self.profiles:
            for entry in profile.entries:
                entry.penalty >>= 1

    # -- control -----------------------------------------------------------------------------

    def command(self, cmd):
        """Execute one command (a dict as :func:`command` makes); return ``(errno, data)``."""
        cmd = {key: int(cmd.get(key, 0)) for key in COMMAND_FIELDS}
        handler = {
            PathCommand.PROFILE_SET: self._profile_set,
            PathCommand.PROFILE_STATE: self._profile_state,
            PathCommand.ENTRY_WRITE: self._entry_write,
            PathCommand.ENTRY_STATE: self._entry_state,
            PathCommand.ENTRY_READ: self._entry_read,
            PathCommand.QP_PROFILE: self._qp_profile,
            PathCommand.PROFILE_READ: self._profile_read,
        }.get(cmd["cmd"])
        if handler is None:
            return Errno.EINVAL, 0
        if cmd["profile"] >= self.config.ev_profiles:
            return Errno.ENOENT, 0
        result = handler(cmd, self.profiles[cmd["profile"]])
        return (result, 0) if isinstance(result, Errno) else result

    def _profile_set(self, cmd, profile):
        if profile.state == ProfileState.ONLINE:
            return Errno.EBUSY
        if cmd["mode"] > EvMode.AUTO or cmd["num_evs"] == 0:
            return Errno.EINVAL
        if cmd["num_evs"] > self.config.evs_per_profile:
            return Errno.E2BIG
        if cmd["min_active"] > cmd["num_evs"]:
            return Errno.EINVAL
        profile.mode = EvMode(cmd["mode"])
        profile.num_evs = cmd["num_evs"]
        profile.min_active = cmd["min_active"]
        profile.adaptive = bool(cmd["adaptive"])
        profile.recovery = ProbeRecovery(cmd["recovery"])
        profile.fate = bool(cmd["fate"])
        profile.clear()
        return Errno.OK

    def _profile_state(self, cmd, profile):
        current, target = profile.state, cmd["state"]
        simple = {(ProfileState.INIT, ProfileState.OFFLINE),
                  (ProfileState.OFFLINE, ProfileState.INIT),
                  (ProfileState.ONLINE, ProfileState.OFFLINE)}
        if (current, target) in simple:
            profile.state = ProfileState(target)
            return Errno.OK
        if (current, target) != (ProfileState.OFFLINE, ProfileState.ONLINE):
            return Errno.EINVAL
        if profile.num_evs == 0:
            return Errno.EINVAL
        if profile.mode == EvMode.GENERATED and not profile.populated:
            return self._generate(cmd["profile"], profile)
        if not profile.populated or profile.usable < profile.min_active:
            return Errno.EINVAL
        profile.state = ProfileState.ONLINE
        return Errno.OK

    def _generate(self, number, profile):
        profile.clear()
        port = 1
        for index in range(profile.num_evs):
            errno, value = self.expander.generate(number, index)
            if errno != Errno.OK:
                profile.clear()
                return Errno(errno)
            errno, fields = self.expander.expand(number, value)
            if errno != Errno.OK:
                profile.clear()
                return Errno(errno)
            self._store(profile, index, fields, port, EvState.GOOD)
            port = 1 if port == self.config.ports else port + 1
        profile.state = ProfileState.ONLINE
        return Errno.OK

    @staticmethod
    def _store(profile, index, fields, port, state):
        entry = profile.entries[index]
        entry.written = True
        entry.state = EvState(state)
        entry.port = port
        entry.penalty = 0
        entry.skip = False
        entry.fields = dict(fields)

    def _index_ok(self, cmd, profile):
        return cmd["index"] < profile.num_evs and cmd["index"] < self.config.evs_per_profile

    @staticmethod
    def _floor_blocks(profile, entry):
        return entry.good and profile.usable <= profile.min_active

    def _entry_write(self, cmd, profile):
        online = profile.state == ProfileState.ONLINE
        if online and not self.modify_online:
            return Errno.EBUSY
        if profile.mode == EvMode.GENERATED:
            return Errno.EINVAL
        if not self._index_ok(cmd, profile):
            return Errno.E2BIG
        if (not 1 <= cmd["port"] <= self.config.ports
                or cmd["state"] not in (EvState.GOOD, EvState.DENIED)):
            return Errno.EINVAL
        entry = profile.entries[cmd["index"]]
        if online and self._floor_blocks(profile, entry) and cmd["state"] != EvState.GOOD:
            return Errno.EBUSY
        errno, fields = self.expander.expand(cmd["profile"], cmd["value"])
        if errno != Errno.OK:
            return Errno.EINVAL
        self._store(profile, cmd["index"], fields, cmd["port"], cmd["state"])
        return Errno.OK

    def _entry_state(self, cmd, profile):
        if not self._index_ok(cmd, profile):
            return Errno.E2BIG
        if cmd["state"] not in (EvState.GOOD, EvState.ASSUMED_BAD, EvState.DENIED):
            return Errno.EINVAL
        entry = profile.entries[cmd["index"]]
        if not entry.written:
            return Errno.ENOENT
        if self._floor_blocks(profile, entry) and cmd["state"] != EvState.GOOD:
            return Errno.EBUSY
        self._set_state(cmd["profile"], cmd["index"], EvState(cmd["state"]))
        return Errno.OK

    def _entry_read(self, cmd, profile):
        if not self._index_ok(cmd, profile):
            return Errno.E2BIG
        entry = profile.entries[cmd["index"]]
        if not entry.written:
            return Errno.ENOENT
        return Errno.OK, entry_read_data(state=entry.state, port=entry.port,
                                         penalty=entry.penalty, skip=entry.skip)

    def _qp_profile(self, cmd, profile):
        if profile.state == ProfileState.INIT:
            return Errno.ENOENT
        if cmd["offset"] >= self.config.evs_per_profile:
            return Errno.EINVAL
        if profile.mode == EvMode.AUTO:
            pointer = auto_index(cmd["qpn"], profile.num_evs, self.hash_seed)
        else:
            pointer = cmd["offset"]
        self.bindings[cmd["qpn"]] = [cmd["profile"], pointer]
        return Errno.OK

    def _profile_read(self, cmd, profile):
        return Errno.OK, profile_read_data(
            state=profile.state, mode=profile.mode, adaptive=int(profile.adaptive),
            recovery=profile.recovery, populated=int(profile.populated),
            num_evs=profile.num_evs, min_active=profile.min_active, usable=profile.usable,
            fate=int(profile.fate))

    # -- conveniences ------------------------------------------------------------------------

    def usable(self, profile):
        """EVs of ``profile`` usable for data (written and GOOD)."""
        return self.profiles[profile].usable

    def entry(self, profile, index):
        return self.profiles[profile].entries[index]


def udp_profile(mode=EvMode.EXPLICIT, *, ev_bits=8, max_val=None):
    """A small UDP-format EV profile for tests and benches: the EV supplies the low
    ``ev_bits`` bits of the UDP source port (0xC000 | ev); ``max_val`` limits generation."""
    fmt = evlib.EvFormat(mode=EvFormatMode.UDP, widths=[16])
    mask = (1 << ev_bits) - 1
    ev_field = evlib.EvField(width=16, init_val=0xC000, mask=mask,
                             max_val=mask if max_val is None else max_val)
    return evlib.EvProfile(format=fmt, mode=mode, fields=[ev_field])


def udp_ev(number, ev_bits=8):
    """The command value of EV ``number`` of :func:`udp_profile` (left-aligned bits)."""
    length = max(1, -(-ev_bits // 8))
    return ev_value((number << (8 * length - ev_bits)).to_bytes(length, "big"))


def bring_up_commands(profile, num_evs, *, ports, mode=EvMode.EXPLICIT, min_active=0,
                      adaptive=0, recovery=ProbeRecovery.AUTO, fate=0, states=None, qpns=(),
                      offsets=None, ev_bits=8):
    """The commands that set up ``profile`` with ``num_evs`` EVs of :func:`udp_profile`
    (EXPLICIT/AUTO: EV k is ``udp_ev(k)`` on port ``k % ports + 1``, state ``states[k]``,
    default GOOD), take it ONLINE and bind ``qpns`` (rotation offsets ``offsets``)."""
    cmds = [command(PathCommand.PROFILE_SET, profile=profile, mode=mode, num_evs=num_evs,
                    min_active=min_active, adaptive=adaptive, recovery=recovery, fate=fate),
            command(PathCommand.PROFILE_STATE, profile=profile, state=ProfileState.OFFLINE)]
    if mode != EvMode.GENERATED:
        for index in range(num_evs):
            state = EvState.GOOD if states is None else states[index]
            cmds.append(command(PathCommand.ENTRY_WRITE, profile=profile, index=index,
                                value=udp_ev(index, ev_bits), port=index % ports + 1,
                                state=state))
    cmds.append(command(PathCommand.PROFILE_STATE, profile=profile, state=ProfileState.ONLINE))
    for n, qpn in enumerate(qpns):
        offset = 0 if offsets is None else offsets[n]
        cmds.append(command(PathCommand.QP_PROFILE, profile=profile, qpn=qpn, offset=offset))
    return cmds
