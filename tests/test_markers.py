"""The marker and group tables of tests/conftest.py name tests that exist: a renamed test or
file would otherwise silently lose its ``slow`` mark (and slow the inner loop down) or its
group (and let two workers build one folder at once)."""

import re
from pathlib import Path

import conftest

TESTS = Path(conftest.__file__).resolve().parent


def _test_file(name):
    """The test file called ``name`` anywhere under tests/."""
    found = sorted(TESTS.rglob(name))
    assert found, f"tests/conftest.py names {name}, which does not exist"
    return found[0].read_text()


def _assert_defines(file, function):
    assert re.search(rf"^(async )?def {function}\(", _test_file(file), re.M), \
        f"tests/conftest.py names {file}::{function}, which does not exist"


def test_marker_tables_name_existing_tests():
    for file in conftest.FILE_MARKS:
        _test_file(file)
    for file, functions in conftest.TEST_MARKS.items():
        for function in functions:
            _assert_defines(file, function)


def test_group_tables_name_existing_tests():
    for file in conftest.SPLIT:
        _test_file(file)
    for test, file in conftest.JOIN.items():
        _assert_defines(*test.split("::"))
        _test_file(file)
    for group in conftest.LONGEST_FIRST:
        file, _, function = group.partition("::")
        if function:
            _assert_defines(file, function)
        else:
            _test_file(file)


def test_only_registered_markers_are_given():
    given = set().union(*conftest.FILE_MARKS.values(),
                        *(marks for functions in conftest.TEST_MARKS.values()
                          for marks in functions.values()))
    assert given <= {"rtl", "formal", "synth", "slow", "formal_deep"}


def test_formal_deep_marks_only_formal_checks_with_a_deep_run():
    """make test leaves out the formal_deep tests because make formal runs them: each must be
    a formal test, and make test must keep at least one formal check of its own."""
    formal_files = {file for file, marks in conftest.FILE_MARKS.items() if "formal" in marks}
    for file, functions in conftest.TEST_MARKS.items():
        for function, marks in functions.items():
            if "formal_deep" in marks:
                assert file in formal_files, f"{file}::{function} is formal_deep, not formal"
    kept = [function for file in formal_files
            for function, marks in conftest.TEST_MARKS.get(file, {}).items()
            if "formal_deep" not in marks]
    assert kept, "make test would run no formal check"


def test_loadgroup_scheduler_groups_by_file_split_and_join(monkeypatch):
    """``--dist loadgroup`` schedules by :func:`conftest.group_of`, computed from the node id
    alone: a file's tests are one unit, a SPLIT file's tests one each, a JOIN test its file's."""
    class Config:
        def getvalue(self, name):
            return {"dist": "loadgroup", "tx": ["2*popen"]}.get(name)

    class Log:
        def __getattr__(self, name):
            return self

        def __call__(self, *args):
            pass

    scheduler = conftest.pytest_xdist_make_scheduler(Config(), Log())
    scope = scheduler._split_scope
    assert scope("tests/sim/test_cli.py::test_a[x-1]") == scope("tests/sim/test_cli.py::test_b")
    assert scope("tests/sim/test_cli.py::test_a") == "test_cli.py"
    split = sorted(conftest.SPLIT)[0]
    assert scope(f"tests/hdl/{split}::test_a[1]") != scope(f"tests/hdl/{split}::test_a[2]")
    assert scope(f"tests/hdl/{split}::Cls::test_a[1]") == f"{split}::Cls::test_a[1]"
    monkeypatch.setitem(conftest.JOIN, "test_cli.py::test_a", "test_waves.py")
    assert scope("tests/sim/test_cli.py::test_a[x]") == scope("tests/sim/test_waves.py::test_c")


def test_make_scheduler_leaves_other_distributions_to_xdist():
    class Config:
        def getvalue(self, name):
            return "loadfile" if name == "dist" else None

    assert conftest.pytest_xdist_make_scheduler(Config(), None) is None
