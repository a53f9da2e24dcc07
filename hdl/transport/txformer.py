"""Transmit former: turns path decisions into packet headers and fetches their payload.

Requests reach the former after path selection (``hdl/path/select.py``): each carries the
chosen EV, its port and expanded header fields, and a context from the block that asked for
the packet: the requester (a data packet) or the probe requester (an EV probe). A data packet
gets MRC 1.0's METH (the requester's message numbers), BTH.ts = 1 with a TSETH stamped with
the send time, BTH.rtx on a retransmission, RETH and ImmDt; an EV probe is an ENDPOINT_REQUEST
with an ERTH. The EV itself rides only where EV expansion put it (UDP source port, flow
label, SRv6). The former adds
what is per connection (destination QPN, MAC and IP, from a table indexed by QP) and per NIC
(source MAC and IP), fetches the payload from host memory, and streams header plus payload
to the header builder.
"""

import enum as py_enum

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import fetch_beat_layout, fetch_request_layout, path_decision_layout
from ..packet.headers import PORT_BITS, PacketKind, packet_beat_layout, packet_header_layout
from ..util import validating

__all__ = ["TxFormer", "TxCommand", "tx_context_layout", "tx_command_layout", "DATA_TCLASS",
           "DATA_HOP_LIMIT"]

#: Traffic class of every packet the NIC originates: DSCP 0, ECN ECT(0), so switches can mark
#: congestion (CE) instead of dropping.
DATA_TCLASS = 0b10
DATA_HOP_LIMIT = 64
_HEADER_FIFO_DEPTH = 8          # headers waiting for their payload from host memory


class TxCommand(py_enum.IntEnum):
    """Commands of :class:`TxFormer`'s ``ctl`` port."""
    CONN_WRITE = 0      #: qpn: dqpn, eth_dst, ip_dst of the QP's peer.
    LOCAL_WRITE = 1     #: the NIC's own eth (MAC) and ip; ``ipv6`` picks the IP version.


def tx_context_layout(send_context, probe_context):
    """The path-select context of a packet to send: a data packet or a probe."""
    return data.StructLayout({
        "probe": unsigned(1),
        "send": send_context,
        "probe_ctx": probe_context,
    })


def tx_command_layout(config):
    return data.StructLayout({
        "op": unsigned(2),
        "qpn": unsigned(config.qpn_bits),
        "dqpn": unsigned(P.QPN_BITS),
        "eth": unsigned(48),
        "ip": unsigned(128),
        "ipv6": unsigned(1),
    })


class TxFormer(wiring.Component):
    """Build data and probe packet headers from path decisions; fetch and attach payloads.

    One decision per cycle; a packet leaves as its payload arrives from ``fetch`` (one beat per
    cycle), in decision order. A decision with ``no_path`` (no usable EV) is not sent and is
    counted in ``no_path``; the requester's loss recovery resends it. A QP whose connection was
    never written sends to destination QPN/MAC/IP 0.

    Parameters
    ----------
    config : NicConfig
    send_context, probe_context : data.StructLayout
        Context layouts of the requester's and the probe requester's path requests. The send
        context has ``psn, opcode, ackreq, va, rkey, dma_len, imm, local_addr,
        retransmission, msn, rqmsn``; the probe context ``probe_id, tx_ts`` (16 bits each).

    Members
    -------
    i : ``In(stream.Signature(path_decision_layout(config, tx_context_layout(...))))``
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
    fetch_req : ``Out(stream.Signature(fetch_request_layout(config)))``
    fetch : ``In(stream.Signature(fetch_beat_layout(config)))``
    sent : ``Out(stream.Signature({qpn, psn, ev}))``: the EV each data PSN went out on.
    sent_port, sent_ts : ``Out``, with ``sent``: its port (0-based) and its send time in ns
        (the TSETH ``tx_timestamp`` is this time's :func:`~hdl.protocol.wire_timestamp`).
    ctl : ``In(stream.Signature(...))``, ctl_resp : ``Out(stream.Signature({errno}))``
    now_ns : ``In(32)``
    no_path : ``Out(32)``
    """

    def __init__(self, *, config, send_context, probe_context):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"config must be a NicConfig, not {config!r}")
        self._config = config
        self.context_layout = tx_context_layout(send_context, probe_context)
        super().__init__({
            "i": In(stream.Signature(path_decision_layout(config, self.context_layout))),
            "o": Out(stream.Signature(packet_beat_layout(config))),
            "fetch_req": Out(stream.Signature(fetch_request_layout(config))),
            "fetch": In(stream.Signature(fetch_beat_layout(config))),
            "sent": Out(stream.Signature(data.StructLayout({
                "qpn": unsigned(config.qpn_bits), "psn": unsigned(P.PSN_BITS),
                "ev": unsigned(config.ev_index_bits)}))),
            "ctl": In(stream.Signature(tx_command_layout(config))),
            "ctl_resp": Out(stream.Signature(data.StructLayout({"errno": P.Errno}))),
            "now_ns": In(32),
            "sent_port": Out(PORT_BITS),
            "sent_ts": Out(32),
            "no_path": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        config = self._config
        conn_layout = data.StructLayout({
            "dqpn": unsigned(P.QPN_BITS), "eth": unsigned(48), "ip": unsigned(128)})
        m.submodules.conn = conn = Memory(shape=conn_layout, depth=config.qps, init=[])
        conn_rd = conn.read_port(domain="sync")
        conn_wr = conn.write_port()
        local_eth = Signal(48)
        local_ip = Signal(128)
        local_ipv6 = Signal(init=int(config.ip_version == 6))

        # Control: one command per cycle, answered at once.
        resp_pending = Signal()
        m.d.comb += [
            self.ctl.ready.eq(~resp_pending | self.ctl_resp.ready),
            self.ctl_resp.valid.eq(resp_pending),
            conn_wr.addr.eq(self.ctl.p.qpn),
            conn_wr.data.dqpn.eq(self.ctl.p.dqpn),
            conn_wr.data.eth.eq(self.ctl.p.eth),
            conn_wr.data.ip.eq(self.ctl.p.ip),
        ]
        with m.If(self.ctl_resp.ready):
            m.d.sync += resp_pending.eq(0)
        with m.If(self.ctl.valid & self.ctl.ready):
            m.d.sync += resp_pending.eq(1)
            with m.Switch(self.ctl.p.op):
                with m.Case(TxCommand.CONN_WRITE):
                    m.d.comb += conn_wr.en.eq(1)
                    m.d.sync += self.ctl_resp.p.errno.eq(P.Errno.OK)
                with m.Case(TxCommand.LOCAL_WRITE):
                    m.d.sync += [local_eth.eq(self.ctl.p.eth), local_ip.eq(self.ctl.p.ip),
                                 local_ipv6.eq(self.ctl.p.ipv6),
                                 self.ctl_resp.p.errno.eq(P.Errno.OK)]
                with m.Default():
                    m.d.sync += self.ctl_resp.p.errno.eq(P.Errno.EINVAL)

        # Stage B: the decision with its connection entry (read during the accept).
        b_valid = Signal()
        b = Signal.like(self.i.payload)
        header = Signal(packet_header_layout(config))
        has_payload = Signal()
        is_probe = b.context.probe
        send = b.context.send
        probe = b.context.probe_ctx
        entry = conn_rd.data
        f = b.fields
        # The 16-bit wire timestamp of now (TSETH): P.wire_timestamp as logic.
        wire_timestamp = self.now_ns[P.TIMESTAMP_SHIFT:P.TIMESTAMP_SHIFT + P.TIMESTAMP_BITS]
        m.d.comb += [
            header.port.eq(b.port),
            header.eth_dst.eq(entry.eth),
            header.eth_src.eq(local_eth),
            header.ipv6.eq(local_ipv6),
            header.ip_src.eq(local_ip),
            header.ip_dst.eq(entry.ip),
            header.tclass.eq(DATA_TCLASS),
            header.flow_label.eq(f.flow_label),
            header.hop_limit.eq(DATA_HOP_LIMIT),
            header.srv6_valid.eq(f.srv6_valid),
            header.srv6_src.eq(local_ip),
            header.srv6_dst.eq(f.srv6_dst),
            header.srh_valid.eq(f.srh_valid),
            header.srh_segment.eq(f.srh_segment),
            header.udp_sport.eq(f.udp_sport),
            header.bth.pkey.eq(P.BTH_DEFAULT_PKEY),
            header.bth.dqpn.eq(entry.dqpn),
        ]
        with m.If(is_probe):
            # An EV probe: ENDPOINT_REQUEST to the endpoint QP, its id in BTH.psn[15:0].
            m.d.comb += [
                header.kind.eq(PacketKind.EP_REQUEST),
                header.bth.opcode.eq(P.Opcode.ENDPOINT_REQUEST),
                header.bth.dqpn.eq(P.ENDPOINT_QPN),
                header.bth.psn.eq(probe.probe_id),
                header.ctl.erth.op.eq(P.EndpointOp.EV_PROBE),
                header.ctl.erth.tx_timestamp.eq(probe.tx_ts),
                header.ctl.erth.ftype.eq(P.Ftype.TIMESTAMP),
            ]
        with m.Else():
            m.d.comb += [
                header.kind.eq(PacketKind.DATA),
                header.payload_len.eq(send.dma_len),
                header.bth.opcode.eq(send.opcode),
                header.bth.ackreq.eq(send.ackreq),
                header.bth.rtx.eq(send.retransmission),
                header.bth.ts.eq(1),
                header.bth.psn.eq(send.psn),
                header.meth.msn.eq(send.msn),
                header.meth.rqmsn.eq(send.rqmsn),
                header.tseth.tx_timestamp.eq(wire_timestamp),
                header.tseth.ftype.eq(P.Ftype.TIMESTAMP),
                header.reth.va.eq(send.va),
                header.reth.rkey.eq(send.rkey),
                header.reth.dma_len.eq(send.dma_len),
                header.immdt.imm.eq(send.imm),
                has_payload.eq(send.dma_len != 0),
            ]

        fifo_layout = data.StructLayout({"header": packet_header_layout(config),
                                         "has_payload": unsigned(1)})
        m.submodules.headers = headers = SyncFIFOBuffered(
            width=fifo_layout.size, depth=_HEADER_FIFO_DEPTH)
        data_packet = ~is_probe & ~b.no_path
        need_fetch = data_packet & has_payload
        fetch_ok = ~need_fetch | self.fetch_req.ready
        sent_ok = ~data_packet | self.sent.ready
        b_moves = b_valid & (b.no_path | (headers.w_rdy & fetch_ok & sent_ok))
        m.d.comb += [
            headers.w_data.eq(Cat(header, has_payload)),
            headers.w_en.eq(b_valid & ~b.no_path & fetch_ok & sent_ok),
            self.fetch_req.valid.eq(b_valid & need_fetch & headers.w_rdy & sent_ok),
            self.fetch_req.p.addr.eq(send.local_addr),
            self.fetch_req.p.length.eq(send.dma_len),
            self.sent.valid.eq(b_valid & data_packet & headers.w_rdy & fetch_ok),
            self.sent.p.qpn.eq(b.qpn),
            self.sent.p.psn.eq(send.psn),
            self.sent.p.ev.eq(b.ev),
            self.sent_port.eq(b.port),
            self.sent_ts.eq(self.now_ns),
        ]
        with m.If(b_moves & b.no_path):
            m.d.sync += self.no_path.eq(self.no_path + 1)

        accept = self.i.valid & (~b_valid | b_moves)
        m.d.comb += [
            self.i.ready.eq(~b_valid | b_moves),
            conn_rd.addr.eq(self.i.p.qpn),
            conn_rd.en.eq(accept),
        ]
        with m.If(accept):
            m.d.sync += [b.eq(self.i.payload), b_valid.eq(1)]
        with m.Elif(b_moves):
            m.d.sync += b_valid.eq(0)

        # Stage C: header plus fetched payload beats.
        out = Signal(fifo_layout)
        first = Signal(init=1)
        m.d.comb += [
            out.eq(headers.r_data),
            self.o.p.header.eq(out.header),
            self.o.p.first.eq(first),
        ]
        with m.If(headers.r_rdy):
            with m.If(out.has_payload):
                m.d.comb += [
                    self.o.valid.eq(self.fetch.valid),
                    self.o.p.data.eq(self.fetch.p.data),
                    self.o.p.keep.eq(self.fetch.p.keep),
                    self.o.p.last.eq(self.fetch.p.last),
                    self.fetch.ready.eq(self.o.ready),
                ]
            with m.Else():
                m.d.comb += [self.o.valid.eq(1), self.o.p.last.eq(1)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += first.eq(self.o.p.last)
            with m.If(self.o.p.last):
                m.d.comb += headers.r_en.eq(1)
        return m
