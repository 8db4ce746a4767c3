"""Inputs and comparisons for the chunked tokenize tests (unit and integration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa

from draftdeck.shards.store import ShardDataset
from tests.conftest import FIXTURES

FIXTURE_CHAT = FIXTURES / "tokenize" / "chat.jsonl"


def write_chat_input(path: Path, n: int = 60) -> Path:
    """The fixture's 8 varied rows (reasoning, tools, CJK, control-token look-alikes, a row with no user
    turn), then `n` generated rows: 1-3 turns, duplicates of earlier rows (rejected only when the
    reading sees the whole input in order), a row that is not JSON and a prompt-only row."""
    lines = FIXTURE_CHAT.read_text(encoding="utf-8").splitlines()
    made: list[str] = []
    for i in range(n):
        if i % 9 == 8:
            made.append(made[i - 5])  # a duplicate, often in another chunk
            continue
        msgs: list[dict[str, Any]] = []
        for t in range(1 + i % 3):
            msgs.append(
                {"role": "user", "content": f"Question {i}.{t}: what is {i} + {t}? Think step by step."}
            )
            msgs.append(
                {"role": "assistant", "content": f"The sum of {i} and {t} is {i + t}. " * (1 + i % 4)}
            )
        made.append(json.dumps({"messages": msgs}, ensure_ascii=False))
    made.insert(n // 2, "not json {")
    made.insert(n // 3, json.dumps({"messages": [{"role": "user", "content": "only a prompt"}]}))
    path.write_text("\n".join(lines + made) + "\n", encoding="utf-8")
    return path


# The loss thresholds a tokenize job gets by default (draftdeck/tokenize/job.py), for in-process runs
# whose dataset is compared with a job's: the manifest records them.
class JobLimits(TypedDict):
    """TokenizeOptions' loss thresholds, as keyword arguments."""

    max_rejected: float
    alert_rejected: float
    alert_duplicated: float
    alert_truncated: float


JOB_LIMITS: JobLimits = {
    "max_rejected": 0.5,
    "alert_rejected": 0.05,
    "alert_duplicated": 0.05,
    "alert_truncated": 0.05,
}


def table(path: Path) -> pa.Table:
    ds = ShardDataset(path)
    return pa.Table.from_batches(list(ds.iter_batches()))


def comparable_manifest(path: Path) -> dict[str, Any]:
    """The manifest minus what differs between runs: timings, paths, shard cuts, encoder bookkeeping."""
    m = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    m.pop("shards")
    m["parameters"].pop("workers", None)
    report = m["report"]
    for key in ("seconds", "outputs", "encoder"):
        report.pop(key)
    return m


def assert_same_dataset(a: Path, b: Path) -> None:
    """Same rows in the same order with the same data, same statistics and manifest (but shard cuts)."""
    ta, tb = table(a), table(b)
    assert ta.num_rows == tb.num_rows > 0
    assert ta.schema == tb.schema
    assert ta.equals(tb), "the rows differ"
    sa = json.loads((a / "stats.json").read_text(encoding="utf-8"))
    sb = json.loads((b / "stats.json").read_text(encoding="utf-8"))
    assert sa == sb
    assert np.array_equal(np.load(a / "trained_token_counts.npy"), np.load(b / "trained_token_counts.npy"))
    ma, mb = comparable_manifest(a), comparable_manifest(b)
    assert ma == mb, _differences(ma, mb)


def _differences(a: Any, b: Any, at: str = "manifest") -> list[str]:
    """Where two JSON values differ, as paths with both sides: a failed comparison says what."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{at}.{k}")]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]
