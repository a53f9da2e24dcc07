"""``mrc-nic replay``: run the frames of a capture through the RTL NIC.

Each frame goes through the NIC top's exported Verilog under cocotb (``--sim``, Verilator by
default; the NIC is brought up as NIC B of ``sim/defaults.py``, the
receiver of the sample packets). The report gives, per frame, ``accepted`` or ``dropped`` with
the parser's reason (:class:`hdl.packet.headers.DropReason`, ``docs/parser.md``) and, for data
packets, the responder's verdict (:class:`hdl.transport.resp_defs.ResponderVerdict`:
``placed``, ``duplicate``, ``out_of_window``, ``bad_rkey``, ...; ``docs/responder.md``).
``--out`` writes every frame the NIC sent in response (ACKs, NAKs, probe responses).
"""

import json
import tempfile
from pathlib import Path

from .env import BUILD
from .errors import fail, nic_config_from
from .waves import add_waves_arguments, waves_from_args


def register(subparsers):
    p = subparsers.add_parser(
        "replay", help="run a capture through the RTL NIC",
        description="Run every frame of a capture through the whole RTL NIC (brought up as NIC "
                    "B of sim/defaults.py) and print, per frame, accepted or dropped with the "
                    "parser's reason and the responder's verdict.")
    p.add_argument("pcap", type=Path, metavar="IN.pcap", help="pcap or pcapng of Ethernet frames")
    p.add_argument("--config", type=Path, metavar="CONFIG.json",
                   help="NicConfig JSON (docs/configuration.md; default: the defaults)")
    p.add_argument("--out", type=Path, metavar="OUT.pcap", help="write the NIC's responses")
    p.add_argument("--json", type=Path, metavar="VERDICTS.json", help="write the verdicts")
    p.add_argument("--port", type=int, default=0, metavar="N",
                   help="RX port the frames arrive on, 0 to the config's ports - 1")
    p.add_argument("--sim", choices=("verilator", "icarus"), default=None,
                   help="simulator (default: verilator)")
    add_waves_arguments(p, "waves.fst in the folder of --out (or --json), else in "
                           "build/replay/")
    p.set_defaults(func=run)



def read_capture(path):
    """Frames of a pcap/pcapng capture of Ethernet frames, as bytes. Raises ValueError."""
    from scapy.error import Scapy_Exception
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap
    try:
        # Opened here, so a file that is not a capture is closed too (rdpcap leaves it open).
        with open(path, "rb") as file:
            packets = rdpcap(file)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (Scapy_Exception, OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a pcap or pcapng capture ({e})") from None
    frames = []
    for number, packet in enumerate(packets, 1):
        if not isinstance(packet, Ether):
            raise ValueError(f"{path}: frame {number} is {type(packet).__name__}, not "
                             f"Ethernet: only Ethernet captures can be replayed")
        frames.append(bytes(packet))
    return frames


def replay_frames(frames, config, *, ports, sim=None, build_dir=None, waves=None):
    """Run ``frames`` (bytes), frame i on RX port ``ports[i]``, through the NIC top; return
    ``{"verdicts": [parser reason per frame], "transport": [responder verdict or None],
    "responses": [{"port", "hex"}], "counters": {...}, "responder_counters": {...}}``.
    ``waves``: a :class:`sim.tb.runner.WavesWindow` (default: what ``MRC_WAVES`` asks).
    ``build_dir``: where the simulator build lives (default ``build/replay/<sim>-<hash of
    the configuration>``, reused while the gateware and the configuration are unchanged).
    Raises :class:`sim.tb.runner.CocotbFailure` when the simulation fails."""
    import hashlib
    import os

    from sim.tb.pair import NIC_MODULE, NicDesign
    from sim.tb.runner import run_cocotb, source_key

    sim = sim or os.environ.get("SIM", "verilator")
    if build_dir is None:
        key = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
        build_dir = BUILD / "replay" / f"{sim}-{key.hexdigest()[:12]}"
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps({"config": config.to_dict(), "frames": [
            {"port": port, "hex": f.hex()} for f, port in zip(frames, ports, strict=True)]}))
        # The NIC is exported only when the gateware or the configuration changed since the
        # design in build_dir was exported, and converted only when no other bench converted it
        # (sim.tb.pair.export_nic: the Icarus and Verilator builds share the conversion).
        run_cocotb(lambda: NicDesign(config), toplevel=NIC_MODULE,
                   test_module="sim.tb.cocotb_replay", build_dir=build_dir, sim=sim,
                   quick_build=True, reuse=True, waves=waves,
                   export_key=source_key("mrc_nic", config.to_dict()),
                   extra_env={"REPLAY_IN": job, "REPLAY_OUT": result})
        return json.loads(result.read_text())


def run(args):
    config = nic_config_from(args.config)
    if not 0 <= args.port < config.ports:
        return fail(f"must be an integer from 0 to {config.ports - 1} (the config's ports), "
                    f"not {args.port}", field="--port")
    try:
        frames = read_capture(args.pcap)
    except ValueError as e:
        return fail(str(e))
    if not frames:
        return fail("the capture holds no frames", field=args.pcap)

    from sim.tb.runner import WAVES_FILE, CocotbFailure
    written = args.out or args.json
    waves = waves_from_args(args, (written.parent if written else BUILD / "replay")
                            / WAVES_FILE)
    print(f"mrc-nic replay: {len(frames)} frames from {args.pcap} through the RTL NIC",
          flush=True)
    try:
        outcome = replay_frames(frames, config, ports=[args.port] * len(frames), sim=args.sim,
                                waves=waves)
    except CocotbFailure as e:
        return fail(f"the simulation failed: {e}", field=args.sim or "verilator")

    verdicts = []
    for number, (reason, transport) in enumerate(
            zip(outcome["verdicts"], outcome["transport"], strict=True), 1):
        verdict = "accepted" if reason == "none" else "dropped"
        verdicts.append({"frame": number, "verdict": verdict,
                         "reason": None if reason == "none" else reason,
                         "transport": transport})
        print(f"{number:6d}  {verdict}" + ("" if reason == "none" else f"  {reason}")
              + (f"  responder: {transport}" if transport else ""))
    counters = outcome["counters"]
    accepted = counters.pop("none")
    reasons = ", ".join(f"{name} {count}" for name, count in counters.items() if count)
    print(f"accepted {accepted}, dropped {sum(counters.values())}"
          + (f" ({reasons})" if reasons else ""))
    responses = [bytes.fromhex(r["hex"]) for r in outcome["responses"]]
    print(f"responses: {len(responses)} frames; responder: " + ", ".join(
        f"{name} {count}" for name, count in outcome["responder_counters"].items() if count))
    report = {"capture": str(args.pcap), "config": config.to_dict(), "frames": verdicts,
              "accepted": accepted, "drop_counters": counters,
              "responder_counters": outcome["responder_counters"],
              "responses": outcome["responses"], "placed_bytes": outcome["placed_bytes"]}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.out:
        from .packets import write_pcap
        write_pcap(args.out, responses)
        print(f"wrote {args.out}: {len(responses)} responses")
    return 0
