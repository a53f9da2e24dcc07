"""Commands, constants and layouts shared by the path-select components.

:mod:`hdl.path.select` re-exports the public names; the components are
:class:`~hdl.path.profiles.ProfileTable`, :class:`~hdl.path.selector.Selector`,
:class:`~hdl.path.entry.EntrySources`, :class:`~hdl.path.entry.EntryUpdate` and
:class:`~hdl.path.control.PathControl`.
"""

from amaranth import *
from amaranth.lib import data, enum

from ..interfaces import EV_VALUE_BITS, ev_fields_layout
from ..protocol import Errno, EvState

__all__ = [
    "PathCommand", "ProbeRecovery", "EntryOp", "path_command_layout", "path_response_layout",
    "path_event_layout", "auto_index", "entry_read_data", "profile_read_data",
    "binding_layout", "fields_word_layout", "entry_word_layout", "profile_params_layout",
    "entry_op_layout", "entry_commit_layout", "entry_words", "first_set", "choose",
    "PROFILE_ID_BITS", "COUNT_BITS", "EV_PORT_BITS", "COUNTERS",
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
    ENTRY_READ = 4              #: read one EV's state, port, penalty and SKIP mark
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


def entry_read_data(*, state, port, penalty, skip=0):
    """The ``data`` word of an ENTRY_READ response: ``skip`` is the SKIP mark of a GOOD EV
    (MRC 1.0's SKIP state, ``docs/path-select.md``)."""
    return int(state) | port << 8 | penalty << 16 | int(skip) << 24


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


class EntryOp(enum.IntEnum, shape=4):
    """Operations of the entry update pipeline; the first five are
    :class:`~hdl.protocol.FeedbackKind`'s values."""
    ACKED = 0
    ECN = 1
    TRIMMED = 2
    LOST = 3
    PROBE_OK = 4
    DECAY = 5                   #: the decay sweep halves one entry's penalty
    WRITE = 6                   #: ENTRY_WRITE (and generation) stores one entry
    SET_STATE = 7               #: ENTRY_STATE
    READ = 8                    #: ENTRY_READ: read only
    BAD_KIND = 9                #: feedback of a kind outside FeedbackKind: counted, ignored
    FATE = 10                   #: the port fate-sharing sweep visits one EV
    RECOVER = 11                #: the SKIP recovery sweep visits one EV


COUNTERS = ("decisions", "no_path", "feedback_acked", "feedback_ecn", "feedback_trimmed",
            "feedback_lost", "feedback_probe_ok", "feedback_ignored", "state_changes",
            "events_dropped", "fate_sweeps", "fate_marked", "skips", "skip_recoveries")


def first_set(vector, width):
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


def choose(m, registers, index, name):
    """The register of ``registers`` that ``index`` names (zero when out of range)."""
    chosen = Signal(len(registers[0]), name=name)
    with m.Switch(index):
        for number, register in enumerate(registers):
            with m.Case(number):
                m.d.comb += chosen.eq(register)
    return chosen


def binding_layout(config):
    """A QP's binding word: bound, profile, rotation pointer."""
    return data.StructLayout({
        "bound": unsigned(1), "profile": unsigned(config.profile_bits),
        "pointer": unsigned(config.ev_index_bits)})


def fields_word_layout(config):
    """A word of the fields RAM: an EV's expanded fields and its 0-based egress port."""
    return data.StructLayout({
        "fields": ev_fields_layout(config), "port": unsigned(EV_PORT_BITS)})


def entry_word_layout(config):
    """A word of the entry RAM: an EV's port (1..P), penalty and the SKIP recovery epoch in
    which its SKIP mark ends (the mark itself is a bit of the profile table's ``skip``
    bitmap)."""
    return data.StructLayout({
        "port": unsigned(EV_PORT_BITS), "penalty": unsigned(PENALTY_BITS),
        "skip_epoch": unsigned(2)})


def entry_words(config):
    """Words of each EV table RAM: ``ev_profiles * 2**ev_index_bits``, addressed by
    ``{profile, index}``."""
    return config.ev_profiles << config.ev_index_bits


def profile_params_layout(config):
    """A profile's parameters as PROFILE_SET writes them."""
    return data.StructLayout({
        "mode": unsigned(2), "num_evs": unsigned(COUNT_BITS),
        "min_active": unsigned(COUNT_BITS), "adaptive": unsigned(1),
        "recovery": unsigned(1), "fate": unsigned(1)})


def entry_op_layout(config):
    """One operation of the entry update pipeline: which entry, and (for the control's
    operations) the state and port to write. ``bound``: the feedback's QP is bound."""
    return data.StructLayout({
        "op": EntryOp, "profile": unsigned(config.profile_bits),
        "index": unsigned(config.ev_index_bits), "bound": unsigned(1),
        "state": unsigned(3), "port": unsigned(EV_PORT_BITS)})


def entry_commit_layout(config):
    """An entry's new state bits as the entry update writes them into the profile table,
    with the old ``good``, ``fresh`` (good, not SKIP) and ``low`` (good, not high, not SKIP)
    bits for the profile's counts."""
    return data.StructLayout({
        "valid": unsigned(1), "profile": unsigned(config.profile_bits),
        "index": unsigned(config.ev_index_bits),
        "good": unsigned(1), "denied": unsigned(1), "written": unsigned(1), "high": unsigned(1),
        "skip": unsigned(1), "was_fresh": unsigned(1), "was_good": unsigned(1),
        "was_low": unsigned(1)})
