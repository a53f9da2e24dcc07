"""EV probes: the responder that answers them and the requester that sends them and times them.

A probe request (BTH opcode PROBE_REQUEST, then an MPRH) travels on the EV being probed; the
responder answers with PROBE_RESPONSE, echoing the MPRH and adding its service time; the
requester turns the echoed transmit time into a round-trip time in ns and tells path selection
that the EV answered. ``docs/probes.md`` describes the flow; ``docs/wire-format.md`` the MPRH.

Packets enter and leave these blocks as :func:`~hdl.packet.headers.packet_beat_layout` beats
(the parser's output, the header builder's input); a probe is one beat with ``keep == 0``.
"""

from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import feedback_layout, path_request_layout
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import validating

__all__ = [
    "ProbeResponder", "ProbeRequester", "probe_context_layout", "probe_command_layout",
    "probe_result_layout", "PROBE_RESPONSE_TCLASS", "PROBE_RESPONSE_HOP_LIMIT",
]

#: Traffic class of a probe response: DSCP 0, ECN ECT(0), as every packet the NIC originates.
PROBE_RESPONSE_TCLASS = 0b10
#: Hop limit (IPv4 TTL) of a probe response, as every packet the NIC originates.
PROBE_RESPONSE_HOP_LIMIT = 64


def probe_context_layout(config):
    """The context a probe carries through path selection to the transmit former, which puts
    it in the MPRH: ``probe_id`` and ``tx_ts`` (ns modulo 2**32)."""
    return data.StructLayout({
        "probe_id": unsigned(32),
        "tx_ts": unsigned(32),
    })


def probe_command_layout(config):
    """A probe to send (control plane -> :class:`ProbeRequester`): on EV ``ev`` of QP ``qpn``."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "ev": unsigned(config.ev_index_bits),
        "probe_id": unsigned(32),
    })


def probe_result_layout(config):
    """A probe answered (:class:`ProbeRequester` -> control plane). Times in ns: ``rtt_ns`` is
    the requester's clock at the response minus the echoed ``tx_ts`` (modulo 2**32),
    ``svc_time`` the responder's service time (0 when the response does not carry one) and
    ``rtt_adjusted_ns`` their difference, 0 if the service time exceeds the RTT."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "ev": unsigned(config.ev_index_bits),
        "probe_id": unsigned(32),
        "rtt_ns": unsigned(32),
        "svc_time": unsigned(32),
        "rtt_adjusted_ns": unsigned(32),
    })


def _check_config(config):
    if not isinstance(config, NicConfig):
        raise TypeError(f"config must be a NicConfig, not {config!r}")


class ProbeResponder(wiring.Component):
    """Answer every probe request with a probe response header. One packet per cycle (II = 1),
    one cycle of latency.

    The response goes back out of the port the request came in by, to the addresses it came
    from (Ethernet and IP source and destination swapped, same VLAN tag), with the request's
    UDP source port and flow label, so in STEV and UDP format modes it returns on the EV it
    was sent on. It is never SRv6-encapsulated: it is addressed to the requester's inner IP
    address (*project choice*). BTH: opcode PROBE_RESPONSE, the request's partition key,
    ``dqpn`` the request's MPRH ``src_qpn``, PSN 0. The MPRH is echoed with flag SERVICE_TIME
    and ``svc_time`` the time the request waited for this block, in ns: ``now_ns`` when the
    response is formed minus ``now_ns`` in the first cycle the request was offered (0 when it
    is taken at once; time spent in the parser before and the builder after is not counted).

    Anything else (data, ACKs, probe responses) is accepted and dropped, counted per packet in
    ``dropped``.

    Parameters
    ----------
    config : NicConfig

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
        Received packets (the parser's output).
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
        Response headers, one beat each (``first``, ``last``, ``keep == 0``), for the builder.
    now_ns : ``In(32)``
        Time in ns (:class:`hdl.timebase.Timebase`).
    answered : ``Out(32)``
        Probe requests answered (wraps).
    dropped : ``Out(32)``
        Packets that were not probe requests (wraps).
    """

    def __init__(self, *, config):
        with validating(self):
            _check_config(config)
        self._config = config
        beat = stream.Signature(packet_beat_layout(config))
        super().__init__({
            "i": In(beat),
            "o": Out(beat),
            "now_ns": In(32),
            "answered": Out(32),
            "dropped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        request, response = self.i.p.header, self.o.p.header
        is_request = ((request.kind == PacketKind.PROBE)
                      & (request.bth.opcode == P.Opcode.PROBE_REQUEST))

        # The request waits while the output is full: its service time starts when it is first
        # offered, not when it is taken.
        waiting = Signal()
        arrival = Signal(32)
        with m.If(self.i.valid & ~self.i.ready & ~waiting):
            m.d.sync += [waiting.eq(1), arrival.eq(self.now_ns)]
        service = Mux(waiting, self.now_ns - arrival, 0)

        can_load = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(~(self.i.p.first & is_request) | can_load)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += waiting.eq(0)
            with m.If(self.i.p.first):
                with m.If(is_request):
                    m.d.sync += [
                        self.o.valid.eq(1),
                        self.answered.eq(self.answered + 1),
                        self.o.p.eq(0),
                        self.o.p.first.eq(1),
                        self.o.p.last.eq(1),
                        response.kind.eq(PacketKind.PROBE),
                        response.port.eq(request.port),
                        response.eth_dst.eq(request.eth_src),
                        response.eth_src.eq(request.eth_dst),
                        response.vlan_valid.eq(request.vlan_valid),
                        response.vlan_tci.eq(request.vlan_tci),
                        response.ipv6.eq(request.ipv6),
                        response.ip_src.eq(request.ip_dst),
                        response.ip_dst.eq(request.ip_src),
                        response.tclass.eq(PROBE_RESPONSE_TCLASS),
                        response.flow_label.eq(request.flow_label),
                        response.hop_limit.eq(PROBE_RESPONSE_HOP_LIMIT),
                        response.udp_sport.eq(request.udp_sport),
                        response.bth.opcode.eq(P.Opcode.PROBE_RESPONSE),
                        response.bth.pkey.eq(request.bth.pkey),
                        response.bth.dqpn.eq(request.mprh.src_qpn),
                        response.mprh.probe_id.eq(request.mprh.probe_id),
                        response.mprh.ev_index.eq(request.mprh.ev_index),
                        response.mprh.flags.eq(P.ProbeFlags.SERVICE_TIME),
                        response.mprh.src_qpn.eq(request.mprh.src_qpn),
                        response.mprh.tx_ts.eq(request.mprh.tx_ts),
                        response.mprh.svc_time.eq(service),
                    ]
                with m.Else():
                    m.d.sync += self.dropped.eq(self.dropped + 1)
        return m


class ProbeRequester(wiring.Component):
    """Send probes through path selection and time their responses. II = 1 on both paths.

    Send: each ``cmd`` becomes a path request with ``probe`` set and ``ev`` the EV to probe
    (path selection skips its choice and may use an ASSUMED_BAD EV), stamped with ``tx_ts`` =
    ``now_ns`` when the command is taken, one cycle of latency. The transmit former puts
    ``probe_id``, ``tx_ts``, the EV index and the QP number in the MPRH.

    Receive: each probe response (``rx``) gives a ``feedback`` of kind PROBE_OK for its EV in
    the cycle after it is taken, and a ``result``, written into a FIFO of ``results`` entries
    in the cycle it is taken. The requester keeps no table of outstanding
    probes (*project choice*): it trusts the echoed ``tx_ts``, ``src_qpn`` (as the response's
    BTH ``dqpn``) and ``ev_index``. A response naming a QP or EV index the build does not
    hold, and any packet that is not a probe response, is dropped and counted in
    ``rx_dropped``.

    The receive path never waits for ``result``: results are for software, which polls them
    (in the NIC top, through the register bus), and a response that waited for a slow reader
    held up every packet received behind it (ACKs and data included: on the 8-plane RTL run
    the receive path stalled for it). A result that finds the FIFO
    full is dropped and counted in ``results_dropped``; its PROBE_OK feedback still goes to
    path selection. Only ``feedback`` (path selection, which takes one per cycle when it has
    no control command) can hold a response back.

    Parameters
    ----------
    config : NicConfig
    results : int
        Result FIFO entries, 2 to 1024 (default 16).

    Members
    -------
    cmd : ``In(stream.Signature(probe_command_layout(config)))``
    o : ``Out(stream.Signature(path_request_layout(config, context=probe_context_layout(config))))``
    rx : ``In(stream.Signature(packet_beat_layout(config)))``
        Received probe responses (the parser's output).
    result : ``Out(stream.Signature(probe_result_layout(config)))``
    feedback : ``Out(stream.Signature(feedback_layout(config)))``
    now_ns : ``In(32)``
    sent, answered, rx_dropped, results_dropped : ``Out(32)``
        Probes sent, responses timed, packets dropped, results dropped on a full result FIFO
        (each wraps).
    """

    def __init__(self, *, config, results=16):
        with validating(self):
            _check_config(config)
            if not isinstance(results, int) or isinstance(results, bool) \
                    or not 2 <= results <= 1024:
                raise ValueError(f"results must be an integer from 2 to 1024, not {results!r}")
        self._config = config
        self._results = results
        super().__init__({
            "cmd": In(stream.Signature(probe_command_layout(config))),
            "o": Out(stream.Signature(
                path_request_layout(config, context=probe_context_layout(config)))),
            "rx": In(stream.Signature(packet_beat_layout(config))),
            "result": Out(stream.Signature(probe_result_layout(config))),
            "feedback": Out(stream.Signature(feedback_layout(config))),
            "now_ns": In(32),
            "sent": Out(32),
            "answered": Out(32),
            "rx_dropped": Out(32),
            "results_dropped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        config = self._config
        result_layout = probe_result_layout(config)
        m.submodules.results = results = SyncFIFOBuffered(
            width=result_layout.size, depth=self._results)
        m.d.comb += [
            self.result.valid.eq(results.r_rdy),
            self.result.payload.eq(results.r_data),
            results.r_en.eq(self.result.ready),
        ]

        # -- send -----------------------------------------------------------------------------
        m.d.comb += self.cmd.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [
                self.o.valid.eq(1),
                self.sent.eq(self.sent + 1),
                self.o.p.qpn.eq(self.cmd.p.qpn),
                self.o.p.avoid_ev_valid.eq(0),
                self.o.p.avoid_ev.eq(0),
                self.o.p.probe.eq(1),
                self.o.p.ev.eq(self.cmd.p.ev),
                self.o.p.context.probe_id.eq(self.cmd.p.probe_id),
                self.o.p.context.tx_ts.eq(self.now_ns),
            ]

        # -- receive --------------------------------------------------------------------------
        header = self.rx.p.header
        mprh = header.mprh
        is_response = ((header.kind == PacketKind.PROBE)
                       & (header.bth.opcode == P.Opcode.PROBE_RESPONSE))
        known = (header.bth.dqpn < config.qps) & (mprh.ev_index < config.evs_per_profile)
        timed = self.rx.p.first & is_response & known

        can_load = ~self.feedback.valid | self.feedback.ready
        m.d.comb += self.rx.ready.eq(~timed | can_load)
        with m.If(self.feedback.ready):
            m.d.sync += self.feedback.valid.eq(0)

        rtt = Signal(32)
        service = Signal(32)
        m.d.comb += [
            rtt.eq(self.now_ns - mprh.tx_ts),
            service.eq(Mux(mprh.flags & P.ProbeFlags.SERVICE_TIME, mprh.svc_time, 0)),
        ]
        qpn = header.bth.dqpn[:config.qpn_bits]
        ev = mprh.ev_index[:config.ev_index_bits]
        # The result goes straight into the FIFO in the cycle the response is taken (or is
        # dropped and counted when the FIFO is full).
        result = Signal(result_layout)
        m.d.comb += [
            result.qpn.eq(qpn), result.ev.eq(ev), result.probe_id.eq(mprh.probe_id),
            result.rtt_ns.eq(rtt), result.svc_time.eq(service),
            result.rtt_adjusted_ns.eq(Mux(service > rtt, 0, rtt - service)),
            results.w_data.eq(result),
        ]
        with m.If(self.rx.valid & self.rx.ready & self.rx.p.first):
            with m.If(timed):
                m.d.comb += results.w_en.eq(1)
                with m.If(~results.w_rdy):
                    m.d.sync += self.results_dropped.eq(self.results_dropped + 1)
                m.d.sync += [
                    self.feedback.valid.eq(1),
                    self.answered.eq(self.answered + 1),
                    self.feedback.p.qpn.eq(qpn),
                    self.feedback.p.ev.eq(ev),
                    self.feedback.p.kind.eq(P.FeedbackKind.PROBE_OK),
                ]
            with m.Else():
                m.d.sync += self.rx_dropped.eq(self.rx_dropped + 1)
        return m
