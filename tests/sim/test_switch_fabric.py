"""The fabric of more than two endpoints: a switch per plane, forwarding by destination MAC to
per-port egress queues (ECN marking, trimming, tail drop) where several senders meet."""

import random

import pytest
from scapy.compat import raw

from hdl import protocol as P
from sim import packets as pk
from sim.fabric import Fabric, FabricConfig

RATE_GBPS = 1.0                 # 8 ns per byte
LATENCY_NS = 500.0
NAMES = ("a", "b", "c", "d")
MACS = tuple(0x02_00_00_00_00_0A + i for i in range(len(NAMES)))


def data(dst, psn=0, *, payload=1024, sport=0xC000):
    frame = raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=0x22, psn=psn, va=0x1000,
                               rkey=0xBEEF, payload=bytes(payload), udp_sport=sport))
    # Ethernet is outside the ICRC: the switch forwards on these bytes alone.
    return MACS[NAMES.index(dst)].to_bytes(6, "big") + frame[6:]


def config(**kw):
    values = dict(planes=2, paths_per_plane=1, rate_gbps=RATE_GBPS, latency_ns=LATENCY_NS,
                  ecn_threshold_bytes=0, endpoints=NAMES, macs=MACS)
    values.update(kw)
    return FabricConfig(**values)


def ser_ns(frame):
    return len(frame) * 8 / RATE_GBPS


def drain(fabric):
    """Every frame still in the fabric, as ``(time, dst, plane, frame)``, by stepping the
    bench's clock from arrival to arrival as a bench does."""
    out = []
    while (t := fabric.next_arrival()) is not None:
        out += [(t, *item) for item in fabric.deliver(t)]
    return out


def test_a_switched_fabric_forwards_by_destination_mac():
    """Each frame reaches the endpoint its destination MAC names, on its own plane, one
    serialization and one latency after its hand-over when its ports are idle (an idle
    egress port adds no delay)."""
    rng = random.Random(7)
    fabric = Fabric(config())
    assert fabric.switched
    sent = []
    now = 0.0
    for psn in range(40):
        src, dst = rng.sample(NAMES, 2)
        plane = rng.randrange(2)
        frame = data(dst, psn, payload=rng.choice((64, 512, 1024)))
        now += rng.uniform(12_000, 15_000)      # ports idle between hand-overs
        fabric.send(src, plane, frame, now)
        sent.append((now, dst, plane, frame))
        for item in drain(fabric):
            assert item[1:] == (dst, plane, frame)
            assert item[0] == pytest.approx(now + ser_ns(frame) + LATENCY_NS)
    assert fabric.stats.queue_delay_us() == {"p50": 0.0, "p99": 0.0, "max": 0.0}


def test_a_frame_to_no_endpoint_or_to_its_sender_is_dropped_unroutable():
    fabric = Fabric(config())
    stranger = (0x02_00_00_00_99_99).to_bytes(6, "big") + data("a")[6:]
    assert fabric.send("b", 0, stranger, 0.0).outcome == "dropped-unroutable"
    assert fabric.send("b", 1, data("b"), 10.0).outcome == "dropped-unroutable"
    assert drain(fabric) == []
    assert fabric.stats.counters[0]["dropped-unroutable"] == 1
    assert fabric.stats.data_drops == 2


def test_incast_queues_at_the_receivers_egress_port_not_before():
    """Three senders bursting at one receiver: the receiver's downlink carries one frame at
    a time (arrivals at least a serialization apart), its egress queue marks CE once its
    backlog passes the threshold and drops beyond its capacity; the same load spread over
    distinct receivers never waits at an egress port."""
    rng = random.Random(11)

    def burst(pattern):
        fabric = Fabric(config(planes=1, ecn_threshold_bytes=4096, queue_bytes=16384))
        events = []
        for src, dst in pattern:
            t = rng.uniform(0, 200)
            for psn in range(12):
                frame = data(dst, psn, payload=rng.choice((512, 1024)))
                t += ser_ns(frame) * rng.uniform(1.0, 1.1)   # at about the link's rate
                events.append((t, src, frame))
        for t, src, frame in sorted(events, key=lambda e: e[0]):
            fabric.send(src, 0, frame, t)
        return fabric, drain(fabric)

    fabric, arrivals = burst([("b", "a"), ("c", "a"), ("d", "a")])
    at_a = sorted((t, frame) for t, dst, _, frame in arrivals if dst == "a")
    for (t0, _), (t1, frame) in zip(at_a, at_a[1:], strict=False):
        assert t1 - t0 >= ser_ns(frame) - 1e-6
    counters = fabric.stats.counters[0]
    assert counters["ecn-marked"] > 0
    assert counters["dropped-queue"] > 0
    assert fabric.stats.data_drops == counters["dropped-queue"]
    assert fabric.stats.queue_delay_us()["max"] > 0

    fabric, arrivals = burst([("b", "a"), ("c", "d")])
    assert fabric.stats.counters[0]["ecn-marked"] == 0
    assert fabric.stats.counters[0]["dropped-queue"] == 0
    assert fabric.stats.queue_delay_us()["max"] == 0.0


def test_an_egress_port_serves_frames_in_order_of_arrival_not_of_hand_over():
    """b hands three frames over at once (its uplink queues them); c hands one over later
    that reaches the switch before b's third: the egress port sends c's before it."""
    fabric = Fabric(config(planes=1))
    frames = [data("d", psn, sport=0xC000 + psn) for psn in range(3)]
    for frame in frames:
        fabric.send("b", 0, frame, 0.0)
    late = data("d", 9)
    s = ser_ns(late)
    fabric.send("c", 0, late, 1.5 * s)
    order = [frame for _, _, _, frame in drain(fabric)]
    assert order == [frames[0], frames[1], late, frames[2]]


def test_trimming_at_the_egress_port():
    """Past the trimming threshold the egress port forwards the headers of a data frame."""
    fabric = Fabric(config(planes=1, trim_threshold_bytes=2048, queue_bytes=65536))
    rng = random.Random(3)
    events = sorted((psn * ser_ns(data("a")) + rng.uniform(0, 50), src, psn)
                    for psn in range(10) for src in ("b", "c"))
    for t, src, psn in events:
        fabric.send(src, 0, data("a", psn), t)
    arrivals = drain(fabric)
    trimmed = [f for _, _, _, f in arrivals if len(f) < len(data("a"))]
    assert trimmed and fabric.stats.counters[0]["trimmed"] == len(trimmed)
    assert all(pk.Ether(f)[pk.BTH].opcode == P.Opcode.RDMA_WRITE_ONLY for f in trimmed)


def test_two_endpoint_calls_are_refused_with_a_switch():
    fabric = Fabric(config())
    with pytest.raises(ValueError, match="needs a fabric of two endpoints"):
        fabric.take_in_flight()
    with pytest.raises(ValueError, match="needs a fabric of two endpoints"):
        fabric.inject("a", 0, data("a"), 0.0)


@pytest.mark.parametrize(("values", "message"), [
    ({"endpoints": tuple("abcdefghijklmnopq"), "macs": tuple(range(17))},
     r"FabricConfig\.endpoints must be 2 to 16 distinct names"),
    ({"macs": MACS[:3]}, r"FabricConfig\.macs must be 4 distinct 48-bit integers"),
    ({"macs": (1, 1, 2, 3)}, r"FabricConfig\.macs must be 4 distinct"),
    ({"macs": (1, 2, 3, 1 << 48)}, r"FabricConfig\.macs must be 4 distinct 48-bit"),
])
def test_config_of_a_switched_fabric_names_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        config(**values)
