"""Path select: the EV table and the per-packet choice of an Entropy Value (EV).

:class:`PathSelect` holds every EV profile's array (expanded header fields, egress port, state,
penalty), binds each QP to a profile, and answers one send request per cycle with an EV, its
0-based egress port and its stored header fields. It applies path feedback (ACK, ECN, trim,
loss, probe answers) to the EV states and penalties, keeps the ``ev_min_active`` floor, raises
EV events, and is configured through a small command stream that mirrors ``mrc_ctl.h``.

The Python reference of the same rules is :class:`sim.model.path.PathModel`; the numbers and
choices are explained in ``docs/path-select.md``.
"""

from amaranth import *
from amaranth.hdl import Shape
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..interfaces import (
    EV_VALUE_BITS,
    ev_fields_layout,
    expand_request_layout,
    expand_response_layout,
    feedback_layout,
    generate_request_layout,
    generate_response_layout,
    path_decision_layout,
    path_request_layout,
)
from ..protocol import Errno, EvMode, EvState, FeedbackKind, ProfileState
from ..util import validating

__all__ = [
    "PathSelect", "PathCommand", "ProbeRecovery", "path_command_layout",
    "path_response_layout", "path_event_layout", "auto_index", "entry_read_data",
    "profile_read_data",
    "PENALTY_BITS", "PENALTY_MAX", "PENALTY_ACKED", "PENALTY_ECN", "PENALTY_TRIMMED",
    "PENALTY_LOST", "PENALTY_HIGH", "HASH_MULTIPLIER",
]


class PathCommand(enum.IntEnum, shape=4):
    """Control commands of :class:`PathSelect` (``mrc_ctl.h`` semantics; codes are a *project
    choice*). Any other code is answered with ``EINVAL``."""
    PROFILE_SET = 0             #: create/set a profile's mode, size, floor, flags (INIT/OFFLINE)
    PROFILE_STATE = 1           #: INIT <-> OFFLINE <-> ONLINE
    ENTRY_WRITE = 2             #: write one EV (value, port, GOOD|DENIED), not while ONLINE
    ENTRY_STATE = 3             #: set one EV's state (GOOD/ASSUMED_BAD/DENIED), floor kept
    ENTRY_READ = 4              #: read one EV's state, port and penalty
    QP_PROFILE = 5              #: bind a QP to a profile, reset its rotation pointer
    PROFILE_READ = 6            #: read a profile's state, mode, size, floor and usable count


class ProbeRecovery(enum.IntEnum, shape=1):
    """What a PROBE_OK on an ASSUMED_BAD EV does."""
    AUTO = 0                    #: the EV returns to GOOD (and an event says so)
    CONTROLLER = 1              #: only an event (``probe_ok`` set); the controller decides


# Field widths of the command stream. 9 bits hold 0..511, so an index or count one past the
# largest build (256 EVs) is representable and refused with E2BIG rather than wrapped.
PROFILE_ID_BITS = 4
COUNT_BITS = 9
EV_PORT_BITS = 5                #: ports 1..16 as the EV entries store them

# Penalties (adaptive spraying), *project choice*; docs/path-select.md explains the numbers.
PENALTY_BITS = 8
PENALTY_MAX = (1 << PENALTY_BITS) - 1
PENALTY_ACKED = 1               #: an ACK takes this much off (saturating at 0)
PENALTY_ECN = 8                 #: ECN echo: a small penalty
PENALTY_TRIMMED = 32            #: a trimmed packet: congestion, a larger penalty
PENALTY_LOST = 64               #: a loss the floor keeps from turning into ASSUMED_BAD
PENALTY_HIGH = 64               #: an EV with a penalty at or above this is "high"

#: Fibonacci hashing constant of the AUTO mode's per-QP EV choice (2**32 / golden ratio, odd).
HASH_MULTIPLIER = 0x9E3779B1


def auto_index(qpn, num_evs, seed=0):
    """The EV index an AUTO profile gives QP ``qpn``: a Fibonacci hash of ``qpn ^ seed`` (16
    bits), scaled to ``0 .. num_evs - 1`` by a multiply and shift (no division in hardware)."""
    x = (qpn ^ seed) & 0xFFFF
    h = ((x * HASH_MULTIPLIER) >> 16) & 0xFFFF
    return (h * num_evs) >> 16


def entry_read_data(*, state, port, penalty):
    """The ``data`` word of an ENTRY_READ response."""
    return int(state) | port << 8 | penalty << 16


def profile_read_data(*, state, mode, adaptive, recovery, populated, num_evs, min_active,
                      usable, fate=0):
    """The ``data`` word of a PROFILE_READ response (16-bit lanes from bit 16 up)."""
    return (int(state) | int(mode) << 2 | adaptive << 4 | int(recovery) << 5 | populated << 6
            | fate << 7 | num_evs << 16 | min_active << 32 | usable << 48)


def path_command_layout(config):
    """A control command; each command reads only the fields it names (docs/path-select.md).

    ``state`` is an :class:`~hdl.protocol.EvState` for the ENTRY commands and a
    :class:`~hdl.protocol.ProfileState` for PROFILE_STATE; ``value`` an EV as
    :func:`~hdl.interfaces.expand_request_layout` takes it (byte 0 in the top bits).
    """
    return data.StructLayout({
        "cmd": unsigned(4),
        "profile": unsigned(PROFILE_ID_BITS),
        "index": unsigned(COUNT_BITS),
        "mode": unsigned(2),
        "num_evs": unsigned(COUNT_BITS),
        "min_active": unsigned(COUNT_BITS),
        "adaptive": unsigned(1),
        "recovery": unsigned(1),
        "fate": unsigned(1),
        "state": unsigned(3),
        "port": unsigned(EV_PORT_BITS),
        "qpn": unsigned(config.qpn_bits),
        "offset": unsigned(COUNT_BITS),
        "value": unsigned(EV_VALUE_BITS),
    })


def path_response_layout(config):
    """One response per command, in order: ``errno`` (OK or why refused) and read ``data``."""
    return data.StructLayout({
        "errno": Errno,
        "data": unsigned(64),
    })


def path_event_layout(config):
    """An EV event: EV ``index`` of ``profile`` (egress ``port`` 1..P) changed to ``state``
    (GOOD <-> ASSUMED_BAD); or, with ``probe_ok``, a probe answered on an ASSUMED_BAD EV of a
    CONTROLLER-recovery profile (``state`` still ASSUMED_BAD)."""
    return data.StructLayout({
        "profile": unsigned(config.profile_bits),
        "index": unsigned(config.ev_index_bits),
        "port": unsigned(EV_PORT_BITS),
        "state": EvState,
        "probe_ok": unsigned(1),
    })


class _Op(enum.IntEnum, shape=4):
    # Operations of the entry engine; the first five are FeedbackKind's values.
    ACKED = 0
    ECN = 1
    TRIMMED = 2
    LOST = 3
    PROBE_OK = 4
    DECAY = 5
    WRITE = 6
    SET_STATE = 7
    READ = 8
    BAD_KIND = 9
    FATE = 10                   # the port fate-sharing sweep visits one EV


COUNTERS = ("decisions", "no_path", "feedback_acked", "feedback_ecn", "feedback_trimmed",
            "feedback_lost", "feedback_probe_ok", "feedback_ignored", "state_changes",
            "events_dropped", "fate_sweeps", "fate_marked")


def _first_set(vector, width):
    """(found, index) of the lowest set bit of ``vector[:width]``: a log-depth mux tree."""
    size = 1 << max(0, (width - 1).bit_length())
    bits = [vector[i] if i < width else C(0, 1) for i in range(size)]

    def node(lo, n):
        if n == 1:
            return bits[lo], C(0, 0)
        found_lo, index_lo = node(lo, n // 2)
        found_hi, index_hi = node(lo + n // 2, n // 2)
        return found_lo | found_hi, Mux(found_lo, Cat(index_lo, C(0, 1)), Cat(index_hi, C(1, 1)))

    return node(0, size)


def _choose(m, registers, index, name):
    """The register of ``registers`` that ``index`` names (zero when out of range)."""
    chosen = Signal(len(registers[0]), name=name)
    with m.Switch(index):
        for number, register in enumerate(registers):
            with m.Case(number):
                m.d.comb += chosen.eq(register)
    return chosen


class PathSelect(wiring.Component):
    """EV table and per-packet path selection.

    Selection: one request accepted per cycle, decisions in request order, two cycles of
    latency (request to ``o.valid``) when ``o`` is ready. Back-to-back requests of one QP get
    successive rotation positions. Selection never waits for feedback or control (they use
    other RAM ports); only a QP_PROFILE command holds ``i`` for the few cycles it writes the
    binding table.

    Storage: the expanded fields and port of each EV in one block RAM
    (``ev_profiles * 2**ev_index_bits`` words), port and penalty in a second, per-QP binding
    (bound, profile, rotation pointer) in a third with two read ports; per-profile
    registers and four bitmaps of ``evs_per_profile`` bits (good, written, denied,
    high-penalty) in flip-flops, so the next usable EV is found in one cycle.

    Feedback: one per cycle while no command runs; it is applied only to an ONLINE profile's
    written EV with index below ``num_evs`` of a bound QP, otherwise it is accepted and
    counted in ``feedback_ignored``. Kinds outside :class:`~hdl.protocol.FeedbackKind` are
    ignored the same way.

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
    feedback_probe_ok, feedback_ignored, state_changes, events_dropped : ``Out(32)`` counters
    """

    def __init__(self, *, config, context=None, event_depth=16, modify_online=False,
                 hash_seed=0, decay_shift=16):
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
        self._config = config
        self._context = context
        self._event_depth = event_depth
        self._modify_online = modify_online
        self._hash_seed = hash_seed
        self._decay_shift = decay_shift
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
    def entry_words(self):
        """Words of each EV table RAM: ``ev_profiles * 2**ev_index_bits``."""
        return self._config.ev_profiles << self._config.ev_index_bits

    def memory_shapes(self):
        """(name, width in bits, depth) of every block RAM, for the BRAM estimate."""
        cfg = self._config
        return [
            ("fields", ev_fields_layout(cfg).size + EV_PORT_BITS, self.entry_words),
            ("entry", EV_PORT_BITS + PENALTY_BITS, self.entry_words),
            ("qp_binding", 1 + cfg.profile_bits + cfg.ev_index_bits, cfg.qps),
            ("qp_binding_feedback_copy", 1 + cfg.profile_bits + cfg.ev_index_bits, cfg.qps),
        ]

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n_profiles, n_evs = cfg.ev_profiles, cfg.evs_per_profile
        index_bits, profile_bits = cfg.ev_index_bits, cfg.profile_bits
        all_evs = (1 << n_evs) - 1

        # -- per-profile registers (at most 16 profiles) -------------------------------------
        p_state = [Signal(2, name=f"profile{p}_state") for p in range(n_profiles)]
        p_mode = [Signal(2, name=f"profile{p}_mode") for p in range(n_profiles)]
        p_num = [Signal(COUNT_BITS, name=f"profile{p}_num_evs") for p in range(n_profiles)]
        p_min = [Signal(COUNT_BITS, name=f"profile{p}_min_active") for p in range(n_profiles)]
        p_adaptive = [Signal(name=f"profile{p}_adaptive") for p in range(n_profiles)]
        p_recovery = [Signal(name=f"profile{p}_recovery") for p in range(n_profiles)]
        p_fate = [Signal(name=f"profile{p}_fate") for p in range(n_profiles)]
        # good: GOOD and written; denied: DENIED and written; ASSUMED_BAD = written & ~good &
        # ~denied; high: penalty >= PENALTY_HIGH. Written bits are cleared by PROFILE_SET.
        p_good = [Signal(n_evs, name=f"profile{p}_good") for p in range(n_profiles)]
        p_written = [Signal(n_evs, name=f"profile{p}_written") for p in range(n_profiles)]
        p_denied = [Signal(n_evs, name=f"profile{p}_denied") for p in range(n_profiles)]
        p_high = [Signal(n_evs, name=f"profile{p}_high") for p in range(n_profiles)]
        p_good_count = [Signal(COUNT_BITS, name=f"profile{p}_usable") for p in range(n_profiles)]
        p_low_count = [Signal(COUNT_BITS, name=f"profile{p}_low") for p in range(n_profiles)]
        for p in range(n_profiles):
            m.d.comb += self.profile_online[p].eq(p_state[p] == ProfileState.ONLINE)

        # -- block RAMs ----------------------------------------------------------------------
        qp_layout = data.StructLayout({
            "bound": unsigned(1), "profile": unsigned(profile_bits),
            "pointer": unsigned(index_bits)})
        m.submodules.qp_mem = qp_mem = Memory(shape=qp_layout, depth=cfg.qps, init=[])
        qp_wr = qp_mem.write_port()
        qp_sel_rd = qp_mem.read_port(domain="sync", transparent_for=(qp_wr,))
        qp_fb_rd = qp_mem.read_port(domain="sync")

        fields_layout = data.StructLayout({
            "fields": ev_fields_layout(cfg), "port": unsigned(EV_PORT_BITS)})
        m.submodules.fields_mem = fields_mem = Memory(
            shape=fields_layout, depth=self.entry_words, init=[])
        fields_wr = fields_mem.write_port()
        fields_rd = fields_mem.read_port(domain="sync")

        entry_layout = data.StructLayout({
            "port": unsigned(EV_PORT_BITS), "penalty": unsigned(PENALTY_BITS)})
        m.submodules.entry_mem = entry_mem = Memory(
            shape=entry_layout, depth=self.entry_words, init=[])
        entry_wr = entry_mem.write_port()
        entry_rd = entry_mem.read_port(domain="sync", transparent_for=(entry_wr,))

        m.submodules.event_fifo = event_fifo = fifo.SyncFIFOBuffered(
            width=path_event_layout(cfg).size, depth=self._event_depth)
        m.d.comb += [
            self.events.valid.eq(event_fifo.r_rdy),
            self.events.payload.eq(event_fifo.r_data),
            event_fifo.r_en.eq(self.events.ready),
        ]

        # Control FSM outputs used by the datapath (driven further down).
        ctl_busy = Signal()             # a command runs: feedback and decay wait
        sel_hold = Signal()             # QP_PROFILE: no new requests
        ctl_qp_we = Signal()
        ctl_qp_addr = Signal(cfg.qpn_bits)
        ctl_qp_data = Signal(qp_layout)

        # ==================================================================================
        # Selection: s0 (accept, read binding) -> s1 (pick, advance pointer, read fields)
        # -> s2 (output register)
        # ==================================================================================
        s1_valid = Signal()
        s1_req = Signal(path_request_layout(cfg, None))
        s1_context = Signal(self._context) if self._context is not None else None
        s2_valid = Signal()
        s2_qpn = Signal(cfg.qpn_bits)
        s2_no_path = Signal()
        s2_ev = Signal(index_bits)
        s2_context = Signal.like(s1_context) if s1_context is not None else None

        s2_ready = ~s2_valid | self.o.ready
        s1_fire = s1_valid & s2_ready
        s1_ready = ~s1_valid | s2_ready
        fate_hold = Signal()            # driven by the entry engine below
        m.d.comb += [
            self.i.ready.eq(s1_ready & ~sel_hold & ~fate_hold),
            qp_sel_rd.addr.eq(self.i.payload.qpn),
            qp_sel_rd.en.eq(self.i.ready),
        ]
        # s1 empties when its request moves on even while new ones are held (sel_hold,
        # fate_hold): else the held cycle would decide the same request twice.
        with m.If(s1_ready):
            m.d.sync += [s1_valid.eq(self.i.valid & self.i.ready), s1_req.eq(self.i.payload)]
            if s1_context is not None:
                m.d.sync += s1_context.eq(self.i.payload.context)

        qp = qp_sel_rd.data
        sel_state = _choose(m, p_state, qp.profile, "sel_state")
        sel_mode = _choose(m, p_mode, qp.profile, "sel_mode")
        sel_min = _choose(m, p_min, qp.profile, "sel_min")
        sel_adaptive = _choose(m, p_adaptive, qp.profile, "sel_adaptive")
        sel_good = _choose(m, p_good, qp.profile, "sel_good")
        sel_high = _choose(m, p_high, qp.profile, "sel_high")
        sel_written = _choose(m, p_written, qp.profile, "sel_written")
        sel_denied = _choose(m, p_denied, qp.profile, "sel_denied")
        sel_low_count = _choose(m, p_low_count, qp.profile, "sel_low_count")

        # Adaptive: high-penalty EVs are skipped while enough low-penalty ones remain: at least
        # min_active and at least half the usable ones (so skipping at most doubles the load
        # on an EV: a plane just back from a failure, with clean penalties, must not draw
        # every packet).
        sel_good_count = _choose(m, p_good_count, qp.profile, "sel_good_count")
        use_low = (sel_adaptive & (sel_low_count != 0) & (sel_low_count >= sel_min)
                   & (sel_low_count >= (sel_good_count + 1) >> 1))
        candidates = Signal(n_evs)
        m.d.comb += candidates.eq(Mux(use_low, sel_good & ~sel_high, sel_good))
        avoided = Signal(n_evs)
        m.d.comb += avoided.eq(candidates & ~(C(1, n_evs) << s1_req.avoid_ev)[:n_evs])
        eligible = Signal(n_evs)
        m.d.comb += eligible.eq(Mux(s1_req.avoid_ev_valid & avoided.any(), avoided, candidates))
        at_or_after = Signal(n_evs)
        m.d.comb += at_or_after.eq(eligible & (C(all_evs, n_evs) << qp.pointer)[:n_evs])
        found_after, index_after = _first_set(at_or_after, n_evs)
        found_any, index_any = _first_set(eligible, n_evs)
        pick = Signal(index_bits)
        m.d.comb += pick.eq(Mux(found_after, index_after, index_any))

        probe_ok = (sel_written.bit_select(s1_req.ev, 1)
                    & ~sel_denied.bit_select(s1_req.ev, 1))
        no_path = Signal()
        m.d.comb += no_path.eq(~qp.bound | (sel_state != ProfileState.ONLINE)
                               | Mux(s1_req.probe, ~probe_ok, ~found_any))
        chosen = Signal(index_bits)
        m.d.comb += chosen.eq(Mux(s1_req.probe, s1_req.ev, Mux(no_path, 0, pick)))

        # The pointer moves past the pick; one wider than the index it would wrap to 0 anyway
        # (no candidate lies at or above num_evs), so no compare with num_evs is needed.
        advance = s1_fire & ~s1_req.probe & ~no_path & (sel_mode != EvMode.AUTO)
        with m.If(ctl_qp_we):
            m.d.comb += [
                qp_wr.en.eq(1),
                qp_wr.addr.eq(ctl_qp_addr),
                qp_wr.data.eq(ctl_qp_data),
            ]
        with m.Else():
            m.d.comb += [
                qp_wr.en.eq(advance),
                qp_wr.addr.eq(s1_req.qpn),
                qp_wr.data.bound.eq(1),
                qp_wr.data.profile.eq(qp.profile),
                qp_wr.data.pointer.eq(pick + 1),
            ]
        m.d.comb += [
            fields_rd.addr.eq(Cat(chosen, qp.profile)),
            fields_rd.en.eq(s2_ready),
        ]
        with m.If(s2_ready):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_qpn.eq(s1_req.qpn),
                s2_no_path.eq(no_path),
                s2_ev.eq(chosen),
            ]
            if s2_context is not None:
                m.d.sync += s2_context.eq(s1_context)
        with m.If(s1_fire):
            m.d.sync += [
                self.decisions.eq(self.decisions + 1),
                self.no_path.eq(self.no_path + no_path),
            ]
        m.d.comb += [
            self.o.valid.eq(s2_valid),
            self.o.payload.qpn.eq(s2_qpn),
            self.o.payload.no_path.eq(s2_no_path),
            self.o.payload.ev.eq(s2_ev),
        ]
        with m.If(~s2_no_path):
            m.d.comb += [
                self.o.payload.port.eq(fields_rd.data.port - 1),
                self.o.payload.fields.eq(fields_rd.data.fields),
            ]
        if s2_context is not None:
            m.d.comb += self.o.payload.context.eq(s2_context)

        # ==================================================================================
        # Entry engine: e1 (issue, read entry RAM) -> e2 (read-modify-write, bitmaps, events)
        # Sources, highest priority first: a command, feedback, the decay sweep.
        # ==================================================================================
        ctl_op_valid = Signal()
        ctl_op = Signal(_Op)
        ctl_op_profile = Signal(profile_bits)
        ctl_op_index = Signal(index_bits)
        ctl_op_state = Signal(3)
        ctl_op_port = Signal(EV_PORT_BITS)

        # Feedback front end: f1 holds one feedback with its QP binding.
        f1_valid = Signal()
        f1 = Signal(feedback_layout(cfg))
        f1_grant = Signal()
        m.d.comb += [
            self.feedback.ready.eq(~f1_valid | f1_grant),
            qp_fb_rd.addr.eq(self.feedback.payload.qpn),
            qp_fb_rd.en.eq(self.feedback.ready),
        ]
        with m.If(self.feedback.ready):
            m.d.sync += [f1_valid.eq(self.feedback.valid), f1.eq(self.feedback.payload)]

        # Decay sweep: every 2**decay_shift cycles, halve every entry's penalty, one per free
        # engine slot.
        sweep_active = Signal()
        sweep_index = Signal(range(self.entry_words))
        sweep_grant = Signal()
        if self._decay_shift is not None:
            timer = Signal(self._decay_shift)
            m.d.sync += timer.eq(timer + 1)
            with m.If(sweep_grant):
                m.d.sync += sweep_index.eq(sweep_index + 1)
                with m.If(sweep_index == self.entry_words - 1):
                    m.d.sync += [sweep_active.eq(0), sweep_index.eq(0)]
            with m.If(timer == (1 << self._decay_shift) - 1):
                m.d.sync += sweep_active.eq(1)

        # Port fate sharing: a LOST that turns an EV of a fate-sharing profile ASSUMED_BAD
        # gives its port a strike; a second such LOST on the port while the strike stands
        # marks the port pending (and clears the strike); a probe that brings an EV of the
        # port back GOOD clears it. The sweep then visits every entry once per pending port
        # (one per free engine slot, after feedback, before the decay sweep) and turns the
        # GOOD EVs on that port ASSUMED_BAD, floor permitting.
        fate_ports = cfg.ports + 1             # ports count from 1 (bit 0 stays clear)
        fate_pending = Signal(fate_ports)
        fate_strike = Signal(fate_ports)
        strike_set = Signal()
        strike_clear = Signal()
        fate_active = Signal()
        fate_port = Signal(EV_PORT_BITS)
        fate_index = Signal(range(self.entry_words))
        fate_grant = Signal()
        fate_trigger = Signal()
        fate_trigger_port = Signal(EV_PORT_BITS)
        with m.If(fate_grant):
            m.d.sync += fate_index.eq(fate_index + 1)
            with m.If(fate_index == self.entry_words - 1):
                m.d.sync += [fate_active.eq(0), fate_index.eq(0)]
        next_found, next_port = _first_set(fate_pending, fate_ports)
        cleared = Signal.like(fate_pending)
        m.d.comb += cleared.eq(fate_pending)
        with m.If(~fate_active & next_found):
            m.d.comb += cleared.bit_select(next_port, 1).eq(0)
            m.d.sync += [fate_active.eq(1), fate_port.eq(next_port), fate_index.eq(0),
                         self.fate_sweeps.eq(self.fate_sweeps + 1)]
        # A port the port watch (``hdl/path/watch.py``) found down is swept like a second
        # strike.
        m.d.sync += fate_pending.eq(
            cleared | Mux(fate_trigger, (C(1, fate_ports) << fate_trigger_port)[:fate_ports], 0)
            | Mux(self.port_down_valid & (self.port_down_port != 0),
                  (C(1, fate_ports) << self.port_down_port)[:fate_ports], 0))

        e1_valid = Signal()
        e1_op = Signal(_Op)
        e2_valid = Signal()
        e2_op = Signal(_Op)
        e1_profile = Signal(profile_bits)
        e1_index = Signal(index_bits)
        e1_bound = Signal()
        with m.If(ctl_busy):
            m.d.comb += [
                e1_valid.eq(ctl_op_valid), e1_op.eq(ctl_op),
                e1_profile.eq(ctl_op_profile), e1_index.eq(ctl_op_index), e1_bound.eq(1),
            ]
        with m.Elif(f1_valid):
            m.d.comb += [
                f1_grant.eq(1), e1_valid.eq(1),
                e1_op.eq(Mux(f1.kind <= FeedbackKind.PROBE_OK, f1.kind, _Op.BAD_KIND)),
                e1_profile.eq(qp_fb_rd.data.profile), e1_index.eq(f1.ev),
                e1_bound.eq(qp_fb_rd.data.bound),
            ]
        with m.Elif(fate_active):
            m.d.comb += [
                fate_grant.eq(1), e1_valid.eq(1), e1_op.eq(_Op.FATE), e1_bound.eq(1),
                e1_profile.eq(fate_index[index_bits:]), e1_index.eq(fate_index[:index_bits]),
            ]
        with m.Elif(sweep_active):
            m.d.comb += [
                sweep_grant.eq(1), e1_valid.eq(1), e1_op.eq(_Op.DECAY),
                e1_profile.eq(sweep_index[index_bits:]), e1_index.eq(sweep_index[:index_bits]),
            ]
        m.d.comb += [
            entry_rd.addr.eq(Cat(e1_index, e1_profile)),
            entry_rd.en.eq(1),
        ]

        e2_profile = Signal(profile_bits)
        e2_index = Signal(index_bits)
        e2_bound = Signal()
        e2_state = Signal(3)
        e2_port = Signal(EV_PORT_BITS)
        m.d.sync += [
            e2_valid.eq(e1_valid), e2_op.eq(e1_op), e2_profile.eq(e1_profile),
            e2_index.eq(e1_index), e2_bound.eq(e1_bound),
            e2_state.eq(ctl_op_state), e2_port.eq(ctl_op_port),
        ]

        e2_state_now = _choose(m, p_state, e2_profile, "e2_profile_state")
        e2_num = _choose(m, p_num, e2_profile, "e2_num_evs")
        e2_min = _choose(m, p_min, e2_profile, "e2_min_active")
        e2_recovery = _choose(m, p_recovery, e2_profile, "e2_recovery")
        e2_fate = _choose(m, p_fate, e2_profile, "e2_fate")
        e2_good_count = _choose(m, p_good_count, e2_profile, "e2_good_count")
        cur_good = _choose(m, p_good, e2_profile, "e2_good").bit_select(e2_index, 1)
        cur_written = _choose(m, p_written, e2_profile, "e2_written").bit_select(e2_index, 1)
        cur_denied = _choose(m, p_denied, e2_profile, "e2_denied").bit_select(e2_index, 1)
        cur_high = _choose(m, p_high, e2_profile, "e2_high").bit_select(e2_index, 1)
        cur_assumed_bad = cur_written & ~cur_good & ~cur_denied
        cur_penalty = entry_rd.data.penalty
        cur_port = entry_rd.data.port
        strike_onehot = (C(1, fate_ports) << cur_port)[:fate_ports]
        strike_hit = (fate_strike & strike_onehot).any()
        m.d.sync += fate_strike.eq(Mux(strike_set, fate_strike | strike_onehot,
                                       Mux(strike_clear, fate_strike & ~strike_onehot,
                                           fate_strike)))

        new_good = Signal()
        new_denied = Signal()
        new_written = Signal()
        new_penalty = Signal(PENALTY_BITS)
        new_port = Signal(EV_PORT_BITS)
        commit = Signal()               # write entry RAM and bitmaps
        event_valid = Signal()
        event = Signal(path_event_layout(cfg))
        fb_applies = Signal()
        m.d.comb += [
            new_good.eq(cur_good), new_denied.eq(cur_denied), new_written.eq(cur_written),
            new_penalty.eq(cur_penalty), new_port.eq(cur_port),
            event.profile.eq(e2_profile), event.index.eq(e2_index), event.port.eq(cur_port),
            fb_applies.eq(e2_bound & (e2_state_now == ProfileState.ONLINE)
                          & (e2_index < e2_num) & cur_written),
        ]

        def add_penalty(amount):
            total = cur_penalty + amount
            return Mux(total > PENALTY_MAX, PENALTY_MAX, total)

        with m.If(e2_valid):
            with m.Switch(e2_op):
                with m.Case(_Op.ACKED):
                    with m.If(fb_applies):
                        m.d.comb += [commit.eq(1), new_penalty.eq(
                            Mux(cur_penalty > PENALTY_ACKED, cur_penalty - PENALTY_ACKED, 0))]
                with m.Case(_Op.ECN):
                    with m.If(fb_applies):
                        m.d.comb += [commit.eq(1), new_penalty.eq(add_penalty(PENALTY_ECN))]
                with m.Case(_Op.TRIMMED):
                    with m.If(fb_applies):
                        m.d.comb += [commit.eq(1),
                                     new_penalty.eq(add_penalty(PENALTY_TRIMMED))]
                with m.Case(_Op.LOST):
                    with m.If(fb_applies & cur_good):
                        m.d.comb += commit.eq(1)
                        # The floor: only if ev_min_active usable EVs remain afterwards.
                        with m.If(e2_good_count > e2_min):
                            m.d.comb += [new_good.eq(0), event_valid.eq(1),
                                         event.state.eq(EvState.ASSUMED_BAD),
                                         fate_trigger.eq(e2_fate & strike_hit),
                                         fate_trigger_port.eq(cur_port),
                                         strike_set.eq(e2_fate & ~strike_hit),
                                         strike_clear.eq(e2_fate & strike_hit)]
                        with m.Else():
                            m.d.comb += new_penalty.eq(add_penalty(PENALTY_LOST))
                with m.Case(_Op.FATE):
                    with m.If(fb_applies & e2_fate & cur_good & (cur_port == fate_port)
                              & (e2_good_count > e2_min)):
                        m.d.comb += [commit.eq(1), new_good.eq(0), event_valid.eq(1),
                                     event.state.eq(EvState.ASSUMED_BAD)]
                        m.d.sync += self.fate_marked.eq(self.fate_marked + 1)
                with m.Case(_Op.PROBE_OK):
                    with m.If(fb_applies & cur_assumed_bad):
                        m.d.comb += [event_valid.eq(1), event.state.eq(EvState.ASSUMED_BAD)]
                        with m.If(e2_recovery == ProbeRecovery.AUTO):
                            m.d.comb += [commit.eq(1), new_good.eq(1),
                                         event.state.eq(EvState.GOOD), strike_clear.eq(1)]
                        with m.Else():
                            m.d.comb += event.probe_ok.eq(1)
                with m.Case(_Op.DECAY):
                    m.d.comb += [commit.eq(1), new_penalty.eq(cur_penalty >> 1)]
                with m.Case(_Op.WRITE):
                    m.d.comb += [
                        commit.eq(1), new_written.eq(1), new_penalty.eq(0),
                        new_port.eq(e2_port),
                        new_good.eq(e2_state == EvState.GOOD),
                        new_denied.eq(e2_state == EvState.DENIED),
                    ]
                with m.Case(_Op.SET_STATE):
                    m.d.comb += [
                        commit.eq(1),
                        new_good.eq(e2_state == EvState.GOOD),
                        new_denied.eq(e2_state == EvState.DENIED),
                        event.state.eq(e2_state),
                        event_valid.eq(
                            (cur_good & (e2_state == EvState.ASSUMED_BAD))
                            | (cur_assumed_bad & (e2_state == EvState.GOOD))),
                    ]

        new_high = new_penalty >= PENALTY_HIGH
        old_low = cur_good & ~cur_high
        new_low = new_good & ~new_high
        m.d.comb += [
            entry_wr.en.eq(commit),
            entry_wr.addr.eq(Cat(e2_index, e2_profile)),
            entry_wr.data.penalty.eq(new_penalty),
            entry_wr.data.port.eq(new_port),
        ]
        for p in range(n_profiles):
            with m.If(commit & (e2_profile == p)):
                m.d.sync += [
                    p_good[p].bit_select(e2_index, 1).eq(new_good),
                    p_denied[p].bit_select(e2_index, 1).eq(new_denied),
                    p_written[p].bit_select(e2_index, 1).eq(new_written),
                    p_high[p].bit_select(e2_index, 1).eq(new_high),
                ]
                with m.If(new_good & ~cur_good):
                    m.d.sync += p_good_count[p].eq(p_good_count[p] + 1)
                with m.Elif(~new_good & cur_good):
                    m.d.sync += p_good_count[p].eq(p_good_count[p] - 1)
                with m.If(new_low & ~old_low):
                    m.d.sync += p_low_count[p].eq(p_low_count[p] + 1)
                with m.Elif(~new_low & old_low):
                    m.d.sync += p_low_count[p].eq(p_low_count[p] - 1)

        # Selection waits while a LOST is on its way through the engine and while a fate
        # sweep is pending or running: a decision taken then (typically the retransmission
        # the LOST came with; the requester sends the LOST first) must not pick an EV the
        # LOST or the sweep is about to take out.
        # (Registered stages only: a ready that depended on another stream's valid in the
        # same cycle would make a combinational path between the two inputs.)
        m.d.comb += fate_hold.eq(
            (f1_valid & (f1.kind == FeedbackKind.LOST))
            | (e2_valid & (e2_op == _Op.LOST)) | fate_active | fate_pending.any())

        state_changed = commit & cur_written & (e2_op != _Op.WRITE) & (
            (new_good != cur_good) | (new_denied != cur_denied))
        m.d.sync += self.state_changes.eq(self.state_changes + state_changed)
        m.d.comb += [event_fifo.w_en.eq(event_valid), event_fifo.w_data.eq(event)]
        with m.If(event_valid & ~event_fifo.w_rdy):
            m.d.sync += self.events_dropped.eq(self.events_dropped + 1)

        is_feedback = e2_op <= _Op.PROBE_OK
        with m.If(e2_valid & is_feedback):
            with m.Switch(e2_op):
                for kind, counter in ((_Op.ACKED, self.feedback_acked),
                                      (_Op.ECN, self.feedback_ecn),
                                      (_Op.TRIMMED, self.feedback_trimmed),
                                      (_Op.LOST, self.feedback_lost),
                                      (_Op.PROBE_OK, self.feedback_probe_ok)):
                    with m.Case(kind):
                        m.d.sync += counter.eq(counter + 1)
        with m.If(e2_valid & ((is_feedback & ~fb_applies) | (e2_op == _Op.BAD_KIND))):
            m.d.sync += self.feedback_ignored.eq(self.feedback_ignored + 1)

        # ==================================================================================
        # Control
        # ==================================================================================
        cmd = Signal(path_command_layout(cfg))
        resp = Signal(path_response_layout(cfg))
        cmd_profile_ok = cmd.profile < n_profiles
        c_state = _choose(m, p_state, cmd.profile, "cmd_state")
        c_mode = _choose(m, p_mode, cmd.profile, "cmd_mode")
        c_num = _choose(m, p_num, cmd.profile, "cmd_num_evs")
        c_min = _choose(m, p_min, cmd.profile, "cmd_min_active")
        c_adaptive = _choose(m, p_adaptive, cmd.profile, "cmd_adaptive")
        c_recovery = _choose(m, p_recovery, cmd.profile, "cmd_recovery")
        c_fate = _choose(m, p_fate, cmd.profile, "cmd_fate")
        c_good_count = _choose(m, p_good_count, cmd.profile, "cmd_good_count")
        c_good = _choose(m, p_good, cmd.profile, "cmd_good")
        c_written = _choose(m, p_written, cmd.profile, "cmd_written")
        c_denied = _choose(m, p_denied, cmd.profile, "cmd_denied")
        below_num = Signal(n_evs)
        m.d.comb += below_num.eq(~(C(all_evs, n_evs) << c_num)[:n_evs])
        populated = Signal()
        m.d.comb += populated.eq((c_written & below_num) == below_num)
        index_ok = (cmd.index < c_num) & (cmd.index < n_evs)
        entry_good = c_good.bit_select(cmd.index, 1)
        entry_written = c_written.bit_select(cmd.index, 1)
        entry_denied = c_denied.bit_select(cmd.index, 1)
        entry_state = Mux(entry_good, EvState.GOOD,
                          Mux(entry_denied, EvState.DENIED, EvState.ASSUMED_BAD))
        floor_blocks = entry_good & (c_good_count <= c_min)
        ev_state_ok = ((cmd.state == EvState.GOOD) | (cmd.state == EvState.ASSUMED_BAD)
                       | (cmd.state == EvState.DENIED))

        generating = Signal()
        gen_k = Signal(COUNT_BITS)
        gen_port = Signal(EV_PORT_BITS)
        value = Signal(EV_VALUE_BITS)
        w_index = Signal(index_bits)
        w_port = Signal(EV_PORT_BITS)
        w_state = Signal(3)
        w_fields = Signal(ev_fields_layout(cfg))
        hash_h = Signal(16)
        clear_profile = Signal()

        m.d.comb += [
            ctl_op_profile.eq(cmd.profile), ctl_op_index.eq(w_index),
            ctl_op_state.eq(w_state), ctl_op_port.eq(w_port),
        ]

        def respond(errno, word=0):
            m.d.sync += [resp.errno.eq(errno), resp.data.eq(word)]
            m.next = "RESPOND"

        with m.FSM(name="control") as control:
            m.d.comb += ctl_busy.eq(~control.ongoing("IDLE"))
            with m.State("IDLE"):
                m.d.comb += self.ctl.ready.eq(1)
                with m.If(self.ctl.valid):
                    m.d.sync += [cmd.eq(self.ctl.payload), generating.eq(0)]
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                # Lets the engine finish the feedback it issued while the command arrived.
                m.d.sync += [
                    w_index.eq(cmd.index), w_port.eq(cmd.port), w_state.eq(cmd.state),
                    value.eq(cmd.value),
                    hash_h.eq(((cmd.qpn ^ self._hash_seed)[:16] * HASH_MULTIPLIER)[16:32]),
                ]
                m.next = "EXEC"
            with m.State("EXEC"):
                with m.Switch(cmd.cmd):
                    with m.Case(PathCommand.PROFILE_SET):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Elif(c_state == ProfileState.ONLINE):
                            respond(Errno.EBUSY)
                        with m.Elif((cmd.mode > EvMode.AUTO) | (cmd.num_evs == 0)):
                            respond(Errno.EINVAL)
                        with m.Elif(cmd.num_evs > n_evs):
                            respond(Errno.E2BIG)
                        with m.Elif(cmd.min_active > cmd.num_evs):
                            respond(Errno.EINVAL)
                        with m.Else():
                            for p in range(n_profiles):
                                with m.If(cmd.profile == p):
                                    m.d.sync += [
                                        p_mode[p].eq(cmd.mode), p_num[p].eq(cmd.num_evs),
                                        p_min[p].eq(cmd.min_active),
                                        p_adaptive[p].eq(cmd.adaptive),
                                        p_recovery[p].eq(cmd.recovery),
                                        p_fate[p].eq(cmd.fate),
                                    ]
                            m.d.comb += clear_profile.eq(1)
                            respond(Errno.OK)
                    with m.Case(PathCommand.PROFILE_STATE):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Elif(((c_state == ProfileState.INIT)
                                     & (cmd.state == ProfileState.OFFLINE))
                                    | ((c_state == ProfileState.OFFLINE)
                                       & (cmd.state == ProfileState.INIT))
                                    | ((c_state == ProfileState.ONLINE)
                                       & (cmd.state == ProfileState.OFFLINE))):
                            m.next = "SET_PROFILE_STATE"
                        with m.Elif((c_state == ProfileState.OFFLINE)
                                    & (cmd.state == ProfileState.ONLINE)):
                            with m.If(c_num == 0):
                                respond(Errno.EINVAL)
                            with m.Elif((c_mode == EvMode.GENERATED) & ~populated):
                                m.d.comb += clear_profile.eq(1)
                                m.d.sync += [generating.eq(1), gen_k.eq(0), gen_port.eq(1),
                                             w_index.eq(0), w_state.eq(EvState.GOOD)]
                                m.next = "GEN_REQ"
                            with m.Elif(~populated | (c_good_count < c_min)):
                                respond(Errno.EINVAL)
                            with m.Else():
                                m.next = "SET_PROFILE_STATE"
                        with m.Else():
                            respond(Errno.EINVAL)
                    with m.Case(PathCommand.ENTRY_WRITE):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Elif((c_state == ProfileState.ONLINE)
                                    & (not self._modify_online)):
                            respond(Errno.EBUSY)
                        with m.Elif(c_mode == EvMode.GENERATED):
                            respond(Errno.EINVAL)
                        with m.Elif(~index_ok):
                            respond(Errno.E2BIG)
                        with m.Elif((cmd.port == 0) | (cmd.port > cfg.ports)
                                    | ((cmd.state != EvState.GOOD)
                                       & (cmd.state != EvState.DENIED))):
                            respond(Errno.EINVAL)
                        with m.Elif((c_state == ProfileState.ONLINE) & floor_blocks
                                    & (cmd.state != EvState.GOOD)):
                            respond(Errno.EBUSY)
                        with m.Else():
                            m.next = "EXP_REQ"
                    with m.Case(PathCommand.ENTRY_STATE):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Elif(~index_ok):
                            respond(Errno.E2BIG)
                        with m.Elif(~ev_state_ok):
                            respond(Errno.EINVAL)
                        with m.Elif(~entry_written):
                            respond(Errno.ENOENT)
                        with m.Elif(floor_blocks & (cmd.state != EvState.GOOD)):
                            respond(Errno.EBUSY)
                        with m.Else():
                            m.d.comb += [ctl_op_valid.eq(1), ctl_op.eq(_Op.SET_STATE)]
                            m.next = "ENGINE"
                    with m.Case(PathCommand.ENTRY_READ):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Elif(~index_ok):
                            respond(Errno.E2BIG)
                        with m.Elif(~entry_written):
                            respond(Errno.ENOENT)
                        with m.Else():
                            m.d.comb += [ctl_op_valid.eq(1), ctl_op.eq(_Op.READ)]
                            m.next = "ENGINE"
                    with m.Case(PathCommand.QP_PROFILE):
                        with m.If(~cmd_profile_ok | (c_state == ProfileState.INIT)):
                            respond(Errno.ENOENT)
                        with m.Elif(cmd.offset >= n_evs):
                            respond(Errno.EINVAL)
                        with m.Else():
                            m.next = "QP_WAIT"
                    with m.Case(PathCommand.PROFILE_READ):
                        with m.If(~cmd_profile_ok):
                            respond(Errno.ENOENT)
                        with m.Else():
                            respond(Errno.OK, Cat(
                                c_state, c_mode, c_adaptive, c_recovery, populated, c_fate,
                                C(0, 8),
                                c_num, C(0, 16 - COUNT_BITS), c_min, C(0, 16 - COUNT_BITS),
                                c_good_count))
                    with m.Default():
                        respond(Errno.EINVAL)

            with m.State("SET_PROFILE_STATE"):
                for p in range(n_profiles):
                    with m.If(cmd.profile == p):
                        m.d.sync += p_state[p].eq(cmd.state)
                respond(Errno.OK)

            # -- GENERATED profile going ONLINE: gen_req(k) -> exp_req(value) -> store -------
            with m.State("GEN_REQ"):
                m.d.comb += [
                    self.gen_req.valid.eq(1),
                    self.gen_req.payload.profile.eq(cmd.profile),
                    self.gen_req.payload.index.eq(gen_k),
                ]
                with m.If(self.gen_req.ready):
                    m.next = "GEN_RESP"
            with m.State("GEN_RESP"):
                m.d.comb += self.gen_resp.ready.eq(1)
                with m.If(self.gen_resp.valid):
                    with m.If(self.gen_resp.payload.errno != Errno.OK):
                        m.d.comb += clear_profile.eq(1)
                        respond(self.gen_resp.payload.errno)
                    with m.Else():
                        m.d.sync += [value.eq(self.gen_resp.payload.value),
                                     w_index.eq(gen_k), w_port.eq(gen_port)]
                        m.next = "EXP_REQ"

            with m.State("EXP_REQ"):
                m.d.comb += [
                    self.exp_req.valid.eq(1),
                    self.exp_req.payload.profile.eq(cmd.profile),
                    self.exp_req.payload.value.eq(value),
                    self.exp_req.payload.tag.eq(w_index),
                ]
                with m.If(self.exp_req.ready):
                    m.next = "EXP_RESP"
            with m.State("EXP_RESP"):
                m.d.comb += self.exp_resp.ready.eq(1)
                with m.If(self.exp_resp.valid):
                    with m.If(self.exp_resp.payload.errno != Errno.OK):
                        with m.If(generating):
                            m.d.comb += clear_profile.eq(1)
                            respond(self.exp_resp.payload.errno)
                        with m.Else():
                            respond(Errno.EINVAL)
                    with m.Else():
                        m.d.sync += w_fields.eq(self.exp_resp.payload.fields)
                        m.next = "STORE"
            with m.State("STORE"):
                m.d.comb += [
                    fields_wr.en.eq(1),
                    fields_wr.addr.eq(Cat(w_index, cmd.profile)),
                    fields_wr.data.fields.eq(w_fields),
                    fields_wr.data.port.eq(w_port),
                    ctl_op_valid.eq(1), ctl_op.eq(_Op.WRITE),
                ]
                with m.If(generating):
                    m.d.sync += [
                        gen_k.eq(gen_k + 1),
                        gen_port.eq(Mux(gen_port == cfg.ports, 1, gen_port + 1)),
                    ]
                    m.next = "GEN_NEXT"
                with m.Else():
                    m.next = "ENGINE"
            with m.State("GEN_NEXT"):
                # The write issued by STORE commits in this cycle.
                with m.If(gen_k == c_num):
                    m.next = "SET_PROFILE_STATE"
                with m.Else():
                    m.next = "GEN_REQ"

            with m.State("ENGINE"):
                # The command's engine operation is in e2 now: its read data is valid.
                respond(Errno.OK, Mux(cmd.cmd == PathCommand.ENTRY_READ,
                                      Cat(entry_state, C(0, 5), cur_port, C(0, 3), cur_penalty),
                                      0))

            with m.State("QP_WAIT"):
                m.d.comb += sel_hold.eq(1)
                with m.If(~s1_valid):
                    m.next = "QP_WRITE"
            with m.State("QP_WRITE"):
                m.d.comb += [
                    sel_hold.eq(1), ctl_qp_we.eq(1), ctl_qp_addr.eq(cmd.qpn),
                    ctl_qp_data.bound.eq(1), ctl_qp_data.profile.eq(cmd.profile),
                    ctl_qp_data.pointer.eq(Mux(c_mode == EvMode.AUTO,
                                               (hash_h * c_num)[16:16 + index_bits],
                                               cmd.offset)),
                ]
                respond(Errno.OK)

            with m.State("RESPOND"):
                m.d.comb += [self.ctl_resp.valid.eq(1), self.ctl_resp.payload.eq(resp)]
                with m.If(self.ctl_resp.ready):
                    m.next = "IDLE"

        # Placed after the engine's updates so that a clear wins (they never coincide: a
        # command clears only while the engine is idle).
        for p in range(n_profiles):
            with m.If(clear_profile & (cmd.profile == p)):
                m.d.sync += [
                    p_good[p].eq(0), p_written[p].eq(0), p_denied[p].eq(0), p_high[p].eq(0),
                    p_good_count[p].eq(0), p_low_count[p].eq(0),
                ]
        return m
