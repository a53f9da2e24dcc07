"""Two RTL NICs back to back through a reordering, duplicating network model (cocotb).

NIC ``a`` and NIC ``b`` (``sim/tb/pair.py``) are brought up through their register buses by
:class:`sim.driver.nic.NicDriver`: addresses, a memory region each, a GENERATED EV profile
(``sim/data/default-ev-profile.json``) and ``QPS`` connected QP pairs (QP q of a <-> QP q of
b). Each side then posts RDMA WRITE and WRITE WITH IMMEDIATE work requests of random sizes to
the other. Every frame on the wire is decoded with Scapy and its ICRC checked; the network
delays each frame by a random number of cycles per plane (so packets reorder across and
within planes) and duplicates some. The test ends when every work request has completed, and
checks: the target memory equals the source bytes, byte for byte; requester completions are
in posting order per QP with SUCCESS; responder completions carry the immediates in order.

Environment: NIC_CONFIG (NicConfig as JSON; defaults otherwise), QPS (QP pairs used),
MESSAGES (work requests per side), SEED, DUPLICATE (probability), DELAY (max cycles), PCAP
(path to write the traffic to, optional).
"""

import heapq
import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from scapy.layers.l2 import Ether

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.control.nicmap import nic_register_map
from hdl.interfaces import completion_layout, work_request_layout
from hdl.packet.headers import net_beat_layout
from hdl.path.ev import load_profile_json
from sim import packets as pk
from sim.defaults import MR_BASE, MR_LENGTH, NIC_A, NIC_B
from sim.driver.nic import NicDriver
from sim.env import REPO
from sim.tb.cocotb_host import CocotbBus, HostMemory, MemoryPort
from sim.tb.streams import StreamSink, StreamSource, beats_to_bytes, frame_to_beats, unpack

CONFIG = NicConfig.from_dict(json.loads(os.environ.get("NIC_CONFIG", "{}")))
QPS = int(os.environ.get("QPS", "3"))
MESSAGES = int(os.environ.get("MESSAGES", "12"))
SEED = int(os.environ.get("SEED", "1"))
DUPLICATE = float(os.environ.get("DUPLICATE", "0.05"))
DELAY = int(os.environ.get("DELAY", "300"))
PCAP = os.environ.get("PCAP", "")
W = CONFIG.data_width
PD = 1
SRC_BASE = 0x2000_0000
PSN_BASE = 0xFFFF80         # wraps the 24-bit PSN during the run


def mac_int(text):
    return int(text.replace(":", ""), 16)


def ip_int(endpoint):
    import ipaddress
    if CONFIG.ip_version == 6:
        return int(ipaddress.IPv6Address(endpoint.ipv6))
    return int(ipaddress.IPv4Address(endpoint.ipv4))


class Side:
    """One NIC of the pair with its host: memory, WR source, completion sink, driver."""

    def __init__(self, dut, name, endpoint, rkey_slot, rng):
        self.name = name
        self.endpoint = endpoint
        self.prefix = f"{name}_"
        clk = dut.clk
        self.memory = HostMemory()
        self.port = MemoryPort(dut, self.prefix, CONFIG, self.memory, clk, idle=0.2,
                               backpressure=0.2, seed=rng.randrange(1 << 30))
        self.wr = StreamSource(dut, f"{name}_wr", work_request_layout(CONFIG), clk, idle=0.3,
                               seed=rng.randrange(1 << 30))
        self.completions = StreamSink(dut, f"{name}_completion", completion_layout(CONFIG),
                                      clk, backpressure=0.3, seed=rng.randrange(1 << 30))
        self.rx = [StreamSource(dut, f"{name}_rx__{p}", net_beat_layout(W), clk, idle=0.1,
                                seed=rng.randrange(1 << 30)) for p in range(CONFIG.ports)]
        self.tx = [StreamSink(dut, f"{name}_tx__{p}", net_beat_layout(W), clk,
                              backpressure=0.1, seed=rng.randrange(1 << 30))
                   for p in range(CONFIG.ports)]
        self.bus = CocotbBus(dut, f"{name}_bus__", clk)
        self.driver = NicDriver(nic_register_map(CONFIG), self.bus, CONFIG)
        self.rkey = 0xBEE0 | rkey_slot
        self.rkey_slot = rkey_slot

    def drivers(self):
        return [*self.port.drivers(), self.wr, self.completions, *self.rx, *self.tx]

    async def bring_up(self, peer, profile):
        d = self.driver
        await d.set_local(mac=mac_int(self.endpoint.mac), ip=ip_int(self.endpoint))
        await d.register_mr(slot=self.rkey_slot, rkey=self.rkey, pd=PD, base=MR_BASE,
                            length=MR_LENGTH)
        await d.configure_acks(ack_every=4, ack_delay=64, nak_interval=256)
        await d.ev_profile_online(0, profile, num_evs=min(4 * CONFIG.ports,
                                                          CONFIG.evs_per_profile), min_active=2)
        for qpn in range(QPS):
            await d.connect_qp(qpn, ev_profile=0, ev_offset=qpn, remote_qpn=qpn,
                               remote_mac=mac_int(peer.endpoint.mac),
                               remote_ip=ip_int(peer.endpoint), psn=PSN_BASE + qpn,
                               remote_psn=PSN_BASE + qpn, mpr=CONFIG.mpr_units,
                               max_wimm=min(4, CONFIG.max_wimm), pd=PD)


class Network:
    """Frames from one side's TX ports to the other side's RX ports: random delay per frame
    (reordering), random duplication; every frame checked with Scapy."""

    def __init__(self, source, sink, rng, clock, log):
        self.source, self.sink, self.rng, self.clock, self.log = source, sink, rng, clock, log
        self.frames = 0
        self.duplicates = 0

    async def run(self):
        taken = [0] * CONFIG.ports
        queue = []
        cycle = 0
        serial = 0
        while True:
            await RisingEdge(self.clock)
            cycle += 1
            for port in range(CONFIG.ports):
                packets = self.source.tx[port].packets()
                while taken[port] < len(packets):
                    frame = beats_to_bytes(packets[taken[port]], W)
                    taken[port] += 1
                    self.frames += 1
                    assert pk.icrc_ok(frame), f"bad ICRC on the wire: {frame.hex()}"
                    self.log.append((self.source.name, port, frame))
                    copies = 2 if self.rng.random() < DUPLICATE else 1
                    self.duplicates += copies - 1
                    for _ in range(copies):
                        serial += 1
                        heapq.heappush(queue, (cycle + self.rng.randint(1, DELAY), serial,
                                               port, frame))
            while queue and queue[0][0] <= cycle:
                _, _, port, frame = heapq.heappop(queue)
                self.sink.rx[port].send(frame_to_beats(frame, W))


def make_work(rng, side, peer):
    """Random WRs from ``side`` into ``peer``'s memory region, with their source bytes."""
    work = []
    offset = 0
    for index in range(MESSAGES):
        qpn = index % QPS
        length = rng.choice([0, 1, 63, 64, 1000, 1024, 1025, rng.randint(1, 3 * CONFIG.mtu)])
        imm = rng.random() < 0.5
        source = SRC_BASE + offset
        target = MR_BASE + offset
        data = rng.randbytes(length)
        side.memory.write(source, data)
        work.append({"qpn": qpn, "opcode": P.WrOpcode.RDMA_WRITE_WITH_IMM if imm
                     else P.WrOpcode.RDMA_WRITE, "wr_id": (ord(side.name) << 32) | index,
                     "local_addr": source, "remote_addr": target, "rkey": peer.rkey,
                     "length": length, "imm": rng.getrandbits(32) if imm else 0,
                     "data": data})
        offset += length + rng.randint(0, 64)
    return work


@cocotb.test()
async def loopback(dut):
    rng = random.Random(SEED)
    Clock(dut.clk, 8, unit="ns").start()
    dut.rst.value = 1
    a = Side(dut, "a", NIC_A, 1, rng)
    b = Side(dut, "b", NIC_B, 2, rng)
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for driver in a.drivers() + b.drivers():
        cocotb.start_soon(driver.run())
    cocotb.start_soon(a.port.run())
    cocotb.start_soon(b.port.run())
    log = []
    a_to_b = Network(a, b, random.Random(SEED + 1), dut.clk, log)
    b_to_a = Network(b, a, random.Random(SEED + 2), dut.clk, log)
    cocotb.start_soon(a_to_b.run())
    cocotb.start_soon(b_to_a.run())

    spec = load_profile_json(json.loads(
        (REPO / "sim" / "data" / "default-ev-profile.json").read_text()))
    await a.bring_up(b, spec.profile)
    await b.bring_up(a, spec.profile)
    dut._log.info("both NICs up; posting work")

    work = {"a": make_work(rng, a, b), "b": make_work(rng, b, a)}
    for side in (a, b):
        side.wr.send([{k: v for k, v in wr.items() if k != "data"} for wr in work[side.name]])

    def expected_completions(side):
        own = len(work[side.name])
        peer_imm = sum(1 for wr in work["b" if side.name == "a" else "a"]
                       if wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM)
        return own + peer_imm

    for cycle in range(400_000):
        if all(len(s.completions.raw) >= expected_completions(s) for s in (a, b)):
            break
        await RisingEdge(dut.clk)
        if cycle % 20_000 == 0 and cycle:
            dut._log.info(f"cycle {cycle}: completions a {len(a.completions.raw)}/"
                          f"{expected_completions(a)}, b {len(b.completions.raw)}/"
                          f"{expected_completions(b)}, frames {a_to_b.frames}+"
                          f"{b_to_a.frames}")
            if os.environ.get("LOOPBACK_DEBUG"):
                layout = completion_layout(CONFIG)
                for side in (a, b):
                    dut._log.info(f"{side.name} completions: "
                                  f"{[unpack(layout, r) for r in side.completions.raw][:4]}")
                    dut._log.info(f"{side.name} counters: {await side.driver.counters()}")
    else:
        counters = {s.name: await s.driver.counters() for s in (a, b)}
        raise AssertionError(f"work did not complete; counters {counters}")
    await ClockCycles(dut.clk, 50)

    if PCAP:
        pk.write_pcap(PCAP, [Ether(frame) for _, _, frame in log])

    layout = completion_layout(CONFIG)
    for side, peer in ((a, b), (b, a)):
        completions = [unpack(layout, raw) for raw in side.completions.raw]
        own = [c for c in completions if c["side"] == 0]
        remote = [c for c in completions if c["side"] == 1]
        for qpn in range(QPS):
            posted = [wr for wr in work[side.name] if wr["qpn"] == qpn]
            done = [c for c in own if c["qpn"] == qpn]
            assert [c["wr_id"] for c in done] == [wr["wr_id"] for wr in posted], \
                f"{side.name} QP {qpn}: requester completions out of order or missing"
            assert all(c["status"] == P.CompletionStatus.SUCCESS for c in done), done
            assert all(c["opcode"] == P.WcOpcode.RDMA_WRITE for c in done)
            imms = [wr["imm"] for wr in work[peer.name] if wr["qpn"] == qpn
                    and wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM]
            got = [c["imm"] for c in remote if c["qpn"] == qpn]
            assert got == imms, f"{side.name} QP {qpn}: immediates {got} != {imms}"
            assert all(c["opcode"] == P.WcOpcode.RECV_RDMA_WITH_IMM and c["imm_valid"]
                       for c in remote if c["qpn"] == qpn)
        for wr in work[side.name]:
            got = peer.memory.read(wr["remote_addr"], wr["length"])
            assert got == wr["data"], f"{side.name} wr {wr['wr_id']:#x}: memory differs"
    for side in (a, b):
        counters = await side.driver.counters()
        dut._log.info(f"{side.name}: {counters}")
        assert counters["rx_counters"]["bad_icrc"] == 0
        assert counters["responder_counters"]["bad_rkey"] == 0
        assert counters["responder_counters"]["out_of_bounds"] == 0
        assert counters["tx_counters"]["no_path"] == 0
    dut._log.info(f"frames a->b {a_to_b.frames} (+{a_to_b.duplicates} duplicated), "
                  f"b->a {b_to_a.frames} (+{b_to_a.duplicates} duplicated)")
