"""The responder's reply stage: SACK, NACK and NAK headers from the execute stage's decision.

The execute stage (:mod:`hdl.transport.responder`) decides which reply a packet gets and
registers it as a :func:`~hdl.transport.resp_layouts.reply_layout` (a few fields, not a
header); :class:`ReplyStage` finishes the fields that depend on the step's advance, builds
the header and cuts the SACK bitmap out of the receive bitmap.
"""

from types import SimpleNamespace

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import shift_right, validating
from .resp_defs import ACK_HOP_LIMIT, ACK_TCLASS
from .resp_layouts import reply_layout

__all__ = ["ReplyStage", "reply_fields", "reply_beat"]


def reply_fields(m, config, reply, *, name):
    """The fields of a registered ``reply`` that depend on its step's advance: ``cack``
    (expected PSN after the step - 1), ``ack_psn_offset``, ``sack_psn_offset`` and the
    ``shift`` of the receive bitmap its SACK bitmap starts at. Adders of the advance (at most
    CHUNK) and compares of 5 bits, nothing wider."""
    advance = reply.advance
    shift_bits = ceil_log2(config.window_psns + 1)
    fields = SimpleNamespace(
        cack=Signal(24, name=f"{name}_cack"),
        ack_psn_offset=Signal(16, name=f"{name}_ack_psn_offset"),
        sack_psn_offset=Signal(16, name=f"{name}_sack_psn_offset"),
        shift=Signal(shift_bits, name=f"{name}_shift"),
    )
    aligned = Signal(name=f"{name}_aligned")
    m.d.comb += [
        fields.cack.eq(reply.epsn + advance - 1),
        aligned.eq(~reply.probe & (reply.far | (reply.near_lo & (advance <= reply.lo_max)) |
                                   (reply.near_hi & (advance >= reply.hi_min)))),
        # trigger - cack_psn = dist + 1 - advance
        fields.ack_psn_offset.eq(Mux(reply.probe, reply.probe_id,
                                     (reply.dist[:16] + 1 - advance)[:16])),
        fields.sack_psn_offset.eq(Mux(aligned, (reply.block_shift + 1 - advance)[:16], 1)),
        fields.shift.eq(Mux(aligned, reply.block_shift[:shift_bits], advance)),
    ]
    return fields


def reply_beat(m, config, reply, *, name, fields=None):
    """The reply packet (SACK bitmap 0) that the registered decision ``reply`` stands for
    (``fields``: its :func:`reply_fields`, made here if not given)."""
    if fields is None:
        fields = reply_fields(m, config, reply, name=f"{name}_f")
    beat = Signal(packet_beat_layout(config), name=name)
    tmpl, r = reply.tmpl, beat.header
    seth, cc_state, neth = r.ctl.sack.seth, r.ctl.sack.cc_state, r.ctl.neth
    # The EV the trigger arrived with: UDP source port, IPv6 flow label (low 16 bits).
    entropy = Cat(tmpl.udp_sport, Mux(tmpl.ipv6, tmpl.flow_label[:16], 0))
    m.d.comb += [
        beat.first.eq(1), beat.last.eq(1),
        r.kind.eq(reply.kind),
        r.port.eq(tmpl.port),
        r.eth_dst.eq(tmpl.eth_src), r.eth_src.eq(tmpl.eth_dst),
        r.vlan_valid.eq(tmpl.vlan_valid), r.vlan_tci.eq(tmpl.vlan_tci),
        r.ipv6.eq(tmpl.ipv6), r.ip_src.eq(tmpl.ip_dst), r.ip_dst.eq(tmpl.ip_src),
        r.tclass.eq(ACK_TCLASS), r.flow_label.eq(tmpl.flow_label),
        r.hop_limit.eq(ACK_HOP_LIMIT), r.udp_sport.eq(tmpl.udp_sport),
        r.bth.pkey.eq(P.BTH_DEFAULT_PKEY), r.bth.dqpn.eq(reply.dqpn),
    ]
    with m.If(reply.kind == PacketKind.NACK):
        m.d.comb += [
            r.bth.opcode.eq(int(P.Opcode.RELIABILITY_NACK)),
            r.bth.psn.eq(tmpl.psn),
            neth.nack_reason.eq(reply.nack_reason), neth.entropy.eq(entropy),
            neth.nack_psn.eq(tmpl.psn), neth.tx_timestamp.eq(tmpl.tx_ts),
        ]
    with m.Elif(reply.kind == PacketKind.AETH):
        m.d.comb += [
            r.bth.opcode.eq(int(P.Opcode.ACKNOWLEDGE)),
            r.bth.psn.eq(tmpl.psn),
            r.aeth.syndrome.eq(P.AETH_NAK_BASE | reply.nak_code),
            r.aeth.msn.eq(reply.msn),
        ]
    with m.Else():
        m.d.comb += [
            r.bth.opcode.eq(int(P.Opcode.RELIABILITY_SACK)),
            r.bth.psn.eq(fields.cack),
            seth.m.eq(Mux(tmpl.ce, P.SackMark.SKIP_ONCE, P.SackMark.NONE)),
            seth.pr.eq(reply.probe),
            seth.ack_psn_offset.eq(fields.ack_psn_offset),
            seth.entropy.eq(entropy),
            seth.cack_psn.eq(fields.cack),
            seth.mpr.eq(reply.mpr),
            seth.sack_psn_offset.eq(fields.sack_psn_offset),
            cc_state.tx_timestamp.eq(tmpl.tx_ts),
            cc_state.ooo_count.eq(reply.ooo_count),
            cc_state.rcvd_bytes.eq(reply.rcvd_bytes),
        ]
    return beat


class ReplyStage(wiring.Component):
    """The reply stage (SACK, NACK and NAK generation): finishes the fields of the execute
    stage's registered decision, builds the reply header, cuts a SACK's 64-bit bitmap out of
    the receive bitmap and registers the reply for the header builder.

    Latency two cycles (``i`` taken -> ``o.valid``): the decision is registered (``held``: its
    kind, the trigger and a few fields, not a whole header), then the advance-dependent fields
    are finished (adders and compares of at most 5-bit operands, ``reply_fields``), the header
    built, the bitmap cut (the low 64 bits of ``rcv >> shift``, a window-wide shift) and the
    reply registered again in ``o``. Throughput one reply per cycle: ``i.ready`` is high
    while ``held`` is empty or moves on to ``o`` this cycle. NACKs and NAKs carry no bitmap.
    Hazards: none; the stage keeps no state besides its two registers (``busy``), and a
    reply is never dropped.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(stream.Signature(reply_layout(config)))``
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
    busy : ``Out(1)``
        A reply is held (in either register).
    """

    def __init__(self, *, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
        self._config = config
        # The held decision, made here so that Responder(observe=True) can read it.
        self._held = Signal(reply_layout(config), name="held", reset_less=True)
        self._held_valid = Signal(name="held_valid")
        super().__init__({
            "i": In(stream.Signature(reply_layout(config))),
            "o": Out(stream.Signature(packet_beat_layout(config))),
            "busy": Out(1),
        })

    @property
    def held(self):
        """The registered decision (for the responder's observation ports)."""
        return self._held

    @property
    def held_valid(self):
        return self._held_valid

    def elaborate(self, platform):
        m = Module()
        held, held_valid = self._held, self._held_valid
        o_room = ~self.o.valid | self.o.ready
        m.d.comb += [self.i.ready.eq(~held_valid | o_room),
                     self.busy.eq(held_valid | self.o.valid)]
        with m.If(self.i.ready):
            m.d.sync += [held_valid.eq(self.i.valid), held.eq(self.i.payload)]

        reply = Signal(packet_beat_layout(self._config))
        fields = reply_fields(m, self._config, held, name="held")
        bitmap = shift_right(m, held.rcv, fields.shift, name="sack")
        m.d.comb += reply.eq(reply_beat(m, self._config, held, name="held_beat",
                                        fields=fields))
        with m.If(held.kind == PacketKind.SACK):
            m.d.comb += reply.header.ctl.sack.seth.sack_bitmap.eq(bitmap[:P.SACK_BITMAP_BITS])
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        # The payload is loaded whenever the register may change, whether or not a reply
        # comes: its enable does not wait on the decision.
        with m.If(o_room):
            m.d.sync += self.o.payload.eq(reply)
        with m.If(held_valid & o_room):
            m.d.sync += self.o.valid.eq(1)
        return m
