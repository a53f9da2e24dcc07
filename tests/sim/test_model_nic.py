"""The model NIC (sim/model/nic.py) and the two-NIC model run (sim/model/pair.py)."""

import json
import math

import pytest
from scapy.compat import raw
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.path import ev as evlib
from hdl.path.select import auto_index
from sim import packets as pk
from sim.defaults import MR_BASE, NIC_A, NIC_B
from sim.model.nic import ModelNic
from sim.model.pair import (
    PROFILE_JSON,
    PSN_BASE,
    SRC_BASE,
    DelayNetwork,
    default_network,
    make_work,
    rkey_of,
    run_model,
)
from sim.scenario import Scenario, nic_config_for

SMALL = Scenario(name="small", backend="model", planes=4, qps=2, evs=8, bytes=40 * 1024,
                 msg_size=5 * 1024, mtu=1024, fail_plane=None, fail_at_us=None,
                 recover_at_us=None, max_us=2000.0)
SPEC = evlib.load_profile_json(json.loads(PROFILE_JSON.read_text()))


def run_small(scn=SMALL, **network_kw):
    network = DelayNetwork(planes=scn.planes, delay_ns=scn.latency_us * 1e3, **network_kw)
    return run_model(scn, network=network), network


def check_run(result, scn):
    """Everything moved, memory equal, completions as posted."""
    assert result["finished"]
    assert result["memory_mismatches"] == []
    work = make_work(scn)
    for side, peer in (("a", "b"), ("b", "a")):
        done = result["completions"][side]
        own = [c for c in done if c["side"] == 0]
        remote = [c for c in done if c["side"] == 1]
        for qpn in range(scn.qps):
            posted = [wr for wr in work[side] if wr["qpn"] == qpn]
            got = [c for c in own if c["qpn"] == qpn]
            assert [c["wr_id"] for c in got] == [wr["wr_id"] for wr in posted]
            assert all(c["status"] == P.CompletionStatus.SUCCESS for c in got)
            assert [c["byte_len"] for c in got] == [wr["length"] for wr in posted]
            imms = [wr["imm"] for wr in work[peer] if wr["qpn"] == qpn
                    and wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM]
            assert [c["imm"] for c in remote if c["qpn"] == qpn] == imms
        counters = result["counters"][side]
        assert counters["rx_counters"]["bad_icrc"] == 0
        assert counters["responder_counters"]["bad_rkey"] == 0
        assert counters["responder_counters"]["out_of_bounds"] == 0
    assert result["first_send_us"] <= result["done_us"] == result["sim_us"]
    assert result["cycles"] == int(result["sim_us"] * 1e3 * 125e6 / 1e9)


def data_frames(network, src):
    out = []
    for _, sender, plane, frame in network.capture:
        packet = Ether(frame)
        if sender == src and pk.METH in packet:
            out.append((plane, frame, packet))
    return out


# -- two NICs ---------------------------------------------------------------------------------

def test_clean_run_moves_every_byte_with_completions_in_order():
    result, network = run_small()
    check_run(result, SMALL)
    assert result["backend"] == "model" and result["ev_events"] == []
    for side in "ab":
        requester = result["counters"][side]["requester_counters"]
        assert requester["retransmissions"] == 0 and requester["bad_acks"] == 0
    assert network.dropped == 0
    assert sum(wr["length"] for side in "ab" for wr in result["work"][side]) == 2 * SMALL.bytes
    assert "data" not in result["work"]["a"][0]


def test_a_failed_plane_is_recovered_and_its_evs_marked_bad():
    # On the ECN window: with NSCC the port watch also reports two healthy planes down in this
    # run (three port reports per NIC; docs/performance.md, the one-way entries), which is
    # not what this test is about.
    scn = SMALL.replace(fail_plane=2, fail_at_us=10.0, recover_at_us=None, cc_algorithm="ecn")
    result, network = run_small(scn, fail_plane=2, fail_at_ns=10_000.0)
    check_run(result, scn)
    assert network.dropped > 0
    assert all(result["counters"][s]["requester_counters"]["retransmissions"] > 0
               for s in "ab")
    assert result["ev_events"], "losses on the failed plane raise EV events"
    assert all(e["port"] == 3 and e["state"] == P.EvState.ASSUMED_BAD
               for e in result["ev_events"])
    assert all(e["time_us"] >= 10.0 for e in result["ev_events"])


def test_reorder_windows_expire_without_a_later_ack_or_timer_event():
    """Time-based inference alone (count rule off, reo_wnd 8 units) against a plane that dies
    for good, with a retransmit timeout of 1,049 us: the model NIC polls each running reorder
    window when it expires, as the gateware's scanner does each scan period, so holes are
    resent reo_wnd after their window armed even when no later ACK or timer event comes.
    The run then ends after one timeout per side (time-rule resends give no LOST feedback,
    so only that timeout takes the dead plane out of a resend's way: docs/recovery.md).
    When the model NIC polled only at timer expiries, windows that no ACK followed waited for
    the timer and the run had not finished after 2,000 us."""
    scn = SMALL.replace(fail_plane=2, fail_at_us=10.0, recover_at_us=None, infer_k=0,
                        reo_wnd=8, timeout=10)
    result, network = run_small(scn, fail_plane=2, fail_at_ns=10_000.0)
    check_run(result, scn)
    assert network.dropped > 0
    for side in "ab":
        requester = result["counters"][side]["requester_counters"]
        assert requester["reorder_expiries"] > 0 and requester["retransmissions"] > 0
        assert requester["timeouts"] <= 1
    assert result["done_us"] < 1.2 * 1_049


def test_trimmed_packets_are_nacked_and_resent():
    result, network = run_small(trim_plane=1, trim_every=2)
    check_run(result, SMALL)
    assert network.trimmed > 0
    for side in "ab":
        counters = result["counters"][side]
        peer = "b" if side == "a" else "a"
        trims = result["counters"][peer]["responder_counters"]["trimmed"]
        assert trims > 0
        assert counters["requester_counters"]["nak_trimmed"] == trims
        assert counters["requester_counters"]["retransmissions"] >= trims


def test_wire_frames_decode_with_valid_icrc_and_match_the_scapy_builder():
    result, network = run_small()
    config = nic_config_for(SMALL)
    evs = evlib.generate(SPEC.profile, SMALL.evs)
    assert network.capture
    for _, _, _, frame in network.capture:
        assert pk.icrc_ok(frame)
        assert pk.BTH in Ether(frame)
    frames = data_frames(network, "a")
    assert len(frames) == sum(math.ceil(wr["length"] / config.mtu)
                              for wr in result["work"]["a"])
    placements = {index: evlib.header_fields(SPEC.profile.format,
                                             evlib.expand(SPEC.profile, ev))
                  for index, ev in enumerate(evs)}
    for plane, frame, packet in frames:
        # An independent build of the same packet: sim.packets from the EV definition (the
        # EV rides only in the UDP source port here: find its index from it).
        bth, meth, reth = packet[pk.BTH], packet[pk.METH], packet[pk.RETH]
        (index,) = [i for i, f in placements.items() if f["udp_sport"] == packet[UDP].sport]
        assert plane == index % SMALL.planes        # GENERATED: ports taken in turn
        payload = pk.transport_payload(packet)
        imm = packet[pk.ImmDt].imm if pk.ImmDt in packet else None
        qpn = bth.dqpn
        assert qpn < SMALL.qps and P.psn_diff(bth.psn, PSN_BASE + qpn) >= 0
        assert reth.rkey == rkey_of("b") and reth.va >= MR_BASE
        assert bth.ts == 1 and packet[pk.TSETH].ftype == P.Ftype.TIMESTAMP
        expected = pk.data_packet(bth.opcode, dqpn=qpn, psn=bth.psn, va=reth.va,
                                  rkey=reth.rkey, payload=payload, imm=imm, msn=meth.msn,
                                  rqmsn=meth.rqmsn, rtx=bool(bth.rtx),
                                  tseth={"tx_timestamp": packet[pk.TSETH].tx_timestamp,
                                         "ftype": P.Ftype.TIMESTAMP},
                                  ackreq=bth.ackreq, src=NIC_A, dst=NIC_B,
                                  udp_sport=placements[index]["udp_sport"], dscp=0, ecn=0b10,
                                  hop_limit=64)
        assert raw(expected) == frame
    # The payload is the posted bytes at the right offset of the message.
    by_va = {wr["remote_addr"]: wr for wr in make_work(SMALL)["a"]}
    firsts = [packet for _, _, packet in frames if packet[pk.BTH].opcode in P.FIRST_OPCODES]
    assert len(firsts) == len(by_va)
    for packet in firsts:
        wr = by_va[packet[pk.RETH].va]
        assert pk.transport_payload(packet) == wr["data"][:config.mtu]


def test_auto_baseline_sends_each_qp_on_one_ev():
    scn = SMALL.replace(baseline="ecmp", qps=3, bytes=30 * 1024)
    result, network = run_small(scn)
    check_run(result, scn)
    placements = {evlib.header_fields(SPEC.profile.format, evlib.expand(SPEC.profile, ev))[
        "udp_sport"]: index for index, ev in enumerate(evlib.generate(SPEC.profile, scn.evs))}
    for side in "ab":
        evs = {}
        for _, _, packet in data_frames(network, side):
            evs.setdefault(packet[pk.BTH].dqpn, set()).add(placements[packet[UDP].sport])
        assert set(evs) == set(range(scn.qps))
        assert evs == {qpn: {auto_index(qpn, scn.evs)} for qpn in range(scn.qps)}


@pytest.mark.skipif(default_network(SMALL).__class__ is DelayNetwork,
                    reason="sim.fabric is not available")
def test_a_run_through_the_fabric():
    scn = SMALL.replace(bytes=16 * 1024, fail_plane=1, fail_at_us=5.0, recover_at_us=None)
    network = default_network(scn)
    result = run_model(scn, network=network)
    check_run(result, scn)


# -- one NIC ----------------------------------------------------------------------------------

CONFIG = NicConfig(ports=2, qps=4, mpr_units=1, evs_per_profile=8, mtu=512)


def single_nic():
    nic = ModelNic(CONFIG, name="a")
    nic.set_local(mac=0x02000000000A, ip=0xFD00 << 112 | 0xA)
    nic.register_mr(slot=1, rkey=rkey_of("a"), pd=1, base=MR_BASE, length=1 << 16)
    nic.memory.add(SRC_BASE, 1 << 16)
    nic.memory.write(SRC_BASE, bytes(range(256)) * 256)
    nic.configure_acks(ack_every=4, ack_delay=128, nak_interval=1024)
    nic.ev_profile_online(0, SPEC.profile, num_evs=4, min_active=1)
    nic.connect_qp(1, ev_profile=0, remote_qpn=7, remote_mac=0x02000000000B,
                   remote_ip=0xFD00 << 112 | 0xB, psn=100, remote_psn=500, mpr=1, max_wimm=1,
                   pd=1)
    return nic


def drain(nic, until_ns):
    """``[(time_ns, plane, frame)]`` as the NIC hands frames over, up to ``until_ns``."""
    out = []
    while (t := nic.next_event_ns()) is not None and t <= until_ns:
        out += [(t, plane, frame) for plane, frame in nic.transmit(t)]
    return out


def test_frames_leave_back_to_back_at_the_engine_line_rate():
    nic = single_nic()
    count = 6
    nic.post({"qpn": 1, "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": 1, "local_addr": SRC_BASE,
              "remote_addr": 0x5000, "rkey": 0x99, "length": count * CONFIG.mtu}, 0.0)
    sent = drain(nic, 1e6)
    assert len(sent) == count
    lanes = CONFIG.data_width // 8
    cycles = math.ceil(len(sent[0][2]) / lanes)
    period = 1e9 / CONFIG.clock_hz
    assert all(len(frame) == len(sent[0][2]) for _, _, frame in sent[:-1])
    assert [t for t, _, _ in sent[:-1]] == [(n + 1) * cycles * period
                                            for n in range(count - 1)]
    assert sent[-1][0] == sent[-2][0] + math.ceil(len(sent[-1][2]) / lanes) * period
    assert [plane for _, plane, _ in sent] == [n % CONFIG.ports for n in range(count)]


def test_an_ack_goes_before_queued_data():
    nic = single_nic()
    nic.post({"qpn": 1, "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": 1, "local_addr": SRC_BASE,
              "remote_addr": 0x5000, "rkey": 0x99, "length": 4 * CONFIG.mtu}, 0.0)
    first = drain(nic, 100.0)          # the engine is inside the first data frame
    assert first == []
    incoming = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=500, va=MR_BASE,
                              rkey=rkey_of("a"), payload=b"x" * 64, ackreq=1, src=NIC_B,
                              dst=NIC_A)
    nic.receive(1, raw(incoming), 100.0)
    sent = drain(nic, 1e6)
    kinds = [Ether(frame)[pk.BTH].opcode for _, _, frame in sent]
    assert kinds[1] == P.Opcode.RELIABILITY_SACK and kinds.count(P.Opcode.RELIABILITY_SACK) == 1
    ack = Ether(sent[1][2])
    assert sent[1][1] == 1 and ack[pk.BTH].dqpn == 7 and ack[pk.SETH].cack_psn == 500
    assert nic.memory.read(MR_BASE, 64) == b"x" * 64


def test_bad_frames_are_dropped_and_counted():
    nic = single_nic()
    good = raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=1, psn=500, va=MR_BASE,
                              rkey=rkey_of("a"), payload=b"y" * 32, src=NIC_B, dst=NIC_A))
    corrupted = good[:-10] + bytes([good[-10] ^ 1]) + good[-9:]
    not_roce = raw(Ether() / IPv6() / UDP(dport=53) / b"hello")
    not_ip = good[:12] + b"\x08\x06" + good[14:]
    unknown_qp = raw(pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=3, psn=0, va=MR_BASE,
                                    rkey=rkey_of("a"), payload=b"z", src=NIC_B, dst=NIC_A))
    for t, frame in enumerate((corrupted, good[:40], good[:-3], not_roce, not_ip, unknown_qp)):
        nic.receive(0, frame, 10.0 * (t + 1))
    rx = {name: value for name, value in nic.counters["rx_counters"].items() if value}
    assert rx == {"bad_icrc": 1, "runt": 1, "bad_ip_length": 1, "bad_udp_port": 1,
                  "bad_ethertype": 1, "none": 1}
    assert nic.counters["responder_counters"]["bad_state"] == 1     # QP 3 never connected
    assert nic.memory.read(MR_BASE, 32) == bytes(32)
    sent = drain(nic, 1e6)
    naks = [Ether(f) for _, _, f in sent]
    assert len(naks) == 1 and naks[0][pk.AETH].syndrome >> 5 == 3


def test_ack_settings_out_of_range_are_refused_with_the_field_named():
    from sim.driver.core import DriverError
    nic = ModelNic(CONFIG, name="a")
    with pytest.raises(DriverError, match="gap_depth") as bad_depth:
        nic.configure_acks(gap_depth=16)
    assert bad_depth.value.errno == P.Errno.EINVAL
    with pytest.raises(DriverError, match="ack_every"):
        nic.configure_acks(ack_every=0)
    nic.configure_acks(coalesce_gaps=True, gap_depth=15)
    assert nic.responder.gap_depth == 15 and nic.responder.coalesce_gaps
