"""JSON Schemas of the files ``mrc-nic sim`` writes (``report.schema.json``: ``report.json``).

The schema is package data, so a report can be checked wherever the package is installed;
``docs/sim.md`` describes every key it names.
"""

import json
from functools import cache
from pathlib import Path

__all__ = ["REPORT_SCHEMA_PATH", "report_schema", "validate_report"]

REPORT_SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


@cache
def report_schema():
    """The schema of ``report.json``, as a dict."""
    return json.loads(REPORT_SCHEMA_PATH.read_text())


def validate_report(report):
    """Raise :class:`jsonschema.ValidationError` unless ``report`` (a dict, or the JSON text of
    one) matches the schema. Needs the ``jsonschema`` package."""
    from jsonschema import Draft202012Validator
    if isinstance(report, str):
        report = json.loads(report)
    Draft202012Validator(report_schema()).validate(report)
