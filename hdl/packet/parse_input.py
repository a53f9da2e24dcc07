"""The receive parser's input stage: admission and the header stack tracker
(:class:`ParseInput`)."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import validating
from .headers import net_beat_layout
from .parse_defs import (
    DOT1Q,
    ETHERNET,
    FLAG_NAMES,
    HEADER_QUEUE_DEPTH,
    IPV6,
    MODE_PLAIN,
    MODE_SRH,
    MODE_SRV6,
    SRH,
    STACKS,
    ParserGeometry,
    field_offset,
    input_beat_layout,
    wire_bytes,
)

__all__ = ["ParseInput", "stack_matches"]


def stack_matches():
    """Byte values at fixed frame offsets that select the stack: ``{name: (offset, value,
    bytes)}``; ``vlan_`` names are the same bytes behind an 802.1Q tag."""
    ethertype_at = field_offset(ETHERNET, "ethertype")
    vlan_ethertype_at = field_offset(DOT1Q, "ethertype")
    nh_in_ipv6 = field_offset(IPV6, "next_header")
    nh_in_srh = IPV6.size + field_offset(SRH, "next_header")
    matches = {
        "vlan": (ethertype_at, P.ETHERTYPE_VLAN, 2),
        "v4": (ethertype_at, P.ETHERTYPE_IPV4, 2),
        "v6": (ethertype_at, P.ETHERTYPE_IPV6, 2),
        "vlan_v4": (vlan_ethertype_at, P.ETHERTYPE_IPV4, 2),
        "vlan_v6": (vlan_ethertype_at, P.ETHERTYPE_IPV6, 2),
    }
    for vlan in (False, True):
        l3 = DOT1Q.size if vlan else ETHERNET.size
        tag = "vlan_" if vlan else ""
        matches[tag + "nh41"] = (l3 + nh_in_ipv6, P.IP_PROTO_IPV6, 1)
        matches[tag + "nh4"] = (l3 + nh_in_ipv6, P.IP_PROTO_IPV4, 1)
        matches[tag + "nh43"] = (l3 + nh_in_ipv6, P.IP_PROTO_ROUTING, 1)
        matches[tag + "srh4"] = (l3 + nh_in_srh, P.IP_PROTO_IPV4, 1)
    return matches


class ParseInput(wiring.Component):
    """Take frame beats when the packet FIFO and the header queue have room, and track each
    frame's header stack as its beats arrive.

    A beat is taken when fewer than the FIFO's last two beats would be in use (``fifo_space``
    at least 3 a cycle earlier: space falls by at most one beat a cycle, so the condition can
    be registered) and, at a frame start, when the header queue has a reservation left
    (``queue_level`` plus the frames between admission and verdict, registered likewise).
    ``i.ready`` is a function of registers only and does not depend on ``i.valid``.

    The bytes that select the stack (ethertype, 802.1Q, outer next header, SRH next header)
    are matched at fixed offsets of each beat; the flags so far and the stack they select
    (``Stack.code`` and its one-hot decode) are registered with the beat, so the next stage's
    CRC mask select and the decode's window select start at flip-flops.

    Latency: one cycle (``o`` is the registered beat). Throughput: one beat per cycle.
    Hazards: a frame is delimited by ``last`` alone; its beats past ``max_beats`` keep the
    index ``max_beats`` (the next stage stores none of them). ``verdict_valid`` must strobe
    once per frame, so that the reservations balance.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(data_width, tagged=True)))``
    fifo_space : ``In(range(fifo_depth + 1))``
        The packet FIFO's free beats.
    queue_level : ``In(range(HEADER_QUEUE_DEPTH + 1))``
        Entries in the header queue.
    verdict_valid : ``In(1)``
        A frame's verdict: its reservation ends.
    o : ``Out(input_beat_layout(geometry))``
        The beat taken a cycle earlier (``valid``), its index in the frame, the flags and the
        stack up to and including it.
    """

    def __init__(self, *, config):
        with validating(self):
            self._geometry = ParserGeometry.of(config)
        g = self._geometry
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(g.data_width, tagged=True))),
            "fifo_space": In(range(g.fifo_depth + 1)),
            "queue_level": In(range(HEADER_QUEUE_DEPTH + 1)),
            "verdict_valid": In(1),
            "o": Out(input_beat_layout(g)),
        })

    @property
    def geometry(self):
        return self._geometry

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        lanes = g.lanes
        max_beats = g.max_beats
        hq_depth = HEADER_QUEUE_DEPTH

        in_beat = Signal(g.beat_bits)         # index of the next input beat within its frame
        in_flight = Signal(range(hq_depth + 1))     # frames started, verdict not yet given
        frame_start = Signal()
        accept = Signal()
        # Room for the beat in s1 and this one (FIFO space falls by at most one beat a cycle, so
        # a margin of one more lets the conditions be registered); a frame start needs a header
        # queue reservation (the sum below rises by at most one a cycle).
        fifo_room = Signal(init=1)
        queue_room = Signal(init=1)
        m.d.sync += [
            fifo_room.eq(self.fifo_space >= 3),
            queue_room.eq(self.queue_level + in_flight < hq_depth - 1),
        ]
        m.d.comb += [
            frame_start.eq(in_beat == 0),
            self.i.ready.eq(fifo_room & (~frame_start | queue_room)),
            accept.eq(self.i.valid & self.i.ready),
        ]
        with m.If(accept):
            with m.If(self.i.payload.last):
                m.d.sync += in_beat.eq(0)
            with m.Elif(in_beat != max_beats):
                m.d.sync += in_beat.eq(in_beat + 1)

        # Frames between admission and verdict hold a header-queue reservation each.
        started = accept & frame_start
        with m.If(started & ~self.verdict_valid):
            m.d.sync += in_flight.eq(in_flight + 1)
        with m.Elif(~started & self.verdict_valid):
            m.d.sync += in_flight.eq(in_flight - 1)

        # The frame's stack flags so far, and the stack they select, are decided here from this
        # beat's byte matches and a running register: s1 receives them registered, so its CRC
        # mask select and the stack's one-hot decode start at flip-flops (behind the flag logic
        # they were the 125 MHz self-test's critical path).
        hit = {}
        in_bytes = wire_bytes(self.i.payload.data, lanes)
        for name, (offset, value, count) in stack_matches().items():
            lane = offset % lanes
            wire = Cat(*reversed(in_bytes[lane:lane + count]))
            hit[name] = Signal(name=f"in_hit_{name}")
            m.d.comb += hit[name].eq((in_beat == offset // lanes) & (wire == value))
        # ``flag``: the flags up to the beat in s1 (registered); ``in_flag``: up to this beat.
        flag = self.o.flags
        in_flag = {name: Signal(name=f"in_{name}") for name in FLAG_NAMES}
        prev = {name: flag[name] & ~frame_start for name in FLAG_NAMES}
        m.d.comb += in_flag["vlan"].eq(prev["vlan"] | hit["vlan"])
        for name in FLAG_NAMES[1:]:
            m.d.comb += in_flag[name].eq(
                prev[name] | Mux(in_flag["vlan"], hit["vlan_" + name], hit[name]))
        in_mode = Signal(2)
        in_inner_v4 = Signal()
        with m.If(in_flag["v6"] & (in_flag["nh41"] | in_flag["nh4"])):
            m.d.comb += [in_mode.eq(MODE_SRV6), in_inner_v4.eq(in_flag["nh4"])]
        with m.Elif(in_flag["v6"] & in_flag["nh43"]):
            m.d.comb += [in_mode.eq(MODE_SRH), in_inner_v4.eq(in_flag["srh4"])]
        with m.Else():
            m.d.comb += [in_mode.eq(MODE_PLAIN), in_inner_v4.eq(in_flag["v4"])]

        in_stack = Signal(4)
        m.d.comb += in_stack.eq(Cat(in_flag["vlan"], in_inner_v4, in_mode))
        m.d.sync += self.o.valid.eq(accept)
        with m.If(accept):
            m.d.sync += [self.o.beat.eq(self.i.payload), self.o.index.eq(in_beat),
                         self.o.stack.eq(in_stack),
                         self.o.stack_hot.eq(Cat(in_stack == st.code for st in STACKS))]
            m.d.sync += [flag[name].eq(in_flag[name]) for name in FLAG_NAMES]
        return m
