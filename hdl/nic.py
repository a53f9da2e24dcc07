"""The MRC NIC top: every block wired together, one register bus over their control ports.

::

    wr ─► Requester ─► send ─┐                         ┌─► TxFormer ─► tx arbiter ─► engine ─► tx[P]
              ▲  ▲           ├─► PathSelect ─(EV, port,│     │ fetch_req/fetch (host memory)
              │  └ sent ◄────┼── fields)───────────────┘     │
              │   ProbeRequester ◄── probe commands           │
              │        ▲                                      │
    rx[P] ─► engine ─► rx demux ─┬─ DATA, RPROBE ──► Responder ─► place (host memory)
              │                  │             ├─► SACK/NACK/NAK ─► tx arbiter (priority)
              │                  │             └─► completion ─┐
              └─ SACK/NACK/NAK ◄─┤                             ├─► completion
                                 ├─ EP_REQUEST ─► ProbeResponder ─► tx arbiter (priority)
                                 └─ EP_RESPONSE ─► ProbeRequester ─► RTT results
    feedback: Requester (ACK/ECN/TRIM), ProbeRequester (PROBE_OK) ─► PathSelect
    PortWatch: data sends per port + SACK/NACK echoes per port ─► port down ─► PathSelect
    EvExpander ◄─► PathSelect (expansion and generation of EV entries)
    bus ─► RegisterBus ─► every block's control port, counters and event queues

``docs/nic.md`` describes the ports; ``docs/registers.md`` the register map.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .config import NicConfig
from .control.nicmap import TX_COUNTERS, nic_register_map
from .control.regmap import RegisterBus, bus_signature
from .interfaces import (
    completion_layout,
    feedback_layout,
    fetch_beat_layout,
    fetch_request_layout,
    place_beat_layout,
    work_request_layout,
)
from .packet.engine import PacketEngine
from .packet.headers import DropReason, PacketKind, net_beat_layout, packet_beat_layout
from .packet.mux import PacketArbiter, PacketDemux, StreamMerge
from .path.expand import EvExpander
from .path.probe import ProbeRequester, ProbeResponder, probe_context_layout
from .path.select import COUNTERS as PATH_COUNTERS
from .path.select import PathSelect
from .path.watch import PortWatch
from .protocol import Errno
from .timebase import Timebase
from .transport.req_defs import send_context_layout
from .transport.requester import Requester
from .transport.resp_defs import ResponderVerdict
from .transport.responder import Responder
from .transport.txformer import TxFormer, tx_context_layout
from .util import validating

__all__ = ["MrcNic", "RxRoute"]


class RxRoute:
    """Outputs of the receive demultiplexer."""
    DATA = 0            #: to the responder: data packets and reliability probes (PETH)
    ACK = 1             #: to the requester: SACKs, NACKs and AETH NAKs
    PROBE_REQUEST = 2   #: to the probe responder: ENDPOINT_REQUEST
    PROBE_RESPONSE = 3  #: to the probe requester: ENDPOINT_RESPONSE
    COUNT = 4


class MrcNic(wiring.Component):
    """Multipath Reliable Connection NIC.

    Parameters
    ----------
    config : NicConfig
        Build parameters (``docs/configuration.md``); defaults to ``NicConfig()``.
    nscc : NsccSetting or None
        Build the requester's NSCC engine with this setting (``docs/congestion.md``, "NSCC in
        the RTL"); ``None``: the ECN window only.

    Members
    -------
    rx : ``In(stream.Signature(net_beat_layout(W))).array(ports)``
        Frames received on each network port (plane), without FCS.
    tx : ``Out(stream.Signature(net_beat_layout(W))).array(ports)``
        Frames to transmit on each port.
    wr : ``In(stream.Signature(work_request_layout(config)))``
        Work requests (RDMA WRITE, WRITE WITH IMMEDIATE).
    completion : ``Out(stream.Signature(completion_layout(config)))``
        Requester and responder completions, each side in order per QP.
    fetch_req, fetch : payload reads from host memory (requester).
    place : payload writes into host memory (responder).
    bus : ``In(bus_signature(...))``
        The register bus (``docs/registers.md``).
    rx_verdict_valid, rx_verdict_reason : the parser's verdict per received frame.
    resp_verdict_valid, resp_verdict : the responder's verdict per data packet.
    """

    def __init__(self, config=None, *, nscc=None):
        with validating(self):
            config = NicConfig() if config is None else config
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
        self._config = config
        self._nscc = nscc
        self._regmap = nic_register_map(config)
        beat = stream.Signature(net_beat_layout(config.data_width))
        super().__init__({
            "rx": In(beat).array(config.ports),
            "tx": Out(beat).array(config.ports),
            "wr": In(stream.Signature(work_request_layout(config))),
            "completion": Out(stream.Signature(completion_layout(config))),
            "fetch_req": Out(stream.Signature(fetch_request_layout(config))),
            "fetch": In(stream.Signature(fetch_beat_layout(config))),
            "place": Out(stream.Signature(place_beat_layout(config))),
            "bus": In(bus_signature(self._regmap.address_bits)),
            "rx_verdict_valid": Out(1),
            "rx_verdict_reason": Out(DropReason),
            "resp_verdict_valid": Out(1),
            "resp_verdict": Out(ResponderVerdict),
        })

    @property
    def config(self):
        return self._config

    @property
    def register_map(self):
        return self._regmap

    def elaborate(self, platform):
        m = Module()
        config = self._config
        packet = packet_beat_layout(config)

        m.submodules.timebase = timebase = Timebase(clock_hz=config.clock_hz)
        m.submodules.engine = engine = PacketEngine(config)
        m.submodules.requester = requester = Requester(config=config, nscc=self._nscc)
        m.submodules.responder = responder = Responder(config=config)
        send_context = send_context_layout(config)
        probe_context = probe_context_layout(config)
        context = tx_context_layout(send_context, probe_context)
        m.submodules.path = path = PathSelect(config=config, context=context)
        m.submodules.expander = expander = EvExpander(config=config)
        m.submodules.probe_requester = probe_req = ProbeRequester(config=config)
        m.submodules.probe_responder = probe_resp = ProbeResponder(config=config)
        m.submodules.txformer = txformer = TxFormer(
            config=config, send_context=send_context, probe_context=probe_context)
        m.submodules.rx_demux = rx_demux = PacketDemux(layout=packet, count=RxRoute.COUNT)
        m.submodules.tx_urgent = tx_urgent = StreamMerge(layout=packet, count=2)
        m.submodules.tx_arbiter = tx_arbiter = PacketArbiter(layout=packet, count=2)
        m.submodules.completions = completions = StreamMerge(
            layout=completion_layout(config), count=2)
        m.submodules.feedback = feedback = StreamMerge(layout=feedback_layout(config), count=2)
        m.submodules.regs = regs = RegisterBus(self._regmap)
        m.submodules.watch = watch = PortWatch(ports=config.ports)

        for block in (requester, responder, probe_req, probe_resp, txformer):
            m.d.comb += block.now_ns.eq(timebase.ns)
        # The retransmit timers count 1.024 us units (the local ACK timeout's).
        m.d.comb += requester.now_units.eq(timebase.units)

        # Network ports and the packet engine
        for port in range(config.ports):
            wiring.connect(m, wiring.flipped(self.rx[port]), engine.rx[port])
            wiring.connect(m, engine.tx[port], wiring.flipped(self.tx[port]))
        m.d.comb += [
            engine.trim_dscp.eq(regs.settings.trim_dscp),
            self.rx_verdict_valid.eq(engine.rx_verdict_valid),
            self.rx_verdict_reason.eq(engine.rx_verdict_reason),
            self.resp_verdict_valid.eq(responder.verdict_valid),
            self.resp_verdict.eq(responder.verdict),
        ]

        # Receive: route each packet by kind
        wiring.connect(m, engine.rx_packets, rx_demux.i)
        header = rx_demux.i.payload.header
        with m.Switch(header.kind):
            with m.Case(PacketKind.DATA, PacketKind.RPROBE):
                m.d.comb += rx_demux.select.eq(RxRoute.DATA)
            with m.Case(PacketKind.SACK, PacketKind.NACK, PacketKind.AETH):
                m.d.comb += rx_demux.select.eq(RxRoute.ACK)
            with m.Case(PacketKind.EP_REQUEST):
                m.d.comb += rx_demux.select.eq(RxRoute.PROBE_REQUEST)
            with m.Case(PacketKind.EP_RESPONSE):
                m.d.comb += rx_demux.select.eq(RxRoute.PROBE_RESPONSE)
            with m.Default():
                m.d.comb += rx_demux.select.eq(RxRoute.COUNT)
        wiring.connect(m, rx_demux.o[RxRoute.DATA], responder.i)
        wiring.connect(m, rx_demux.o[RxRoute.ACK], requester.rx)
        wiring.connect(m, rx_demux.o[RxRoute.PROBE_REQUEST], probe_resp.i)
        wiring.connect(m, rx_demux.o[RxRoute.PROBE_RESPONSE], probe_req.rx)

        # Host side
        wiring.connect(m, wiring.flipped(self.wr), requester.wr)
        wiring.connect(m, responder.place, wiring.flipped(self.place))
        wiring.connect(m, requester.completion, completions.i[0])
        wiring.connect(m, responder.completion, completions.i[1])
        wiring.connect(m, completions.o, wiring.flipped(self.completion))
        wiring.connect(m, txformer.fetch_req, wiring.flipped(self.fetch_req))
        wiring.connect(m, wiring.flipped(self.fetch), txformer.fetch)

        # Send: requester and probes -> path select -> transmit former -> builder
        req_send, probe_send = requester.send, probe_req.o
        with m.If(probe_send.valid):
            m.d.comb += [
                path.i.valid.eq(1),
                path.i.p.qpn.eq(probe_send.p.qpn),
                path.i.p.probe.eq(1),
                path.i.p.ev.eq(probe_send.p.ev),
                path.i.p.context.probe.eq(1),
                path.i.p.context.probe_ctx.eq(probe_send.p.context),
                probe_send.ready.eq(path.i.ready),
            ]
        with m.Else():
            m.d.comb += [
                path.i.valid.eq(req_send.valid),
                path.i.p.qpn.eq(req_send.p.qpn),
                path.i.p.avoid_ev_valid.eq(req_send.p.avoid_ev_valid),
                path.i.p.avoid_ev.eq(req_send.p.avoid_ev),
                path.i.p.context.send.eq(req_send.p.context),
                req_send.ready.eq(path.i.ready),
            ]
        wiring.connect(m, path.o, txformer.i)
        wiring.connect(m, txformer.sent, requester.sent)
        wiring.connect(m, path.exp_req, expander.exp_req)
        wiring.connect(m, expander.exp_resp, path.exp_resp)
        wiring.connect(m, path.gen_req, expander.gen_req)
        wiring.connect(m, expander.gen_resp, path.gen_resp)
        m.d.comb += expander.locked.eq(path.profile_online)
        wiring.connect(m, requester.feedback, feedback.i[0])
        wiring.connect(m, probe_req.feedback, feedback.i[1])
        wiring.connect(m, feedback.o, path.feedback)

        # Port watch: data sends per port against the SACKs and NACKs that come back on each
        # port, echoing the data packets' TSETH timestamps; a port that stopped answering is
        # swept in path select (docs/recovery.md). AETH NAKs carry no timestamp.
        ack_in = rx_demux.o[RxRoute.ACK]
        ack_is_sack = ack_in.p.header.kind == PacketKind.SACK
        ack_is_nack = ack_in.p.header.kind == PacketKind.NACK
        m.d.comb += [
            watch.now_ns.eq(timebase.ns),
            watch.window.eq(regs.settings.port_wnd),
            watch.quiet.eq(regs.settings.port_quiet),
            watch.sent_valid.eq(txformer.sent.valid & txformer.sent.ready),
            watch.sent_port.eq(txformer.sent_port),
            watch.sent_ts.eq(txformer.sent_ts),
            watch.ack_valid.eq(ack_in.valid & ack_in.ready & ack_in.p.first
                               & (ack_is_sack | ack_is_nack)),
            watch.ack_port.eq(ack_in.p.header.port),
            watch.ack_echo.eq(Mux(ack_is_sack, ack_in.p.header.ctl.sack.cc_state.tx_timestamp,
                                  ack_in.p.header.ctl.neth.tx_timestamp)),
            watch.rx_valid.eq(rx_demux.i.valid & rx_demux.i.ready & rx_demux.i.p.first),
            watch.rx_port.eq(rx_demux.i.p.header.port),
            path.port_down_valid.eq(watch.down_valid),
            path.port_down_port.eq(watch.down_port),
        ]

        # Transmit: ACKs and probe responses (one-beat headers, taking turns) before data and
        # probe requests at every frame boundary. Both answer a packet the receive path has
        # taken, and the receive path waits while its answer cannot leave: behind data they
        # waited up to a data frame each, and the probe responses held up the receive path
        # on the 8-plane RTL run.
        wiring.connect(m, responder.ack, tx_urgent.i[0])
        wiring.connect(m, probe_resp.o, tx_urgent.i[1])
        wiring.connect(m, tx_urgent.o, tx_arbiter.i[0])
        wiring.connect(m, txformer.o, tx_arbiter.i[1])
        wiring.connect(m, tx_arbiter.o, engine.tx_packets)

        # Control plane
        wiring.connect(m, wiring.flipped(self.bus), regs.bus)
        for name, block in (("requester", requester), ("responder", responder),
                            ("path", path), ("tx", txformer)):
            wiring.connect(m, getattr(regs, f"{name}_req"), block.ctl)
            wiring.connect(m, block.ctl_resp, getattr(regs, f"{name}_resp"))
        wiring.connect(m, regs.ev_define_req, expander.define)
        wiring.connect(m, expander.define_resp, regs.ev_define_resp)
        # Probe commands have no response of their own: answer OK once the command is taken.
        probe_ack = Signal()
        wiring.connect(m, regs.probe_req, probe_req.cmd)
        with m.If(probe_req.cmd.valid & probe_req.cmd.ready):
            m.d.sync += probe_ack.eq(1)
        with m.Elif(regs.probe_resp.ready):
            m.d.sync += probe_ack.eq(0)
        m.d.comb += [regs.probe_resp.valid.eq(probe_ack),
                     regs.probe_resp.p.errno.eq(Errno.OK)]
        wiring.connect(m, path.events, regs.ev_events)
        wiring.connect(m, probe_req.result, regs.probe_results)
        wiring.connect(m, requester.qp_error, regs.qp_errors)
        for index, reason in enumerate(DropReason):
            m.d.comb += regs.rx_counters[reason.name.lower()].eq(engine.rx_counters[index])
        tx_counters = {"tx_length_errors": engine.tx_length_errors,
                       "tx_bad_port": engine.tx_bad_port, "no_path": txformer.no_path,
                       "rx_unrouted": rx_demux.dropped,
                       "probe_results_dropped": probe_req.results_dropped,
                       "probe_unknown_ids": probe_req.unknown_ids,
                       "port_downs": watch.downs, "port_watch_overflows": watch.overflows}
        for name in TX_COUNTERS:
            m.d.comb += regs.tx_counters[name].eq(tx_counters[name])
        m.d.comb += [regs.requester_counters.eq(requester.counters),
                     regs.responder_counters.eq(responder.counters)]
        for name in PATH_COUNTERS:
            m.d.comb += regs.path_counters[name].eq(getattr(path, name))
        return m
