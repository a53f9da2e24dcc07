"""Two NIC tops in one simulation top, every port of NIC ``a`` and NIC ``b`` exposed with an
``a_``/``b_`` prefix, so a cocotb bench can put a network model between them.

The two NICs have one configuration, so :meth:`NicPair.export_sv` writes the NIC once, as the
module ``mrc_nic``, and a top that instantiates it twice: Verilator compiles one NIC's C++, not
two, which halves the build of ``make sim`` (the build is most of a default run's wall time).
A NIC is converted once per configuration and NSCC setting (:func:`export_nic`, kept in
:data:`PAIR_EXPORTS`): the pair, a group and the one-NIC benches (:class:`NicDesign`) of one
configuration read the same text. A pair design is exported once too: its Verilog is kept there
and read by every bench of that design, the pair as the top and the C++ agents' wrapper around
it (:class:`sim.tb.dpi.DpiPair`).
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Flow

from hdl.config import NicConfig
from hdl.nic import MrcNic

from .. import export as _export_module
from ..env import BUILD
from ..export import export_sv, write_if_changed

__all__ = ["NicPair", "NicGroup", "NicDesign", "export_nic", "SMALL_CONFIG", "RECEIVE_CONFIG",
           "NIC_MODULE", "GROUP_MODULE", "PAIR_EXPORTS"]

#: Where :func:`export_nic` keeps each NIC's Verilog and :meth:`NicPair.export_sv` each pair
#: design's: a folder per design, configuration and NSCC setting (``mrc_nic-<digest>``,
#: ``nic_pair-<digest>``), holding the Verilog and the key it was exported under.
PAIR_EXPORTS = BUILD / "exports"

#: The Verilog module name of the shared NIC.
NIC_MODULE = "mrc_nic"

#: The configuration of the NIC-level cocotb tests (loopback, replay): every block, the
#: default 64-bit datapath, 4 planes, but small tables (64 QPs, 16 EVs, a 128-PSN window), so
#: a NIC compiles in minutes under Verilator on two cores.
SMALL_CONFIG = NicConfig(ports=4, qps=64, mpr_units=1, ev_profiles=1, evs_per_profile=16,
                         max_wimm=4, wr_slots=4, mtu=512)

#: The one-NIC receive path's configuration in the tests (``mrc-nic replay`` and ``mrc-nic flow``
#: with ``--sim``): :data:`SMALL_CONFIG` on 2 ports, so both commands' builds read one
#: conversion of the NIC (:func:`export_nic`).
RECEIVE_CONFIG = SMALL_CONFIG.replace(ports=2)


def _design_parts(config, nscc):
    """What names a NIC design besides the gateware: its configuration and NSCC setting."""
    parts = [config.to_dict()]
    if nscc is not None:
        parts.append(dataclasses.asdict(nscc))
    return parts


def _cached_export(kind, parts, key_parts, make):
    """The Verilog ``make()`` returns, kept in ``PAIR_EXPORTS/<kind>-<digest of parts>/<kind>.sv``
    under the key :func:`sim.tb.runner.source_key` of ``kind``, ``parts`` and ``key_parts``
    (the gateware with them): read from there while the key is unchanged, made and kept
    otherwise (the folder locked meanwhile, so two workers take turns)."""
    from .runner import _folder_lock, source_key
    name = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    folder = PAIR_EXPORTS / f"{kind}-{name}"
    cached, key_file = folder / f"{kind}.sv", folder / "export.key"
    key = source_key(kind, *parts, *key_parts)
    with _folder_lock(folder):
        if cached.exists() and key_file.exists() and key_file.read_text() == key:
            return cached.read_text()
        text = make()
        key_file.unlink(missing_ok=True)
        write_if_changed(cached, text)
        key_file.write_text(key)
        return text


def export_nic(config, *, nscc=None):
    """The Verilog of :class:`hdl.nic.MrcNic` (``config``, ``nscc``) as the module
    :data:`NIC_MODULE`, converted once per configuration and NSCC setting while the gateware is
    unchanged (kept in :data:`PAIR_EXPORTS`): the pairs, groups and one-NIC benches of one
    configuration share the conversion."""
    return _cached_export(
        NIC_MODULE, _design_parts(config, nscc), [Path(_export_module.__file__).read_bytes()],
        lambda: export_sv(MrcNic(config, nscc=nscc), name=NIC_MODULE))


class NicDesign:
    """One NIC as the top :data:`NIC_MODULE`, for :func:`sim.tb.runner.run_cocotb`
    (``toplevel=NIC_MODULE``): its Verilog is :func:`export_nic`'s, shared with every other
    bench of the same configuration and NSCC setting."""

    def __init__(self, config, *, nscc=None):
        self.config = config
        self.nscc = nscc

    def export_sv(self, path=None):
        text = export_nic(self.config, nscc=self.nscc)
        if path is not None:
            write_if_changed(path, text)
        return text


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

    Elaborated as two Amaranth submodules (one flat design, what the Amaranth simulator
    needs), or, once :meth:`export_sv` has run, as two instances of the black box
    :data:`NIC_MODULE` that the exported file defines. ``nscc``: both NICs' requesters get
    NSCC with this setting (:class:`hdl.nic.MrcNic`).
    """

    def __init__(self, config, *, nscc=None):
        self._config = config
        self._nscc = nscc
        self._shared = False
        self.nics = {"a": MrcNic(config, nscc=nscc), "b": MrcNic(config, nscc=nscc)}
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
                outer = SimpleNamespace(**{name: getattr(self, f"{prefix}_{name}")
                                           for name in nic.signature.members})
                for path, member, value in nic.signature.flatten(outer):
                    kind = "o" if member.flow == Flow.Out else "i"
                    ports[f"{kind}_{'__'.join(map(str, path))}"] = value
                m.submodules[f"nic_{prefix}"] = Instance(NIC_MODULE, **ports)
                continue
            m.submodules[f"nic_{prefix}"] = nic
            for name, member in nic.signature.members.items():
                _connect(m, getattr(self, f"{prefix}_{name}"), getattr(nic, name), member)
        return m

    def export_sv(self, path=None):
        """Write NIC ``a`` once, as the module :data:`NIC_MODULE`, and this pair as the top
        ``nic_pair`` with two instances of it, to ``path`` (kept when unchanged; ``None``: only
        return the text). NIC ``b`` is never elaborated: the second instance stands for it.

        The text comes from :data:`PAIR_EXPORTS` when it was exported there under the same key
        (:func:`sim.tb.runner.source_key` of the gateware, this module, the export module, the
        configuration and the NSCC setting); otherwise the top is elaborated, the NIC's
        Verilog is :func:`export_nic`'s, and the text is kept there."""
        parts = _design_parts(self._config, self._nscc)
        self._shared = True
        _mark_used(self, *self.nics.values())     # a kept text elaborates none of them

        def make():
            return export_nic(self._config, nscc=self._nscc) + "\n" + \
                export_sv(self, name="nic_pair")

        text = _cached_export("nic_pair", parts, [Path(__file__).read_bytes(),
                                                  Path(_export_module.__file__).read_bytes()],
                              make)
        if path is not None:
            write_if_changed(path, text)
        return text


#: The Verilog module name of a group's top (:class:`NicGroup`).
GROUP_MODULE = "nic_group"


class NicGroup(wiring.Component):
    """NICs ``names`` (``a``, ``b``, ``c``, ...) with the same configuration, unconnected to
    each other, every port of NIC ``x`` exposed with an ``x_`` prefix: the pair generalised
    to the N-NIC runs of the main job (``sim/tb/cocotb_group.py``).

    Only one NIC is elaborated: :meth:`export_sv` writes it once, as :data:`NIC_MODULE`, and
    the top :data:`GROUP_MODULE` with one instance of it per name, so Verilator compiles one
    NIC's C++ whatever the count. There is no flat elaboration (the Amaranth simulator has no
    bench of several NICs). ``nscc``: every NIC's requester gets the NSCC congestion engine
    with this :class:`~sim.model.nscc.NsccSetting` (``None``: the ECN window only), as in
    :class:`NicPair`."""

    def __init__(self, config, names, *, nscc=None):
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"names: two or more distinct NIC names, not {names!r}")
        self._config = config
        self._nscc = nscc
        self.names = tuple(names)
        self._nic = MrcNic(config, nscc=nscc)
        members = {}
        for prefix in self.names:
            for name, member in self._nic.signature.members.items():
                members[f"{prefix}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for prefix in self.names:
            ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
            outer = SimpleNamespace(**{name: getattr(self, f"{prefix}_{name}")
                                       for name in self._nic.signature.members})
            for path, member, value in self._nic.signature.flatten(outer):
                kind = "o" if member.flow == Flow.Out else "i"
                ports[f"{kind}_{'__'.join(map(str, path))}"] = value
            m.submodules[f"nic_{prefix}"] = Instance(NIC_MODULE, **ports)
        return m

    def export_sv(self, path):
        """Write the NIC once, as :data:`NIC_MODULE` (:func:`export_nic`'s Verilog), and the
        group as the top :data:`GROUP_MODULE` with an instance of it per NIC, to ``path`` (kept
        when unchanged)."""
        _mark_used(self._nic)
        nic = export_nic(self._config, nscc=self._nscc)
        top = export_sv(self, name=GROUP_MODULE)
        text = nic + "\n" + top
        write_if_changed(path, text)
        return text
