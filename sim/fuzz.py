"""``mrc-nic fuzz``: hostile frames against two RTL NICs while legitimate traffic runs.

Two RTL NICs (the main job's pair, ``docs/sim.md``) run over the multi-plane fabric under
Verilator with the C++ stream agents. Both move legitimate WRITE and WRITE WITH IMMEDIATE
traffic on their *live* QPs, checked byte for byte; NIC a's *victim* QPs send to NIC b's; and
the fabric's hostile source (:class:`HostileSource`, :mod:`sim.mutants`) injects forged and
mutated frames of every MRC packet type into NIC b's receive ports (data, probes) and NIC a's
(acknowledgements). The bench (:mod:`sim.tb.cocotb_fuzz`) watches every placement, the QP
invariants over the register bus, every stream for stalls and the live traffic for progress;
this module turns its result into the JSON report. ``docs/fuzz.md`` describes the command, the
mutants, the report and the bounds.

The QP plan of both NICs (the fuzzer's bring-up, :func:`sim.tb.cocotb_fuzz.Bench.bring_up`):

======================  ==========================================================
QPs ``VICTIM_QPS``      connected, PD ``VICTIM_PD``, their own MR; anything goes
QPs ``LEGIT_QPS``       connected, PD ``LEGIT_PD``, the live traffic
QPs ``INIT_QPS``        left in INIT (a wrong state)
every other QP          left in RESET
======================  ==========================================================
"""

import json
import random
import time
from pathlib import Path

from .env import BUILD
from .errors import fail

__all__ = ["register", "run_fuzz", "make_report", "HostileSource", "LEGIT_QPS", "VICTIM_QPS",
           "INIT_QPS", "reset_qps"]

# -- the plan ---------------------------------------------------------------------------------

VICTIM_QPS = (0, 1)
LEGIT_QPS = (2, 3)
INIT_QPS = (4,)
LEGIT_PD, VICTIM_PD, FOREIGN_PD = 1, 2, 3

#: MR slots: the rkey's low bits select the slot (docs/responder.md), so each rkey ends in its
#: slot. The live MR is the one the main job registers (slot 1 on a, 2 on b).
VICTIM_SLOT, FOREIGN_SLOT = 5, 9
VICTIM_RKEY = 0x5EC7_1005
FOREIGN_RKEY = 0xF0E1_0009
#: rkeys a forged packet may carry that no QP may use: a valid MR of a PD no QP has, a slot
#: never registered, the victim's slot with other high bits.
FOREIGN_RKEYS = (FOREIGN_RKEY, 0x0BAD_000C, VICTIM_RKEY ^ 0x0100_0000)

#: Host memory of each NIC: the source ring (both kinds of traffic) and the three MRs.
SRC_BASE = 0x2000_0000
LEGIT_MR_BASE = 0x1_0000_0000
VICTIM_MR, VICTIM_MR_BYTES = 0x3_0000_0000, 64 * 1024
FOREIGN_MR, FOREIGN_MR_BYTES = 0x4_0000_0000, 16 * 1024
#: Live traffic: WRs outstanding per QP (the build's WR slots), the ring of target slots per QP
#: (a slot is reused only after its WR completed and was checked), bytes per slot (4 MTUs of
#: the largest MTU).
OUTSTANDING = 4
RING = 16
SLOT_BYTES = 4 * 4096
LEGIT_MR_BYTES = len(LEGIT_QPS) * RING * SLOT_BYTES
SRC_BYTES = LEGIT_MR_BYTES + len(VICTIM_QPS) * SLOT_BYTES
#: Victim QPs give up fast (timeout 1.024 us * 2**t, t = 5; two retries), so a victim the
#: hostile frames desynchronised goes to ERROR and is re-armed instead of retrying forever.
VICTIM_TIMEOUT = 5
VICTIM_RETRIES = 2


def legit_slot(side):
    return 1 if side == "a" else 2


def legit_rkey(side):
    """The rkey of ``side``'s live MR (as the main job: 0xBEE0 | slot)."""
    return 0xBEE0 | legit_slot(side)


def legit_mr(side):
    return LEGIT_MR_BASE


def legit_offset(qpn, slot):
    return (LEGIT_QPS.index(qpn) * RING + slot) * SLOT_BYTES


def victim_src_offset(qpn):
    return LEGIT_MR_BYTES + VICTIM_QPS.index(qpn) * SLOT_BYTES


def first_psn(qpn):
    """First PSN of a QP: near the top, so that the 24-bit PSN wraps during a run."""
    return (0xFFFF00 + 0x10 * qpn) & 0xFFFFFF


def reset_qps(qps):
    return tuple(q for q in range(qps) if q not in VICTIM_QPS + LEGIT_QPS + INIT_QPS)


# -- the hostile source -----------------------------------------------------------------------

class HostileSource:
    """The fabric's hostile source (``Fabric(hostile=...)``): forged frames from ``mutator``
    at ``load`` beats per engine cycle on average (the NICs' receive path takes one), each on
    a random plane, until ``total`` frames. Keeps the last frames in ``history`` (a deque) for
    a failure's vector. Set ``paused`` to hold injection (a receive backlog)."""

    def __init__(self, mutator, *, total, load, planes, period_ns, seed, history, cycle_of,
                 lanes=8):
        self.mutator = mutator
        self.total = total
        self.ns_per_beat = period_ns / load
        self.planes = planes
        self.rng = random.Random(f"mrc-fuzz-planes/{seed}")
        self.history = history
        self.cycle_of = cycle_of
        self.lanes = lanes
        self.injected = 0
        self.next_ns = 0.0
        self.paused = False

    def __call__(self, now):
        out = []
        if self.paused:
            self.next_ns = max(self.next_ns, now)
            return out
        # A late wake does not make up for lost time at once: at most a few mutants.
        self.next_ns = max(self.next_ns, now - 64 * self.ns_per_beat * 16)
        while self.injected < self.total and self.next_ns <= now:
            name, frames = self.mutator.next()
            frames = frames[:self.total - self.injected]
            plane = self.rng.randrange(self.planes)
            beats = 0
            for dst, frame in frames:
                out.append((dst, plane, frame))
                beats += -(-max(len(frame), 1) // self.lanes)
                self.history.append({"cycle": self.cycle_of(now), "mutant": name, "dst": dst,
                                     "plane": plane, "hex": frame.hex()})
            self.injected += len(frames)
            self.next_ns += beats * self.ns_per_beat
        return out


class ReplaySource:
    """A hostile source that injects a vector's frames again (``frames`` as
    :func:`write_vectors` saves them), each at its recorded distance from the first, starting
    ``warmup_ns`` into the run, on its plane (modulo ``planes``)."""

    def __init__(self, frames, *, planes, period_ns, warmup_ns, history, cycle_of):
        first = frames[0]["cycle"] if frames else 0
        self.frames = [((f["cycle"] - first) * period_ns + warmup_ns, f["dst"],
                        f["plane"] % planes, bytes.fromhex(f["hex"]), f["mutant"])
                       for f in frames]
        self.total = len(self.frames)
        self.history = history
        self.cycle_of = cycle_of
        self.injected = 0
        self.paused = False

    def __call__(self, now):
        out = []
        while self.injected < self.total and self.frames[self.injected][0] <= now:
            _, dst, plane, frame, mutant = self.frames[self.injected]
            out.append((dst, plane, frame))
            self.history.append({"cycle": self.cycle_of(now), "mutant": mutant, "dst": dst,
                                 "plane": plane, "hex": frame.hex()})
            self.injected += 1
        return out


# -- command line -----------------------------------------------------------------------------

#: Bounds of the checks (docs/fuzz.md, "Hangs").
STALL_CYCLES = 20_000
PROGRESS_CYCLES = 250_000
CHECK_CYCLES = 20_000
MAX_PACKETS = 100_000_000
LOADS = (0.01, 1.0)


def register(subparsers):
    p = subparsers.add_parser(
        "fuzz", help="hostile frames against two RTL NICs while live traffic runs (docs/fuzz.md)",
        description="Run two RTL NICs (Verilator) over the fabric with live traffic both ways "
                    "and inject forged and mutated frames of every MRC packet type; check "
                    "every placement, the QP invariants, stalls and progress, and the live "
                    "data byte for byte; write the JSON report. Exit status 1 when a check "
                    "failed.")
    p.add_argument("--packets", type=int, default=10_000, metavar="N",
                   help=f"hostile frames to inject, 1 to {MAX_PACKETS:,}")
    p.add_argument("--seed", type=int, default=1, metavar="N",
                   help="random seed (mutants, live traffic, fabric), 0 or more")
    p.add_argument("--json", type=Path, default=BUILD / "fuzz" / "fuzz.json",
                   metavar="OUT.json", help="the report")
    p.add_argument("--load", type=float, default=0.5, metavar="X",
                   help=f"hostile beats per engine cycle, {LOADS[0]} to {LOADS[1]} (the "
                        f"receive path takes one)")
    p.add_argument("--planes", type=int, default=8, metavar="N", help="planes (NIC ports), 1-16")
    p.add_argument("--mtu", type=int, default=1024, metavar="N",
                   help="path MTU: 256, 512, 1024, 2048 or 4096")
    p.add_argument("--vectors", type=Path, default=BUILD / "fuzz" / "vectors", metavar="DIR",
                   help="where each failure's vector goes (the frames before it, as JSON)")
    p.add_argument("--vector", type=Path, default=None, metavar="VECTOR.json",
                   help="inject a vector's frames again instead of new mutants (on its "
                        "seed, planes and MTU; the flags above are not used)")
    p.set_defaults(func=run)


def _check_args(args):
    from .scenario import MTUS
    if not 1 <= args.packets <= MAX_PACKETS:
        return fail(f"must be an integer from 1 to {MAX_PACKETS}, not {args.packets}",
                    field="--packets")
    if args.seed < 0:
        return fail(f"must be an integer, 0 or more, not {args.seed}", field="--seed")
    if not LOADS[0] <= args.load <= LOADS[1]:
        return fail(f"must be a number from {LOADS[0]} to {LOADS[1]}, not {args.load}",
                    field="--load")
    if not 1 <= args.planes <= 16:
        return fail(f"must be an integer from 1 to 16, not {args.planes}", field="--planes")
    if args.mtu not in MTUS:
        return fail(f"must be one of {', '.join(map(str, MTUS))}, not {args.mtu}",
                    field="--mtu")
    return 0


def read_vector(path):
    """A vector file (:func:`write_vectors`) as a dict; :class:`UsageError` naming
    ``--vector`` when it cannot be read or is not one."""
    from .errors import UsageError
    try:
        vector = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError("--vector", f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise UsageError("--vector", f"{path}: not valid JSON: {e}") from None
    if not isinstance(vector, dict) or not isinstance(vector.get("run"), dict) \
            or not vector.get("frames"):
        raise UsageError("--vector", f"{path}: not a fuzz vector (needs run and frames)")
    return vector


def run(args):
    if args.vector is not None:
        vector = read_vector(args.vector)
        run_ = vector["run"]
        args.seed, args.planes, args.mtu = run_["seed"], run_["planes"], run_["mtu"]
        args.load, args.packets = run_.get("load", 0.5), len(vector["frames"])
    status = _check_args(args)
    if status:
        return status
    for flag, path in (("--json", args.json.parent), ("--vectors", args.vectors)):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return fail(f"{path}: cannot create: {e.strerror}", field=flag)
    report = run_fuzz(packets=args.packets, seed=args.seed, load=args.load, planes=args.planes,
                      mtu=args.mtu, out=args.json, vectors=args.vectors,
                      replay=vector["frames"] if args.vector is not None else None)
    print(summary(report))
    return 0 if report["ok"] else 1


# -- running ----------------------------------------------------------------------------------

def scenario_for(*, seed, planes, mtu):
    """The main job's default scenario on ``planes`` and ``mtu``, without a failure: the
    fabric, the NIC build, ACK coalescing, loss recovery and QP timers of the fuzz run."""
    from .scenario import SCENARIOS
    return SCENARIOS["default"].replace(name="fuzz", seed=seed, planes=planes, mtu=mtu,
                                        fail_plane=None, fail_at_us=None, recover_at_us=None)


def build_dir_for(scn):
    """The main job's build folder of ``scn`` (the fuzz run's NICs are the main job's)."""
    from .mainjob import _build_dir
    return _build_dir(scn)


def run_fuzz(*, packets, seed, load=0.5, planes=8, mtu=1024, out=None, vectors=None,
             build_dir=None, quick_build=False, log=print, stall_cycles=STALL_CYCLES,
             progress_cycles=PROGRESS_CYCLES, check_cycles=CHECK_CYCLES, max_cycles=None,
             replay=None):
    """Run the fuzzer; write the report to ``out`` (and each failure's vector into
    ``vectors``) when given; return the report. ``replay``: a vector's frames, injected
    again instead of new mutants (:class:`ReplaySource`; ``packets`` is then their count).

    ``build_dir``/``quick_build`` as :func:`sim.mainjob.run_scenario`'s (the build is the main
    job's, with the C++ agents: ``<build_dir>-dpi``)."""
    import tempfile

    from .mainjob import rtl_nscc_setting
    from .scenario import nic_config_for
    from .tb.dpi import pair_build
    from .tb.runner import run_cocotb

    scn = scenario_for(seed=seed, planes=planes, mtu=mtu)
    config = nic_config_for(scn)
    # The main job's NICs: the NSCC engine built in, its window chosen by the scenario.
    nscc = rtl_nscc_setting(scn, config)
    base = Path(build_dir or build_dir_for(scn))
    build = base.with_name(base.name + "-dpi")
    if max_cycles is None:
        # Far more than the injection takes at the load asked: a run that gets there is stuck.
        max_cycles = int(packets * 200 / load) + 4 * progress_cycles
    log(f"mrc-nic fuzz: {packets} hostile frames, seed {seed}, two RTL NICs ({config.ports} "
        f"ports, {config.data_width}-bit, verilator); a cached build is reused")
    wall0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        job_path = Path(tmp) / "job.json"
        job = {"scenario": scn.to_dict(), "seed": seed, "packets": packets, "load": load,
               "stall_cycles": stall_cycles, "progress_cycles": progress_cycles,
               "check_cycles": check_cycles, "max_cycles": max_cycles,
               "result": str(result_path), "replay": replay}
        # In a file: a vector's frames are too long for the environment.
        job_path.write_text(json.dumps(job))
        run_cocotb(**pair_build(config, nscc), test_module="sim.tb.cocotb_fuzz",
                   build_dir=build, sim="verilator", waves=False, log=log, reuse=True,
                   quick_build=quick_build,
                   extra_env={"FUZZ_JOB": str(job_path), "MRC_DPI": "1"})
        result = json.loads(result_path.read_text())
    result["total_wall_s"] = time.monotonic() - wall0
    report = make_report(result, seed=seed, load=load, packets=packets, config=config,
                         bounds={"stall_cycles": stall_cycles,
                                 "progress_cycles": progress_cycles,
                                 "check_cycles": check_cycles, "max_cycles": max_cycles})
    if vectors is not None:
        report["vectors"] = write_vectors(result["failures"], Path(vectors), seed=seed,
                                          packets=packets, load=load, planes=planes, mtu=mtu)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def write_vectors(failures, directory, *, seed, packets, load, planes, mtu):
    """One JSON file per failure: the run that found it (enough to run it again) and the
    hostile frames injected before it. Returns the paths."""
    paths = []
    for number, failure in enumerate(failures):
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"seed{seed}-{number}-{failure['kind']}.json"
        vector = {"run": {"seed": seed, "packets": packets, "load": load, "planes": planes,
                          "mtu": mtu},
                  "failure": {k: v for k, v in failure.items() if k != "frames"},
                  "frames": failure["frames"]}
        path.write_text(json.dumps(vector, indent=1) + "\n")
        paths.append(str(path))
    return paths


# -- the report -------------------------------------------------------------------------------

def _delta(after, before):
    return {name: (value - before.get(name, 0)) & 0xFFFFFFFF for name, value in after.items()}


#: Counter blocks that give verdicts, and the prefix of their reasons in ``verdicts``.
VERDICT_BLOCKS = {"rx_counters": "parser", "responder_counters": "responder",
                  "requester_counters": "requester"}


def make_report(result, *, seed, load, packets, config, bounds):
    """The report of a fuzz run (``docs/fuzz.md``, "The report")."""
    counters = {side: {block: _delta(values, result["counters_before"][side][block])
                       for block, values in blocks.items()}
                for side, blocks in result["counters"].items()}
    verdicts = {}
    for side in ("a", "b"):
        for block, prefix in VERDICT_BLOCKS.items():
            for name, count in counters[side][block].items():
                key = f"{prefix}.{'accepted' if name == 'none' else name}"
                verdicts[key] = verdicts.get(key, 0) + count
    legit = result["legit"]
    legit_verified = (result["end"] == "done" and not result["legit_errors"]
                      and legit["wrs_posted"] > 0
                      and legit["wrs_verified"] == legit["wrs_posted"])
    wall = result["wall_s"]
    report = {
        "packets": result["packets"],
        "seed": seed,
        "load": load,
        "verdicts": dict(sorted(verdicts.items())),
        "hangs": len(result["hangs"]),
        "writes_outside_regions": result["outside_bytes"],
        "state_errors": len(result["state_errors"]),
        "legit_verified": legit_verified,
        "cycles": result["cycles"],
        "sim_us": round(result["sim_us"], 3),
        "wall_s": round(wall, 2),
        "total_wall_s": round(result["total_wall_s"], 2),
        "packets_per_s": round(result["packets"] / wall, 1) if wall else None,
        "cycles_per_s": round(result["cycles"] / wall, 1) if wall else None,
        "mutants": result["mutants"],
        "legit": {**legit, "errors": result["legit_errors"]},
        "victims": result["victim"],
        "end": result["end"],
        "bounds": bounds,
        "hang_details": result["hangs"],
        "outside_write_details": result["outside"],
        "state_error_details": result["state_errors"],
        "qp_errors": result["qp_errors"],
        "ev_events": result["ev_events"],
        "max_stall_cycles": result["max_stall_cycles"],
        "placed_bytes": result["placed_bytes"],
        "counters": counters,
        "config": {"ports": config.ports, "mtu": config.mtu, "qps": config.qps,
                   "window_psns": config.mpr_units * 128},
        "requested_packets": packets,
    }
    report["ok"] = bool(report["hangs"] == 0 and report["writes_outside_regions"] == 0
                        and report["state_errors"] == 0 and legit_verified)
    return report


def summary(report):
    mutants = sum(report["mutants"].values())
    lines = [
        f"fuzz seed {report['seed']}: {report['packets']} hostile frames ({mutants} by "
        f"mutant) in {report['cycles']} cycles, {report['wall_s']} s "
        f"({report['packets_per_s']} packets/s)",
        f"  hangs {report['hangs']}, writes outside regions {report['writes_outside_regions']} "
        f"bytes, state errors {report['state_errors']}, live traffic verified "
        f"{report['legit_verified']} ({report['legit']['wrs_verified']} of "
        f"{report['legit']['wrs_posted']} WRs, {report['legit']['bytes_verified']} bytes)",
        f"  victims: {report['victims']['wrs_posted']} WRs, {report['victims']['rearms']} "
        f"re-armed",
        "  verdicts: " + ", ".join(f"{k} {v}" for k, v in report["verdicts"].items() if v
                                   and not k.startswith(("requester.packets", "responder.acks"))),
        f"  {'OK' if report['ok'] else 'FAILED'}",
    ]
    for path in report.get("vectors", []):
        lines.append(f"  vector: {path}")
    return "\n".join(lines)
