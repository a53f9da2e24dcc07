# amaranth: UnusedElaboratable=no
"""PortWatch (``hdl/path/watch.py``) against its model, cycle by cycle, for tens of thousands
of cycles: the Amaranth testbench runs on a Verilator model of the unit (the ``on_verilator``
fixture, :mod:`sim.tb.verilated`).

The unit's inputs are strobes (a send, an ACK), not streams: it never stalls, so there is no
backpressure to apply; the random tests space the strobes with random idle cycles instead.
"""

import random

import pytest
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.path.watch import (
    WATCH_DEPTH,
    WATCH_UNIT_SHIFT,
    PortWatch,
    echo_time_ns,
    watch_quiet_frames,
)
from sim.model.watch import PortWatchModel

pytestmark = pytest.mark.usefixtures("on_verilator")

UNIT = 1 << WATCH_UNIT_SHIFT
NS_PER_CYCLE = 8


def clock(cycle, start_ns=1_000_000, jump=None):
    """The time (ns) at ``cycle``; ``jump`` = (cycle, ns): time leaps ahead there (an idle
    spell, without simulating its cycles)."""
    now = start_ns + cycle * NS_PER_CYCLE
    if jump is not None and cycle >= jump[0]:
        now += jump[1]
    return now


def run(ports, script, *, window, quiet=0, cycles, depth=WATCH_DEPTH, start_ns=1_000_000,
        jump=None):
    """Drive ``script``: {cycle: [("send", port) | ("ack", port, echo_ns) | ("rx", port)]}
    (``rx``: a frame of another kind arrived on the port) into the unit and
    the model (the model polled every cycle); an ACK echoes the 16-bit wire timestamp of
    ``echo_ns`` (as a SACK's CC_STATE does). Returns (unit reports, model reports, counters)
    with reports as (cycle, port 1..P)."""
    dut = PortWatch(ports=ports, depth=depth)
    model = PortWatchModel(ports, depth=depth)
    model.window, model.quiet = window, quiet
    got, want, counters = [], [], {}

    async def bench(ctx):
        ctx.set(dut.window, window)
        ctx.set(dut.quiet, quiet)
        for cycle in range(cycles):
            now = clock(cycle, start_ns, jump)
            ctx.set(dut.now_ns, now & 0xFFFF_FFFF)
            ctx.set(dut.sent_valid, 0)
            ctx.set(dut.ack_valid, 0)
            ctx.set(dut.rx_valid, 0)
            for item in script.get(cycle, ()):
                if item[0] == "rx":
                    ctx.set(dut.rx_valid, 1)
                    ctx.set(dut.rx_port, item[1])
                    model.arrived(item[1], now)
                elif item[0] == "send":
                    ctx.set(dut.sent_valid, 1)
                    ctx.set(dut.sent_port, item[1])
                    ctx.set(dut.sent_ts, now & 0xFFFF_FFFF)
                    model.sent(item[1], now)
                else:
                    ctx.set(dut.ack_valid, 1)
                    ctx.set(dut.ack_port, item[1])
                    echo = P.wire_timestamp(item[2])
                    ctx.set(dut.ack_echo, echo)
                    want.extend((cycle, p) for p in model.ack(item[1], echo, now))
            want.extend((cycle, p) for p in model.poll(now))
            await ctx.tick()
            if ctx.get(dut.down_valid):
                got.append((cycle, ctx.get(dut.down_port)))
        counters["downs"] = ctx.get(dut.downs)
        counters["overflows"] = ctx.get(dut.overflows)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got, want, counters, model


def same_reports(got, want, ports):
    """The unit reports the model's ports in order, each within ``ports`` + 3 cycles."""
    assert [p for _, p in got] == [p for _, p in want]
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert w <= g <= w + ports + 3, (got, want)


def traffic(ports, cycles, *, dead=None, dead_from=0, rtt_cycles=(1500, 2500), gap=40,
            seed=0, start_ns=1_000_000, jump=None, frames=True):
    """Sends sprayed over the ports every ``gap`` cycles (jittered); every send on a live
    port is ACKed on its port a random round trip later, echoing its time; from
    ``dead_from`` the sends on port ``dead`` get no ACK. Each ACK also arrives as a frame
    (``rx``, counted for the quiet rule), as in the NIC, unless ``frames`` is false."""
    rng = random.Random(seed)
    script = {}
    cycle = 0
    port = 0
    while cycle < cycles:
        script.setdefault(cycle, []).append(("send", port))
        if port != dead or cycle < dead_from:
            at = cycle + rng.randint(*rtt_cycles)
            while any(item[0] == "ack" for item in script.get(at, ())):
                at += 1                                 # one ACK per cycle, as the unit takes
            script.setdefault(at, []).append(("ack", port, clock(cycle, start_ns, jump)))
            if frames:
                script[at].append(("rx", port))
        port = (port + 1) % ports
        cycle += rng.randint(gap // 2, gap + gap // 2)
        if jump is not None and at >= jump[0] > cycle:
            cycle = jump[0] + 2_000         # nothing is sent during the idle spell
    return script


def test_a_dead_port_is_reported_once_and_live_ports_never():
    """Eight ports, ACKs coming back 12-20 us after their sends; port 5 stops answering at
    cycle 20,000. With a 24 us window and 8 us of quiet it alone is reported, once, within
    the window plus a round trip of its last answered send; the model agrees cycle for
    cycle (within the unit's scan). Sends go on (nothing here steers them away, as path
    selection would), so it is reported again each time fresh sends lag by the window."""
    script = traffic(8, 40_000, dead=5, dead_from=20_000, seed=1)
    got, want, counters, _ = run(8, script, window=24, quiet=8, cycles=42_000)
    same_reports(got, want, 8)
    assert got and {p for _, p in got} == {6}
    # The first unanswered send is at or after cycle 20,000 (within one round of the 8
    # ports); the report comes once an echo 24 units (3,072 cycles) newer has come back.
    assert 20_000 + 3_072 + 1_500 <= got[0][0] <= 20_000 + 8 * 60 + 3_072 + 2_500 + 60
    cycles = [c for c, _ in got]
    assert all(b - a >= 3_072 for a, b in zip(cycles, cycles[1:], strict=False))
    assert counters == {"downs": len(got), "overflows": 0}


def test_a_slow_port_that_still_answers_is_not_reported_while_quiet_holds():
    """Port 2's queue builds up from cycle 6,000 until its round trip is 30 us longer than the
    others': from then on its oldest send lags the newest echo by more than the window, but
    its ACKs keep coming, so with a quiet time longer than its ACK spacing it is never
    reported; without the quiet condition (0) the lag alone reports it."""
    rng = random.Random(2)
    script = {}
    for cycle in range(0, 30_000, 37):
        port = (cycle // 37) % 4
        script.setdefault(cycle, []).append(("send", port))
        extra = min(3_750, max(0, cycle - 6_000) // 2) if port == 2 else 0
        rtt = rng.randint(1500, 1800) + extra
        script.setdefault(cycle + rtt, []).extend([("ack", port, 1_000_000 + cycle * 8),
                                                   ("rx", port)])
    got, want, counters, _ = run(4, script, window=16, quiet=8, cycles=36_000)
    same_reports(got, want, 4)
    assert got == []
    got, want, counters, _ = run(4, script, window=16, quiet=0, cycles=36_000)
    same_reports(got, want, 4)
    assert got and {p for _, p in got} == {3}
    assert counters["downs"] == len(got)


def test_coalesced_acks_with_frames_arriving_report_only_the_dead_port():
    """ACKs coalesced: each answers one send in seven, on that send's port, so a live port's
    sends stay uncovered for tens of microseconds and its oldest one lags the newest echo by
    more than the window. The peer's frames (its data, traffic both ways) still arrive on every
    live port every few microseconds, so only port 1, dead from cycle 8,000 (nothing arrives
    on it and none of its sends is ACKed), is reported. With no frames but the ACKs (traffic
    one way) a live port goes longer than ``quiet`` without a frame, but the other ports
    receive only a few frames meanwhile, never ``watch_quiet_frames``: again only the dead
    port is reported."""
    rng = random.Random(4)
    script = {}
    dead, dead_from = 1, 8_000
    for n, cycle in enumerate(range(0, 30_000, 40)):
        port = n % 4
        script.setdefault(cycle, []).append(("send", port))
        alive = port != dead or cycle < dead_from
        if alive and n % 7 == 5:                # one send in 7 ACKed: every port in turn
            at = cycle + rng.randint(1500, 2500)
            while any(item[0] == "ack" for item in script.get(at, ())):
                at += 1
            script.setdefault(at, []).append(("ack", port, clock(cycle)))
    with_rx = {cycle: list(items) for cycle, items in script.items()}
    for n, cycle in enumerate(range(13, 32_000, 40)):      # the peer's frames
        port = n % 4
        if port != dead or cycle < dead_from:
            with_rx.setdefault(cycle, []).append(("rx", port))
    got, want, counters, _ = run(4, with_rx, window=8, quiet=4, cycles=32_000)
    same_reports(got, want, 4)
    assert got and {p for _, p in got} == {dead + 1}
    assert got[0][0] > dead_from
    acks_only = {cycle: list(items) + [("rx", item[1]) for item in items if item[0] == "ack"]
                 for cycle, items in script.items()}
    got, want, counters, _ = run(4, acks_only, window=8, quiet=4, cycles=32_000)
    same_reports(got, want, 4)
    assert got and {p for _, p in got} == {dead + 1}
    assert got[0][0] > dead_from


@pytest.mark.parametrize("ports", [2, 4, 8])
def test_a_silent_port_is_quiet_only_once_the_others_received_the_frame_count(ports):
    """Port 0 heard a frame, then nothing, and its send lags an echo on port 1 by more than
    the window; its silence passes ``quiet`` long before the others' frames come in. While the
    other ports have received fewer than ``watch_quiet_frames(ports)`` frames since port 0's
    last one it is not reported; the frame that completes the count reports it (within the
    scan); a frame on port 0 meanwhile starts the count again."""
    need = watch_quiet_frames(ports)
    assert need == 4 * ports

    def script(count, reset_at=None):
        out = {
            0: [("send", 0)],
            5: [("rx", 0)],
            200: [("send", 1)],
            # Port 1's send made the round trip: port 0's send lags by more than a unit.
            300: [("ack", 1, clock(200)), ("rx", 1)],
        }
        # The other ports' frames (port 1's ACK above is the first), from well after quiet.
        for n in range(count - 1):
            out.setdefault(2_000 + 40 * n, []).append(("rx", 1 + n % (ports - 1)))
        if reset_at is not None:
            out.setdefault(reset_at, []).append(("rx", 0))
        return out

    last = 2_000 + 40 * (need - 2)
    cycles = last + 2_000
    got, want, _, _ = run(ports, script(need - 1), window=1, quiet=2, cycles=cycles)
    assert got == want == []
    got, want, _, _ = run(ports, script(need), window=1, quiet=2, cycles=cycles)
    same_reports(got, want, ports)
    assert [p for _, p in got] == [1]
    assert last <= got[0][0] <= last + ports + 3
    got, want, _, _ = run(ports, script(need, reset_at=last - 20), window=1, quiet=2,
                          cycles=cycles)
    assert got == want == []
    # Without the quiet condition the lag alone reports it, whatever the frames.
    got, want, _, _ = run(ports, script(need - 1), window=1, quiet=0, cycles=cycles)
    same_reports(got, want, ports)
    assert [p for _, p in got] == [1] and got[0][0] < 2_000


def test_window_zero_is_off_and_reports_write_the_sends_off():
    """Window 0 reports nothing. After a report the port's sends are written off: a port
    that stays silent is reported again only once new sends lag by the window."""
    script = traffic(4, 30_000, dead=1, dead_from=5_000, seed=3, gap=60)
    got, want, counters, _ = run(4, script, window=0, cycles=32_000)
    assert got == want == [] and counters["downs"] == 0
    got, want, counters, _ = run(4, script, window=8, quiet=4, cycles=32_000)
    same_reports(got, want, 4)
    assert {p for _, p in got} == {2}
    # Sends every ~4 x 60 cycles on the dead port: each report needs its own fresh lag of
    # 8 units (1,024 cycles), so reports are at least that far apart.
    cycles = [c for c, _ in got]
    assert len(cycles) >= 5
    assert all(b - a >= 1_024 for a, b in zip(cycles, cycles[1:], strict=False))


def test_overflow_is_counted_and_old_echoes_cover_nothing():
    """More sends than the FIFO holds are counted (the port then looks younger, never older);
    an echo older than every send neither covers sends nor reports anything; an ACK on a port
    beyond P is ignored."""
    script = {c: [("send", 0)] for c in range(0, 20 * 10, 10)}      # 20 sends, depth 16
    script.setdefault(300, []).append(("ack", 1, 1_000_000 - 10_000))   # before any send
    script.setdefault(310, []).append(("ack", 7, 1_000_000 + 100))          # no port 7
    got, want, counters, model = run(4, script, window=1, cycles=2_000, depth=16)
    assert counters["overflows"] == 4 == model.counters["port_watch_overflows"]
    assert got == want == []
    assert [echo_time_ns(1_000_000 + 300 * 8, P.wire_timestamp(1_000_000 - 10_000))] == \
        [1_000_000 - 10_000 + 7]         # an echo stands for the last ns of its 8 ns unit
    # A genuine echo 1.024 us after the first send reports port 0 (its first send lags).
    script.setdefault(400, []).append(("ack", 1, 1_000_000 + 199 * 8 + UNIT))
    script.setdefault(150, []).append(("send", 1))
    got, want, counters, _ = run(4, script, window=1, cycles=2_000, depth=16)
    same_reports(got, want, 4)
    assert [p for _, p in got] == [1]


@pytest.mark.parametrize("seed", [4, 5, 6, 7])
def test_random_traffic_matches_the_model(seed):
    """Random spacing, round trips, dead port and time of death, window (above the round
    trips' spread, so only the dead port lags) and quiet time: the unit reports what the model
    reports, each within its scan."""
    rng = random.Random(seed)
    ports = rng.choice([2, 4, 8])
    rtt = rng.randint(600, 3_000)
    # Fewer sends in flight per port than the FIFO holds (the unit pops one covered send per
    # cycle, the model all at once: only a full FIFO could tell them apart).
    gap = rng.randint(max(8, rtt // (12 * ports)), 80 + rtt // (12 * ports))
    dead = rng.randrange(ports)
    script = traffic(ports, 25_000, dead=dead, dead_from=rng.randrange(20_000),
                     rtt_cycles=(400, rtt), gap=gap, seed=seed)
    spread = ((rtt - 400) + ports * gap * 3 // 2) * NS_PER_CYCLE // UNIT + 1
    got, want, counters, _ = run(ports, script, window=spread + rng.randint(1, 8),
                                 quiet=rng.randint(0, 6), cycles=28_000)
    same_reports(got, want, ports)
    assert got and {p for _, p in got} == {dead + 1}
    assert counters["downs"] == len(got)


@pytest.mark.parametrize("start_ns", [
    (1 << 22) - 60_000,         # the 64 ns stamps wrap (16 bits: every 4.19 ms) mid-run
    (1 << 26) - 80_000,         # the 1.024 us ACK arrival counts wrap (every 67.1 ms)
    (1 << 32) - 100_000,        # the ns time itself wraps (every 4.29 s)
])
def test_reports_are_unchanged_across_the_wraps_of_stamps_and_counts(start_ns):
    """Sends, echoes and ACK arrivals are kept as 16-bit stamps and counts, compared modulo
    2**16: a run that crosses a wrap reports the dead port as one that does not, and the
    model (which keeps the same stamps) agrees."""
    def reports(start):
        script = traffic(4, 24_000, dead=2, dead_from=8_000, seed=8, gap=50, start_ns=start)
        got, want, counters, _ = run(4, script, window=12, quiet=4, cycles=26_000,
                                     start_ns=start)
        same_reports(got, want, 4)
        return got
    got = reports(start_ns)
    assert got and {p for _, p in got} == {3}
    # The same traffic far from any wrap, shifted by a whole number of stamps and counts.
    shift = 1 << 26
    plain = reports(start_ns - shift if start_ns > shift else start_ns + shift)
    assert [p for _, p in got] == [p for _, p in plain]
    assert all(abs(a - b) <= 4 + 3 for (a, _), (b, _) in zip(got, plain, strict=True))


def test_quiet_counts_whole_units_without_cutting_the_quiet_time_short():
    """ACK arrivals are kept in whole 1.024 us units. An ACK heard at the very end of a unit
    must still leave the port a full ``quiet`` of real silence before it is reported: with
    quiet 2 (2,048 ns, 256 cycles) and the last ACK on port 0 at cycle 250 (1,016 ns into its
    unit), the report comes no earlier than cycle 506, and at most one unit and a scan
    later."""
    start = 1_024_000 + 1_016 - 250 * NS_PER_CYCLE      # cycle 250 ends a unit
    script = {
        0: [("send", 0)],
        200: [("send", 1)],
        # An ACK on port 0 for something older than its send: heard, but nothing covered.
        250: [("ack", 0, start - 5_000)],
        # Port 1's send made the round trip: port 0's send now lags by more than a unit.
        300: [("ack", 1, start + 200 * NS_PER_CYCLE), ("rx", 1)],
    }
    # Port 1 receives the frames that let port 0 be quiet, long before its time is up.
    for n in range(1, watch_quiet_frames(2)):
        script[300 + 10 * n] = [("rx", 1)]
    got, want, _, _ = run(2, script, window=1, quiet=2, cycles=1_000, start_ns=start)
    same_reports(got, want, 2)
    assert [p for _, p in got] == [1]
    assert 250 + 256 <= got[0][0] <= 250 + 3 * 128 + 2 + 3


@pytest.mark.parametrize("idle_ms", [1.5, 3.0, 5.0])
def test_after_an_idle_spell_fresh_sends_are_not_reported_but_a_dead_port_still_is(idle_ms):
    """Traffic, then nothing sent or answered for ``idle_ms`` (past the point where the 64 ns
    stamps' modulo comparison turns an old ``newest`` into a future one: 2.1 ms), then
    traffic again. The old newest echo is stale: fresh sends are not measured against it, so
    no live port is reported when traffic resumes; a port that dies later is still found."""
    jump = (6_000, int(idle_ms * 1e6))
    script = traffic(4, 24_000, seed=9, gap=50, jump=jump)
    got, want, counters, _ = run(4, script, window=12, quiet=4, cycles=26_000, jump=jump)
    same_reports(got, want, 4)
    assert got == []
    script = traffic(4, 24_000, dead=1, dead_from=14_000, seed=9, gap=50, jump=jump)
    got, want, counters, _ = run(4, script, window=12, quiet=4, cycles=26_000, jump=jump)
    same_reports(got, want, 4)
    assert got and {p for _, p in got} == {2} and got[0][0] >= 14_000


@pytest.mark.parametrize("kwargs, message", [
    ({"ports": 0}, "ports must be an integer in 1..16"),
    ({"ports": 17}, "ports must be an integer in 1..16"),
    ({"ports": 4, "depth": 1}, "depth must be an integer in 2..1024"),
])
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PortWatch(**kwargs)

