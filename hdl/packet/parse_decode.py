"""The receive parser's decode stages: header windows at the frame's stack offsets (D1,
:class:`ParseWindows`), then, side by side, the parsed header (D2, :class:`ParseFields`) and
the check bits and lengths (D2, :class:`ParseChecks`)."""

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import REPLICA_TAG, chunks, onehot_select, validating
from . import layouts as L
from .headers import PacketKind, opcode_kind, packet_header_layout
from .parse_defs import (
    DOT1Q,
    ETHERNET,
    ETHERNET_MIN_FRAME,
    FLAG_NAMES,
    IPV4,
    IPV6,
    L4_WINDOW,
    MODE_PLAIN,
    MODE_SRH,
    SRH,
    SRH_ONE_SEGMENT_LEN,
    STACKS,
    TRANSPORT_SIZE,
    UDP,
    ParserGeometry,
    checks_layout,
    field_offset,
    frame_layout,
    windows_layout,
    wire_bytes,
    wire_field,
)

__all__ = ["ParseWindows", "ParseFields", "ParseChecks"]

# Offsets in the L4 window (it starts at the UDP header).
BTH_AT = UDP.size
EXT_AT = UDP.size + L.BTH.size              # transport headers after the BTH
RETH_AT = EXT_AT + L.METH.size              # the RETH follows the METH (and a TSETH with ts)


def _v4_field(window, name):
    return wire_field(window, IPV4, name)


def _v6_field(window, name):
    return wire_field(window, IPV6, name)


class _Windows:
    """The D1 windows of a :func:`windows_layout` register as byte lists, and the facts both
    D2 components derive from them."""

    def __init__(self, m, d1):
        self.eth = wire_bytes(d1.eth, DOT1Q.size)
        self.outer = wire_bytes(d1.outer, IPV6.size)
        self.srh = wire_bytes(d1.srh, SRH.size)
        self.inner = wire_bytes(d1.inner, IPV6.size)
        self.l4 = wire_bytes(d1.l4, L4_WINDOW)
        self.mode = d1.stack[2:4]
        self.inner_v4 = d1.stack[1]
        self.srv6 = self.mode != MODE_PLAIN
        self.kind_data = d1.kind == PacketKind.DATA
        # A TSETH follows the METH of a data packet with BTH.ts (ts means nothing elsewhere).
        self.data_ts = Signal()
        m.d.comb += self.data_ts.eq(self.kind_data & wire_field(self.l4, L.BTH, "ts", BTH_AT))
        self.tclass = Mux(self.inner_v4, _v4_field(self.inner, "tos"),
                          _v6_field(self.inner, "tclass"))


#: Window bits selected by one copy of D1a's one-hot stack register.
REPLICA_BITS = 64


class ParseWindows(wiring.Component):
    """Cut the header windows (Ethernet, first IP header, SRH, inner IP header, UDP onwards)
    out of the capture of a frame that ended at the offsets of its stack, and classify its
    opcode.

    Two stages: D1a takes the capture and shifts an 802.1Q frame's back by the tag (every
    offset of a tagged stack is its untagged twin's plus the tag), so D1 selects among the six
    untagged stacks' offsets only. The windows are an AND-OR select by a one-hot register; the
    opcode is decoded at each stack's BTH position and the small result selected likewise (a
    decoder behind the window select would be slower).

    Latency: two cycles (``o`` is D1; its registers, and D1a's, load every cycle, ``o.valid``
    follows ``i.valid`` two cycles later and says when they hold a frame). Throughput: one
    frame per cycle. Hazards: ``i.hot`` must have exactly one bit set (every stack code is in
    ``STACKS``); ``i.cap`` is read only in the cycle ``i.valid`` is set.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(frame_layout(geometry))``
        The frame that ended (D0); its capture is valid while ``i.valid`` is set.
    o : ``Out(windows_layout(geometry))``
        The windows, the opcode class, the frame's length facts.
    """

    def __init__(self, *, config):
        with validating(self):
            self._geometry = ParserGeometry.of(config)
        super().__init__({
            "i": In(frame_layout(self._geometry)),
            "o": Out(windows_layout(self._geometry)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        d0, d1 = self.i, self.o
        # Every offset of an 802.1Q stack is its untagged twin's plus the tag: D1a shifts a
        # tagged frame's capture back by the tag, so that D1 selects among the six untagged
        # stacks' offsets only. The select is the widest crossbar of the parser (every window
        # bit from a byte at any stack's offset); split over two stages, each half of it has
        # a cycle of its own.
        tag = DOT1Q.size - ETHERNET.size
        untagged = [s for s in STACKS if not s.vlan]
        twin = {s: next(t for t in STACKS if t.vlan and (t.mode, t.inner_v4) ==
                        (s.mode, s.inner_v4)) for s in untagged}
        for s, t in twin.items():
            assert (t.l3, t.x, t.u, t.t) == (s.l3 + tag, s.x + tag, s.u + tag, s.t + tag)
        index = {s: k for k, s in enumerate(STACKS)}

        # D1a: registers load every cycle, without an enable (``valid`` travels beside them).
        a = Signal(frame_layout(g))
        a_eth = Signal(8 * DOT1Q.size)
        a_hot = Signal(len(untagged))       # the untagged stack (or its tagged twin), one-hot
        a_hot_next = Cat(d0.hot[index[s]] | d0.hot[index[twin[s]]] for s in untagged)
        cap_bits = g.cap_beats * g.data_width
        m.d.sync += [
            a.eq(d0),
            a.cap.eq(Mux(d0.flags.vlan, d0.cap[8 * tag:], d0.cap[:cap_bits])),
            a_eth.eq(d0.cap[:8 * DOT1Q.size]),
            a_hot.eq(a_hot_next),
        ]

        # D1: registers load every cycle as well.
        cap_bytes = wire_bytes(a.cap, g.cap_beats * g.lanes)
        m.d.sync += [
            d1.valid.eq(a.valid),
            d1.eth.eq(a_eth),
            d1.len.eq(a.len),
            d1.too_long.eq(a.len > g.max_frame),
            d1.stack.eq(a.stack),
            d1.port.eq(a.port),
            d1.start.eq(a.start),
            d1.end.eq(a.end),
        ]
        m.d.sync += [d1.flags[name].eq(a.flags[name]) for name in FLAG_NAMES]
        with m.Switch(Cat(a.flags.vlan, a.flags.v4)):
            for vlan in (0, 1):
                for v4 in (0, 1):
                    with m.Case(vlan | v4 << 1):
                        before = (DOT1Q.size if vlan else ETHERNET.size) + (0 if v4 else IPV6.size)
                        m.d.sync += d1.ip_room.eq(a.len - before)

        def window(offset, size):
            return Cat(*cap_bytes[offset:offset + size])

        opcode_at = field_offset(L.BTH, "opcode")
        opcode_class = {}
        for s in untagged:
            code = Signal(5, name=f"opcode_class_{s.code}")    # Cat(ok, imm, kind)
            opcode_class[s.code] = code
            with m.Switch(cap_bytes[s.t + opcode_at]):
                for op in sorted(P.SUPPORTED_OPCODES):
                    kind = opcode_kind(op)
                    with m.Case(op):
                        m.d.comb += code.eq(Cat(Const(1, 1),
                                                Const(op in P.IMMEDIATE_OPCODES, 1),
                                                Const(kind.value, 3)))
        # The select's one-hot drives every window bit: each chunk of REPLICA_BITS window bits
        # reads its own copy of it (named with ``REPLICA_TAG``: the board builds keep such
        # copies apart), so no select net fans out across the chip.
        def select(target, values):
            target = Value.cast(target)
            for lo, hi in chunks(len(target), REPLICA_BITS):
                replica = Signal(len(untagged), name=f"a_hot{REPLICA_TAG}{len(replicas)}")
                replicas.append(replica)
                m.d.sync += [
                    replica.eq(a_hot_next),
                    target[lo:hi].eq(onehot_select(replica, [v[lo:hi] for v in values])),
                ]

        replicas = []
        select(d1.outer, [window(s.l3, IPV6.size) for s in untagged])
        select(d1.srh, [window(s.l3 + IPV6.size, SRH.size) for s in untagged])
        select(d1.inner, [window(s.x, IPV6.size) for s in untagged])
        select(d1.l4, [window(s.u, L4_WINDOW) for s in untagged])
        m.d.sync += Cat(d1.opcode_ok, d1.imm, d1.kind.as_value()).eq(
            onehot_select(a_hot, [opcode_class[s.code] for s in untagged]))
        return m


class ParseFields(wiring.Component):
    """Fill the parsed header from the D1 windows.

    Every field comes from the header tables through ``field_slices``; members that do not
    apply to the packet's kind or stack are 0 (the control headers share a union: only the
    kind's member is filled). ``payload_len`` is left 0: the verdict stage fills it in.

    Latency: one cycle (``o`` is the D2 header, loaded every cycle; it belongs to a frame when
    ``i.valid`` was set a cycle earlier). Throughput: one frame per cycle. Hazards: the header
    of a frame that fails its checks is garbage; only the verdict says which headers count.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(windows_layout(geometry))``
    trim_dscp : ``In(6)``
    o : ``Out(packet_header_layout(config))``
    """

    def __init__(self, *, config):
        with validating(self):
            self._geometry = ParserGeometry.of(config)
        self._config = config
        super().__init__({
            "i": In(windows_layout(self._geometry)),
            "trim_dscp": In(6),
            "o": Out(packet_header_layout(config)),
        })

    def elaborate(self, platform):
        m = Module()
        d1 = self.i
        w = _Windows(m, d1)
        eth, outer, srh, inner, l4 = w.eth, w.outer, w.srh, w.inner, w.l4
        vlan = d1.flags.vlan
        inner_v4, data_ts = w.inner_v4, w.data_ts
        # The header register loads every cycle, without an enable: the frame's ``valid``
        # travels beside it (an enable would fan out to every header bit).
        d2m = m

        hdr = Signal(packet_header_layout(self._config))
        tx = EXT_AT
        d2m.d.comb += [
            hdr.kind.eq(d1.kind),
            hdr.trimmed.eq(w.kind_data & (w.tclass[2:] == self.trim_dscp)),
            hdr.port.eq(d1.port),
            hdr.eth_dst.eq(wire_field(eth, ETHERNET, "dst")),
            hdr.eth_src.eq(wire_field(eth, ETHERNET, "src")),
            hdr.vlan_valid.eq(vlan),
            hdr.vlan_tci.eq(Mux(vlan, wire_field(eth, DOT1Q, "tci"), 0)),
            hdr.ipv6.eq(~inner_v4),
            hdr.ip_src.eq(Mux(inner_v4, _v4_field(inner, "src"), _v6_field(inner, "src"))),
            hdr.ip_dst.eq(Mux(inner_v4, _v4_field(inner, "dst"), _v6_field(inner, "dst"))),
            hdr.tclass.eq(w.tclass),
            hdr.flow_label.eq(Mux(inner_v4, 0, _v6_field(inner, "flow_label"))),
            hdr.hop_limit.eq(Mux(inner_v4, _v4_field(inner, "ttl"),
                                 _v6_field(inner, "hop_limit"))),
            hdr.srv6_valid.eq(w.srv6),
            hdr.udp_sport.eq(wire_field(l4, UDP, "sport")),
        ]
        with d2m.If(w.srv6):
            d2m.d.comb += [hdr.srv6_src.eq(_v6_field(outer, "src")),
                           hdr.srv6_dst.eq(_v6_field(outer, "dst"))]
        with d2m.If(w.mode == MODE_SRH):
            d2m.d.comb += [hdr.srh_valid.eq(1),
                           hdr.srh_segment.eq(wire_field(srh, SRH, "segment"))]
        for f in L.BTH.fields:
            d2m.d.comb += hdr.bth[f.name].eq(wire_field(l4, L.BTH, f.name, BTH_AT))
        with d2m.If(w.kind_data):
            for f in L.METH.fields:
                d2m.d.comb += hdr.meth[f.name].eq(wire_field(l4, L.METH, f.name, tx))
            with d2m.If(data_ts):
                for f in L.TSETH.fields:
                    d2m.d.comb += hdr.tseth[f.name].eq(wire_field(l4, L.TSETH, f.name,
                                                                  tx + L.METH.size))
            # RETH and ImmDt sit one TSETH further with BTH.ts.
            for header, member, at in ((L.RETH, hdr.reth, RETH_AT),
                                       (L.IMMDT, hdr.immdt, RETH_AT + L.RETH.size)):
                for f in header.fields:
                    value = Mux(data_ts, wire_field(l4, header, f.name, at + L.TSETH.size),
                                wire_field(l4, header, f.name, at))
                    if header is L.IMMDT:
                        value = Mux(d1.imm, value, 0)
                    d2m.d.comb += member[f.name].eq(value)
        with d2m.If(d1.kind == PacketKind.AETH):
            for f in L.AETH.fields:
                d2m.d.comb += hdr.aeth[f.name].eq(wire_field(l4, L.AETH, f.name, tx))
        # Control headers: the union member of the kind (the others overlap it).
        control = (
            (PacketKind.SACK, ((L.SETH, hdr.ctl.sack.seth, tx),
                               (L.CC_STATE, hdr.ctl.sack.cc_state, tx + L.SETH.size))),
            (PacketKind.NACK, ((L.NETH, hdr.ctl.neth, tx),)),
            (PacketKind.RPROBE, ((L.PETH, hdr.ctl.peth, tx),)),
            (PacketKind.EP_REQUEST, ((L.ERTH, hdr.ctl.erth, tx),)),
            (PacketKind.EP_RESPONSE, ((L.EETH, hdr.ctl.eeth, tx),)),
        )
        with d2m.Switch(d1.kind):
            for kind, parts in control:
                with d2m.Case(kind):
                    for header, member, at in parts:
                        for f in header.fields:
                            d2m.d.comb += member[f.name].eq(wire_field(l4, header, f.name, at))
        d2m.d.sync += self.o.eq(hdr)
        return m


class ParseChecks(wiring.Component):
    """Register the check bits that follow from field values, the lengths relative to the
    first IP header, where the payload starts, and the IPv4 checksum's first adder level.

    Lengths: the first IP packet's length from its header (``ip_len``); where the inner IP
    packet and the UDP datagram say they end; where the transport headers and the ICRC end
    (``need``), from the stack, kind, immediate flag and BTH.ts; the ends of the inner IP
    header, UDP header and BTH (for RUNT). The verdict compares them with each other.

    Latency: one cycle (``o`` is D2, loaded when ``i.valid``; ``o.valid`` follows
    ``i.valid``). Throughput: one frame per cycle. Hazards: check bits of headers the frame
    does not reach, or that a failed earlier check makes meaningless, are garbage: the
    verdict's priority order decides which count.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(windows_layout(geometry))``
    trim_dscp : ``In(6)``
    o : ``Out(checks_layout(geometry))``
    """

    def __init__(self, *, config):
        with validating(self):
            self._geometry = ParserGeometry.of(config)
        super().__init__({
            "i": In(windows_layout(self._geometry)),
            "trim_dscp": In(6),
            "o": Out(checks_layout(self._geometry)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        d1, d2 = self.i, self.o
        w = _Windows(m, d1)
        outer, srh, inner, l4 = w.outer, w.srh, w.inner, w.l4
        vlan, v4, v6 = d1.flags.vlan, d1.flags.v4, d1.flags.v6
        inner_v4, srv6, kind_data, data_ts = w.inner_v4, w.srv6, w.kind_data, w.data_ts
        d2m = Module()
        m.submodules.d2 = EnableInserter(d1.valid)(d2m)
        m.d.sync += d2.valid.eq(d1.valid)
        d2m.d.sync += [d2.too_long.eq(d1.too_long), d2.start.eq(d1.start), d2.end.eq(d1.end)]

        def v4_header_bad(window_):
            return ((_v4_field(window_, "version") != 4) | (_v4_field(window_, "ihl") != 5) |
                    _v4_field(window_, "mf") | (_v4_field(window_, "frag_offset") != 0))

        # The first IP header's length field: IPv4 total length, IPv6 payload length.
        outer_len_field = Mux(v4, _v4_field(outer, "total_length"),
                              _v6_field(outer, "payload_length"))
        outer_len = Signal(17)      # bytes of the first IP packet, from its header
        d2m.d.comb += outer_len.eq(outer_len_field + Mux(v4, 0, IPV6.size))
        outer_nh = _v6_field(outer, "next_header")
        srh_nh = wire_field(srh, SRH, "next_header")
        inner_proto = Mux(inner_v4, _v4_field(inner, "protocol"),
                          _v6_field(inner, "next_header"))
        udp_len = wire_field(l4, UDP, "length")
        dma_len = Mux(data_ts, wire_field(l4, L.RETH, "dma_len", RETH_AT + L.TSETH.size),
                      wire_field(l4, L.RETH, "dma_len", RETH_AT))

        c = d2.bits
        n = d1.len
        l3 = Mux(vlan, DOT1Q.size, ETHERNET.size)
        outer_hdr = Mux(v4, IPV4.size, IPV6.size)
        # A frame of exactly the Ethernet minimum may carry padding after the IP packet.
        pad = (n == ETHERNET_MIN_FRAME) & (
            outer_len_field < ETHERNET_MIN_FRAME - l3 - Mux(v4, 0, IPV6.size))
        d2m.d.sync += [
            c.runt_eth.eq(n < ETHERNET.size),
            c.runt_vlan.eq(vlan & (n < DOT1Q.size)),
            c.bad_ethertype.eq(~v4 & ~v6),
            c.runt_ip.eq(n < l3 + outer_hdr),
            c.bad_ip_header.eq(Mux(v4, v4_header_bad(outer),
                                   _v6_field(outer, "version") != 6)),
            c.outer_len_bad.eq((v4 & (outer_len < IPV4.size)) |
                               ~((outer_len_field == d1.ip_room) | pad)),
            c.bad_ip_protocol.eq(Mux(v4, _v4_field(outer, "protocol") != P.IP_PROTO_UDP,
                                     ~outer_nh.matches(P.IP_PROTO_UDP, P.IP_PROTO_IPV6,
                                                       P.IP_PROTO_IPV4,
                                                       P.IP_PROTO_ROUTING))),
            c.bad_srh.eq((wire_field(srh, SRH, "routing_type") != P.SRH_ROUTING_TYPE) |
                         (wire_field(srh, SRH, "hdr_ext_len") != SRH_ONE_SEGMENT_LEN) |
                         ~srh_nh.matches(P.IP_PROTO_IPV6, P.IP_PROTO_IPV4)),
            c.bad_inner_header.eq(Mux(inner_v4, v4_header_bad(inner),
                                      _v6_field(inner, "version") != 6)),
            c.inner_tl_short.eq(inner_v4 & (_v4_field(inner, "total_length") < IPV4.size)),
            c.bad_inner_protocol.eq(inner_proto != P.IP_PROTO_UDP),
            c.bad_udp_port.eq(wire_field(l4, UDP, "dport") != P.ROCEV2_UDP_PORT),
            c.bad_bth.eq((wire_field(l4, L.BTH, "version", BTH_AT) != P.BTH_VERSION) |
                         (wire_field(l4, L.BTH, "padcount", BTH_AT) != 0)),
            c.bad_opcode.eq(~d1.opcode_ok),
            c.plain_v4.eq(~srv6 & inner_v4),
            c.srv6_v4.eq(srv6 & inner_v4),
            c.trimmed.eq(kind_data & (w.tclass[2:] == self.trim_dscp)),
            c.srv6.eq(srv6),
            c.srh.eq(w.mode == MODE_SRH),
            c.kind_data.eq(kind_data),
        ]

        # Lengths, all relative to the first IP header (after the check of the IP length, the
        # frame ends exactly `ip_len` bytes after it, padding excluded).
        inner_len = Mux(inner_v4, _v4_field(inner, "total_length"),
                        _v6_field(inner, "payload_length") + IPV6.size)
        inner_rel = Signal(8)
        udp_rel = Signal(8)
        need_rel = Signal(8)
        with d2m.Switch(Cat(d1.stack, d1.kind.as_value(), d1.imm, data_ts)):
            for s in STACKS:
                for (kind, imm, ts), size in TRANSPORT_SIZE.items():
                    code = s.code | kind.value << 4 | int(imm) << 7 | int(ts) << 8
                    headers_end = s.t + L.BTH.size + size      # where a payload starts
                    with d2m.Case(code):
                        d2m.d.comb += [
                            inner_rel.eq(s.x - s.l3),
                            udp_rel.eq(s.u - s.l3),
                            need_rel.eq(headers_end + P.ICRC_BYTES - s.l3),
                        ]
                        d2m.d.sync += [
                            d2.runt.inner.eq(s.x - s.l3 + s.inner_size),
                            d2.runt.udp.eq(s.u - s.l3 + UDP.size),
                            d2.runt.bth.eq(s.t - s.l3 + L.BTH.size),
                            d2.pay_beat.eq(headers_end // g.lanes),
                            d2.pay_lane.eq(headers_end % g.lanes),
                        ]
        d2m.d.sync += [
            d2.ip_len.eq(outer_len),
            d2.inner_end.eq(inner_rel + inner_len),
            d2.udp_end.eq(udp_rel + udp_len),
            d2.need.eq(need_rel),
            d2.dma_len.eq(dma_len),
        ]

        # IPv4 header checksum, first adder level (the inner window is the only IPv4 header).
        words = [Cat(inner[2 * k + 1], inner[2 * k]) for k in range(IPV4.size // 2)]
        d2m.d.sync += [d2.pairs[k].eq(words[2 * k] + words[2 * k + 1])
                       for k in range(len(words) // 2)]
        return m
