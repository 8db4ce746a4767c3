"""The eval on suites (draftdeck/drafter/eval/suites): each prompt's turns rendered with the chat template
as in training (with the eval's template settings, e.g. thinking off), answered turn by turn, each turn
after the target's own earlier answers, and counted per suite and category beside the whole.

The target's answer to a turn is its target-only decoding (greedy: what every lossless method gives
too), decoded to text for the next turn's history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from draftdeck.drafter.eval import suites
from draftdeck.drafter.eval.keys import ALL
from draftdeck.drafter.eval.tally import Decoded, Tally
from draftdeck.quality import Report


@dataclass
class Turn:
    """One turn of a suite prompt as decoded: what it counts under and what the walk needs."""

    suite: str
    category: str
    ids: list[int]
    decoded: Decoded
    file: str
    line: int
    turn: int  # 1-based


def read_suites(names: list[str], report: Report, max_per_category: int | None) -> list[suites.SuitePrompt]:
    return [p for name in names for p in suites.load(name, report, max_per_category)]


def decode_turns(
    prompts: list[suites.SuitePrompt],
    tokenizer: Any,
    template_kwargs: dict[str, Any],
    fits: Callable[[list[int]], str | None],
    decode: Callable[[list[int], int], Decoded],
    report: Report,
) -> Iterator[Turn]:
    """Decode every turn of every prompt in order. `fits(ids)`: why a prompt is too long (None: it
    fits); `decode(ids, n)`: the n-th decode of the eval. A prompt whose template raises, or whose turn
    does not fit, is rejected (its earlier turns stay counted); the others count as out."""
    n = 0
    for p in prompts:
        history: list[dict[str, str]] = []
        for k, text in enumerate(p.turns, 1):
            history.append({"role": "user", "content": text})
            try:
                ids = tokenizer.apply_chat_template(
                    history, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
                )
            except Exception as exc:  # a template raising is the prompt's problem, named, not a crash
                report.reject("template_error", p.file, p.line, f"turn {k}: {type(exc).__name__}: {exc}")
                break
            ids = [int(t) for t in ids]
            too_long = fits(ids)
            if too_long is not None:
                report.reject("too_long", p.file, p.line, f"turn {k}: {too_long}")
                break
            decoded = decode(ids, n)
            n += 1
            yield Turn(p.suite, p.category, ids, decoded, p.file, p.line, k)
            answer = tokenizer.decode(decoded.plain.output_ids, skip_special_tokens=True)
            history.append({"role": "assistant", "content": answer})
        else:
            report.rows_out += 1


class SuiteTallies:
    """A :class:`Tally` per suite and category, and per suite over its categories."""

    def __init__(self, block: int, greedy: bool):
        self.block, self.greedy = block, greedy
        self.by: dict[str, dict[str, Tally]] = {}
        self.turns: dict[str, dict[str, int]] = {}

    def add(self, t: Turn) -> None:
        cats = self.by.setdefault(t.suite, {})
        where = {"suite": t.suite, "category": t.category, "file": t.file, "line": t.line, "turn": t.turn}
        for key in (t.category, ALL):
            cats.setdefault(key, Tally(self.block, self.greedy)).add(t.decoded, where)

    def to_json(self) -> dict[str, Any]:
        """Per suite, per category (and ``all``): turns decoded, target-only speed, each method's counts."""
        return {
            suite: {
                cat: {
                    "turns": tally.prompts,
                    "target_only": tally.target_only(),
                    "methods": tally.method_entries(),
                }
                for cat, tally in sorted(cats.items(), key=lambda kv: (kv[0] == ALL, kv[0]))
            }
            for suite, cats in self.by.items()
        }
