"""Two NIC tops in one simulation top, every port of NIC ``a`` and NIC ``b`` exposed with an
``a_``/``b_`` prefix, so a cocotb bench can put a network model between them."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Flow

from hdl.config import NicConfig
from hdl.nic import MrcNic

__all__ = ["NicPair", "SMALL_CONFIG"]

#: The configuration of the NIC-level cocotb tests (loopback, replay): every block, the
#: default 64-bit datapath, 4 planes, but small tables (64 QPs, 16 EVs, a 128-PSN window), so
#: a NIC compiles in minutes under Verilator on two cores.
SMALL_CONFIG = NicConfig(ports=4, qps=64, mpr_units=1, ev_profiles=1, evs_per_profile=16,
                         max_wimm=4, wr_slots=4, mtu=512)


def _connect(m, outer, inner, member):
    if member.is_port:
        if member.flow == Flow.Out:
            m.d.comb += outer.eq(inner)
        else:
            m.d.comb += inner.eq(outer)
    elif member.dimensions:
        for index in range(member.dimensions[0]):
            wiring.connect(m, wiring.flipped(outer[index]), inner[index])
    else:
        wiring.connect(m, wiring.flipped(outer), inner)


class NicPair(wiring.Component):
    """NICs ``a`` and ``b`` with the same configuration, unconnected to each other."""

    def __init__(self, config):
        self._config = config
        self.nics = {"a": MrcNic(config), "b": MrcNic(config)}
        members = {}
        for prefix, nic in self.nics.items():
            for name, member in nic.signature.members.items():
                members[f"{prefix}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for prefix, nic in self.nics.items():
            m.submodules[f"nic_{prefix}"] = nic
            for name, member in nic.signature.members.items():
                _connect(m, getattr(self, f"{prefix}_{name}"), getattr(nic, name), member)
        return m
