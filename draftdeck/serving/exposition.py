"""A scrape of a server's `/metrics`, parsed with `prometheus_client`'s own parser and kept as the raw
values of the series that matter for speculative decoding.

vLLM (`vllm/v1/spec_decode/metrics.py`) exports counters, labelled `model_name` and `engine`:
`vllm:spec_decode_num_drafts` (verify steps), `..._num_draft_tokens`, `..._num_accepted_tokens` and
`..._num_accepted_tokens_per_pos{position="i"}` (drafts that accepted more than i tokens); in the
text they end in `_total`, beside `_created` gauges that are not counts. SGLang exports only the gauges
`sglang:spec_accept_length` and `sglang:spec_accept_rate`, figures of its last log interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from draftdeck.errors import InputError

KINDS = ("vllm", "sglang")
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SGLANG_GAUGES = {"sglang:spec_accept_length": "accept_length", "sglang:spec_accept_rate": "accept_rate"}


class ExpositionError(InputError):
    """Text that is not a Prometheus exposition, or one without the server's spec-decode series."""


@dataclass
class Engine:
    """One engine's counters as scraped: totals since that engine started."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def went_down_from(self, before: Engine) -> bool:
        """A counter below its earlier value: the engine restarted in between."""
        pairs = [(self.drafts, before.drafts), (self.draft_tokens, before.draft_tokens)]
        pairs += [(self.accepted, before.accepted)]
        pairs += [
            (v, before.per_position[i]) for i, v in self.per_position.items() if i in before.per_position
        ]
        return any(now < then for now, then in pairs)


@dataclass
class Scrape:
    """The spec-decode series of one scrape: vLLM's counters per (model_name, engine), SGLang's gauges
    per model_name. `at` is the scrape's wall time in epoch seconds."""

    kind: str
    at: float
    engines: dict[tuple[str, str], Engine] = field(default_factory=dict)
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at": self.at,
            "engines": [
                {
                    "model_name": m,
                    "engine": e,
                    "drafts": c.drafts,
                    "draft_tokens": c.draft_tokens,
                    "accepted": c.accepted,
                    "per_position": {str(i): v for i, v in sorted(c.per_position.items())},
                }
                for (m, e), c in sorted(self.engines.items())
            ],
            "gauges": self.gauges,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scrape:
        engines = {
            (str(e["model_name"]), str(e["engine"])): Engine(
                float(e["drafts"]), float(e["draft_tokens"]), float(e["accepted"]),
                {int(i): float(v) for i, v in (e.get("per_position") or {}).items()},
            )
            for e in d.get("engines") or []
        }  # fmt: skip
        gauges = {
            str(m): {str(k): float(v) for k, v in g.items()} for m, g in (d.get("gauges") or {}).items()
        }
        return cls(str(d["kind"]), float(d["at"]), engines, gauges)


def _families(text: str, source: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        head = text.strip().splitlines()[0][:80] if text.strip() else ""
        starts = "" if head in str(e) else f"; it starts {head!r}"
        raise ExpositionError(f"{source}: not a Prometheus text exposition ({e}){starts}") from None


def parse(text: str, kind: str, at: float, source: str = "metrics") -> Scrape:
    """The spec-decode series of `text`; an ExpositionError when the text does not parse or holds none
    of them (for vLLM, they exist only while speculative decoding is configured)."""
    if kind not in KINDS:
        raise ExpositionError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    scrape = Scrape(kind, at)
    for family in _families(text, source):
        name = family.name.removesuffix("_total")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # the time a series was created, not a count
            labels = sample.labels
            model = labels.get("model_name", "")
            if kind == "vllm" and (name in VLLM_COUNTERS or name == VLLM_PER_POSITION):
                engine = scrape.engines.setdefault((model, labels.get("engine", "")), Engine())
                if name == VLLM_PER_POSITION:
                    position = labels.get("position", "")
                    if not position.isdigit():
                        raise ExpositionError(f"{source}: {name} has position {position!r}, not a number")
                    engine.per_position[int(position)] = float(sample.value)
                else:
                    setattr(engine, VLLM_COUNTERS[name], float(sample.value))
            elif kind == "sglang" and name in SGLANG_GAUGES:
                scrape.gauges.setdefault(model, {})[SGLANG_GAUGES[name]] = float(sample.value)
    if not scrape.engines and not scrape.gauges:
        wanted = ", ".join([*VLLM_COUNTERS, VLLM_PER_POSITION] if kind == "vllm" else SGLANG_GAUGES)
        raise ExpositionError(
            f"{source}: a Prometheus exposition, but without {kind}'s speculative-decoding series "
            f"({wanted}): is the server {kind}, with a drafter configured?"
        )
    return scrape
