"""The header builder's packet sequencing: header stages N and C (:class:`BuildNext`) and the
beat pipeline's control stage P0 (:class:`BuildControl`)."""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..util import validating
from .build_defs import (
    DERIVE_CYCLES,
    FLUSH,
    HDR,
    LAYOUT_ID_BITS,
    MERGE,
    PAY,
    READY_AGE,
    BuilderPlan,
    beat_control_layout,
    derived_layout,
)
from .headers import packet_header_layout

__all__ = ["BuildNext", "BuildControl", "next_layout"]


def _table(values, shape):
    return Array(C(v, shape) for v in values)


def next_layout(config):
    """Header stage N: the next packet to emit."""
    return data.StructLayout({
        "valid": 1,
        "claimed": 1,                   # the control stage has started it
        "hdr": packet_header_layout(config),
        "lid": LAYOUT_ID_BITS,
        "age": range(READY_AGE + 1),
        "der": derived_layout(),
    })


class BuildNext(wiring.Component):
    """Header stage N (the next packet to emit) and stage C (the packet whose header beats
    the word multiplexer is building).

    N takes I's header when N is empty or moves to C in the same cycle (``take``). N keeps
    counting the header's age and copies the derive pipeline's result at age
    ``DERIVE_CYCLES``. The control stage ``claim``\\ s N when it starts the packet; N moves to
    C (``release``) when the packet's first beat leaves P1, two or more cycles after the claim,
    which needs age ``READY_AGE - 2``, so the derived values are complete by then.

    Latency: one cycle from I to N, N to C at ``release``. Throughput: one header per packet;
    N is free again in the cycle it is released. Hazards: ``claim`` only with ``n.valid`` and
    not ``n.claimed``; ``release`` only after ``claim``.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    cap_valid, cap_hdr, cap_lid, cap_age, cap_der : ``In``
        Header stage I.
    derived : ``In(derived_layout())``
    take : ``Out(1)``
        I's header moves to N.
    claim, release : ``In(1)``
    n : ``Out(next_layout(config))``
    c_hdr, c_der : ``Out``
        Stage C: the header and derived values of the packet at the word multiplexer.
    """

    def __init__(self, *, config):
        with validating(self):
            BuilderPlan(config)
        super().__init__({
            "cap_valid": In(1),
            "cap_hdr": In(packet_header_layout(config)),
            "cap_lid": In(LAYOUT_ID_BITS),
            "cap_age": In(range(READY_AGE + 1)),
            "cap_der": In(derived_layout()),
            "derived": In(derived_layout()),
            "take": Out(1),
            "claim": In(1),
            "release": In(1),
            "n": Out(next_layout(config)),
            "c_hdr": Out(packet_header_layout(config)),
            "c_der": Out(derived_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        m.d.comb += self.take.eq(self.cap_valid & (~n.valid | self.release))
        with m.If(self.release):
            m.d.sync += [
                self.c_hdr.eq(n.hdr),
                self.c_der.eq(n.der),
                n.valid.eq(0),
            ]
        with m.Elif(n.valid & (n.age != READY_AGE)):
            m.d.sync += n.age.eq(n.age + 1)
            with m.If(n.age == DERIVE_CYCLES):
                m.d.sync += n.der.eq(self.derived)
        with m.If(self.take):
            m.d.sync += [
                n.valid.eq(1),
                n.claimed.eq(0),
                n.hdr.eq(self.cap_hdr),
                n.lid.eq(self.cap_lid),
                n.age.eq(Mux(self.cap_age == READY_AGE, READY_AGE, self.cap_age + 1)),
                n.der.eq(Mux(self.cap_age == DERIVE_CYCLES, self.derived, self.cap_der)),
            ]
        with m.If(self.claim):
            m.d.sync += n.claimed.eq(1)
        return m


class BuildControl(wiring.Component):
    """The beat pipeline's control stage P0: walk a packet's header beats, then pop its
    payload from the payload FIFO, and say for every beat what it is (``emit``).

    A packet's beats are its header beats (``HDR``), the beat where the header's last bytes
    meet the first payload bytes (``MERGE``), payload beats (``PAY``), and, when the payload's
    tail does not fit the last popped beat, one ``FLUSH`` beat. The next packet is claimed
    from N in the cycle the last beat is emitted, so frames follow each other without an idle
    beat. Every register moves on ``advance`` only.

    Latency: ``emit`` is combinational from P0's registers and the FIFO's head; a claimed
    packet's first beat is emitted the cycle after the claim. Throughput: one beat per cycle
    while ``advance``, the FIFO permitting. Hazards: the payload FIFO must hold the packet's
    beats in order; N's derived values must be complete two cycles after the claim (N's age
    guarantees it).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    n : ``In(next_layout(config))``
    claim : ``Out(1)``
        P0 starts N's packet.
    advance : ``In(1)``
        The beat pipeline moves.
    r_rdy, r_data : ``In``
        The payload FIFO's head.
    r_en : ``Out(1)``
    emit : ``Out(beat_control_layout(plan))``
        The beat P0 hands to P1 on ``advance``.
    beat, lid : ``Out``
        The header beat and layout: the word ROM's address.
    """

    def __init__(self, *, config):
        with validating(self):
            plan = self._plan = BuilderPlan(config)
        count_bits = ceil_log2(plan.lanes + 1)
        super().__init__({
            "n": In(next_layout(config)),
            "claim": Out(1),
            "advance": In(1),
            "r_rdy": In(1),
            "r_data": In(plan.data_width + count_bits + 1),
            "r_en": Out(1),
            "emit": Out(beat_control_layout(plan)),
            "beat": Out(plan.beat_bits),
            "lid": Out(LAYOUT_ID_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        plan = self._plan
        width, lanes = plan.data_width, plan.lanes
        count_shape = range(lanes + 1)
        count_bits = ceil_log2(lanes + 1)
        offset_shape = range(lanes // 4)
        beat_bits = plan.beat_bits
        n, advance, emit = self.n, self.advance, self.emit

        p0_active = Signal()
        p0_phase = Signal(2)
        p0_beat = self.beat
        p0_lid = self.lid
        p0_hdr_beats = Signal(beat_bits)
        p0_offset = Signal(offset_shape)            # payload lane offset = 2 + 4 * p0_offset
        p0_icrc_beat = Signal(beat_bits)
        p0_icrc_lane = Signal(count_shape)
        p0_port = Signal(len(emit.port))
        p0_left = Signal(count_shape)               # bytes of the flush beat

        fifo_count = self.r_data[width:width + count_bits]
        fifo_last = self.r_data[width + count_bits]
        payload_lane = Signal(range(lanes))
        m.d.comb += payload_lane.eq(2 + 4 * p0_offset)

        done = Signal()
        pop = Signal()
        header_like = (p0_phase == HDR) | (p0_phase == MERGE)
        m.d.comb += [
            emit.start.eq((p0_phase == HDR) & (p0_beat == 0)),
            emit.offset.eq(p0_offset),
            emit.port.eq(p0_port),
            emit.count.eq(lanes),
            emit.crc_valid.eq(~header_like | (p0_beat >= p0_icrc_beat)),
            emit.crc_first.eq(header_like & (p0_beat == p0_icrc_beat)),
            emit.crc_lo.eq(Mux(emit.crc_first, p0_icrc_lane, 0)),
        ]
        with m.If(p0_active):
            with m.Switch(p0_phase):
                with m.Case(HDR):
                    m.d.comb += [emit.valid.eq(1), emit.type.eq(HDR)]
                with m.Case(MERGE, PAY):
                    with m.If(self.r_rdy):
                        m.d.comb += [
                            emit.valid.eq(1), pop.eq(1),
                            emit.type.eq(Mux(p0_phase == MERGE, MERGE, PAY)),
                        ]
                        with m.If(fifo_last & (fifo_count + payload_lane <= lanes)):
                            m.d.comb += [
                                emit.count.eq(fifo_count + payload_lane),
                                emit.last.eq(1),
                                done.eq(1),
                            ]
                with m.Case(FLUSH):
                    m.d.comb += [
                        emit.valid.eq(1), emit.type.eq(FLUSH), emit.count.eq(p0_left),
                        emit.last.eq(1), done.eq(1),
                    ]
        m.d.comb += self.r_en.eq(advance & pop)

        load = self.claim
        # The derived values are first needed when the packet's first beat reaches P2, at
        # least two cycles after its load: the load may go ahead two cycles before they exist.
        m.d.comb += load.eq(advance & n.valid & ~n.claimed & (n.age >= READY_AGE - 2) &
                            (~p0_active | done))
        with m.If(advance):
            with m.Switch(p0_phase):
                with m.Case(HDR):
                    m.d.sync += p0_beat.eq(p0_beat + 1)
                    with m.If(p0_beat + 1 == p0_hdr_beats):
                        m.d.sync += p0_phase.eq(MERGE)
                with m.Case(MERGE, PAY):
                    with m.If(pop):
                        m.d.sync += p0_phase.eq(PAY)
                        with m.If(fifo_last & ~done):
                            m.d.sync += [
                                p0_phase.eq(FLUSH),
                                p0_left.eq(fifo_count + payload_lane - lanes),
                            ]
            with m.If(done):
                m.d.sync += p0_active.eq(0)
            with m.If(load):
                m.d.sync += [
                    p0_active.eq(1),
                    p0_phase.eq(HDR),
                    p0_beat.eq(0),
                    p0_lid.eq(n.lid),
                    p0_hdr_beats.eq(_table(plan.table("header_beats"), beat_bits)[n.lid]),
                    p0_offset.eq(_table([(a - 2) // 4 for a in plan.table("payload_lane")],
                                        offset_shape)[n.lid]),
                    p0_icrc_beat.eq(_table(plan.table("icrc_beat"), beat_bits)[n.lid]),
                    p0_icrc_lane.eq(_table(plan.table("icrc_lane"), count_shape)[n.lid]),
                    p0_port.eq(n.hdr.port),
                ]
        return m
