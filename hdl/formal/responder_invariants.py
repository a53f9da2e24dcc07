"""Inductive invariants of the responder's tables and pipeline (``hdl/transport/responder.py``).

:class:`ResponderInvariants` wraps a :class:`~hdl.transport.responder.Responder` built with
``observe=True`` (an asynchronous read of its tables at one row, and S2's state) under the
same free inputs and assumptions as :mod:`.responder_props`, and states properties strong
enough for k-induction: each holds in *every* state that satisfies the others, not only in
the states reachable within a bound. For one QP (any: ``watch_qpn`` is an ``AnyConst``) the
wrapper keeps ``latest``, the row S2 last wrote back for it (all zeros before the first
write, like the tables after reset). Checks:

``cum_psn``
    The QP's cumulative PSN never moves backwards: every write-back of its row, except an
    accepted ``QP_WRITE`` with ``set_psn``, sets the expected PSN to ``epsn + a`` with
    ``0 <= a <= CHUNK`` (24-bit serial arithmetic), ``epsn`` being the latest one written.
``placed_once``
    No PSN is placed twice: for one PSN (an ``AnyConst``), S2 gives the verdict PLACED at most
    once between two accepted ``QP_WRITE set_psn`` of the QP, unless the expected PSN has
    moved on by half the PSN space in between (then the PSN has come round again: it lies
    more than a window ahead, where nothing is placed, and its flag is dropped).
``placed_once_mutant``
    The same on a responder with one forwarding path removed (``forward_prev2``: S1 no longer
    takes the write-back of two cycles ago): the proof must fail, which shows it can.

Supporting invariants, asserted by every check (k-induction assumes them for k steps and
proves them in the next):

- *tables*: the tables' row of the QP equals ``latest``, except in the cycle after S2 wrote it
  (the write-back reaches the table from a register, a cycle later);
- *forwarding*: whenever S2 holds an operation of the QP, the row it decides on (``st``, the
  table's data with the two pending write-backs and S2's own forwarded) equals ``latest``;
- *configuration*: the QP's MPR is at most ``config.mpr_units`` (``QP_WRITE`` refuses more);
- *placed* (``placed_once``): a placed PSN is recorded in ``latest``: below the expected PSN,
  or inside the window with its receive bit set, or more than a window ahead (come round).
"""

from amaranth import *
from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Assume

from .. import protocol as P
from ..config import NicConfig
from ..transport.responder import CHUNK, Responder
from ..util import validating
from .common import psn_ge
from .responder_props import drive_inputs

__all__ = ["ResponderInvariants", "CHECKS"]

CHECKS = ("cum_psn", "placed_once", "placed_once_mutant")


def _without_prev2(text):
    """The RTLIL of the responder with S1's forwarding of ``prev2`` cut: the select of the
    write-back of two cycles ago (``prev2.valid & (prev2.qpn == s1.qpn)``) tied to 0."""
    line = "    connect \\A \\prev2 [0]\n"
    if text.count(line) != 1:
        raise ValueError("Mutant: the select of prev2's forwarding is not found once in the "
                         "RTLIL; the responder's S1 has changed, update the mutant")
    return text.replace(line, "    connect \\A 1'0\n")


def _decided(row):
    """The fields of a row the properties read: expected PSN, MPR and receive bitmap. (The
    whole row is forwarded alike; equality of all of it is as true but makes the solver's
    induction step more than ten times slower.)"""
    return Cat(row.qp.epsn, row.qp.mpr, row.bm.rcv)


class ResponderInvariants(Elaboratable):
    """A :class:`Responder` (``observe=True``) with free inputs and the invariants of ``check``.

    Parameters
    ----------
    config : NicConfig
    check : str
        One of :data:`CHECKS`.
    mr_slots, timers, completions : int
        The responder's own parameters, smallest by default.
    """

    def __init__(self, *, config, check, mr_slots=1, timers=1, completions=2):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
            if check not in CHECKS:
                raise ValueError(f"Check must be one of {', '.join(CHECKS)}, not {check!r}")
        self.config = config
        self.check = check
        self.dut = Responder(config=config, mr_slots=mr_slots, timers=timers,
                             completions=completions, observe=True)
        #: Applied by :func:`sim.formal.run_formal` to the RTLIL before the proof.
        self.rtlil_patch = _without_prev2 if check.endswith("_mutant") else None

    def elaborate(self, platform):
        m = Module()
        config = self.config
        window = config.window_psns
        m.submodules.dut = dut = self.dut
        check = self.check
        drive_inputs(m, dut)
        obs = dut.obs

        watch_qpn = Signal(config.qpn_bits)
        m.d.comb += [watch_qpn.eq(AnyConst(config.qpn_bits)), Assume(watch_qpn < config.qps),
                     dut.obs_qpn.eq(watch_qpn), dut.obs_slot.eq(0)]

        # `latest`: the row S2 last wrote back for the watched QP.
        latest = Signal.like(obs.new_state)
        mine = obs.e_row & (obs.e_qpn == watch_qpn)
        write = obs.table_write & (obs.e_qpn == watch_qpn)
        wrote = Signal()                # the write reaches the table at the end of this cycle
        m.d.sync += wrote.eq(write)
        with m.If(write):
            m.d.sync += latest.eq(obs.new_state)
        m.d.comb += [
            Assert(wrote | (_decided(obs.row) == _decided(latest)),
                   "the table's row is the latest write-back"),
            Assert(~mine | (_decided(obs.st) == _decided(latest)),
                   "S2 decides on the latest row"),
            Assert(latest.qp.mpr <= config.mpr_units, "MPR within the configuration"),
        ]
        restart = write & obs.set_rx

        if check == "cum_psn":
            advance = (obs.new_state.qp.epsn - latest.qp.epsn)[:P.PSN_BITS]
            with m.If(write & ~restart):
                m.d.comb += Assert(psn_ge(obs.new_state.qp.epsn, latest.qp.epsn) &
                                   (advance <= CHUNK), "the cumulative PSN moved backwards")

        if check.startswith("placed_once"):
            watch_psn = Signal(P.PSN_BITS)
            m.d.comb += watch_psn.eq(AnyConst(P.PSN_BITS))
            distance = Signal(P.PSN_BITS)           # watch_psn - epsn
            m.d.comb += distance.eq(watch_psn - latest.qp.epsn)
            below = distance[P.PSN_BITS - 1]
            far_ahead = ~below & (distance >= window)
            in_window = ~below & (distance < window)
            received = in_window & latest.bm.rcv.bit_select(distance[:(window - 1).bit_length()],
                                                           1)
            placed_flag = Signal()      # the watched PSN was placed since the last restart
            placed_now = mine & obs.e_fire & obs.placed & (obs.e_psn == watch_psn)
            m.d.comb += [
                Assert(~placed_now | ~placed_flag, "a PSN placed twice"),
                Assert(~placed_flag | below | received | far_ahead,
                       "a placed PSN is recorded in the row"),
            ]
            with m.If(placed_now):
                m.d.sync += placed_flag.eq(1)
            with m.If(restart | (far_ahead & ~placed_now)):
                m.d.sync += placed_flag.eq(0)
        return m
