"""The traffic of a scenario, shared by the RTL bench and the model backend: one definition
of which work requests each NIC posts, with which bytes."""

import random

from hdl import protocol as P

__all__ = ["make_work", "fabric_config_for"]


def make_work(scenario, side, peer_rkey, src_base, dst_base):
    """Work requests NIC ``side`` ("a" or "b") posts: ``scenario.bytes`` of payload cut into
    messages of ``msg_size`` (the last one shorter), QPs round robin, RDMA WRITE and WRITE WITH
    IMMEDIATE alternating. Each dict has the :func:`~hdl.interfaces.work_request_layout` fields
    plus ``data`` (the payload bytes, seeded by ``scenario.seed`` and the side)."""
    rng = random.Random(f"{scenario.seed}-{side}")
    size = scenario.msg_size or scenario.bytes
    work = []
    offset = 0
    index = 0
    while offset < scenario.bytes:
        length = min(size, scenario.bytes - offset)
        imm = index % 2 == 1
        work.append({
            "qpn": index % scenario.qps,
            "opcode": P.WrOpcode.RDMA_WRITE_WITH_IMM if imm else P.WrOpcode.RDMA_WRITE,
            "wr_id": (ord(side) << 32) | index,
            "local_addr": src_base + offset, "remote_addr": dst_base + offset,
            "rkey": peer_rkey, "length": length,
            "imm": rng.getrandbits(32) if imm else 0,
            "data": rng.randbytes(length),
        })
        offset += length
        index += 1
    return work


def fabric_config_for(scenario, nic_config):
    """The fabric of a scenario (:class:`sim.fabric.FabricConfig`): one plane per NIC port,
    plane rates adding up to the NIC's line rate, the scenario's queue thresholds, impairments
    and failure (on both directions of the plane)."""
    from .fabric.config import FabricConfig
    from .fabric.schedule import Failure
    failures = ()
    failure = scenario.failure
    if failure is not None:
        recover = failure["recover_at_us"]
        planes = range(nic_config.ports) if failure["all_planes"] else (failure["plane"],)
        failures = tuple(Failure(kind=failure["kind"], plane=plane,
                                 at_ns=failure["at_us"] * 1000.0,
                                 recover_ns=None if recover is None else recover * 1000.0,
                                 period_ns=(failure["flap_period_us"] or 0.0) * 1000.0)
                         for plane in planes)
    return FabricConfig.for_nic(
        nic_config, paths_per_plane=scenario.paths, latency_ns=scenario.latency_us * 1000.0,
        queue_bytes=scenario.queue_bytes,
        ecn_threshold_bytes=min(scenario.ecn_threshold, scenario.queue_bytes),
        trim_threshold_bytes=min(scenario.trim_threshold, scenario.queue_bytes),
        loss=scenario.loss, burst_loss=scenario.extra.get("burst_loss", 0.0),
        duplicate=scenario.duplicate, corrupt=scenario.corrupt,
        failures=failures, seed=scenario.seed)
