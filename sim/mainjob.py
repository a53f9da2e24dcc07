"""``mrc-nic sim``: the main job. Two NICs over the multi-plane fabric, one scenario, one report.

The RTL backend runs :mod:`sim.tb.cocotb_fabric` on two RTL NICs (Verilator by default); the
model backend runs the same scenario on two reference-model NICs (:mod:`sim.model.pair`).
Either way the raw result and the fabric's capture become ``report.json``, ``traffic.pcapng``
(one interface per plane), ``traffic.pcap`` and ``goodput.png`` in ``build/sim/<scenario>/``,
and a short summary on the terminal. ``docs/sim.md`` describes every key of the report.
"""

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from hdl import protocol as P

from .analysis import analyse
from .env import BUILD, REPO
from .errors import fail, nic_config_from
from .scenario import (
    PATTERNS,
    SCENARIOS,
    ScenarioError,
    allowed,
    describe_scenarios,
    line_rate_gbps,
    load,
    nic_config_for,
)
from .waves import add_waves_arguments

__all__ = ["register", "run_scenario", "make_report", "payload_capacity_gbps",
           "per_packet_overhead"]


# -- command line -----------------------------------------------------------------------------

FLAGS = [
    # (flag, scenario field, type, help); --help adds the allowed values (sim/scenario.py) and
    # the default scenario's value.
    ("--nics", "nics", int, "NICs on the fabric (more than 2: a switch per plane; the RTL "
                            "backend runs up to 5, under Verilator)"),
    ("--pattern", "pattern", str, "who sends to whom: pairs (NIC 2k <-> 2k + 1), incast "
                                  "(every NIC to NIC a) or all-to-all"),
    ("--planes", "planes", int, "planes (NIC ports)"),
    ("--qps", "qps", int, "QPs each way"),
    ("--bytes", "bytes", int, "payload bytes per direction"),
    ("--msg-size", "msg_size", int, "bytes per work request"),
    ("--mtu", "mtu", int, "path MTU"),
    ("--fail-plane", "fail_plane", int, "plane that fails"),
    ("--fail-at", "fail_at_us", float, "failure time, us after the transfer starts"),
    ("--recover-at", "recover_at_us", float, "recovery time, us after the transfer starts"),
    ("--loss", "loss", float, "random loss probability per frame"),
    ("--trim-threshold", "trim_threshold", int, "queue bytes above which data is trimmed "
                                                "(0: never)"),
    ("--ecn-threshold", "ecn_threshold", int, "queue bytes above which ECN CE is set"),
    ("--evs", "evs", int, "EVs in the profile (sprayed over the planes)"),
    ("--seed", "seed", int, "random seed (traffic and fabric)"),
    ("--timeout", "timeout", int, "local ACK timeout exponent t: 1.024 us * 2^t"),
    ("--infer-k", "infer_k", int, "SACK loss inference threshold K (0: off)"),
    ("--reo-wnd", "reo_wnd", int, "time-based loss inference: reorder window, 1.024 us units "
     "(0: off)"),
    ("--port-wnd", "port_wnd", int, "port watch: sweep a plane whose ACKs lag the others' "
     "by this window, 1.024 us units (0: off)"),
    ("--port-quiet", "port_quiet", int, "port watch: and no ACK came back on it for this long, "
     "1.024 us units"),
    ("--ack-every", "ack_every", int, "responder: ACK every N packets"),
    ("--ack-delay", "ack_delay", int, "responder: ACK delay timer, engine cycles"),
    ("--coalesce-gaps", "coalesce_gaps", int, "responder: 1 = out-of-order arrivals are "
     "ACKed like in-order ones (coalesced), 0 = at once"),
    ("--gap-depth", "gap_depth", int, "responder: ACK at once a packet that is the Nth "
     "received above a hole, even when coalescing (0: off)"),
    ("--ack-new-holes", "ack_new_holes", int, "responder: 1 = ACK at once a packet that opens "
     "a new hole (the PSN below it not yet arrived), even when coalescing"),
    ("--fate", "fate", int, "port fate sharing: 1 = a loss abandons its whole plane until "
     "probes answer, 0 = per EV only"),
    ("--cc", "cc", str, "congestion window: nscc = UET's NSCC (a window in bytes per QP from "
     "the ACKs' round trip against a target delay, their ECN echo and trims), ecn = the ECN "
     "window (each QP takes 1/8 off the window it used per marked window and widens by one "
     "PSN per cwnd/4 PSNs acknowledged), off = MPR only; the RTL NICs carry both"),
    ("--max-us", "max_us", float, "give up after this much simulated time"),
]


#: ``--cc``'s values: (scenario ``cc``, ``cc_algorithm`` or None to keep it). 1 and 0 are
#: the flag's former spellings: the window on (the scenario's algorithm) or off.
CC_VALUES = {"ecn": (1, "ecn"), "nscc": (1, "nscc"), "off": (0, None), "1": (1, None),
             "0": (0, None)}


def _default(field):
    if field == "cc":
        default = SCENARIOS["default"]
        return default.cc_algorithm if default.cc else "off"
    value = getattr(SCENARIOS["default"], field)
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else value


def register(subparsers):
    p = subparsers.add_parser(
        "sim", help="the main job: two NICs over a multi-plane fabric (docs/sim.md)",
        description="Run a scenario on two NICs joined by the multi-plane fabric and write "
                    "report.json, the capture and a goodput plot into build/sim/<scenario>/. "
                    "The scenario is a named one (--list) or a TOML file; --config sets the "
                    "NIC build; the flags below override both. A flag's default is the "
                    "scenario's value (shown: the default scenario's).")
    p.add_argument("--scenario", default="default", metavar="NAME|FILE",
                   help="named scenario (see --list) or scenario TOML file (docs/sim.md)")
    p.add_argument("--list", action="store_true",
                   help="list the named scenarios with a line each, and exit")
    p.add_argument("--config", type=Path, metavar="CONFIG.json",
                   help="NicConfig JSON, the build of both NICs (docs/configuration.md); its "
                        "ports and mtu set the planes and the MTU, its qps and "
                        "evs_per_profile bound --qps and --evs (default: 16 QPs, 64 EVs, one "
                        "port per plane)")
    for flag, field, kind, text in FLAGS:
        metavar = "US" if field.endswith("_us") else "N" if kind is int else \
            "|".join(PATTERNS) if field == "pattern" else "ecn|nscc|off" if field == "cc" \
            else "X"
        shown = "one of ecn, nscc, off" if field == "cc" else allowed(field)
        p.add_argument(flag, dest=field, type=kind, default=None, metavar=metavar,
                       help=f"{text}: {shown} (default: {_default(field)})")
    p.add_argument("--backend", choices=("rtl", "model"), default=None,
                   help=f"rtl: RTL NICs under --sim; model: the reference model "
                        f"(default: {_default('backend')})")
    p.add_argument("--baseline", choices=("ecmp", "none"), default=None,
                   help=f"ecmp: one fixed EV per QP (the single-path baseline); none: MRC "
                        f"(default: {_default('baseline')})")
    p.add_argument("--sim", choices=("verilator", "icarus"), default=None,
                   help=f"simulator of the RTL backend (default: {_default('sim')})")
    add_waves_arguments(p, "OUT/waves.fst (both NICs)")
    p.add_argument("--one-way", action="store_true",
                   help="only NIC a sends (its ACKs come back on the idle reverse planes)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: build/sim/<scenario name>)")
    p.set_defaults(func=run)


def scenario_from_args(args):
    """``(scenario, its file)`` the flags ask for: the named scenario or scenario file, then
    ``--config`` (the NIC build, with its ports and MTU), then every flag given on top. A
    negative ``--fail-plane`` or ``--recover-at`` means "none"/"never". Raises
    :class:`ScenarioError` naming each value by the flag or the scenario that set it."""
    overrides, labels = {}, {"scenario": "--scenario"}
    if args.config is not None:
        config = nic_config_from(args.config)
        overrides.update(nic_config=config.to_dict(), planes=config.ports, mtu=config.mtu)
        labels.update(nic_config="--config", planes="the ports of --config",
                      mtu="the mtu of --config")
    given = [(flag, field) for flag, field, _, _ in FLAGS]
    given += [(f"--{name}", name) for name in ("backend", "baseline", "sim")]
    for flag, field in given:
        if getattr(args, field) is not None:
            overrides[field] = getattr(args, field)
            labels[field] = flag
    window = {"waves_from_us": "--waves-from", "waves_to_us": "--waves-to"}
    for field, flag in window.items():
        if getattr(args, field) is not None:
            overrides[field] = getattr(args, field)
            labels[field] = flag
    if args.waves or any(getattr(args, field) is not None for field in window):
        overrides["waves"] = True
        labels["waves"] = "--waves"
    if args.one_way:
        overrides["both_ways"] = False
        labels["both_ways"] = "--one-way"
    if "cc" in overrides:
        if overrides["cc"] not in CC_VALUES:
            raise ScenarioError("cc", f"must be one of ecn, nscc, off, not {overrides['cc']!r}",
                                labels={"cc": "--cc"})
        overrides["cc"], algorithm = CC_VALUES[overrides["cc"]]
        if algorithm is not None:
            overrides["cc_algorithm"] = algorithm
            labels["cc_algorithm"] = "--cc"
    try:
        return load(args.scenario, overrides, labels=labels)
    except ScenarioError as e:
        raise e.relabel({"scenario": "--scenario"}) from None


#: The most NICs the RTL backend runs (the C++ stream agents' limit of streams per build).
RTL_MAX_NICS = 5


def backend_refusal(scn):
    """``(flag, message)`` when the scenario's backend cannot run it, else None: the RTL
    backend runs up to :data:`RTL_MAX_NICS` RTL NICs, more than two (or two in another
    pattern than pairs) under Verilator only."""
    if scn.backend != "rtl":
        return None
    if scn.nics > RTL_MAX_NICS:
        return "--nics", f"the RTL backend runs at most {RTL_MAX_NICS} NICs: add --backend model"
    if _grouped(scn) and (scn.sim != "verilator" or scn.waves):
        return ("--sim" if scn.sim != "verilator" else "--waves",
                "the RTL backend runs more than two NICs (or another pattern than pairs) "
                "under Verilator without waves only")
    return None


def rtl_nscc_setting(scn, config):
    """The NSCC setting the RTL NICs of ``scn`` are built with. Every RTL NIC of the main job
    carries the NSCC engine and CONFIG ``cc_nscc`` chooses its window at run time, so a run on
    the ECN window (or none) needs no build of its own: a run on NSCC is built with its own
    setting (the model's :func:`sim.model.nscc.setting_for`), any other with
    :func:`rtl_default_nscc_setting`, so those runs share one build per NIC build whatever
    their fabric (and share it with NSCC runs on the default scenario's fabric)."""
    if scn.cc and scn.cc_algorithm == "nscc":
        from .model.nscc import setting_for
        return setting_for(scn, config)
    return rtl_default_nscc_setting(config)


def rtl_default_nscc_setting(config):
    """The NSCC setting of an RTL NIC build ``config`` on the default scenario's fabric (its
    latency, two NICs sending to each other, no trimming): what the NICs of a run that does
    not use NSCC are built with."""
    from .model.nscc import setting_for
    return setting_for(SCENARIOS["default"], config)


def _grouped(scn):
    """Whether the RTL backend runs ``scn`` on a group of NICs over a switch per plane
    (``sim/tb/cocotb_group.py``), not on the pair."""
    return scn.nics != 2 or scn.pattern != "pairs"


def group_build_dir(scn, nscc=None):
    """The Verilator build of a group of ``scn.nics`` RTL NICs: a folder per count (and per
    NSCC setting, which :func:`_build_dir`'s key includes)."""
    base = _build_dir(scn, nscc)
    return base.with_name(f"{base.name}-group{scn.nics}-dpi")


def run(args):
    if args.list:
        names = describe_scenarios()
        width = max(len(name) for name, _ in names)
        for name, description in names:
            print(f"{name:{width}s}  {description}")
        return 0
    try:
        scn, path = scenario_from_args(args)
    except ScenarioError as e:
        return fail(str(e))
    if scn.waves and scn.backend != "rtl":
        return fail("the model backend has no waveforms: use --backend rtl", field="--waves")
    refusal = backend_refusal(scn)
    if refusal is not None:
        return fail(refusal[1], field=refusal[0])
    out = args.out or BUILD / "sim" / scn.name
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(f"{out}: cannot create: {e.strerror}", field="--out" if args.out else None)
    report = run_scenario(scn, out, log=print, scenario_file=path)
    print(summary(report))
    return 0 if report["ok"] else 1


# -- running ----------------------------------------------------------------------------------

def _build_dir(scn, nscc=None):
    """The RTL pair's build folder of ``scn`` with the NSCC setting ``nscc`` built in (default:
    :func:`rtl_nscc_setting`'s)."""
    config = nic_config_for(scn)
    nscc = rtl_nscc_setting(scn, config) if nscc is None else nscc
    # Not the waves: a run with waves builds its traced model into trace/ in this folder, and
    # the window is given at run time. The NSCC setting is built in (rtl_nscc_setting).
    parts = [config.to_dict(), scn.sim, dataclasses.asdict(nscc)]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    return BUILD / "sim" / "rtl" / f"{scn.sim}-{key}"


def _waves_window(scn, out):
    """The :class:`sim.tb.runner.WavesWindow` of ``scn`` (``None`` without waves): both NICs
    in one file, ``out/waves.fst``, as they are one simulation model (``sim/tb/pair.py``)."""
    if not scn.waves:
        return None
    from .tb.runner import WAVES_FILE, WavesWindow
    return WavesWindow(Path(out) / WAVES_FILE, scn.waves_from_us, scn.waves_to_us)


def _shown_path(path):
    """A scenario file as the report names it: inside the repository, relative to it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_scenario(scn, out, *, log=print, build_dir=None, quick_build=False,
                 scenario_file=None, build_nscc=None):
    """Run ``scn``; write every output into ``out``; return the report (a dict).

    ``build_dir``/``quick_build``: where the RTL simulator build lives (default
    ``build/sim/rtl/<sim>-<hash>``) and whether Verilator compiles without optimisation
    (tests: faster to build, slower to run). ``scenario_file``: the scenario file ``scn`` was
    read from, echoed in the report (``null`` without one). ``build_nscc``: the NSCC setting
    to build the RTL NICs with when it is not :func:`rtl_nscc_setting`'s (tests that run
    several scenarios on one build): the NICs run the ECN window with any setting (CONFIG
    ``cc_nscc`` off), but NSCC only with the scenario's own, which the model's NSCC uses."""
    refusal = backend_refusal(scn)
    if refusal is not None:
        raise ValueError(f"{refusal[0]}: {refusal[1]}")
    if scn.backend == "rtl":
        config = nic_config_for(scn)
        if build_nscc is None:
            build_nscc = rtl_nscc_setting(scn, config)
        elif scn.cc and scn.cc_algorithm == "nscc" and build_nscc != rtl_nscc_setting(scn,
                                                                                      config):
            raise ValueError(f"build_nscc: a run on NSCC needs NICs built with its own "
                             f"setting {rtl_nscc_setting(scn, config)}, not {build_nscc}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "report.json"):
        (out / stale).unlink(missing_ok=True)
    wall0 = time.monotonic()
    switched = None                     # the fabric of a run with a switch per plane
    if scn.backend == "rtl" and _grouped(scn):
        result = _run_group(scn, out, log=log, build_dir=build_dir, quick_build=quick_build,
                            nscc=build_nscc)
    elif scn.backend == "rtl":
        from .tb.dpi import pair_build, uses_dpi
        from .tb.pair import NicPair
        from .tb.runner import run_cocotb, source_key
        nscc = build_nscc
        # The export is keyed by the NSCC setting built in too.
        nscc_key = (dataclasses.asdict(nscc),)
        log(f"building two RTL NICs ({config.ports} ports, {config.data_width}-bit, "
            f"{scn.sim}, NSCC engine; {_cc_name(scn)} runs); a cached build is reused")
        waves = _waves_window(scn, out)
        env = {"SCENARIO": json.dumps(scn.to_dict()), "OUT": out.resolve(),
               "MRC_SIMULATOR": scn.sim}
        if uses_dpi(scn):       # the stream agents in C++ (sim/tb/dpi.py)
            base = Path(build_dir or _build_dir(scn, nscc))
            build = base.with_name(base.name + "-dpi")
            run_cocotb(**pair_build(config, nscc), test_module="sim.tb.cocotb_fabric",
                       build_dir=build, sim=scn.sim, waves=waves, log=log, reuse=True,
                       quick_build=quick_build, extra_env={**env, "MRC_DPI": "1"})
        else:
            # A quick build (the tests') of the Python agents' bench is always the traceable
            # one: Python, not the model, sets that bench's pace, and one build then serves
            # the runs with and without a waves window.
            run_cocotb(lambda: NicPair(config, nscc=nscc), toplevel="nic_pair",
                       test_module="sim.tb.cocotb_fabric",
                       build_dir=build_dir or _build_dir(scn, nscc), sim=scn.sim,
                       waves=waves, log=log, reuse=True, quick_build=quick_build,
                       traceable=bool(waves) or (quick_build and scn.sim == "verilator"),
                       export_key=source_key("nic_pair-shared", config.to_dict(), *nscc_key),
                       extra_env=env)
        result = json.loads((out / "result.json").read_text())
        if waves and result.get("transfer_start_us") is not None:
            log(f"  the transfer started at {result['transfer_start_us']:g} us of simulated "
                f"time: --fail-at and the report's times count from there")
    else:
        from .fabric import Fabric
        from .model.multi import fabric_config_multi, run_nics
        from .model.pair import run_model
        from .workload import fabric_config_for
        config = nic_config_for(scn)
        two = scn.nics == 2 and scn.pattern == "pairs"
        fabric = Fabric(fabric_config_for(scn, config) if two
                        else fabric_config_multi(scn, config))
        def progress(p):
            done = sum(p["completions"].values())
            expected = sum(p["expected"].values())
            detail = " ".join(f"{side} {p['completions'][side]}/{p['expected'][side]}"
                              for side in sorted(p["expected"])) if len(p["expected"]) <= 4 \
                else f"{done}/{expected} ({100 * done / max(expected, 1):.0f} %)"
            log(f"t={p['sim_us']:8.1f} us  completions {detail}")
        if two:
            result = run_model(scn, network=fabric, progress=progress)
        else:
            log(f"{scn.nics} model NICs, {scn.pattern}, over a switch per plane")
            result = run_nics(scn, network=fabric, progress=progress)
        result["analysis"] = analyse(fabric, scn, config, end_ns=result["sim_us"] * 1e3)
        switched = fabric if fabric.switched else None
        result["fabric_summary"] = {"queue_delay_us": fabric.stats.queue_delay_us(),
                                    "data_drops": fabric.stats.data_drops}
        fabric.save(out)
        (out / "result.json").write_text(json.dumps(result, default=str))
    result["total_wall_s"] = time.monotonic() - wall0
    report = make_report(scn, result, out)
    report["scenario_file"] = _shown_path(scenario_file) if scenario_file else None
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    try:
        from .fabric.plot import plot_egress_waits, plot_run
        plot_run(out, title=scn.name)
        if switched is not None:
            plot_egress_waits(switched.stats.queue_waits, out / "egress.png",
                              title=f"{scn.name}: {scn.nics} NICs, {scn.pattern}, "
                                    f"cc {report['cc']['algorithm']}: egress queue waits")
    except RuntimeError as e:          # matplotlib missing
        log(f"no plot: {e}")
    return report


def _run_group(scn, out, *, log, build_dir, quick_build, nscc):
    """The RTL backend on ``scn.nics`` NICs over a switch per plane: the raw result that
    :func:`sim.model.multi.run_nics` gives for model NICs (``sim/tb/cocotb_group.py``).
    ``nscc``: the NSCC setting the NICs are built with."""
    from .model.multi import nic_names
    from .tb.dpi import GROUP_DPI_TOP, DpiGroup, dpi_key, verilator_args
    from .tb.runner import run_cocotb, source_key
    config = nic_config_for(scn)
    names = nic_names(scn.nics)
    # As the pair's: the export is keyed by the NSCC setting built in too.
    nscc_key = (dataclasses.asdict(nscc),)
    log(f"building {scn.nics} RTL NICs ({config.ports} ports, {config.data_width}-bit, "
        f"{scn.sim}, NSCC engine; {_cc_name(scn)} runs), {scn.pattern}, over a switch per "
        f"plane; a cached build is reused")
    env = {"SCENARIO": json.dumps(scn.to_dict()), "OUT": out.resolve(),
           "MRC_SIMULATOR": scn.sim, "MRC_DPI": "1"}
    run_cocotb(lambda: DpiGroup(config, names, nscc=nscc), toplevel=GROUP_DPI_TOP,
               test_module="sim.tb.cocotb_group",
               build_dir=build_dir or group_build_dir(scn, nscc), sim=scn.sim, waves=False,
               log=log, reuse=True, quick_build=quick_build,
               export_key=source_key("nic_group-dpi", names, config.to_dict(), dpi_key(),
                                     *nscc_key),
               # Not optimise_cycles: -O1 costs the group's larger model more compile time than
               # its short test runs save.
               verilator_args=verilator_args(), extra_env=env)
    return json.loads((out / "result.json").read_text())


def _cc_name(scn):
    """The congestion window a run uses: ``nscc``, ``ecn`` or ``off``."""
    return scn.cc_algorithm if scn.cc else "off"


# -- the report -------------------------------------------------------------------------------

def per_packet_overhead(config):
    """Wire bytes of an MTU data packet beyond its payload (Ethernet to ICRC; the datapath
    carries no preamble or FCS): from a packet built by the Scapy layers."""
    from . import packets as pk
    frame = bytes(pk.data_packet(P.Opcode.RDMA_WRITE_MIDDLE, dqpn=1, psn=0, va=0, rkey=0,
                                 payload=bytes(config.mtu), ip_version=config.ip_version,
                                 tseth={}))             # the NIC sends a TSETH on every one
    return len(frame) - config.mtu


def payload_capacity_gbps(config):
    """Line rate times payload / (payload + per-packet overhead) at the MTU; the overhead is
    rounded up to whole datapath beats, as the engine sends a frame in whole beats."""
    lanes = config.data_width // 8
    beats = -(-(config.mtu + per_packet_overhead(config)) // lanes)
    return line_rate_gbps(config) * config.mtu / (beats * lanes)


#: Counter names the report gives in place of the RTL's: the receive path's drop reason
#: ``none`` counts the frames it accepted.
REPORT_COUNTER_NAMES = {"rx_counters": {"none": "accepted"}}


def _report_counters(blocks):
    """One NIC's counters as the report names them (:data:`REPORT_COUNTER_NAMES`)."""
    return {block: {REPORT_COUNTER_NAMES.get(block, {}).get(name, name): value
                    for name, value in values.items()} if isinstance(values, dict) else values
            for block, values in blocks.items()}


def _report_event(event):
    """An EV event with its state by name (the model backend records the number)."""
    state = event["state"]
    return {**event, "state": P.EvState(state).name if isinstance(state, int) else state}


def _by_qp(posted):
    """A NIC's posted WRs by QP, each QP's in posting order."""
    out = {}
    for wr in posted:
        out.setdefault(wr["qpn"], []).append(wr)
    return out


def flow_figures(result):
    """``(flows, jain)`` of a model run: per sending QP ``{src, dst, qp, bytes,
    goodput_gbps}`` (the bytes of its WRs that completed successfully over the time from the
    run's first send to its last such completion), and Jain's fairness index over their
    goodputs (None without a flow)."""
    times = result.get("completion_times_us")
    if times is None:
        return None, None
    start = result.get("first_send_us", 0.0)
    flows = []
    for name, posted in result["work"].items():
        done = {}
        for c, t in zip(result["completions"][name], times[name], strict=True):
            if c["side"] == 0 and c["status"] == P.CompletionStatus.SUCCESS:
                done[c["wr_id"]] = t
        for qpn, wrs in sorted(_by_qp(posted).items()):
            finished = [wr for wr in wrs if wr["wr_id"] in done]
            nbytes = sum(wr["length"] for wr in finished)
            end = max((done[wr["wr_id"]] for wr in finished), default=start)
            span_ns = (end - start) * 1e3
            flows.append({"src": name, "dst": wrs[0].get("dst", "b" if name == "a" else "a"),
                          "qp": qpn, "bytes": nbytes,
                          "goodput_gbps": round(nbytes * 8 / span_ns, 4) if span_ns > 0
                          else 0.0})
    rates = [f["goodput_gbps"] for f in flows]
    squares = sum(r * r for r in rates)
    jain = round(sum(rates) ** 2 / (len(rates) * squares), 4) if rates and squares else None
    return flows, jain


def cc_figures(scn, config):
    """``{"algorithm", "target_qdelay_us"}``: the congestion window's algorithm (``off``,
    ``ecn``, ``nscc``) and NSCC's target queueing delay (None for the others)."""
    if not scn.cc:
        return {"algorithm": "off", "target_qdelay_us": None}
    if scn.cc_algorithm != "nscc":
        return {"algorithm": scn.cc_algorithm, "target_qdelay_us": None}
    from .model.nscc import NsccParameters, setting_for
    target = NsccParameters(setting_for(scn, config)).target_ns
    return {"algorithm": "nscc", "target_qdelay_us": round(target / 1000, 3)}


def make_report(scn, result, out):
    """``report.json`` from a raw result (both backends write the same raw keys)."""
    config = nic_config_for(scn)
    work = result["work"]
    completions = result["completions"]
    flows = result.get("flows")
    # Per receiving NIC: two NICs each way, one one way; an N-NIC run's distinct receivers.
    directions = len({dst for _, dst in flows}) if flows else 2 if scn.both_ways else 1
    offered = sum(wr["length"] for side in work.values() for wr in side)
    bad = {(m["side"], m["wr_id"]) for m in result["memory_mismatches"]}
    delivered = corrupted = 0
    completed = 0
    in_order = True
    for name, posted in work.items():
        own = [c for c in completions[name] if c["side"] == 0]
        status = {c["wr_id"]: c["status"] for c in own}
        for qpn, wrs in _by_qp(posted).items():
            # Two NICs: QP q talks to the other's QP q; more: the WR names its receiver's.
            peer = wrs[0].get("dst", "b" if name == "a" else "a")
            peer_qpn = wrs[0].get("dst_qpn", qpn)
            posted_q = [wr["wr_id"] for wr in wrs]
            done_q = [c["wr_id"] for c in own if c["qpn"] == qpn]
            if done_q != posted_q[:len(done_q)]:
                in_order = False
            imms = [wr["imm"] for wr in wrs if wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM]
            got = [c["imm"] for c in completions[peer] if c["side"] == 1
                   and c["qpn"] == peer_qpn]
            if got != imms[:len(got)]:
                in_order = False
        for wr in posted:
            if status.get(wr["wr_id"]) == P.CompletionStatus.SUCCESS:
                completed += 1
                if (name, wr["wr_id"]) in bad:
                    corrupted += wr["length"]
                else:
                    delivered += wr["length"]
    analysis = result["analysis"]
    duration_ns = max(result["sim_us"] * 1e3, 1.0)
    goodput = delivered * 8 / duration_ns / directions
    capacity = payload_capacity_gbps(config)
    counters = {side: _report_counters(blocks)
                for side, blocks in result.get("counters", {}).items()}

    def total(block, name):
        return sum(c.get(block, {}).get(name, 0) for c in counters.values())

    cycles = result.get("cycles", 0)
    wall = result.get("wall_s", 0.0)
    report = {
        "line_rate_gbps": line_rate_gbps(config),
        "payload_capacity_gbps": round(capacity, 4),
        "goodput_gbps": round(goodput, 4),
        "efficiency": round(goodput / capacity, 4),
        "bytes_offered": offered,
        "bytes_delivered": delivered,
        "bytes_lost": offered - delivered - corrupted,
        "bytes_corrupted": corrupted,
        "messages_completed": completed,
        "messages_posted": sum(len(side) for side in work.values()),
        "completions_in_order": in_order,
        "packets_sent": total("requester_counters", "packets"),
        "retransmissions": total("requester_counters", "retransmissions"),
        "trims": analysis["trims"],
        "timeouts": total("requester_counters", "timeouts"),
        "inferred_losses": total("requester_counters", "inferred_losses"),
        "ev_events": [_report_event(e) for e in result.get("ev_events", [])],
        "failure": analysis["failure"],
        "fabric": analysis["fabric"],
        "wire_shares": analysis.get("wire_shares"),
        "duration_us": round(duration_ns / 1000, 3),
        "finished": result["finished"],
        "qp_errors": result.get("qp_errors", {}),
        "sim": {"backend": result["backend"], "simulator": result.get("simulator"),
                "agents": result.get("agents"),
                "cycles": cycles, "wall_s": round(wall, 2),
                "cycles_per_s": round(cycles / wall, 1) if wall else None,
                "total_wall_s": round(result.get("total_wall_s", wall), 2)},
        "scenario": scn.to_dict(),
        "counters": counters,
    }
    flow_list, jain = flow_figures(result)
    if flow_list is not None:
        report["flows"] = flow_list
        report["jain_fairness"] = jain
    fabric_summary = result.get("fabric_summary")
    if fabric_summary is not None:
        report["queue_delay_us"] = fabric_summary["queue_delay_us"]
        report["fabric_data_drops"] = fabric_summary["data_drops"]
    report["cc"] = cc_figures(scn, config)
    if scn.pattern == "incast":
        # What the one receiver's downlinks carry at most: goodput_gbps is over it.
        report["receiver_payload_capacity_gbps"] = round(capacity, 4)
    if "rx_backlog" in result:
        # RTL only: beats the fabric had delivered that a NIC's receive path had not yet taken
        # (sampled every 1,000 cycles), as time at one beat per cycle.
        period_us = 1e6 / config.clock_hz
        report["rx_backlog"] = {
            name: {"max_beats": side["max_beats"],
                   "max_us": round(side["max_beats"] * period_us, 3)}
            for name, side in result["rx_backlog"].items()}
    report["ok"] = bool(result["finished"] and report["bytes_lost"] == 0
                        and corrupted == 0 and in_order)
    return report


def _or_none(value):
    return "none (a window too short)" if value is None else f"{value:.3f}"


def summary(report):
    scn = report["scenario"]
    nics = scn.get("nics", 2)
    group = "" if nics == 2 and scn.get("pattern", "pairs") == "pairs" \
        else f"{nics} NICs {scn['pattern']}, "
    lines = [
        f"scenario {scn['name']}: {group}{scn['planes']} planes, {scn['qps']} QPs, "
        f"{report['bytes_offered']} bytes offered, backend {report['sim']['backend']}",
        f"  goodput {report['goodput_gbps']:.3f} Gb/s of {report['line_rate_gbps']:.1f} Gb/s "
        f"line rate (efficiency {report['efficiency']:.3f} of the "
        f"{report['payload_capacity_gbps']:.3f} Gb/s payload capacity)",
        f"  delivered {report['bytes_delivered']} bytes, lost {report['bytes_lost']}, "
        f"corrupted {report['bytes_corrupted']}, completions in order: "
        f"{report['completions_in_order']}",
        f"  packets {report['packets_sent']}, retransmissions {report['retransmissions']}, "
        f"timeouts {report['timeouts']}, trims {report['trims']}, "
        f"EV events {len(report['ev_events'])}",
    ]
    if "flows" in report and group:
        delays = report["queue_delay_us"]
        lines.append(f"  {len(report['flows'])} flows, Jain fairness {report['jain_fairness']}; "
                     f"egress queue waits p50 {delays['p50']} us, p99 {delays['p99']} us, max "
                     f"{delays['max']} us; data frames dropped {report['fabric_data_drops']}; "
                     f"cc {report['cc']['algorithm']}")
    shares = report.get("wire_shares")
    if shares:
        lines.append(f"  wire of the sending side{'s' if shares['data_sides'] > 1 else ''}: "
                     f"{shares['first_transmission']:.3f} first sends, "
                     f"{shares['retransmission']:.3f} resends, {shares['control']:.3f} "
                     f"ACKs and other control frames")
    failure = report["failure"]
    if failure:
        lines.append(f"  plane {failure['plane']} failed at {failure['at_us']} us: no new "
                     f"packet on it after {failure['dead_plane_abandoned_after_rtts']} RTTs; "
                     f"every lost PSN resent after {failure['all_lost_resent_after_us']} us")
        goodput = failure["goodput"]
        planes = report["scenario"]["planes"]
        lines.append(f"  steady-state goodput during / before the failure "
                     f"{_or_none(goodput['during_over_before'])} (ideal "
                     f"{(planes - 1) / planes:.3f}), after / before "
                     f"{_or_none(goodput['after_over_before'])} (ideal 1)")
    sim = report["sim"]
    lines.append(f"  simulated {sim['cycles']} cycles in {sim['wall_s']} s "
                 f"({sim['cycles_per_s']} cycles/s), {'OK' if report['ok'] else 'FAILED'}")
    return "\n".join(lines)


