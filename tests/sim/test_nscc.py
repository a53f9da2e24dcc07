"""NSCC in the model requester (``sim/model/nscc.py``): one rule per test, against values
computed by hand from UET's parameters; the requester's window under it; the default that the
RTL equivalence tests rely on."""

import math
import random

import pytest

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.transport.req_defs import RequesterCommand
from sim.model.nscc import Nscc, NsccParameters, NsccSetting, setting_for
from sim.model.requester import RequesterModel
from sim.scenario import nic_config_for, scenario

MTU = 4096
#: The reference network itself: a = b = 1, so each parameter is its bare formula.
REFERENCE = NsccSetting(line_rate_gbps=100.0, base_rtt_ns=12_000.0, mtu=MTU)
BDP = 150_000.0                 # 100 Gb/s x 12 us
ALPHA = 4 * MTU / 12_000        # 4 MSS a b / target, per ns
FI = 5 * MTU
ETA = 0.15 * MTU
MAX_WINDOW = 1.5 * BDP


def fresh():
    """An NSCC whose base RTT is set (12 us) by one ACK at t = 100 ns with no queueing."""
    cc = Nscc(REFERENCE, 0.0)
    cc.on_ack(100.0, MTU, 12_000.0, False)
    return cc


def test_parameters_of_the_reference_network():
    p = NsccParameters(REFERENCE)
    assert (p.bdp, p.a, p.target_ns, p.b) == (BDP, 1.0, 12_000.0, 1.0)
    assert p.alpha == pytest.approx(ALPHA)
    assert (p.fi, p.eta, p.fi_scale) == (pytest.approx(FI), pytest.approx(ETA), 0.25)
    assert (p.max_window, p.min_window) == (MAX_WINDOW, MTU)
    assert Nscc(REFERENCE).cwnd == BDP


@pytest.mark.parametrize("seed", range(4))
def test_parameters_scale_with_the_bdp_and_the_target(seed):
    """a = BDP / 150 kB; the target is 0.75 RTT with trimming, 1 RTT without; b = target /
    12 us; alpha = 4 MSS a b / target, fi = 5 MSS a, eta = 0.15 MSS a, fi_scale = 0.25 a."""
    rng = random.Random(seed)
    rate, rtt = rng.uniform(1, 400), rng.uniform(1_000, 100_000)
    mtu, trimming = rng.choice((256, 1024, 4096)), rng.random() < 0.5
    p = NsccParameters(NsccSetting(line_rate_gbps=rate, base_rtt_ns=rtt, mtu=mtu,
                                   trimming=trimming))
    a = rate / 8 * rtt / 150_000
    target = (0.75 if trimming else 1.0) * rtt
    b = target / 12_000
    assert p.a == pytest.approx(a)
    assert p.target_ns == pytest.approx(target)
    assert p.alpha == pytest.approx(4 * mtu * a * b / target)
    assert p.fi == pytest.approx(5 * mtu * a)
    assert p.eta == pytest.approx(0.15 * mtu * a)
    assert p.fi_scale == pytest.approx(0.25 * a)
    assert p.max_window == pytest.approx(1.5 * rate / 8 * rtt)


def test_no_ce_below_target_increases_in_proportion_to_the_headroom():
    cc = fresh()
    assert cc.inc == pytest.approx(ALPHA * MTU * 12_000)        # delay 0: the whole target
    before = cc.inc
    assert cc.on_ack(200.0, MTU, 12_000.0 + 3_000, False) == "proportional"
    assert cc.inc - before == pytest.approx(ALPHA * MTU * 9_000)
    assert cc.cwnd == BDP                   # applied only at the end of the adjust period


def test_no_ce_at_or_above_target_increases_fairly():
    cc = fresh()
    before = cc.inc
    assert cc.on_ack(200.0, 2 * MTU, 12_000.0 + 12_000, False) == "fair"
    assert cc.inc - before == pytest.approx(FI * 2 * MTU)


def test_ce_below_target_changes_nothing():
    cc = fresh()
    before = (cc.inc, cc.cwnd)
    assert cc.on_ack(200.0, MTU, 12_000.0 + 5_000, True) == "hold"
    assert (cc.inc, cc.cwnd) == before


def test_no_decrease_while_the_averaged_delay_is_within_target():
    cc = fresh()
    assert cc.on_ack(200.0, MTU, 12_000.0 + 20_000, True) == "decrease-held"   # avg 250 ns
    assert cc.cwnd == BDP


def test_ce_at_or_above_target_decreases_by_the_averaged_excess_once_per_base_rtt():
    """avg = 0.0125 x 1.2 ms = 15 us after one sample (from 0): the factor is 1 - 0.8 x
    (15 - 12) / 15 = 0.84; a second mark within a base RTT changes nothing."""
    cc = fresh()
    assert cc.on_ack(200.0, MTU, 12_000.0 + 1_200_000, True) == "decrease"
    assert cc.avg_delay_ns == pytest.approx(15_000)
    assert cc.cwnd == pytest.approx(0.84 * BDP)
    assert cc.on_ack(300.0, MTU, 12_000.0 + 1_200_000, True) == "decrease-held"
    assert cc.cwnd == pytest.approx(0.84 * BDP)


def test_a_decrease_takes_at_most_half():
    cc = fresh()
    cc.on_ack(200.0, MTU, 12_000.0 + 10_000_000, True)          # avg 125 us: factor < 0.5
    assert cc.cwnd == pytest.approx(0.5 * BDP)


def test_the_adjust_period_applies_the_increase_after_8_mtus_or_a_base_rtt_and_eta_per_rtt():
    cc = fresh()                                                # 1 MTU acknowledged
    for t in range(2, 9):                                       # 7 more: 8 MTUs
        cc.on_ack(100.0 * t, MTU, 12_000.0, False)
    first = BDP + 8 * ALPHA * MTU * 12_000 / BDP                # no eta: < one RTT since 0
    assert cc.cwnd == pytest.approx(first)
    assert cc.inc == 0
    cc.on_ack(13_000.0, MTU, 12_000.0 + 2_000, False)           # a base RTT later: adjust
    assert cc.cwnd == pytest.approx(first + ALPHA * MTU * 10_000 / first + ETA)


def test_fast_increase_after_a_whole_window_under_one_us():
    cc = Nscc(REFERENCE, 0.0)
    assert cc.on_ack(100.0, int(BDP), 12_000.0, False) == "fast"    # a whole window at once
    assert cc.cwnd == pytest.approx(BDP + BDP * 0.25)
    assert cc.inc == 0
    assert cc.on_ack(200.0, MTU, 12_000.0 + 500, False) == "fast"   # on until 1 us of delay
    assert cc.cwnd == pytest.approx(1.25 * BDP + MTU * 0.25)
    assert cc.on_ack(300.0, MTU, 12_000.0 + 1_500, False) == "proportional"
    assert cc.on_ack(400.0, MTU, 12_000.0, False) == "proportional"  # a new window to count


def test_fast_increase_waits_for_a_whole_window():
    cc = Nscc(REFERENCE, 0.0)
    for t in range(1, 36):                                          # 35 MTUs < 150 kB
        assert cc.on_ack(10.0 * t, MTU, 12_000.0 + 900, False) == "proportional"
    assert cc.fast_bytes == 35 * MTU


def test_quick_adapt_on_a_nack_sets_the_window_to_the_bytes_of_the_period():
    """The first period ends at base RTT + target = 24 us; 1 MTU was acknowledged in it,
    under max window / 8, so the window becomes 1 MTU (the NACK's bytes do not come off
    too)."""
    cc = fresh()
    assert cc.on_nack(30_000.0, MTU)
    assert (cc.cwnd, cc.quick_adapts) == (MTU, 1)


def test_a_nack_within_a_period_triggers_quick_adapt_at_its_end():
    cc = fresh()
    assert not cc.on_nack(5_000.0, MTU)                 # mid-period: only the bytes come off
    assert cc.cwnd == BDP - MTU
    cc.on_ack(10_000.0, MTU, 12_000.0, False)
    assert cc.on_ack(25_000.0, MTU, 12_000.0, False) == "quick-adapt"
    assert cc.cwnd == 3 * MTU                           # the period's three ACKed MTUs


def test_quick_adapt_needs_a_period_under_an_eighth_of_the_max_window():
    cc = fresh()
    cc.on_ack(200.0, math.ceil(MAX_WINDOW / 8), 12_000.0 + 2_000, False)
    assert not cc.on_nack(30_000.0, MTU)
    assert cc.quick_adapts == 0
    assert cc.cwnd == BDP - MTU


def test_quick_adapt_on_a_delay_over_four_targets_at_most_once_per_period():
    cc = fresh()
    assert cc.on_ack(30_000.0, MTU, 12_000.0 + 4 * 12_000 + 8, False) == "quick-adapt"
    assert cc.cwnd == 2 * MTU
    assert cc.on_ack(30_100.0, MTU, 12_000.0 + 4 * 12_000 + 8, False) == "fair"
    cc.on_nack(30_200.0, MTU)
    assert cc.quick_adapts == 1


def test_a_nack_takes_its_bytes_off_the_window():
    cc = fresh()
    cc.on_nack(200.0, MTU)
    assert cc.cwnd == BDP - MTU


@pytest.mark.parametrize("seed", range(3))
def test_the_window_stays_between_one_mtu_and_one_and_a_half_bdp(seed):
    rng = random.Random(seed)
    cc = Nscc(REFERENCE, 0.0)
    now = 0.0
    for _ in range(3000):
        now += rng.expovariate(1 / 500)
        if rng.random() < 0.05:
            cc.on_nack(now, MTU)
        else:
            cc.on_ack(now, MTU * rng.randrange(1, 40), 12_000.0 + rng.expovariate(1 / 8000),
                      rng.random() < 0.3)
        assert MTU <= cc.cwnd <= MAX_WINDOW
        assert 1 <= cc.window_psns() <= MAX_WINDOW // MTU


# -- in the requester ---------------------------------------------------------------------------

CONFIG = NicConfig(qps=8, mpr_units=1, mtu=1024, wr_slots=4, max_wimm=2, evs_per_profile=8)
SETTING = NsccSetting(line_rate_gbps=8.0, base_rtt_ns=12_000.0, mtu=1024)     # BDP 12,000 B


def requester(algorithm=None):
    m = RequesterModel(CONFIG)
    m.control(RequesterCommand.CONFIG, cc=1)
    if algorithm is not None:
        m.set_cc_algorithm(algorithm, SETTING if algorithm == "nscc" else None)
    assert m.qp_write(0, psn=0, mpr=1, max_wimm=2) == (P.Errno.OK, 0)
    m.post({"qpn": 0, "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": 1, "length": 64 * 1024,
            "remote_addr": 0x10000, "local_addr": 0x80000, "rkey": 0x55, "imm": 0})
    return m


def test_the_default_window_is_the_rtls_ecn_window():
    """The RTL has no NSCC: the model's default stays the ECN window (MPR PSNs at first)."""
    m = requester()
    assert m.cc_algorithm == "ecn"
    assert len(m.pull_all()) == 64


def test_nscc_limits_the_psns_in_flight_to_its_window():
    m = requester("nscc")
    assert len(m.pull_all()) == 11                  # 12,000 B of 1,024 B packets
    sack = {"kind": PacketKind.SACK, "bth": {"dqpn": 0, "psn": 4},
            "ctl": {"sack": {"seth": {"m": P.SackMark.NONE, "pr": 0, "ack_psn_offset": 0,
                                      "cack_psn": 4, "sack_psn_offset": 1,
                                      "sack_bitmap": 0b11},
                             "cc_state": {"tx_timestamp": P.wire_timestamp(1_000)}}}}
    assert m.receive(sack, now_ns=13_000) == "applied"
    cc = m._qps[0].nscc
    assert cc.base_rtt_ns == 12_000                 # the echo's age
    assert cc.qa_bytes == 7 * 1024                  # PSNs 0-4 cumulatively, 6-7 SACKed
    assert len(m.pull_all()) == cc.window_psns() - 6    # PSNs 5-10 still ahead of una


def test_an_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="cc algorithm must be one of ecn, nscc"):
        RequesterModel(CONFIG).set_cc_algorithm("bbr")
    with pytest.raises(ValueError, match="nscc needs an NsccSetting"):
        RequesterModel(CONFIG).set_cc_algorithm("nscc")


# -- the setting of a scenario ------------------------------------------------------------------

def _rtt_of(**overrides):
    scn = scenario("clean", **overrides)
    return setting_for(scn, nic_config_for(scn)).base_rtt_ns


def test_the_setting_is_the_unloaded_round_trip_when_only_acks_come_back():
    """8 planes of 1 Gb/s, 1 us each way: the data frame (1,024 + 110 B) and the ACK (110 B)."""
    assert _rtt_of(both_ways=False) == pytest.approx(2_000 + (1_134 + 110) * 8)
    assert _rtt_of(nics=4, pattern="incast") == _rtt_of(both_ways=False)


@pytest.mark.parametrize("overrides", [{}, {"nics": 4, "pattern": "all-to-all"}])
def test_the_setting_counts_half_a_peer_frame_when_acks_share_the_planes(overrides):
    """Each ACK waits behind the peer's data frame in service on its plane: half, on average."""
    assert _rtt_of(**overrides) == pytest.approx(_rtt_of(both_ways=False) + 1_134 * 8 / 2)
