"""The requester's block RAM tables (:class:`RequesterTables`) and the ports each engine has
on them.

Every table has exactly one write port, owned by one engine (the control's QP reset goes
through the owner's port), and one read port per engine that reads it. Every read port is
transparent for its table's write port: a read sees every write of the same cycle and earlier.
:data:`TABLE_ACCESS` names, per engine, the tables it reads and the ones it writes;
:func:`table_access_signature` is that engine's port on :class:`RequesterTables`.
"""

from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..util import validating
from .req_common import PSN, WIMM_BITS, check_config, check_observe, log2
from .req_defs import (
    CWND_BITS,
    MSN_BITS,
    PSN_CHUNK,
    RETRY_COUNT_BITS,
    TIME_BITS,
    bitmap_psns,
    chunk_map_slots,
    pool_entries,
    pool_index_bits,
    psn_chunk_bits,
    psn_chunks,
    slot_depth,
)

__all__ = ["requester_tables", "block_ram_bits", "TABLE_ACCESS", "table_access_signature",
           "table_writes_signature", "with_write",
           "OBSERVED_TABLES", "observed_row_layout", "RequesterTables"]


def requester_tables(config):
    """The block RAM tables: ``{name: (shape, depth, read_ports)}``. Each table has one write
    port; a FPGA implementation holds one copy per read port."""
    window = bitmap_psns(config)
    slots = slot_depth(config)
    count_bits = log2(slots) + 1
    qps = config.qps
    pool = pool_entries(config)
    chunks = psn_chunks(config)
    return {
        "cfg": (data.StructLayout({"state": 3, "mpr": 4, "max_wimm": 8, "timeout": 5,
                                   "retry_linear": 3, "retry_exp": 5}), qps, 5),
        # Messages (and WRITE_IMM messages) the QP started, modulo 2**16: the METH numbers.
        "sq": (data.StructLayout({"tail": count_bits, "wimm": WIMM_BITS, "msgs": MSN_BITS,
                                  "imm_msgs": MSN_BITS}), qps, 3),
        "next_psn": (unsigned(PSN), qps, 6),
        "ack": (data.StructLayout({"una": PSN, "error": 1, "err_status": P.CompletionStatus,
                                   "err_psn": PSN}), qps, 6),
        "cq": (data.StructLayout({"head": count_bits, "wimm": WIMM_BITS, "err_done": 1}),
               qps, 3),
        "acked": (unsigned(window), qps, 2),
        # A QP has a completion trigger queued while its two bits differ (ACK side sets,
        # completion engine clears: one writer each).
        "trig_set": (unsigned(1), qps, 2),
        "trig_seen": (unsigned(1), qps, 2),
        # The shared per-PSN state, in chunks of PSN_CHUNK PSNs: PSN p of a QP is entry
        # `chunk * PSN_CHUNK + p % PSN_CHUNK`, its chunk the one the QP's chunk map names.
        # `slot`: the WR pool entry of the PSN's WR.
        "meta": (data.StructLayout({"slot": pool_index_bits(config), "time": TIME_BITS,
                                    "retx": 1}),
                 chunks * PSN_CHUNK, 1),
        # The EV each PSN last went out on: read by the retransmitter (LOST feedback) and by
        # ACK processing (the EV a SACK or NACK names by its PSN).
        "ev": (unsigned(config.ev_index_bits), chunks * PSN_CHUNK, 2),
        # The chunk map: per QP, the chunk holding PSN chunk n at entry n % chunk_map_slots
        # (the segmenter writes it as it takes a chunk from the pool).
        "chunk_map": (unsigned(psn_chunk_bits(config)), qps * chunk_map_slots(config), 3),
        # The chunk of the QP's last PSN sent (the segmenter's, for the QP's next WR).
        "tail_chunk": (unsigned(psn_chunk_bits(config)), qps, 1),
        # The PSN pool's own table: the QP holds the chunks of its PSNs from `pool_lo` up to
        # its next PSN (none when they are equal); pool_lo is its una at the last reclaim.
        "pool_lo": (unsigned(PSN), qps, 2),
        # The WR ring: per QP, the WR pool entries of its outstanding WRs in WR order, from
        # `cq.head` up to `sq.tail` (the intake appends, the completion engine walks it).
        "wr_ring": (unsigned(pool_index_bits(config)), qps * slots, 1),
        # The shared WR pool: an entry per outstanding WR of any QP (free list: the intake).
        "wr_done": (data.StructLayout({"wr_id": 64, "end": PSN, "length": 32, "is_imm": 1,
                                       "refused": P.CompletionStatus}), pool, 1),
        "wr_send": (data.StructLayout({"va": 64, "local": 64, "rkey": 32, "imm": 32,
                                       "first": PSN, "length": 32, "is_imm": 1,
                                       "msn": MSN_BITS, "rqmsn": MSN_BITS}),
                    pool, 1),
        # Loss recovery: the timer scanner's own table: armed, start time, una at its last visit,
        # retries since the last progress.
        "tmr": (data.StructLayout({"armed": 1, "start": 32, "una_seen": PSN,
                                   "retries": RETRY_COUNT_BITS}), qps, 2),
        # Time una last advanced (ACK processing): where the timer restarts on progress.
        "progress": (unsigned(32), qps, 1),
        # The inference unit's own table: PSNs before `to` were already inferred lost; the
        # reorder window (time-based inference) runs since `reo_at` for the holes before
        # `reo_end` while `reo_armed`.
        "infer": (data.StructLayout({"to": PSN, "reo_armed": 1, "reo_end": PSN,
                                     "reo_at": TIME_BITS}), qps, 1),
        # The ECN congestion window (ACK processing): PSNs from una the segmenter may send
        # with CONFIG cc, and the PSN a mark must reach to shrink it again.
        "cc": (data.StructLayout({"cwnd": CWND_BITS, "acc": CWND_BITS, "recover": PSN}),
               qps, 3),
        # NSCC's window in PSNs (the NSCC engine, in a build with it), read by the segmenter
        # with CONFIG cc_nscc.
        "nscc_window": (unsigned(CWND_BITS), qps, 1),
    }


def block_ram_bits(config, *, copies=True):
    """Block RAM bits of the tables: ``{name: bits}``; ``copies`` counts one copy per read
    port (as a simple-dual-port FPGA RAM needs)."""
    out = {}
    for name, (shape, depth, ports) in requester_tables(config).items():
        width = Shape.cast(shape).width
        out[name] = width * depth * (ports if copies else 1)
    return out


#: Per engine: ``(tables read, tables written)``. The read ports of a table add up to its
#: ``read_ports`` in :func:`requester_tables`; every table is written by one engine.
TABLE_ACCESS = {
    "control": (("cfg", "sq", "next_psn", "ack", "cq", "tmr", "cc", "trig_set", "trig_seen"),
                ("cfg",)),
    "intake": (("cfg", "sq", "next_psn", "ack", "cq", "tail_chunk", "pool_lo", "cc",
                "nscc_window"),
               ("sq", "wr_ring", "wr_done", "wr_send")),
    # The segmenter reads no table: it tracks its QP's `ack`, `cc`, `nscc_window` and
    # `pool_lo` entries from their write ports.
    "segmenter": ((), ("next_psn", "chunk_map", "tail_chunk")),
    "retransmitter": (("cfg", "next_psn", "ack", "acked", "meta", "ev", "wr_send",
                       "chunk_map"), ()),
    "send": ((), ("meta",)),
    "ev_reports": (("chunk_map",), ("ev",)),
    # The PSN pool also reads `chunk_map`, through ACK processing's port (lent).
    "psn_pool": (("next_psn", "pool_lo"), ("pool_lo",)),
    "ack": (("cfg", "next_psn", "ack", "acked", "trig_set", "trig_seen", "cc", "ev",
             "chunk_map"),
            ("ack", "acked", "cc", "trig_set", "progress")),
    "inference": (("infer",), ("infer",)),
    "scanner": (("cfg", "ack", "next_psn", "tmr", "progress"), ("tmr",)),
    "completion": (("cq", "ack", "sq", "wr_ring", "wr_done"), ("trig_seen", "cq")),
    "nscc": ((), ("nscc_window",)),
}


#: The per-QP tables ``RequesterTables(observe=True)`` reads at ``obs_qpn``.
OBSERVED_TABLES = ("cfg", "next_psn", "ack", "sq", "cq")


def observed_row_layout(config):
    """A QP's entries of :data:`OBSERVED_TABLES`, its ``wr_ring`` entries at ring positions
    ``obs_pos`` (``wr_ring``) and ``obs_head`` (``wr_ring_head``) and the ``wr_done`` entry
    of WR pool entry ``obs_slot``, as ``RequesterTables(observe=True)`` shows them on
    ``obs``."""
    tables = requester_tables(config)
    count_bits = log2(slot_depth(config)) + 1
    ring = data.StructLayout({"tail": count_bits, "head": count_bits,
                              "slots": data.ArrayLayout(tables["wr_ring"][0],
                                                        slot_depth(config))})
    return data.StructLayout({**{name: tables[name][0] for name in OBSERVED_TABLES},
                              "wr_ring": tables["wr_ring"][0],
                              "wr_ring_head": tables["wr_ring"][0],
                              "wr_done": tables["wr_done"][0],
                              # Every QP's WR ring: `sq.tail`, `cq.head` and every slot.
                              "rings": data.ArrayLayout(ring, config.qps)})


def _addr_width(depth):
    return ceil_log2(depth)          # as Memory's own ports


def table_access_signature(config, engine):
    """The port of ``engine`` on :class:`RequesterTables`, from the tables' side: ``read``
    holds a :class:`~amaranth.lib.memory.ReadPort` signature per table the engine reads,
    ``write`` a :class:`~amaranth.lib.memory.WritePort` signature per table it writes. An
    engine takes it as ``In(...)``."""
    tables = requester_tables(config)
    reads, writes = TABLE_ACCESS[engine]

    def shape(name):
        return tables[name][0], _addr_width(tables[name][1])

    members = {}
    if reads:
        members["read"] = Out(wiring.Signature({
            name: Out(ReadPort.Signature(addr_width=shape(name)[1], shape=shape(name)[0]))
            for name in reads}))
    if writes:
        members["write"] = Out(wiring.Signature({
            name: Out(WritePort.Signature(addr_width=shape(name)[1], shape=shape(name)[0]))
            for name in writes}))
    return wiring.Signature(members)


def table_writes_signature(config, names):
    """The write ports of tables ``names`` as a reader that tracks them sees them (their
    owners' ports, fanned out): an engine takes it as ``In(...)``."""
    tables = requester_tables(config)
    return wiring.Signature({
        name: Out(WritePort.Signature(addr_width=_addr_width(tables[name][1]),
                                      shape=tables[name][0]))
        for name in names})


def with_write(port, addr, current, field=None):
    """``current`` (an entry at ``addr``, or its ``field``) with the write of this cycle on
    ``port`` (a table's write port, as :func:`table_writes_signature` gives it) applied:
    what a transparent read of ``addr`` would give next cycle."""
    value = port.data if field is None else port.data[field]
    return Mux(port.en & (port.addr == addr), value, current)


class RequesterTables(wiring.Component):
    """The requester's per-QP tables, its shared per-PSN state and its WR pool in block RAM.

    Each read port is synchronous: ``data`` is the entry at the ``addr`` of the previous cycle
    in which ``en`` was high (``en`` idles high), and transparent: it already holds a write of
    that same cycle to that entry. A write takes effect at the end of its cycle. No other
    logic: the ports are the memories' own.

    Parameters
    ----------
    config : NicConfig
    observe : bool
        Add ``obs_qpn``, ``obs_pos``, ``obs_head``, ``obs_slot`` and ``obs`` (off by
        default): an asynchronous read of the QP's entries of :data:`OBSERVED_TABLES`, of its
        ``wr_ring`` entries at ring positions ``obs_pos`` and ``obs_head`` and of the
        ``wr_done`` entry of WR pool entry ``obs_slot``, for the formal proofs. A read port
        more on each of those tables, in that build only; nothing else changes.

    Members
    -------
    <engine> : ``Out(table_access_signature(config, engine))``
        One port per engine named in :data:`TABLE_ACCESS` (``control``, ``intake``,
        ``segmenter``, ``retransmitter``, ``send``, ``ev_reports``, ``psn_pool``, ``ack``,
        ``inference``, ``scanner``, ``completion``, ``nscc``), with the read and write ports
        it gives that engine.
    obs_qpn : ``In(config.qpn_bits)`` (``observe`` only)
    obs_pos, obs_head : ``In(log2(slot_depth(config)))`` (``observe`` only)
    obs_slot : ``In(pool_index_bits(config))`` (``observe`` only)
    obs : ``Out(observed_row_layout(config))`` (``observe`` only)
        The entries of QP ``obs_qpn`` (its ring entries ``obs_pos`` and ``obs_head``, pool
        entry ``obs_slot``) in this cycle (the writes of this cycle not yet in).
    """

    def __init__(self, *, config, observe=False):
        with validating(self):
            check_config(config)
            check_observe(observe)
        self._config = config
        self._observe = observe
        members = {engine: Out(table_access_signature(config, engine))
                   for engine in TABLE_ACCESS}
        if observe:
            members["obs_qpn"] = In(config.qpn_bits)
            members["obs_pos"] = In(log2(slot_depth(config)))
            members["obs_head"] = In(log2(slot_depth(config)))
            members["obs_slot"] = In(pool_index_bits(config))
            members["obs"] = Out(observed_row_layout(config))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        memories, write_ports = {}, {}
        for name, (shape, depth, _ports) in requester_tables(self._config).items():
            memories[name] = m.submodules[f"{name}_table"] = Memory(shape=shape, depth=depth,
                                                                      init=[])
            write_ports[name] = memories[name].write_port()
        for engine, (reads, writes) in TABLE_ACCESS.items():
            access = getattr(self, engine)
            for name in writes:
                port, outer = write_ports[name], getattr(access.write, name)
                m.d.comb += [port.addr.eq(outer.addr), port.en.eq(outer.en),
                             port.data.eq(outer.data)]
            for name in reads:
                port = memories[name].read_port(transparent_for=(write_ports[name],))
                outer = getattr(access.read, name)
                m.d.comb += [port.addr.eq(outer.addr), port.en.eq(outer.en),
                             outer.data.eq(port.data)]
        if self._observe:
            for name in OBSERVED_TABLES:
                port = memories[name].read_port(domain="comb")
                m.d.comb += [port.addr.eq(self.obs_qpn), self.obs[name].eq(port.data)]
            for position, field in ((self.obs_pos, "wr_ring"), (self.obs_head, "wr_ring_head")):
                port = memories["wr_ring"].read_port(domain="comb")
                m.d.comb += [port.addr.eq(Cat(position, self.obs_qpn)),
                             self.obs[field].eq(port.data)]
            port = memories["wr_done"].read_port(domain="comb")
            m.d.comb += [port.addr.eq(self.obs_slot), self.obs.wr_done.eq(port.data)]
            slots = slot_depth(self._config)
            for qpn in range(self._config.qps):
                ring = self.obs.rings[qpn]
                for name, field in (("sq", "tail"), ("cq", "head")):
                    port = memories[name].read_port(domain="comb")
                    m.d.comb += [port.addr.eq(qpn), ring[field].eq(port.data[field])]
                for position in range(slots):
                    port = memories["wr_ring"].read_port(domain="comb")
                    m.d.comb += [port.addr.eq(qpn * slots + position),
                                 ring.slots[position].eq(port.data)]
        return m
