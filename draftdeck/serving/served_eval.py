"""Served eval: the eval's own prompts (their token ids, the same ones decoded offline) sent to a served
drafter, greedy, and the server's acceptance on exactly those prompts.

- vLLM: `/v1/completions` with the prompt's token ids; the spec-decode counters scraped before and
  after give the window (exact when nothing else is served meanwhile: the tokens its verify steps
  produced must not exceed the completion tokens returned, else `other_traffic` is set).
- SGLang: `/generate` with `input_ids`; each response's `meta_info` has `completion_tokens` and
  `spec_verify_ct`, so served tau = sum of completion tokens / sum of verify steps, per request.

Counts are returned; ratios are properties, as everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from draftdeck.errors import InputError
from draftdeck.serving.exposition import parse
from draftdeck.serving.fetch import fetch_text
from draftdeck.serving.window import Window, windows


class ServedEvalError(InputError):
    """The served endpoint refused a prompt or answered in a shape the eval cannot read."""


@dataclass
class ServedCounts:
    kind: str
    prompts: int = 0
    completion_tokens: int = 0
    verify_steps: int = 0  # SGLang: sum of spec_verify_ct; vLLM: the window's drafts
    window: Window | None = None  # vLLM: the counter deltas over the prompts
    per_prompt: list[dict[str, int]] = field(default_factory=list)

    @property
    def tau_incl_bonus(self) -> float | None:
        if self.kind == "vllm":
            return self.window.tau_incl_bonus if self.window else None
        return self.completion_tokens / self.verify_steps if self.verify_steps else None

    @property
    def other_traffic(self) -> bool:
        """The server verified more tokens than it returned us: someone else was served meanwhile."""
        w = self.window
        return bool(w and w.accepted + w.drafts > self.completion_tokens)

    @classmethod
    def merge(cls, kind: str, parts: list[ServedCounts]) -> ServedCounts:
        """The counts of several windows of one server taken one after another (one per category)."""
        out = cls(kind)
        for p in parts:
            out.prompts += p.prompts
            out.completion_tokens += p.completion_tokens
            out.verify_steps += p.verify_steps
            out.per_prompt += p.per_prompt
            if p.window is not None:
                if out.window is None:
                    out.window = Window(p.window.model_name, 0.0)
                w = out.window
                w.seconds += p.window.seconds
                w.drafts += p.window.drafts
                w.draft_tokens += p.window.draft_tokens
                w.accepted += p.window.accepted
                if not w.per_position_counts:
                    w.per_position_counts = list(p.window.per_position_counts)
                elif len(w.per_position_counts) == len(p.window.per_position_counts):
                    pairs = zip(w.per_position_counts, p.window.per_position_counts, strict=True)
                    w.per_position_counts = [None if a is None or b is None else a + b for a, b in pairs]
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "prompts": self.prompts,
            "completion_tokens": self.completion_tokens,
            "verify_steps": self.verify_steps,
            "tau_incl_bonus": self.tau_incl_bonus,
            "convention": (
                "1 + accepted / drafts from the counters, as vLLM counts"
                if self.kind == "vllm"
                else "completion tokens / spec_verify_ct, per request (SGLang's meta_info)"
            ),
        }
        if self.window is not None:
            out["window"] = self.window.to_json()
            out["other_traffic"] = self.other_traffic
        return out


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        r = client.post(url, json=body)
    except httpx.HTTPError as e:
        raise ServedEvalError(f"{url}: cannot reach it ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        raise ServedEvalError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
    try:
        data = r.json()
    except ValueError:
        raise ServedEvalError(f"{url}: the answer is not JSON: {r.text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ServedEvalError(f"{url}: the answer is not a JSON object")
    return data


def served_eval(
    prompts: list[list[int]], *, kind: str, base_url: str, metrics_url: str | None, model: str | None,
    max_new_tokens: int, token: str | None = None, timeout: float = 300.0,
) -> ServedCounts:  # fmt: skip
    base = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    counts = ServedCounts(kind)
    with httpx.Client(headers=headers, timeout=timeout) as client:
        if kind == "vllm":
            if not metrics_url:
                raise ServedEvalError(
                    "a vLLM served eval needs the metrics URL: its counters are the figures"
                )
            before = parse(fetch_text(metrics_url, token=token), kind, time.time(), source=metrics_url)
            for ids in prompts:
                body: dict[str, Any] = {
                    "model": model,
                    "prompt": ids,
                    "max_tokens": max_new_tokens,
                    "temperature": 0,
                }
                data = _post(client, f"{base}/v1/completions", body)
                usage = data.get("usage") or {}
                if not isinstance(usage.get("completion_tokens"), int):
                    raise ServedEvalError(f"{base}/v1/completions: no usage.completion_tokens in the answer")
                counts.completion_tokens += usage["completion_tokens"]
                counts.prompts += 1
            now = parse(fetch_text(metrics_url, token=token), kind, time.time(), source=metrics_url)
            found = windows(before, now)
            if found:
                w = found[0]
                for other in found[1:]:  # several model names: one server, one drafter; summed
                    w.drafts += other.drafts
                    w.draft_tokens += other.draft_tokens
                    w.accepted += other.accepted
                counts.window, counts.verify_steps = w, w.drafts
        else:
            for ids in prompts:
                body = {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
                }
                meta = _post(client, f"{base}/generate", body).get("meta_info") or {}
                produced, steps = meta.get("completion_tokens"), meta.get("spec_verify_ct")
                if not isinstance(produced, int) or not isinstance(steps, int):
                    raise ServedEvalError(
                        f"{base}/generate: meta_info lacks completion_tokens or spec_verify_ct: "
                        "is speculative decoding on?"
                    )
                counts.completion_tokens += produced
                counts.verify_steps += steps
                counts.prompts += 1
                counts.per_prompt.append({"completion_tokens": produced, "spec_verify_ct": steps})
    return counts
