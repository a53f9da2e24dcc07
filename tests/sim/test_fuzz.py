"""``mrc-nic fuzz`` (sim/fuzz.py, sim/mutants.py, sim/tb/cocotb_fuzz.py): the forged frames are
the Scapy layers' byte for byte, the parser-level mutants never pass a parser, the mutants
aimed at live QPs stay out of their windows (they reach the transport, where a correct NIC
drops them or answers harmlessly), and a short RTL run ends with no hang, no write outside a
region, no state error and every live transfer verified, its verdicts covering every reason
the mutants aim at. Every failure the fuzzer found is a vector under ``tests/vectors/fuzz/``,
run again here.
"""

import json
import random
from collections import Counter, deque
from pathlib import Path

import pytest
from scapy.compat import raw
from scapy.layers.l2 import Ether

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import DropReason
from sim import fuzz as F
from sim import mutants as M
from sim import packets as pk
from sim.cli import main
from sim.env import BUILD
from sim.fabric import Fabric, FabricConfig
from tests.hdl.test_parser import reference_verdict

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "fuzz"
CONFIG = NicConfig(mtu=1024)


def view(*, acked=0xFFFF20, posted=0xFFFF60, victim_acked=5, victim_posted=9):
    return M.View(
        legit=[M.QpView(q, q, F.legit_rkey("b"), F.LEGIT_MR_BASE, F.LEGIT_MR_BYTES,
                        acked_end=acked, posted_end=posted) for q in F.LEGIT_QPS],
        victims=[M.QpView(q, q, F.VICTIM_RKEY, F.VICTIM_MR, F.VICTIM_MR_BYTES,
                          acked_end=victim_acked, posted_end=victim_posted)
                 for q in F.VICTIM_QPS],
        wrong_state=F.INIT_QPS + F.reset_qps(16), qps=16, qpn_bits=4, mtu=CONFIG.mtu,
        foreign_rkeys=F.FOREIGN_RKEYS, legit_rkey=F.legit_rkey("b"))


def forged(name, count, *, seed=0, wrap=0.06, **kw):
    mutator = M.Mutator(view(**kw), seed=seed, wrap=wrap)
    return [frame for _ in range(count) for _dst, frame in mutator.next(name)[1]]


# -- the frames -------------------------------------------------------------------------------

@pytest.mark.parametrize("ip_version", [4, 6])
def test_forged_frames_are_the_scapy_layers_byte_for_byte(ip_version):
    kit = M.FrameKit(ip_version=ip_version)
    rng = random.Random(ip_version)
    for _ in range(12):
        opcode = rng.choice(sorted(P.DATA_OPCODES))
        imm = rng.getrandbits(32) if opcode in P.IMMEDIATE_OPCODES else None
        tx = rng.choice((None, rng.getrandbits(16)))
        fields = dict(dqpn=rng.getrandbits(24), psn=rng.getrandbits(24),
                      va=rng.getrandbits(64), rkey=rng.getrandbits(32),
                      payload=rng.randbytes(rng.randrange(0, 300)), ackreq=rng.randrange(2),
                      msn=rng.getrandbits(16), rqmsn=rng.getrandbits(16))
        ev = dict(udp_sport=rng.getrandbits(16),
                  flow_label=rng.getrandbits(20) if ip_version == 6 else 0)
        ours = kit.data(opcode, imm=imm, tx_timestamp=tx, **fields, **ev)
        theirs = raw(pk.data_packet(opcode, imm=imm, ip_version=ip_version,
                                    tseth=None if tx is None else {"tx_timestamp": tx},
                                    **fields, **ev))
        assert ours == theirs
        assert pk.icrc_ok(ours)
    seth = dict(m=2, pr=1, ack_psn_offset=-7, sack_psn_offset=3, sack_bitmap=0xF0F0,
                entropy=0x1234_5678, mpr=1)
    assert kit.sack(dqpn=3, cack_psn=0xABCDEF, cc_state={"tx_timestamp": 9}, **seth) == raw(
        pk.sack_packet(dqpn=3, cack_psn=0xABCDEF, cc_state={"tx_timestamp": 9},
                       ip_version=ip_version, **seth))
    assert kit.nack(dqpn=3, nack_psn=7, nack_reason=P.NackReason.PSN_OOR_WINDOW) == raw(
        pk.nack_packet(dqpn=3, nack_psn=7, nack_reason=P.NackReason.PSN_OOR_WINDOW,
                       ip_version=ip_version))
    assert kit.aeth(dqpn=3, psn=7, syndrome=0x62, msn=5) == raw(
        pk.ack_packet(dqpn=3, psn=7, syndrome=0x62, msn=5, ip_version=ip_version))
    assert kit.probe(dqpn=3, psn=7, probe_id=11, tx_timestamp=4) == raw(
        pk.probe_packet(dqpn=3, psn=7, probe_id=11, tx_timestamp=4, ip_version=ip_version))


@pytest.mark.parametrize("ip_version", [4, 6])
@pytest.mark.parametrize("segment", [None, bytes(range(16))])
def test_srv6_and_vlan_wrapping_is_the_scapy_layers(ip_version, segment):
    kit = M.FrameKit(ip_version=ip_version)
    frame = kit.sack(dqpn=2, cack_psn=0x123456, sack_bitmap=5)
    dst = bytes(range(16, 32))
    assert M.srv6_encapsulate(frame, dst=dst, segment=segment) == raw(
        pk.srv6_encapsulate(Ether(frame), dst=dst, segment=segment))
    tagged = Ether(M.add_vlan(frame, 0x2005))
    assert tagged.vlan == 5 and tagged.prio == 1 and pk.icrc_ok(raw(tagged))
    for wrapped in (M.srv6_encapsulate(frame, dst=dst, segment=segment),
                    M.add_vlan(frame, 7)):
        assert reference_verdict(wrapped, config=CONFIG) == DropReason.NONE


def test_signature_names_the_rkey_and_the_qp():
    payload = M.fill(0x5EC7_1005, 1, 100)
    assert M.read_signature(payload[:16]) == (0x5EC7_1005, 1)
    assert M.read_signature(payload[:15]) is None
    assert M.read_signature(bytes(16)) is None


# -- the mutants ------------------------------------------------------------------------------

def test_every_mutant_is_forged_for_its_nic():
    mutator = M.Mutator(view(), seed=3)
    for name, (_, nics, _) in M.MUTANTS.items():
        for _ in range(20):
            _, frames = mutator.next(name)
            assert frames and all(dst in nics for dst, _ in frames), name


@pytest.mark.parametrize("name", sorted(M.PARSER_MUTANTS))
def test_parser_level_mutants_never_pass_a_parser(name):
    reasons = Counter(reference_verdict(frame, config=CONFIG)
                      for frame in forged(name, 60, seed=len(name)))
    assert DropReason.NONE not in reasons, reasons


def _bth(frame):
    """BTH fields of a frame, tagged or SRv6-encapsulated or not (Scapy decodes it)."""
    bth = Ether(frame)[pk.BTH]
    return {"dqpn": bth.dqpn, "psn": bth.psn}


def _seth(frame):
    seth = Ether(frame)[pk.SETH]
    return {name: getattr(seth, name) for name in ("cack_psn", "sack_psn_offset",
                                                   "sack_bitmap")}


@pytest.mark.parametrize("name", ["psn_below", "psn_beyond", "probe", "unknown_qp",
                                  "wrong_state_qp", "sack_below", "sack_beyond",
                                  "sack_malformed", "nack_stale", "nak_stale", "victim_in_window",
                                  "victim_bad_rkey", "victim_out_of_bounds", "victim_sack",
                                  "victim_nack", "victim_nak", "victim_wimm_flood",
                                  "endpoint"])
def test_transport_mutants_pass_the_parser(name):
    """They are meant for the transport: a valid ICRC and every length right."""
    for frame in forged(name, 20, wrap=0.5):
        assert reference_verdict(frame, config=CONFIG) == DropReason.NONE, name


def test_live_qp_data_stays_out_of_the_window():
    """psn_below is below what the responder has certainly passed; psn_beyond at least a
    window beyond anything the requester sent: neither can be placed."""
    v = view()
    window = 128
    for frame in forged("psn_below", 100) + forged("psn_beyond", 100):
        bth = _bth(frame)
        assert bth["dqpn"] in F.LEGIT_QPS
        qp = v.legit[F.LEGIT_QPS.index(bth["dqpn"])]
        below = M.psn_diff(bth["psn"], qp.acked_end) < 0
        beyond = M.psn_diff(bth["psn"], M.psn_add(qp.posted_end, window + M.LIVE_MARGIN)) >= 0
        assert below or beyond


def test_live_qp_acknowledgements_say_nothing_new():
    """A forged SACK for a live QP acknowledges nothing at or above its acknowledged PSNs, or
    claims PSNs never sent (dropped); NACKs and NAKs name PSNs not outstanding."""
    v = view()
    for frame in forged("sack_below", 100):
        qp = v.legit[F.LEGIT_QPS.index(_bth(frame)["dqpn"])]
        seth = _seth(frame)
        assert M.psn_diff(seth["cack_psn"], qp.acked_end) < 0
        base = M.psn_add(seth["cack_psn"], seth["sack_psn_offset"])
        for bit in range(64):
            if seth["sack_bitmap"] >> bit & 1:
                assert M.psn_diff(M.psn_add(base, bit), qp.acked_end) < 0
    for frame in forged("sack_beyond", 40):
        qp = v.legit[F.LEGIT_QPS.index(_bth(frame)["dqpn"])]
        assert M.psn_diff(_seth(frame)["cack_psn"], qp.posted_end) > M.LIVE_MARGIN
    for frame in forged("nack_stale", 40) + forged("nak_stale", 40):
        bth = _bth(frame)
        qp = v.legit[F.LEGIT_QPS.index(bth["dqpn"])]
        # Not outstanding, nor about to be: the QP cannot reach it while the frame travels.
        reachable = (M.psn_diff(bth["psn"], qp.acked_end) >= 0
                     and M.psn_diff(bth["psn"], qp.posted_end) < M.LIVE_MARGIN)
        assert not reachable


def test_mutants_that_may_hurt_a_qp_name_only_victims():
    for name in M.MUTANTS:
        if not name.startswith("victim_"):
            continue
        for frame in forged(name, 10):
            assert _bth(frame)["dqpn"] in F.VICTIM_QPS, name


def test_odd_qps_are_unknown_or_not_connected():
    for frame in forged("unknown_qp", 60):
        assert _bth(frame)["dqpn"] >= 16
    for frame in forged("wrong_state_qp", 60):
        assert _bth(frame)["dqpn"] in F.INIT_QPS + F.reset_qps(16)


def test_replays_are_the_frames_seen():
    v = view()
    v.data_frames.extend([b"data-frame-" + bytes([k]) for k in range(3)])
    v.ack_frames.append(b"ack-frame")
    mutator = M.Mutator(v, seed=1, wrap=0)
    assert {f for _ in range(30) for _, f in mutator.next("replay_data")[1]} <= set(v.data_frames)
    _, flood = mutator.next("ack_flood")
    assert 8 <= len(flood) <= 32 and {f for _, f in flood} == {b"ack-frame"}


# -- the hostile source and the fabric --------------------------------------------------------

class _Steady:
    """A mutator stand-in: 80-byte frames (10 beats) for b."""

    def next(self):
        return "steady", [("b", bytes(80))]


def test_hostile_source_paces_by_load_and_stops_at_its_total():
    history = deque(maxlen=4)
    source = F.HostileSource(_Steady(), total=500, load=0.5, planes=4, period_ns=8.0, seed=1,
                             history=history, cycle_of=lambda ns: round(ns / 8))
    frames = []
    for step in range(1, 801):
        frames += source(step * 8.0 * 10)        # every 10 cycles
    # 10 beats at half a beat per cycle: one frame at once, then one every 20 cycles.
    assert len(frames) == 401
    assert all(dst == "b" and 0 <= plane < 4 for dst, plane, _ in frames)
    for step in range(801, 2000):
        frames += source(step * 80.0)
    assert len(frames) == source.injected == 500 and len(history) == 4
    source.paused = True
    assert source(1e9) == []


def test_fabric_injects_hostile_frames_past_its_queues():
    due = [("b", 2, b"\x01" * 90)]
    fabric = Fabric(FabricConfig(planes=4, loss=0.5, seed=3),
                    hostile=lambda now: [due.pop()] if due else [])
    fabric.send("a", 0, bytes(100), 0.0)
    arrivals = fabric.deliver(1e6)
    assert ("b", 2, b"\x01" * 90) in arrivals
    record = next(r for r in fabric.records if r.marks == ("hostile",))
    assert record.src == "a" and record.outcome == "delivered"
    assert fabric.stats.counters[2]["hostile"] == 1


# -- the command ------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--packets", "0"], "mrc-nic fuzz: --packets: must be an integer from 1 to 100000000, not 0"),
    (["--packets", "x"], "mrc-nic fuzz: --packets: must be an integer, not 'x'"),
    (["--seed", "-1"], "mrc-nic fuzz: --seed: must be an integer, 0 or more, not -1"),
    (["--load", "2"], "mrc-nic fuzz: --load: must be a number from 0.01 to 1.0, not 2.0"),
    (["--planes", "17"], "mrc-nic fuzz: --planes: must be an integer from 1 to 16, not 17"),
    (["--mtu", "1000"], "mrc-nic fuzz: --mtu: must be one of 256, 512, 1024, 2048, 4096, "
                        "not 1000"),
    (["--vector", "/nonexistent/v.json"], "mrc-nic fuzz: --vector: /nonexistent/v.json: cannot "
                                          "read: No such file or directory"),
    (["--vector", str(VECTORS)], f"mrc-nic fuzz: --vector: {VECTORS}: cannot read: Is a "
                                 f"directory"),
    (["--vector", str(VECTORS / "README.md")], f"mrc-nic fuzz: --vector: {VECTORS}/README.md: "
                                               f"not valid JSON: Expecting value: line 1 "
                                               f"column 1 (char 0)"),
])
def test_bad_flags_are_one_line(capsys, argv, message):
    status = main(["fuzz", *argv])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err == message + "\n"


def _result(**changes):
    counters = {side: {block: dict.fromkeys(names, 0) for block, names in {
        "rx_counters": ("none", "bad_icrc"), "responder_counters": ("placed", "bad_qp"),
        "requester_counters": ("bad_acks",), "tx_counters": ("no_path",),
        "path_counters": ("events",)}.items()} for side in "ab"}
    after = json.loads(json.dumps(counters))
    after["b"]["rx_counters"]["bad_icrc"] = 5
    after["a"]["requester_counters"]["bad_acks"] = 3
    result = {"end": "done", "packets": 10, "mutants": {"bad_icrc": 10}, "cycles": 1000,
              "sim_us": 8.0, "wall_s": 2.0, "total_wall_s": 3.0, "counters_before": counters,
              "counters": after, "hangs": [], "outside": [], "outside_bytes": 0,
              "state_errors": [], "legit": {"wrs_posted": 4, "wrs_verified": 4,
                                            "bytes_verified": 100, "immediates": 2},
              "legit_errors": [], "victim": {}, "placed_bytes": {}, "qp_errors": {},
              "ev_events": 0, "max_stall_cycles": {}, "failures": []}
    result.update(changes)
    return result


def test_report_fields_and_exit_rule():
    report = F.make_report(_result(), seed=1, load=0.5, packets=10, config=CONFIG, bounds={})
    for key in ("packets", "verdicts", "hangs", "writes_outside_regions", "state_errors",
                "legit_verified", "seed", "cycles", "wall_s"):
        assert key in report
    assert report["verdicts"]["parser.bad_icrc"] == 5
    assert report["verdicts"]["requester.bad_acks"] == 3
    assert report["ok"] and report["legit_verified"]
    for changes in ({"hangs": [{"what": "x"}]}, {"outside_bytes": 4},
                    {"state_errors": [{"what": "x"}]}, {"legit_errors": [{"what": "x"}]},
                    {"end": "no progress"}):
        assert not F.make_report(_result(**changes), seed=1, load=0.5, packets=10,
                                 config=CONFIG, bounds={})["ok"]


# -- on the RTL -------------------------------------------------------------------------------

#: The reasons a short run must reach: the parser's and the transport's (so the test fails if
#: the mutants stop getting there).
EXPECTED_VERDICTS = [
    "parser.bad_icrc", "parser.runt", "parser.bad_ip_length", "parser.bad_udp_length",
    "parser.bad_length", "parser.unsupported_opcode", "parser.oversize",
    "responder.bad_qp", "responder.bad_state", "responder.out_of_window",
    "responder.duplicate", "responder.bad_rkey", "responder.out_of_bounds",
    "responder.bad_sequence", "responder.trimmed", "responder.probes",
    "responder.probes_dropped", "requester.bad_acks", "requester.duplicate_acks",
]


def _run(tmp_path, **kw):
    # The NIC pair build of tests/hdl/test_nic_rtl.py (4 planes, MTU 512, C++ agents, -O0).
    return F.run_fuzz(planes=4, mtu=512, build_dir=BUILD / "tests" / "nic_pair",
                      quick_build=True, out=tmp_path / "fuzz.json", vectors=tmp_path / "vectors",
                      log=lambda *_: None, **kw)


def _assert_clean(report):
    assert report["hangs"] == 0, report["hang_details"]
    assert report["writes_outside_regions"] == 0, report["outside_write_details"]
    assert report["state_errors"] == 0, report["state_error_details"]
    assert report["legit_verified"], report["legit"]


def test_short_run_is_clean_and_reaches_every_verdict(tmp_path):
    report = _run(tmp_path, packets=1200, seed=11, load=0.6)
    saved = json.loads((tmp_path / "fuzz.json").read_text())
    assert saved["packets"] == report["packets"] == 1200
    _assert_clean(report)
    missing = [name for name in EXPECTED_VERDICTS if not report["verdicts"].get(name)]
    assert not missing, report["verdicts"]
    assert report["legit"]["wrs_verified"] > 100


def test_regression_vectors(tmp_path):
    """Every failure the fuzzer found: its frames injected again, each at its distance from the
    first, into the tests' NIC pair (planes taken modulo 4; at MTU 512 a payload over 512 bytes
    is now oversize) brought up on the vector's seed: the run must be clean."""
    vectors = sorted(VECTORS.glob("*.json"))
    for vector in vectors:
        saved = F.read_vector(vector)
        report = _run(tmp_path, packets=len(saved["frames"]), seed=saved["run"]["seed"],
                      replay=saved["frames"])
        assert report["packets"] == len(saved["frames"]), vector.name
        _assert_clean(report)


def test_docs_name_every_mutant_and_every_report_key():
    text = (Path(__file__).resolve().parents[2] / "docs" / "fuzz.md").read_text()
    for name in M.MUTANTS:
        assert f"`{name}`" in text, name
    report = F.make_report(_result(), seed=1, load=0.5, packets=10, config=CONFIG, bounds={})
    for key in report:
        assert f"`{key}`" in text, key
