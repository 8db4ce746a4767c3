# ruff: noqa: F811 - pytest fixtures imported from tests.support.tokenize
"""Tokenize's outputs pinned: speed work on the tokenize path must not change one id or mask bit.

The fixture conversations' rows (ids, mask runs, turn, source row) are spelled out in
pinned_chat_rows.json; the real-data sample is pinned by a digest of its rows (924k tokens do not
belong in the repository). Both were written by the code before issue 56's speed work, and both
encoders must give them (the HF encoder is the reference the tiktoken path is checked against).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.conftest import REAL_DATA
from tests.support.tokenize import FIXTURES, qwen_dir  # noqa: F401

PINNED = Path(__file__).with_name("pinned_chat_rows.json")
# the real sample: every file of ../shared/datasets/real/ (what the benchmark reads too)
REAL_DIGEST = "9be54fa637d9c2eeb3cb6bfb83ddbedfee02591dc9ba68bb69af1c4abde83334"
REAL_ROWS, REAL_TOKENS = 4748, 923_965


def _runs(mask: list[int]) -> list[int]:
    """Lengths of alternating 0/1 runs of `mask`, starting with a run of 0s (maybe empty)."""
    out, cur, n = [], 0, 0
    for m in mask:
        if m != cur:
            out.append(n)
            cur, n = m, 0
        n += 1
    out.append(n)
    return out


def _rows(out: Path) -> list[dict[str, Any]]:
    ds = ShardDataset(out)
    return [
        {"source_row": r["source_row"], "turn": r["turn"], "truncated": r["truncated"], "issues": r["issues"],
         "input_ids": list(r["input_ids"]), "mask_runs": _runs(list(r["loss_mask"]))}
        for r in (ds.row(i) for i in range(len(ds)))
    ]  # fmt: skip


def _digest(rows: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps({k: v for k, v in r.items() if k not in ("input_ids",)}, sort_keys=True).encode())
        h.update(np.asarray(r["input_ids"], dtype=np.int32).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("encoder", ["tiktoken", "hf"])
def test_fixture_rows_are_pinned(tmp_path: Path, qwen_dir: Path, encoder: Literal["tiktoken", "hf"]) -> None:
    out = tmp_path / "ds"
    tokenize_files([FIXTURES / "chat.jsonl"], out, TokenizeOptions(qwen_dir, workers=1, encoder=encoder))
    assert _rows(out) == json.loads(PINNED.read_text())


@pytest.mark.parametrize("workers", [1, 2])
def test_real_sample_rows_are_pinned(tmp_path: Path, qwen_dir: Path, workers: int) -> None:
    files = sorted(REAL_DATA.glob("*.json*"))
    if not files:
        pytest.skip(f"{REAL_DATA} is absent")
    out = tmp_path / "ds"
    opts = TokenizeOptions(qwen_dir, workers=workers, on_missing="drop", chunk_size=64)
    report = tokenize_files(files, out, opts)
    rows = _rows(out)
    assert (len(rows), report.extra["tokens"]) == (REAL_ROWS, REAL_TOKENS)
    assert _digest(rows) == REAL_DIGEST
