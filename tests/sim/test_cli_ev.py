"""``mrc-nic ev expand``: output formats and the one-line error with exit status 2."""

import json
import subprocess
import sys

import pytest

from sim import evtool
from sim.cli import main
from sim.env import REPO

# The worked examples of docs/ev-expansion.md (and tests/hdl/test_ev_expansion.py).
UDP_DOCUMENT = {
    "format": {"mode": "udp", "widths": [8, 8]},
    "profile": {
        "mode": "explicit",
        "fields": [
            {"width": 8, "init_val": "0xa5", "min_val": 0, "max_val": 15, "mask": "0x63"},
            {"width": 4, "init_val": "0x9", "min_val": 0, "max_val": 0, "mask": 0},
        ],
        "evs": ["b0", "00", "f0"],
    },
}
# b0 -> c709 (worked example); 00 -> 0xa5 & ~0x63 = 0x84: 8409;
# f0 takes 1111 -> deposited 0x63: 0x84 | 0x63 = 0xe7: e709.
UDP_IMAGES = [hex4.ljust(64, "0") for hex4 in ("c709", "8409", "e709")]

GENERATED_DOCUMENT = {
    "format": {"mode": "udp", "widths": [8, 8]},
    "profile": {
        "mode": "generated",
        "fields": [
            {"width": 8, "init_val": "0xc0", "min_val": 1, "max_val": 3, "mask": "0x03"},
            {"width": 8, "init_val": "0x10", "min_val": 0, "max_val": 1, "mask": "0x0f"},
        ],
        "count": 4,
    },
}
GENERATED_IMAGES = [hex4.ljust(64, "0") for hex4 in ("c110", "c111", "c210", "c211")]


def write(tmp_path, document, name="profile.json"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def run(capsys, *argv):
    """Run ``mrc-nic`` in this process: (status, stdout, stderr)."""
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_expand_prints_one_image_per_line_in_order(tmp_path, capsys):
    status, out, err = run(capsys, "ev", "expand", write(tmp_path, UDP_DOCUMENT))
    assert (status, err) == (0, "")
    assert out.splitlines() == UDP_IMAGES


def test_expand_json_prints_a_list(tmp_path, capsys):
    status, out, err = run(capsys, "ev", "expand", write(tmp_path, UDP_DOCUMENT), "--json")
    assert (status, err) == (0, "")
    assert json.loads(out) == UDP_IMAGES


def test_expand_generated_count(tmp_path, capsys):
    status, out, _ = run(capsys, "ev", "expand", write(tmp_path, GENERATED_DOCUMENT))
    assert status == 0
    assert out.splitlines() == GENERATED_IMAGES


def test_main_runs_the_same_parser(tmp_path, capsys):
    assert evtool.main(["ev", "expand", str(write(tmp_path, UDP_DOCUMENT))]) == 0
    assert capsys.readouterr().out.splitlines() == UDP_IMAGES


def broken(document, change):
    document = json.loads(json.dumps(document))
    change(document)
    return document


def set_mask(document):
    document["profile"]["fields"][0]["mask"] = "0x100"


def set_trailing_ev(document):
    document["profile"]["evs"][2] = "f8"


def set_count(document):
    document["profile"]["count"] = 7


ERROR_CASES = [
    pytest.param(broken(UDP_DOCUMENT, set_mask),
                 "profile.fields[0].mask: 0x100 has bits outside the field's "
                 "8-bit width (EINVAL)", id="mask"),
    pytest.param(broken(UDP_DOCUMENT, set_trailing_ev),
                 "profile.evs[2]: bit 4 is 1", id="trailing-bit"),
    pytest.param(broken(GENERATED_DOCUMENT, set_count),
                 "profile.count: 7 EVs requested, but the profile can make only "
                 "6 distinct EVs (E2BIG)", id="count"),
    pytest.param("{not json", "not valid JSON", id="json"),
    pytest.param("[]", "document: must be a JSON object", id="top-level"),
]


@pytest.mark.parametrize("document, expected", ERROR_CASES)
def test_bad_document_is_one_line_and_status_2(tmp_path, capsys, document, expected):
    path = write(tmp_path, document)
    status, out, err = run(capsys, "ev", "expand", path)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"mrc-nic ev expand: {path}: ")
    assert expected in err


def test_missing_file_is_one_line_and_status_2(tmp_path, capsys):
    status, out, err = run(capsys, "ev", "expand", tmp_path / "absent.json")
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "absent.json: cannot read" in err and "(ENOENT)" in err


# ---------------------------------------------------------------------------------------------
# Through the real entry point, as a user runs it
# ---------------------------------------------------------------------------------------------

def mrc_nic(*argv):
    return subprocess.run([sys.executable, "-m", "sim.cli", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_entry_point_expands(tmp_path):
    result = mrc_nic("ev", "expand", write(tmp_path, UDP_DOCUMENT))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == UDP_IMAGES
    result = mrc_nic("ev", "expand", "--json", write(tmp_path, GENERATED_DOCUMENT))
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout) == GENERATED_IMAGES


def test_entry_point_bad_document_is_one_line_and_status_2(tmp_path):
    path = write(tmp_path, broken(UDP_DOCUMENT, set_mask))
    result = mrc_nic("ev", "expand", path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (f"mrc-nic ev expand: {path}: profile.fields[0].mask: 0x100 has "
                             "bits outside the field's 8-bit width (EINVAL)\n")
