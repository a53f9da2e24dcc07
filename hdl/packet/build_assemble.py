"""The header builder's beat assembly, P1 to P4: header words from the word ROM and the
source-word multiplexer, the payload rotated to its lane offset, both merged into frame beats
(:class:`BuildAssemble`)."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..util import validating
from .build_defs import (
    HDR,
    LAYOUT_COUNT,
    LAYOUT_ID_BITS,
    MERGE,
    PAY,
    BuilderPlan,
    beat_control_layout,
    derived_layout,
    keep_mask,
)
from .headers import packet_header_layout

__all__ = ["BuildAssemble"]


class BuildAssemble(wiring.Component):
    """Turn the control stage's beats into frame beats: P1 reads the word ROM (which source
    word each 32-bit lane of a header beat takes, by layout and header beat) and takes the
    popped payload; P2 rotates the payload to its lane offset; P3 holds the header bytes, built
    by one word multiplexer per lane from stage C's header, and their ICRC masks; P4 holds the
    merged frame beat and what the CRC sees of it (masked fields as ones, only the lanes from
    the ICRC's start).

    No byte is shifted by a variable amount except the payload, by one of ``W/32`` offsets.
    Every register moves on ``advance``.

    Latency: four ``advance`` cycles from P0 to P4. Throughput: one beat per ``advance``.
    Hazards: ``c_hdr``/``c_der`` must be the packet's from its first beat's P2 until its last
    header beat's P3 (``release`` moves N to C as the first beat leaves P1, and the next
    packet's header beats follow this packet's beats).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    emit : ``In(beat_control_layout(plan))``
    payload : ``In(data_width)``
        The payload FIFO's head (taken with ``emit``).
    beat, lid : ``In``
        P0's header beat and layout: the word ROM's address.
    advance : ``In(1)``
    c_hdr, c_der : ``In``
        Stage C's header and derived values.
    release : ``Out(1)``
        The packet's first beat moves from P1 on: N moves to C.
    p4 : ``Out(beat_control_layout(plan))``
    p4_data, p4_crc_data, p4_crc_keep : ``Out``
        The frame beat, and the data and lanes the CRC takes of it.
    """

    def __init__(self, *, config):
        with validating(self):
            plan = self._plan = BuilderPlan(config)
        ctl = beat_control_layout(plan)
        super().__init__({
            "emit": In(ctl),
            "payload": In(plan.data_width),
            "beat": In(plan.beat_bits),
            "lid": In(LAYOUT_ID_BITS),
            "advance": In(1),
            "c_hdr": In(packet_header_layout(config)),
            "c_der": In(derived_layout()),
            "release": Out(1),
            "p4": Out(ctl),
            "p4_data": Out(plan.data_width),
            "p4_crc_data": Out(plan.data_width),
            "p4_crc_keep": Out(plan.lanes),
        })

    def elaborate(self, platform):
        m = Module()
        plan = self._plan
        width, lanes, advance = plan.data_width, plan.lanes, self.advance
        offsets = lanes // 4                        # payload lane offsets: 2, 6, 10, ...
        index_bits, word_lanes = plan.index_bits, plan.word_lanes
        ctl_layout = beat_control_layout(plan)

        # ROM: the source word of every word lane of header beat `beat` (read on `advance`).
        m.submodules.word_rom = rom = Memory(
            shape=unsigned(index_bits * (word_lanes + 1)),
            depth=LAYOUT_COUNT << plan.beat_bits, init=plan.rom_init())
        rom_port = rom.read_port(domain="sync")
        m.d.comb += [
            rom_port.en.eq(advance),
            rom_port.addr.eq(Cat(self.beat, self.lid)),
        ]

        # P1: ROM data, popped payload.
        p1 = Signal(ctl_layout)
        p1_data = Signal(width)
        # P2: word selects, payload rotated to its lane offset.
        p2 = Signal(ctl_layout)
        p2_sel = Signal(index_bits * (word_lanes + 1))
        p2_rot = Signal(width)
        # P3: header bytes (and their ICRC masks) of the beat.
        p3 = Signal(ctl_layout)
        p3_hdr = Signal(width)
        p3_mask = Signal(width)
        p3_rot = Signal(width)
        carry = Signal(width)                       # the previous payload beat, rotated
        # P4: the frame beat (before the ICRC), and what the CRC sees of it.
        p4 = self.p4

        m.d.comb += self.release.eq(advance & p1.valid & p1.start)

        rotated = Signal(width)
        with m.Switch(p1.offset):
            for offset in range(offsets):
                with m.Case(offset):
                    m.d.comb += rotated.eq(p1_data.rotate_left(8 * (2 + 4 * offset)))

        # Source words, from stage C's registers.
        words, masks = plan.source_word_values(self.c_hdr, self.c_der)
        word_array = Array(words)
        mask_array = Array(C(mask, 32) for mask in masks)
        lane_words, lane_masks = [], []
        for lane in range(word_lanes + 1):
            sel = p2_sel.word_select(lane, index_bits)
            word = Signal(32, name=f"word{lane}")
            mask = Signal(32, name=f"mask{lane}")
            m.d.comb += [word.eq(word_array[sel]), mask.eq(mask_array[sel])]
            lane_words.append(word)
            lane_masks.append(mask)

        def grid_beat(values):
            return Cat(values[0][16:], *values[1:-1], values[-1][:16])

        # Merge of header, carried payload and rotated payload at P3.
        lo_lanes = Signal(lanes)                    # lanes below the payload offset
        with m.Switch(p3.offset):
            for offset in range(offsets):
                with m.Case(offset):
                    m.d.comb += lo_lanes.eq((1 << (2 + 4 * offset)) - 1)
        merged = Signal(width)
        merged_mask = Signal(width)
        for lane in range(lanes):
            byte = slice(8 * lane, 8 * lane + 8)
            with m.If((p3.type == HDR) | ((p3.type == MERGE) & lo_lanes[lane])):
                m.d.comb += [merged[byte].eq(p3_hdr[byte]), merged_mask[byte].eq(p3_mask[byte])]
            with m.Elif(lo_lanes[lane]):
                m.d.comb += merged[byte].eq(carry[byte])
            with m.Else():
                m.d.comb += merged[byte].eq(p3_rot[byte])
        crc_keep = Signal(lanes)
        m.d.comb += crc_keep.eq(keep_mask(p3.count, lanes) & ~keep_mask(p3.crc_lo, lanes))

        with m.If(advance):
            m.d.sync += [
                p1.eq(self.emit),
                p1_data.eq(self.payload),
                p2.eq(p1),
                p2_sel.eq(rom_port.data),
                p2_rot.eq(rotated),
                p3.eq(p2),
                p3_hdr.eq(grid_beat(lane_words)),
                p3_mask.eq(grid_beat(lane_masks)),
                p3_rot.eq(p2_rot),
                p4.eq(p3),
                self.p4_data.eq(merged),
                self.p4_crc_data.eq(merged | merged_mask),
                self.p4_crc_keep.eq(crc_keep),
            ]
            with m.If(p3.valid & ((p3.type == MERGE) | (p3.type == PAY))):
                m.d.sync += carry.eq(p3_rot)
        return m
