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
from draftdeck.drafter.tiny_vlm import ImageRow, image_row, load_image_processor, write_image_dataset
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
    images.add(row.ids, list(zip(row.pictures, row.grids, strict=True)), "row 0")
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


@pytest.mark.slow
def test_eval_reports_image_and_text_prompts_apart(
    tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    ds = write_image_dataset(tmp_path / "data", _rows(tiny_vlm, pictures, 24), tiny_vlm)
    train(TrainParams(inputs=[str(ds)], target=str(tiny_vlm), out=str(tmp_path / "run"), block_size=4,
                      batch_size=4, max_steps=2, heldout_fraction=0.4, device="cpu"),
          LocalContext(tmp_path / "train"))  # fmt: skip
    ctx = LocalContext(tmp_path / "eval")
    run_eval(EvalParams(inputs=[str(ds)], target=str(tiny_vlm), checkpoint=str(tmp_path / "run"),
                        max_new_tokens=12, heldout_fraction=0.4, max_prompts=6, baselines=False),
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
