"""Path select: the EV table and the per-packet choice of an Entropy Value (EV).

:class:`PathSelect` holds every EV profile's array (expanded header fields, egress port, state,
penalty), binds each QP to a profile, and answers one send request per cycle with an EV, its
0-based egress port and its stored header fields. It applies path feedback (ACK, ECN, trim,
loss, probe answers) to the EV states and penalties, keeps the ``ev_min_active`` floor, raises
EV events, and is configured through a small command stream that mirrors ``mrc_ctl.h``.

It is built from five components around three block RAMs::

    i ─► Selector ─► o                      (binding RAM: read S0, pointer write-back S5;
           ▲  reads candidates                fields RAM: read S5)
    ProfileTable (per-profile registers, bitmaps, counts, candidate sets)
           ▲  commit                 ▲ set / state / clear
    feedback ─► EntrySources ─► EntryUpdate ─► events      (entry RAM: read e1, write e3)
                 ▲ ctl_op                 │ result
    ctl ─► PathControl ─► ctl_resp ◄──────┘   (fields RAM write, binding write, exp/gen)

The Python reference of the same rules is :class:`sim.model.path.PathModel`; the numbers,
choices and the pipelines are explained in ``docs/path-select.md``.
"""

from amaranth import *
from amaranth.hdl import Shape
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..interfaces import (
    ev_fields_layout,
    expand_request_layout,
    expand_response_layout,
    feedback_layout,
    generate_request_layout,
    generate_response_layout,
    path_decision_layout,
    path_request_layout,
)
from ..protocol import ProfileState
from ..util import validating
from .control import PathControl
from .entry import ENTRY_COUNTERS, EntrySources, EntryUpdate
from .pathdefs import (
    COUNT_BITS,
    COUNTERS,
    EV_PORT_BITS,
    HASH_MULTIPLIER,
    PENALTY_ACKED,
    PENALTY_BITS,
    PENALTY_ECN,
    PENALTY_HIGH,
    PENALTY_LOST,
    PENALTY_MAX,
    PENALTY_TRIMMED,
    PROFILE_ID_BITS,
    PathCommand,
    ProbeRecovery,
    auto_index,
    binding_layout,
    entry_read_data,
    entry_word_layout,
    entry_words,
    fields_word_layout,
    path_command_layout,
    path_event_layout,
    path_response_layout,
    profile_read_data,
)
from .profiles import ProfileTable
from .selector import SELECT_LATENCY, Selector

__all__ = [
    "PathSelect", "PathCommand", "ProbeRecovery", "path_command_layout",
    "path_response_layout", "path_event_layout", "auto_index", "entry_read_data",
    "profile_read_data", "SELECT_LATENCY",
    "PENALTY_BITS", "PENALTY_MAX", "PENALTY_ACKED", "PENALTY_ECN", "PENALTY_TRIMMED",
    "PENALTY_LOST", "PENALTY_HIGH", "HASH_MULTIPLIER",
    "COUNT_BITS", "COUNTERS", "EV_PORT_BITS", "PROFILE_ID_BITS",
]


class PathSelect(wiring.Component):
    """EV table and per-packet path selection.

    Selection (:class:`~hdl.path.selector.Selector`): one request accepted per cycle,
    sustained, decisions in request order, ``SELECT_LATENCY`` (seven) cycles from accepting
    a request to its decision on ``o`` when ``o`` is ready. Back-to-back requests of one QP get
    successive rotation positions (the pointer write-backs in flight are forwarded). ``i`` is
    not ready while the output queue has no room (``o`` stalled), while a QP_PROFILE command
    writes the binding table, and while a LOST or the fate sweep it starts is being applied.

    Storage: the expanded fields and port of each EV in one block RAM
    (``ev_profiles * 2**ev_index_bits`` words), port and penalty in a second, per-QP binding
    (bound, profile, rotation pointer) in a third with two read ports; per-profile
    registers and four bitmaps of ``evs_per_profile`` bits (good, written, denied,
    high-penalty) in flip-flops (:class:`~hdl.path.profiles.ProfileTable`).

    Hazards: every table is read, decided on and written back in separate pipeline stages;
    each pipeline forwards its own in-flight write-backs, and the control changes a table only
    while the pipelines that read it are drained or held (``docs/path-select.md``).

    Feedback (:class:`~hdl.path.entry.EntrySources`, :class:`~hdl.path.entry.EntryUpdate`):
    one per cycle while no command runs, decided and written back five cycles after it is
    accepted, in the profile table's bitmaps a cycle later. It is
    applied only to an ONLINE profile's written EV with index below ``num_evs`` of a bound QP,
    otherwise it is accepted and counted in ``feedback_ignored``. Kinds outside
    :class:`~hdl.protocol.FeedbackKind` are ignored the same way.

    Parameters
    ----------
    config : NicConfig
    context : shape-castable or None
        Carried from a request to its decision unchanged.
    event_depth : int
        Entries of the EV event queue, 1 to 1024. A full queue drops the event and counts it.
    modify_online : bool
        Allow ENTRY_WRITE on an ONLINE profile (the floor still holds: EBUSY).
    hash_seed : int
        16-bit seed of the AUTO mode's per-QP hash.
    decay_shift : int or None
        Penalties halve every ``2**decay_shift`` cycles (8 to 30); ``None``: no decay.
    skip_shift : int or None
        SKIP recovery: a SKIP mark (set by ECN or a trim on a GOOD EV) is cleared by the
        recovery sweep that starts every ``2**skip_shift`` cycles, one to two periods after it
        was set (6 to 30); ``None``: marks are never cleared by time (only by a state change).

    Members
    -------
    i : ``In(stream.Signature(path_request_layout(config, context)))``
    o : ``Out(stream.Signature(path_decision_layout(config, context)))``
    feedback : ``In(stream.Signature(feedback_layout(config)))``
    events : ``Out(stream.Signature(path_event_layout(config)))``
    ctl : ``In(stream.Signature(path_command_layout(config)))``
    ctl_resp : ``Out(stream.Signature(path_response_layout(config)))``
    exp_req, exp_resp, gen_req, gen_resp : master ports to the EV expander
    profile_online : ``Out(config.ev_profiles)``, bit p set while profile p is ONLINE
    port_down_valid, port_down_port : ``In``
        Port ``port_down_port`` (1..P) is down (:class:`~hdl.path.watch.PortWatch`): sweep it
        as a second fate-sharing strike does. Port 0 and ports above P are ignored.
    decisions, no_path, feedback_acked, feedback_ecn, feedback_trimmed, feedback_lost,
    feedback_probe_ok, feedback_ignored, state_changes, events_dropped, fate_sweeps,
    fate_marked, skips, skip_recoveries : ``Out(32)`` counters
    """

    def __init__(self, *, config, context=None, event_depth=16, modify_online=False,
                 hash_seed=0, decay_shift=16, skip_shift=10):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
            if context is not None:
                Shape.cast(context)
            if (not isinstance(event_depth, int) or isinstance(event_depth, bool)
                    or not 1 <= event_depth <= 1024):
                raise ValueError(f"Event depth must be an integer from 1 to 1024, "
                                 f"not {event_depth!r}")
            if not isinstance(modify_online, bool):
                raise TypeError(f"modify_online must be a bool, not {modify_online!r}")
            if (not isinstance(hash_seed, int) or isinstance(hash_seed, bool)
                    or not 0 <= hash_seed <= 0xFFFF):
                raise ValueError(f"Hash seed must be an integer from 0 to 65535, "
                                 f"not {hash_seed!r}")
            if decay_shift is not None and (
                    not isinstance(decay_shift, int) or isinstance(decay_shift, bool)
                    or not 8 <= decay_shift <= 30):
                raise ValueError(f"Decay shift must be None or an integer from 8 to 30, "
                                 f"not {decay_shift!r}")
            if skip_shift is not None and (
                    not isinstance(skip_shift, int) or isinstance(skip_shift, bool)
                    or not 6 <= skip_shift <= 30):
                raise ValueError(f"Skip shift must be None or an integer from 6 to 30, "
                                 f"not {skip_shift!r}")
        self._config = config
        self._context = context
        self._event_depth = event_depth
        self._modify_online = modify_online
        self._hash_seed = hash_seed
        self._decay_shift = decay_shift
        self._skip_shift = skip_shift
        members = {
            "i": In(stream.Signature(path_request_layout(config, context))),
            "o": Out(stream.Signature(path_decision_layout(config, context))),
            "feedback": In(stream.Signature(feedback_layout(config))),
            "events": Out(stream.Signature(path_event_layout(config))),
            "ctl": In(stream.Signature(path_command_layout(config))),
            "ctl_resp": Out(stream.Signature(path_response_layout(config))),
            "exp_req": Out(stream.Signature(expand_request_layout(config))),
            "exp_resp": In(stream.Signature(expand_response_layout(config))),
            "gen_req": Out(stream.Signature(generate_request_layout(config))),
            "gen_resp": In(stream.Signature(generate_response_layout(config))),
            "profile_online": Out(config.ev_profiles),
            "port_down_valid": In(1),
            "port_down_port": In(EV_PORT_BITS),
        }
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    @property
    def config(self):
        return self._config

    @property
    def event_depth(self):
        return self._event_depth

    @property
    def modify_online(self):
        return self._modify_online

    @property
    def hash_seed(self):
        return self._hash_seed

    @property
    def decay_shift(self):
        return self._decay_shift

    @property
    def skip_shift(self):
        return self._skip_shift

    @property
    def entry_words(self):
        """Words of each EV table RAM: ``ev_profiles * 2**ev_index_bits``."""
        return entry_words(self._config)

    def memory_shapes(self):
        """(name, width in bits, depth) of every block RAM, for the BRAM estimate."""
        cfg = self._config
        return [
            ("fields", ev_fields_layout(cfg).size + EV_PORT_BITS, self.entry_words),
            ("entry", entry_word_layout(cfg).size, self.entry_words),
            ("qp_binding", 1 + cfg.profile_bits + cfg.ev_index_bits, cfg.qps),
            ("qp_binding_feedback_copy", 1 + cfg.profile_bits + cfg.ev_index_bits, cfg.qps),
        ]

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        words = self.entry_words

        # -- block RAMs ----------------------------------------------------------------------
        m.submodules.qp_mem = qp_mem = Memory(shape=binding_layout(cfg), depth=cfg.qps, init=[])
        m.submodules.fields_mem = fields_mem = Memory(shape=fields_word_layout(cfg),
                                                      depth=words, init=[])
        m.submodules.entry_mem = entry_mem = Memory(shape=entry_word_layout(cfg), depth=words,
                                                    init=[])

        # -- components ----------------------------------------------------------------------
        m.submodules.profiles = profiles = ProfileTable(config=cfg)
        m.submodules.selector = selector = Selector(config=cfg, context=self._context)
        m.submodules.sources = sources = EntrySources(config=cfg, decay_shift=self._decay_shift,
                                                      skip_shift=self._skip_shift)
        m.submodules.update = update = EntryUpdate(config=cfg, event_depth=self._event_depth)
        m.submodules.control = control = PathControl(config=cfg,
                                                     modify_online=self._modify_online,
                                                     hash_seed=self._hash_seed)

        wiring.connect(m, wiring.flipped(self.i), selector.i)
        wiring.connect(m, selector.o, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.feedback), sources.feedback)
        wiring.connect(m, update.events, wiring.flipped(self.events))
        wiring.connect(m, wiring.flipped(self.ctl), control.ctl)
        wiring.connect(m, control.ctl_resp, wiring.flipped(self.ctl_resp))
        for name in ("exp_req", "gen_req"):
            wiring.connect(m, getattr(control, name), wiring.flipped(getattr(self, name)))
        for name in ("exp_resp", "gen_resp"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(control, name))
        wiring.connect(m, sources.o, update.i)
        wiring.connect(m, control.ctl_op, sources.ctl_op)

        # Profile table: read by all, written by the entry update and the control.
        for reader, names in (
                (selector, ("state", "params", "written", "denied", "candidates",
                            "candidates_any")),
                (update, ("state", "params", "good", "written", "denied", "high", "skip",
                          "good_count")),
                (control, ("state", "params", "good", "written", "denied", "good_count"))):
            m.d.comb += [getattr(reader, name).eq(getattr(profiles, name)) for name in names]
        m.d.comb += profiles.commit.eq(update.commit)
        m.d.comb += [getattr(profiles, name).eq(getattr(control, name)) for name in (
            "set_en", "set_profile", "set_params", "state_en", "state_profile", "state_value",
            "clear_en", "clear_profile")]
        for p in range(cfg.ev_profiles):
            m.d.comb += self.profile_online[p].eq(profiles.state[p] == ProfileState.ONLINE)

        # Memory ports.
        _connect_read(m, selector.binding_rd, qp_mem.read_port())
        _connect_read(m, sources.binding_rd, qp_mem.read_port())
        binding_wr = qp_mem.write_port()
        # The control writes a binding only while the selector is held and idle.
        with m.If(control.binding_wr.en):
            _connect_write(m, control.binding_wr, binding_wr)
        with m.Else():
            _connect_write(m, selector.binding_wr, binding_wr)
        _connect_read(m, selector.fields_rd, fields_mem.read_port())
        _connect_write(m, control.fields_wr, fields_mem.write_port())
        _connect_read(m, update.entry_rd, entry_mem.read_port())
        _connect_write(m, update.entry_wr, entry_mem.write_port())

        # Control, fate sharing and ordering.
        m.d.comb += [
            sources.ctl_busy.eq(control.ctl_busy),
            control.engine_busy.eq(update.busy),
            control.result_valid.eq(update.result_valid),
            control.result.eq(update.result),
            control.result_skip.eq(update.result_skip),
            update.skip_epoch.eq(sources.skip_epoch),
            control.selector_idle.eq(selector.idle),
            sources.fate_trigger_valid.eq(update.fate_trigger_valid),
            sources.fate_trigger_port.eq(update.fate_trigger_port),
            sources.port_down_valid.eq(self.port_down_valid),
            sources.port_down_port.eq(self.port_down_port),
            # Selection waits while a LOST is on its way through the entry update and while a
            # fate sweep is pending or running: a decision taken then (typically the
            # retransmission the LOST came with; the requester sends the LOST first) must not
            # pick an EV the LOST or the sweep is about to take out. (Registered stages only:
            # a ready that depended on another stream's valid in the same cycle would make a
            # combinational path between the two inputs.)
            selector.hold.eq(control.sel_hold | sources.hold | update.hold),
            self.decisions.eq(selector.decisions),
            self.no_path.eq(selector.no_path),
            self.fate_sweeps.eq(sources.fate_sweeps),
        ]
        m.d.comb += [getattr(self, name).eq(getattr(update, name)) for name in ENTRY_COUNTERS]
        return m


def _connect_read(m, user, port):
    m.d.comb += [port.addr.eq(user.addr), port.en.eq(user.en), user.data.eq(port.data)]


def _connect_write(m, user, port):
    m.d.comb += [port.addr.eq(user.addr), port.en.eq(user.en), port.data.eq(user.data)]
