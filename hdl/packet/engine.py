"""The packet engine: P network ports, one parser and one header builder.

The NIC top (:mod:`hdl.nic`) puts the transport blocks between ``rx_packets`` and
``tx_packets``; the engine alone is what the packet-level tests, ``mrc-nic replay`` and the
packet benchmarks drive::

    rx[0..P-1] ─► PortArbiter ─► [slice] ─► Parser ─► rx_packets     (to the transport blocks)
    tx[0..P-1] ◄─ PortDemux  ◄─ [slice] ◄─ HeaderBuilder ◄─ tx_packets (from the transport blocks)

The ``[slice]`` stages (:class:`~hdl.packet.slice.RegisterSlice`, with ``pipeline=True``, the
default) cut the combinational paths from the arbiter's grant multiplexer into the parser's
admission logic and from the builder's output stage into the demux and the ports' ``ready``:
without them that chain was the engine's critical path on the ECP5 (``docs/boards.md``).

The receive path checks every frame (docs/parser.md) and drops bad ones whole with a counted
reason; the transmit path builds complete frames with lengths, checksums and ICRC
(docs/builder.md) and sends each on the port its header names.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..util import validating
from .builder import HeaderBuilder
from .headers import DropReason, net_beat_layout, packet_beat_layout
from .parser import Parser
from .ports import PortArbiter, PortDemux
from .slice import RegisterSlice

__all__ = ["PacketEngine"]


class PacketEngine(wiring.Component):
    """The NIC's packet engine: port arbiter, parser, header builder, port demux.

    Parameters
    ----------
    config : NicConfig
        Build parameters (``docs/configuration.md``); defaults to ``NicConfig()``.
    pipeline : bool
        Register slices between the port arbiter and the parser and between the header builder
        and the port demux (default ``True``): one more cycle of latency on each path, the
        same throughput (one beat per cycle) and the same behaviour otherwise; about
        2 x (W + W/8 + 6) flip-flops per slice.

    Members
    -------
    rx : ``In(stream.Signature(net_beat_layout(W))).array(ports)``
        Frames received on each network port (plane), without FCS.
    tx : ``Out(stream.Signature(net_beat_layout(W))).array(ports)``
        Frames to transmit on each port.
    rx_packets : ``Out(stream.Signature(packet_beat_layout(config)))``
        Accepted packets: parsed header and payload.
    tx_packets : ``In(stream.Signature(packet_beat_layout(config)))``
        Packets to send: header (its ``port`` picks the plane) and payload.
    rx_counters : ``Out(data.ArrayLayout(32, len(DropReason)))``
        Element 0: frames accepted; element r: frames dropped for :class:`DropReason` r.
    rx_verdict_valid, rx_verdict_reason : ``Out(1)``, ``Out(DropReason)``
        One strobe per received frame, in arrival order through the arbiter.
    tx_length_errors : ``Out(32)``
        Packets whose payload disagreed with their header's ``payload_len``.
    tx_bad_port : ``Out(32)``
        Frames discarded because their header named a port the NIC does not have.
    trim_dscp : ``In(6, init=config.trim_dscp)``
        DSCP code point of trimmed packets (a control register in the NIC top).
    """

    def __init__(self, config=None, *, pipeline=True):
        with validating(self):
            config = NicConfig() if config is None else config
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
            if not isinstance(pipeline, bool):
                raise TypeError(f"pipeline must be a bool, not {pipeline!r}")
        self._config = config
        self._pipeline = pipeline
        beat = stream.Signature(net_beat_layout(config.data_width))
        packet = stream.Signature(packet_beat_layout(config))
        super().__init__({
            "rx": In(beat).array(config.ports),
            "tx": Out(beat).array(config.ports),
            "rx_packets": Out(packet),
            "tx_packets": In(packet),
            "rx_counters": Out(data.ArrayLayout(32, len(DropReason))),
            "rx_verdict_valid": Out(1),
            "rx_verdict_reason": Out(DropReason),
            "tx_length_errors": Out(32),
            "tx_bad_port": Out(32),
            "trim_dscp": In(6, init=config.trim_dscp),
        })

    @property
    def config(self):
        return self._config

    @property
    def pipeline(self):
        return self._pipeline

    def _sliced(self, m, name, source, sink):
        """Connect ``source`` to ``sink``, through a register slice when pipelined."""
        if self._pipeline:
            shape = source.signature.members["payload"].shape
            m.submodules[name] = stage = RegisterSlice(shape=shape)
            wiring.connect(m, source, stage.i)
            wiring.connect(m, stage.o, sink)
        else:
            wiring.connect(m, source, sink)

    def elaborate(self, platform):
        m = Module()
        config = self._config
        ports = dict(data_width=config.data_width, ports=config.ports)

        # Receive path
        m.submodules.rx_arbiter = arbiter = PortArbiter(**ports)
        m.submodules.parser = parser = Parser(config=config)
        for port in range(config.ports):
            wiring.connect(m, wiring.flipped(self.rx[port]), arbiter.i[port])
        self._sliced(m, "rx_slice", arbiter.o, parser.i)
        wiring.connect(m, parser.o, wiring.flipped(self.rx_packets))
        m.d.comb += [
            parser.trim_dscp.eq(self.trim_dscp),
            self.rx_counters.eq(parser.counters),
            self.rx_verdict_valid.eq(parser.verdict_valid),
            self.rx_verdict_reason.eq(parser.verdict_reason),
        ]

        # Transmit path
        m.submodules.builder = builder = HeaderBuilder(config=config)
        m.submodules.tx_demux = demux = PortDemux(**ports)
        wiring.connect(m, wiring.flipped(self.tx_packets), builder.i)
        self._sliced(m, "tx_slice", builder.o, demux.i)
        for port in range(config.ports):
            wiring.connect(m, demux.o[port], wiring.flipped(self.tx[port]))
        m.d.comb += [
            self.tx_length_errors.eq(builder.length_errors),
            self.tx_bad_port.eq(demux.bad_port),
        ]
        return m
