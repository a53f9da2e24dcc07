"""Receive parser: validates MRC frames, extracts their headers and realigns their payload.

Frames arrive as network beats (Ethernet without FCS). Every frame is written to a block-RAM
packet FIFO while a capture register keeps its first bytes and the ICRC is computed on the
fly; when the frame has ended, a short decode pipeline checks every header, in wire order,
and either queues the parsed header for the reader or drops the frame. The reader streams the
payload of accepted frames out of the FIFO, realigned to lane 0, with the header attached.
``docs/parser.md`` describes the checks, the drop reasons and the sizing.

:class:`Parser` is the top: it instantiates the stages below, the packet FIFO and the header
queue, and wires them; it has no logic of its own. Each stage is a component of its own, with
its latency, throughput and hazards in its docstring:

* **input** (:class:`~.parse_input.ParseInput`, into s1): admission (packet FIFO room, a
  header queue reservation per frame) and the stack tracker (ethertype, 802.1Q, next headers);
* **ICRC feed** (:class:`~.parse_store.ParseIcrc`, s1 to s2 and the CRC-32 unit): variant
  fields masked, from the inner IP header on; the residue check;
* **capture** (:class:`~.parse_store.ParseCapture`, s1 to D0): the first ``HEADER_BYTES``, the
  packet FIFO write (commit, rollback of an oversized frame), the facts of a frame that ended;
* **windows** (:class:`~.parse_decode.ParseWindows`, D1a and D1): an 802.1Q frame's capture
  shifted back by the tag, then header windows at the stack's offsets, the opcode class;
* **fields** and **checks** (:class:`~.parse_decode.ParseFields`,
  :class:`~.parse_decode.ParseChecks`, D2, side by side): the parsed header; check bits,
  lengths and the checksum's first adder level;
* **lengths** (:class:`~.parse_verdict.ParseLengths`, D3): one bit per check, payload length
  and place;
* **verdict** (:class:`~.parse_verdict.ParseVerdict`, D4): the drop reason in priority
  order, the counters, the header queue write;
* **reader** (:class:`~.parse_reader.ParseReader`): payloads of accepted frames out of the
  packet FIFO, realigned, header attached.

Shared tables (stacks, offsets, sizes, the registers between stages) are in
:mod:`~.parse_defs`.
"""

from amaranth.hdl import Cat, Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from .headers import DropReason, net_beat_layout, packet_beat_layout
from .parse_decode import ParseChecks, ParseFields, ParseWindows
from .parse_defs import (
    DOT1Q,
    ETHERNET,
    ETHERNET_MIN_FRAME,
    HEADER_BYTES,
    HEADER_QUEUE_DEPTH,
    ICRC_INIT_BYTES,
    ICRC_MASKED_FIELDS,
    ICRC_RESIDUE,
    IPV4,
    IPV6,
    SRH,
    SRH_ONE_SEGMENT_LEN,
    STACKS,
    UDP,
    ParserGeometry,
    max_frame_bytes,
    queue_entry_layout,
)
from .parse_input import ParseInput
from .parse_reader import ParseReader
from .parse_store import ParseCapture, ParseIcrc
from .parse_verdict import ParseLengths, ParseVerdict
from .pktfifo import PacketFifo

__all__ = ["Parser", "ETHERNET", "DOT1Q", "IPV4", "IPV6", "SRH", "UDP", "ICRC_MASKED_FIELDS",
           "ICRC_INIT_BYTES", "ICRC_RESIDUE", "SRH_ONE_SEGMENT_LEN", "ETHERNET_MIN_FRAME",
           "STACKS", "HEADER_BYTES", "max_frame_bytes"]


class Parser(wiring.Component):
    """Parse, validate and realign received MRC frames; drop bad ones whole, counting why.

    Store and forward: a frame is only forwarded once all of it, ICRC included, has been
    checked. Input frames (Ethernet without FCS) are delimited by ``last`` (``first`` is not
    needed); ``keep`` is taken as full on every beat but the last, whose valid lanes start at
    lane 0. Every frame gets one verdict, in input order: accepted frames come out of ``o`` once,
    in order; dropped frames leave nothing on ``o``. Bad input never stalls the parser.

    Checks, in the order that decides the reported reason (``docs/parser.md``): frame longer
    than the longest legal frame (OVERSIZE, before anything else); Ethernet/802.1Q; the first IP
    header (IPv4 without options and fragments, checksum verified; or IPv6), its length against
    the frame (a 60-byte frame may be padded), its protocol; SRv6 (outer next header 41 or 4,
    or 43 with a type-4 SRH of one segment) and the inner IP header; UDP port 4791 and length; BTH
    version and pad count; the opcode (not an MRC 1.0 opcode: UNSUPPORTED_OPCODE); the transport
    headers' lengths (RUNT when the frame ends before a data packet's METH, [TSETH], RETH,
    [ImmDt] and ICRC do, which BTH.ts and the opcode decide; BAD_LENGTH when a control packet is
    not exactly its headers and the ICRC long); payload over the MTU; RETH ``dma_len``; the
    ICRC last. A data frame whose inner traffic class carries the trim DSCP is a trimmed DATA
    packet: its ICRC and ``dma_len`` are not checked and its payload is discarded.

    Throughput: one beat per cycle (II = 1) for back-to-back frames of any size, as long as
    ``o`` is ready; ``i.ready`` drops only when the packet FIFO or the header queue is full
    because ``o`` is backpressured. Latency (cycles, no backpressure): the verdict strobe comes
    6 cycles after the cycle that transfers a frame's last beat; the first output beat of an
    accepted frame 10 cycles after it for a packet without payload, 12 for one with payload
    (11 at W = 256, which reads the packet FIFO without an output register).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
        ``data_width`` (64, 128 or 256), ``mtu`` and the initial ``trim_dscp``.

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(data_width, tagged=True)))``
        Received frames; ``port`` is taken from the first beat.
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
        Accepted packets: the parsed header (stable on every beat) and the payload from lane 0
        of the first beat; ``keep``/``last`` on the last beat. A packet without payload (a
        control packet, a trimmed or zero-length write) is one beat with ``first``, ``last``
        and ``keep == 0``.
    trim_dscp : ``In(6, init=config.trim_dscp)``
        The DSCP that marks trimmed packets.
    counters : ``Out(data.ArrayLayout(32, len(DropReason)))``
        Element 0 counts accepted frames, element ``r`` frames dropped for
        :class:`DropReason` ``r``. Wrapping (modulo 2**32); updated the cycle after the verdict.
    verdict_valid : ``Out(1)``
        One-cycle strobe per input frame, in input order.
    verdict_reason : ``Out(DropReason)``
        ``NONE`` for an accepted frame, else why it was dropped; valid with ``verdict_valid``.
    """

    #: Header queue entries (accepted frames waiting for the reader, plus reservations).
    HEADER_QUEUE_DEPTH = HEADER_QUEUE_DEPTH

    def __init__(self, *, config):
        if not isinstance(config, NicConfig):
            raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        self._geometry = ParserGeometry.of(config)
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(config.data_width, tagged=True))),
            "o": Out(stream.Signature(packet_beat_layout(config))),
            "trim_dscp": In(6, init=config.trim_dscp),
            "counters": Out(data.ArrayLayout(32, len(DropReason))),
            "verdict_valid": Out(1),
            "verdict_reason": Out(DropReason),
        })

    @property
    def config(self):
        return self._config

    @property
    def max_frame_bytes(self):
        """Frames longer than this are dropped (OVERSIZE) without being stored."""
        return self._geometry.max_frame

    @property
    def fifo_depth(self):
        """Beats of the packet FIFO: at least two of the longest frames."""
        return self._geometry.fifo_depth

    def elaborate(self, platform):
        m = Module()
        cfg, g = self._config, self._geometry

        # A registered FIFO read (for timing) costs the reader one cycle per frame; at W = 256
        # the shortest frames leave no cycle to spare, so that width reads the RAM directly.
        m.submodules.fifo = fifo = PacketFifo(width=g.data_width, depth=g.fifo_depth,
                                              registered_read=g.data_width <= 128)
        entry_layout = queue_entry_layout(cfg, g)
        header_bits = entry_layout["header"].width
        assert entry_layout["header"].offset == 0
        # The header queue is two FIFOs written and read together. The header's reads its LUT
        # RAM directly: the reader copies the head into a bank, so an output register would be
        # a third copy of the header, with an enable fanned out to every bit. The pointers and
        # lengths come from a register (SyncFIFOBuffered), as does ``r_rdy``: they steer the
        # packet FIFO's seek and its block RAM's address.
        m.submodules.queue_header = queue_header = SyncFIFO(width=header_bits,
                                                            depth=HEADER_QUEUE_DEPTH)
        m.submodules.queue = queue = SyncFIFOBuffered(width=entry_layout.size - header_bits,
                                                      depth=HEADER_QUEUE_DEPTH)
        m.submodules.input = input_ = ParseInput(config=cfg)
        m.submodules.icrc = icrc = ParseIcrc(config=cfg)
        m.submodules.capture = capture = ParseCapture(config=cfg)
        m.submodules.windows = windows = ParseWindows(config=cfg)
        m.submodules.fields = fields = ParseFields(config=cfg)
        m.submodules.checks = checks = ParseChecks(config=cfg)
        m.submodules.lengths = lengths = ParseLengths(config=cfg)
        m.submodules.verdict = verdict = ParseVerdict(config=cfg)
        m.submodules.reader = reader = ParseReader(config=cfg)

        wiring.connect(m, wiring.flipped(self.i), input_.i)
        m.d.comb += [
            input_.fifo_space.eq(fifo.w_space),
            input_.queue_level.eq(queue.level),
            input_.verdict_valid.eq(verdict.verdict_valid),
            # s1 feeds the ICRC and the capture; D0 the decode.
            icrc.i.eq(input_.o),
            capture.i.eq(input_.o),
            fifo.w_en.eq(capture.w_en),
            fifo.w_data.eq(capture.w_data),
            fifo.w_commit.eq(capture.w_commit),
            fifo.w_rollback.eq(capture.w_rollback),
            capture.w_ptr.eq(fifo.w_ptr),
            windows.i.eq(capture.o),
            fields.i.eq(windows.o),
            fields.trim_dscp.eq(self.trim_dscp),
            checks.i.eq(windows.o),
            checks.trim_dscp.eq(self.trim_dscp),
            lengths.i.eq(checks.o),
            lengths.header.eq(fields.o),
            lengths.icrc_match.eq(icrc.match),
            verdict.i.eq(lengths.o),
            self.verdict_valid.eq(verdict.verdict_valid),
            self.verdict_reason.eq(verdict.verdict_reason),
            self.counters.eq(verdict.counters),
            # The queue is never full when written: every frame holds a reservation from its
            # first beat to its verdict.
            queue_header.w_en.eq(verdict.accepted),
            queue_header.w_data.eq(verdict.entry.header),
            queue.w_en.eq(verdict.accepted),
            queue.w_data.eq(verdict.entry.as_value()[header_bits:]),
            reader.entry.valid.eq(queue.r_rdy),
            reader.entry.payload.eq(Cat(queue_header.r_data, queue.r_data)),
            queue_header.r_en.eq(reader.entry.valid & reader.entry.ready),
            queue.r_en.eq(reader.entry.valid & reader.entry.ready),
            reader.queue_empty.eq(queue.level == 0),
            reader.verdict_end.eq(verdict.verdict_end),
            fifo.r_seek.eq(reader.r_seek),
            fifo.r_seek_ptr.eq(reader.r_seek_ptr),
        ]
        wiring.connect(m, fifo.r, reader.fifo_r)
        wiring.connect(m, reader.o, wiring.flipped(self.o))
        return m
