"""EV probes: the responder that answers them and the requester that sends them and times them.

An EV probe is an MRC 1.0 ENDPOINT_REQUEST (BTH opcode 0xD8, ``dqpn`` the endpoint QP, an
ERTH with op EV_PROBE and the sender's 16-bit ``tx_timestamp``) that travels on the EV being
probed; BTH.psn[15:0] carries an id private to the requester. The responder answers with an
ENDPOINT_RESPONSE (0xD9) whose EETH echoes the timestamp and whose BTH.psn[15:0] echoes the
id; the requester looks the id up in its table of outstanding probes (QP and EV), turns the
echo into a round-trip time (:func:`hdl.protocol.timestamp_age_ns`) and tells path selection
that the EV answered. ``docs/probes.md`` describes the flow; ``docs/wire-format.md`` the
headers.

Packets enter and leave these blocks as :func:`~hdl.packet.headers.packet_beat_layout` beats
(the parser's output, the header builder's input); a probe is one beat with ``keep == 0``.
"""

from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import feedback_layout, path_request_layout
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import validating

__all__ = [
    "ProbeResponder", "ProbeRequester", "probe_context_layout", "probe_command_layout",
    "probe_result_layout", "PROBE_RESPONSE_TCLASS", "PROBE_RESPONSE_HOP_LIMIT",
    "PROBE_TABLE_BITS",
]

#: Traffic class of a probe response: DSCP 0, ECN ECT(0), as every packet the NIC originates.
PROBE_RESPONSE_TCLASS = 0b10
#: Hop limit (IPv4 TTL) of a probe response, as every packet the NIC originates.
PROBE_RESPONSE_HOP_LIMIT = 64
#: The probe requester remembers the last 2**PROBE_TABLE_BITS probes it sent, in one block RAM
#: (*project choice*): a probe's id selects its entry by its low bits and the rest of the id
#: tells a late answer to a reused entry from the answer to the probe now in it. The table is
#: as deep as the probes that can be outstanding when software probes every ASSUMED_BAD EV of
#: several QPs each round and answers take tens of microseconds behind queued data.
PROBE_TABLE_BITS = 8


def probe_context_layout(config):
    """The context a probe carries through path selection to the transmit former, which puts
    it on the wire: ``probe_id`` (BTH.psn[15:0]) and ``tx_ts`` (the ERTH's 16-bit wire
    timestamp)."""
    return data.StructLayout({
        "probe_id": unsigned(P.ENDPOINT_ID_BITS),
        "tx_ts": unsigned(P.TIMESTAMP_BITS),
    })


def probe_command_layout(config):
    """A probe to send (control plane -> :class:`ProbeRequester`): on EV ``ev`` of QP ``qpn``;
    ``probe_id`` is software's own and comes back in the result."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "ev": unsigned(config.ev_index_bits),
        "probe_id": unsigned(32),
    })


def probe_result_layout(config):
    """A probe answered (:class:`ProbeRequester` -> control plane). Times in ns: ``rtt_ns`` is
    :func:`~hdl.protocol.timestamp_age_ns` of the echoed timestamp (a multiple of 8 ns).
    ``svc_time`` is 0 (an EETH carries no service time) and ``rtt_adjusted_ns`` equals
    ``rtt_ns``; both stay for the register map's result layout."""
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


def _wire_timestamp(now_ns):
    """:func:`hdl.protocol.wire_timestamp` as logic."""
    return now_ns[P.TIMESTAMP_SHIFT:P.TIMESTAMP_SHIFT + P.TIMESTAMP_BITS]


class ProbeResponder(wiring.Component):
    """Answer every EV probe (ENDPOINT_REQUEST, ERTH op EV_PROBE) with an ENDPOINT_RESPONSE
    header. One packet per cycle (II = 1), one cycle of latency.

    The response goes back out of the port the request came in by, to the addresses it came
    from (Ethernet and IP source and destination swapped, same VLAN tag), with the request's
    UDP source port and flow label, so in STEV and UDP format modes it returns on the EV it
    was sent on. It is never SRv6-encapsulated: it is addressed to the requester's inner IP
    address (*project choice*). BTH: opcode ENDPOINT_RESPONSE, the request's partition key,
    ``dqpn`` the endpoint QP, ``psn[15:0]`` the request's id. The EETH has op EV_PROBE and
    echoes the ERTH's ``tx_timestamp``.

    Anything else (data, SACKs, endpoint requests of another op or QP, responses) is accepted
    and dropped, counted per packet in ``dropped``.

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
        Unused (the response echoes the requester's timestamp); kept for the NIC's wiring.
    answered : ``Out(32)``
        Probe requests answered (wraps).
    dropped : ``Out(32)``
        Packets that were not EV probe requests (wraps).
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
        erth = request.ctl.erth
        is_request = ((request.kind == PacketKind.EP_REQUEST)
                      & (request.bth.opcode == P.Opcode.ENDPOINT_REQUEST)
                      & (request.bth.dqpn == P.ENDPOINT_QPN)
                      & (erth.op == P.EndpointOp.EV_PROBE))

        can_load = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(~(self.i.p.first & is_request) | can_load)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.If(self.i.valid & self.i.ready & self.i.p.first):
            with m.If(is_request):
                m.d.sync += [
                    self.o.valid.eq(1),
                    self.answered.eq(self.answered + 1),
                    self.o.p.eq(0),
                    self.o.p.first.eq(1),
                    self.o.p.last.eq(1),
                    response.kind.eq(PacketKind.EP_RESPONSE),
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
                    response.bth.opcode.eq(P.Opcode.ENDPOINT_RESPONSE),
                    response.bth.pkey.eq(request.bth.pkey),
                    response.bth.dqpn.eq(P.ENDPOINT_QPN),
                    response.bth.psn.eq(request.bth.psn[:P.ENDPOINT_ID_BITS]),
                    response.ctl.eeth.op.eq(P.EndpointOp.EV_PROBE),
                    response.ctl.eeth.tx_timestamp.eq(erth.tx_timestamp),
                ]
            with m.Else():
                m.d.sync += self.dropped.eq(self.dropped + 1)
        return m


class ProbeRequester(wiring.Component):
    """Send EV probes through path selection and time their answers. II = 1 on both paths.

    Send: each ``cmd`` becomes a path request with ``probe`` set and ``ev`` the EV to probe
    (path selection skips its choice and may use an ASSUMED_BAD EV), one cycle of latency. It
    gets the next 16-bit id (a counter) and ``tx_ts`` = the wire timestamp of ``now_ns`` when
    the command is taken; the id's entry of a block-RAM table of ``2**PROBE_TABLE_BITS``
    entries (its low bits) remembers the whole id, the QP, the EV and software's ``probe_id``,
    replacing whatever probe held it. The transmit former puts the id in BTH.psn[15:0] and the
    timestamp in the ERTH. A command waits one cycle when an answer frees an entry in the same
    cycle (the table has one write port).

    Receive: two stages. In the cycle a beat is taken its entry is read; in the next an EV
    probe answer (ENDPOINT_RESPONSE, EETH op EV_PROBE) whose id names an outstanding probe
    frees the entry, writes a ``result`` (RTT from the echoed timestamp) into a FIFO of
    ``results`` entries, and gives a ``feedback`` of kind PROBE_OK for its EV one cycle after
    that. An answer whose id names no outstanding probe (never sent, already answered, or
    forgotten when its entry was reused) is dropped and counted in ``unknown_ids``; any other
    packet is dropped and counted in ``rx_dropped``. II = 1 while ``feedback`` is taken.

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
    sent, answered, rx_dropped, unknown_ids, results_dropped : ``Out(32)``
        Probes sent, answers timed, packets dropped, answers naming no outstanding probe,
        results dropped on a full result FIFO (each wraps).
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
            "unknown_ids": Out(32),
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
        entry_layout = data.StructLayout({
            "valid": 1, "id": P.ENDPOINT_ID_BITS, "qpn": config.qpn_bits,
            "ev": config.ev_index_bits, "probe_id": 32})
        m.submodules.table = table = Memory(shape=entry_layout, depth=1 << PROBE_TABLE_BITS,
                                            init=[])
        wp = table.write_port()
        rp = table.read_port(transparent_for=(wp,))
        next_id = Signal(P.ENDPOINT_ID_BITS)

        # -- receive, stage 1: the answer's table entry is read ------------------------------
        # A received beat is registered (r1) while its entry is read; stage 2 (the cycle after)
        # decides. The read is transparent to the write port, so an answer freeing an entry
        # is seen by the next answer read in the same cycle.
        header = self.rx.p.header
        r1_valid = Signal()
        r1_first = Signal()
        r1_response = Signal()
        r1_id = Signal(P.ENDPOINT_ID_BITS)
        r1_rtt = Signal(32)             # the RTT as of the cycle the answer is taken
        is_response = ((header.kind == PacketKind.EP_RESPONSE)
                       & (header.bth.opcode == P.Opcode.ENDPOINT_RESPONSE)
                       & (header.ctl.eeth.op == P.EndpointOp.EV_PROBE))
        entry = Signal(entry_layout)
        m.d.comb += entry.eq(rp.data)
        known = entry.valid & (entry.id == r1_id)
        timed = r1_valid & r1_first & r1_response & known

        # -- receive, stage 2: time the answer, free its entry, tell path selection -----------
        can_load = ~self.feedback.valid | self.feedback.ready
        r1_advance = ~timed | can_load
        m.d.comb += [
            self.rx.ready.eq(~r1_valid | r1_advance),
            rp.addr.eq(header.bth.psn[:PROBE_TABLE_BITS]),
            rp.en.eq(self.rx.ready),
        ]
        with m.If(self.rx.ready):
            m.d.sync += [
                r1_valid.eq(self.rx.valid),
                r1_first.eq(self.rx.p.first),
                r1_response.eq(is_response),
                r1_id.eq(header.bth.psn[:P.ENDPOINT_ID_BITS]),
                r1_rtt.eq(((_wire_timestamp(self.now_ns) - header.ctl.eeth.tx_timestamp)
                           [:P.TIMESTAMP_BITS]) << P.TIMESTAMP_SHIFT),
            ]
        with m.If(self.feedback.ready):
            m.d.sync += self.feedback.valid.eq(0)

        rtt = r1_rtt
        # The result goes straight into the FIFO in the cycle the answer is decided (or is
        # dropped and counted when the FIFO is full).
        result = Signal(result_layout)
        m.d.comb += [
            result.qpn.eq(entry.qpn), result.ev.eq(entry.ev), result.probe_id.eq(entry.probe_id),
            result.rtt_ns.eq(rtt), result.svc_time.eq(0), result.rtt_adjusted_ns.eq(rtt),
            results.w_data.eq(result),
        ]
        free = Signal()
        with m.If(r1_valid & r1_advance & r1_first):
            with m.If(timed):
                m.d.comb += [results.w_en.eq(1), free.eq(1)]
                with m.If(~results.w_rdy):
                    m.d.sync += self.results_dropped.eq(self.results_dropped + 1)
                m.d.sync += [
                    self.feedback.valid.eq(1),
                    self.answered.eq(self.answered + 1),
                    self.feedback.p.qpn.eq(entry.qpn),
                    self.feedback.p.ev.eq(entry.ev),
                    self.feedback.p.kind.eq(P.FeedbackKind.PROBE_OK),
                ]
            with m.Elif(r1_response):
                m.d.sync += self.unknown_ids.eq(self.unknown_ids + 1)
            with m.Else():
                m.d.sync += self.rx_dropped.eq(self.rx_dropped + 1)

        # -- send: one table write port, shared; freeing an answered entry goes first ---------
        m.d.comb += self.cmd.ready.eq(~free & (~self.o.valid | self.o.ready))
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        send = self.cmd.valid & self.cmd.ready
        with m.If(free):
            m.d.comb += [wp.addr.eq(r1_id[:PROBE_TABLE_BITS]), wp.en.eq(1), wp.data.eq(0)]
        with m.Elif(send):
            m.d.comb += [
                wp.addr.eq(next_id[:PROBE_TABLE_BITS]), wp.en.eq(1),
                wp.data.valid.eq(1), wp.data.id.eq(next_id), wp.data.qpn.eq(self.cmd.p.qpn),
                wp.data.ev.eq(self.cmd.p.ev), wp.data.probe_id.eq(self.cmd.p.probe_id),
            ]
        with m.If(send):
            m.d.sync += [
                self.o.valid.eq(1),
                self.sent.eq(self.sent + 1),
                next_id.eq(next_id + 1),
                self.o.p.qpn.eq(self.cmd.p.qpn),
                self.o.p.avoid_ev_valid.eq(0),
                self.o.p.avoid_ev.eq(0),
                self.o.p.probe.eq(1),
                self.o.p.ev.eq(self.cmd.p.ev),
                self.o.p.context.probe_id.eq(next_id),
                self.o.p.context.tx_ts.eq(_wire_timestamp(self.now_ns)),
            ]
        return m
