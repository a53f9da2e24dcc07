"""Path-selection reference model: the rules of EV choice, feedback, the floor and control."""

import math
import random

import pytest

from hdl.config import NicConfig
from hdl.path import ev as evlib
from hdl.path.select import (
    PENALTY_HIGH,
    PENALTY_TRIMMED,
    PathCommand,
    ProbeRecovery,
    auto_index,
)
from hdl.protocol import Errno, EvMode, EvState, FeedbackKind, ProfileState
from sim.model.path import (
    PathModel,
    ReferenceExpander,
    bring_up_commands,
    command,
    fields_of_image,
    udp_ev,
    udp_profile,
)

CONFIG = NicConfig(qps=16, ev_profiles=2, evs_per_profile=64, ports=8)


def chi2_sf(statistic, df):
    """Upper tail of the chi-square distribution (scipy is not installed): the regularized
    upper incomplete gamma Q(df/2, statistic/2), by the series of the lower one."""
    a, x = df / 2, statistic / 2
    term = total = 1 / a
    n = 1
    while term > total * 1e-15:
        term *= x / (a + n)
        total += term
        n += 1
    return 1 - math.exp(-x + a * math.log(x) - math.lgamma(a)) * total


def chi2_uniform(counts):
    expected = sum(counts) / len(counts)
    return sum((c - expected) ** 2 / expected for c in counts)


def make_model(config=CONFIG, **kwargs):
    expander = ReferenceExpander({0: udp_profile(), 1: udp_profile(EvMode.GENERATED)})
    return PathModel(config=config, expander=expander, **kwargs)


def run(model, cmds):
    results = [model.command(cmd) for cmd in cmds]
    for cmd, (errno, _) in zip(cmds, results, strict=True):
        assert errno == Errno.OK, (cmd, errno)
    return results


def test_chi2_sf_matches_the_table():
    # Tabulated critical value of chi-square, 63 degrees of freedom, p = 0.01: 92.010.
    assert chi2_sf(92.010, 63) == pytest.approx(0.01, abs=2e-5)
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1), rel=1e-12)    # closed form, df=2


def test_rotation_starts_at_offset_and_walks_every_ev():
    model = make_model()
    run(model, bring_up_commands(0, 8, ports=4, qpns=(3, 5), offsets=(0, 6)))
    assert [model.select(3).ev for _ in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert [model.select(5).ev for _ in range(4)] == [6, 7, 0, 1]
    decision = model.select(3)
    assert (decision.port, decision.fields["udp_sport"]) == (2 % 4, 0xC000 | 2)


def test_denied_and_assumed_bad_are_skipped_for_data_but_probes_use_their_ev():
    model = make_model()
    states = [EvState.GOOD, EvState.DENIED, EvState.GOOD, EvState.GOOD]
    run(model, bring_up_commands(0, 4, ports=2, states=states, qpns=(1,)))
    run(model, [command(PathCommand.ENTRY_STATE, profile=0, index=2,
                        state=EvState.ASSUMED_BAD)])
    assert {model.select(1).ev for _ in range(20)} == {0, 3}
    assert model.select(1, probe=True, ev=2).no_path == 0
    assert model.select(1, probe=True, ev=2).ev == 2
    assert model.select(1, probe=True, ev=1).no_path == 1


@pytest.mark.parametrize("qpn", [0, 7])
def test_ten_thousand_picks_are_uniform_over_64_evs(qpn):
    model = make_model()
    run(model, bring_up_commands(0, 64, ports=8, qpns=(qpn,), offsets=(qpn * 5,)))
    rng = random.Random(qpn)
    counts = [0] * 64
    for _ in range(10_000):
        avoid = rng.randrange(64) if rng.random() < 0.2 else None
        decision = model.select(qpn, avoid_ev=avoid)
        assert decision.ev != avoid
        counts[decision.ev] += 1
    assert chi2_sf(chi2_uniform(counts), 63) > 0.01


def test_avoid_ev_takes_the_next_usable_unless_it_is_the_only_one():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=2, qpns=(1,)))
    assert model.select(1, avoid_ev=0).ev == 1
    assert model.select(1, avoid_ev=2).ev == 3
    for index in (0, 1, 2):
        run(model, [command(PathCommand.ENTRY_STATE, profile=0, index=index,
                            state=EvState.DENIED)])
    assert model.select(1, avoid_ev=3).ev == 3


def test_lost_storm_never_breaks_the_floor():
    model = make_model()
    run(model, bring_up_commands(0, 16, ports=4, min_active=5, qpns=(2,)))
    rng = random.Random(1)
    for _ in range(500):
        model.feedback(2, rng.randrange(16), FeedbackKind.LOST)
        assert model.usable(0) >= 5
    assert model.usable(0) == 5
    assert model.counters["state_changes"] == 11
    picks = {model.select(2).ev for _ in range(50)}
    assert len(picks) == 5 and all(model.entry(0, i).state == EvState.GOOD for i in picks)


def test_lost_and_probe_events_carry_profile_index_port_and_state():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, qpns=(1,)))
    model.feedback(1, 2, FeedbackKind.LOST)
    model.feedback(1, 2, FeedbackKind.LOST)          # already ASSUMED_BAD: no event
    model.feedback(1, 2, FeedbackKind.PROBE_OK)
    events = [e.as_dict() for e in model.pop_events()]
    assert events == [
        {"profile": 0, "index": 2, "port": 3, "state": EvState.ASSUMED_BAD, "probe_ok": 0},
        {"profile": 0, "index": 2, "port": 3, "state": EvState.GOOD, "probe_ok": 0},
    ]


def test_controller_recovery_only_reports_the_probe():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, qpns=(1,), recovery=ProbeRecovery.CONTROLLER))
    model.feedback(1, 0, FeedbackKind.LOST)
    model.feedback(1, 0, FeedbackKind.PROBE_OK)
    assert model.entry(0, 0).state == EvState.ASSUMED_BAD
    assert [e.probe_ok for e in model.pop_events()] == [0, 1]


def test_event_queue_overflow_counts_drops():
    model = make_model(event_depth=4)
    run(model, bring_up_commands(0, 16, ports=4, qpns=(1,)))
    for index in range(10):
        model.feedback(1, index, FeedbackKind.LOST)
    assert len(model.events) == 4
    assert model.counters["events_dropped"] == 6


def test_failover_kills_every_ev_of_one_port():
    model = make_model()
    run(model, bring_up_commands(0, 64, ports=8, min_active=8, qpns=(0, 1, 2)))
    for index in range(64):
        if index % 8 + 1 == 3:
            model.feedback(index % 3, index, FeedbackKind.LOST)
    assert all(model.select(q % 3).port != 2 for q in range(300))


def test_adaptive_skips_high_penalty_evs_until_they_decay():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=2, qpns=(1,)))
    for _ in range(PENALTY_HIGH // PENALTY_TRIMMED):
        model.feedback(1, 1, FeedbackKind.TRIMMED)
    assert model.entry(0, 1).penalty >= PENALTY_HIGH
    assert 1 not in {model.select(1).ev for _ in range(12)}
    model.decay_tick()
    # The trims marked it SKIP too: two recovery sweeps end the mark.
    assert 1 not in {model.select(1).ev for _ in range(12)}
    model.skip_tick()
    model.skip_tick()
    assert 1 in {model.select(1).ev for _ in range(12)}


def test_ecn_or_a_trim_marks_a_good_ev_skip_for_one_to_two_recovery_sweeps():
    """MRC 1.0's SKIP: ECN (a SACK's m = SKIP_ONCE) or a trim on a GOOD EV marks it SKIP; an
    adaptive profile passes it over, ENTRY_READ reports it (bit 24), and time-based recovery
    ends it: the second recovery sweep after the mark clears it, not the first. A LOST
    that takes the EV out clears the mark (it is ASSUMED_BAD now, not SKIP)."""
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=1, qpns=(1,)))
    model.feedback(1, 2, FeedbackKind.ECN)
    model.feedback(1, 3, FeedbackKind.TRIMMED)
    assert model.entry(0, 2).skip and model.entry(0, 3).skip
    assert model.entry(0, 2).penalty < PENALTY_HIGH            # not the penalty's doing
    errno, data = model.command(command(PathCommand.ENTRY_READ, profile=0, index=2))
    assert errno == Errno.OK and data >> 24 & 1 == 1
    assert {model.select(1).ev for _ in range(12)} == {0, 1}
    model.skip_tick()
    assert {model.select(1).ev for _ in range(12)} == {0, 1}
    model.feedback(1, 3, FeedbackKind.ECN)                      # renewed: two more sweeps
    model.skip_tick()
    assert {model.select(1).ev for _ in range(12)} == {0, 1, 2}
    assert model.counters["skips"] == 2                         # a renewal is not a new mark
    assert model.counters["skip_recoveries"] == 1
    model.feedback(1, 3, FeedbackKind.LOST)
    assert not model.entry(0, 3).skip and model.entry(0, 3).state == EvState.ASSUMED_BAD
    model.feedback(1, 3, FeedbackKind.ECN)                      # not GOOD: no mark
    assert not model.entry(0, 3).skip
    errno, data = model.command(command(PathCommand.ENTRY_READ, profile=0, index=2))
    assert data >> 24 & 1 == 0


def test_skip_is_honoured_without_adaptive_but_not_by_auto_profiles():
    """SKIP is MRC 1.0's, not the penalties': a profile without ``adaptive`` passes SKIP EVs
    over too (while at least half the usable EVs are unmarked), an AUTO profile keeps each QP
    on its hashed EV (the single-path baseline)."""
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, min_active=1, qpns=(1,)))
    model.feedback(1, 1, FeedbackKind.ECN)
    assert {model.select(1).ev for _ in range(12)} == {0, 2, 3}
    for ev in (0, 2):
        model.feedback(1, ev, FeedbackKind.ECN)
    assert {model.select(1).ev for _ in range(12)} == {0, 1, 2, 3}      # 1 of 4 unmarked
    auto = make_model()
    run(auto, bring_up_commands(0, 4, ports=4, mode=EvMode.AUTO, min_active=1, qpns=(1,)))
    hashed = auto.select(1).ev
    auto.feedback(1, hashed, FeedbackKind.ECN)
    assert auto.entry(0, hashed).skip
    assert {auto.select(1).ev for _ in range(6)} == {hashed}


def test_skip_recovery_follows_the_clock_with_advance_to():
    """``advance_to(cycle)`` applies the recovery sweeps the hardware starts every
    ``2**skip_shift`` cycles, however far the clock jumps."""
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=1, qpns=(1,)))
    period = 1 << model.skip_shift
    model.advance_to(5 * period + 3)
    model.feedback(1, 2, FeedbackKind.ECN)
    model.advance_to(6 * period)                # one sweep: still marked
    assert model.entry(0, 2).skip
    model.advance_to(7 * period - 1)
    assert model.entry(0, 2).skip
    model.advance_to(7 * period)                # the second: cleared
    assert not model.entry(0, 2).skip
    model.feedback(1, 2, FeedbackKind.ECN)
    model.advance_to(1000 * period + 1)         # a long jump clears it too
    assert not model.entry(0, 2).skip
    assert model.counters["skip_recoveries"] == 2


def test_adaptive_uses_high_penalty_evs_when_too_few_low_ones_remain():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, adaptive=1, min_active=3, qpns=(1,)))
    for index in (0, 1):
        for _ in range(2):
            model.feedback(1, index, FeedbackKind.TRIMMED)
    assert {model.select(1).ev for _ in range(12)} == {0, 1, 2, 3}


def test_auto_mode_keeps_one_ev_per_qp_and_spreads_qps():
    config = NicConfig(qps=256, ev_profiles=1, evs_per_profile=64)
    model = PathModel(config=config, expander=ReferenceExpander({0: udp_profile()}))
    run(model, bring_up_commands(0, 64, ports=8, mode=EvMode.AUTO, qpns=range(256)))
    chosen = {}
    for qpn in range(256):
        picks = {model.select(qpn).ev for _ in range(5)}
        assert picks == {auto_index(qpn, 64)}
        chosen[qpn] = picks.pop()
    assert len(set(chosen.values())) > 48


def test_generated_profile_generates_its_array_going_online():
    model = make_model()
    run(model, bring_up_commands(1, 12, ports=8, mode=EvMode.GENERATED, qpns=(4,)))
    definition = udp_profile(EvMode.GENERATED)
    entries = evlib.generate_entries(definition, 12, num_ports=8)
    for index, (ev, port) in enumerate(entries):
        entry = model.entry(1, index)
        assert entry.port == port
        assert entry.fields == fields_of_image(definition.format, evlib.expand(definition, ev))


def test_generated_profile_with_too_few_evs_is_refused_with_e2big():
    expander = ReferenceExpander({0: udp_profile(EvMode.GENERATED, max_val=9)})
    model = PathModel(config=CONFIG, expander=expander)
    cmds = bring_up_commands(0, 12, ports=8, mode=EvMode.GENERATED)
    assert [model.command(c)[0] for c in cmds] == [Errno.OK, Errno.OK, Errno.E2BIG]
    assert model.profiles[0].state == ProfileState.OFFLINE
    assert not any(entry.written for entry in model.profiles[0].entries)


def test_entry_write_checks():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4))
    write = dict(profile=0, index=0, value=udp_ev(0), port=1, state=EvState.GOOD)
    assert model.command(command(PathCommand.ENTRY_WRITE, **write))[0] == Errno.EBUSY
    run(model, [command(PathCommand.PROFILE_STATE, profile=0, state=ProfileState.OFFLINE)])
    cases = [
        (dict(profile=5), Errno.ENOENT),
        (dict(index=4), Errno.E2BIG),
        (dict(port=0), Errno.EINVAL),
        (dict(port=CONFIG.ports + 1), Errno.EINVAL),
        (dict(state=EvState.ASSUMED_BAD), Errno.EINVAL),
        (dict(value=udp_ev(1) | 1), Errno.EINVAL),          # a 1 after the consumed bits
        (dict(state=EvState.DENIED), Errno.OK),
    ]
    for change, errno in cases:
        assert model.command(command(PathCommand.ENTRY_WRITE, **{**write, **change}))[0] == errno


def test_modify_online_allows_writes_but_keeps_the_floor():
    model = make_model(modify_online=True)
    run(model, bring_up_commands(0, 2, ports=2, min_active=2))
    write = dict(profile=0, index=1, value=udp_ev(1), port=2)
    assert model.command(command(PathCommand.ENTRY_WRITE, **write,
                                 state=EvState.GOOD))[0] == Errno.OK
    assert model.command(command(PathCommand.ENTRY_WRITE, **write,
                                 state=EvState.DENIED))[0] == Errno.EBUSY


def test_not_fully_populated_explicit_profile_cannot_go_online():
    model = make_model()
    cmds = bring_up_commands(0, 4, ports=4)
    del cmds[4]                                         # the write of index 2
    errnos = [model.command(c)[0] for c in cmds]
    assert errnos[-1] == Errno.EINVAL and set(errnos[:-1]) == {Errno.OK}


def test_profile_read_and_entry_read():
    model = make_model()
    run(model, bring_up_commands(0, 4, ports=4, min_active=1, adaptive=1))
    model.bindings[0] = [0, 0]
    model.feedback(0, 3, FeedbackKind.TRIMMED)
    errno, word = model.command(command(PathCommand.ENTRY_READ, profile=0, index=3))
    # The trim marked the GOOD EV SKIP too (bit 24).
    assert errno == Errno.OK and word == EvState.GOOD | 4 << 8 | PENALTY_TRIMMED << 16 | 1 << 24
    errno, word = model.command(command(PathCommand.PROFILE_READ, profile=0))
    assert word & 3 == ProfileState.ONLINE and (word >> 4) & 1 == 1 and (word >> 6) & 1 == 1
    assert (word >> 16) & 0xFFFF == 4 and (word >> 32) & 0xFFFF == 1
    assert (word >> 48) & 0xFFFF == 4


# (from, to, errno): every pair of profile states, plus an undefined target.
TRANSITIONS = [
    (ProfileState.INIT, ProfileState.INIT, Errno.EINVAL),
    (ProfileState.INIT, ProfileState.OFFLINE, Errno.OK),
    (ProfileState.INIT, ProfileState.ONLINE, Errno.EINVAL),
    (ProfileState.OFFLINE, ProfileState.INIT, Errno.OK),
    (ProfileState.OFFLINE, ProfileState.OFFLINE, Errno.EINVAL),
    (ProfileState.OFFLINE, ProfileState.ONLINE, Errno.OK),
    (ProfileState.ONLINE, ProfileState.INIT, Errno.EINVAL),
    (ProfileState.ONLINE, ProfileState.OFFLINE, Errno.OK),
    (ProfileState.ONLINE, ProfileState.ONLINE, Errno.EINVAL),
    (ProfileState.OFFLINE, 3, Errno.EINVAL),
]
# Commands that take a fully written 2-EV profile from INIT to each state.
REACH = {
    ProfileState.INIT: [],
    ProfileState.OFFLINE: [ProfileState.OFFLINE],
    ProfileState.ONLINE: [ProfileState.OFFLINE, ProfileState.ONLINE],
}


def transition_commands(start, target):
    cmds = bring_up_commands(0, 2, ports=2)[:1] + [
        c for c in bring_up_commands(0, 2, ports=2) if c["cmd"] == PathCommand.ENTRY_WRITE]
    cmds += [command(PathCommand.PROFILE_STATE, profile=0, state=s) for s in REACH[start]]
    return cmds, command(PathCommand.PROFILE_STATE, profile=0, state=target)


@pytest.mark.parametrize("start, target, errno", TRANSITIONS)
def test_profile_state_machine(start, target, errno):
    model = make_model()
    setup, cmd = transition_commands(start, target)
    run(model, setup)
    assert model.profiles[0].state == start
    assert model.command(cmd)[0] == errno
    assert model.profiles[0].state == (target if errno == Errno.OK else start)


def test_online_needs_ev_min_active_usable():
    model = make_model()
    cmds = bring_up_commands(0, 4, ports=4, min_active=3,
                             states=[EvState.GOOD, EvState.DENIED, EvState.DENIED, EvState.GOOD])
    errnos = [model.command(c)[0] for c in cmds]
    assert errnos[-1] == Errno.EINVAL and set(errnos[:-1]) == {Errno.OK}


def test_profile_set_checks():
    model = make_model()
    base = dict(profile=0, mode=EvMode.EXPLICIT, num_evs=4, min_active=1)
    cases = [
        (dict(profile=2), Errno.ENOENT),
        (dict(mode=3), Errno.EINVAL),
        (dict(num_evs=0, min_active=0), Errno.EINVAL),
        (dict(num_evs=65), Errno.E2BIG),
        (dict(min_active=5), Errno.EINVAL),
        ({}, Errno.OK),
    ]
    for change, errno in cases:
        assert model.command(command(PathCommand.PROFILE_SET, **{**base, **change}))[0] == errno


def test_qp_binding_needs_a_profile_out_of_init():
    model = make_model()
    run(model, [command(PathCommand.PROFILE_SET, profile=0, num_evs=2)])
    bind = command(PathCommand.QP_PROFILE, profile=0, qpn=1)
    assert model.command(bind)[0] == Errno.ENOENT
    run(model, [command(PathCommand.PROFILE_STATE, profile=0, state=ProfileState.OFFLINE)])
    assert model.command(bind)[0] == Errno.OK
    assert model.select(1).no_path == 1                 # bound, but the profile is OFFLINE
    assert model.command(command(PathCommand.QP_PROFILE, profile=0, qpn=1,
                                 offset=64))[0] == Errno.EINVAL


def test_entry_state_keeps_the_floor_and_needs_a_written_entry():
    model = make_model()
    run(model, bring_up_commands(0, 3, ports=2, min_active=2))
    cmd = dict(profile=0, state=EvState.DENIED)
    assert model.command(command(PathCommand.ENTRY_STATE, index=0, **cmd))[0] == Errno.OK
    assert model.command(command(PathCommand.ENTRY_STATE, index=1, **cmd))[0] == Errno.EBUSY
    assert model.command(command(PathCommand.ENTRY_STATE, index=3, **cmd))[0] == Errno.E2BIG
    assert model.command(command(PathCommand.ENTRY_STATE, index=1, profile=0,
                                 state=3))[0] == Errno.EINVAL
    # Moving between two unusable states does not touch the floor.
    assert model.command(command(PathCommand.ENTRY_STATE, index=0, profile=0,
                                 state=EvState.ASSUMED_BAD))[0] == Errno.OK
    run(model, [command(PathCommand.PROFILE_SET, profile=1, num_evs=2),
                command(PathCommand.PROFILE_STATE, profile=1, state=ProfileState.OFFLINE)])
    assert model.command(command(PathCommand.ENTRY_STATE, profile=1, index=0,
                                 state=EvState.GOOD))[0] == Errno.ENOENT
