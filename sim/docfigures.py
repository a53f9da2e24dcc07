"""Measured figures in the docs, generated from checked-in JSON snapshots.

``docs/figures/<name>.json`` holds the current figures of one document (``performance`` ->
``docs/performance.md``, ``boards`` -> ``docs/boards.md``): tables of rows, each cell a label
(a string), a figure, or a list of figures shown joined by `` / ``. A figure is a dict::

    {"value": 0.898, "unit": "", "format": ".3f", "command": "make bench", "seed": 1,
     "source": {"file": "fabric", "path": ["scenarios", "clean", "efficiency"]}}

``value`` is a number, a boolean (shown as yes / no), or a string for a figure that is a state
("not routed"); ``unit`` is shown after the value unless ``hide_unit`` (where the column
says it); ``command`` reproduces it; ``seed`` is the seed of the run (``null`` where the
flow has none); ``source`` says where the flow that ``command`` runs writes it (``null`` for a
figure no flow writes, e.g. one read from a build's log, which only an edit changes):

* ``file``: ``fabric`` (``build/bench/fabric.json``), ``recovery``, ``packet``, ``path``,
  ``incast`` (``build/bench/``), or ``synth``: ``build/synth/report.json`` or a bitstream build's
  ``build/boards/<board>/summary.json``;
* ``select`` (``synth`` only): the keys and values that pick one entry of ``results``, e.g.
  ``{"kind": "board", "board": "ecpix5"}``;
* ``path``: keys into that document or entry; a key may be a glob (``"*sync*"``), which
  takes the first matching key;
* ``ratio`` instead of ``path``: two paths, the figure is the first over the second;
* ``scale`` and ``round``: the value times ``scale`` (seconds to minutes), rounded.

A cell may also be a check against a target, ``{"check": ">=", "limit": 100, "unit": "MHz",
"col": 4}``: it shows the limit and whether the figure in column ``col`` of the same row (the
``item``-th of a list cell) meets it, so "met" and "missed" follow the figures.

Each table renders between ``<!-- figures:NAME begin -->`` and ``<!-- figures:NAME end -->``
in its document. ``python -m sim.docfigures`` re-renders the documents from the snapshots,
``--check`` fails when a document is out of date (``tests/sim/test_docfigures.py``), and
``--update FILE...`` first takes new values from the JSON that ``make bench``,
``boards.cli synth-report`` or ``boards.cli bitstream`` wrote (``--update-from-build``: every
such file present under ``build/``).
"""

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path

__all__ = ["DOCS", "FIGURES", "load", "dumps", "render_table", "render_document", "update",
           "update_snapshot", "sync", "main"]

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "docs" / "figures"
#: Snapshot name -> the document its tables render into.
DOCS = {"performance": REPO / "docs" / "performance.md",
        "boards": REPO / "docs" / "boards.md"}

_MARK = re.compile(r"(<!-- figures:(?P<name>[\w.-]+) begin -->\n)(?P<body>.*?)"
                   r"(<!-- figures:(?P=name) end -->)", re.S)


def load(name, root=FIGURES):
    return json.loads((Path(root) / f"{name}.json").read_text())


def dumps(snapshot):
    """The snapshot as JSON with one table cell per line (short diffs when a figure moves)."""
    def one(value):
        return json.dumps(value, ensure_ascii=False)
    out = ["{"]
    head = [k for k in snapshot if k != "tables"]
    out += [f" {one(k)}: {one(snapshot[k])}," for k in head]
    out.append(' "tables": [')
    for t, table in enumerate(snapshot["tables"]):
        out.append("  {")
        keys = [k for k in table if k != "rows"]
        out += [f"   {one(k)}: {one(table[k])}," for k in keys]
        out.append('   "rows": [')
        for r, row in enumerate(table["rows"]):
            out.append("    [")
            out += [f"     {one(cell)}" + ("," if c < len(row) - 1 else "")
                    for c, cell in enumerate(row)]
            out.append("    ]" + ("," if r < len(table["rows"]) - 1 else ""))
        out.append("   ]")
        out.append("  }" + ("," if t < len(snapshot["tables"]) - 1 else ""))
    out += [" ]", "}"]
    return "\n".join(out) + "\n"


def _is_figure(cell):
    return isinstance(cell, dict) and "value" in cell


def _figures(cell):
    if _is_figure(cell):
        return [cell]
    if isinstance(cell, list):
        return [c for c in cell if _is_figure(c)]
    return []


def format_figure(fig):
    value = fig["value"]
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        return "yes" if value else "no"
    elif isinstance(value, str):
        text = value
    elif fig.get("format"):
        text = format(value, fig["format"])
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = repr(value)
    unit = "" if fig.get("hide_unit") else fig.get("unit") or ""
    if unit and value is not None and not isinstance(value, str):
        text += unit if unit == "%" else f" {unit}"
    if fig.get("note"):
        text += f" ({fig['note']})"
    return text


_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def _check(cell, row):
    target = row[cell["col"]]
    if isinstance(target, list):
        target = target[cell.get("item", 0)]
    limit = f"{cell['limit']:,}" + (f" {cell['unit']}" if cell.get("unit") else "")
    text = f"{cell['check']} {limit}" if cell.get("show_op", True) else limit
    value = target.get("value") if _is_figure(target) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        met = _OPS[cell["check"]](value, cell["limit"])
        text += ": " + ("met" if met else "**missed**")
    return text + (f" {cell['note']}" if cell.get("note") else "")


def _cell(cell, row=()):
    if isinstance(cell, str):
        return cell
    if isinstance(cell, dict) and "check" in cell:
        return _check(cell, row)
    if _is_figure(cell):
        return format_figure(cell)
    if isinstance(cell, list):
        return " / ".join(_cell(c) for c in cell)
    raise ValueError(f"not a cell: {cell!r}")


def _reproduce(figs):
    """The commands (with seeds) of ``figs``, in order of first use."""
    seen = []
    for fig in figs:
        key = (fig["command"], fig.get("seed"))
        if key not in seen:
            seen.append(key)
    return "; ".join(f"`{cmd}`" + (f" (seed {seed})" if seed is not None and "--seed" not in cmd
                                   else "") for cmd, seed in seen)


def render_table(table):
    """Markdown for one table: a line naming the command when every figure shares it, else a
    last column with each row's commands."""
    columns = list(table["columns"])
    rows = table["rows"]
    align = table.get("align") or ["---"] * len(columns)
    row_figs = [[f for cell in row for f in _figures(cell)] for row in rows]
    every = [f for figs in row_figs for f in figs]
    shared = len({(f["command"], f.get("seed")) for f in every}) <= 1
    lines = []
    if every and shared:
        lines += [f"Reproduce: {_reproduce(every)}.", ""]
    if not shared:
        columns.append("reproduce")
        align = list(align) + ["---"]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("| " + " | ".join(align) + " |")
    for row, figs in zip(rows, row_figs, strict=True):
        cells = [_cell(c, row) for c in row]
        if not shared:
            cells.append(_reproduce(figs))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_document(text, snapshot):
    """``text`` with every marked table replaced by its render from ``snapshot``; a marker
    without a table, or a table without a marker, is an error."""
    tables = {t["name"]: t for t in snapshot["tables"]}
    found = set()

    def replace(match):
        name = match.group("name")
        if name not in tables:
            raise KeyError(f"no table {name!r} in the snapshot")
        found.add(name)
        return match.group(1) + render_table(tables[name]) + match.group(4)

    out = _MARK.sub(replace, text)
    missing = set(tables) - found
    if missing:
        raise KeyError(f"tables without a marker in the document: {', '.join(sorted(missing))}")
    return out


# -- updating the snapshot from the flows' JSON ----------------------------------------------

def kind_of(document):
    """Which flow wrote ``document``: fabric, recovery, packet, path, incast or synth."""
    if document.get("benchmark") == "incast on the model NIC":
        return "incast"
    if "scenarios" in document:
        return "fabric"
    if "decisions_per_cycle" in document:
        return "path"
    if document.get("benchmark") == "packet engines":
        return "packet"
    if isinstance(document.get("results"), dict):
        return "recovery"
    if isinstance(document.get("results"), list) or "resources" in document:
        return "synth"
    raise ValueError("not a bench, synth-report or bitstream summary document")


def _walk(node, path):
    for key in path:
        if isinstance(node, list):
            node = node[int(key)]
            continue
        if not isinstance(node, dict):
            raise KeyError(key)
        if key in node:
            node = node[key]
            continue
        matches = [k for k in node if fnmatch.fnmatchcase(k, str(key))]
        if not matches:
            raise KeyError(key)
        node = node[matches[0]]
    return node


def _lookup(document, source):
    node = document
    if source.get("select") is not None:
        entries = document["results"] if "results" in document else [document]
        picked = [e for e in entries
                  if all(e.get(k) == v for k, v in source["select"].items())]
        if not picked:
            raise KeyError(f"no entry {source['select']}")
        node = picked[-1]
    if "ratio" in source:
        top, bottom = (_walk(node, p) for p in source["ratio"])
        return round(top / bottom, source.get("round", 3))
    value = _walk(node, source["path"])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value * source.get("scale", 1)
        if "round" in source:
            value = round(value, source["round"])
    return value


def _all(snapshot):
    """``(table name, figure)`` for every figure of ``snapshot``."""
    for table in snapshot["tables"]:
        for row in table["rows"]:
            for fig in (f for cell in row for f in _figures(cell)):
                yield table["name"], fig


def _sourced(snapshot, kind):
    """``(table name, figure)`` for every figure of ``snapshot`` that comes from ``kind``."""
    return [(name, fig) for name, fig in _all(snapshot)
            if (fig.get("source") or {}).get("file") == kind]


def update(snapshot, document, kind=None):
    """Take every figure of ``snapshot`` whose source is ``document`` (of ``kind``, found
    from its shape if not given) from it, in place. Returns ``(changed, missing)``: the
    figures whose value changed (as ``(table, old, new)``) and those the document does not
    hold (``(table, figure)``; they keep their value)."""
    kind = kind or kind_of(document)
    changed, missing = [], []
    for name, fig in _sourced(snapshot, kind):
        try:
            value = _lookup(document, fig["source"])
        except (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError):
            value = None
        if value is None or isinstance(value, (dict, list)):
            missing.append((name, fig))
            continue
        if value != fig["value"]:
            changed.append((name, fig["value"], value))
            fig["value"] = value
    return changed, missing


def update_snapshot(name, documents, root=FIGURES):
    """Update snapshot ``name`` from ``documents`` (paths or dicts) and write it back. Returns
    the changes and the figures of the documents' kinds that none of them held."""
    snapshot = load(name, root)
    changed, tried, missed = [], set(), set()
    for doc in documents:
        if not isinstance(doc, dict):
            doc = json.loads(Path(doc).read_text())
        kind = kind_of(doc)
        c, m = update(snapshot, doc, kind)
        changed += c
        sourced = {id(f) for _, f in _sourced(snapshot, kind)}
        missing_here = {id(f) for _, f in m}
        missed = (missed - (sourced - missing_here)) | (missing_here - tried)
        tried |= sourced - missing_here
    missing = [(t, f["source"]) for t, f in _all(snapshot) if id(f) in missed]
    (Path(root) / f"{name}.json").write_text(dumps(snapshot))
    return changed, missing


def build_outputs(build=REPO / "build"):
    """The flows' JSON files present under ``build``, oldest first (so that where a board is
    in both the synthesis report and its bitstream's ``summary.json``, the newer one wins)."""
    build = Path(build)
    names = [build / "bench" / f for f in ("fabric.json", "recovery.json", "packet.json",
                                           "path.json", "incast.json")]
    names.append(build / "synth" / "report.json")
    names += sorted((build / "boards").glob("*/summary.json"))
    return sorted((p for p in names if p.exists()), key=lambda p: p.stat().st_mtime)


def sync(check=False, root=FIGURES, docs=None):
    """Render every document from its snapshot; with ``check``, only compare. Returns the
    documents that were (or would be) changed."""
    stale = []
    for name, path in (docs or DOCS).items():
        text = Path(path).read_text()
        new = render_document(text, load(name, root))
        if new != text:
            stale.append(Path(path))
            if not check:
                Path(path).write_text(new)
    return stale


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.docfigures", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a document is out of date; write nothing")
    parser.add_argument("--update", nargs="+", metavar="FILE", default=[],
                        help="take new values from these bench / synth-report / summary files")
    parser.add_argument("--update-from-build", action="store_true",
                        help="take new values from every such file under build/")
    args = parser.parse_args(argv)
    files = [Path(f) for f in args.update]
    if args.update_from_build:
        files += build_outputs()
    if files and args.check:
        parser.error("--check writes nothing: it cannot be combined with --update")
    for name in DOCS if files else ():
        changed, missing = update_snapshot(name, files, root=FIGURES)
        for table, old, new in changed:
            print(f"{name}/{table}: {old} -> {new}")
        for table, source in missing:
            print(f"{name}/{table}: not in these files: {source}")
    stale = sync(check=args.check, root=FIGURES, docs=DOCS)
    for path in stale:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"{'out of date' if args.check else 'wrote'}: {shown}")
    if args.check and stale:
        print("run: python -m sim.docfigures", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
