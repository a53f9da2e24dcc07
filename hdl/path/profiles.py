"""The per-profile registers of path select: parameters, state, the entry bitmaps and counts.

Every EV profile (at most 16) keeps its parameters, its state and five bitmaps of
``evs_per_profile`` bits (good, written, denied, high penalty, SKIP) in flip-flops, with the
usable (good), fresh (good, not SKIP) and low (good, not high and not SKIP) counts. The
selector reads them for every request, the entry update for every operation and the control
for every command; only the entry update
(``commit``) and the control (``set``, ``state_set``, ``clear``) write them.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..protocol import EvMode
from ..util import validating
from .pathdefs import (
    COUNT_BITS,
    PROFILE_ID_BITS,
    entry_commit_layout,
    profile_params_layout,
)

__all__ = ["ProfileTable"]


class ProfileTable(wiring.Component):
    """Per-profile parameters, states and entry bitmaps, with the selector's candidate sets.

    ``set``, ``state_set``, ``clear`` and ``commit`` take effect one cycle after they are
    given (each is registered first, so no enable reaches the bitmaps from another
    component's logic); reads are the registers. ``candidates`` (the
    usable EVs a data request may take: good; outside AUTO mode, with enough fresh EVs, not
    SKIP; and for an adaptive profile with enough low EVs neither high nor SKIP) and
    ``candidates_any`` are registered from the bitmaps and counts, so they follow a change one
    cycle after the bitmaps do. Outside AUTO mode a
    profile passes its SKIP EVs over while enough fresh ones remain (MRC 1.0's SKIP state);
    AUTO keeps a QP on its hashed EV (the single-path baseline) while it is usable. A
    ``clear`` wins over a ``commit`` applied in the same cycle (the control clears only while
    the entry update is idle, so they never coincide).

    Parameters
    ----------
    config : NicConfig

    Members
    -------
    set_en, set_profile, set_params : ``In``
        PROFILE_SET: store ``set_params`` (:func:`~hdl.path.pathdefs.profile_params_layout`).
    state_en, state_profile, state_value : ``In``
        Set a profile's :class:`~hdl.protocol.ProfileState`.
    clear_en, clear_profile : ``In``
        Forget every entry of a profile (all bitmaps and counts to zero).
    commit : ``In(entry_commit_layout(config))``
        One entry's new state bits, from the entry update.
    params, state, good, written, denied, high, skip, good_count, fresh_count, low_count :
        ``Out``
        One element per profile (``data.ArrayLayout``).
    candidates : ``Out(ArrayLayout(evs_per_profile, ev_profiles))``, candidates_any : ``Out``
    """

    def __init__(self, *, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        n, evs = config.ev_profiles, config.evs_per_profile
        super().__init__({
            "set_en": In(1),
            "set_profile": In(PROFILE_ID_BITS),
            "set_params": In(profile_params_layout(config)),
            "state_en": In(1),
            "state_profile": In(PROFILE_ID_BITS),
            "state_value": In(2),
            "clear_en": In(1),
            "clear_profile": In(PROFILE_ID_BITS),
            "commit": In(entry_commit_layout(config)),
            "params": Out(data.ArrayLayout(profile_params_layout(config), n)),
            "state": Out(data.ArrayLayout(unsigned(2), n)),
            "good": Out(data.ArrayLayout(unsigned(evs), n)),
            "written": Out(data.ArrayLayout(unsigned(evs), n)),
            "denied": Out(data.ArrayLayout(unsigned(evs), n)),
            "high": Out(data.ArrayLayout(unsigned(evs), n)),
            "skip": Out(data.ArrayLayout(unsigned(evs), n)),
            "good_count": Out(data.ArrayLayout(unsigned(COUNT_BITS), n)),
            "fresh_count": Out(data.ArrayLayout(unsigned(COUNT_BITS), n)),
            "low_count": Out(data.ArrayLayout(unsigned(COUNT_BITS), n)),
            "candidates": Out(data.ArrayLayout(unsigned(evs), n)),
            "candidates_any": Out(n),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        n = self._config.ev_profiles
        # The commit is registered first: its enables and data reach every bitmap bit from
        # flip-flops, not from the entry update's decision logic.
        commit = Signal(entry_commit_layout(self._config))
        m.d.sync += commit.eq(self.commit)
        new_low = commit.good & ~commit.high & ~commit.skip
        new_fresh = commit.good & ~commit.skip
        # So are the control's writes: the clear resets every bitmap bit, and its enable
        # must not come from the command checks' logic.
        ctl = Signal(data.StructLayout({
            "set_en": 1, "set_profile": PROFILE_ID_BITS,
            "set_params": profile_params_layout(self._config),
            "state_en": 1, "state_profile": PROFILE_ID_BITS, "state_value": 2,
            "clear_en": 1, "clear_profile": PROFILE_ID_BITS}))
        m.d.sync += [getattr(ctl, name).eq(getattr(self, name)) for name in (
            "set_en", "set_profile", "set_params", "state_en", "state_profile", "state_value",
            "clear_en", "clear_profile")]
        for p in range(n):
            params = self.params[p]
            with m.If(ctl.set_en & (ctl.set_profile == p)):
                m.d.sync += params.eq(ctl.set_params)
            with m.If(ctl.state_en & (ctl.state_profile == p)):
                m.d.sync += self.state[p].eq(ctl.state_value)

            good, written, denied, high, skip = (self.good[p], self.written[p],
                                                 self.denied[p], self.high[p], self.skip[p])
            good_count, low_count = self.good_count[p], self.low_count[p]
            fresh_count = self.fresh_count[p]
            with m.If(commit.valid & (commit.profile == p)):
                m.d.sync += [
                    good.bit_select(commit.index, 1).eq(commit.good),
                    denied.bit_select(commit.index, 1).eq(commit.denied),
                    written.bit_select(commit.index, 1).eq(commit.written),
                    high.bit_select(commit.index, 1).eq(commit.high),
                    skip.bit_select(commit.index, 1).eq(commit.skip),
                ]
                with m.If(commit.good & ~commit.was_good):
                    m.d.sync += good_count.eq(good_count + 1)
                with m.Elif(~commit.good & commit.was_good):
                    m.d.sync += good_count.eq(good_count - 1)
                with m.If(new_fresh & ~commit.was_fresh):
                    m.d.sync += fresh_count.eq(fresh_count + 1)
                with m.Elif(~new_fresh & commit.was_fresh):
                    m.d.sync += fresh_count.eq(fresh_count - 1)
                with m.If(new_low & ~commit.was_low):
                    m.d.sync += low_count.eq(low_count + 1)
                with m.Elif(~new_low & commit.was_low):
                    m.d.sync += low_count.eq(low_count - 1)
            # After the commit: a clear wins.
            with m.If(ctl.clear_en & (ctl.clear_profile == p)):
                m.d.sync += [good.eq(0), written.eq(0), denied.eq(0), high.eq(0), skip.eq(0),
                             good_count.eq(0), fresh_count.eq(0), low_count.eq(0)]

            # Adaptive: high-penalty and SKIP EVs are passed over while enough low ones remain:
            # at least min_active and at least half the usable ones (so skipping at most doubles
            # the load on an EV: a plane just back from a failure, with clean penalties, must
            # not draw every packet).
            # (Half the usable ones rounded up: 2 * low >= good, one comparison, no adder.
            # The reductions are taken before the choice, in parallel with the comparisons.)
            # SKIP alone (outside AUTO mode) by the same rule, with the fresh count.
            low = good & ~high & ~skip
            fresh = good & ~skip
            use_low = (params.adaptive & (low_count != 0) & (low_count >= params.min_active)
                       & ((low_count << 1) >= good_count))
            use_fresh = ((params.mode != EvMode.AUTO) & (fresh_count != 0)
                         & (fresh_count >= params.min_active) & ((fresh_count << 1) >= good_count))
            m.d.sync += [
                self.candidates[p].eq(Mux(use_low, low, Mux(use_fresh, fresh, good))),
                self.candidates_any[p].eq(Mux(use_low, low.any(),
                                              Mux(use_fresh, fresh.any(), good.any()))),
            ]
        return m
