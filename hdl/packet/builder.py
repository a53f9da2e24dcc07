"""Header builder: turns parsed headers plus payload beats into complete Ethernet frames.

The builder is the inverse of the parser: it takes the
:func:`~hdl.packet.headers.packet_beat_layout` stream (a header struct on every beat, the
payload from lane 0 of the first beat) and emits the wire frame as
:func:`~hdl.packet.headers.net_beat_layout` beats, with every length, the IPv4 header checksum
and the RoCEv2 ICRC computed in hardware. ``docs/builder.md`` explains the
pipeline; ``docs/wire-format.md`` is the packet specification.

How the header becomes bytes without a giant shifter. Every header a frame can carry is cut
into 32-bit *source words* on a grid that starts two bytes before the frame (the Ethernet
header is 14 bytes and every other header is a multiple of four, so the grid lines up with
every header boundary). Which source word lands at which position of the frame depends only on
the *layout* of the packet (VLAN, SRv6 mode, IP version, transport headers): 96 layouts. A ROM,
filled at elaboration time, holds for every layout and header beat the source word of each
word lane, so the datapath is one wide word multiplexer per lane, registered, and no byte is
ever shifted by a variable amount except the payload (by one of ``W/32`` offsets).

:class:`HeaderBuilder` is the top: it instantiates the stages below and the payload FIFO and
wires them; it has no logic of its own. Each stage is a component of its own, with its
latency, throughput and hazards in its docstring:

* **intake** (:class:`~.build_intake.BuildIntake`): payload beats into the payload FIFO, the
  byte count check, header stage I (capture and layout id);
* **derive** (:class:`~.build_intake.BuildDerive`): lengths and the IPv4 checksum of the
  header in I, a free-running pipeline;
* **next** (:class:`~.build_control.BuildNext`): header stage N (the next packet) and C (the
  packet at the word multiplexer);
* **control** (:class:`~.build_control.BuildControl`, P0): the beats of a packet, header,
  merge, payload, flush;
* **assemble** (:class:`~.build_assemble.BuildAssemble`, P1-P4): word ROM, source-word
  multiplexer, payload rotation, merge, the CRC's view of each beat;
* **output** (:class:`~.build_output.BuildOutput`, P5-P7): the ICRC, its insertion and
  spill beat, the output buffer, ``advance``.

The layout tables, the source-word plan and the layouts between stages are in
:mod:`~.build_defs`.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..util import validating
from .build_assemble import BuildAssemble
from .build_control import BuildControl, BuildNext
from .build_defs import (
    CONTROL_SIZES,
    ICRC_INIT_BYTES,
    IPV4_FLAGS_FRAGMENT,
    IPV4_IDENTIFICATION,
    LAYOUT_COUNT,
    LAYOUT_ID_BITS,
    PAYLOAD_FIFO_DEPTH,
    SRV6_OUTER_HOP_LIMIT,
    BuilderPlan,
    Transport,
    check_config,
    decode_layout_id,
    header_bytes,
    icrc_start,
    layout_id,
    layout_parts,
    layout_segments,
)
from .build_intake import BuildDerive, BuildIntake
from .build_output import BuildOutput
from .headers import net_beat_layout, packet_beat_layout

__all__ = [
    "HeaderBuilder", "Transport", "CONTROL_SIZES", "LAYOUT_ID_BITS", "LAYOUT_COUNT",
    "layout_id", "decode_layout_id", "layout_parts", "layout_segments", "header_bytes",
    "icrc_start", "IPV4_IDENTIFICATION", "IPV4_FLAGS_FRAGMENT", "SRV6_OUTER_HOP_LIMIT",
    "ICRC_INIT_BYTES",
]


class HeaderBuilder(wiring.Component):
    """Build complete RoCEv2/MRC Ethernet frames (no FCS) from headers and payload beats.

    Everything that depends on the packet length is computed in hardware from
    ``header.payload_len``: the IPv4 total length and header checksum, the IPv6 payload length,
    the UDP length and the SRv6 outer payload length. The ICRC is computed on the fly over the
    frame as it is emitted and appended after the payload.

    Input protocol: every beat of a packet carries the same ``header``. Payload byte 0 is lane
    0 of the packet's first beat; every beat but the last is full; the last beat's ``keep`` is
    a run of ones from lane 0 (``keep == 0`` on a one-beat packet: no payload). The input's
    ``first`` flag is not used: the beat after a ``last`` beat starts a packet.

    Length errors: the length fields always follow ``payload_len``, but the frame carries the
    payload bytes actually received. When their count differs from ``payload_len``, the frame
    is emitted anyway (a receiver drops it as a bad length) and ``length_errors`` counts it.

    Throughput and latency: one output beat per cycle while ``o`` is ready; back-to-back
    packets of any size leave with no idle cycle between frames when the input keeps up (at
    W = 256, runs of frames of at most three beats may lose about one cycle per two frames).
    The input runs up to 16 beats ahead into a payload FIFO, then waits while header beats are
    emitted. Latency, builder idle: 13 cycles from the clock edge that takes a packet's first
    input beat to the edge that hands its first frame beat to a ready ``o``.

    Which transport headers follow the BTH: for ``kind`` DATA, METH, a TSETH when
    ``header.bth.ts`` is set, RETH, and an ImmDt on the immediate opcodes; for a control kind,
    the AETH or the kind's member of ``header.ctl``, whose length is the header's (a control
    packet's payload is not sent: it has none).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
        Uses ``data_width`` (64, 128 or 256).

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
        Headers and payload.
    o : ``Out(stream.Signature(net_beat_layout(config.data_width, tagged=True)))``
        Frames; ``port`` is ``header.port`` on every beat.
    length_errors : ``Out(32)``
        Packets whose payload byte count differed from ``header.payload_len`` (wraps).
    """

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        self._plan = BuilderPlan(config)
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout(config))),
            "o": Out(stream.Signature(net_beat_layout(config.data_width, tagged=True))),
            "length_errors": Out(32),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        config, plan = self._config, self._plan
        count_bits = ceil_log2(plan.lanes + 1)

        m.submodules.payload_fifo = pfifo = SyncFIFOBuffered(
            width=plan.data_width + count_bits + 1, depth=PAYLOAD_FIFO_DEPTH)
        m.submodules.intake = intake = BuildIntake(config=config)
        m.submodules.derive = derive = BuildDerive(config=config)
        m.submodules.next = next_ = BuildNext(config=config)
        m.submodules.control = control = BuildControl(config=config)
        m.submodules.assemble = assemble = BuildAssemble(config=config)
        m.submodules.output = output = BuildOutput(config=config)

        wiring.connect(m, wiring.flipped(self.i), intake.i)
        advance = output.advance
        m.d.comb += [
            pfifo.w_en.eq(intake.w_en),
            pfifo.w_data.eq(intake.w_data),
            intake.w_rdy.eq(pfifo.w_rdy),
            intake.derived.eq(derive.derived),
            intake.take.eq(next_.take),
            self.length_errors.eq(intake.length_errors),
            derive.hdr.eq(intake.cap_hdr),
            derive.lid.eq(intake.cap_lid),
            next_.cap_valid.eq(intake.cap_valid),
            next_.cap_hdr.eq(intake.cap_hdr),
            next_.cap_lid.eq(intake.cap_lid),
            next_.cap_age.eq(intake.cap_age),
            next_.cap_der.eq(intake.cap_der),
            next_.derived.eq(derive.derived),
            next_.claim.eq(control.claim),
            next_.release.eq(assemble.release),
            control.n.eq(next_.n),
            control.advance.eq(advance),
            control.r_rdy.eq(pfifo.r_rdy),
            control.r_data.eq(pfifo.r_data),
            pfifo.r_en.eq(control.r_en),
            assemble.emit.eq(control.emit),
            assemble.payload.eq(pfifo.r_data[:plan.data_width]),
            assemble.beat.eq(control.beat),
            assemble.lid.eq(control.lid),
            assemble.advance.eq(advance),
            assemble.c_hdr.eq(next_.c_hdr),
            assemble.c_der.eq(next_.c_der),
            output.p4.eq(assemble.p4),
            output.p4_data.eq(assemble.p4_data),
            output.p4_crc_data.eq(assemble.p4_crc_data),
            output.p4_crc_keep.eq(assemble.p4_crc_keep),
        ]
        wiring.connect(m, output.o, wiring.flipped(self.o))
        return m
