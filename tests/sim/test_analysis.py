"""Steady-state goodput windows of ``report.json`` (sim/analysis.py), on synthetic arrivals.

The traffic below has a known shape: nothing for the first one-way delay, a ramp at half the
rate, a steady level, a failure that halves the rate for a while before it settles at three
quarters, a recovery, and a tail where one sender is left. Each window must start after the
transition before it and end before the next one.
"""

import pytest

from sim.analysis import ramp_up_end_ns, steady_goodput, window_goodput

FRAME = 1000                     # payload bytes per frame
GAP = 1000.0                     # ns between frames at the steady level: 8 Gb/s


def _arrivals(segments):
    """``(arrival_ns, bytes)`` of frames spaced ``gap`` ns apart in each [start, stop)."""
    samples = []
    for start, stop, gap in segments:
        count = round((stop - start) / gap)
        samples += [(start + i * gap, FRAME) for i in range(count)]
    return samples


FIRST = 10_000.0                 # first arrival: the one-way delay
RAMP_END = 20_000.0              # half rate until here
AT, SETTLED, RECOVER, BACK, TAIL, END = 60_000.0, 80_000.0, 140_000.0, 150_000.0, \
    200_000.0, 230_000.0
SAMPLES = _arrivals([
    (FIRST, RAMP_END, 2 * GAP),          # ramp-up
    (RAMP_END, AT, GAP),                 # steady, all planes
    (AT, SETTLED, 2 * GAP),              # the transition: the dead plane's share is stuck
    (SETTLED, RECOVER, GAP / 0.75),      # steady on the planes left
    (RECOVER, BACK, 2 * GAP),            # the recovery's transition
    (BACK, TAIL, GAP),                   # steady again
    (TAIL, END, 2 * GAP),                # one sender left
])
WINDOW = 5_000.0


def test_ramp_up_ends_where_the_steady_level_starts():
    end = ramp_up_end_ns(SAMPLES, AT, WINDOW)
    assert RAMP_END - WINDOW < end <= RAMP_END
    # The ramp-up never takes more than half of the interval before the failure.
    slow = _arrivals([(FIRST, 40_000.0, 4 * GAP), (40_000.0, 50_000.0, GAP)])
    assert ramp_up_end_ns(slow, 50_000.0, WINDOW) == 25_000.0
    assert ramp_up_end_ns([], AT, WINDOW) == AT / 2


def test_a_flat_start_has_no_ramp_up_beyond_the_first_arrival():
    flat = _arrivals([(FIRST, AT, GAP)])
    assert ramp_up_end_ns(flat, AT, WINDOW) <= FIRST


def test_windows_exclude_the_ramp_up_and_both_transitions():
    out = steady_goodput(SAMPLES, at_ns=AT, recover_ns=RECOVER, abandoned_ns=15_000.0,
                         returned_ns=6_000.0, settle_ns=5_000.0, traffic_end_ns=TAIL,
                         directions=1, line_rate_gbps=8.0, window_ns=WINDOW)
    before, during, after = out["before"], out["during"], out["after"]
    assert RAMP_END - WINDOW < before["from_us"] * 1000 <= RAMP_END
    assert before["to_us"] * 1000 == AT
    assert during["from_us"] * 1000 == AT + 15_000.0 + 5_000.0 == SETTLED
    assert during["to_us"] * 1000 == RECOVER
    assert after["from_us"] * 1000 == RECOVER + 6_000.0 + 5_000.0
    assert after["to_us"] * 1000 == TAIL
    assert out["failure_allowance_us"] == 20.0 and out["recovery_allowance_us"] == 11.0
    # Steady levels: 8 Gb/s, 6 Gb/s, 8 Gb/s (to within the frames at a window's edges).
    assert before["goodput_gbps"] == pytest.approx(8.0, rel=0.05)
    assert during["goodput_gbps"] == pytest.approx(6.0, rel=0.02)
    assert after["goodput_gbps"] == pytest.approx(8.0, rel=0.02)
    assert out["during_over_before"] == pytest.approx(0.75, rel=0.05)
    assert out["after_over_before"] == pytest.approx(1.0, rel=0.05)
    assert before["relative_to_line_rate"] == pytest.approx(1.0, rel=0.05)


def test_the_whole_interval_ratio_is_what_the_windows_correct():
    """Taken from time 0 to the failure and from the failure to the recovery, the ramp-up and
    the transition pull both figures down by different amounts."""
    naive = {name: window_goodput(SAMPLES, lo, hi, directions=1, line_rate_gbps=8.0,
                                  min_ns=WINDOW)["goodput_gbps"]
             for name, lo, hi in (("before", 0.0, AT), ("during", AT, RECOVER))}
    assert naive["during"] / naive["before"] != pytest.approx(0.75, rel=0.05)


def test_a_window_shorter_than_the_rolling_window_has_bounds_but_no_rate():
    short = window_goodput(SAMPLES, 30_000.0, 33_000.0, directions=2, line_rate_gbps=8.0,
                           min_ns=WINDOW)
    assert short == {"from_us": 30.0, "to_us": 33.0, "frames": 3, "goodput_gbps": None,
                     "relative_to_line_rate": None}
    assert window_goodput(SAMPLES, None, 1.0, directions=1, line_rate_gbps=8.0,
                          min_ns=WINDOW) is None


def test_no_recovery_before_the_traffic_ends_leaves_no_after_window():
    out = steady_goodput(SAMPLES, at_ns=AT, recover_ns=None, abandoned_ns=15_000.0,
                         returned_ns=None, settle_ns=5_000.0, traffic_end_ns=RECOVER,
                         directions=1, line_rate_gbps=8.0, window_ns=WINDOW)
    assert out["after"] is None and out["after_over_before"] is None
    assert out["recovery_allowance_us"] is None
    assert out["during"]["to_us"] * 1000 == RECOVER
    # A transition that outlasts the failure leaves no steady state during it.
    stuck = steady_goodput(SAMPLES, at_ns=AT, recover_ns=RECOVER, abandoned_ns=78_000.0,
                           returned_ns=0.0, settle_ns=5_000.0, traffic_end_ns=TAIL,
                           directions=1, line_rate_gbps=8.0, window_ns=WINDOW)
    assert stuck["during"]["goodput_gbps"] is None and stuck["during_over_before"] is None
