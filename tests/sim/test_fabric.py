"""The multi-plane fabric model (sim/fabric): timing, queues, impairments, failures, capture."""

import json
import math
import struct
import sys

import pytest
from scapy.compat import raw
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import PcapNgReader, rdpcap

from hdl import protocol as P
from hdl.config import NicConfig
from sim import packets as pk
from sim.analysis import wire_shares
from sim.fabric import Fabric, FabricConfig, Failure, Statistics, line_rate_gbps
from sim.fabric.capture import read_pcapng
from sim.fabric.plot import plot_goodput, plot_run

PAYLOAD = 1024
RATE_GBPS = 1.0                 # 8 ns per byte: exact serialization times
LATENCY_NS = 500.0


def data(psn=0, *, sport=0xC000, payload=PAYLOAD, **kw):
    return raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=0x22, psn=psn, va=0x1000,
                              rkey=0xBEEF, payload=bytes(range(256)) * (payload // 256)
                              + bytes(payload % 256), udp_sport=sport, **kw))


def ack(psn=0, **kw):
    return raw(pk.sack_packet(dqpn=0x11, cack_psn=psn, **kw))


def config(**kw):
    values = dict(planes=2, paths_per_plane=1, rate_gbps=RATE_GBPS, latency_ns=LATENCY_NS,
                  ecn_threshold_bytes=0)
    values.update(kw)
    return FabricConfig(**values)


def ser_ns(frame, rate_gbps=RATE_GBPS):
    return len(frame) * 8 / rate_gbps


def spaced(fabric, frames, gap_ns, *, plane=0, src="a"):
    """Send frames ``gap_ns`` apart; returns their records."""
    return [fabric.send(src, plane, frame, i * gap_ns) for i, frame in enumerate(frames)]


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def test_back_to_back_frames_arrive_one_serialization_apart():
    fabric = Fabric(config())
    frames = [data(i) for i in range(3)] + [ack(9)]
    for frame in frames:
        fabric.send("a", 0, frame, 0)
    expected, finish = [], 0.0
    for frame in frames:
        finish += ser_ns(frame)
        expected.append(finish + LATENCY_NS)
    assert [r.arrival_ns for r in fabric.records] == expected
    assert fabric.next_arrival() == expected[0]
    assert fabric.deliver(expected[0] - 0.5) == []
    assert fabric.deliver(expected[0]) == [("b", 0, frames[0])]
    assert fabric.deliver(expected[-1]) == [("b", 0, f) for f in frames[1:]]
    assert fabric.next_arrival() is None and fabric.deliver(math.inf) == []
    # After the link went idle a frame only pays its own serialization and the latency.
    late = 1_000_000.0
    record = fabric.send("b", 0, frames[0], late)
    assert record.arrival_ns == late + ser_ns(frames[0]) + LATENCY_NS
    assert fabric.deliver(record.arrival_ns) == [("a", 0, frames[0])]


def test_paths_add_skewed_latency_and_their_own_serializer():
    skew, path_rate = 250.0, 0.5
    fabric = Fabric(config(paths_per_plane=4, path_skew_ns=skew, path_rate_gbps=path_rate))
    by_path = {}
    for n in range(64):
        frame = data(n, sport=0xC000 + 16 * n)
        by_path.setdefault(fabric.path_of(0, frame), []).append(frame)
    assert len(by_path) == 4
    for path, frames in by_path.items():
        fabric = Fabric(config(paths_per_plane=4, path_skew_ns=skew, path_rate_gbps=path_rate))
        port_free = path_free = 0.0
        for frame in frames[:3]:
            record = fabric.send("a", 0, frame, 0)
            port_free += ser_ns(frame)
            path_free = max(path_free, port_free) + ser_ns(frame, path_rate)
            assert record.path == path
            assert record.arrival_ns == path_free + LATENCY_NS + path * skew


@pytest.mark.parametrize("nic", [NicConfig(), NicConfig(ports=3, data_width=128),
                                 NicConfig(ports=16, data_width=256, clock_hz=250_000_000),
                                 NicConfig(ports=1, clock_hz=100_000_000)],
                         ids=["default", "3x128", "16x256", "1x64"])
def test_default_plane_rates_add_up_to_the_nic_line_rate(nic):
    fabric_config = FabricConfig.for_nic(nic)
    assert line_rate_gbps(nic) == nic.line_rate_bps / 1e9
    assert fabric_config.planes == nic.ports
    rates = [fabric_config.plane_rate_gbps(p) for p in range(nic.ports)]
    assert sum(rates) == pytest.approx(line_rate_gbps(nic))
    assert len(set(rates)) == 1


# ---------------------------------------------------------------------------------------------
# ECMP
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["udp", "stev", "srv6"])
def test_ecmp_spreads_evs_over_paths_and_keeps_each_ev_on_one_path(mode):
    fabric = Fabric(config(paths_per_plane=4, planes=1))

    def frame(ev, psn):
        if mode == "udp":
            return data(psn, sport=0xC000 + 16 * ev)
        if mode == "stev":
            return data(psn, sport=0xC000 + ev, flow_label=0x10000 + 7 * ev)
        return raw(pk.srv6_encapsulate(pk.data_packet(
            P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=psn, va=0, rkey=1, payload=b"x" * 64),
            dst=f"fc00:0:1:{ev:x}::"))

    paths = {}
    for ev in range(64):
        seen = {fabric.path_of(0, frame(ev, psn)) for psn in range(6)}
        assert len(seen) == 1, f"EV {ev} took paths {seen}"
        paths[ev] = seen.pop()
    counts = [list(paths.values()).count(p) for p in range(4)]
    assert min(counts) >= 6, counts        # 16 expected per path


# ---------------------------------------------------------------------------------------------
# Queue: ECN, trimming, tail drop
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ip_version", [6, 4])
def test_ecn_marks_above_threshold_with_valid_icrc_and_checksum(ip_version):
    frames = [data(i, ip_version=ip_version) for i in range(8)]
    size = len(frames[0])
    threshold = 2 * size + 100
    fabric = Fabric(config(ecn_threshold_bytes=threshold))
    for frame in frames:
        fabric.send("a", 0, frame, 0)
    for k, record in enumerate(fabric.records):
        backlog_ahead = k * size
        marked = backlog_ahead > threshold
        assert ("ecn-marked" in record.marks) == marked
        pkt = Ether(record.frame)
        ip = pkt[IPv6] if ip_version == 6 else pkt[IP]
        ecn = (ip.tc if ip_version == 6 else ip.tos) & 3
        assert ecn == (P.ECN_CE if marked else 0b10)
        assert pk.icrc_ok(record.frame)
        if ip_version == 4:
            fresh = ip.copy()
            fresh.chksum = None
            assert IP(raw(fresh)).chksum == ip.chksum
    assert fabric.stats.counters[0]["ecn-marked"] == sum(k * size > threshold for k in range(8))


def test_ecn_marks_the_inner_header_of_srv6_and_spares_not_ect():
    inner = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=1, va=0, rkey=1,
                           payload=bytes(512))
    srv6 = raw(pk.srv6_encapsulate(inner, dst="fc00::1"))
    not_ect = data(2, ecn=0)
    fabric = Fabric(config(ecn_threshold_bytes=1))
    fabric.send("a", 0, data(0), 0)                 # builds a backlog
    marked = fabric.send("a", 0, srv6, 0)
    spared = fabric.send("a", 0, not_ect, 0)
    assert "ecn-marked" in marked.marks and pk.icrc_ok(marked.frame)
    layers = Ether(marked.frame)
    assert layers[IPv6].tc == 0                      # outer header untouched
    assert layers[IPv6].payload.tc & 3 == P.ECN_CE
    assert "ecn-marked" not in spared.marks and spared.frame == not_ect


def test_trimming_above_threshold_keeps_headers_and_drops_other_packets():
    frames = [data(i) for i in range(6)]
    size = len(frames[0])
    threshold = size + 10
    fabric = Fabric(config(trim_threshold_bytes=threshold, queue_bytes=16 * size))
    for frame in frames:
        fabric.send("a", 0, frame, 0)
    late_ack = fabric.send("a", 0, ack(1), 0)
    backlog = 0
    for sent, record in zip(frames, fabric.records[:-1], strict=True):
        trimmed = backlog > threshold
        assert ("trimmed" in record.marks) == trimmed
        pkt = Ether(record.frame)
        if trimmed:
            assert pk.is_trimmed(pkt)
            assert pkt[pk.RETH].dma_len == PAYLOAD
            assert pk.METH in pkt and pk.Raw not in pkt[pk.RETH]
            assert pkt[IPv6].plen == len(record.frame) - 14 - 40
            assert len(record.frame) == size - PAYLOAD
        else:
            assert record.frame == sent and pk.icrc_ok(record.frame)
            assert not pk.is_trimmed(pkt)
        backlog += len(record.frame)
    assert late_ack.outcome == "dropped-queue"
    assert fabric.stats.counters[0]["trimmed"] == 4
    # A data opcode with its headers cut short cannot be trimmed: dropped, never a crash.
    stump = fabric.send("a", 0, frames[0][:80], 0)
    assert stump.outcome == "dropped-queue" and stump.marks == ()


def test_tail_drop_when_the_frame_does_not_fit():
    frames = [data(i) for i in range(10)]
    size = len(frames[0])
    fabric = Fabric(config(queue_bytes=int(3.5 * size)))
    for frame in frames:
        fabric.send("a", 0, frame, 0)
    assert [r.outcome for r in fabric.records] == ["delivered"] * 3 + ["dropped-queue"] * 7
    assert fabric.stats.counters[0]["dropped-queue"] == 7
    # Once the first frame has left the serializer there is room again for one.
    record = fabric.send("a", 0, frames[0], ser_ns(frames[0]))
    assert record.outcome == "delivered"
    assert record.arrival_ns == 4 * ser_ns(frames[0]) + LATENCY_NS


# ---------------------------------------------------------------------------------------------
# Impairments
# ---------------------------------------------------------------------------------------------

def _outcomes(fabric, count, frame, gap_ns=2000.0):
    return [fabric.send("a", 0, frame, i * gap_ns).outcome for i in range(count)]


def test_random_loss_rate_within_statistical_bounds():
    count, p = 6000, 0.1
    lost = _outcomes(Fabric(config(loss=p, capture=False)), count, ack()).count("dropped-loss")
    sigma = math.sqrt(count * p * (1 - p))
    assert abs(lost - count * p) < 5 * sigma


def test_burst_loss_mean_burst_length():
    count, enter, length = 40000, 0.01, 5.0
    outcomes = _outcomes(Fabric(config(burst_loss=enter, burst_length=length,
                                       capture=False)), count, ack())
    bursts, run = [], 0
    for outcome in outcomes + ["delivered"]:
        if outcome == "dropped-loss":
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    mean = sum(bursts) / len(bursts)
    # Geometric bursts of mean L; one in 100 merges with the next: L / (1 - p) ~ 5.05.
    assert 4.0 < mean < 6.2, (mean, len(bursts))
    assert abs(len(bursts) - count * enter) < 5 * math.sqrt(count * enter)


def test_duplication_delivers_an_identical_second_copy():
    frames = [data(i) for i in range(20)]
    fabric = Fabric(config(duplicate=1.0, reorder_delay_ns=300.0))
    spaced(fabric, frames, 20_000)
    got = fabric.deliver(math.inf)
    assert [f for _, _, f in got] == [f for f in frames for _ in range(2)]
    originals = [r for r in fabric.records if "duplicate" not in r.marks]
    copies = [r for r in fabric.records if "duplicate" in r.marks]
    assert len(originals) == len(copies) == 20
    for original, copy in zip(originals, copies, strict=True):
        assert "duplicated" in original.marks
        assert original.arrival_ns <= copy.arrival_ns <= original.arrival_ns + 300.0
    assert fabric.stats.counters[0]["sent"] == 20
    assert fabric.stats.counters[0]["delivered"] == 40


def test_partial_duplication_rate():
    count, p = 4000, 0.2
    fabric = Fabric(config(duplicate=p, capture=False))
    _outcomes(fabric, count, ack())
    copies = fabric.stats.counters[0]["duplicate"]
    assert abs(copies - count * p) < 5 * math.sqrt(count * p * (1 - p))


def test_corruption_flips_one_byte_and_fails_the_icrc():
    frames = [data(i, payload=64) for i in range(40)] + [ack(i) for i in range(40)]
    fabric = Fabric(config(corrupt=1.0))
    spaced(fabric, frames, 5_000)
    for sent, record in zip(frames, fabric.records, strict=True):
        assert record.marks == ("corrupted",)
        assert len(record.frame) == len(sent)
        assert sum(a != b for a, b in zip(sent, record.frame, strict=True)) == 1
        assert not pk.icrc_ok(record.frame)


def test_reordering_adds_bounded_delay_and_changes_order():
    frames = [data(i, payload=64) for i in range(200)]
    gap, extra = 2_000.0, 5_000.0
    fabric = Fabric(config(reorder=0.5, reorder_delay_ns=extra))
    records = spaced(fabric, frames, gap)
    base = ser_ns(frames[0]) + LATENCY_NS
    for i, record in enumerate(records):
        delay = record.arrival_ns - i * gap - base
        assert 0 <= delay <= extra
        assert delay == 0 or "reordered" in record.marks
    got = [f for _, _, f in fabric.deliver(math.inf)]
    assert sorted(got) == sorted(frames) and got != frames
    assert 60 < fabric.stats.counters[0]["reordered"] < 140


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------

def _crossed(fabric, frames, gap_ns, planes=(0, 1), src="a"):
    """Send ``frames`` on each plane, ``gap_ns`` apart; {(plane, i): record}."""
    out = {}
    for i, frame in enumerate(frames):
        for plane in planes:
            out[(plane, i)] = fabric.send(src, plane, frame, i * gap_ns)
    return out


def test_plane_blackhole_loses_everything_inside_the_window_only():
    t1, t2, gap = 20_000.0, 50_000.0, 2_000.0
    frames = [data(i, payload=64) for i in range(40)]
    transit = ser_ns(frames[0]) + LATENCY_NS
    fabric = Fabric(config(failures=[Failure(kind="blackhole", plane=1, at_ns=t1,
                                             recover_ns=t2)]))
    records = _crossed(fabric, frames, gap)
    for (plane, i), record in records.items():
        sent = i * gap
        inside = plane == 1 and sent + transit >= t1 and sent < t2
        assert record.outcome == ("dropped-failure" if inside else "delivered"), (plane, i)
    assert fabric.stats.counters[0]["dropped-failure"] == 0
    assert fabric.stats.counters[1]["dropped-failure"] == 15      # sent 20 us .. 48 us


def test_blackhole_without_recovery_and_one_direction_only():
    fabric = Fabric(config(failures=[Failure(kind="blackhole", plane=0, at_ns=5_000.0,
                                             direction="a")]))
    frames = [ack(i) for i in range(20)]
    a_to_b = _crossed(fabric, frames, 1_000.0, planes=(0,))
    fabric_b = Fabric(config(failures=[Failure(kind="blackhole", plane=0, at_ns=5_000.0,
                                               direction="a")]))
    b_to_a = _crossed(fabric_b, frames, 1_000.0, planes=(0,), src="b")
    transit = ser_ns(frames[0]) + LATENCY_NS
    for (_, i), record in a_to_b.items():
        assert (record.outcome == "delivered") == (i * 1_000.0 + transit < 5_000.0)
    assert all(r.outcome == "delivered" for r in b_to_a.values())


def _flap_down(failure, t):
    if not failure.at_ns <= t < failure.recover_ns:
        return False
    return (t - failure.at_ns) % failure.period_ns < failure.duty * failure.period_ns


def test_flap_follows_its_period_and_duty_cycle():
    flap = Failure(kind="flap", plane=0, at_ns=20_000.0, recover_ns=80_000.0,
                   period_ns=10_000.0, duty=0.3)
    fabric = Fabric(config(latency_ns=100.0, failures=[flap]))
    # AETH frames (the shortest): each one's flight is under the 1 us between sends.
    frames = [raw(pk.ack_packet(dqpn=0x11, psn=i)) for i in range(100)]
    assert ser_ns(frames[0]) + 100.0 < 1_000.0
    records = _crossed(fabric, frames, 1_000.0, planes=(0,))
    lost = 0
    for (_, i), record in records.items():
        start, end = i * 1_000.0, record.sent_ns + ser_ns(frames[0]) + 100.0
        # Reference: sample the flap every ns over the frame's flight.
        down = any(_flap_down(flap, t) for t in range(int(start), int(end) + 1))
        assert (record.outcome == "dropped-failure") == down, i
        lost += down
    assert lost == 18           # 3 per down window of 3 us, 6 windows


def test_one_path_failure_spares_the_other_paths():
    fabric = Fabric(config(paths_per_plane=4, failures=[
        Failure(kind="blackhole", plane=0, path=2, at_ns=0.0)]))
    frames = [data(n, sport=0xC000 + 16 * n, payload=64) for n in range(64)]
    records = spaced(fabric, frames, 2_000.0)
    assert {r.path for r in records} == {0, 1, 2, 3}
    for record, frame in zip(records, frames, strict=True):
        on_failed_path = fabric.path_of(0, frame) == 2
        assert record.outcome == ("dropped-failure" if on_failed_path else "delivered")
    assert fabric.stats.path_counters[(0, 2)]["dropped-failure"] > 0
    assert fabric.stats.path_counters[(0, 1)]["dropped-failure"] == 0


# ---------------------------------------------------------------------------------------------
# Determinism, capture, statistics
# ---------------------------------------------------------------------------------------------

def _busy_run(seed):
    fabric = Fabric(config(planes=3, paths_per_plane=4, seed=seed, loss=0.05, burst_loss=0.01,
                           duplicate=0.05, reorder=0.2, corrupt=0.05, ecn_threshold_bytes=2000,
                           trim_threshold_bytes=6000, queue_bytes=12000,
                           failures=[Failure(kind="flap", plane=2, at_ns=0.0,
                                             recover_ns=200_000.0, period_ns=30_000.0)]))
    for i in range(300):
        frame = data(i, sport=0xC000 + 16 * (i % 32), payload=512) if i % 3 else ack(i)
        fabric.send("ab"[i % 2], i % 3, frame, i * 300.0)
    return fabric


def test_same_seed_same_capture_and_another_seed_differs():
    first, again, other = _busy_run(7), _busy_run(7), _busy_run(8)
    assert first.records == again.records
    assert first.deliver(math.inf) == again.deliver(math.inf)
    assert [r.fate for r in first.records] != [r.fate for r in other.records]
    fates = {m for r in first.records for m in (r.outcome, *r.marks)}
    assert {"dropped-loss", "dropped-failure", "trimmed", "ecn-marked", "corrupted",
            "duplicated", "reordered"} <= fates


def test_pcapng_has_one_interface_per_plane_read_back_by_scapy(tmp_path):
    fabric = _busy_run(3)
    fabric.save(tmp_path)
    assert json.loads((tmp_path / "fabric.json").read_text())["stats"]["goodput_bytes"] \
        == fabric.delivered_payload_bytes() > 0
    reader = PcapNgReader(str(tmp_path / "traffic.pcapng"))
    packets = list(reader)
    reader.close()
    assert [iface[2]["name"] for iface in reader.interfaces] == [b"plane0", b"plane1",
                                                                  b"plane2"]
    records = sorted(fabric.records, key=lambda r: r.time_ns)
    assert len(packets) == len(records)
    for packet, record in zip(packets, records, strict=True):
        assert raw(packet) == record.frame
        assert packet.sniffed_on == f"plane{record.plane}"
        assert packet.direction == (2 if record.src == "a" else 1)
        comment = packet.comments[0].decode()
        assert f"plane={record.plane} path={record.path} fate={record.fate} " in comment
        assert f" sent_us={record.sent_ns / 1000:.6f}" in comment
        assert float(packet.time) == pytest.approx(record.time_ns * 1e-9, abs=1e-9)
    assert len(rdpcap(str(tmp_path / "traffic.pcapng"))) == len(records)
    classic = rdpcap(str(tmp_path / "traffic.pcap"))
    delivered = sorted((r for r in records if r.outcome == "delivered"),
                       key=lambda r: r.arrival_ns)
    assert [raw(p) for p in classic] == [r.frame for r in delivered]
    assert [float(p.time) for p in classic] == pytest.approx(
        [r.arrival_ns * 1e-9 for r in delivered], abs=1e-9)


def test_goodput_statistics_count_intact_payload_per_bin_and_direction():
    fabric = Fabric(config(bin_ns=10_000.0, corrupt=0.2, seed=5))
    records = []
    for i in range(50):
        for src, size in (("a", 256), ("b", 128)):
            records.append(fabric.send(src, 1, data(i, payload=size), i * 3_000.0))
    fabric.send("a", 1, ack(), 200_000.0)
    expected = {"a": {}, "b": {}}
    for record in records:
        if "corrupted" not in record.marks:
            index = int(record.arrival_ns // 10_000.0)
            per_src = expected[record.src]
            per_src[index] = per_src.get(index, 0) + (256 if record.src == "a" else 128)
    for src in "ab":
        got = {i: b.goodput_by_src[src] for i, b in fabric.stats.bins[1].items()
               if b.goodput_by_src[src]}
        assert got == expected[src]
        times, rates = fabric.stats.goodput_gbps(1, src)
        assert times[3] == 30_000.0 and rates[3] == expected[src][3] * 8 / 10_000.0
    _, both = fabric.stats.goodput_gbps(1)
    assert both[3] == (expected["a"][3] + expected["b"][3]) * 8 / 10_000.0
    assert fabric.delivered_payload_bytes() == sum(sum(e.values()) for e in expected.values())
    assert fabric.stats.to_dict()["planes"][1]["sent"] == 101


def test_wire_shares_split_the_data_sides_wire_into_first_sends_resends_and_control():
    fabric = Fabric(config(wire_overhead_bytes=20, duplicate=1.0, seed=2))
    first = [data(i, payload=512) for i in range(3)]
    resend = data(1, payload=512, rtx=True)
    for i, frame in enumerate([*first, resend, ack(9)]):
        fabric.send("a", 0, frame, i * 10_000.0)          # a sends data and one ACK ...
        if i < 4:
            fabric.send("b", 1, ack(i), i * 10_000.0)     # ... b only answers
    wire = {"first": sum(len(f) + 20 for f in first), "resend": len(resend) + 20,
            "control": len(ack(9)) + 20}
    total = sum(wire.values())
    shares = wire_shares(fabric.records, 20)
    assert any("duplicate" in r.marks for r in fabric.records)
    # The fabric's duplicates are not something a NIC sent; b sent no data, so its ACKs
    # (on the reverse planes) are not counted.
    assert shares == {"first_transmission": round(wire["first"] / total, 4),
                      "retransmission": round(wire["resend"] / total, 4),
                      "control": round(wire["control"] / total, 4), "data_sides": 1}
    fabric.send("b", 1, data(7, payload=512), 50_000.0)   # now b sends data too
    both = wire_shares(fabric.records, 20)
    assert both["data_sides"] == 2
    assert both["control"] == round((wire["control"] + 4 * (len(ack(0)) + 20))
                                    / (total + 4 * (len(ack(0)) + 20) + len(first[0]) + 20), 4)
    assert wire_shares([], 20) is None


def test_plot_writes_a_png(tmp_path):
    fabric = _busy_run(4)
    path = tmp_path / "goodput.png"
    fabric.plot(path, title="test")
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (900, 700) and len(png) > 5_000
    # The same plot from the files a bench in another process saved.
    fabric.save(tmp_path / "run")
    reloaded = Statistics.from_dict(json.loads((tmp_path / "run" / "fabric.json").read_text())
                                    ["stats"])
    assert reloaded.to_dict() == fabric.stats.to_dict()
    plot_goodput(tmp_path / "run", tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The capture read back gives the records the plots need, dropped frames included.
    back = read_pcapng(tmp_path / "run" / "traffic.pcapng")
    records = sorted(fabric.records, key=lambda r: r.time_ns)
    assert [r[2:] for r in back] == [r[2:] for r in records]
    assert [r.time_ns for r in back] == pytest.approx([r.time_ns for r in records], abs=1e-3)
    plot_run(tmp_path / "run")
    assert (tmp_path / "run" / "queues.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(RuntimeError, match="'matplotlib'"):
        _busy_run(4).plot(tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"planes": 0}, r"FabricConfig\.planes must be an integer from 1 to 16, not 0"),
    ({"paths_per_plane": 65}, r"FabricConfig\.paths_per_plane must be an integer from 1"),
    ({"rate_gbps": -1}, r"FabricConfig\.rate_gbps must be a number greater than 0"),
    ({"rate_gbps": (1.0,)}, r"FabricConfig\.rate_gbps must have one rate per plane"),
    ({"latency_ns": -5}, r"FabricConfig\.latency_ns must be a number at least 0"),
    ({"loss": 1.5}, r"FabricConfig\.loss must be a number from 0 to 1, not 1\.5"),
    ({"duplicate": float("nan")}, r"FabricConfig\.duplicate must be a number from 0 to 1"),
    ({"burst_length": 0.5}, r"FabricConfig\.burst_length must be a number at least 1"),
    ({"ecn_threshold_bytes": 70000}, r"FabricConfig\.ecn_threshold_bytes must be an integer "
                                     r"from 0 to 65536"),
    ({"trim_dscp": 64}, r"FabricConfig\.trim_dscp must be an integer from 0 to 63"),
    ({"endpoints": ("a", "a")}, r"FabricConfig\.endpoints must be 2 to 16 distinct names"),
    ({"endpoints": ("a", "b", "c")}, r"FabricConfig\.macs must be 3 distinct 48-bit integers"),
    ({"failures": [Failure(kind="blackhole", plane=9)]},
     r"FabricConfig\.failures\[0\]\.plane must be from 0 to 7, not 9"),
    ({"failures": [Failure(kind="blackhole", plane=0, path=4)]},
     r"FabricConfig\.failures\[0\]\.path must be from 0 to 3"),
    ({"failures": [Failure(kind="blackhole", plane=0, direction="c")]},
     r"FabricConfig\.failures\[0\]\.direction must be None or one of a, b"),
])
def test_config_validation_names_the_field_and_range(values, message):
    with pytest.raises(ValueError, match=message):
        FabricConfig(**values)


@pytest.mark.parametrize("values, message", [
    ({"kind": "melt", "plane": 0}, r"Failure\.kind must be one of blackhole, flap"),
    ({"kind": "flap", "plane": 0}, r"Failure\.period_ns must be a number greater than 0"),
    ({"kind": "flap", "plane": 0, "period_ns": 10, "duty": 2},
     r"Failure\.duty must be a number from 0 to 1"),
    ({"kind": "blackhole", "plane": 0, "at_ns": 10, "recover_ns": 5},
     r"Failure\.recover_ns must be a number greater than 10"),
    ({"kind": "blackhole", "plane": -1}, r"Failure\.plane must be a plane index"),
])
def test_failure_validation(values, message):
    with pytest.raises(ValueError, match=message):
        Failure(**values)


def test_bad_sends_raise_and_opaque_frames_pass():
    fabric = Fabric(config())
    with pytest.raises(ValueError, match="src must be one of a, b, not 'c'"):
        fabric.send("c", 0, data(), 0)
    with pytest.raises(ValueError, match="plane must be from 0 to 1, not 2"):
        fabric.send("a", 2, data(), 0)
    fabric.send("a", 0, data(), 100)
    with pytest.raises(ValueError, match="send times must not decrease"):
        fabric.send("a", 0, data(), 50)
    for junk in (b"", b"\x01" * 10, b"\xff" * 200, raw(Ether() / IPv6(nh=6) / (b"x" * 30))):
        record = fabric.send("a", 1, junk, 200)
        assert record.outcome == "delivered" and record.frame == junk
