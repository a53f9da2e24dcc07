"""The header builder's output side, P5 to P7: the ICRC over each frame, appended after its
payload (in an extra beat when it does not fit), the output buffer, and the pipeline's
``advance`` (:class:`BuildOutput`)."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import validating
from .build_defs import ICRC_INIT_BYTES, BuilderPlan, beat_control_layout, keep_mask
from .crc import CRC32
from .headers import net_beat_layout

__all__ = ["BuildOutput"]


class BuildOutput(wiring.Component):
    """Run the ICRC over each frame beat, insert it after the frame's last byte, and hand the
    beats to ``o`` through a two-entry buffer.

    The CRC unit moves on ``advance`` like the beat registers P5 and P6 that hold each beat
    while the unit's data stage and loop take it; at P7 the CRC includes the beat. A frame
    whose last beat has fewer than four free lanes spills its ICRC's tail into one more beat:
    the pipeline then stops for that beat. ``o.valid`` and ``o.payload`` are registers, and
    the pipeline sees a registered ready, so ``o.ready`` reaches only the buffer.

    ``advance`` enables every pipeline register, the CRC unit and the payload FIFO's read: it
    is a register, computed a cycle ahead from the next values of the four registers it
    depends on, so the wide fan-out starts at a flip-flop. It always equals
    ``(~p7.valid | out_ready) & ~(p7.valid & spills & ~spill_pending)``.

    Latency: three ``advance`` cycles from P4 to P7, one more to ``o``. Throughput: one beat
    per cycle while ``o`` is ready, one cycle lost per frame whose ICRC spills. Hazards: none;
    the input is taken only on ``advance``.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    p4 : ``In(beat_control_layout(plan))``
    p4_data, p4_crc_data, p4_crc_keep : ``In``
    advance : ``Out(1, init=1)``
    o : ``Out(stream.Signature(net_beat_layout(data_width, tagged=True)))``
    """

    def __init__(self, *, config):
        with validating(self):
            plan = self._plan = BuilderPlan(config)
        super().__init__({
            "p4": In(beat_control_layout(plan)),
            "p4_data": In(plan.data_width),
            "p4_crc_data": In(plan.data_width),
            "p4_crc_keep": In(plan.lanes),
            "advance": Out(1, init=1),
            "o": Out(stream.Signature(net_beat_layout(plan.data_width, tagged=True))),
        })

    def elaborate(self, platform):
        m = Module()
        plan = self._plan
        width, lanes = plan.data_width, plan.lanes
        count_shape = range(lanes + 1)
        ctl_layout = beat_control_layout(plan)
        advance, p4 = self.advance, self.p4

        # P5, P6: the frame beat while the CRC unit's data stage and loop take it (the unit
        # moves on `advance` too, so its stages stay in step with these).
        p5 = Signal(ctl_layout)
        p5_data = Signal(width)
        p6 = Signal(ctl_layout)
        p6_data = Signal(width)
        # P7: the frame beat, the CRC (its fold stage) including it; whether its ICRC spills
        # into an extra beat, decoded a stage early.
        p7 = Signal(ctl_layout)
        p7_data = Signal(width)
        p7_spills = Signal()

        m.submodules.icrc = crc = CRC32(data_width=width, init_bytes=ICRC_INIT_BYTES)
        m.d.comb += [
            crc.en.eq(advance),
            crc.valid.eq(p4.valid & p4.crc_valid),
            crc.first.eq(p4.crc_first),
            crc.data.eq(self.p4_crc_data),
            crc.keep.eq(self.p4_crc_keep),
        ]
        with m.If(advance):
            m.d.sync += [
                p5.eq(p4),
                p5_data.eq(self.p4_data),
                p6.eq(p5),
                p6_data.eq(p5_data),
                p7.eq(p6),
                p7_data.eq(p6_data),
                p7_spills.eq(p6.last & (p6.count > lanes - 4)),
            ]

        icrc = crc.crc                              # sent least significant byte first
        icrc_byte = [icrc[8 * j:8 * j + 8] for j in range(4)]
        with_icrc = Signal(width)
        spill_data = Signal(width)
        for lane in range(lanes):
            byte = slice(8 * lane, 8 * lane + 8)
            m.d.comb += with_icrc[byte].eq(p7_data[byte])
            for j in range(min(4, lane + 1)):
                with m.If(p7.count == lane - j):
                    m.d.comb += with_icrc[byte].eq(icrc_byte[j])
            for count in range(max(lanes - 3, lane + 1), lanes + 1):
                j = lane + lanes - count
                if j < 4:
                    with m.If(p7.count == count):
                        m.d.comb += spill_data[byte].eq(icrc_byte[j])

        spills = p7_spills
        spill_pending = Signal()
        beat_layout = net_beat_layout(width, tagged=True)
        out_beat = Signal(beat_layout)
        out_count = Signal(count_shape)
        out_write = Signal()
        out_ready = Signal()
        m.d.comb += [
            out_beat.port.eq(p7.port),
            out_beat.keep.eq(keep_mask(out_count, lanes)),
        ]
        with m.If(spill_pending):
            m.d.comb += [
                out_beat.data.eq(spill_data),
                out_count.eq(p7.count + 4 - lanes),
                out_beat.last.eq(1),
            ]
        with m.Elif(p7.last):
            m.d.comb += [
                out_beat.data.eq(with_icrc),
                out_count.eq(Mux(spills, lanes, p7.count + 4)),
                out_beat.last.eq(~spills),
                out_beat.first.eq(p7.start),
            ]
        with m.Else():
            m.d.comb += [
                out_beat.data.eq(p7_data),
                out_count.eq(lanes),
                out_beat.first.eq(p7.start),
            ]
        m.d.comb += out_write.eq(p7.valid & out_ready)
        with m.If(out_write):
            m.d.sync += spill_pending.eq(spills & ~spill_pending)

        # Two-entry output buffer.
        skid_valid = Signal()
        skid = Signal(beat_layout)
        m.d.comb += out_ready.eq(~skid_valid)
        o_free = self.o.ready | ~self.o.valid
        with m.If(o_free):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(out_beat), self.o.valid.eq(out_write)]
        with m.Elif(out_write):
            m.d.sync += [skid.eq(out_beat), skid_valid.eq(1)]

        next_p7_valid = Mux(advance, p6.valid, p7.valid)
        next_spills = Mux(advance, p6.last & (p6.count > lanes - 4), p7_spills)
        next_pending = Mux(out_write, spills & ~spill_pending, spill_pending)
        next_skid_valid = ~o_free & (skid_valid | out_write)
        m.d.sync += advance.eq((~next_p7_valid | ~next_skid_valid) &
                               ~(next_p7_valid & next_spills & ~next_pending))
        return m
