"""Requester constants, enumerations and stream layouts.

Shared by the gateware (:mod:`hdl.transport.requester`) and the reference model
(:mod:`sim.model.requester`), so a command, a counter name or a limit has one definition.
``docs/requester.md`` explains each.
"""

from typing import NamedTuple

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .. import protocol as P
from ..config import PSN_CHUNK

__all__ = [
    "RequesterCommand", "requester_command_layout", "requester_response_layout",
    "send_context_layout", "sent_layout", "retx_layout", "qp_error_layout",
    "REQUESTER_COUNTERS", "HANDOFF_ENTRIES", "MAX_WR_PACKETS", "TIME_SHIFT", "TIME_BITS",
    "ACKREQ_EVERY_BITS",
    "bitmap_psns", "slot_depth", "pool_entries", "segmenter_contexts", "pool_index_bits",
    "PSN_CHUNK", "psn_chunks", "psn_chunk_bits", "chunk_map_slots", "wr_refusal", "wr_packets",
    "FATAL_NAK_STATUS",
    "QP_WRITE_STATES", "WalkKind", "walk_layout", "retry_expiry", "RetryExpiry",
    "RETRY_EXPONENT_MAX", "RETRY_COUNT_BITS", "INFER_K_BITS", "INFER_K_DEFAULT",
    "REO_WND_BITS", "MSN_BITS", "NACK_COUNTERS",
    "YOUNG_CAP_LOG2", "timer_page", "cc_page", "CC_MIN_WINDOW", "CC_DECREASE_SHIFT",
    "CC_INCREASE_SHIFT", "CC_MAX_STEPS", "CWND_BITS",
]

#: A work request may span at most this many packets; a longer one is refused with
#: LOC_LEN_ERR. It keeps every WR's PSN range far inside the 2**23 of serial arithmetic
#: (*project choice*; with an MTU of 1024 or more no 32-bit length reaches it).
MAX_WR_PACKETS = 1 << 22
#: Per-PSN send time: ``now_ns >> TIME_SHIFT`` (1.024 us units) in TIME_BITS bits, as the
#: retransmit timer counts in the same unit as the local ACK timeout.
TIME_SHIFT = 10
TIME_BITS = 16
ACKREQ_EVERY_BITS = 16
#: METH msn and rqmsn: message counts modulo 2**16.
MSN_BITS = 16

#: The retry wait never exceeds 2**RETRY_EXPONENT_MAX units (18 minutes): the 32-bit time
#: difference the timer compares stays far from its wrap (*project choice*).
RETRY_EXPONENT_MAX = 30
#: Width of the per-QP retry count; it saturates (only E = 25, "retry forever", reaches it).
RETRY_COUNT_BITS = 6
#: CONFIG ``infer_k``: a hole is an inferred loss once K later PSNs are SACKed; 0 = off.
INFER_K_BITS = 4
INFER_K_DEFAULT = 3
#: CONFIG ``reo_wnd``: time-based inference (RACK-like, ``docs/recovery.md``). Once an ACK
#: has shown a PSN SACKed above a hole, the hole is an inferred loss when it is still not
#: SACKed ``reo_wnd`` units (1.024 us) later; 0 = off (the value after reset).
REO_WND_BITS = 6
#: The ECN window (CONFIG ``cc``, ``docs/requester.md``) never closes below this many PSNs
#: (*project choice*).
CC_MIN_WINDOW = 2
#: A decrease takes 1/2**CC_DECREASE_SHIFT (at least one PSN) off the window the QP used:
#: the larger of the PSNs in flight and those sent since the last decrease (*project choice*).
CC_DECREASE_SHIFT = 3
#: The window widens by one PSN per cwnd / 2**CC_INCREASE_SHIFT PSNs (at least one) that
#: unmarked ACKs acknowledge, at most CC_MAX_STEPS per ACK: about four PSNs per round trip
#: (*project choice*).
CC_INCREASE_SHIFT = 2
#: The window widens by at most this many PSNs per ACK (*project choice*: with an ACK per
#: window, as coalesced ACKs give a window-limited QP, the growth is still about four PSNs per
#: round trip; an ACK can acknowledge more than cwnd PSNs, hence a limit).
CC_MAX_STEPS = 4
#: Width of the per-QP congestion window: up to 16 x 128 PSNs (the largest MPR).
CWND_BITS = 12

#: A TIMEOUT walk resends a PSN other than the oldest only if it was last sent at least
#: ``min(2**t, 2**YOUNG_CAP_LOG2)`` units ago (the send time is stored in 16 bits).
YOUNG_CAP_LOG2 = TIME_BITS - 1


class RetryExpiry(NamedTuple):
    wait_units: int         #: units from the timer's start to this expiry
    exhausted: bool         #: this expiry ends the QP (RETRY_EXC_ERR) instead of a retry


def retry_expiry(t, linear, exponential, retries):
    """The retry policy (mrc.h): when the QP's next timer expiry happens and what it means.

    ``t`` is the local ACK timeout exponent (1.024 us x 2**t), ``linear`` (L, 0..7) the
    retries at the base timeout, ``exponential`` (E, 0..25) the retries with a doubling
    timeout after them (25: retry forever), ``retries`` (r) the retries already done since
    the last progress. The timer starts when the oldest outstanding PSN is sent (or una
    advances, or the previous retry was sent); the next expiry is ``wait_units`` later:

    * ``2**t`` while ``r <= L`` (the first send and the L linear retries);
    * ``2**(t + r - L)`` after that, the exponent capped at :data:`RETRY_EXPONENT_MAX`.

    The expiry is a retry, except when ``E < 25`` and ``r == L + E``: then the QP goes to
    ERROR with RETRY_EXC_ERR (1 + L + E transmissions of the oldest PSN in all). The retry
    count saturates at ``2**RETRY_COUNT_BITS - 1``.
    """
    if not 0 <= t <= P.LOCAL_ACK_TIMEOUT_MAX:
        raise ValueError(f"Timeout exponent must be from 0 to {P.LOCAL_ACK_TIMEOUT_MAX}, "
                         f"not {t!r}")
    if not 0 <= linear <= P.RETRY_LINEAR_MAX:
        raise ValueError(f"Linear retry count must be from 0 to {P.RETRY_LINEAR_MAX}, "
                         f"not {linear!r}")
    if not 0 <= exponential <= P.RETRY_EXPONENTIAL_MAX:
        raise ValueError(f"Exponential retry count must be from 0 to "
                         f"{P.RETRY_EXPONENTIAL_MAX}, not {exponential!r}")
    exponent = min(t + max(0, retries - linear), RETRY_EXPONENT_MAX)
    exhausted = exponential != P.RETRY_INFINITE and retries >= linear + exponential
    return RetryExpiry(1 << exponent, exhausted)


def cc_page(*, cwnd, acc, recover):
    """QP_READ page 3, the ECN window: bits 0-11 cwnd, 12-23 PSNs acknowledged (unmarked)
    towards the next widening, 32-55 the PSN a mark must reach to shrink it again. Takes ints
    (the model) or Amaranth values of those widths (the gateware): one packing for both."""
    return cwnd | acc << CWND_BITS | recover << 32


def timer_page(*, armed, retries, start):
    """QP_READ page 2: bit 0 armed, bits 8-13 retries done, bits 32-63 the timer's start
    time (1.024 us units). Ints or Amaranth values, as :func:`cc_page`."""
    return armed | retries << 8 | (start & 0xFFFF_FFFF) << 32


class WalkKind(enum.Enum, shape=2):
    """Why the retransmitter walks a PSN range."""
    TIMEOUT = 0     #: the QP's timer expired: the oldest PSN, then old holes
    INFER = 1       #: K later PSNs were SACKed: holes not yet retransmitted
    #: a reorder window expired (time rule) and the count rule found nothing: holes not yet
    #: retransmitted, resent without LOST feedback (late is not evidence of a bad path)
    REORDER = 2


def walk_layout(config):
    """A range of PSNs for the retransmitter to walk, one PSN per cycle."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "psn": unsigned(P.PSN_BITS),
        "count": unsigned((bitmap_psns(config)).bit_length()),
        "kind": WalkKind,
    })


#: Completion status of the WR holding the PSN a fatal NAK names.
FATAL_NAK_STATUS = {
    P.NakCode.INVALID_REQUEST: P.CompletionStatus.REM_INV_REQ_ERR,
    P.NakCode.REMOTE_ACCESS: P.CompletionStatus.REM_ACCESS_ERR,
    P.NakCode.REMOTE_OPERATIONAL: P.CompletionStatus.REM_OP_ERR,
}

#: States QP_WRITE accepts.
QP_WRITE_STATES = tuple(int(s) for s in P.QpState)


class RequesterCommand(enum.Enum, shape=2):
    """Control commands of the requester (``ctl`` stream); errnos in ``docs/requester.md``."""
    QP_WRITE = 0
    QP_READ = 1
    CONFIG = 2


def requester_command_layout(config):
    """One control command. Fields a command does not use are ignored.

    QP_WRITE: ``qpn``, ``state``, ``psn`` (first PSN to send), ``mpr`` (units of 128 PSNs),
    ``max_wimm``, ``timeout`` (t: 1.024 us x 2**t, 0..24), ``retry_linear`` (L, 0..7),
    ``retry_exp`` (E, 0..25; 25 = forever); on a QP with WRs outstanding only ``state`` ERROR
    is taken (the WRs are flushed), any other state is EBUSY. QP_READ: ``qpn``, ``page``
    (0..3). CONFIG: ``ackreq_every``, ``infer_k`` (0 = no count-based SACK inference), ``cc``
    (1 = the congestion window limits each QP's PSN range), ``reo_wnd`` (units; 0 = no
    time-based inference), ``cc_nscc`` (the congestion window's algorithm: 0 = the ECN
    window, 1 = NSCC, in a build with it; ``docs/congestion.md``); CONFIG sets all five.
    """
    return data.StructLayout({
        "cmd": RequesterCommand,
        "qpn": unsigned(P.QPN_BITS),
        "state": unsigned(3),
        "psn": unsigned(P.PSN_BITS),
        "mpr": unsigned(4),
        "max_wimm": unsigned(8),
        "page": unsigned(2),
        "ackreq_every": unsigned(ACKREQ_EVERY_BITS),
        "timeout": unsigned(5),
        "retry_linear": unsigned(3),
        "retry_exp": unsigned(5),
        "infer_k": unsigned(INFER_K_BITS),
        "cc": unsigned(1),
        "reo_wnd": unsigned(REO_WND_BITS),
        "cc_nscc": unsigned(1),
    })


def requester_response_layout(config):
    """One response per command, in command order.

    QP_READ page 0: bits 0-7 state (ERROR once a fatal NAK arrived), 8-31 next PSN,
    32-55 oldest unacknowledged PSN. Page 1: bits 0-7 outstanding WRs, 8-15 WRITE_IMMs in
    flight, 16-23 mpr, 24-31 max_wimm, 32-39 error status, 40-63 error PSN. Page 2 (the
    retransmit timer, :func:`timer_page`): bit 0 armed, 8-13 retries done, 32-63 start time.
    Page 3 (the ECN window, :func:`cc_page`). Other commands: 0.
    """
    return data.StructLayout({"errno": P.Errno, "data": unsigned(64)})


def send_context_layout(config):
    """Everything the transmit former needs to build one data packet and fetch its payload.

    ``va`` is the remote address of this packet's first byte (every MRC data packet carries a
    RETH), ``local_addr`` where its ``dma_len`` payload bytes are fetched from. ``imm`` is 0
    unless the opcode carries immediate data. ``retransmission`` becomes BTH.rtx; ``msn`` and
    ``rqmsn`` the METH: the messages (and the WRITE WITH IMMEDIATE messages) the QP started
    before this packet's message, modulo 2**16.
    """
    return data.StructLayout({
        "psn": unsigned(P.PSN_BITS),
        "opcode": P.Opcode,
        "ackreq": unsigned(1),
        "va": unsigned(64),
        "rkey": unsigned(32),
        "dma_len": unsigned(16),
        "imm": unsigned(32),
        "local_addr": unsigned(64),
        "retransmission": unsigned(1),
        "msn": unsigned(MSN_BITS),
        "rqmsn": unsigned(MSN_BITS),
    })


def sent_layout(config):
    """Transmit side -> requester: PSN ``psn`` of QP ``qpn`` went out on EV ``ev``."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "psn": unsigned(P.PSN_BITS),
        "ev": unsigned(config.ev_index_bits),
    })


def retx_layout(config):
    """A request to retransmit one PSN (from the retransmit timer)."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "psn": unsigned(P.PSN_BITS),
    })


def qp_error_layout(config):
    """The requester moved QP ``qpn`` to ERROR because of a NAK answered with ``status``."""
    return data.StructLayout({
        "qpn": unsigned(config.qpn_bits),
        "status": P.CompletionStatus,
    })


#: Names of the 32-bit counters, in the order of the ``counters`` struct (docs/requester.md).
REQUESTER_COUNTERS = (
    "wrs", "wr_refused", "packets", "retransmissions", "retx_ignored", "acks",
    "duplicate_acks", "bad_acks", "nak_psn_out_of_window", "nak_invalid_request",
    "nak_remote_access", "nak_remote_operational", "nak_trimmed", "completions",
    "error_completions", "feedback_dropped",
    # Retransmit timer and loss recovery.
    "timeouts", "retry_exceeded", "timeout_retransmissions", "inferred_losses",
    "lost_feedback", "walk_skipped", "arm_dropped", "infer_dropped",
    # Time-based inference: regions whose reorder window expired.
    "reorder_expiries",
    # WRs that waited for an entry of the shared WR pool (``wr_pool``).
    "wr_pool_waits",
    # Packets that waited for a chunk of the shared per-PSN state (``psn_pool``).
    "psn_pool_waits",
)

#: The counter of each AETH NAK code (fatal) ...
NAK_COUNTERS = {
    P.NakCode.INVALID_REQUEST: "nak_invalid_request",
    P.NakCode.REMOTE_ACCESS: "nak_remote_access",
    P.NakCode.REMOTE_OPERATIONAL: "nak_remote_operational",
}
#: ... and of each NETH nack_reason the requester acts on (any other reason is a bad ACK).
NACK_COUNTERS = {
    P.NackReason.PSN_OOR_WINDOW: "nak_psn_out_of_window",
    P.NackReason.TRIMMED: "nak_trimmed",
}


def bitmap_psns(config):
    """Entries of the per-QP acked bitmap and per-PSN metadata: the window rounded up to a
    power of two, so ``psn % bitmap_psns`` stays consistent across the 24-bit wrap."""
    return 1 << (config.window_psns - 1).bit_length()


def slot_depth(config):
    """WR slots per QP in block RAM: ``wr_slots`` rounded up to a power of two (at least 2);
    only ``wr_slots`` of them are ever in use."""
    return max(2, 1 << (config.wr_slots - 1).bit_length())


def pool_entries(config):
    """Entries of the shared WR pool: ``wr_pool``, but no more than the QPs' WR slots together
    (``qps x wr_slots``), which bound the WRs outstanding anyway: a larger ``wr_pool`` is not
    built."""
    return min(config.wr_pool, config.qps * config.wr_slots)


#: WRs the hand-off register in front of several segmenter contexts holds
#: (:class:`~.req_segbank.SegmenterBank`): the one offered to the contexts and one behind it.
HANDOFF_ENTRIES = 2


def segmenter_contexts(config):
    """WRs the segmenter cuts at once, each of a different QP: ``segmenters``, but no more
    than the QPs, which bound them anyway: a larger ``segmenters`` is not built."""
    return min(config.segmenters, config.qps)


def pool_index_bits(config):
    """Bits of an entry index of the shared WR pool (:func:`pool_entries`): what the per-QP
    ring, the per-PSN metadata and the send path carry to name a WR."""
    return max(1, (pool_entries(config) - 1).bit_length())


def wr_packets(config, length):
    """Packets of a WR of ``length`` bytes: one per MTU, and one for a zero-length WRITE."""
    return max(1, -(-length // config.mtu))


def wr_refusal(config, opcode, length, state):
    """The error status a WR is refused with, or ``None`` if it is sent. ``state`` is the QP's
    effective state (ERROR once a fatal NAK arrived). Checked in this order."""
    if state == P.QpState.ERROR:
        return P.CompletionStatus.WR_FLUSH_ERR
    if opcode not in P.SUPPORTED_WR_OPCODES:
        return P.CompletionStatus.LOC_QP_OP_ERR
    if state != P.QpState.RTS:
        return P.CompletionStatus.LOC_QP_OP_ERR
    if wr_packets(config, length) > MAX_WR_PACKETS:
        return P.CompletionStatus.LOC_LEN_ERR
    return None


def psn_chunks(config):
    """Chunks of the shared per-PSN state (:data:`~hdl.config.PSN_CHUNK` PSNs each):
    ``psn_pool / PSN_CHUNK``, but no more than every QP's chunk map can hold
    (``qps x`` :func:`chunk_map_slots`): a larger ``psn_pool`` is not built."""
    return min(config.psn_pool // PSN_CHUNK, config.qps * chunk_map_slots(config))


def psn_chunk_bits(config):
    """Bits of a chunk index of the shared per-PSN state (:func:`psn_chunks`)."""
    return max(1, (psn_chunks(config) - 1).bit_length())


def chunk_map_slots(config):
    """Entries of a QP's chunk map: chunk ``n`` (PSNs ``n x PSN_CHUNK`` on) sits at entry
    ``n % chunk_map_slots``. Twice the chunks of the window: a QP's window spans at most one
    chunk more than ``bitmap_psns / PSN_CHUNK``, and the chunks wholly below una go back to
    the pool a few cycles after una passes them, so the QP's chunks never share an entry
    while the segmenter keeps them within this span."""
    return 2 * bitmap_psns(config) // PSN_CHUNK
