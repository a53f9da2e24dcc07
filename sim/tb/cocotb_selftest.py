"""cocotb test: run a :class:`~sim.tb.selftest.SelfTestBench` for ``CYCLES`` cycles.

Reset stays low (as in the Amaranth simulator, registers start at their initial values). The
bench's knobs (``KNOBS``, a JSON object of input name to value) are set before the first
clock edge. The UART line is sampled once per cycle, between two rising edges; after the
last cycle the counters, the error flag and the external frame count are written to
``RESULT`` as JSON.
"""

import json
import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

CYCLES = int(os.environ["CYCLES"])
PERIOD_NS = float(os.environ.get("PERIOD_NS", "10"))
ETH_PERIOD_NS = os.environ.get("ETH_PERIOD_NS")
RESULT = Path(os.environ["RESULT"])
KNOBS = json.loads(os.environ.get("KNOBS", "{}"))


@cocotb.test()
async def run_selftest(dut):
    dut.rst.value = 0
    for name, value in KNOBS.items():
        getattr(dut, name).value = value
    if ETH_PERIOD_NS is not None:
        dut.eth_rst.value = 0
        Clock(dut.eth_clk, float(ETH_PERIOD_NS), unit="ns").start()
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    levels = []
    uart = dut.uart_tx
    for _ in range(CYCLES):
        await FallingEdge(dut.clk)
        levels.append(str(int(uart.value)))
    words = len(dut.counters) // 32
    packed = dut.counters.value.to_unsigned()
    RESULT.write_text(json.dumps({
        "counters": [(packed >> (32 * n)) & 0xFFFF_FFFF for n in range(words)],
        "error": int(dut.error.value),
        "ext_frames": dut.ext_frames.value.to_unsigned(),
        "levels": "".join(levels),
    }))
