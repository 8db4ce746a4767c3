"""Speculative decoding with images in the prompt (issue 55): the prompt's pictures go through the
tiny VLM's tower at the prefill, later positions continue from its M-RoPE positions (rope delta), the
output equals transformers' own greedy generation with the same pictures token for token, and the
eval reports the drafter's tau on prompts with images and on text prompts apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import (
    ReferenceDrafts,
    TargetRunner,
    generate_plain,
    generate_speculative,
)
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import ImageRows
from draftdeck.drafter.tiny_vlm import ImageRow, image_row, load_image_processor
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext

torch.set_num_threads(1)
WORDS = ["red", "circle", "square", "blue", "green", "box", "ring", "sun", "dot", "line"]


def _rows(folder: Path, pictures: list[Path], n: int) -> list[ImageRow]:
    """Rows with one or two pictures, every third of text alone."""
    from transformers import AutoTokenizer

    tok, processor = AutoTokenizer.from_pretrained(folder), load_image_processor(folder)
    out = []
    for i in range(n):
        shown = [] if i % 3 == 2 else [pictures[i % 6], *([pictures[(i + 1) % 6]] if i % 4 == 0 else [])]
        answer = " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(6 + i % 5))
        out.append(image_row(tok, processor, f"Say what picture {i} shows.", answer, shown))
    return out


def test_greedy_with_pictures_equals_transformers_generate(tiny_vlm: Path, pictures: list[Path]) -> None:
    rows = _rows(tiny_vlm, pictures, 1)  # two pictures
    row = rows[0]
    prompt = row.ids[: row.mask.index(1)]
    target = Target.load(tiny_vlm, vision=True)
    images = ImageRows(target.model.config.image_token_id)
    images.bind(prompt, list(zip(row.pictures, row.grids, strict=True)))  # the prompt's pictures
    target.attach_images(images)
    ids = torch.tensor([prompt])
    inputs = target.vision_inputs(ids, None)
    new = 24
    reference = target.model.generate(input_ids=ids, **inputs, max_new_tokens=new, do_sample=False,
                                      eos_token_id=[], pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    runner = TargetRunner(target, [])  # no eos: every one of the `new` tokens compared
    plain = generate_plain(runner, prompt, new).output_ids
    assert plain == reference
    assert target.model.model.rope_deltas is not None and int(target.model.model.rope_deltas) < 0
    # drafts wrong every third token: rejections undo the hybrid layers' states mid-block
    spec = generate_speculative(runner, ReferenceDrafts(reference, wrong_every=3), prompt, new, 4)
    assert spec.output_ids == reference and spec.steps < new and spec.accepted < len(reference) - 1
    # the same prompt read as text alone (the language model only) answers otherwise: the pictures count
    text = generate_plain(TargetRunner(Target.load(tiny_vlm), []), prompt, new).output_ids
    assert text != reference


def _mixed_file(folder: Path, pictures: list[Path]) -> Path:
    """24 conversations: OpenAI `image_url` parts (a file path), LLaMA-Factory `<image>` placeholders with
    an `images` list relative to the file, and text alone, by turns."""
    lines = []
    for i in range(24):
        answer = " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(6 + i % 5))
        if i % 3 == 0:
            parts = [{"type": "image_url", "image_url": {"url": str(pictures[i % 6])}},
                     {"type": "text", "text": f"What is in picture {i}?"}]  # fmt: skip
            row: dict = {"messages": [{"role": "user", "content": parts}]}
        elif i % 3 == 1:
            row = {"messages": [{"role": "user", "content": f"<image>Describe picture {i}."}],
                   "images": [f"{pictures[i % 6].parent.name}/{pictures[i % 6].name}"]}  # fmt: skip
        else:
            row = {"messages": [{"role": "user", "content": f"Say something about {i}."}]}
        row["messages"].append({"role": "assistant", "content": answer})
        lines.append(json.dumps(row))
    path = pictures[0].parent.parent / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_mixed_file_tokenized_trained_and_evaluated(
    tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """Issue 55's done-when: a file mixing OpenAI image_url rows and LLaMA-Factory <image> rows tokenizes
    against the tiny Qwen3.5-style VLM with every row kept, each picture expanded to its grid's token
    count with loss mask 0 there; a train run and a lossless eval run on it, image and text prompts
    reported apart."""
    from draftdeck.shards.store import ShardDataset
    from draftdeck.tokenize.job import TokenizeParams, tokenize_files

    ds = tmp_path / "data"
    report = tokenize_files(
        TokenizeParams(inputs=[str(_mixed_file(tiny_vlm, pictures))], tokenizer=str(tiny_vlm)), ds
    )
    assert report.rows_in == report.rows_out == 24 and not report.rejected
    shards, pad = ShardDataset(ds), Target.load(tiny_vlm, vision=True).model.config.image_token_id
    assert sum(len(shards.row_images(n)) for n in range(len(shards))) == 16  # two rows in three show one
    for n in range(len(shards)):
        row, images = shards.row(n), shards.row_images(n)
        image = [i for i, t in enumerate(row["input_ids"]) if t == pad]
        assert len(image) == sum(t * h * w // 4 for _, (t, h, w) in images)  # 2 x 2 patches a token
        assert all(row["loss_mask"][i] == 0 for i in image)
    train(TrainParams(inputs=[str(ds)], target=str(tiny_vlm), out=str(tmp_path / "run"), block_size=4,
                      batch_size=4, max_steps=2, heldout_fraction=0.4, device="cpu"),
          LocalContext(tmp_path / "train"))  # fmt: skip
    ctx = LocalContext(tmp_path / "eval")
    run_eval(EvalParams(inputs=[str(ds)], target=str(tiny_vlm), checkpoint=str(tmp_path / "run"),
                        max_new_tokens=12, heldout_fraction=0.4, max_prompts=8, baselines=False),
             ctx)  # fmt: skip
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    assert ev["lossless"] is True
    by = ev["by_modality"]
    assert by["image"]["prompts"] > 0 and by["text"]["prompts"] > 0
    assert by["image"]["prompts"] + by["text"]["prompts"] == ev["prompts"]
    drafter = ev["methods"]["drafter"]["counts"]
    assert by["image"]["steps"] + by["text"]["steps"] == drafter["verify_steps"]
    assert by["image"]["accepted"] + by["text"]["accepted"] == drafter["accepted"]
    # the walk over the target's own outputs (teacher-forced, pictures looked up) equals real decoding
    assert (ev["walked"]["accepted"], ev["walked"]["steps"]) == (drafter["accepted"], drafter["verify_steps"])
    assert any("vision tower" in m for _, m, _, _ in ctx.events)
    # the export records what the drafter was trained on, and says how a VLM target is served
    from draftdeck.drafter.export.params import ExportParams, run_export

    exported = run_export(ExportParams(inputs=[str(tmp_path / "run")], out=str(tmp_path / "export")),
                          LocalContext(tmp_path / "export-job"))  # fmt: skip
    said = json.loads((tmp_path / "export" / "trained_on.json").read_text())
    assert said["data"] == "text + images" and said["rows_with_images"] == 16
    assert any("--enable-multimodal" in line for line in exported.extra["vlm_serving"])
