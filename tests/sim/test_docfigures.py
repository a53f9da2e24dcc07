"""The measured figures in docs/performance.md and docs/boards.md are generated from the
snapshots in docs/figures/ (``python -m sim.docfigures``)."""

import json
import re

import pytest

from sim import docfigures
from sim.docfigures import DOCS, load, render_document, sync, update, update_snapshot


def test_docs_are_in_sync_with_the_figure_snapshots():
    stale = sync(check=True)
    assert not stale, f"run: python -m sim.docfigures ({', '.join(map(str, stale))})"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_figure_names_its_command_seed_and_unit(name):
    for table in load(name)["tables"]:
        for row in table["rows"]:
            assert len(row) == len(table["columns"]), (table["name"], row[0])
            for cell in row:
                for fig in docfigures._figures(cell):
                    assert fig["command"] and "seed" in fig, fig
                    assert fig["unit"] or isinstance(fig["value"], str), fig
                    source = fig["source"]
                    assert source is None or source["file"] in (
                        "fabric", "recovery", "packet", "path", "incast", "synth"), source


@pytest.mark.parametrize("name", sorted(DOCS))
def test_docs_carry_no_commit_hashes_dates_or_issue_numbers(name):
    text = DOCS[name].read_text()
    assert not re.search(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b", text)
    assert not re.search(r"\bissue #?[0-9]", text, re.I)
    # Hex words that are not register values (``0x...``) or UART fields (``sent=0001e240``).
    words = re.findall(r"(?<![0-9a-fx=])[0-9a-f]{7,40}(?![0-9a-f])", text)
    assert not [w for w in words if re.search(r"[a-f]", w) and re.search(r"[0-9]", w)], words


def _snapshot():
    fig = {"value": 0.5, "unit": "", "format": ".3f", "command": "make bench", "seed": 1,
           "source": {"file": "fabric", "path": ["scenarios", "clean", "efficiency"]}}
    fmax = {"value": 90.0, "unit": "MHz", "command": "make bitstream BOARD=ecpix5", "seed": 1,
            "source": {"file": "synth", "select": {"kind": "board", "board": "ecpix5", "seed": 1},
                       "path": ["fmax", "*sync*", "achieved_mhz"]}}
    lut = {"value": 7, "unit": "", "command": "make bitstream BOARD=ecpix5", "seed": 1,
           "source": {"file": "synth", "select": {"kind": "board", "board": "ecpix5", "seed": 1},
                      "path": ["resources", "lut", "used"], "scale": 1}}
    return {"doc": "x.md", "tables": [
        {"name": "eff", "columns": ["entry", "efficiency", "target"],
         "rows": [["clean", fig, {"check": ">=", "limit": 0.97, "col": 1}]]},
        {"name": "fmax", "columns": ["board", "LUT", "fmax"],
         "rows": [["ecpix5", lut, fmax]]}]}


def test_render_fills_the_markers_and_says_met_or_missed():
    text = ("# t\n\n<!-- figures:eff begin -->\nold\n<!-- figures:eff end -->\n\n"
            "<!-- figures:fmax begin -->\n<!-- figures:fmax end -->\n")
    out = render_document(text, _snapshot())
    assert "| clean | 0.500 | >= 0.97: **missed** |" in out
    assert "Reproduce: `make bench` (seed 1)." in out
    assert "| ecpix5 | 7 | 90.0 MHz |" in out
    assert out.count("<!-- figures:eff begin -->") == 1 and "old" not in out
    assert render_document(out, _snapshot()) == out
    with pytest.raises(KeyError):
        render_document("no markers\n", _snapshot())


def test_update_takes_values_from_the_flows_json(tmp_path):
    snapshot = _snapshot()
    fabric = {"benchmark": "two RTL NICs", "scenarios": {"clean": {"efficiency": 0.98}},
              "comparison": {}, "cycles_per_second": {}}
    changed, missing = update(snapshot, fabric)
    assert changed == [("eff", 0.5, 0.98)] and not missing
    out = render_document("<!-- figures:eff begin -->\n<!-- figures:eff end -->\n"
                          "<!-- figures:fmax begin -->\n<!-- figures:fmax end -->\n", snapshot)
    assert ">= 0.97: met" in out

    # A bitstream's summary.json is one board entry; a synth report lists entries.
    summary = {"kind": "board", "board": "ecpix5", "seed": 1,
               "resources": {"lut": {"used": 19000, "available": 83640}},
               "fmax": {"$glbnet$cd_sync.clk": {"achieved_mhz": 120.5,
                                                  "constraint_mhz": 100.0}}}
    report = {"tools": {}, "seed": 1, "results": [
        {"kind": "board", "board": "versa", "seed": 1, "resources": {}, "fmax": {}}]}
    (tmp_path / "t.json").write_text(json.dumps(snapshot))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    changed, missing = update_snapshot("t", [report, tmp_path / "summary.json"], root=tmp_path)
    assert sorted(c[1:] for c in changed) == [(7, 19000), (90.0, 120.5)]
    assert not missing
    again = load("t", tmp_path)
    assert again["tables"][1]["rows"][0][2]["value"] == 120.5
    # A document that lacks a figure leaves it alone and says so.
    changed, missing = update_snapshot("t", [report], root=tmp_path)
    assert not changed and len(missing) == 2


def test_kind_of_each_flow_document():
    assert docfigures.kind_of({"scenarios": {}}) == "fabric"
    assert docfigures.kind_of({"results": {"plane-failure": {}}}) == "recovery"
    assert docfigures.kind_of({"benchmark": "packet engines", "results": []}) == "packet"
    assert docfigures.kind_of({"decisions_per_cycle": 1.0}) == "path"
    assert docfigures.kind_of({"results": []}) == "synth"
    assert docfigures.kind_of({"kind": "board", "resources": {}}) == "synth"


def _document_for(snapshot, kind):
    """A document of ``kind`` holding every sourced figure's value where its source points
    (globs replaced by a clock name), as the flow would write it."""
    doc = {"results": []} if kind == "synth" else {"scenarios": {}}
    for _, fig in docfigures._sourced(snapshot, kind):
        source, value = fig["source"], fig["value"]
        node = doc
        if source.get("select"):
            entry = next((e for e in doc["results"]
                          if all(e.get(k) == v for k, v in source["select"].items())), None)
            if entry is None:
                entry = dict(source["select"])
                doc["results"].append(entry)
            node = entry
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value / source.get("scale", 1)
        *keys, last = [k.replace("*", "clk") for k in source["path"]]
        for key in keys:
            node = node.setdefault(key, {})
        node[last] = value
    return doc


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_source_points_into_its_flows_json(name):
    """Each sourced figure is found again, unchanged, in a document of its flow's shape."""
    snapshot = load(name)
    kinds = {f["source"]["file"] for t in snapshot["tables"] for r in t["rows"] for c in r
             for f in docfigures._figures(c) if f["source"]}
    for kind in kinds:
        document = _document_for(snapshot, kind)
        assert docfigures.kind_of(document) == ("synth" if kind == "synth" else "fabric")
        changed, missing = update(snapshot, document, kind)
        assert not missing and not changed, (kind, changed[:3], missing[:3])


def test_cli_updates_from_a_flow_file_then_checks(tmp_path, monkeypatch, capsys):
    (tmp_path / "t.json").write_text(docfigures.dumps(_snapshot()))
    doc = tmp_path / "t.md"
    doc.write_text("<!-- figures:eff begin -->\n<!-- figures:eff end -->\n"
                   "<!-- figures:fmax begin -->\n<!-- figures:fmax end -->\n")
    monkeypatch.setattr(docfigures, "FIGURES", tmp_path)
    monkeypatch.setattr(docfigures, "DOCS", {"t": doc})
    assert docfigures.main(["--check"]) == 1
    assert docfigures.main([]) == 0 and docfigures.main(["--check"]) == 0
    fabric = tmp_path / "fabric.json"
    fabric.write_text(json.dumps({"scenarios": {"clean": {"efficiency": 0.99}}}))
    assert docfigures.main(["--update", str(fabric)]) == 0
    assert "eff: 0.5 -> 0.99" in capsys.readouterr().out
    assert "| clean | 0.990 | >= 0.97: met |" in doc.read_text()
    assert load("t", tmp_path)["tables"][0]["rows"][0][1]["value"] == 0.99
