"""The responder's completion reorder: the pending WRITE WITH IMMEDIATE entries of a QP and
the completion FIFO that releases them in message order."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import CompletionSide, completion_layout
from ..util import as_signal, validating
from .resp_bits import lowest_set, or_all
from .resp_layouts import CHUNK, responder_layouts

__all__ = ["CompletionReorder"]


class CompletionReorder(wiring.Component):
    """The completion reorder buffer of the responder's execute stage.

    Payloads are placed in any order; a WRITE_IMM completes only when every PSN up to its
    last one has arrived, so completions leave in message order per QP. Each QP row keeps
    ``max_wimm`` entries {valid, position, imm} and their count; the execute stage (S2) hands
    this component the row's entries and what its step decides, and writes back
    ``new_entries`` and ``new_count`` with the row.

    Combinational part (inside S2's one-cycle loop on the QP row): a placed WRITE_IMM above
    the expected PSN takes the first free entry (position = ``epos`` + ``offset`` modulo the
    window); one at the expected PSN completes at once (``placed_d0``: its immediate is the
    packet's); a step that passes a WRITE_IMM end (``stop``, at ``wimm_at`` PSNs from the
    expected one) releases the entry at that position. Which entry a step releases, and which
    one an insertion takes, are decided from the entries and the packet alone (``at_epsn``:
    the packet is at the expected PSN, known before the verdict), so the verdict (``placed``)
    reaches only the insertion's write enable.

    Sequential part: ``push`` (S2 fires and releases a completion) registers the completion
    (one cycle, no decision logic in front of the FIFO), which then enters the completion
    FIFO (``completions`` deep) read by ``completion``. Latency: ``push`` -> ``completion.valid``
    2 cycles. Throughput one completion per cycle. ``room`` is low when the FIFO, counting the
    one on its way, is full: the execute stage then waits (a completion is never dropped).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
    completions : int
        Completion FIFO entries (2 to 1024, checked by the responder).

    Members
    -------
    entries : ``In(wimm_row layout)``, count : ``In(range(max_wimm + 1))``
        The QP row's pending immediates and their count (S2's forwarded row).
    epos : ``In(position)``, offset : ``In(position)``, wimm_at : ``In(range(CHUNK + 1))``
        The expected PSN's position, the packet's distance from it, where the step's
        WRITE_IMM end lies.
    stop, placed, placed_d0, at_epsn, imm_op : ``In(1)``
    imm : ``In(32)``
        The packet's immediate.
    new_entries, new_count : ``Out``
        The entries and count S2 writes back.
    push : ``In(1)``, qpn : ``In(qpn_bits)``, wr_id : ``In(24)``
        Release a completion of this QP, its message's MSN.
    room : ``Out(1)``
    completion : ``Out(stream.Signature(completion_layout(config)))``
    """

    def __init__(self, *, config, completions):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
        self._config = config
        self._completions = completions
        layouts = responder_layouts(config)
        pos_bits = max(1, ceil_log2(config.window_psns))
        super().__init__({
            "entries": In(layouts.wimm_row), "count": In(range(config.max_wimm + 1)),
            "epos": In(pos_bits), "offset": In(pos_bits), "wimm_at": In(range(CHUNK + 1)),
            "stop": In(1), "placed": In(1), "placed_d0": In(1), "at_epsn": In(1),
            "imm_op": In(1),
            "imm": In(32),
            "new_entries": Out(layouts.wimm_row),
            "new_count": Out(range(config.max_wimm + 1)),
            "completed_imm": Out(32),
            "push": In(1), "qpn": In(config.qpn_bits), "wr_id": In(24),
            "room": Out(1),
            "completion": Out(stream.Signature(completion_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        config = self._config
        window = config.window_psns
        wt = self.entries
        pkt_pos = Signal(len(self.epos))
        wimm_pos = Signal(len(self.epos))
        pkt_pos_sum = self.epos + self.offset
        wimm_pos_sum = self.epos + self.wimm_at
        m.d.comb += [
            pkt_pos.eq(Mux(pkt_pos_sum >= window, pkt_pos_sum - window, pkt_pos_sum)),
            wimm_pos.eq(Mux(wimm_pos_sum >= window, wimm_pos_sum - window, wimm_pos_sum)),
        ]
        free_slot = lowest_set(m, ~Cat(wt[k].valid for k in range(config.max_wimm)),
                               "free_slot")
        done_at_once = self.placed_d0 & self.imm_op
        # A placed WRITE_IMM above the expected PSN (placed at it, it completes at once:
        # placed_d0 is placed & at_epsn). The slot it would take is chosen before the verdict.
        inserting = as_signal(m, self.imm_op & ~self.at_epsn, "wimm_inserting")
        insert = as_signal(m, self.placed & inserting, "wimm_insert")
        hit_imms = [Mux(done_at_once, self.imm, 0)]
        hits = []
        for k in range(config.max_wimm):
            hit = as_signal(m, wt[k].valid & (wt[k].pos == wimm_pos) & self.stop,
                            f"wimm_hit{k}")
            hits.append(hit)
            hit_imms.append(Mux(hit, wt[k].imm, 0))
            m.d.comb += self.new_entries[k].eq(wt[k])
            takes = as_signal(m, inserting & (free_slot == k), f"wimm_takes{k}")
            with m.If(self.placed & takes):
                m.d.comb += [self.new_entries[k].valid.eq(1), self.new_entries[k].pos.eq(pkt_pos),
                             self.new_entries[k].imm.eq(self.imm)]
            with m.Elif(hit):
                m.d.comb += self.new_entries[k].valid.eq(0)
        # One entry at most completes; OR is the cheapest select.
        m.d.comb += [self.completed_imm.eq(or_all(hit_imms)),
                     self.new_count.eq(self.count + insert - or_all(hits))]

        # Completions reach the FIFO a cycle later, from a register (no decision logic in
        # front of a FIFO); the FIFO's room counts the one on its way.
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=completion_layout(config).size,
                                                    depth=self._completions)
        request = Signal(completion_layout(config), reset_less=True)
        pending = Signal()
        completion = Signal(completion_layout(config))
        m.d.comb += [
            self.room.eq(Mux(pending, fifo.level < self._completions - 1,
                             fifo.level < self._completions)),
            completion.qpn.eq(self.qpn), completion.side.eq(CompletionSide.RESPONDER),
            completion.wr_id.eq(self.wr_id), completion.status.eq(P.CompletionStatus.SUCCESS),
            completion.opcode.eq(P.WcOpcode.RECV_RDMA_WITH_IMM), completion.imm_valid.eq(1),
            completion.imm.eq(self.completed_imm),
            fifo.w_en.eq(pending), fifo.w_data.eq(request),
            self.completion.valid.eq(fifo.r_rdy), self.completion.payload.eq(fifo.r_data),
            fifo.r_en.eq(self.completion.ready),
        ]
        m.d.sync += [pending.eq(self.push), request.eq(completion)]
        return m
