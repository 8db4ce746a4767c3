"""Issue codes, row accounting and the escalation policy.

This is the one place that decides whether an issue rejects a row, warns, or fails a job.
Every pipeline (scan, convert, tokenize) counts what it sees in a :class:`Report` and asks a
:class:`Policy` for the verdict at the end (and, for early stops, on the way).

The invariant every report keeps::

    rows_in + rows_expanded == rows_out + sum(rejected.values())

``rows_expanded`` counts the extra output rows that one input row produced (a message tree with
three leaves gives one input row and three output rows: ``rows_expanded`` grows by two).

The report's JSON (:meth:`Report.to_dict`) gives the FOLDED codes (rows merged into another row's
conversation, or its metadata: not lost) apart from the rejected rows, as the pages and the CLI do::

    rows_in + rows_expanded == rows_out + sum(rejected.values()) + sum(merged.values())
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftdeck.errors import AccountingError, PolicyError
from draftdeck.issue_codes import FOLDED, Action, code

MAX_EXAMPLES_PER_CODE = 5


@dataclass
class Example:
    file: str
    line: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "reason": self.reason}


@dataclass
class Output:
    """A file of rows a job wrote; (kind "dataset") the dataset folder that holds its shards, which the
    service registers as a dataset when the job succeeds; or (kind "artifact") a file that holds no rows
    (a drafter's weights, its config, a run record), shown without a row count."""

    path: str
    rows: int
    bytes: int
    sha256: str
    kind: str = "file"  # file | dataset | artifact

    def to_dict(self) -> dict[str, Any]:
        d = {"path": self.path, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}
        return d if self.kind == "file" else {**d, "kind": self.kind}


@dataclass
class Report:
    """Counts of one job's rows and issues. Merge reports of chunks with :meth:`merge`."""

    rows_in: int = 0
    rows_out: int = 0
    rows_expanded: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    formats: Counter[str] = field(default_factory=Counter)
    # plain counts beside the rows (tokenize: answers trained, answers a per-turn flag left untrained)
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Example]] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    # -- counting -------------------------------------------------------------------------
    def _example(self, name: str, file: str, line: int | None, reason: str) -> None:
        kept = self.examples.setdefault(name, [])
        if len(kept) < MAX_EXAMPLES_PER_CODE:
            kept.append(Example(file, line, reason))

    def reject(self, name: str, file: str, line: int | None, reason: str) -> None:
        """Count one input row as rejected for `name`."""
        code(name)
        self.rejected[name] += 1
        self._example(name, file, line, reason)

    def warn(self, name: str, file: str, line: int | None, reason: str, n: int = 1) -> None:
        code(name)
        self.warnings[name] += n
        self._example(name, file, line, reason)

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def rows_folded(self) -> int:
        """Rows counted under the FOLDED codes: merged into another row's conversation, or metadata."""
        return sum(n for name, n in self.rejected.items() if name in FOLDED)

    @property
    def rows_lost(self) -> int:
        """Rejected rows that are data lost: not those a mix's recipe chose to leave (filters, draw)."""
        return sum(n for name, n in self.rejected.items() if code(name).loss)

    def merge(self, other: Report) -> None:
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.rows_expanded += other.rows_expanded
        self.rejected.update(other.rejected)
        self.warnings.update(other.warnings)
        self.formats.update(other.formats)
        self.counts.update(other.counts)
        for name, items in other.examples.items():
            for ex in items:
                self._example(name, ex.file, ex.line, ex.reason)
        self.outputs.extend(other.outputs)

    # -- checking -------------------------------------------------------------------------
    def check_accounting(self) -> None:
        """Raise :class:`AccountingError` unless every input row is accounted for."""
        lhs = self.rows_in + self.rows_expanded
        rhs = self.rows_out + self.rows_rejected
        if lhs != rhs:
            raise AccountingError(
                f"row accounting does not balance: rows_in {self.rows_in} + expanded {self.rows_expanded}"
                f" = {lhs}, but rows_out {self.rows_out} + rejected {self.rows_rejected} = {rhs}"
            )
        files = [o for o in self.outputs if o.kind == "file"]
        written = sum(o.rows for o in files)
        if files and written != self.rows_out:
            raise AccountingError(
                f"outputs hold {written} rows but the report counts rows_out {self.rows_out}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "rows_expanded": self.rows_expanded,
            "accounting": "rows_in + rows_expanded == rows_out + sum(rejected) + sum(merged); rows_expanded"
            " counts the extra conversations that trees and trajectories yield beyond one per input row;"
            " merged, the rows folded into another row's conversation (an agent session's later lines and"
            " events) or its metadata: counted, not lost",
            "rejected": {k: n for k, n in sorted(self.rejected.items()) if k not in FOLDED},
            "merged": {k: n for k, n in sorted(self.rejected.items()) if k in FOLDED},
            "warnings": dict(sorted(self.warnings.items())),
            "formats": dict(sorted(self.formats.items())),
            **({"counts": dict(sorted(self.counts.items()))} if self.counts else {}),
            "outputs": [o.to_dict() for o in self.outputs],
            "examples": {k: [e.to_dict() for e in v] for k, v in sorted(self.examples.items())},
            **self.extra,
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# Policy's alert thresholds: the name of the loss and the codes counted (none: every rejected row).
LOSSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "alert_rejected": ("rejected", ()),
    "alert_duplicated": ("duplicated", ("duplicate_conversation", "duplicate_removed")),
    # tokenize cuts a row at seq_length; regenerate keeps an answer cut at max_tokens (keep_cut_off)
    "alert_truncated": ("truncated", ("truncated", "answer_cut_off")),
}


def empty_output(report: Report, inputs: Sequence[object] = ()) -> str:
    """What every job says when it wrote nothing: how many rows it read (from which inputs) and why the
    most were rejected."""
    top = ", ".join(f"{n:,} {c}" for c, n in report.rejected.most_common(3)) or "none rejected"
    shown = [str(p) for p in inputs[:3]] + ([f"{len(inputs) - 3} more"] if len(inputs) > 3 else [])
    where = f" from {', '.join(shown)}" if shown else ""
    return f"empty output: no rows were written out of {report.rows_in:,} read{where} ({top})"


@dataclass(frozen=True)
class Rule:
    """A per-code override. `max_count`/`max_fraction` fail the job once a warned code passes them."""

    action: Action
    max_count: int | None = None
    max_fraction: float | None = None


@dataclass(frozen=True)
class Failure:
    code: str
    reason: str


def loss_alert_kind(what: str) -> str:
    """The alert a loss past its threshold raises (`Policy.losses`' keys: rejected, duplicated,
    truncated), one name for the job's alert, the CLI and /alerts: high_rejected, high_duplicated, and
    high_truncation, the dataset alert's kind (draftdeck.dataset_alerts), so one alert per job for it."""
    return "high_truncation" if what == "truncated" else f"high_{what}"


@dataclass
class Policy:
    """Decides, per code, reject / warn / fail, and whether a finished report passes.

    - `rules` override the default action of a code and add thresholds.
    - `strict` turns every warning into a job failure.
    - `max_rejected` fails the job when more than this fraction of input rows was rejected.
    - An empty output always fails the job: this is not configurable.
    """

    rules: dict[str, Rule] = field(default_factory=dict)
    strict: bool = False
    max_rejected: float | None = None
    # alert (the job still succeeds) when more than this share of the rows was lost that way
    alert_rejected: float | None = None
    alert_duplicated: float | None = None
    alert_truncated: float | None = None

    def action(self, name: str) -> Action:
        rule = self.rules.get(name)
        return rule.action if rule else code(name).action

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        """Build from `{"strict": bool, "max_rejected": float, "codes": {code: action | {action, ...}}}`."""
        rules: dict[str, Rule] = {}
        for name, spec in (data.get("codes") or {}).items():
            code(name)
            if isinstance(spec, str):
                spec = {"action": spec}
            try:
                rules[name] = Rule(
                    action=Action(spec["action"]),
                    max_count=spec.get("max_count"),
                    max_fraction=spec.get("max_fraction"),
                )
            except (KeyError, ValueError) as exc:
                raise PolicyError(f"policy for {name!r} is not valid: {spec!r} ({exc})") from exc
        unknown = set(data) - {"codes", "strict", "max_rejected", *LOSSES}
        if unknown:
            raise PolicyError(f"unknown policy keys: {', '.join(sorted(unknown))}")
        return cls(
            rules=rules,
            strict=bool(data.get("strict", False)),
            max_rejected=data.get("max_rejected"),
            **{k: data[k] for k in LOSSES if k in data},
        )

    @classmethod
    def from_file(cls, path: Path) -> Policy:
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise PolicyError(f"cannot read policy file {path}: {exc}") from exc

    @classmethod
    def build(
        cls,
        policy_file: Path | None,
        strict: bool = False,
        max_rejected: float | None = None,
        **alerts: float | None,
    ) -> Policy:
        """The policy from a file (if any), with `strict`, `max_rejected` and the alert shares
        (``alert_rejected=...``: the job's parameters) layered on top."""
        policy = cls.from_file(policy_file) if policy_file is not None else cls()
        if strict:
            policy.strict = True
        if max_rejected is not None:
            policy.max_rejected = max_rejected
        for name, share in alerts.items():
            if name not in LOSSES:
                raise PolicyError(f"unknown alert threshold {name!r}; known: {', '.join(LOSSES)}")
            if share is not None:
                setattr(policy, name, share)
        return policy

    def losses(self, report: Report) -> dict[str, dict[str, Any]]:
        """The rows lost each way (rejected, duplicated, truncated) with their share of all rows and
        the thresholds; ``alert`` is the message when the share passes its alert threshold. The core
        puts this in the report (``extra["losses"]``); the service raises each alert."""
        total = report.rows_in + report.rows_expanded
        out: dict[str, dict[str, Any]] = {}
        for name, (what, codes) in LOSSES.items():
            n = report.rows_lost if not codes else sum(
                report.rejected.get(c, 0) + report.warnings.get(c, 0) for c in codes
            )  # fmt: skip
            share = n / total if total else 0.0
            limit = getattr(self, name)
            entry: dict[str, Any] = {"rows": n, "of": total, "share": round(share, 4), "alert_above": limit}
            if name == "alert_rejected":
                entry["fail_above"] = self.max_rejected
            if limit is not None and n and share > limit:
                entry["alert"] = (
                    f"{n:,} of {total:,} rows {what} ({share:.1%}), above the alert threshold {limit:.0%}"
                )
            out[what] = entry
        return out

    def loss_alerts(self, report: Report) -> list[tuple[str, str]]:
        """(alert kind, message) for every loss past its threshold: high_rejected, high_duplicated,
        high_truncation."""
        losses = self.losses(report).items()
        return [(loss_alert_kind(what), e["alert"]) for what, e in losses if "alert" in e]

    def severity(self, name: str) -> str:
        """How the job page labels a code: error (fails the job), rejected, merged (a row folded into
        another row's conversation: not a loss), or warning."""
        act = self.action(name)
        if act is Action.FAIL or (self.strict and act is Action.WARN):
            return "error"
        if act is Action.REJECT:
            return "merged" if name in FOLDED else "rejected"
        return "warning"

    def failures(self, report: Report) -> list[Failure]:
        """Every reason the finished `report` fails the job (empty list: it passes)."""
        out: list[Failure] = []
        if report.rows_out == 0:
            out.append(Failure("empty_output", empty_output(report)))
        counted = Counter(report.rejected) + Counter(report.warnings)
        for name, n in sorted(counted.items()):
            act = self.action(name)
            if act is Action.FAIL:
                out.append(Failure(name, f"{n} rows with {name}, which this policy makes an error"))
                continue
            if self.strict and act is Action.WARN:
                out.append(Failure(name, f"{n} rows with {name}; --strict turns warnings into errors"))
                continue
            rule = self.rules.get(name)
            if rule and rule.max_count is not None and n > rule.max_count:
                out.append(Failure(name, f"{n} rows with {name}, above the limit of {rule.max_count}"))
            if rule and rule.max_fraction is not None and report.rows_in:
                frac = n / report.rows_in
                if frac > rule.max_fraction:
                    out.append(
                        Failure(
                            name,
                            f"{frac:.1%} of rows with {name}, above the limit of {rule.max_fraction:.1%}",
                        )
                    )
        if self.max_rejected is not None and report.rows_in:
            frac = report.rows_lost / report.rows_in
            if frac > self.max_rejected:
                out.append(
                    Failure(
                        "max_rejected",
                        f"{report.rows_lost} of {report.rows_in} rows rejected ({frac:.1%}),"
                        f" above --max-rejected {self.max_rejected:.1%}",
                    )
                )
        return out
