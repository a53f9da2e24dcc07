"""The header builder's input side: payload beats into the payload FIFO, the length check and
header stage I (:class:`BuildIntake`), and the lengths and IPv4 checksum computed for the
captured header (:class:`BuildDerive`)."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..util import validating
from . import layouts as L
from .build_defs import (
    DERIVE_CYCLES,
    IPV4_FLAGS_FRAGMENT,
    IPV4_IDENTIFICATION,
    LAYOUT_COUNT,
    LAYOUT_ID_BITS,
    READY_AGE,
    BuilderPlan,
    Transport,
    derived_layout,
    layout_parts,
    layout_segments,
)
from .headers import KIND_OPCODES, packet_beat_layout, packet_header_layout

__all__ = ["BuildIntake", "BuildDerive"]


def _table(values, shape):
    return Array(C(v, shape) for v in values)


class BuildIntake(wiring.Component):
    """Take packet beats into the payload FIFO, check each packet's byte count against its
    ``payload_len``, and capture each packet's header with its layout id (header stage I).

    The FIFO word is the beat's data, its byte count (full on every beat but the last) and
    ``last``. A packet's first beat is taken only when I is empty; I's wide registers load on
    every cycle I is empty (their enable is a register, not ``i.valid``), and I hands its
    header on (``take``) when stage N can have it. While in I a header ages; at age
    ``DERIVE_CYCLES`` the derive pipeline's result is its and is kept.

    Latency: the header is in I the cycle after its beat is taken (``cap.valid``); the length
    check counts an error three cycles after the packet's last beat is taken. Throughput: one
    beat per cycle while the FIFO has room; one header per packet. Hazards: ``take`` must only
    be asserted with ``cap.valid``.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
    w_en, w_data : ``Out``
        The payload FIFO's write side (``Cat(data, count, last)``).
    w_rdy : ``In(1)``
    derived : ``In(derived_layout())``
        The derive pipeline's last stage.
    take : ``In(1)``
        Stage N takes I's header this cycle.
    cap_valid, cap_age : ``Out``
        I holds a header; cycles since its capture, saturating at ``READY_AGE``.
    cap_hdr, cap_lid, cap_der : ``Out``
        I's header, its layout id, and its derived values once ``cap_age`` has passed
        ``DERIVE_CYCLES``.
    length_errors : ``Out(32)``
    """

    def __init__(self, *, config):
        with validating(self):
            plan = self._plan = BuilderPlan(config)
        self._config = config
        count_bits = ceil_log2(plan.lanes + 1)
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout(config))),
            "w_en": Out(1),
            "w_data": Out(plan.data_width + count_bits + 1),
            "w_rdy": In(1),
            "derived": In(derived_layout()),
            "take": In(1),
            "cap_valid": Out(1),
            "cap_age": Out(range(READY_AGE + 1)),
            "cap_hdr": Out(packet_header_layout(config)),
            "cap_lid": Out(LAYOUT_ID_BITS),
            "cap_der": Out(derived_layout()),
            "length_errors": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._plan.lanes
        count_shape = range(lanes + 1)
        ip = self.i.payload
        keep_end = Signal(count_shape)
        for lane in range(lanes):
            with m.If(ip.keep[lane]):
                m.d.comb += keep_end.eq(lane + 1)

        in_count = Signal(count_shape)              # non-last beats are full
        m.d.comb += in_count.eq(Mux(ip.last, keep_end, lanes))
        at_first = Signal(init=1)
        m.d.comb += [
            self.w_en.eq(self.i.valid & self.i.ready),
            self.w_data.eq(Cat(ip.data, in_count, ip.last)),
        ]
        capture = self.w_en & at_first
        with m.If(self.w_en):
            m.d.sync += at_first.eq(ip.last)

        # Bytes received per packet, compared with payload_len two cycles after the last beat.
        byte_count = Signal(24)
        check_valid = Signal()
        check_count = Signal(24)
        check_tail = Signal(count_shape)
        check_expected = Signal(16)
        length_error = Signal()
        m.d.sync += check_valid.eq(0)
        with m.If(self.w_en):
            with m.If(ip.last):
                m.d.sync += [
                    byte_count.eq(0),
                    check_valid.eq(1),
                    check_count.eq(byte_count),
                    check_tail.eq(keep_end),
                    check_expected.eq(ip.header.payload_len),
                ]
            with m.Else():
                m.d.sync += byte_count.eq(byte_count + lanes)
        m.d.sync += length_error.eq(check_valid & (check_count + check_tail != check_expected))
        with m.If(length_error):
            m.d.sync += self.length_errors.eq(self.length_errors + 1)

        # Header stage I: capture and layout id.
        in_hdr = ip.header
        in_imm = in_hdr.bth.opcode.matches(*(int(op) for op in P.IMMEDIATE_OPCODES))
        in_transport = Signal(3)
        with m.Switch(in_hdr.kind):
            for kind, opcode in KIND_OPCODES.items():
                with m.Case(kind):
                    size = L.headers_size(L.CONTROL_HEADERS[opcode])
                    m.d.comb += in_transport.eq(Transport.control(size))
            with m.Default():
                m.d.comb += in_transport.eq(Cat(in_hdr.bth.ts, in_imm))
        in_srv6 = Mux(in_hdr.srv6_valid, Mux(in_hdr.srh_valid, 2, 1), 0)
        in_lid = Cat(in_hdr.vlan_valid, in_srv6[:2], in_hdr.ipv6, in_transport)

        cap_valid, cap_age = self.cap_valid, self.cap_age
        m.d.comb += self.i.ready.eq(self.w_rdy & (~at_first | ~cap_valid))
        with m.If(self.take):
            m.d.sync += cap_valid.eq(0)
        with m.Elif(cap_valid & (cap_age != READY_AGE)):
            m.d.sync += cap_age.eq(cap_age + 1)
            with m.If(cap_age == DERIVE_CYCLES):
                m.d.sync += self.cap_der.eq(self.derived)
        with m.If(capture):
            m.d.sync += [cap_valid.eq(1), cap_age.eq(0)]
        # Loaded whenever I is empty, whether or not a header arrives: the enable of these wide
        # registers is then a register, not the input's `valid`.
        with m.If(~cap_valid):
            m.d.sync += [self.cap_hdr.eq(in_hdr), self.cap_lid.eq(in_lid)]
        return m


class BuildDerive(wiring.Component):
    """Compute a header's length fields and IPv4 header checksum: a free-running pipeline of
    ``DERIVE_CYCLES`` stages.

    It reads the header in I once, in the cycle after its capture (age 0); at age
    ``DERIVE_CYCLES`` its results are in ``derived`` and are copied to wherever the header is
    then (I or N), so a header never waits in I for them. Lengths are ``payload_len`` plus a
    per-layout constant; the checksum is the complement of the one's complement sum of the
    IPv4 header's 16-bit words.

    Latency: ``DERIVE_CYCLES`` cycles. Throughput: one header per cycle. Hazards: the result
    belongs to the header that was in I ``DERIVE_CYCLES`` cycles earlier; the stages that
    copy it count ages to know which.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    hdr : ``In(packet_header_layout(config))``
    lid : ``In(LAYOUT_ID_BITS)``
    derived : ``Out(derived_layout())``
    """

    def __init__(self, *, config):
        with validating(self):
            BuilderPlan(config)
        super().__init__({
            "hdr": In(packet_header_layout(config)),
            "lid": In(LAYOUT_ID_BITS),
            "derived": Out(derived_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        cap_hdr, cap_lid = self.hdr, self.lid
        udp_const, ip4_const, outer_const = [], [], []
        for lid in range(LAYOUT_COUNT):
            parts = layout_parts(lid)
            segments = layout_segments(lid)
            udp = sum(size for _name, size in parts[segments.index("udp"):]) + P.ICRC_BYTES
            inner = udp + (L.IPV6.size if "ipv6" in segments else L.IPV4.size)
            udp_const.append(udp)
            ip4_const.append(L.IPV4.size + udp)
            outer_const.append(inner + (L.SRH.size if "srh" in segments else 0))
        checksum_const = [0x4500 + IPV4_IDENTIFICATION + IPV4_FLAGS_FRAGMENT + P.IP_PROTO_UDP + c
                          for c in ip4_const]

        d1 = Signal(derived_layout())
        d2 = Signal(derived_layout())
        d3 = Signal(derived_layout())
        derived = self.derived                      # the last stage
        sum_src = Signal(17)
        sum_dst = Signal(17)
        sum_var = Signal(17)
        sum_const = Signal(17)
        sum_addr = Signal(18)
        sum_rest = Signal(18)
        sum_fold = Signal(17)
        m.d.sync += [
            d1.udp_len.eq(cap_hdr.payload_len + _table(udp_const, 16)[cap_lid]),
            d1.ip4_total.eq(cap_hdr.payload_len + _table(ip4_const, 16)[cap_lid]),
            d1.outer_plen.eq(cap_hdr.payload_len + _table(outer_const, 16)[cap_lid]),
            sum_src.eq(cap_hdr.ip_src[16:32] + cap_hdr.ip_src[0:16]),
            sum_dst.eq(cap_hdr.ip_dst[16:32] + cap_hdr.ip_dst[0:16]),
            sum_var.eq(Cat(cap_hdr.tclass, cap_hdr.hop_limit) + cap_hdr.payload_len),
            sum_const.eq(_table(checksum_const, 17)[cap_lid]),
            d2.eq(d1),
            sum_addr.eq(sum_src + sum_dst),
            sum_rest.eq(sum_var + sum_const),
            d3.eq(d2),
            sum_fold.eq((sum_addr + sum_rest)[:16] + (sum_addr + sum_rest)[16:]),
            derived.eq(d3),
            derived.ip_checksum.eq(~(sum_fold[:16] + sum_fold[16])),
        ]
        return m
