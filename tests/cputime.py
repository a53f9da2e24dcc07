"""A pytest plugin that records each test's processor time: its own and its subprocesses'
(``os.times()`` around the test's setup, call and teardown), with its wall time, one JSON line
per test appended to the file ``MRC_CPUTIME`` (default ``build/cputime.jsonl``).

``.venv/bin/python -m pytest -p tests.cputime tests/sim/test_replay.py``: what a change of a
test file costs or saves, on a machine other jobs share (``docs/testing.md``, "Measurements").
A subprocess's time counts once it has ended and been waited for, as every simulator and
export of the suite is.
"""

import json
import os
import time
from pathlib import Path

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, wall = os.times(), time.monotonic()
    yield
    end = os.times()
    own = end.user - start.user + end.system - start.system
    children = (end.children_user - start.children_user
                + end.children_system - start.children_system)
    path = Path(os.environ.get("MRC_CPUTIME", "build/cputime.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"test": item.nodeid, "own_s": round(own, 2),
                              "children_s": round(children, 2),
                              "cpu_s": round(own + children, 2),
                              "wall_s": round(time.monotonic() - wall, 2)}) + "\n")
