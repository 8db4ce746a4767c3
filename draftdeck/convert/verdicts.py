"""The state of one read: the policy's verdicts, the placeholder buffer and the duplicate set (the
design is in :mod:`draftdeck.convert`). The one-process reader and the parallel parent share it, so
both count, hold and judge rows the same way."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from draftdeck.convert.checks import where_prefix
from draftdeck.convert.options import ConvertOptions
from draftdeck.convert.placeholders import is_filler, strip_answers
from draftdeck.errors import JobFailed
from draftdeck.formats.model import Conversation
from draftdeck.issue_codes import Action
from draftdeck.quality import Report

_LINE_BITS = 40
_LINE_MASK = (1 << _LINE_BITS) - 1


class RowState:
    """The state of one read_conversations run (policy cache, placeholder buffer, duplicate set)."""

    def __init__(self, report: Report, options: ConvertOptions):
        self.report = report
        self.options = options
        self.actions: dict[str, Action] = {}
        self.parse_options = options.parse_options()
        # duplicate key -> where it first appeared, packed in one int (see first_seen): a 913K-row read
        # keeps one small int per row, and a duplicate's warning names the record it repeats
        self.seen: dict[int, int] = {}
        self._files: dict[str, int] = {}
        self.rule = options.placeholder_rule
        self.checked = 0  # conversations past their own checks: the placeholder share's denominator
        self.prompts: dict[tuple[str, ...], set[int]] = {}  # per candidate key: its distinct prompts
        self.flagged: dict[tuple[str, ...], int] = {}  # placeholder key -> distinct prompts when flagged
        # (placeholder key, item, duplicate key): items are Conversations, or a worker's prepared rows
        self.pending: deque[tuple[tuple[str, ...], Any, int | None]] = deque()
        self.released_before_flag = 0
        self.released_keys: dict[tuple[str, ...], int] = {}

    def action(self, code: str) -> Action:
        act = self.actions.get(code)
        if act is None:
            act = self.actions[code] = self.options.policy.action(code)
        return act

    def fail(self, code: str, file: str, line: int | None, reason: str) -> JobFailed:
        self.report.reject(code, file, line, reason)
        return JobFailed(
            f"{code} at {file}{':' + str(line) if line is not None else ''}: {reason}"
            " (the policy makes this code an error)",
            self.report,
        )

    def verdict(self, conv: Any, issues: list[tuple[str, str]]) -> bool:
        """Count `issues` for a parsed conversation; True when it is kept. Raises JobFailed on a fail code.

        `conv` is anything with a ``source`` (file, line, index, path): a Conversation or a prepared row.
        """
        src = conv.source
        assert src is not None
        file, line, where = src.file, src.line, where_prefix(src.line, src.index, src.path)
        for code, reason in issues:
            act = self.action(code)
            if act is Action.FAIL:
                raise self.fail(code, file, line, f"{where}{reason}")
        for code, reason in issues:
            if self.action(code) is Action.REJECT:
                self.report.reject(code, file, line, f"{where}{reason}")
                return False
        kept = conv.warnings if isinstance(conv, Conversation) else None
        for code, reason in issues:
            self.report.warn(code, file, line, f"{where}{reason}")
            if kept is not None and code not in kept:
                kept.append(code)
        return True

    def file_base(self, file: str) -> int:
        """A record of `file` at line L is kept in :attr:`seen` as ``file_base(file) | L + 1`` (0: no
        line): the file's number in the high bits."""
        return self._files.setdefault(file, len(self._files)) << _LINE_BITS

    def duplicate(self, dkey: int, file: str) -> list[tuple[str, str]]:
        """The duplicate_conversation issue of a record in `file` whose key appeared before: it names
        where (the line, and the file when it was another one)."""
        packed = self.seen[dkey]
        number, line = packed >> _LINE_BITS, (packed & _LINE_MASK) - 1
        first = next(f for f, n in self._files.items() if n == number)
        where = ("line " if first == file else f"{first}:") + str(line) if line >= 0 else first
        return [("duplicate_conversation", f"the same messages appeared earlier, at {where}")]

    def release(self, conv: Any, dkey: int | None) -> bool:
        """Last check before a kept conversation leaves (duplicates: `dkey` is its :func:`duplicate_key`,
        None when duplicates are not checked); True when it leaves."""
        if dkey is not None:
            src = conv.source
            if dkey in self.seen:
                return self.verdict(conv, self.duplicate(dkey, src.file))
            self.seen[dkey] = self.file_base(src.file) | (0 if src.line is None else src.line + 1)
        return True

    def placeholder(self, conv: Any, key: tuple[str, ...], dkey: int | None, prompt: int) -> Iterator[Any]:
        """A candidate placeholder (all answers short) answering `prompt` (its :func:`prompt_key`): judge
        it when its key is flagged, else hold it (a known filler is flagged once it crosses its
        threshold; other keys are judged when their rows leave the buffer)."""
        if key in self.flagged:
            out = self._judge(conv, key, dkey)
            if out is not None:
                yield out
            return
        prompts = self.prompts.setdefault(key, set())
        prompts.add(prompt)
        self.pending.append((key, conv, dkey))
        if is_filler(key) and self.rule.passes(key, len(prompts), self.checked):
            yield from self._flag(key)
        elif len(self.pending) > self.options.placeholder_buffer:
            yield from self._leave()

    def _flag(self, key: tuple[str, ...]) -> Iterator[Any]:
        """Make `key` a placeholder and judge its held rows, in order."""
        self.flagged[key] = len(self.prompts.pop(key, ()))
        self.released_before_flag += self.released_keys.pop(key, 0)
        held = [(c, d) for k, c, d in self.pending if k == key]
        self.pending = deque(p for p in self.pending if p[0] != key)
        for c, d in held:
            out = self._judge(c, key, d)
            if out is not None:
                yield out

    def _leave(self) -> Iterator[Any]:
        """The oldest held row must leave: flag its key if the counts of now make it a placeholder."""
        key, conv, dkey = self.pending[0]
        if self.rule.passes(key, len(self.prompts.get(key, ())), self.checked):
            yield from self._flag(key)
            return
        self.pending.popleft()
        self.released_keys[key] = self.released_keys.get(key, 0) + 1
        if self.release(conv, dkey):
            yield conv

    def _judge(self, conv: Any, key: tuple[str, ...], dkey: int | None) -> Any | None:
        """A row of a placeholder key, as ``placeholders`` says: the row to yield, or None."""
        shown = " / ".join(repr(k) for k in key[:3])
        n, rule = self.flagged[key], self.rule.describe(key)
        reason = f"assistant answer {shown} answers {n}+ different prompts ({rule})"
        mode = self.options.placeholders
        if mode == "reject":
            if not self.verdict(conv, [("placeholder_response", reason)]):
                return None
        else:
            src = conv.source
            where = where_prefix(src.line, src.index, src.path)
            if mode == "keep":
                self.report.warn("placeholder_response", src.file, src.line, f"{where}{reason}; kept")
                if isinstance(conv, Conversation):
                    conv.warnings.append("placeholder_response")
            else:
                self.report.warn(
                    "placeholder_stripped", src.file, src.line, f"{where}{reason}; answers removed"
                )
                conv = strip_answers(conv) if isinstance(conv, Conversation) else conv.without_answers()
        return conv if self.release(conv, dkey) else None

    def drain(self) -> Iterator[Any]:
        """The end of the input: every held row leaves, judged with the whole input's counts."""
        while self.pending:
            yield from self._leave()

    def placeholder_summary(self) -> dict[str, Any]:
        return {
            "answers": [" / ".join(k) for k in sorted(self.flagged)][:20],
            "mode": self.options.placeholders,
            "min_rows": self.rule.min_rows,
            "min_share": self.rule.min_share,
            "filler_rows": self.rule.filler_rows,
            "released_before_flag": self.released_before_flag,
        }
