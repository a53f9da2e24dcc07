"""Incast on the model NIC (``build/bench/incast.json``): N senders to one receiver over a
switch per plane, with the ECN window and with NSCC side by side.

Each entry runs one scenario of the main job (:mod:`sim.mainjob`) with ``--backend model
--pattern incast --qps 1 --fail-plane -1``: NICs ``b`` onwards each write :data:`BYTES` to
NIC ``a`` on one QP (so a flow is a sender and NSCC's state sees all of its sender's ACKs),
the scenarios' fabric otherwise (8 planes of 1 Gb/s, 16 KiB queues, ECN above 4 KiB, no
trimming). The largest fan-in is 15:1, as a fabric joins at most 16 NICs.

Each entry keeps its report's efficiency (over the receiver's payload capacity), Jain's index
over the senders' goodputs, the egress queues' waits, drops, resends and timeouts; its folder
``build/bench/incast/<entry>/`` has the report, the capture and the plots (``egress.png``: the
waits at the egress ports over time).
"""

import json
import platform
from pathlib import Path

from .env import BUILD
from .mainjob import run_scenario
from .scenario import scenario

__all__ = ["run", "ENTRIES", "BYTES", "SENDERS", "CCS"]

#: Payload bytes each sender writes to the receiver.
BYTES = 256 * 1024
SENDERS = (4, 8, 15)
CCS = ("ecn", "nscc")
ENTRIES = tuple(f"incast-{n}to1-{cc}" for n in SENDERS for cc in CCS)
SEED = 1


def _entry(name):
    senders, cc = name.removeprefix("incast-").split("to1-")
    return int(senders), cc


def _figures(report):
    keys = ("efficiency", "goodput_gbps", "receiver_payload_capacity_gbps", "jain_fairness",
            "queue_delay_us", "fabric_data_drops", "retransmissions", "timeouts", "trims",
            "bytes_offered", "bytes_lost", "duration_us", "finished", "ok", "cc")
    out = {k: report[k] for k in keys}
    rates = [f["goodput_gbps"] for f in report["flows"]]
    out["flow_goodput_gbps"] = {"min": min(rates), "max": max(rates)}
    out["ecn_marked"] = sum(p.get("ecn-marked", 0) for p in report["fabric"]["planes"])
    out["seed"] = report["scenario"]["seed"]
    out["sim"] = report["sim"]
    return out


def run(out_dir=None, *, entries=ENTRIES, log=print, **overrides):
    out_dir = Path(out_dir or BUILD / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in entries:
        senders, cc = _entry(name)
        values = {"backend": "model", "nics": senders + 1, "pattern": "incast", "qps": 1,
                  "bytes": BYTES, "fail_plane": -1, "cc": 1, "cc_algorithm": cc,
                  "seed": SEED, **overrides}
        scn = scenario("default", **values).replace(name=name)
        log(f"bench: {name} (model, {senders} senders, cc {cc}) ...")
        report = run_scenario(scn, out_dir / "incast" / name, log=log)
        results[name] = _figures(report)
        q = report["queue_delay_us"]
        log(f"  efficiency {report['efficiency']:.3f}, Jain {report['jain_fairness']}, "
            f"queue p50/p99/max {q['p50']}/{q['p99']}/{q['max']} us, "
            f"drops {report['fabric_data_drops']}")
    document = {"benchmark": "incast on the model NIC", "machine": platform.node(),
                "python": platform.python_version(), "bytes_per_sender": BYTES,
                "entries": results}
    (out_dir / "incast.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    log(f"wrote {out_dir / 'incast.json'}")
    return document
