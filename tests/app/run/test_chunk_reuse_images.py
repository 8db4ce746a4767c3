"""A chunked tokenize job with images that fails keeps its done chunks' pictures with them, leaves its
`out` folder empty (a retry may start), and its retry reuses those chunks with their pictures: the
dataset equals the in-process run's, images and all (issue 55)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.run.resume import kept_dir
from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.app.run.test_chunk_reuse import _fail_in_chunk, _job, _retry
from tests.app.run.test_tokenize_chunks import _chunks


def _submit_images(migrated: Path) -> tuple[int, Path, Path, Path]:
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope
    from draftdeck.kinds import get_kind

    data = migrated / "data"
    tok = data / "vlm"
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), tok)
    (tok / "preprocessor_config.json").write_text(json.dumps(tiny_vlm.preprocessor_config()))
    pics = tiny_vlm.write_tiny_images(data / "pics", n=4)
    rows = [{"conversations": [{"from": "human", "value": f"<image> what is in picture {i}?"},
                               {"from": "gpt", "value": f"Shapes, answer {i}."}],
             "images": [f"pics/{pics[i % 4].name}"]} for i in range(12)]  # fmt: skip
    src = data / "images.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = data / "out"
    kind = get_kind("tokenize")
    raw = {"inputs": str(src), "tokenizer": str(tok), "chunk_rows": 3, "out": str(out)}
    p = kind.params.model_validate(raw).confined(get_settings().roots)
    with session_scope() as session:
        job = jobs.create_job(session, "tokenize", p.model_dump(), kind.queue)
    assert job.id is not None
    return job.id, src, tok, out


def test_a_retried_job_with_images_reuses_its_chunks_with_their_pictures(
    migrated: Path, tmp_path: Path
) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job

    job_id, src, tok, out = _submit_images(migrated)
    assert run_job(job_id) == "handed-off"
    assert len(_chunks(job_id)) == 4
    assert [run_chunk(job_id, i) for i in (0, 1, 2)] == ["done"] * 3
    assert len(list((out / "images").iterdir())) == 4  # rows 0-8 of chunks 0-2 show all four pictures
    _fail_in_chunk(job_id, 3)
    assert _job(job_id).status == "failed"
    assert not out.exists() or list(out.iterdir()) == [], "out is empty again: the retry may start"
    assert len(list((kept_dir(job_id) / "images").iterdir())) == 4, "the pictures are kept with the chunks"

    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    assert [c.reused_from for c in _chunks(new_id)] == [job_id, job_id, job_id, None]
    assert run_chunk(new_id, 3) == "succeeded"
    assert _job(new_id).status == "succeeded"
    cli = tmp_path / "cli"
    tokenize_files([src], cli, TokenizeOptions(tok, workers=1))
    a, b = ShardDataset(cli), ShardDataset(out)
    assert a.table.to_pylist() == b.table.to_pylist() and len(b) == 12
    assert a.manifest.images == b.manifest.images and len(b.manifest.images or []) == 4
    assert sorted(p.name for p in b.images_dir.iterdir()) == [f.filename for f in b.manifest.images or []]
