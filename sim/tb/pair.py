"""Two NIC tops in one simulation top, every port of NIC ``a`` and NIC ``b`` exposed with an
``a_``/``b_`` prefix, so a cocotb bench can put a network model between them.

The two NICs have one configuration, so :meth:`NicPair.export_sv` writes the NIC once, as the
module ``mrc_nic``, and a top that instantiates it twice: Verilator compiles one NIC's C++, not
two, which halves the build of ``make sim`` (the build is most of a default run's wall time).
"""

from pathlib import Path

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Flow

from hdl.config import NicConfig
from hdl.nic import MrcNic

from ..export import export_sv

__all__ = ["NicPair", "SMALL_CONFIG", "NIC_MODULE"]

#: The Verilog module name of the shared NIC.
NIC_MODULE = "mrc_nic"

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


def _mark_used(*elaboratables):
    """Tell Amaranth these elaboratables are accounted for: otherwise each one warns
    ``UnusedElaboratable`` when garbage collected, which under ``filterwarnings = error``
    fails whatever test is running at that moment."""
    for item in elaboratables:
        item._MustUse__used = True


class NicPair(wiring.Component):
    """NICs ``a`` and ``b`` with the same configuration, unconnected to each other.

    ``shared``: elaborate the NICs as two instances of the black box :data:`NIC_MODULE`
    (what :meth:`export_sv` does); otherwise as two Amaranth submodules (one flat design, what
    the Amaranth simulator needs).
    """

    def __init__(self, config, *, shared=False):
        self._config = config
        self._shared = shared
        self.nics = {"a": MrcNic(config), "b": MrcNic(config)}
        if shared:                  # signatures only: the black boxes stand for them
            _mark_used(*self.nics.values())
        members = {}
        for prefix, nic in self.nics.items():
            for name, member in nic.signature.members.items():
                members[f"{prefix}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for prefix, nic in self.nics.items():
            if self._shared:
                ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
                for path, member, value in nic.signature.flatten(self._outer(prefix)):
                    kind = "o" if member.flow == Flow.Out else "i"
                    ports[f"{kind}_{'__'.join(map(str, path))}"] = value
                m.submodules[f"nic_{prefix}"] = Instance(NIC_MODULE, **ports)
                continue
            m.submodules[f"nic_{prefix}"] = nic
            for name, member in nic.signature.members.items():
                _connect(m, getattr(self, f"{prefix}_{name}"), getattr(nic, name), member)
        return m

    def _outer(self, prefix):
        """An object with the NIC's member names bound to this top's ``prefix_`` ports."""
        class Outer:
            pass
        outer = Outer()
        for name in self.nics[prefix].signature.members:
            setattr(outer, name, getattr(self, f"{prefix}_{name}"))
        return outer

    def export_sv(self, path):
        """Write the NIC module once and a top ``nic_pair`` with two instances of it to
        ``path``; an unchanged text keeps the file (and its time stamp). This object and its
        two NICs are then described by the file, never elaborated themselves."""
        _mark_used(self, *self.nics.values())
        nic = export_sv(MrcNic(self._config), name=NIC_MODULE)
        top = export_sv(NicPair(self._config, shared=True), name="nic_pair")
        text = nic + "\n" + top
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return text
