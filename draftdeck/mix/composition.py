"""The composition table as shown: a mix report's per-source counts with their shares and means
(computed here, at display, from the stored counts), and a totals row that balances."""

from __future__ import annotations

from typing import Any

COUNTS = ("rows_in", "rejected_rows", "duplicates", "not_sampled", "taken", "repeated", "rows_out", "turns",
          "chars", "answer_chars")  # fmt: skip


def composition(mix: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source, then ``{"name": "total", ...}``: counts, ``share`` (of the mix's rows),
    ``answer_share`` (of its answer characters), ``mean_turns`` and ``mean_chars`` per row written,
    ``balanced`` (rows in = taken + rejected + duplicates + not sampled)."""
    rows = []
    for s in mix.get("sources") or []:
        row = dict(s)
        row["rejected_rows"] = sum((s.get("rejected") or {}).values())
        rows.append(row)
    total: dict[str, Any] = {"name": "total", "amount": "", "rejected": {}, "duplicates_against": {}}
    for key in COUNTS:
        total[key] = sum(int(r.get(key) or 0) for r in rows)
    for r in rows:
        for code, n in (r.get("rejected") or {}).items():
            total["rejected"][code] = total["rejected"].get(code, 0) + n
    out_rows, answer = total["rows_out"], total["answer_chars"]
    for r in [*rows, total]:
        n = int(r.get("rows_out") or 0)
        r["share"] = n / out_rows if out_rows else 0.0
        r["answer_share"] = int(r.get("answer_chars") or 0) / answer if answer else 0.0
        r["mean_turns"] = int(r.get("turns") or 0) / n if n else None
        r["mean_chars"] = int(r.get("chars") or 0) / n if n else None
        r["balanced"] = r["rows_in"] == r["taken"] + r["rejected_rows"] + r["duplicates"] + r["not_sampled"]
    return [*rows, total]
