"""The fuzzer's bench: two RTL NICs over the fabric, legitimate traffic both ways, and a
hostile source injecting forged frames into NIC b (data, probes) and NIC a (acknowledgements).

Runs the job in the file ``FUZZ_JOB`` (JSON from :func:`sim.fuzz.run_fuzz`) on the C++ stream
agents of :mod:`sim.tb.dpi` and writes its raw result to the job's ``result`` file;
:mod:`sim.fuzz` makes the report. What it checks, and the bounds it uses, are in ``docs/fuzz.md``:

* every placed packet (the agents' placement log) lies inside a registered MR whose rkey the
  packet carried, of the PD of the QP it named (the fuzzer's payloads say which: their
  signature, :mod:`sim.mutants`), or, for legitimate data, inside the legitimate MR;
* the QP invariants, read over the register bus (QP_READ) every ``check_cycles`` and at the
  end: a live QP's responder expected PSN never moves backwards nor beyond what its peer
  sent, every requester has ``una <= next`` and ``next - una`` within its window, live QPs
  stay out of ERROR, no completion names a QP that is not connected;
* no receive port or fetch stream holds a beat for ``stall_cycles``, and live work requests
  never go ``progress_cycles`` without a completion while some are outstanding;
* every legitimate work request completes with SUCCESS, in order, its target memory equal
  byte for byte, and every immediate arrives in order.
"""

import dataclasses
import json
import math
import os
import random
import time
from collections import deque
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hdl import protocol as P
from hdl.control.nicmap import nic_register_map
from hdl.interfaces import completion_layout, work_request_layout
from hdl.transport.req_defs import RequesterCommand
from hdl.transport.resp_defs import ResponderCommand
from sim import fuzz as F
from sim import mutants as M
from sim.defaults import NIC_A, NIC_B, default_profile_spec, ip_int, mac_int
from sim.driver.nic import NicDriver
from sim.fabric import Fabric
from sim.scenario import PROBE_INTERVAL_US, Scenario, nic_config_for
from sim.tb.dpi import DpiAgents, DpiBus
from sim.tb.streams import pack, unpack
from sim.workload import fabric_config_for

JOB = json.loads(Path(os.environ["FUZZ_JOB"]).read_text()) if "FUZZ_JOB" in os.environ else {}
SCENARIO = Scenario.from_dict(JOB.get("scenario", {}))
CONFIG = nic_config_for(SCENARIO)
PERIOD_NS = 1e9 / CONFIG.clock_hz
WINDOW = CONFIG.mpr_units * 128
TICK = 256                  # cycles between the bench's own wakes (pacing, posting, checks)
POLL_CYCLES = 500           # EV events and QP errors
BACKLOG_LIMIT = 4096        # beats queued at a NIC's receive ports above which injection waits
HISTORY = 256               # hostile frames kept for a failure's vector
REPLAY_WARMUP = 5000        # cycles of live traffic before a vector's first frame


def _qp_read_responder(data):
    return {"state": data & 0xFF, "expected": (data >> 8) & M.PSN_MASK,
            "msn": (data >> 32) & M.PSN_MASK}


def _qp_read_requester(data):
    return {"state": data & 0xFF, "next": (data >> 8) & M.PSN_MASK,
            "una": (data >> 32) & M.PSN_MASK}


class Stream:
    """The work one requester QP posts: WRs in order, their PSNs, what is outstanding."""

    def __init__(self, side, peer, qpn, psn, *, victim):
        self.side, self.peer, self.qpn = side, peer, qpn
        self.victim = victim
        self.base = psn
        self.next_psn = psn             # PSN of the next packet a posted WR will take
        self.acked_end = psn            # every PSN below it acknowledged (WR completions)
        self.outstanding = deque()
        self.posted = self.completed = 0
        self.dead = False               # a victim whose QP went to ERROR, waiting to re-arm
        self.epoch = 0

    def restart(self, psn):
        self.base = self.next_psn = self.acked_end = psn
        self.outstanding.clear()
        self.dead = False
        self.epoch += 1


class Bench:
    def __init__(self, dut):
        self.dut = dut
        self.rng = random.Random(f"mrc-fuzz-bench/{JOB['seed']}")
        self.dpi = DpiAgents(CONFIG, first_step_edge=1 << 62, backlog_cycles=0)
        self.dpi.set_place_log(True)
        self.dpi.set_stall_bound(JOB["stall_cycles"])
        self.start = None
        self.zero_ps = None
        self.fabric = None
        self.source = None
        self.drivers = {}
        self.wr_layout = work_request_layout(CONFIG)
        self.cq_layout = completion_layout(CONFIG)
        self.streams = {"a": {}, "b": {}}
        self.expected_imm = {"a": {}, "b": {}}      # responder side -> qpn -> deque of imm
        self.mrs = {"a": {}, "b": {}}               # rkey -> (base, length, pd)
        self.qp_pd = {q: F.LEGIT_PD for q in F.LEGIT_QPS}
        self.qp_pd.update({q: F.VICTIM_PD for q in F.VICTIM_QPS})
        # results
        self.hangs = []
        self.outside = []
        self.outside_bytes = 0
        self.state_errors = []
        self.legit_errors = []
        self.legit = {"wrs_posted": 0, "wrs_verified": 0, "bytes_verified": 0,
                      "immediates": 0}
        self.victim = {"wrs_posted": 0, "completions": 0, "error_completions": 0,
                       "rearms": 0, "placed_bytes": 0}
        self.placed = {"a": 0, "b": 0}
        self.history = deque(maxlen=HISTORY)
        self.failures = []
        self.last_progress = 0
        self.responder_seen = {}
        self.rearming = set()
        self.done = False
        self.stopping = False
        self.qp_errors = {"a": [], "b": []}
        self.ev_events = []

    # -- time ---------------------------------------------------------------------------------

    @property
    def cycle(self):
        """The agents' cycle count at this point of the simulation."""
        return math.ceil((get_sim_time("ps") - self.zero_ps) / (PERIOD_NS * 1000) - 1e-9)

    def ns_at(self, cycle):
        return 0.0 if self.start is None else (cycle - self.start) * PERIOD_NS

    def until(self, cycle):
        target = self.zero_ps + round((cycle - 0.5) * PERIOD_NS * 1000)
        return Timer(max(1, target - get_sim_time("ps")), unit="ps")

    async def edges(self, count):
        await self.until(self.cycle + count)
        await RisingEdge(self.dut.clk)

    # -- failures -----------------------------------------------------------------------------

    def failure(self, kind, detail):
        """Record a failure and, for the first few, the hostile frames that led to it."""
        record = {"kind": kind, "cycle": self.cycle - (self.start or 0), **detail}
        if len(self.failures) < 8:
            cocotb.log.warning(f"fuzz: {kind} at cycle {record['cycle']}: "
                               f"{ {k: v for k, v in detail.items() if k != 'head'} }")
            injected = self.source.injected if self.source is not None else 0
            self.failures.append({**record, "packets": injected, "frames": list(self.history)})
        return record

    # -- memory -------------------------------------------------------------------------------

    def add_mr(self, side, slot, rkey, pd, base, length):
        self.dpi.add_region("ab".index(side), base, length)
        self.mrs[side][rkey] = (base, length, pd)
        return self.drivers[side].register_mr(slot=slot, rkey=rkey, pd=pd, base=base,
                                              length=length)

    def check_placement(self, side, lo, hi, nbytes, outside, head):
        """A placed packet must lie in an MR it may write (see the module docstring)."""
        if nbytes == 0:
            return
        self.placed[side] += nbytes
        sig = M.read_signature(head)
        if sig is None:
            base, length, _ = self.mrs[side][F.legit_rkey(side)]
            allowed = base <= lo and hi <= base + length and not outside
            why = "legitimate data outside the legitimate MR"
        else:
            rkey, qpn = sig
            mr = self.mrs[side].get(rkey)
            allowed = (mr is not None and not outside and mr[0] <= lo and hi <= mr[0] + mr[1]
                       and mr[2] == self.qp_pd.get(qpn))
            why = f"a payload carrying rkey {rkey:#x} for QP {qpn} outside that MR or PD"
            if allowed and qpn in F.VICTIM_QPS:
                self.victim["placed_bytes"] += nbytes
            if qpn in F.LEGIT_QPS:
                # The fuzzer forges live-QP data only where no window can take it.
                self.state_errors.append(self.failure("state_error", {
                    "nic": side, "qpn": qpn, "lo": lo, "bytes": nbytes,
                    "what": "a forged packet for a live QP was placed"}))
        if not allowed:
            self.outside_bytes += nbytes
            if len(self.outside) < 32:
                self.outside.append(self.failure("write_outside_regions", {
                    "nic": side, "lo": lo, "hi": hi, "bytes": nbytes,
                    "outside_host_memory": outside, "head": head.hex(), "why": why}))

    # -- traffic ------------------------------------------------------------------------------

    def post(self, stream):
        """Post one WR on ``stream`` (its data written into the source ring first)."""
        rng = self.rng
        mtu = CONFIG.mtu
        side, peer = stream.side, stream.peer
        if stream.victim:
            length = 16 * rng.randrange(1, 2 * mtu // 16 + 1)
            rkey = F.VICTIM_RKEY
            offset = 16 * rng.randrange((F.VICTIM_MR_BYTES - length) // 16 + 1)
            remote = F.VICTIM_MR + offset
            data = M.fill(rkey, stream.qpn, length)
            local = F.SRC_BASE + F.victim_src_offset(stream.qpn)
            opcode = P.WrOpcode.RDMA_WRITE
            imm = 0
        else:
            length = rng.choice((0, rng.randrange(1, mtu + 1), rng.randrange(mtu, 4 * mtu + 1),
                                 rng.randrange(1, 4 * mtu + 1)))
            slot = stream.posted % F.RING
            offset = F.legit_offset(stream.qpn, slot)
            remote, local = F.legit_mr(peer) + offset, F.SRC_BASE + offset
            rkey = F.legit_rkey(peer)
            data = rng.randbytes(length)
            immediate = rng.random() < 0.5
            opcode = P.WrOpcode.RDMA_WRITE_WITH_IMM if immediate else P.WrOpcode.RDMA_WRITE
            imm = rng.getrandbits(32) if immediate else 0
            if immediate:
                self.expected_imm[peer].setdefault(stream.qpn, deque()).append(imm)
        if length:
            self.dpi.write("ab".index(side), local, data)
        packets = max(1, -(-length // mtu))
        wr_id = (ord(side) << 56) | (stream.qpn << 40) | (stream.epoch << 32) | stream.posted
        wr = {"qpn": stream.qpn, "opcode": opcode, "wr_id": wr_id, "local_addr": local,
              "remote_addr": remote, "rkey": rkey, "length": length, "imm": imm}
        stream.outstanding.append({**wr, "data": data, "psn": stream.next_psn,
                                   "packets": packets})
        stream.next_psn = M.psn_add(stream.next_psn, packets)
        stream.posted += 1
        if stream.victim:
            self.victim["wrs_posted"] += 1
        else:
            self.legit["wrs_posted"] += 1
        self.dpi.send_beats(f"{side}_wr", [pack(self.wr_layout, wr)])

    def top_up(self):
        """Keep every live stream at its outstanding WRs (none once stopping), and the
        victims' traffic going."""
        for side in "ab":
            for stream in self.streams[side].values():
                if stream.victim:
                    while not stream.dead and len(stream.outstanding) < 2 and not self.stopping:
                        self.post(stream)
                    continue
                # A live QP that failed posts no more: its errors are in the report.
                while len(stream.outstanding) < F.OUTSTANDING and not self.stopping \
                        and not stream.dead:
                    self.post(stream)
        self.update_view()

    def legit_error(self, text, **detail):
        if len(self.legit_errors) < 32:
            self.legit_errors.append({"what": text, **detail})

    def completion(self, side, bits, cycle):
        c = unpack(self.cq_layout, bits)
        qpn = c["qpn"]
        if c["side"] == 1:      # responder: a WRITE WITH IMMEDIATE arrived
            if qpn in F.VICTIM_QPS:
                return
            if qpn not in F.LEGIT_QPS:
                self.state_errors.append(self.failure("state_error", {
                    "nic": side, "qpn": qpn,
                    "what": "a responder completion for a QP that is not connected"}))
                return
            queue = self.expected_imm[side].get(qpn)
            if not queue:
                self.legit_error("an immediate nobody sent", nic=side, qpn=qpn, imm=c["imm"])
            else:
                want = queue.popleft()
                if c["imm"] != want or not c["imm_valid"]:
                    self.legit_error("immediate out of order or wrong", nic=side, qpn=qpn,
                                     got=c["imm"], want=want)
                else:
                    self.legit["immediates"] += 1
            self.last_progress = cycle
            return
        stream = self.streams[side].get(qpn)
        if stream is None:
            self.state_errors.append(self.failure("state_error", {
                "nic": side, "qpn": qpn,
                "what": "a requester completion for a QP that posted nothing"}))
            return
        if not stream.outstanding or stream.outstanding[0]["wr_id"] != c["wr_id"]:
            if stream.victim:
                # Completions of an earlier epoch (before a re-arm) may still be in flight.
                return
            self.legit_error("requester completion out of order", nic=side, qpn=qpn,
                             wr_id=c["wr_id"])
            return
        wr = stream.outstanding.popleft()
        stream.completed += 1
        ok = c["status"] == P.CompletionStatus.SUCCESS
        if ok:
            stream.acked_end = M.psn_add(wr["psn"], wr["packets"])
        if stream.victim:
            self.victim["completions"] += 1
            if not ok:
                self.victim["error_completions"] += 1
                stream.dead = True
            return
        self.last_progress = cycle
        if not ok:
            stream.dead = True
            self.legit_error("legitimate WR completed with an error", nic=side, qpn=qpn,
                             wr_id=wr["wr_id"], status=P.CompletionStatus(c["status"]).name)
            return
        got = self.dpi.read("ab".index(stream.peer), wr["remote_addr"], wr["length"])
        if got != wr["data"]:
            bad = next(i for i in range(len(got)) if got[i] != wr["data"][i])
            self.legit_error("target memory differs", nic=side, qpn=qpn, wr_id=wr["wr_id"],
                             first_bad_offset=bad)
            return
        self.legit["wrs_verified"] += 1
        self.legit["bytes_verified"] += wr["length"]

    # -- the mutator's view -------------------------------------------------------------------

    def update_view(self):
        for view, stream in self.view_of:
            view.acked_end = stream.acked_end
            view.posted_end = stream.next_psn
        # Legitimate frames become replayable once their PSNs are acknowledged.
        for qpn, pending in self.pending_data.items():
            acked = self.streams["a"][qpn].acked_end
            while pending and M.psn_diff(pending[0][0], acked) < 0:
                self.view.data_frames.append(pending.popleft()[1])
        for qpn, pending in self.pending_acks.items():
            acked = self.streams["a"][qpn].acked_end
            while pending and M.psn_diff(pending[0][0], acked) < 0:
                self.view.ack_frames.append(pending.popleft()[1])

    def observe(self, src, frame):
        """Keep some legitimate frames of the live QPs for replay (every fourth)."""
        self.observed += 1
        if self.observed % 4:
            return
        kit = self.mutator.to_b
        if len(frame) < kit.bth_at + 12:
            return
        opcode = frame[kit.bth_at]
        bth = kit.bth(frame)
        if bth["dqpn"] not in F.LEGIT_QPS:
            return
        if src == "a" and opcode in P.DATA_OPCODES:
            self.pending_data[bth["dqpn"]].append((bth["psn"], frame))
        elif src == "b" and opcode == P.Opcode.RELIABILITY_SACK:
            seth = kit.header(frame, M.L.SETH)
            if seth["m"] == P.SackMark.NONE:
                self.pending_acks[bth["dqpn"]].append((seth["cack_psn"], frame))
        elif src == "b" and opcode == P.Opcode.RELIABILITY_NACK:
            self.pending_acks[bth["dqpn"]].append((bth["psn"], frame))

    # -- the agents' news ---------------------------------------------------------------------

    def hand_over(self):
        for arrival_ps, serial, dst, plane, frame in self.fabric.take_in_flight():
            cycle = self.start + max(0, math.ceil(arrival_ps / (PERIOD_NS * 1000)) - 1)
            while not (self.ns_at(cycle) >= arrival_ps / 1000
                       and arrival_ps <= round(self.ns_at(cycle) * 1000)):
                cycle += 1
            self.dpi.deliver(self.dpi.rx[dst][plane], cycle, arrival_ps, serial, frame)

    def service(self):
        completed = False
        for event in self.dpi.drain():
            kind = event[0]
            if kind == "frame":
                _, cycle, src, port, frame = event
                self.fabric.send(src, port, frame, self.ns_at(cycle))
                self.observe(src, frame)
            elif kind == "completion":
                _, cycle, side, bits = event
                self.completion(side, bits, cycle)
                completed = True
            elif kind == "placement":
                _, cycle, side, lo, hi, nbytes, outside, head = event
                self.check_placement(side, lo, hi, nbytes, outside, head)
            elif kind == "stall":
                _, cycle, stream = event
                self.hangs.append(self.failure("hang", {
                    "what": f"{stream} held a beat for {JOB['stall_cycles']} cycles"}))
        if completed:
            self.top_up()
        self.hand_over()

    # -- bring-up -----------------------------------------------------------------------------

    async def connect(self, side, qpn, psn, remote_psn, *, victim):
        peer = "b" if side == "a" else "a"
        endpoint = NIC_A if peer == "a" else NIC_B
        extra = ({"timeout": F.VICTIM_TIMEOUT, "retry_linear": F.VICTIM_RETRIES,
                  "retry_exponential": 0} if victim else
                 {"timeout": SCENARIO.timeout, "retry_linear": SCENARIO.retry_linear,
                  "retry_exponential": SCENARIO.retry_exponential})
        await self.drivers[side].connect_qp(
            qpn, ev_profile=0, ev_offset=qpn, remote_qpn=qpn,
            remote_mac=mac_int(endpoint.mac), remote_ip=ip_int(endpoint, CONFIG.ip_version),
            psn=psn, remote_psn=remote_psn, mpr=CONFIG.mpr_units,
            max_wimm=min(4, CONFIG.max_wimm), pd=F.VICTIM_PD if victim else F.LEGIT_PD,
            **extra)

    async def bring_up(self, side, profile):
        """Addresses, the MRs (legitimate, victim, foreign), ACK and requester settings, the
        EV profile, and the QPs of :mod:`sim.fuzz`'s plan: live and victim QPs connected,
        wrong-state QPs left in INIT (the rest stay in RESET)."""
        d = self.drivers[side]
        endpoint = NIC_A if side == "a" else NIC_B
        await d.set_local(mac=mac_int(endpoint.mac), ip=ip_int(endpoint, CONFIG.ip_version))
        self.dpi.add_region("ab".index(side), F.SRC_BASE, F.SRC_BYTES)
        await self.add_mr(side, F.legit_slot(side), F.legit_rkey(side), F.LEGIT_PD,
                          F.legit_mr(side), F.LEGIT_MR_BYTES)
        await self.add_mr(side, F.VICTIM_SLOT, F.VICTIM_RKEY, F.VICTIM_PD, F.VICTIM_MR,
                          F.VICTIM_MR_BYTES)
        await self.add_mr(side, F.FOREIGN_SLOT, F.FOREIGN_RKEY, F.FOREIGN_PD, F.FOREIGN_MR,
                          F.FOREIGN_MR_BYTES)
        s = SCENARIO
        await d.configure_acks(ack_every=s.ack_every, ack_delay=s.ack_delay, nak_interval=1024,
                               coalesce_gaps=bool(s.coalesce_gaps), gap_depth=s.gap_depth)
        await d.configure_requester(infer_k=s.infer_k, cc=bool(s.cc), reo_wnd=s.reo_wnd,
                                    cc_nscc=s.cc_algorithm == "nscc")
        await d.set_port_watch(s.port_wnd, s.port_quiet)
        await d.ev_profile_online(0, profile, num_evs=s.evs, min_active=2, fate=bool(s.fate))
        for qpn in F.VICTIM_QPS + F.LEGIT_QPS:
            psn = F.first_psn(qpn)
            await self.connect(side, qpn, psn, psn, victim=qpn in F.VICTIM_QPS)
        for qpn in F.INIT_QPS:
            await d.modify_qp(qpn, P.QpState.INIT, ev_profile=0, ev_offset=qpn)

    async def rearm(self, stream):
        """A victim QP pair back to RTS on fresh PSNs, once its ERROR flush completed."""
        psn = self.rng.getrandbits(24)
        q = stream.qpn
        self.rearming.add(q)
        for side in (stream.side, stream.peer):
            await self.drivers[side].modify_qp(q, P.QpState.RESET)
            await self.connect(side, q, psn, psn, victim=True)
        stream.restart(psn)
        self.rearming.discard(q)
        self.victim["rearms"] += 1

    # -- control and checks -------------------------------------------------------------------

    async def control(self):
        """The NICs' software: EV events (probing ASSUMED_BAD EVs through a live QP), QP
        errors (a live QP's is a state error; a victim is re-armed after its flush)."""
        assumed_bad = {"a": set(), "b": set()}
        last_probe = {"a": 0.0, "b": 0.0}
        probe_id = 0
        while not self.done:
            await self.edges(POLL_CYCLES)
            for side in "ab":
                d = self.drivers[side]
                for event in await d.poll_ev_events():
                    state = P.EvState(event["state"])
                    self.ev_events.append(state.name)
                    if state == P.EvState.ASSUMED_BAD:
                        assumed_bad[side].add(event["index"])
                    elif state == P.EvState.GOOD:
                        assumed_bad[side].discard(event["index"])
                now_us = self.ns_at(self.cycle) / 1000
                if assumed_bad[side] and now_us - last_probe[side] >= PROBE_INTERVAL_US:
                    last_probe[side] = now_us
                    for index in sorted(assumed_bad[side]):
                        probe_id += 1
                        await d.send_probe(qpn=F.LEGIT_QPS[0], ev=index, probe_id=probe_id)
                    await d.poll_probe_results()
                for entry in await d.qp_errors():
                    self.qp_errors[side].append(entry)
                    if entry["qpn"] in F.LEGIT_QPS:
                        self.state_errors.append(self.failure("state_error", {
                            "nic": side, "qpn": entry["qpn"],
                            "what": f"live QP moved to ERROR ("
                                    f"{P.CompletionStatus(entry['status']).name})"}))
                    elif entry["qpn"] in self.streams[side]:
                        self.streams[side][entry["qpn"]].dead = True
            for stream in self.streams["a"].values():
                if stream.victim and stream.dead and not stream.outstanding:
                    await self.rearm(stream)
                    self.top_up()

    async def check_qps(self):
        """QP_READ of every connected and wrong-state QP on both NICs (the invariants of the
        module docstring)."""
        for side in "ab":
            d = self.drivers[side]
            peer = "b" if side == "a" else "a"
            for qpn in F.VICTIM_QPS + F.LEGIT_QPS + F.INIT_QPS:
                live = qpn in F.LEGIT_QPS
                if qpn in self.rearming:
                    continue
                epoch = self.streams["a"][qpn].epoch if qpn in F.VICTIM_QPS else 0
                own = self.streams[side].get(qpn)
                # Completions seen before the read: una had passed them when it was read
                # (those handled while the read is on the bus may be later than it).
                completed = own.acked_end if own is not None else None
                resp = _qp_read_responder((await d.command(
                    "responder", cmd=ResponderCommand.QP_READ, qpn=qpn))["data"])
                req = _qp_read_requester((await d.command(
                    "requester", cmd=RequesterCommand.QP_READ, qpn=qpn, page=0))["data"])
                problems = []
                if qpn in F.INIT_QPS:
                    if resp["state"] != P.QpState.INIT or req["state"] != P.QpState.INIT:
                        problems.append(f"a QP left in INIT is now responder "
                                        f"{resp['state']}, requester {req['state']}")
                else:
                    in_flight = M.psn_diff(req["next"], req["una"])
                    if not 0 <= in_flight <= WINDOW:
                        problems.append(f"requester next {req['next']:#x} - una "
                                        f"{req['una']:#x} = {in_flight}, not 0 to {WINDOW}")
                    if own is not None and req["state"] == P.QpState.RTS and \
                            M.psn_diff(own.next_psn, req["next"]) < 0:
                        problems.append(f"requester next {req['next']:#x} beyond every PSN "
                                        f"posted ({own.next_psn:#x})")
                    sender = self.streams[peer].get(qpn)
                    key = (side, qpn, epoch)
                    seen = self.responder_seen.get(key)
                    if seen is not None and M.psn_diff(resp["expected"], seen) < 0 \
                            and qpn not in self.rearming:
                        problems.append(f"responder expected PSN moved backwards, "
                                        f"{seen:#x} to {resp['expected']:#x}")
                    # (A victim's responder takes forged PSNs its peer never sent.)
                    if live and M.psn_diff(sender.next_psn, resp["expected"]) < 0:
                        problems.append(f"responder expected PSN {resp['expected']:#x} beyond "
                                        f"every PSN its peer posted ({sender.next_psn:#x})")
                    self.responder_seen[key] = resp["expected"]
                    if live:
                        if req["state"] != P.QpState.RTS or resp["state"] != P.QpState.RTS:
                            problems.append(f"live QP not in RTS: responder {resp['state']}, "
                                            f"requester {req['state']}")
                        if own is not None and M.psn_diff(req["una"], completed) < 0:
                            problems.append(f"requester una {req['una']:#x} behind PSNs "
                                            f"already completed ({completed:#x})")
                for text in problems:
                    self.state_errors.append(self.failure("state_error", {
                        "nic": side, "qpn": qpn, "what": text}))


@cocotb.test()
async def fuzz_run(dut):
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    dut.rst.value = 1
    bench = Bench(dut)
    dpi = bench.dpi
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    bench.zero_ps = get_sim_time("ps")
    dpi.set_first_step_edge(dpi.edge + 2)
    for side in "ab":
        bench.drivers[side] = NicDriver(nic_register_map(CONFIG), DpiBus(dut, dpi, "ab".index(side),
                                                                         dut.clk), CONFIG)
    spec = default_profile_spec()
    for side in "ab":
        await bench.bring_up(side, spec.profile)
    cocotb.log.info(f"both NICs up after {bench.cycle} cycles")

    # The live and victim streams, and the mutator's view of them.
    for side in "ab":
        peer = "b" if side == "a" else "a"
        for qpn in F.LEGIT_QPS:
            bench.streams[side][qpn] = Stream(side, peer, qpn, F.first_psn(qpn), victim=False)
    for qpn in F.VICTIM_QPS:
        bench.streams["a"][qpn] = Stream("a", "b", qpn, F.first_psn(qpn), victim=True)
    view = M.View(
        legit=[M.QpView(q, q, F.legit_rkey("b"), F.legit_mr("b"), F.LEGIT_MR_BYTES,
                        window=WINDOW) for q in F.LEGIT_QPS],
        victims=[M.QpView(q, q, F.VICTIM_RKEY, F.VICTIM_MR, F.VICTIM_MR_BYTES, window=WINDOW)
                 for q in F.VICTIM_QPS],
        wrong_state=F.INIT_QPS + F.reset_qps(CONFIG.qps), qps=CONFIG.qps,
        qpn_bits=CONFIG.qpn_bits, mtu=CONFIG.mtu, foreign_rkeys=F.FOREIGN_RKEYS,
        legit_rkey=F.legit_rkey("b"))
    bench.view = view
    bench.view_of = [(v, bench.streams["a"][v.qpn]) for v in view.legit + view.victims]
    bench.pending_data = {q: deque(maxlen=64) for q in F.LEGIT_QPS}
    bench.pending_acks = {q: deque(maxlen=64) for q in F.LEGIT_QPS}
    bench.observed = 0
    bench.mutator = M.Mutator(view, seed=JOB["seed"], ip_version=CONFIG.ip_version,
                              trim_dscp=CONFIG.trim_dscp)
    if JOB.get("replay"):
        source = F.ReplaySource(JOB["replay"], planes=CONFIG.ports, period_ns=PERIOD_NS,
                                warmup_ns=REPLAY_WARMUP * PERIOD_NS, history=bench.history,
                                cycle_of=lambda ns: round(ns / PERIOD_NS))
        for frame in JOB["replay"]:
            bench.mutator.counts[frame["mutant"]] = bench.mutator.counts.get(
                frame["mutant"], 0) + 1
    else:
        source = F.HostileSource(
            bench.mutator, total=JOB["packets"], load=JOB["load"], planes=CONFIG.ports,
            period_ns=PERIOD_NS, seed=JOB["seed"], history=bench.history,
            cycle_of=lambda ns: round(ns / PERIOD_NS))
    bench.source = source
    fabric_config = fabric_config_for(SCENARIO, CONFIG)
    bench.fabric = Fabric(dataclasses.replace(fabric_config, capture=False), hostile=source)

    counters0 = {side: await bench.drivers[side].counters() for side in "ab"}
    bench.start = bench.cycle - 1
    dpi.set_start(bench.start)
    bench.last_progress = bench.start

    async def pump():
        change = dut.attention.value_change
        while True:
            await change
            bench.service()
    cocotb.start_soon(pump())
    cocotb.start_soon(bench.control())

    profiler = None
    if os.environ.get("MRC_PROFILE", "") not in ("", "0"):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    wall0 = time.monotonic()
    bench.top_up()
    next_check = bench.start + JOB["check_cycles"]
    next_report = time.monotonic() + 10.0
    end_reason = None
    while True:
        await bench.edges(TICK)
        cycle = bench.cycle
        bench.service()
        backlog = sum(dpi.queued(f"b_rx__{p}") for p in range(CONFIG.ports))
        backlog += sum(dpi.queued(f"a_rx__{p}") for p in range(CONFIG.ports))
        source.paused = backlog > BACKLOG_LIMIT
        bench.update_view()
        bench.fabric.run_hostile(bench.ns_at(cycle))
        bench.hand_over()
        if cycle >= next_check:
            next_check = cycle + JOB["check_cycles"]
            await bench.check_qps()
        if time.monotonic() >= next_report:
            next_report = time.monotonic() + 10.0
            elapsed = time.monotonic() - wall0
            cocotb.log.info(
                f"fuzz: {source.injected}/{JOB['packets']} packets, {cycle - bench.start} "
                f"cycles, live WRs verified {bench.legit['wrs_verified']}, hangs "
                f"{len(bench.hangs)}, outside {bench.outside_bytes} B, state errors "
                f"{len(bench.state_errors)}, {source.injected / max(elapsed, 1e-9):,.0f} "
                f"packets/s")
        outstanding = any(s.outstanding for side in "ab" for s in bench.streams[side].values()
                          if not s.victim)
        if outstanding and cycle - bench.last_progress >= JOB["progress_cycles"]:
            bench.hangs.append(bench.failure("hang", {
                "what": f"no live completion for {JOB['progress_cycles']} cycles with live "
                        f"WRs outstanding"}))
            end_reason = "no progress"
            break
        if source.injected >= JOB["packets"] and not bench.stopping:
            bench.stopping = True
            bench.last_progress = max(bench.last_progress, cycle)
        if bench.stopping and not outstanding:
            end_reason = "done"
            break
        if cycle - bench.start >= JOB["max_cycles"]:
            bench.hangs.append(bench.failure("hang", {
                "what": f"the run reached its limit of {JOB['max_cycles']} cycles"}))
            end_reason = "cycle limit"
            break
    cycles = bench.cycle - bench.start
    wall_s = time.monotonic() - wall0
    if profiler is not None:
        import pstats
        profiler.disable()
        with open(os.environ["MRC_PROFILE"], "w") as file:
            file.write(f"{cycles} cycles in {wall_s:.2f} s\n")
            pstats.Stats(profiler, stream=file).sort_stats("tottime").print_stats(40)
    # Let the last frames and completions land, then read everything once more.
    await bench.edges(2 * POLL_CYCLES)
    bench.service()
    await bench.check_qps()
    bench.done = True
    await bench.edges(2 * POLL_CYCLES)
    bench.service()
    counters = {side: await bench.drivers[side].counters() for side in "ab"}
    for side in "ab":
        for entry in await bench.drivers[side].qp_errors():
            bench.qp_errors[side].append(entry)
            if entry["qpn"] in F.LEGIT_QPS:
                bench.state_errors.append(bench.failure("state_error", {
                    "nic": side, "qpn": entry["qpn"], "what": "live QP moved to ERROR"}))
    for side in "ab":
        for qpn, queue in bench.expected_imm[side].items():
            if queue:
                bench.legit_error("immediates never completed", nic=side, qpn=qpn,
                                  missing=len(queue))
    max_stall = {prefix: dpi.max_stall(prefix) for prefix in
                 [f"{n}_rx__{p}" for n in "ab" for p in range(CONFIG.ports)]
                 + ["a_fetch", "b_fetch", "a_wr", "b_wr"]}
    result = {
        "end": end_reason, "packets": source.injected, "mutants": bench.mutator.counts,
        "cycles": cycles, "sim_us": cycles * PERIOD_NS / 1000, "wall_s": wall_s,
        "counters_before": counters0, "counters": counters,
        "hangs": bench.hangs, "outside": bench.outside, "outside_bytes": bench.outside_bytes,
        "state_errors": bench.state_errors, "legit": bench.legit,
        "legit_errors": bench.legit_errors, "victim": bench.victim,
        "placed_bytes": bench.placed, "qp_errors": bench.qp_errors,
        "ev_events": len(bench.ev_events), "max_stall_cycles": max_stall,
        "failures": bench.failures,
    }
    Path(JOB["result"]).write_text(json.dumps(result, default=str))
    cocotb.log.info(f"fuzz done ({end_reason}): {source.injected} packets in {cycles} cycles, "
                    f"wall {wall_s:.1f} s")
