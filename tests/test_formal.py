# amaranth: UnusedElaboratable=no
"""Formal checks of the sequence trackers (docs/formal.md), run through SymbiYosys.

Each test runs one sby task and asserts its outcome; ``python -m sim.formal`` runs the
registered (deeper) checks of :data:`sim.formal.PROOFS`.
"""

import pytest

from hdl.config import NicConfig
from hdl.formal.examples import SerialCounter
from hdl.formal.requester_props import RequesterProperties
from hdl.formal.requester_props import formal_config as requester_config
from hdl.formal.responder_props import ResponderProperties
from hdl.formal.responder_props import formal_config as responder_config
from sim.formal import FormalError, run_formal, run_proof

#: Seconds a proof may take. The runs take 1-3 minutes alone; `make test` runs two test files
#: at once and a Verilator build may share the core, so the limit leaves a wide margin (a run
#: that hits it fails with TIMEOUT, never passes).
SOLVER_TIMEOUT = 1200


def test_harness_proves_a_true_property_by_induction(tmp_path):
    result = run_formal(SerialCounter(), name="counter", mode="prove", depth=4,
                        directory=tmp_path, timeout=SOLVER_TIMEOUT)
    assert result.status == "PASS", result.summary()


def test_harness_catches_a_counter_that_moves_backwards(tmp_path):
    """A PASS means something: the same check on a mutated counter fails, and the result
    names the failing assertion."""
    result = run_formal(SerialCounter(backwards_bug=True), name="mutant", mode="bmc",
                        depth=40, directory=tmp_path, timeout=SOLVER_TIMEOUT)
    assert result.status == "FAIL", result.summary()
    assert any("examples.py" in failure for failure in result.failures)


def test_harness_rejects_bad_arguments():
    with pytest.raises(FormalError, match="Mode must be one of"):
        run_formal(SerialCounter(), name="x", mode="sim")
    with pytest.raises(FormalError, match="Check name must be"):
        run_formal(SerialCounter(), name="a b")
    with pytest.raises(FormalError, match="Proof must be one of"):
        run_proof("nonsense")


def test_wrappers_validate_their_parameters():
    with pytest.raises(ValueError, match="Check must be one of"):
        ResponderProperties(config=responder_config(), check="everything")
    with pytest.raises(TypeError, match="Configuration must be a NicConfig"):
        RequesterProperties(config={"qps": 2}, check="window")
    assert isinstance(requester_config(), NicConfig)


def test_responder_places_a_psn_at_most_once(tmp_path):
    """BMC: every verdict answers one packet and the first placement is not a second one
    (all inputs free). Depth 5 (one verdict) keeps the test short; depth 6, two verdicts,
    is ``python -m sim.formal responder_placed_once`` (docs/formal.md: its solver time
    varies from 30 s to more than 10 minutes)."""
    result = run_formal(ResponderProperties(config=responder_config(), check="placed_once"),
                        name="responder_placed_once", mode="bmc", depth=5, directory=tmp_path,
                        timeout=SOLVER_TIMEOUT)
    assert result.status == "PASS", result.summary()


def test_responder_placement_is_reachable(tmp_path):
    """The deliberately wrong "nothing is ever placed" fails (the first verdict comes at
    step 4): the PASS above covers runs that place packets."""
    result = run_formal(ResponderProperties(config=responder_config(), check="never_placed"),
                        name="responder_never_placed", mode="bmc", depth=5,
                        directory=tmp_path, timeout=SOLVER_TIMEOUT)
    assert result.status == "FAIL", result.summary()
    assert any("responder_props.py" in failure for failure in result.failures)


def test_requester_new_psns_consecutive_and_inside_window(tmp_path):
    """BMC: new PSNs of a QP are consecutive and inside una + mpr x 128 (depth 7: the first
    packet after a QP_WRITE and a WR leaves at step 6)."""
    result = run_formal(RequesterProperties(config=requester_config(), check="window"),
                        name="requester_window", mode="bmc", depth=7, directory=tmp_path,
                        timeout=SOLVER_TIMEOUT)
    assert result.status == "PASS", result.summary()
