"""The control-plane stand-in's probe schedule (sim.probing.ProbeBackoff)."""

import pytest

from sim.probing import PROBE_CAP_US, PROBE_FIRST_US, ProbeBackoff


def probe_times(backoff, ev, until_us, step_us=0.5):
    times = []
    now = 0.0
    while now <= until_us:
        if ev in backoff.due(now):
            times.append(now)
        now += step_us
    return times


def test_a_suspect_ev_is_probed_soon_then_on_a_doubling_backoff_up_to_the_cap():
    backoff = ProbeBackoff(first_us=2.0, cap_us=16.0)
    backoff.suspect(5, 0.0)
    assert backoff.next_due_us() == 2.0
    # 2, then waits of 4, 8, 16, 16: 2, 6, 14, 30, 46
    assert probe_times(backoff, 5, 50.0) == [2.0, 6.0, 14.0, 30.0, 46.0]
    assert backoff.sent == 5


def test_an_ev_seen_good_again_is_forgotten_and_starts_over_when_suspect_again():
    backoff = ProbeBackoff(first_us=2.0, cap_us=16.0)
    backoff.track({1, 2}, 0.0)
    assert backoff.due(2.0) == [1, 2]
    backoff.track({2}, 3.0)                 # EV 1 answered its probe
    assert backoff.suspects == {2}
    backoff.track({1, 2}, 10.0)             # EV 1 bad again: its first probe soon again
    assert backoff.next_due_us() == 6.0     # EV 2's second probe, 4 us after its first
    assert backoff.due(12.0) == [1, 2]
    assert backoff.next_due_us() == 16.0    # EV 1: 4 us after its second probe; EV 2: 8


def test_suspecting_an_ev_twice_keeps_its_schedule():
    backoff = ProbeBackoff()
    backoff.suspect(3, 0.0)
    backoff.suspect(3, 1.0)
    assert backoff.next_due_us() == PROBE_FIRST_US
    assert ProbeBackoff().next_due_us() is None
    assert PROBE_FIRST_US < PROBE_CAP_US


@pytest.mark.parametrize("kw, field", [({"first_us": 0}, "first_us"),
                                       ({"first_us": 100.0, "cap_us": 50.0}, "first_us"),
                                       ({"cap_us": -1}, "cap_us")])
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        ProbeBackoff(**kw)
