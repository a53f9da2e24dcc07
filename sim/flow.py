"""``mrc-nic sim``: the most end-to-end flow that exists.

Today (before the RTL NIC exists) it exercises the foundation end to end: it loads the default
EV profile, generates and expands its EVs, segments WRITE and WRITE WITH IMMEDIATE messages
into MTU packets that carry a RETH each, sprays them over the EVs (each EV with its egress
port, i.e. plane), answers with coalesced ACKs, writes the exchange as a capture, checks every
ICRC and has tshark decode the capture with the project's Wireshark dissector. It writes
``report.json`` and ``traffic.pcap`` into ``build/flow/`` (or ``--out``).
"""

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

from hdl import protocol as P
from hdl.config import ConfigError, NicConfig
from hdl.path import ev as evlib

from . import defaults as D
from . import packets as pk
from .dissector import tshark_errors
from .env import BUILD, REPO
from .errors import fail, nic_config_from
from .waves import add_waves_arguments, waves_from_args

DEFAULT_PROFILE = D.DEFAULT_PROFILE_JSON



def register(subparsers):
    p = subparsers.add_parser(
        "flow", help="the packet-level foundation flow (Python exchange, RTL receive path, "
                     "tshark check)",
        description="Build a WRITE exchange in Python, spray it over the EVs of a profile, "
                    "check every ICRC, decode the capture with tshark and the project's "
                    "dissector, and run every frame through the NIC's RTL receive path.")
    p.add_argument("--bytes", type=int, default=256 * 1024, metavar="N",
                   help="payload bytes to move, at least 1")
    p.add_argument("--msg-size", type=int, default=16 * 1024, metavar="N",
                   help="bytes per message, at least 1")
    p.add_argument("--config", type=Path, metavar="CONFIG.json",
                   help="NicConfig JSON, the NIC of the RTL receive path "
                        "(docs/configuration.md; default: the defaults); --mtu and --planes "
                        "override its mtu and ports")
    p.add_argument("--mtu", type=int, default=None, metavar="N",
                   help=f"path MTU: 256, 512, 1024, 2048 or 4096 (default: the config's, "
                        f"else {NicConfig().mtu})")
    p.add_argument("--planes", type=int, default=None, metavar="N",
                   help=f"planes (NIC ports), 1 to 16 (default: the config's ports, else "
                        f"{NicConfig().ports})")
    p.add_argument("--evs", type=int, default=64, metavar="N",
                   help="EVs generated from the profile, at least 1")
    p.add_argument("--ack-every", type=int, default=4, metavar="N",
                   help="ACK coalescing: packets per ACK, at least 1")
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, metavar="PROFILE.json",
                   help="EV profile JSON (docs/ev-expansion.md)")
    p.add_argument("--seed", type=int, default=1, metavar="N", help="random seed, any integer")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: build/flow)")
    p.add_argument("--sim", choices=("verilator", "icarus", "none"), default="verilator",
                   help="simulator for the RTL receive path (none: skip the RTL step)")
    add_waves_arguments(p, "OUT/waves.fst (the RTL receive path)")
    p.set_defaults(func=run)


def _load_evs(path, count, planes):
    try:
        spec = evlib.load_profile_json(json.loads(Path(path).read_text()))
        entries = evlib.generate_entries(spec.profile, count, num_ports=planes)
    except OSError as e:
        raise ValueError(f"cannot read EV profile {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    except evlib.EvProfileError as e:
        raise ValueError(f"{path}: {e}") from None
    table = []
    for index, (ev, port) in enumerate(entries):
        fields = evlib.header_fields(spec.profile.format,
                                     evlib.expand(spec.profile, ev, index=index))
        table.append({"index": index, "ev": ev.hex(), "port": port, **{
            k: (v.hex() if isinstance(v, bytes) else v) for k, v in fields.items()}})
    return spec.profile.format, table


def _underlay_for(ev_entry):
    kw = {}
    if "udp_sport" in ev_entry:
        kw["udp_sport"] = ev_entry["udp_sport"]
    if "flow_label" in ev_entry:
        kw["flow_label"] = ev_entry["flow_label"]
    return kw


def run(args):
    started = time.monotonic()
    flags = {"mtu": "--mtu", "ports": "--planes"}
    base = nic_config_from(args.config).to_dict()
    given = {field: getattr(args, flag[2:]) for field, flag in flags.items()
             if getattr(args, flag[2:]) is not None}
    try:
        config = NicConfig.from_dict({**base, **given})
    except ConfigError as e:
        return fail(str(e).removeprefix(f"NicConfig.{e.field} "),
                    field=flags.get(e.field, "--config"))
    for name in ("bytes", "msg_size", "evs", "ack_every"):
        if getattr(args, name) < 1:
            return fail(f"must be at least 1, not {getattr(args, name)}",
                        field=f"--{name.replace('_', '-')}")
    try:
        fmt, evs = _load_evs(args.profile, args.evs, config.ports)
    except ValueError as e:
        return fail(str(e), field="--profile")
    if fmt.mode == P.EvFormatMode.SRV6:
        return fail("the foundation flow sends UDP/STEV EVs only; SRv6 arrives with the RTL",
                    field="--profile")
    out = args.out or BUILD / "flow"
    waves = waves_from_args(args, out / "waves.fst")
    if waves and args.sim == "none":
        return fail("needs the RTL step: --sim verilator or icarus, not none", field="--waves")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(f"{out}: cannot create: {e.strerror}", field="--out")
    rng = random.Random(args.seed)

    print(f"mrc-nic flow: {args.bytes} B in {args.msg_size} B messages, MTU {config.mtu}, "
          f"{len(evs)} EVs over {config.ports} planes -> {out}")
    frames, frame_ports, per_plane = [], [], [0] * config.ports
    psn, cum, ev_cursor, va, messages = D.INITIAL_PSN, None, rng.randrange(len(evs)), 0, 0
    immediates = 0
    remaining = args.bytes
    while remaining:
        size = min(args.msg_size, remaining)
        immediate = messages % 2 == 1                 # alternate WRITE and WRITE_IMM
        packets = -(-size // config.mtu)
        for k in range(packets):
            chunk = min(config.mtu, size - k * config.mtu)
            opcode = P.write_opcode(first=k == 0, last=k == packets - 1,
                                    immediate=immediate and k == packets - 1)
            entry = evs[ev_cursor]
            ev_cursor = (ev_cursor + 1) % len(evs)   # oblivious spraying: rotate over the EVs
            payload = bytes(rng.getrandbits(8) for _ in range(chunk))
            frames.append(pk.data_packet(
                opcode, dqpn=D.QPN_B, psn=psn, va=D.MR_BASE + va + k * config.mtu,
                rkey=D.MR_RKEY, payload=payload,
                imm=messages if opcode in P.IMMEDIATE_OPCODES else None,
                msn=messages & 0xFFFF, rqmsn=immediates & 0xFFFF,
                tseth={"tx_timestamp": P.wire_timestamp(len(frames) * 100),
                       "ftype": int(P.Ftype.TIMESTAMP)},
                ackreq=int(k == packets - 1), **_underlay_for(entry)))
            per_plane[entry["port"] - 1] += 1
            frame_ports.append(entry["port"] - 1)
            if (psn - D.INITIAL_PSN + 1) % args.ack_every == 0 or k == packets - 1:
                cum = psn
                underlay = _underlay_for(entry)
                frames.append(pk.sack_packet(
                    dqpn=D.QPN_A, cack_psn=cum, ack_psn_offset=0, sack_psn_offset=1,
                    entropy=underlay.get("flow_label", 0) << 16 & 0xFFFF_0000
                    | underlay.get("udp_sport", 0),
                    cc_state={"tx_timestamp": P.wire_timestamp((len(frames) - 1) * 100)},
                    src=D.NIC_B, dst=D.NIC_A, **underlay))
                frame_ports.append(entry["port"] - 1)
            psn = P.psn_add(psn, 1)
        va += size
        remaining -= size
        messages += 1
        immediates += immediate
        if messages % 8 == 0:
            print(f"  {args.bytes - remaining:>10} B, {messages} messages, {len(frames)} frames")

    pcap = out / "traffic.pcap"
    pk.write_pcap(pcap, frames)
    raw_frames = [bytes(f) for f in frames]
    bad_icrc = sum(not pk.icrc_ok(f) for f in raw_frames)
    decoded = _tshark_check(pcap, frames)
    rtl = _rtl_receive(raw_frames, frame_ports, config, args.sim, out, waves)
    report = {
        "stage": "foundation (no RTL yet)",
        "config": config.to_dict(), "seed": args.seed,
        "messages": messages, "payload_bytes": args.bytes,
        "data_packets": sum(per_plane), "acks": len(frames) - sum(per_plane),
        "packets_per_plane": per_plane, "evs": len(evs), "bad_icrc": bad_icrc,
        "tshark": decoded, "rtl_receive": rtl, "wire_bytes": sum(len(f) for f in raw_frames),
        "payload_efficiency": args.bytes / sum(len(f) for f in raw_frames),
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"  {report['data_packets']} data packets, {report['acks']} ACKs, per plane "
          f"{per_plane}")
    print(f"  ICRC errors: {bad_icrc}; tshark: {decoded['status']}; payload/wire bytes "
          f"{report['payload_efficiency']:.3f}")
    if rtl["status"] != "skipped":
        print(f"  RTL receive path ({rtl['simulator']}): {rtl['accepted']} of {len(frames)} "
              f"frames accepted, {rtl['simulated_cycles_per_second']:.0f} cycles/s")
    print(f"  wrote {pcap} and {out / 'report.json'} in {report['elapsed_s']} s")
    ok = (bad_icrc == 0 and decoded["status"] in ("ok", "skipped: no tshark")
          and rtl["status"] in ("ok", "skipped"))
    return 0 if ok else 1


def _rtl_receive(frames, ports, config, sim, out, waves=None):
    """Every frame through the NIC's RTL receive path, each on its EV's plane."""
    if sim == "none":
        return {"status": "skipped"}
    from .replay import replay_frames
    from .tb.runner import CocotbFailure
    print(f"  RTL receive path: {len(frames)} frames through the NIC top under {sim} ...",
          flush=True)
    try:
        # The build is replay's, kept per configuration in build/replay/ and reused.
        outcome = replay_frames(frames, config, ports=ports, sim=sim, waves=waves)
    except CocotbFailure as e:
        return {"status": "error", "simulator": sim, "error": str(e)}
    counters = outcome["counters"]
    accepted = counters.pop("none")
    return {"status": "ok" if accepted == len(frames) else "dropped", "simulator": sim,
            "accepted": accepted, "drop_counters": counters,
            "placed_bytes": outcome["placed_bytes"], "responses": len(outcome["responses"]),
            "responder_counters": outcome["responder_counters"],
            "simulated_cycles": outcome["cycles"],
            "simulated_cycles_per_second": outcome["cycles"] / max(outcome["wall_seconds"], 1e-9)}


def _tshark_check(pcap, frames):
    """Decode the capture with tshark + our dissector and compare PSNs, the data packets'
    timestamps and the SACKs' cumulative PSNs."""
    tshark = shutil.which("tshark")
    if tshark is None:
        return {"status": "skipped: no tshark"}
    lua = REPO / "sim" / "wireshark" / "mrc.lua"
    cmd = [tshark, "-r", str(pcap), "-X", f"lua_script:{lua}", "-T", "fields",
           "-e", "infiniband.bth.psn", "-e", "mrc.tseth.tx_timestamp", "-e", "mrc.seth.cack_psn"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    errors = tshark_errors(result.stderr)
    if result.returncode != 0 or errors:
        return {"status": "error", "stderr": "\n".join(errors)[-500:]}
    rows = [line.split("\t") for line in result.stdout.splitlines()]

    def number(text):
        return int(text.split(",")[-1], 0) if text else -1

    mismatches = 0
    for row, frame in zip(rows, frames, strict=False):
        if frame.haslayer(pk.TSETH):
            mismatches += number(row[1]) != frame[pk.TSETH].tx_timestamp
        else:
            mismatches += number(row[2]) != frame[pk.SETH].cack_psn
        mismatches += number(row[0]) != frame[pk.BTH].psn
    if len(rows) != len(frames):
        mismatches += abs(len(rows) - len(frames))
    return {"status": "ok" if mismatches == 0 else "mismatch", "frames": len(rows),
            "mismatches": mismatches}
