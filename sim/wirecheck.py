"""An independent reader of MRC 1.0 captures: does what is on the wire follow the tables?

Written from the opcode and header tables of the MRC 1.0 switch (bytes after the 12-byte BTH,
big-endian), with :mod:`struct` and integer arithmetic only: it imports neither the layout
table (``hdl.packet.layouts``) nor the Scapy layers (``sim.packets``), so a mistake there
cannot hide here. ``mrc-nic wirecheck CAPTURE`` reads a classic pcap or a pcapng (the sim's
``traffic.pcap`` holds the delivered frames, ``traffic.pcapng`` every frame with the dropped
ones), checks every RoCEv2 frame (UDP destination port 4791) against the rules below and
writes a JSON verdict:

``opcode``
    every opcode is one of the table's;
``data_headers``
    every data packet carries METH and RETH, plus TSETH where BTH.ts is set (and ImmDt on the
    two WITH_IMMEDIATE opcodes): the frame is long enough for them and the ICRC, and the
    payload is RETH.dma_len bytes (or none at all, for a packet a switch trimmed);
``rtx``
    every repeated data PSN (same addresses, destination QP and PSN) has BTH.rtx set: of the
    copies of a PSN at most one, the first transmission, has BTH.rtx clear. (The order of a
    capture is the order of arrival, or of hand-over for a dropped frame: a first transmission
    delayed on a slow path may show after its retransmission, so the order is not judged.)
``control_length``
    each SACK, NACK, AETH, PETH, ERTH and EETH packet is exactly its headers and the ICRC;
``psn_echo``
    a SACK's cack_psn and a NACK's nack_psn equal BTH.psn;
``ack_psn``
    a SACK's ack_psn (cack_psn + ack_psn_offset, when pr = 0) names a data PSN the other
    side sent to this side's peer before the SACK;
``bitmap``
    every PSN the SACK bitmap marks (cack_psn + sack_psn_offset + bit) lies above cack_psn;
``tshark``
    tshark with the project's dissector reports no malformed frame (skipped without tshark);
``no_byte_lost``
    the sim's own ``report.json`` (beside the capture, or ``--report``) says no byte was lost
    (skipped when there is none).

The run passes when no rule fails. Exit status 0 when it passes, 1 when a rule fails, 2 for
input that cannot be read (one line, as every ``mrc-nic`` command).
"""

import json
import shutil
import struct
import subprocess
from pathlib import Path

from .errors import fail

__all__ = ["check_capture", "read_capture", "RULES", "register", "handler"]

# ---------------------------------------------------------------------------------------------
# The tables (typed from the opcode and header tables, not imported)
# ---------------------------------------------------------------------------------------------

ROCEV2_PORT = 4791
BTH_BYTES = 12
ICRC_BYTES = 4
PSN_MODULUS = 1 << 24
METH_BYTES, TSETH_BYTES, RETH_BYTES, IMMDT_BYTES = 4, 4, 16, 4
DATA_OPCODES = {0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB}
IMMEDIATE_OPCODES = {0xC9, 0xCB}
#: Control opcodes: (name, bytes of headers after the BTH).
CONTROL_OPCODES = {
    0xD1: ("ACKNOWLEDGE", 4),                   # AETH
    0xD8: ("ENDPOINT_REQUEST", 16),             # ERTH
    0xD9: ("ENDPOINT_RESPONSE", 36),            # EETH
    0xDC: ("RELIABILITY_SACK", 36),             # SETH + CC_STATE
    0xDD: ("RELIABILITY_NACK", 20),             # NETH
    0xDE: ("RELIABILITY_PROBE_REQUEST", 16),    # PETH
}
SACK, NACK = 0xDC, 0xDD
DEFAULT_TRIM_DSCP = 33

RULES = ("opcode", "data_headers", "rtx", "control_length", "psn_echo", "ack_psn", "bitmap",
         "tshark", "no_byte_lost")
_EXAMPLES = 10          # failures kept per rule in the verdict


class CaptureError(Exception):
    """The capture cannot be read."""


# ---------------------------------------------------------------------------------------------
# Capture files
# ---------------------------------------------------------------------------------------------

def _pcap_frames(data):
    magic = data[:4]
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<",
              b"\xa1\xb2\x3c\x4d": ">"}[magic]
    nanoseconds = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    if len(data) < 24:
        raise CaptureError("the pcap header is cut short")
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    if linktype != 1:
        raise CaptureError(f"link type {linktype}, not Ethernet (1)")
    offset, frames = 24, []
    while offset < len(data):
        if offset + 16 > len(data):
            raise CaptureError(f"a record header is cut short at byte {offset}")
        seconds, fraction, captured, _length = struct.unpack_from(endian + "IIII", data, offset)
        offset += 16
        if offset + captured > len(data):
            raise CaptureError(f"a record is cut short at byte {offset}")
        time_ns = seconds * 10**9 + (fraction if nanoseconds else fraction * 1000)
        frames.append((time_ns, data[offset:offset + captured]))
        offset += captured
    return frames


def _pcapng_frames(data):
    offset, frames, endian, resolutions = 0, [], "<", []
    while offset < len(data):
        if offset + 12 > len(data):
            raise CaptureError(f"a block is cut short at byte {offset}")
        block_type = struct.unpack_from(endian + "I", data, offset)[0]
        if block_type == 0x0A0D0D0A:
            endian = "<" if data[offset + 8:offset + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            resolutions = []
        length = struct.unpack_from(endian + "I", data, offset + 4)[0]
        if length < 12 or offset + length > len(data):
            raise CaptureError(f"a block of {length} bytes at byte {offset} does not fit")
        body = data[offset + 8:offset + length - 4]
        if block_type == 1:                                     # interface description
            linktype = struct.unpack_from(endian + "H", body, 0)[0]
            if linktype != 1:
                raise CaptureError(f"link type {linktype}, not Ethernet (1)")
            resolutions.append(_tsresol(body[8:], endian))
        elif block_type == 6:                                   # enhanced packet
            interface, high, low, captured = struct.unpack_from(endian + "IIII", body, 0)
            if interface >= len(resolutions):
                raise CaptureError(f"a packet names interface {interface}, which is undefined")
            ticks = (high << 32) | low
            frames.append((ticks * 10**9 // resolutions[interface], body[20:20 + captured]))
        offset += length
    return frames


def _tsresol(options, endian):
    """Ticks per second of an interface (if_tsresol; default microseconds)."""
    offset = 0
    while offset + 4 <= len(options):
        code, length = struct.unpack_from(endian + "HH", options, offset)
        if code == 0:
            break
        if code == 9 and length >= 1:
            value = options[offset + 4]
            return 2 ** (value & 0x7F) if value & 0x80 else 10 ** value
        offset += 4 + length + (-length % 4)
    return 10**6


def read_capture(path):
    """``[(time_ns, frame bytes)]`` of a classic pcap or a pcapng, in file order."""
    data = Path(path).read_bytes()
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        return _pcapng_frames(data)
    if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1",
                    b"\xa1\xb2\x3c\x4d"):
        return _pcap_frames(data)
    raise CaptureError("not a pcap or pcapng capture")


# ---------------------------------------------------------------------------------------------
# Frames: Ethernet, 802.1Q, IPv4/IPv6 (SRv6: IPv6 or IPv4 in IPv6, an SRH), UDP, BTH
# ---------------------------------------------------------------------------------------------

def _u(data, offset, size):
    return int.from_bytes(data[offset:offset + size], "big")


def _roce(frame):
    """``(src, dst, dscp, udp_payload)`` of a RoCEv2 frame (UDP to 4791), else ``None``. The
    addresses and DSCP are the innermost IP header's; ``udp_payload`` ends where the UDP
    length says (Ethernet padding dropped)."""
    if len(frame) < 14:
        return None
    ethertype, offset = _u(frame, 12, 2), 14
    if ethertype == 0x8100 and len(frame) >= 18:
        ethertype, offset = _u(frame, 16, 2), 18
    version = {0x0800: 4, 0x86DD: 6}.get(ethertype)
    if version is None:
        return None
    while True:
        if version == 4:
            if len(frame) < offset + 20:
                return None
            header = (frame[offset] & 0x0F) * 4
            src, dst = frame[offset + 12:offset + 16], frame[offset + 16:offset + 20]
            dscp, protocol = frame[offset + 1] >> 2, frame[offset + 9]
            offset += header
        else:
            if len(frame) < offset + 40:
                return None
            src, dst = frame[offset + 8:offset + 24], frame[offset + 24:offset + 40]
            dscp = (_u(frame, offset, 2) >> 6) & 0x3F
            protocol = frame[offset + 6]
            offset += 40
            if protocol == 43 and len(frame) >= offset + 8:      # routing header (SRH)
                protocol, length = frame[offset], frame[offset + 1]
                offset += 8 + 8 * length
        if protocol == 17:
            break
        version = {41: 6, 4: 4}.get(protocol)                   # SRv6: an inner IP header
        if version is None:
            return None
    if len(frame) < offset + 8:
        return None
    if _u(frame, offset + 2, 2) != ROCEV2_PORT:
        return None
    udp_length = _u(frame, offset + 4, 2)
    return src.hex(), dst.hex(), dscp, frame[offset + 8:offset + max(udp_length, 8)]


def _psn_above(psn, base):
    """``psn`` is after ``base`` in the PSN space (within half of it)."""
    return 0 < (psn - base) % PSN_MODULUS < PSN_MODULUS // 2


def _signed16(value):
    return value - (1 << 16) if value & 0x8000 else value


# ---------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------

class _Verdict:
    def __init__(self):
        self.rules = {name: {"checked": 0, "failed": 0, "examples": []} for name in RULES}

    def check(self, rule, ok, frame_number, message):
        entry = self.rules[rule]
        entry["checked"] += 1
        if not ok:
            entry["failed"] += 1
            if len(entry["examples"]) < _EXAMPLES:
                entry["examples"].append(f"frame {frame_number}: {message}")

    def skip(self, rule, why):
        self.rules[rule]["skipped"] = why

    def result(self, **extra):
        for entry in self.rules.values():
            entry["pass"] = entry["failed"] == 0 and "skipped" not in entry
        failed = [name for name, entry in self.rules.items() if entry["failed"]]
        return {"pass": not failed, "failed_rules": failed,
                "skipped_rules": [n for n, e in self.rules.items() if "skipped" in e],
                **extra, "rules": self.rules}


def check_capture(path, *, report=None, tshark=None, lua=None, trim_dscp=DEFAULT_TRIM_DSCP):
    """The verdict (a dict, as the JSON file holds it) on the capture at ``path``.

    ``report``: the sim's ``report.json`` (``None``: the rule is skipped); ``tshark``: the
    tshark to run with the dissector ``lua`` (``None``: the rule is skipped).
    """
    verdict = _Verdict()
    frames = read_capture(path)
    roce_frames = 0
    sent = {}                   # (src, dst) -> {psn: first time seen} of data packets
    originals = set()           # (src, dst, dqpn, psn) of data packets seen without BTH.rtx
    sacks = []                  # checked once every data packet is known
    for number, (time_ns, frame) in enumerate(frames, 1):
        info = _roce(frame)
        if info is None:
            continue
        roce_frames += 1
        src, dst, dscp, transport = info
        if len(transport) < BTH_BYTES:
            verdict.check("opcode", False, number, "frame ends inside the BTH")
            continue
        opcode = transport[0]
        dqpn, psn = _u(transport, 5, 3), _u(transport, 9, 3)
        rtx, ts = bool(transport[8] & 0x20), bool(transport[8] & 0x10)
        known = opcode in DATA_OPCODES or opcode in CONTROL_OPCODES
        verdict.check("opcode", known, number, f"opcode 0x{opcode:02X} is not MRC 1.0's")
        after = transport[BTH_BYTES:]
        if opcode in DATA_OPCODES:
            need = (METH_BYTES + (TSETH_BYTES if ts else 0) + RETH_BYTES
                    + (IMMDT_BYTES if opcode in IMMEDIATE_OPCODES else 0))
            payload = len(after) - need - ICRC_BYTES
            reth = METH_BYTES + (TSETH_BYTES if ts else 0)
            if payload < 0:
                verdict.check("data_headers", False, number,
                              f"0x{opcode:02X} ts={int(ts)} needs {need} header bytes and the "
                              f"ICRC after the BTH, has {len(after)}")
            else:
                dma_len = _u(after, reth + 12, 4)
                trimmed = payload == 0 and dscp == trim_dscp
                verdict.check("data_headers", payload == dma_len or trimmed, number,
                              f"payload {payload} bytes, RETH dma_len {dma_len}")
            key = (src, dst, dqpn, psn)
            verdict.check("rtx", rtx or key not in originals, number,
                          f"PSN 0x{psn:06X} to QP 0x{dqpn:06X} repeated without BTH.rtx")
            if not rtx:
                originals.add(key)
            sent.setdefault((src, dst), {}).setdefault(psn, time_ns)
        elif opcode in CONTROL_OPCODES:
            name, size = CONTROL_OPCODES[opcode]
            verdict.check("control_length", len(after) == size + ICRC_BYTES, number,
                          f"{name} is {len(after)} bytes after the BTH, not {size} + ICRC")
            if len(after) < size:
                continue
            if opcode == SACK:
                cack_psn = _u(after, 13, 3)
                verdict.check("psn_echo", cack_psn == psn, number,
                              f"cack_psn 0x{cack_psn:06X} != BTH.psn 0x{psn:06X}")
                sacks.append((number, time_ns, src, dst, cack_psn, after))
            elif opcode == NACK:
                nack_psn = _u(after, 13, 3)
                verdict.check("psn_echo", nack_psn == psn, number,
                              f"nack_psn 0x{nack_psn:06X} != BTH.psn 0x{psn:06X}")
    for number, time_ns, src, dst, cack_psn, seth in sacks:
        pr = seth[1] & 0x02
        if not pr:
            ack_psn = (cack_psn + _signed16(_u(seth, 2, 2))) % PSN_MODULUS
            first = sent.get((dst, src), {}).get(ack_psn)
            verdict.check("ack_psn", first is not None and first <= time_ns, number,
                          f"ack_psn 0x{ack_psn:06X} was not sent to this side before")
        base = (cack_psn + _signed16(_u(seth, 18, 2))) % PSN_MODULUS
        bitmap = _u(seth, 20, 8)
        below = [(base + bit) % PSN_MODULUS for bit in range(64)
                 if bitmap >> bit & 1 and not _psn_above((base + bit) % PSN_MODULUS, cack_psn)]
        verdict.check("bitmap", not below, number,
                      f"bitmap marks PSN(s) {', '.join(f'0x{p:06X}' for p in below[:4])} at "
                      f"or below cack_psn 0x{cack_psn:06X}")
    _check_tshark(verdict, path, tshark, lua)
    _check_report(verdict, report)
    return verdict.result(capture=str(path), frames=len(frames), roce_frames=roce_frames)


def _check_tshark(verdict, path, tshark, lua):
    if tshark is None:
        verdict.skip("tshark", "no tshark")
        return
    command = [tshark, "-n", "-r", str(path), "-X", f"lua_script:{lua}",
               "-o", "udp.ignore_ipv6_zero_checksum:TRUE", "-T", "fields",
               "-e", "frame.number", "-e", "_ws.malformed", "-e", "mrc.malformed",
               "-e", "_ws.expert.message"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                            check=False)
    if result.returncode != 0:
        verdict.check("tshark", False, 0, f"tshark failed: {result.stderr.strip()[-200:]}")
        return
    for line in result.stdout.splitlines():
        number, ws_malformed, mrc_malformed, messages = (line.split("\t") + [""] * 4)[:4]
        bad = ws_malformed != "" or mrc_malformed not in ("", "0", "False")
        lua_error = "Lua Error" in messages
        verdict.check("tshark", not bad and not lua_error, int(number),
                      "malformed" if bad else "Lua error in the dissector")


def _check_report(verdict, report):
    if report is None:
        verdict.skip("no_byte_lost", "no report.json")
        return
    lost = report.get("bytes_lost")
    corrupted = report.get("bytes_corrupted", 0)
    verdict.check("no_byte_lost", lost == 0 and corrupted == 0 and report.get("finished"),
                  0, f"report.json: bytes_lost {lost}, bytes_corrupted {corrupted}, "
                     f"finished {report.get('finished')}")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def register(subparsers):
    """Add ``wirecheck`` to the ``mrc-nic`` command line."""
    parser = subparsers.add_parser(
        "wirecheck", help="check a capture against the MRC 1.0 wire rules",
        description="Read every RoCEv2 frame of a capture (pcap or pcapng) with a reader "
                    "written from the MRC 1.0 tables and check the wire rules (opcodes, data "
                    "headers, BTH.rtx on repeated PSNs, control header lengths, PSN echoes, "
                    "SACK ack_psn and bitmap), tshark's view and the sim's report. Writes a "
                    "JSON verdict; exit status 0 when every rule passes, 1 otherwise.")
    parser.add_argument("capture", type=Path, metavar="CAPTURE",
                        help="pcap or pcapng, e.g. build/sim/<run>/traffic.pcap")
    parser.add_argument("--report", type=Path, metavar="REPORT.json",
                        help="the sim's report (default: report.json beside the capture, "
                             "if there is one)")
    parser.add_argument("--out", type=Path, metavar="VERDICT.json",
                        help="verdict file (default: wirecheck.json beside the capture)")
    parser.add_argument("--tshark", choices=("auto", "never"), default="auto",
                        help="run tshark with the project's dissector when it is installed")
    parser.add_argument("--trim-dscp", type=int, default=DEFAULT_TRIM_DSCP, metavar="DSCP",
                        help="DSCP of a data packet a switch trimmed")
    parser.set_defaults(func=handler)
    return parser


def handler(args):
    if not 0 <= args.trim_dscp < 64:
        return fail(f"must be from 0 to 63, not {args.trim_dscp}", field="--trim-dscp")
    report_path = args.report
    if report_path is None and (args.capture.parent / "report.json").is_file():
        report_path = args.capture.parent / "report.json"
    report = None
    if report_path is not None:
        try:
            report = json.loads(report_path.read_text())
        except OSError as e:
            return fail(f"cannot read: {e.strerror}", field=str(report_path))
        except json.JSONDecodeError as e:
            return fail(f"not valid JSON: {e.msg}", field=str(report_path))
    tshark = shutil.which("tshark") if args.tshark == "auto" else None
    lua = Path(__file__).resolve().parent / "wireshark" / "mrc.lua"
    try:
        verdict = check_capture(args.capture, report=report, tshark=tshark, lua=lua,
                                trim_dscp=args.trim_dscp)
    except OSError as e:
        return fail(f"cannot read: {e.strerror}", field=str(args.capture))
    except CaptureError as e:
        return fail(str(e), field=str(args.capture))
    out = args.out or args.capture.parent / "wirecheck.json"
    try:
        out.write_text(json.dumps(verdict, indent=2) + "\n")
    except OSError as e:
        return fail(f"cannot write: {e.strerror}", field="--out")
    for name, entry in verdict["rules"].items():
        state = ("skipped: " + entry["skipped"] if "skipped" in entry
                 else "ok" if entry["pass"] else "FAILED")
        print(f"  {name:15s} {entry['checked']:8d} checked, {entry['failed']:6d} failed  "
              f"{state}")
        for example in entry["examples"][:3]:
            print(f"      {example}")
    print(f"wirecheck: {verdict['roce_frames']} RoCEv2 frames of {verdict['frames']}: "
          f"{'PASS' if verdict['pass'] else 'FAIL'} -> {out}")
    return 0 if verdict["pass"] else 1
