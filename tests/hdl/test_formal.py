# amaranth: UnusedElaboratable=no
"""Formal checks of the sequence trackers (docs/formal.md), run through SymbiYosys.

Each test runs one registered check of :data:`sim.formal.PROOFS` and asserts its outcome, at
the check's test depth; ``make formal`` (``--formal-deep`` or ``MRC_FORMAL_DEEP=1``) runs the
same tests at the deep depths. A check that runs past its time limit raises
:class:`~sim.formal.FormalTimeout`, so a solver that loses its way fails the test by name.
"""

import pytest

from hdl.config import NicConfig
from hdl.formal.examples import SerialCounter
from hdl.formal.requester_invariants import RequesterInvariants, _without_ack_forwarding
from hdl.formal.requester_props import RequesterProperties
from hdl.formal.requester_props import formal_config as requester_config
from hdl.formal.responder_invariants import ResponderInvariants
from hdl.formal.responder_props import ResponderProperties
from hdl.formal.responder_props import formal_config as responder_config
from hdl.transport.req_tables import RequesterTables
from hdl.transport.requester import Requester
from hdl.transport.responder import Responder
from sim.formal import PROOFS, FormalError, FormalTimeout, run_formal, run_proof


@pytest.fixture
def check(tmp_path, formal_deep):
    """Run a registered check at the depth this session asks for; return its result after
    asserting the registered outcome."""
    def run(name):
        result = run_proof(name, deep=formal_deep, directory=tmp_path)
        assert result.status == PROOFS[name].expected, result.summary()
        return result
    return run


# --- The harness ------------------------------------------------------------------------------

def test_harness_proves_a_true_property_by_induction(check):
    check("counter_prove")


def test_harness_catches_a_counter_that_moves_backwards(check):
    """A PASS means something: the same check on a mutated counter fails, and the result
    names the failing assertion."""
    result = check("counter_mutant")
    assert any("examples.py" in failure for failure in result.failures)


def test_a_counterexample_is_reported_as_a_waveform(check):
    """A FAIL names the VCD trace sby wrote, and the file is there."""
    result = check("counter_mutant")
    assert result.trace is not None and result.trace.suffix == ".vcd"
    assert result.trace.is_file() and result.trace.stat().st_size > 0
    assert str(result.trace) in result.summary()


def test_harness_rejects_bad_arguments():
    with pytest.raises(FormalError, match="Mode must be one of"):
        run_formal(SerialCounter(), name="x", mode="sim")
    with pytest.raises(FormalError, match="Check name must be"):
        run_formal(SerialCounter(), name="a b")
    with pytest.raises(FormalError, match="Solver must be one of"):
        run_formal(SerialCounter(), name="x", solver="abc")
    with pytest.raises(FormalError, match="Timeout must be a positive"):
        run_formal(SerialCounter(), name="x", timeout=0)
    with pytest.raises(FormalError, match="Proof must be one of"):
        run_proof("nonsense")


def test_a_check_past_its_time_limit_fails_naming_the_check_and_the_limit(tmp_path):
    """The limit covers Yosys as well as the solver, so one second stops any real check."""
    depth = PROOFS["requester_window"].depth
    with pytest.raises(FormalTimeout, match=rf"requester_window \(bmc, depth {depth}, yices\) "
                                            r"did not finish within its limit of 1 s"):
        run_proof("requester_window", timeout=1, directory=tmp_path)


def test_every_check_has_a_deep_depth_at_least_its_test_depth():
    for name, proof in PROOFS.items():
        assert proof.deep_depth >= proof.depth, name
        assert proof.deep_timeout >= proof.timeout, name


def test_wrappers_validate_their_parameters():
    with pytest.raises(ValueError, match="Check must be one of"):
        ResponderProperties(config=responder_config(), check="everything")
    with pytest.raises(TypeError, match="Configuration must be a NicConfig"):
        RequesterProperties(config={"qps": 2}, check="window")
    assert isinstance(requester_config(), NicConfig)
    with pytest.raises(ValueError, match="Check must be one of"):
        ResponderInvariants(config=responder_config(), check="all")
    with pytest.raises(ValueError, match="Check must be one of"):
        RequesterInvariants(config=requester_config(), check="everything")


def test_observation_ports_are_off_by_default():
    """Only ``observe=True`` adds the ports the induction proofs read."""
    plain = Responder(config=responder_config(), mr_slots=1, timers=1, completions=2)
    observed = Responder(config=responder_config(), mr_slots=1, timers=1, completions=2,
                         observe=True)
    added = set(observed.signature.members) - set(plain.signature.members)
    assert added == {"obs_qpn", "obs_slot", "obs"}
    with pytest.raises(TypeError, match="Observe must be a bool"):
        Responder(config=responder_config(), observe=1)


def test_requester_observation_ports_are_off_by_default():
    """Only ``observe=True`` adds the ports the requester's induction proof reads, on the
    requester and on its tables."""
    plain = Requester(config=requester_config())
    observed = Requester(config=requester_config(), observe=True)
    assert set(observed.signature.members) - set(plain.signature.members) == {"obs_qpn", "obs"}
    tables = RequesterTables(config=requester_config())
    assert "obs" not in tables.signature.members
    assert "obs" in RequesterTables(config=requester_config(), observe=True).signature.members
    with pytest.raises(TypeError, match="Observe must be a bool"):
        Requester(config=requester_config(), observe="yes")


def test_requester_mutant_refuses_a_design_it_cannot_patch():
    """The mutant names the line it cuts; a changed A1 raises instead of proving the unmutated
    design."""
    with pytest.raises(ValueError, match="A1's ack forwarding is not found once"):
        _without_ack_forwarding("module top\nend\n")


# --- Responder --------------------------------------------------------------------------------

def test_responder_places_a_psn_at_most_once(check):
    """BMC: every verdict answers one packet and a PSN placed once is not placed again
    (all inputs free; depth 6 has two verdicts, so a second packet of the same PSN)."""
    check("responder_placed_once")


def test_responder_cumulative_psn_never_moves_backwards(check):
    """BMC: the cum_psn of a QP's successive ACKs/NAKs never moves backwards, except across
    an accepted QP_WRITE set_psn."""
    check("responder_cum_psn")


def test_responder_placement_is_reachable(check):
    """The deliberately wrong "nothing is ever placed" fails (the first verdict comes at
    step 4): the PASS above covers runs that place packets."""
    result = check("responder_never_placed")
    assert any("responder_props.py" in failure for failure in result.failures)


def test_responder_covers_placement_duplicate_ack_and_restart(check):
    """Every Cover is reached: a placement, a duplicate of a placed PSN, an ACK that moves
    cum_psn and a restart after a placement, so the asserts above are not vacuous."""
    check("responder_cover")


# --- Responder, by k-induction -----------------------------------------------------------------

def test_responder_cumulative_psn_never_moves_backwards_by_induction(check):
    """k-induction (unbounded): the tables and S2 always hold a QP's latest row, and every
    write-back moves its expected PSN forward by 0 to CHUNK, except a restart."""
    check("responder_induct_cum_psn")


def test_responder_sack_cumulative_psn_never_moves_backwards_by_induction(check):
    """k-induction: the cum_psn of a QP's successive SACKs on ack never moves backwards
    (24-bit serial), except across an accepted QP_WRITE set_psn."""
    check("responder_induct_sack")


def test_responder_sack_environment_moves_and_repeats_the_cumulative_psn(check):
    """The SACK proof's environment reaches a SACK moving cum_psn on, one repeating it and two
    SACKs of the QP in the reply stage at once, so its PASS is not vacuous."""
    check("responder_induct_sack_cover")


def test_responder_places_a_psn_at_most_once_by_induction(check):
    """k-induction: a PSN placed is recorded in the QP's row until a restart or until the
    expected PSN has moved half the PSN space on, so S2 never places it again."""
    check("responder_induct_placed_once")


def test_responder_writes_only_inside_the_region_by_induction(check):
    """k-induction: every beat on place lies inside the region of the MR entry its packet was
    checked against, for payloads that fit their dma_len."""
    check("responder_induct_region")


def test_responder_induction_environment_places_multi_beat_payloads(check):
    """The region proof's environment reaches a third placed beat and a partial last one, so
    its PASS is not vacuous."""
    check("responder_induct_cover")


def test_responder_proof_fails_without_the_prev2_forwarding(check):
    """The same proof on a responder whose S1 misses the write-back of two cycles ago fails,
    with a counterexample from reset as a waveform: the induction proofs can fail."""
    result = check("responder_induct_mutant")
    assert any("responder_invariants.py" in failure for failure in result.failures)
    assert result.trace is not None and result.trace.is_file()


# --- Requester --------------------------------------------------------------------------------

def test_requester_new_psns_consecutive_and_inside_window(check):
    """BMC: new PSNs of a QP are consecutive and inside una + mpr x 128 (the first packet
    after a QP_WRITE and a WR leaves at step 7)."""
    check("requester_window")


def test_requester_covers_sends_and_an_ack_moving_una(check):
    """Every Cover is reached: a new packet, a second one, and an ACK moving una after a
    send."""
    check("requester_cover")


# --- Requester, by k-induction -----------------------------------------------------------------

def test_requester_window_never_exceeds_mpr_by_induction(check):
    """k-induction (unbounded): after a QP_WRITE of the QP, next_psn - una never exceeds
    mpr x 128 and its new PSNs leave consecutive from the QP_WRITE's PSN, inside the window;
    QP_WRITEs of the QP are free at any time (each accepted one restarts the property)."""
    check("requester_induct_window")


def test_requester_induction_environment_sends_and_moves_una(check):
    """The window proof's environment sends new packets, moves una by ACKs, sends after that,
    has an ACK decide on the write-back of the one ahead, and resets the QP by a second
    QP_WRITE and sends from its new PSN, so its PASS is not vacuous."""
    check("requester_induct_cover")


def test_requester_proof_fails_without_the_ack_forwarding(check):
    """The same proof on a requester whose A1 misses the write-back of the ACK ahead fails,
    with a counterexample from reset as a waveform: the proof can fail."""
    result = check("requester_induct_mutant")
    assert any("requester_invariants.py" in failure for failure in result.failures)
    assert result.trace is not None and result.trace.is_file()
