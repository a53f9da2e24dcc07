"""NSCC in the requester (:class:`NsccEngine`): UET 1.0's delay-based congestion window per QP.

The rules are the model's (:mod:`sim.model.nscc`, ``docs/congestion.md``; the constants in
:mod:`hdl.transport.nscc_defs`); this module fixes them in integers. :func:`nscc_constants`
turns an :class:`~hdl.transport.nscc_defs.NsccSetting` into the integer constants the gateware
is built with, :class:`NsccFixed` is the same arithmetic in
Python, bit for bit (the tests hold the gateware to it, and it to the model within the
fixed-point tolerance), :class:`NsccDivider` is the multi-cycle divider and
:class:`NsccEngine` the pipelined per-QP read-modify-write.

Number formats (*project choices*; ``docs/congestion.md``, "NSCC in the RTL"):

* time: units of 8 ns (the wire timestamp's unit, :data:`hdl.protocol.TIMESTAMP_SHIFT`),
  :data:`NSCC_TIME_BITS` bits, compared modulo their wrap;
* round trips and delays: 16 bits of 8 ns (the wire timestamp's width);
* the window: bytes with :data:`CWND_FRAC` fraction bits, in :data:`CWND_FX_BITS` bits;
* the adjust period's increase: bytes squared with :data:`INC_FRAC` fraction bits, so that
  ``inc / cwnd`` is directly the window's format; saturates at :data:`INC_BITS` bits;
* the delay average: 8 ns units with :data:`AVG_FRAC` fraction bits; its weight
  :data:`EWMA_WEIGHT` / 2**:data:`EWMA_SHIFT` (0.0125 to 2e-5);
* bytes acknowledged in a period, in a row under the fast delay and in a quick-adapt period:
  counted in whole PSNs (the model counts whole PSNs at the MTU too), saturating.
"""

import math
from dataclasses import dataclass

from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import validating

# NSCC's constants have one definition (shared with the model); this module fixes their formats.
from . import nscc_defs as _defs
from .req_common import ControlSignature, check_config
from .req_defs import CWND_BITS

__all__ = ["NsccOp", "NsccConstants", "nscc_constants", "nscc_event_layout",
           "nscc_update_layout", "nscc_state_layout", "NsccFixed", "NsccDivider",
           "NsccEngine", "NSCC_TIME_BITS", "CWND_FRAC", "CWND_FX_BITS", "INC_FRAC",
           "INC_BITS", "AVG_FRAC", "AVG_BITS", "EWMA_WEIGHT", "EWMA_SHIFT", "GAMMA_FX",
           "MD_MAX_FX", "ACKED_BITS", "COUNT_BITS", "ADJUST_BITS", "DIVIDEND_BITS",
           "QUOTIENT_BITS"]

#: Time in 8 ns units, modulo 2**NSCC_TIME_BITS (134 ms): a QP idle longer than half of it
#: may see one period's check late once (*project choice*).
NSCC_TIME_BITS = 24
#: The window: bytes x 2**CWND_FRAC, in CWND_FX_BITS bits (at most 16 MiB).
CWND_FRAC = 8
CWND_FX_BITS = 32
#: The period's increase: bytes**2 x 2**INC_FRAC (so inc / cwnd has CWND_FRAC fraction bits).
INC_FRAC = 2 * CWND_FRAC
INC_BITS = 64
#: The delay average: 8 ns units x 2**AVG_FRAC.
AVG_FRAC = 16
AVG_BITS = 32
#: The average's weight, DELAY_EWMA_WEIGHT in 20 fraction bits.
EWMA_SHIFT = 20
EWMA_WEIGHT = round(_defs.DELAY_EWMA_WEIGHT * (1 << EWMA_SHIFT))
#: gamma in 16 fraction bits; a decrease takes at most MD_MAX_FX / 2**16 (1 - MD_FLOOR) off.
GAMMA_FX = round(_defs.GAMMA * (1 << 16))
MD_MAX_FX = round((1 - _defs.MD_FLOOR) * (1 << 16))
#: PSNs an event acknowledges; the per-QP PSN counters (saturating).
ACKED_BITS = 16
COUNT_BITS = 16
ADJUST_BITS = 8
#: The divider: a DIVIDEND_BITS dividend over a CWND_FX_BITS divisor, QUOTIENT_BITS of
#: quotient (saturating).
DIVIDEND_BITS = INC_BITS
QUOTIENT_BITS = 32
_T = 1 << P.TIMESTAMP_SHIFT         # ns per time unit


class NsccOp(enum.Enum, shape=2):
    """What an operation of :class:`NsccEngine` does to its QP."""
    ACK = 0         #: an ACK: acknowledged PSNs, a round trip, a CE echo
    NACK = 1        #: a NACK of a trimmed packet (one MTU)
    APPLY = 2       #: the divider's result for the QP: the period's increase or a decrease
    RESET = 3       #: a QP_WRITE: the QP starts afresh


@dataclass(frozen=True)
class NsccConstants:
    """The integer constants of one build (see :func:`nscc_constants`)."""
    mtu_log2: int
    cwnd_min: int           #: window floor (one MTU), window format
    cwnd_max: int           #: window ceiling (1.5 BDP), window format
    cwnd_init: int          #: window of a fresh QP (one BDP, clamped)
    rtt_default: int        #: the setting's round trip, 8 ns units, rounded up
    target: int             #: target delay, 8 ns units, rounded up (delay < target exact)
    target_ns: int          #: target delay in ns, rounded (the proportional increase)
    target_avg: int         #: target delay in the average's format, rounded down
    qa_delay: int           #: quick adapt's delay threshold (delay > it), 8 ns units
    qa_span_default: int    #: quick-adapt period before a round trip was seen, 8 ns units
    qa_gate: int            #: quick adapt acts when the period's PSNs are below this
    fast_delay: int         #: fast increase's delay bound (delay >= it ends it), 8 ns units
    alpha: int              #: proportional increase per PSN per ns, increase format
    fi: int                 #: fair increase per PSN, increase format
    eta: int                #: eta, window format
    fast_step: int          #: fast increase per PSN, window format
    adjust_psns: int        #: the adjust period ends after this many PSNs acknowledged


def nscc_constants(setting, *, mtu=None):
    """The integer constants of :class:`NsccEngine` for an
    :class:`~hdl.transport.nscc_defs.NsccSetting`, rounded so that the model's comparisons of whole
    8 ns times are exact. Raises ``ValueError`` when the window does not fit its format."""
    if not isinstance(setting, _defs.NsccSetting):
        raise TypeError(f"NSCC setting must be an NsccSetting, not {setting!r}")
    p = _defs.NsccParameters(setting)
    mtu = setting.mtu if mtu is None else mtu
    if not isinstance(mtu, int) or mtu <= 0 or mtu & (mtu - 1) or mtu != setting.mtu:
        raise ValueError(f"NSCC setting mtu must be the NIC's MTU, a power of two, "
                         f"not {setting.mtu!r}")
    frac = 1 << CWND_FRAC
    cwnd_max = math.floor(p.max_window * frac)
    if cwnd_max >= 1 << CWND_FX_BITS:
        raise ValueError(f"NSCC setting: the maximum window (1.5 BDP, {p.max_window:.0f} "
                         f"bytes) must be under {1 << (CWND_FX_BITS - CWND_FRAC)} bytes")
    cwnd_min = mtu * frac
    if cwnd_max < cwnd_min:
        raise ValueError(f"NSCC setting: the maximum window (1.5 BDP, {p.max_window:.0f} "
                         f"bytes) must be at least one MTU ({mtu})")
    if p.target_ns / _T * 4 >= 1 << 16 or setting.base_rtt_ns / _T >= 1 << 15:
        raise ValueError(f"NSCC setting base_rtt_ns must be under {(1 << 15) * _T} ns and "
                         f"4 targets under {(1 << 16) * _T} ns, not {setting.base_rtt_ns!r}")
    inc_scale = 1 << INC_FRAC
    return NsccConstants(
        mtu_log2=mtu.bit_length() - 1,
        cwnd_min=cwnd_min, cwnd_max=cwnd_max,
        cwnd_init=min(max(math.floor(p.bdp * frac), cwnd_min), cwnd_max),
        rtt_default=math.ceil(setting.base_rtt_ns / _T),
        target=math.ceil(p.target_ns / _T),
        target_ns=round(p.target_ns),
        target_avg=math.floor(p.target_ns / _T * (1 << AVG_FRAC)),
        qa_delay=math.floor(_defs.QUICK_ADAPT_TARGETS * p.target_ns / _T),
        qa_span_default=math.ceil((setting.base_rtt_ns + p.target_ns) / _T),
        qa_gate=math.ceil(p.max_window / (1 << _defs.QUICK_ADAPT_GATE) / mtu),
        fast_delay=math.ceil(_defs.FAST_INCREASE_DELAY_NS / _T),
        alpha=round(p.alpha * mtu * inc_scale),
        fi=round(p.fi * mtu * inc_scale),
        eta=round(p.eta * frac),
        fast_step=round(mtu * p.fi_scale * frac),
        adjust_psns=_defs.ADJUST_MTUS,
    )


def nscc_event_layout(config):
    """One ACK-side event for :class:`NsccEngine`: a SACK's newly acknowledged PSNs
    (cumulatively and by SACK bits), its CE echo and its CC_STATE ``tx_timestamp`` echo, or
    (``nack``) a NACK of a trimmed packet."""
    return data.StructLayout({"qpn": config.qpn_bits, "nack": 1, "ecn": 1,
                              "acked": ACKED_BITS, "echo": P.TIMESTAMP_BITS})


def nscc_update_layout(config):
    """What :class:`NsccEngine` did, one per operation: the QP's window in PSNs (what the
    segmenter's gate reads) and in the window format, and for observation the operation,
    its time and whether the divider could take a job then."""
    return data.StructLayout({"qpn": config.qpn_bits, "op": NsccOp,
                              "window": CWND_BITS, "cwnd": CWND_FX_BITS,
                              "now": NSCC_TIME_BITS, "div_free": 1})


def nscc_state_layout():
    """A QP's entry in the engine's table."""
    return data.StructLayout({
        "cwnd": CWND_FX_BITS,
        "base_valid": 1, "base": P.TIMESTAMP_BITS,      # the least round trip seen
        "avg": AVG_BITS,
        "inc": INC_BITS,
        "adjust": ADJUST_BITS,                          # PSNs acknowledged in the period
        "adjust_at": NSCC_TIME_BITS,                    # the period's start
        "eta_at": NSCC_TIME_BITS,                       # when eta was last added
        "md_valid": 1, "md_at": NSCC_TIME_BITS,         # the last decrease
        "fast": 1, "fast_psns": COUNT_BITS,
        "qa_end": NSCC_TIME_BITS, "qa_psns": COUNT_BITS, "qa_trig": 1,
        "pending": 1,                                   # the divider holds a job for the QP
    })


_TMASK = (1 << NSCC_TIME_BITS) - 1


def _elapsed(now, then):
    return (now - then) & _TMASK


def _reached(now, end):
    return not (now - end) & (1 << (NSCC_TIME_BITS - 1))


def _sat(value, bits):
    return min(value, (1 << bits) - 1)


class NsccFixed:
    """:class:`NsccEngine`'s arithmetic in Python, bit for bit: a dict of QP states
    (:func:`nscc_state_layout` fields) and the divider's one job.

    Feed it the engine's operations in the engine's order (``update.op`` of its output):
    :meth:`step` returns the QP's new window format value. ``div_free`` is whether the
    divider could take a job at that operation (the engine reports it)."""

    def __init__(self, k):
        self.k = k
        self.qps = {}
        self.job = None             # (qpn, is_decrease, dividend, divisor)

    def _clamp(self, cwnd):
        return min(max(cwnd, self.k.cwnd_min), self.k.cwnd_max)

    def window(self, qpn):
        cwnd = self.qps[qpn]["cwnd"]
        return min(max(1, cwnd >> (CWND_FRAC + self.k.mtu_log2)), (1 << CWND_BITS) - 1)

    def reset(self, qpn, now):
        k = self.k
        self.qps[qpn] = dict(cwnd=k.cwnd_init, base_valid=0, base=0, avg=0, inc=0, adjust=0,
                             adjust_at=now, eta_at=now, md_valid=0, md_at=0, fast=0,
                             fast_psns=0, qa_end=(now + k.qa_span_default) & _TMASK,
                             qa_psns=0, qa_trig=0, pending=0)
        return self.qps[qpn]["cwnd"]

    def step(self, op, qpn, now, *, acked=0, rtt=0, ecn=False, div_free=True):
        op = NsccOp(op)
        if op == NsccOp.RESET:
            return self.reset(qpn, now)
        s, k = self.qps[qpn], self.k
        if op == NsccOp.APPLY:
            job, self.job = self.job, None
            assert job is not None and job[0] == qpn, (job, qpn)
            if s["pending"]:
                q = min(job[2] // job[3], (1 << QUOTIENT_BITS) - 1)
                if job[1]:
                    m = min((q * GAMMA_FX) >> 16, MD_MAX_FX)
                    s["cwnd"] = self._clamp(s["cwnd"] - ((s["cwnd"] * m) >> 16))
                else:
                    s["cwnd"] = self._clamp(s["cwnd"] + q)
                s["pending"] = 0
            return s["cwnd"]
        if op == NsccOp.NACK:
            s["qa_trig"] = 1
            rtt_now = s["base"] if s["base_valid"] else k.rtt_default
            if not self._quick_adapt(s, now, False, rtt_now):
                s["cwnd"] = self._clamp(s["cwnd"] - k.cwnd_min)
            return s["cwnd"]
        # ACK
        if not s["base_valid"] or rtt < s["base"]:
            s["base"], s["base_valid"] = rtt, 1
        rtt_now = s["base"]
        delay = rtt - s["base"]
        diff = (delay << AVG_FRAC) - s["avg"]
        s["avg"] = (s["avg"] + ((diff * EWMA_WEIGHT) >> EWMA_SHIFT)) & ((1 << AVG_BITS) - 1)
        s["qa_psns"] = _sat(s["qa_psns"] + acked, COUNT_BITS)
        if self._quick_adapt(s, now, delay > k.qa_delay, rtt_now):
            return s["cwnd"]
        if delay >= k.fast_delay:
            s["fast_psns"], s["fast"] = 0, 0
        launched = False
        if not ecn and delay < k.target:
            fast = False
            if delay < k.fast_delay:
                s["fast_psns"] = _sat(s["fast_psns"] + acked, COUNT_BITS)
                if s["fast"] or (s["fast_psns"] << (CWND_FRAC + k.mtu_log2)) >= s["cwnd"]:
                    s["fast"] = 1
                    s["cwnd"] += acked * k.fast_step
                    fast = True
            if not fast:
                s["inc"] = _sat(s["inc"] + k.alpha * acked * (k.target_ns - delay * _T),
                                INC_BITS)
        elif not ecn:
            s["inc"] = _sat(s["inc"] + k.fi * acked, INC_BITS)
        elif delay >= k.target:
            s["fast_psns"], s["fast"] = 0, 0
            if (s["avg"] > k.target_avg and div_free and not s["pending"]
                    and (not s["md_valid"] or _elapsed(now, s["md_at"]) >= rtt_now)):
                self.job = (qpn, True, (s["avg"] - k.target_avg) << 16, s["avg"])
                s["pending"], s["md_valid"], s["md_at"] = 1, 1, now
                launched = True
        s["cwnd"] = self._clamp(s["cwnd"])
        s["adjust"] = _sat(s["adjust"] + acked, ADJUST_BITS)
        if ((s["adjust"] >= k.adjust_psns or _elapsed(now, s["adjust_at"]) >= rtt_now)
                and (s["inc"] == 0 or (div_free and not s["pending"] and not launched))):
            if s["inc"]:
                self.job = (qpn, False, s["inc"], s["cwnd"])
                s["pending"] = 1
            if _elapsed(now, s["eta_at"]) >= rtt_now:
                s["cwnd"] = self._clamp(s["cwnd"] + k.eta)
                s["eta_at"] = now
            s["inc"], s["adjust"], s["adjust_at"] = 0, 0, now
        return s["cwnd"]

    def _quick_adapt(self, s, now, delayed, rtt_now):
        k = self.k
        if not _reached(now, s["qa_end"]):
            return False
        acted = (s["qa_trig"] or delayed) and s["qa_psns"] < k.qa_gate
        if acted:
            s["cwnd"] = self._clamp(s["qa_psns"] << (CWND_FRAC + k.mtu_log2))
            s["qa_trig"], s["inc"], s["adjust"], s["pending"] = 0, 0, 0, 0
        s["qa_psns"] = 0
        span = rtt_now + k.target if s["base_valid"] else k.qa_span_default
        s["qa_end"] = (now + span) & _TMASK
        return acted


# ---------------------------------------------------------------------------------------------
# The divider
# ---------------------------------------------------------------------------------------------

class NsccDivider(wiring.Component):
    """Unsigned division, one quotient bit per cycle (restoring).

    Takes ``dividend / divisor`` on ``i`` and offers ``min(dividend // divisor,
    2**QUOTIENT_BITS - 1)`` on ``o``: QUOTIENT_BITS + 1 cycles after the job was taken, or 1
    when the quotient saturates. One job at a time: ``i`` is ready only while the unit is
    empty (no job running and no result waiting). A zero divisor gives the saturated
    quotient.

    Members
    -------
    i : ``In(stream.Signature({"dividend": DIVIDEND_BITS, "divisor": CWND_FX_BITS}))``
    o : ``Out(stream.Signature(QUOTIENT_BITS))``
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"dividend": DIVIDEND_BITS,
                                                        "divisor": CWND_FX_BITS}))),
            "o": Out(stream.Signature(QUOTIENT_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        running = Signal()
        steps = Signal(range(QUOTIENT_BITS + 1))
        remainder = Signal(CWND_FX_BITS)            # always below the divisor
        bits = Signal(QUOTIENT_BITS)                # dividend bits still to bring down, then
        divisor = Signal(CWND_FX_BITS)              # the quotient bits, shifted in at the LSB
        m.d.comb += [self.i.ready.eq(~running & ~self.o.valid), self.o.payload.eq(bits)]
        job = self.i.payload
        high = job.dividend[QUOTIENT_BITS:]
        with m.If(self.i.valid & self.i.ready):
            with m.If(high >= job.divisor):
                m.d.sync += [bits.eq(-1), self.o.valid.eq(1)]
            with m.Else():
                m.d.sync += [running.eq(1), steps.eq(QUOTIENT_BITS), remainder.eq(high),
                             bits.eq(job.dividend[:QUOTIENT_BITS]), divisor.eq(job.divisor)]
        with m.If(running):
            trial = Cat(bits[-1], remainder)        # remainder x 2 + the next dividend bit
            fits = trial >= divisor
            m.d.sync += [remainder.eq(Mux(fits, trial - divisor, trial)),
                         bits.eq(Cat(fits, bits[:-1])), steps.eq(steps - 1)]
            with m.If(steps == 1):
                m.d.sync += [running.eq(0), self.o.valid.eq(1)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------

class NsccEngine(wiring.Component):
    """NSCC's window per QP: one operation per cycle, read / decide / write back.

    Operations, highest priority first, taken at S0: a QP reset (``control.write``: the QP
    starts with one BDP), an ACK-side event (``i``), the divider's result for the QP it
    worked for (taken in a cycle without either). Each leaves on ``o`` as an update: the
    QP's window in PSNs (``window``: ``max(1, cwnd // MTU)``, saturated at CWND_BITS, what
    the segmenter compares ``psn - una`` with) and bytes.

    Stages (an operation taken at cycle t, no backpressure):

    * S0, t: the QP addresses the table's read port (not transparent); an ACK's round trip
      is its echo's age, ``now - echo`` modulo 2**16.
    * S1, t+1: the entry lands in a register; the two forwarding matches are registered.
    * S2, t+2: forward, decide (the model's rules), write back, emit on ``o``.

    Latency two cycles; throughput one operation per cycle, any mix of QPs, back to back on
    one QP: S2 forwards the write-backs of the two operations ahead (``prev``, ``prev2``),
    which the read missed. ``o`` backpressure stalls the whole pipeline (``i`` not ready);
    the requester's ``o`` is always ready, so ACK processing never waits.

    Division: ``inc / cwnd`` at the end of an adjust period and the decrease factor
    ``(avg - target) / avg`` run in one shared :class:`NsccDivider` (QUOTIENT_BITS + 1
    cycles). S2 launches a job only when the divider and the path back are empty and no job
    is pending for the QP; otherwise a period's end waits for a later ACK of the QP (its
    increase keeps accumulating) and a decrease is held (the next marked ACK retries). A
    period without increase needs no division. While the job runs, the QP's ACKs update its
    accumulators and window as usual; the result comes back as an APPLY operation in an idle
    cycle of ``i``, so an unbroken ACK stream delays it. A quick adapt or reset of the QP
    cancels a pending result (it is dropped when it comes back).

    Hazards: the reset is taken only with ``o`` ready (the requester's always is); the
    control holds while ``busy`` (an operation in S1/S2, a divider job or result), so a
    reset never meets an operation of the QP in flight.

    Parameters
    ----------
    config : NicConfig
    setting : NsccSetting
        The line rate, idle round trip, MTU (the NIC's) and trimming it scales from.

    Members
    -------
    control : ``In(ControlSignature(config))``
    now : ``In(NSCC_TIME_BITS)``
        The time in 8 ns units (the timebase's ns >> 3).
    i : ``In(stream.Signature(nscc_event_layout(config)))``
    o : ``Out(stream.Signature(nscc_update_layout(config)))``
    busy : ``Out(1)``
    """

    def __init__(self, *, config, setting):
        with validating(self):
            check_config(config)
            self._k = nscc_constants(setting, mtu=config.mtu)
        self._config = config
        self._setting = setting
        super().__init__({
            "control": In(ControlSignature(config)),
            "now": In(NSCC_TIME_BITS),
            "i": In(stream.Signature(nscc_event_layout(config))),
            "o": Out(stream.Signature(nscc_update_layout(config))),
            "busy": Out(1),
        })

    @property
    def constants(self):
        return self._k

    @property
    def setting(self):
        return self._setting

    @staticmethod
    def state_bits():
        """Bits of one QP's table entry."""
        return nscc_state_layout().size

    def elaborate(self, platform):
        m = Module()
        k = self._k
        qb = self._config.qpn_bits
        mtu_shift = CWND_FRAC + k.mtu_log2
        state = nscc_state_layout()
        m.submodules.table = table = Memory(shape=state, depth=self._config.qps, init=[])
        read = table.read_port()
        write = table.write_port()
        m.submodules.divider = divider = NsccDivider()

        op_layout = data.StructLayout({
            "op": NsccOp, "qpn": qb, "ecn": 1, "acked": ACKED_BITS,
            "rtt": P.TIMESTAMP_BITS, "now": NSCC_TIME_BITS, "q": QUOTIENT_BITS,
            "decrease": 1})
        s1 = Signal(data.StructLayout({"valid": 1, "op": op_layout}))
        s2 = Signal(data.StructLayout({"valid": 1, "op": op_layout, "stored": state,
                                       "from_prev": 1, "from_prev2": 1}))
        written = data.StructLayout({"valid": 1, "qpn": qb, "state": state})
        prev = Signal(written)
        prev2 = Signal(written)
        advance = Signal()
        m.d.comb += advance.eq(~s2.valid | self.o.ready)

        # The divider's job: for which QP, and whether a decrease; `apply_in_flight`: its
        # result is in S1 or S2 (no new job until that result is written back).
        job_qpn = Signal(qb)
        job_decrease = Signal()
        apply_in_flight = Signal()
        div_free = Signal()
        m.d.comb += div_free.eq(divider.i.ready & ~apply_in_flight)

        # -- S0: take an operation, address the table ---------------------------------------
        ctl = self.control
        take_reset = ctl.write & advance
        take_event = ~ctl.write & self.i.valid & advance
        take_apply = ~ctl.write & ~self.i.valid & divider.o.valid & advance
        m.d.comb += [self.i.ready.eq(~ctl.write & advance), divider.o.ready.eq(take_apply)]
        s0 = Signal(op_layout)
        event = self.i.payload
        with m.If(ctl.write):
            m.d.comb += [s0.op.eq(NsccOp.RESET), s0.qpn.eq(ctl.qpn)]
        with m.Elif(self.i.valid):
            m.d.comb += [s0.op.eq(Mux(event.nack, NsccOp.NACK, NsccOp.ACK)),
                         s0.qpn.eq(event.qpn), s0.ecn.eq(event.ecn),
                         s0.acked.eq(event.acked),
                         s0.rtt.eq(self.now[:P.TIMESTAMP_BITS] - event.echo)]
        with m.Else():
            m.d.comb += [s0.op.eq(NsccOp.APPLY), s0.qpn.eq(job_qpn),
                         s0.q.eq(divider.o.payload), s0.decrease.eq(job_decrease)]
        m.d.comb += [s0.now.eq(self.now), read.addr.eq(s0.qpn), read.en.eq(advance)]
        with m.If(advance):
            m.d.sync += [s1.valid.eq(take_reset | take_event | take_apply), s1.op.eq(s0)]

        # -- S1: the entry lands; forwarding matches for S2 ---------------------------------
        with m.If(advance):
            m.d.sync += [
                s2.valid.eq(s1.valid), s2.op.eq(s1.op), s2.stored.eq(read.data),
                s2.from_prev.eq(s2.valid & (s2.op.qpn == s1.op.qpn)),
                s2.from_prev2.eq(prev.valid & (prev.qpn == s1.op.qpn)),
            ]
        m.d.comb += apply_in_flight.eq((s1.valid & (s1.op.op == NsccOp.APPLY))
                                       | (s2.valid & (s2.op.op == NsccOp.APPLY)))
        m.d.comb += self.busy.eq(s1.valid | s2.valid | ~divider.i.ready)

        # -- S2: forward, decide, write back ------------------------------------------------
        cur = Signal(state)
        m.d.comb += cur.eq(Mux(s2.from_prev, prev.state,
                               Mux(s2.from_prev2, prev2.state, s2.stored)))
        nxt = Signal(state)
        op = s2.op
        now = op.now
        fire = s2.valid & advance
        launch = Signal()
        launch_decrease = Signal()
        dividend = Signal(DIVIDEND_BITS)
        divisor = Signal(CWND_FX_BITS)

        def clamp(value):
            return Mux(value < k.cwnd_min, k.cwnd_min, Mux(value > k.cwnd_max, k.cwnd_max,
                                                           value[:CWND_FX_BITS]))

        def elapsed(then):
            return (now - then)[:NSCC_TIME_BITS]

        def saturate(value, bits):
            return Mux(value >> bits != 0, (1 << bits) - 1, value[:bits])

        # ACK: the base RTT and delay, the average
        base = Signal(P.TIMESTAMP_BITS)
        m.d.comb += base.eq(Mux(~cur.base_valid | (op.rtt < cur.base), op.rtt, cur.base))
        delay = Signal(P.TIMESTAMP_BITS)
        m.d.comb += delay.eq(op.rtt - base)
        avg_diff = Signal(signed(AVG_BITS + 2))
        m.d.comb += avg_diff.eq(Cat(C(0, AVG_FRAC), delay, C(0, 1)).as_signed() - cur.avg)
        avg_step = Signal(signed(AVG_BITS + 2))
        m.d.comb += avg_step.eq((avg_diff * EWMA_WEIGHT) >> EWMA_SHIFT)
        avg_new = Signal(AVG_BITS)
        m.d.comb += avg_new.eq(cur.avg + avg_step)
        rtt_ack = base                  # an ACK compares periods with the base after its sample
        # Quick adapt (both ACK and NACK)
        is_ack = op.op == NsccOp.ACK
        qa_psns = Signal(COUNT_BITS)
        m.d.comb += qa_psns.eq(Mux(is_ack, saturate(cur.qa_psns + op.acked, COUNT_BITS),
                                   cur.qa_psns))
        qa_due = ~(now - cur.qa_end)[NSCC_TIME_BITS - 1]
        qa_delayed = is_ack & (delay > k.qa_delay)
        qa_trig = cur.qa_trig | (op.op == NsccOp.NACK)
        qa_acts = Signal()
        m.d.comb += qa_acts.eq(qa_due & (qa_trig | qa_delayed) & (qa_psns < k.qa_gate))
        qa_span = Mux(cur.base_valid | is_ack, Mux(is_ack, rtt_ack, cur.base) + k.target,
                      k.qa_span_default)
        # Rules
        below = delay < k.target
        fast_delay = delay < k.fast_delay
        fast_psns = Signal(COUNT_BITS)
        m.d.comb += fast_psns.eq(saturate(Mux(fast_delay, cur.fast_psns, 0) + op.acked,
                                          COUNT_BITS))
        fast_on = Signal()
        m.d.comb += fast_on.eq(
            fast_delay & (cur.fast | (Cat(C(0, mtu_shift), fast_psns) >= cur.cwnd)))
        inc_add = Signal(INC_BITS + 8)
        m.d.comb += inc_add.eq(Mux(
            op.ecn, 0,
            Mux(below, Mux(fast_on, 0,
                           k.alpha * op.acked * (k.target_ns - Cat(C(0, 3), delay))[:20]),
                k.fi * op.acked)))
        inc_new = Signal(INC_BITS)
        m.d.comb += inc_new.eq(saturate(cur.inc + inc_add, INC_BITS))
        md_due = (~cur.md_valid | (elapsed(cur.md_at) >= rtt_ack))
        md_launch = Signal()
        m.d.comb += md_launch.eq(op.ecn & ~below & (avg_new > k.target_avg) & div_free
                                 & ~cur.pending & md_due)
        cwnd_rule = Signal(CWND_FX_BITS + 1)
        m.d.comb += cwnd_rule.eq(clamp(cur.cwnd + Mux(~op.ecn & below & fast_on,
                                                      op.acked * k.fast_step, 0)))
        adjust = Signal(ADJUST_BITS)
        m.d.comb += adjust.eq(saturate(cur.adjust + op.acked, ADJUST_BITS))
        adjust_end = Signal()
        m.d.comb += adjust_end.eq(
            ((adjust >= k.adjust_psns) | (elapsed(cur.adjust_at) >= rtt_ack))
            & ((inc_new == 0) | (div_free & ~cur.pending & ~md_launch)))
        eta_due = elapsed(cur.eta_at) >= rtt_ack
        # APPLY
        md_factor = Signal(17)
        md_raw = Signal(QUOTIENT_BITS + 16)
        m.d.comb += [md_raw.eq((op.q * GAMMA_FX) >> 16),
                     md_factor.eq(Mux(md_raw > MD_MAX_FX, MD_MAX_FX, md_raw))]
        md_cut = Signal(CWND_FX_BITS)
        m.d.comb += md_cut.eq((cur.cwnd * md_factor) >> 16)

        m.d.comb += nxt.eq(cur)
        with m.Switch(op.op):
            with m.Case(NsccOp.RESET):
                m.d.comb += [nxt.eq(0), nxt.cwnd.eq(k.cwnd_init), nxt.adjust_at.eq(now),
                             nxt.eta_at.eq(now), nxt.qa_end.eq(now + k.qa_span_default)]
            with m.Case(NsccOp.APPLY):
                with m.If(cur.pending):
                    m.d.comb += [nxt.pending.eq(0),
                                 nxt.cwnd.eq(clamp(Mux(op.decrease, cur.cwnd - md_cut,
                                                       cur.cwnd + op.q)))]
            with m.Default():       # ACK and NACK: quick adapt first
                with m.If(is_ack):
                    m.d.comb += [nxt.base.eq(base), nxt.base_valid.eq(1),
                                 nxt.avg.eq(avg_new)]
                m.d.comb += [nxt.qa_trig.eq(qa_trig), nxt.qa_psns.eq(qa_psns)]
                with m.If(qa_due):
                    m.d.comb += [nxt.qa_psns.eq(0), nxt.qa_end.eq(now + qa_span)]
                with m.If(qa_acts):
                    m.d.comb += [nxt.cwnd.eq(clamp(Cat(C(0, mtu_shift), qa_psns))),
                                 nxt.qa_trig.eq(0), nxt.inc.eq(0), nxt.adjust.eq(0),
                                 nxt.pending.eq(0)]
                with m.Elif(~is_ack):
                    m.d.comb += nxt.cwnd.eq(clamp(Cat(cur.cwnd, C(0, 1)).as_signed() - k.cwnd_min))
                with m.Else():
                    with m.If(~fast_delay | (op.ecn & ~below)):
                        m.d.comb += [nxt.fast.eq(0), nxt.fast_psns.eq(0)]
                    with m.If(~op.ecn & below & fast_delay):
                        m.d.comb += [nxt.fast_psns.eq(fast_psns), nxt.fast.eq(fast_on)]
                    m.d.comb += [nxt.cwnd.eq(cwnd_rule), nxt.inc.eq(inc_new),
                                 nxt.adjust.eq(adjust)]
                    with m.If(md_launch):
                        m.d.comb += [launch.eq(1), launch_decrease.eq(1),
                                     dividend.eq(Cat(C(0, 16), avg_new - k.target_avg)),
                                     divisor.eq(avg_new),
                                     nxt.pending.eq(1), nxt.md_valid.eq(1), nxt.md_at.eq(now)]
                    with m.If(adjust_end):
                        with m.If(inc_new != 0):
                            m.d.comb += [launch.eq(1), dividend.eq(inc_new),
                                         divisor.eq(cwnd_rule), nxt.pending.eq(1)]
                        with m.If(eta_due):
                            m.d.comb += [nxt.cwnd.eq(clamp(cwnd_rule + k.eta)),
                                         nxt.eta_at.eq(now)]
                        m.d.comb += [nxt.inc.eq(0), nxt.adjust.eq(0), nxt.adjust_at.eq(now)]

        m.d.comb += [
            write.en.eq(fire), write.addr.eq(op.qpn), write.data.eq(nxt),
            divider.i.valid.eq(fire & launch),
            divider.i.payload.dividend.eq(dividend), divider.i.payload.divisor.eq(divisor),
        ]
        with m.If(fire & launch):
            m.d.sync += [job_qpn.eq(op.qpn), job_decrease.eq(launch_decrease)]
        with m.If(advance):
            m.d.sync += [prev.valid.eq(s2.valid), prev.qpn.eq(op.qpn), prev.state.eq(nxt),
                         prev2.eq(prev)]

        window = (nxt.cwnd >> mtu_shift)
        update = self.o.payload
        m.d.comb += [
            self.o.valid.eq(s2.valid),
            update.qpn.eq(op.qpn), update.op.eq(op.op), update.cwnd.eq(nxt.cwnd),
            update.window.eq(Mux(window == 0, 1, Mux(window >> CWND_BITS != 0,
                                                     (1 << CWND_BITS) - 1, window))),
            update.now.eq(now), update.div_free.eq(div_free),
        ]
        return m
