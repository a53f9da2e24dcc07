"""cocotb module behind ``mrc-nic replay``: frames of a capture through one NIC top.

The NIC is brought up as NIC B of ``sim/defaults.py`` (the receiver of the sample packets):
its addresses, memory region ``MR_RKEY`` at ``MR_BASE``, QP ``QPN_B`` connected to ``QPN_A``
of NIC A and expecting ``INITIAL_PSN``, an EV profile for its replies. Reads ``REPLAY_IN``
(JSON: config dict and frames as hex with their port), feeds the frames one at a time into the
RX ports, records per frame the parser's verdict and, for data packets, the responder's, and
every frame the NIC sends (ACKs, NAKs, probe responses) on any TX port. Writes ``REPLAY_OUT``.

After the last frame the bench drains: it runs until the NIC is idle, at most
:data:`MAX_DRAIN_CYCLES` cycles. Idle means both: no beat on any of the NIC's outputs (every TX
port, ``place``, ``completion``) for :data:`QUIET_CYCLES` cycles, and no ACK-delay timer that
may still fire before the bound: a timer starts with a data packet's responder verdict and fires
``ack_delay`` cycles later (the responder's reset value ``DEFAULT_ACK_DELAY``: the bench never
sets it), so while any responder verdict's ``ack_delay`` ends within :data:`QUIET_CYCLES` of the
span from now to the bound, the drain goes on (every verdict counts, whether or not it started a
timer). Every frame and verdict the full bound would record is recorded; only the cycles after
the NIC's last output are left out.
"""

import json
import os
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from hdl.config import NicConfig
from hdl.control.nicmap import nic_register_map
from hdl.packet.headers import DropReason, net_beat_layout
from hdl.transport.resp_defs import DEFAULT_ACK_DELAY, ResponderVerdict
from sim import defaults as D
from sim.driver.nic import NicDriver
from sim.tb.cocotb_host import CocotbBus, HostMemory, MemoryPort
from sim.tb.streams import StreamSink, StreamSource, beats_to_bytes, frame_to_beats

#: The replayed NIC's memory region: the slot is the rkey's low bits (docs/responder.md).
MR_SLOT = D.MR_RKEY & 0xF
PD = 1
#: The longest the drain after the last frame runs.
MAX_DRAIN_CYCLES = 2000
#: Cycles without a beat on any NIC output after which the NIC counts as idle (see the module
#: docstring): several times the longest gap between a frame's verdict and its response's first
#: beat, or between two beats of one response.
QUIET_CYCLES = 256




async def bring_up(driver, config):
    """NIC B of the default set-up, ready to receive the sample packets."""
    await driver.set_local(mac=D.mac_int(D.NIC_B.mac), ip=D.ip_int(D.NIC_B, config.ip_version))
    await driver.register_mr(slot=MR_SLOT, rkey=D.MR_RKEY, pd=PD, base=D.MR_BASE,
                             length=D.MR_LENGTH)
    spec = D.default_profile_spec()
    await driver.ev_profile_online(0, spec.profile, num_evs=min(config.evs_per_profile, 16))
    await driver.connect_qp(D.QPN_B, ev_profile=0, remote_qpn=D.QPN_A,
                            remote_mac=D.mac_int(D.NIC_A.mac),
                            remote_ip=D.ip_int(D.NIC_A, config.ip_version), psn=D.INITIAL_PSN,
                            remote_psn=D.INITIAL_PSN, mpr=config.mpr_units,
                            max_wimm=config.max_wimm, pd=PD)


@cocotb.test()
async def replay(dut):
    job = json.loads(open(os.environ["REPLAY_IN"]).read())
    config = NicConfig.from_dict(job["config"])
    width = config.data_width
    Clock(dut.clk, 8, unit="ns").start()
    dut.rst.value = 1
    sources = [StreamSource(dut, f"rx__{p}", net_beat_layout(width), dut.clk)
               for p in range(config.ports)]
    sinks = [StreamSink(dut, f"tx__{p}", net_beat_layout(width), dut.clk)
             for p in range(config.ports)]
    memory = HostMemory()
    port = MemoryPort(dut, "", config, memory, dut.clk)
    for name in ("wr",):
        getattr(dut, f"{name}__valid").value = 0
    dut.completion__ready.value = 1
    bus = CocotbBus(dut, "bus__", dut.clk)
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for driver in [*sources, *sinks, *port.drivers()]:
        cocotb.start_soon(driver.run())
    cocotb.start_soon(port.run())
    nic = NicDriver(nic_register_map(config), bus, config)
    await bring_up(nic, config)

    verdicts, transport = [], []
    cycles = [0]
    current = [None]
    last_output = [0]           # the last cycle any NIC output held a valid beat
    timer_starts = []           # the cycles of the responder's verdicts
    outputs = [sink.valid for sink in sinks] + [dut.place__valid, dut.completion__valid]

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            cycles[0] += 1
            if int(dut.rx_verdict_valid.value):
                verdicts.append(DropReason(int(dut.rx_verdict_reason.value.to_unsigned())))
            if int(dut.resp_verdict_valid.value):
                transport.append((current[0],
                                  ResponderVerdict(int(dut.resp_verdict.value.to_unsigned()))))
                timer_starts.append(cycles[0])
            if any(int(valid.value) for valid in outputs):
                last_output[0] = cycles[0]

    def idle(end):
        now = cycles[0]
        if now - last_output[0] < QUIET_CYCLES:
            return False
        return not any(now < start + DEFAULT_ACK_DELAY + QUIET_CYCLES
                       and start + DEFAULT_ACK_DELAY - QUIET_CYCLES <= end
                       for start in timer_starts)

    cocotb.start_soon(watch())
    started = time.monotonic()
    for number, frame in enumerate(job["frames"]):
        current[0] = number
        sources[frame["port"]].send(frame_to_beats(bytes.fromhex(frame["hex"]), width))
        for _ in range(100_000):
            await RisingEdge(dut.clk)
            if len(verdicts) > number:
                break
        else:
            raise AssertionError(f"frame {number + 1}: no verdict after 100000 cycles")
        await ClockCycles(dut.clk, 12)      # the responder's verdict follows the parser's
    end = cycles[0] + MAX_DRAIN_CYCLES      # the last responses and delayed ACKs drain
    while cycles[0] < end and not idle(end):
        await RisingEdge(dut.clk)

    responses = []
    for plane, sink in enumerate(sinks):
        for beats in sink.packets():
            responses.append({"port": plane, "hex": beats_to_bytes(beats, width).hex()})
    per_frame = {}
    for number, verdict in transport:
        per_frame.setdefault(number, verdict.name.lower())
    counters = await nic.counters()
    with open(os.environ["REPLAY_OUT"], "w") as f:
        json.dump({
            "verdicts": [v.name.lower() for v in verdicts],
            "transport": [per_frame.get(n) for n in range(len(job["frames"]))],
            "cycles": cycles[0],
            "wall_seconds": time.monotonic() - started,
            "responses": responses,
            "placed_bytes": memory.writes,
            "counters": {r.name.lower(): counters["rx_counters"][r.name.lower()]
                         for r in DropReason},
            "responder_counters": counters["responder_counters"],
        }, f)
