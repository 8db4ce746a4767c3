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
from enum import StrEnum
from pathlib import Path
from typing import Any

from draftdeck.errors import AccountingError, PolicyError

MAX_EXAMPLES_PER_CODE = 5


class Action(StrEnum):
    """What an issue does to its row and to the job."""

    REJECT = "reject"  # the row is dropped and counted under `rejected`
    WARN = "warn"  # the row is kept and the issue counted under `warnings`
    FAIL = "fail"  # the job fails as soon as the issue is seen


@dataclass(frozen=True)
class IssueCode:
    name: str
    action: Action
    description: str
    # False for the rows a recipe chose not to take (a mix's filters and draw): not data lost, so not
    # counted by max_rejected or the rejected-share alert
    loss: bool = True


def _codes(*items: tuple[str, Action, str]) -> dict[str, IssueCode]:
    return {
        name: IssueCode(name, action, text, name not in CHOSEN and name not in FOLDED)
        for name, action, text in items
    }


CHOSEN = frozenset({"filtered_out", "not_sampled"})
# Input rows that are part of another row's conversation, or say nothing a conversation holds: an agent
# session's later lines and events, its summary and bookkeeping lines. Counted, not lost.
FOLDED = frozenset({"merged_event", "session_metadata"})


# Codes a kept row may carry that are no issue: how it was made (the sample view shows them apart).
NOTES = {"ids_from_target": ("answer tokens", "the target's own ids, as it generated them (not re-encoded)")}

CODES: dict[str, IssueCode] = _codes(
    ("json_error", Action.REJECT, "the row is not valid JSON"),
    ("encoding_error", Action.REJECT, "the row is not valid UTF-8"),
    ("oversize_row", Action.REJECT, "the row is larger than the configured limit"),
    ("too_deep", Action.REJECT, "the row nests arrays and objects more than 1,024 levels deep"),
    ("not_an_object", Action.REJECT, "the row is valid JSON but not an object"),
    ("unknown_format", Action.REJECT, "no known chat shape matches the row's keys"),
    ("format_mismatch", Action.REJECT, "the row is not of the shape --from forces"),
    (
        "multimodal_content",
        Action.REJECT,
        "the row holds audio or video (or images, read with --images reject): no drafter learns them",
    ),
    # images in the data (draftdeck.formats.images): each image of a row is loaded and checked
    ("image_missing", Action.REJECT, "an image the row names is not there (no such file)"),
    ("image_unreadable", Action.REJECT, "an image's bytes are not an image PIL can decode"),
    ("image_too_large", Action.REJECT, "an image is over the byte or pixel limit (--max-image-*)"),
    ("image_url_unread", Action.REJECT, "an image given as an http(s) URL: never fetched"),
    ("image_outside_roots", Action.REJECT, "an image file outside the data roots (a job run by the service)"),
    (
        "image_placeholder_mismatch",
        Action.REJECT,
        "the <image> placeholders in the text are not as many as the row's images",
    ),
    ("empty_conversation", Action.REJECT, "the conversation has no messages"),
    (
        "merged_event",
        Action.REJECT,
        "a line or event of an agent session, merged into the session's conversation (its first counts)",
    ),
    (
        "session_metadata",
        Action.REJECT,
        "an agent session's summary or bookkeeping line or event, not a turn",
    ),
    (
        "abandoned_branch",
        Action.REJECT,
        "a line of an agent session on a branch it left (a turn edited or retried): not on the kept path",
    ),
    (
        "contained_prefix",
        Action.WARN,
        "the row's episode list holds prefixes of a longer episode: left out, trained once in the longer",
    ),
    ("empty_turn", Action.WARN, "a message has neither text, reasoning nor tool calls"),
    ("empty_assistant_turn", Action.REJECT, "an empty assistant turn (trains only end-of-turn tokens)"),
    ("no_user_turn", Action.REJECT, "the conversation has no user message"),
    ("no_assistant_turn", Action.REJECT, "the conversation has no assistant message (prompt-only)"),
    ("trailing_user_turn", Action.WARN, "the conversation ends on a user message"),
    ("non_alternating", Action.WARN, "user and assistant turns do not alternate"),
    ("unknown_role", Action.REJECT, "a message has a role no chat template knows"),
    ("invalid_tool_arguments", Action.WARN, "a tool call's arguments are not valid JSON (kept as text)"),
    ("orphan_tool_result", Action.WARN, "a tool result answers no earlier tool call"),
    ("placeholder_response", Action.REJECT, "the same short answer ('OK.') to many different prompts"),
    ("placeholder_stripped", Action.WARN, "placeholder answers removed: the row is a prompt to regenerate"),
    ("duplicate_conversation", Action.WARN, "the conversation appeared earlier in the input"),
    ("unrepresentable_field", Action.WARN, "the target format cannot hold a field; it was left out"),
    ("unused_text_field", Action.WARN, "a field of long text no reader used (kept, not trained on)"),
    # nothing of the conversation is lost: what a reader cannot keep rejects the row (a policy may downgrade)
    ("lost_part", Action.REJECT, "a content part of a type no reader keeps (it would be lost)"),
    ("lost_system", Action.REJECT, "a system prompt that cannot be kept as text"),
    ("lost_tools", Action.REJECT, "tool definitions that cannot be read (the template renders them)"),
    ("tools_kept_as_text", Action.WARN, "function definitions in a system text do not parse: kept as text"),
    ("tool_tags_unparsed", Action.WARN, "a <tool_call> or <tool_response> block is not JSON: kept as text"),
    ("redacted_reasoning", Action.WARN, "the answer's reasoning is redacted: kept, but no template shows it"),
    ("system_conflict", Action.WARN, "a top-level system prompt and a system message: both kept, in order"),
    ("preference_chosen", Action.WARN, "a preference row: its chosen answer kept, the rejected one left out"),
    ("preference_row", Action.REJECT, "a preference row, refused by --preference reject"),
    # per-turn training flags
    ("untrained_answer", Action.WARN, "answers a per-turn flag leaves untrained: context, not loss"),
    ("invalid_train_flag", Action.REJECT, "a per-turn training flag with a value no format allows"),
    ("partial_loss_weight", Action.WARN, "a fractional loss_weight: the turn is trained (masks are 0 or 1)"),
    ("trained_non_assistant", Action.REJECT, "a flag asks to train a user, system or tool turn"),
    ("template_error", Action.REJECT, "the chat template raised on the conversation"),
    # what the template left out of the rendered row (draftdeck.chat.coverage): trained on, it is lost
    ("template_dropped_content", Action.REJECT, "the chat template left an answer's text out"),
    ("template_dropped_tool_calls", Action.REJECT, "the chat template left an answer's tool calls out"),
    ("template_dropped_reasoning", Action.REJECT, "the chat template left an answer's reasoning out"),
    ("template_dropped_tools", Action.REJECT, "the chat template left the tool definitions out"),
    ("template_dropped_system", Action.REJECT, "the chat template left the system prompt out"),
    ("no_trained_tokens", Action.REJECT, "the row has no token with loss"),
    ("truncated", Action.WARN, "the row was cut at the sequence length"),
    ("too_long", Action.REJECT, "the row is longer than the sequence length and truncation is 'drop'"),
    ("longer_than_target", Action.REJECT, "the row is longer than the target reads (its positions)"),
    ("no_dflash_anchor", Action.WARN, "the row has no two consecutive trained tokens"),
    ("mask_mismatch", Action.FAIL, "decoding the trained tokens did not give the assistant text"),
    ("encoder_mismatch", Action.WARN, "the fast encoder disagreed with the model's tokenizer"),
    ("ids_reencoded", Action.WARN, "the target's recorded token ids did not fit: answers encoded from text"),
    # regeneration (draftdeck.regenerate): checks on the target's answers
    ("answer_cut_off", Action.REJECT, "the target stopped at max_tokens (finish_reason 'length')"),
    ("empty_answer", Action.REJECT, "the target's answer has no content and no tool calls"),
    ("reasoning_in_content", Action.REJECT, "reasoning markers (<think>) in the content with reasoning off"),
    ("invalid_tool_call", Action.REJECT, "a tool call of the target's answer is not valid JSON"),
    ("tool_calls_diverged", Action.WARN, "the target's tool calls differ from the source's: cut there"),
    ("prompt_too_long", Action.REJECT, "the prompt is longer than the target's context window"),
    ("malformed_answer", Action.REJECT, "the server's answer is not a valid chat completion"),
    ("server_error", Action.REJECT, "the server kept failing on this row after every retry"),
    # export-drafter (each drafter kind's export): the config read as each server's loader reads it
    (
        "served_config",
        Action.WARN,
        "a server would refuse the export, or fill the draft block with another mask id than trained",
    ),
    # cache-hidden (draftdeck.hidden.checks): a stored row that is not the target's hidden states
    ("hidden_ids_mismatch", Action.FAIL, "a cached row's token ids are not the dataset's row"),
    ("hidden_shape_mismatch", Action.FAIL, "a cached row's shape is not [tokens, layers, hidden]"),
    ("hidden_nonfinite", Action.FAIL, "a cached row holds NaN or inf"),
    ("hidden_zero_layer", Action.FAIL, "a cached layer is all zero over a row (vLLM's hybrid bug)"),
    ("hidden_constant_layer", Action.FAIL, "a cached layer holds one value over a row"),
    (
        "hidden_live_mismatch",
        Action.FAIL,
        "a cached row differs from a live forward beyond the dtype's tolerance",
    ),
    # mix (draftdeck.mix): what a recipe takes of each source
    ("filtered_out", Action.REJECT, "the row fails a filter of its source in the mix recipe"),
    (
        "duplicate_removed",
        Action.REJECT,
        "the conversation is already in the mix, from this or another source",
    ),
    ("not_sampled", Action.REJECT, "not drawn: the source's quota or weight takes fewer rows than it has"),
    ("upsampled", Action.WARN, "a source gives more rows than it has: some of its rows are repeated"),
)


def code(name: str) -> IssueCode:
    try:
        return CODES[name]
    except KeyError:
        raise KeyError(f"unknown issue code {name!r}; known codes: {', '.join(sorted(CODES))}") from None


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
