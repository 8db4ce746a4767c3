"""A report's counts and examples as plain JSON and back: how a chunked tokenize job's plan and each
chunk's outcome carry their reports (through plan.json and SQL) to the final step."""

from __future__ import annotations

from typing import Any

from draftdeck.quality import Example, Report


def report_state(report: Report) -> dict[str, Any]:
    """A report's counts and examples as JSON (for SQL and plan.json); :func:`report_from_state`."""
    return {
        "rows_in": report.rows_in,
        "rows_out": report.rows_out,
        "rows_expanded": report.rows_expanded,
        "rejected": dict(report.rejected),
        "warnings": dict(report.warnings),
        "formats": dict(report.formats),
        "counts": dict(report.counts),
        "examples": {k: [e.to_dict() for e in v] for k, v in report.examples.items()},
        "extra": report.extra,
    }


def report_from_state(state: dict[str, Any]) -> Report:
    report = Report(state["rows_in"], state["rows_out"], state["rows_expanded"])
    report.rejected.update(state["rejected"])
    report.warnings.update(state["warnings"])
    report.formats.update(state["formats"])
    report.counts.update(state.get("counts") or {})
    report.examples = {k: [Example(**e) for e in v] for k, v in state["examples"].items()}
    report.extra = dict(state.get("extra") or {})
    return report
