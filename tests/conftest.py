"""Suite-wide test configuration: markers, xdist groups, the deep formal option, the repo root.

Markers (registered in ``pyproject.toml``, ``--strict-markers``) are given here from one table
rather than in each file, keyed by file name (and by test function for files that mix fast
and slow tests), so they survive moving a file to another folder:

``rtl``     runs exported Verilog under cocotb (Icarus or Verilator)
``formal``  runs SymbiYosys (``sim/formal.py``)
``synth``   runs Yosys synthesis or nextpnr
``slow``    takes long enough to leave out of the inner loop: ``make test-fast`` runs
            ``-m "not slow"``; ``make test`` runs everything

Every test also gets an ``xdist_group``. ``make test`` runs ``--dist loadgroup``: one group
runs in one worker, in collection order. A test's group is its file, as under ``--dist
loadfile`` (a file's tests may share a Verilator build folder), except in the files of
:data:`SPLIT`, whose tests share nothing and form a group each, and the tests of
:data:`JOIN`, which share a build folder with another file. Groups are sent longest first
(:data:`LONGEST_FIRST`), so the two workers finish together instead of one waiting on a long
file that came last. ``docs/testing.md`` has the measurements behind the tables.
"""

from pathlib import Path

import pytest

from sim.formal import deep_requested

#: Markers every test of a file gets.
FILE_MARKS = {
    "test_formal.py": {"formal"},
    "test_nic_rtl.py": {"rtl", "slow"},
    "test_packet_engine_rtl.py": {"rtl", "slow"},
    "test_ports.py": {"rtl", "slow"},
}

#: Markers of single tests, ``"file::function"`` (every parametrization of the function).
TEST_MARKS = {
    "test_formal.py::test_responder_places_a_psn_at_most_once": {"slow"},
    "test_formal.py::test_responder_cumulative_psn_never_moves_backwards": {"slow"},
    "test_formal.py::test_responder_placement_is_reachable": {"slow"},
    "test_formal.py::test_responder_covers_placement_duplicate_ack_and_restart": {"slow"},
    "test_formal.py::test_requester_new_psns_consecutive_and_inside_window": {"slow"},
    "test_formal.py::test_requester_covers_sends_and_an_ack_moving_una": {"slow"},
    "test_formal.py::test_a_check_past_its_time_limit_fails_naming_the_check_and_the_limit":
        {"slow"},
    "test_waves.py::test_port_loop_window_under_each_simulator": {"rtl", "slow"},
    "test_waves.py::test_two_nics_window_without_rebuild": {"rtl", "slow"},
}

#: Files whose tests share no build folder: each test (each parametrization) is a group.
SPLIT = {"test_formal.py"}

#: Tests that share a build folder with another file's tests: ``"file::function"`` -> file.
JOIN = {
    # Both use build/tests/nic_pair (one export, one Verilator model each with and without
    # tracing): two workers must not build it at the same time.
    "test_waves.py::test_two_nics_window_without_rebuild": "test_nic_rtl.py",
}

#: Groups in the order the workers should take them, longest first; a split file's groups
#: are named ``"file::function"``. Groups not listed follow, in collection order.
LONGEST_FIRST = [
    "test_nic_rtl.py",
]


def pytest_addoption(parser):
    parser.addoption("--formal-deep", action="store_true",
                     help="run the formal checks at their deep depths (make formal); "
                          "MRC_FORMAL_DEEP=1 does the same")


def _keys(item):
    """``(file name, "file::function")`` of a test item."""
    file = Path(str(item.path)).name
    function = getattr(item, "originalname", None) or item.name.split("[")[0]
    return file, f"{file}::{function}"


def _group(item):
    file, test = _keys(item)
    if test in JOIN:
        return JOIN[test]
    if file in SPLIT:
        return f"{file}::{item.nodeid.split('::', 1)[1]}"
    return file


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        file, test = _keys(item)
        for name in sorted(FILE_MARKS.get(file, set()) | TEST_MARKS.get(test, set())):
            item.add_marker(name)
        item.add_marker(pytest.mark.xdist_group(_group(item)))

    def rank(item):
        group = _group(item)
        for position, name in enumerate(LONGEST_FIRST):
            if group == name or group.startswith(f"{name}["):
                return position
        return len(LONGEST_FIRST)
    items.sort(key=rank)        # stable: within a rank, collection order


@pytest.fixture(scope="session")
def formal_deep(request):
    """True when the formal checks should run at their deep depths."""
    return request.config.getoption("--formal-deep") or deep_requested()


@pytest.fixture(scope="session")
def repo_root(request):
    """The repository's top folder (where ``pyproject.toml`` is), wherever the test file is."""
    return Path(request.config.rootpath)
