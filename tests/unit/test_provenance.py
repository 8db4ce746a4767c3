"""Provenance through the pipeline: a model folder's fingerprint, the identity regenerate records per
row, and tokenize counting rows by who answered them into stats.json and the manifest (one process,
a pool, and a chunk's saved statistics alike)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from draftdeck.chat.testing import small_bpe_tokenizer
from draftdeck.provenance import Answered, ModelIdentity, model_fingerprint
from draftdeck.shards.manifest import read_manifest
from draftdeck.shards.stats import Stats
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.support.drafter import saved_target


def test_a_fingerprint_is_the_weights_not_the_folder(tmp_path: Path) -> None:
    a = saved_target(tmp_path / "a", seed=0)
    b = saved_target(tmp_path / "b", seed=1)  # same config, other weights
    shutil.copytree(a, tmp_path / "copy")
    assert model_fingerprint(a) == model_fingerprint(tmp_path / "copy")
    assert model_fingerprint(a) != model_fingerprint(b)
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    ident = ModelIdentity.of_folder(a)
    assert ident.name == str(a.resolve()) and ident.fingerprint == model_fingerprint(a) and not ident.served
    assert ModelIdentity.from_key(ident.key()) == ident


def test_answered_counts_say_how_many_rows_the_target_wrote() -> None:
    mine = ModelIdentity("target", "sha256:" + "a" * 64)
    other = ModelIdentity("other", "sha256:" + "b" * 64)
    served = ModelIdentity("Qwen/Qwen3.6-27B", served=True)
    answered = Answered.from_counts({mine.key(): 5, other.key(): 3, served.key(): 2, "": 4})
    assert (
        answered.rows == 14
        and answered.no_record == 4
        and answered.by_fingerprint(mine.fingerprint or "") == 5
    )
    line = answered.versus(mine.fingerprint or "")
    assert line.startswith("5 of 14 rows were answered by this target (")
    assert (
        "3 by local model other (sha256:bbbbbbbbbbbb…)" in line
        and "2 by served model 'Qwen/Qwen3.6-27B'" in line
    )
    assert "4 with no record of who answered them" in line
    assert Answered.from_counts({"": 3}).versus("sha256:x") == (
        "0 of 3 rows were answered by this target (3 with no record of who answered them)"
    )


def _regenerated(path: Path, who: ModelIdentity | None, n: int, start: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(start, start + n):
            row: dict[str, Any] = {
                "messages": [
                    {"role": "user", "content": f"Count to {i}."},
                    {"role": "assistant", "content": f"One, two, {i}."},
                ]
            }
            if who is not None:
                row["generation"] = {"model": who.name, "temperature": 0.0, "answered_by": who.to_dict()}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_tokenize_counts_rows_by_who_answered_them(tmp_path: Path, workers: int) -> None:
    a = ModelIdentity("target", "sha256:" + "a" * 64)
    b = ModelIdentity("other", "sha256:" + "b" * 64)
    files = [
        _regenerated(tmp_path / "a.jsonl", a, 30),
        _regenerated(tmp_path / "b.jsonl", b, 20, start=30),
        _regenerated(tmp_path / "none.jsonl", None, 10, start=50),
    ]
    out = tmp_path / "ds"
    tokenize_files(files, out, TokenizeOptions(small_bpe_tokenizer(), workers=workers, shard_rows=16))
    prov = read_manifest(out).provenance
    assert prov is not None and prov.rows == 60 and prov.no_record == 10
    assert dict(prov.by) == {a: 30, b: 20}
    stats = json.loads((out / "stats.json").read_text())["provenance"]
    assert stats == prov.to_dict()


def test_a_chunks_saved_statistics_keep_who_answered(tmp_path: Path) -> None:
    s = Stats(16)
    s.answered = {ModelIdentity("t", "sha256:1").key(): 3, "": 1}
    s.rows = 4
    s.save_state(tmp_path / "state.npz")
    back = Stats.load_state(tmp_path / "state.npz")
    merged = Stats(16)
    merged.merge(back)
    merged.merge(back)
    assert merged.provenance.by_fingerprint("sha256:1") == 6 and merged.provenance.no_record == 2
