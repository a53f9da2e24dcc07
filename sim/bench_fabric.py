"""Whole-NIC benchmarks over the fabric (``build/bench/fabric.json``, ``recovery.json``).

Each entry runs one scenario of the main job (:mod:`sim.mainjob`) on two RTL NICs and keeps
its report's key figures, side by side. Every entry runs with the scenarios' defaults (NSCC,
the coalesced ACK policy of ``docs/responder.md``, SACK inference K = 8, time-based inference
``reo_wnd`` 48, the port watch at 20 / 40 units) but for the changes of :data:`SIZES`:

* ``clean``: efficiency on a clean 8-plane fabric (target >= 0.97);
* ``clean-oneway``: the same transfer from one NIC only, as ``ib_write_bw`` measures by
  default: the ACKs then travel on the otherwise idle reverse planes, so the figure is the
  NIC's own datapath efficiency; with traffic both ways each side's ACKs share its planes with
  its data (``wire_shares`` in the report);
* ``clean-coalesced``: ``clean`` without the port watch and the time rule (``port_wnd`` and
  ``reo_wnd`` 0; its ACK settings are the defaults);
* ``plane-failure``: one of 8 planes blackholed mid-transfer: goodput relative to the healthy
  line rate (target >= 0.85), bytes lost (must be 0) and the recovery figures;
* ``plane-failure-oneway``: ``plane-failure`` from one NIC only (as ``clean-oneway``);
* ``timeout-only``: the same failure with every inference off: SACK and time-based loss
  inference and the port watch (recovery by the retransmit timer alone);
* ``plane-failure-sack``: the same failure with SACK inference alone (``reo_wnd`` 0);
* ``ecmp`` against ``mrc-8qp``: the single-path baseline against MRC with as many QPs as
  planes (target ratio >= 1.5);
* ``loss1``: 1 % random loss (target efficiency >= 0.9);
* ``loss1-reorder``: the same with a reorder window of 48 units (the default now, so the same
  run as ``loss1``);
* ``loss1-oneway``: ``loss1`` from one NIC only (as ``clean-oneway``);
* simulated cycles per second of the two-NIC system per simulator (a short run each).

``recovery.json`` puts ``plane-failure``, ``timeout-only`` and ``plane-failure-sack`` side by
side (the loss-recovery figures of ``docs/performance.md``).
"""

import json
import platform
from pathlib import Path

from .env import BUILD
from .mainjob import run_scenario
from .scenario import scenario

__all__ = ["run", "ENTRIES"]

ENTRIES = ("clean", "clean-oneway", "clean-coalesced", "plane-failure", "plane-failure-oneway",
           "timeout-only", "plane-failure-sack", "ecmp", "mrc-8qp", "loss1", "loss1-reorder",
           "loss1-oneway")
#: Entries that are a named scenario with other settings (``SIZES``).
BASES = {"clean-oneway": "clean", "clean-coalesced": "clean",
         "plane-failure-sack": "plane-failure", "plane-failure-oneway": "plane-failure",
         "loss1-reorder": "loss1", "loss1-oneway": "loss1"}
#: Per-entry changes to the named scenarios: transfers long enough that the first and last
#: round trips weigh little, and a failure in the middle with a recovery (goodput before,
#: during and after). Fate sharing is off under random loss, where a single loss would cost a
#: whole plane.
SIZES = {
    "clean": {"bytes": 1 << 20},
    "clean-oneway": {"bytes": 1 << 20, "both_ways": False},
    "clean-coalesced": {"bytes": 1 << 20, "ack_every": 16, "ack_delay": 4096,
                        "coalesce_gaps": 1, "gap_depth": 8, "port_wnd": 0, "reo_wnd": 0},
    "plane-failure": {"bytes": 1 << 20, "fail_at_us": 300.0, "recover_at_us": 700.0},
    "plane-failure-oneway": {"bytes": 1 << 20, "fail_at_us": 300.0, "recover_at_us": 700.0,
                             "both_ways": False},
    "timeout-only": {"bytes": 1 << 20, "fail_at_us": 300.0, "recover_at_us": 700.0},
    "plane-failure-sack": {"bytes": 1 << 20, "fail_at_us": 300.0, "recover_at_us": 700.0,
                           "reo_wnd": 0},
    "ecmp": {"bytes": 512 << 10},
    "mrc-8qp": {"bytes": 512 << 10},
    "loss1": {"bytes": 1 << 20, "fate": 0},
    "loss1-reorder": {"bytes": 1 << 20, "fate": 0, "reo_wnd": 48},
    "loss1-oneway": {"bytes": 1 << 20, "fate": 0, "both_ways": False},
}


def _figures(report):
    keys = ("goodput_gbps", "efficiency", "payload_capacity_gbps", "line_rate_gbps",
            "bytes_offered", "bytes_delivered", "bytes_lost", "bytes_corrupted",
            "completions_in_order", "packets_sent", "retransmissions", "timeouts",
            "inferred_losses", "trims", "duration_us", "finished", "ok")
    out = {k: report[k] for k in keys}
    out["goodput_over_line_rate"] = round(report["goodput_gbps"] / report["line_rate_gbps"], 4)
    out["failure"] = report["failure"]
    out["wire_shares"] = report["wire_shares"]
    out["ev_events"] = len(report["ev_events"])
    # Ports the port watch reported down, per NIC (docs/recovery.md, "Port watch").
    out["port_downs"] = {side: counters["tx_counters"]["port_downs"]
                         for side, counters in report.get("counters", {}).items()}
    out["sim"] = report["sim"]
    return out


def run(out_dir=None, *, entries=ENTRIES, sims=("verilator",), log=print, **overrides):
    out_dir = Path(out_dir or BUILD / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in entries:
        base = BASES.get(name, name)
        scn = scenario(base, **{**SIZES.get(name, {}), **overrides}).replace(name=name)
        where = f"RTL, {scn.sim}" if scn.backend == "rtl" else "model"
        log(f"bench: scenario {name} ({where}) ...")
        report = run_scenario(scn, out_dir / "fabric" / name, log=log)
        results[name] = _figures(report)
        log(f"  goodput {report['goodput_gbps']:.3f} Gb/s, efficiency {report['efficiency']:.3f},"
            f" lost {report['bytes_lost']}, {report['sim']['cycles_per_s']} cycles/s")
    speed = {}
    for sim in sims:
        if sim == "verilator" and "clean" in results:
            speed[sim] = results["clean"]["sim"]
            continue
        log(f"bench: simulated cycles per second, {sim} (a short run) ...")
        scn = scenario("clean", sim=sim, max_us=4.0, bytes=16 * 1024).replace(
            name=f"speed-{sim}")
        report = run_scenario(scn, out_dir / "fabric" / scn.name, log=log)
        speed[sim] = report["sim"]
    comparison = {}
    if "ecmp" in results and "mrc-8qp" in results:
        comparison["mrc_over_ecmp_goodput"] = round(
            results["mrc-8qp"]["goodput_gbps"] / max(results["ecmp"]["goodput_gbps"], 1e-9), 3)
    document = {"benchmark": "two RTL NICs over the multi-plane fabric",
                "machine": platform.node(), "python": platform.python_version(),
                "scenarios": results, "comparison": comparison,
                "cycles_per_second": speed}
    (out_dir / "fabric.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    if "plane-failure" in results and "timeout-only" in results:
        recovery = {name: {"failure": results[name]["failure"],
                           "goodput_gbps": results[name]["goodput_gbps"],
                           "retransmissions": results[name]["retransmissions"],
                           "timeouts": results[name]["timeouts"],
                           "inferred_losses": results[name]["inferred_losses"],
                           "port_downs": results[name]["port_downs"],
                           "bytes_lost": results[name]["bytes_lost"]}
                    for name in ("plane-failure", "timeout-only", "plane-failure-sack")
                    if name in results}
        (out_dir / "recovery.json").write_text(json.dumps(
            {"benchmark": "one of 8 planes blackholed mid-transfer: SACK plus time-based "
                          "inference (plane-failure, the default) against timeout only "
                          "(timeout-only) and SACK inference alone (plane-failure-sack); the "
                          "port watch on in the first and the last",
             "results": recovery}, indent=2, default=str) + "\n")
    log(f"wrote {out_dir / 'fabric.json'}")
    return document
