# ruff: noqa: E402 - imports follow the sys.path fix
"""Drafters for a vision-language target trained on text alone vs on text and images (issue 55), each
evaluated on prompts with images and on text prompts: real tau, lossless.

    python benchmarks/multimodal.py [--prompts 64] [--steps 150] [--new 32] [--eval 16] [--smoke]

One run on the tiny Qwen3.5-style VLM (draftdeck.drafter.tiny_vlm: the hybrid text model, a 1-layer
vision tower, random weights) and its generated pictures. The data is the target's own greedy answers
(its vision tower reading each prompt's picture) to `--prompts` questions about a picture and
`--prompts` text questions: the `text` drafter trains on 2 x `--prompts` text rows, the `text + images`
drafter on the `--prompts` image rows and `--prompts` text rows (the same number of rows, the same
steps). Both DFlash drafters (blocks of 4) are then decoded against the whole VLM on `--eval` held-out
prompts with pictures and `--eval` without, greedy: tau incl. bonus on each kind of prompt, and whether
the output equals the target's alone token for token. The tokenize side (rows/s with images, bytes per
image stored): benchmarks/multimodal_tokenize.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import ImageRows
from draftdeck.drafter.tiny_vlm import (
    ImageRow,
    image_row,
    load_image_processor,
    write_image_dataset,
    write_tiny_images,
    write_tiny_vlm,
)
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.drafter.train.truth import target_answers
from draftdeck.jobs.context import LocalContext

SUBJECTS = ["shapes", "colours", "corners", "the background", "the largest shape", "the left side"]
TOPICS = ["a garden", "the sea", "winter", "a market", "a castle", "the stars", "a river", "a clock"]


def prompts(folder: Path, pictures: list[Path], n: int, offset: int) -> tuple[list[ImageRow], list[ImageRow]]:
    """`n` questions about a picture and `n` text questions (prompt tokens only, `mask` unused), numbered
    from `offset` so that training and evaluation prompts differ."""
    from transformers import AutoTokenizer

    tok, processor = AutoTokenizer.from_pretrained(folder), load_image_processor(folder)
    shown, text = [], []
    for i in range(offset, offset + n):
        about = f"Tell me about {SUBJECTS[i % len(SUBJECTS)]} in picture {i}."
        row = image_row(tok, processor, about, "-", [pictures[i % len(pictures)]])
        shown.append(ImageRow(row.ids[: row.mask.index(1)], [], row.pictures, row.grids))
        row = image_row(tok, processor, f"Tell me about {TOPICS[i % len(TOPICS)]}, story {i}.", "-", [])
        text.append(ImageRow(row.ids[: row.mask.index(1)], [], [], []))
    return shown, text


def answered(target: Target, asked: list[ImageRow], new: int) -> list[ImageRow]:
    """The target's own greedy answers (at most `new` tokens) to `asked`, its tower reading the pictures."""
    target.attach_images(ImageRows(int(target.model.config.image_token_id)))
    shown = [list(zip(a.pictures, a.grids, strict=True)) for a in asked]
    out = target_answers(target, [a.ids for a in asked], [new] * len(asked), images=shown)
    return [
        ImageRow(ids.tolist(), mask.tolist(), a.pictures, a.grids)
        for (ids, mask), a in zip(out, asked, strict=True)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64, help="training prompts of each kind")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--new", type=int, default=32, help="tokens an answer at most")
    ap.add_argument("--eval", type=int, default=16, help="held-out prompts of each kind")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="a few prompts and steps: checks the script runs")
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.steps, args.new, args.eval = 6, 2, 8, 3
    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dd-multimodal-"))
    began = time.perf_counter()
    try:
        folder = write_tiny_vlm(work / "target", seed=0)
        pictures = write_tiny_images(work / "pictures", n=8, seed=0)
        target = Target.load(folder, vision=True)
        shown, text = prompts(folder, pictures, args.prompts, 0)
        more_text = prompts(folder, pictures, args.prompts, args.prompts)[1]
        held_shown, held_text = prompts(folder, pictures, args.eval, 10 * args.prompts)
        datasets = {
            "text": answered(target, text + more_text, args.new),
            "text + images": answered(target, shown + text, args.new),
        }
        held = write_image_dataset(
            work / "heldout", answered(target, held_shown + held_text, args.new), folder
        )
        print(
            f"tiny VLM, {args.prompts} prompts of each kind, {args.steps} steps, DFlash blocks of 4; "
            f"eval: {args.eval} image + {args.eval} text prompts, greedy, {args.new} tokens at most\n"
        )
        print(
            "| drafter trained on | rows | rows with images | train s | tau image prompts | tau text prompts"
            " | lossless |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, rows in datasets.items():
            slug = name.replace(" + ", "-")
            data = write_image_dataset(work / f"data-{slug}", rows, folder)
            t0 = time.perf_counter()
            train(
                TrainParams(
                    inputs=[str(data)],
                    target=str(folder),
                    out=str(work / f"run-{slug}"),
                    block_size=4,
                    batch_size=8,
                    lr=3e-3,
                    max_steps=args.steps,
                    heldout_fraction=0.05,
                    truth_rows=0,
                    checkpoint_every=args.steps,
                    eval_every=args.steps,
                    device="cpu",
                ),
                LocalContext(work / f"train-{slug}"),
            )
            seconds = time.perf_counter() - t0
            ctx = LocalContext(work / f"eval-{slug}")
            run_eval(
                EvalParams(
                    inputs=[str(held)],
                    target=str(folder),
                    checkpoint=str(work / f"run-{slug}"),
                    max_new_tokens=args.new,
                    heldout_fraction=0.99,
                    max_prompts=2 * args.eval,
                    baselines=False,
                ),
                ctx,
            )
            ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
            by = ev["by_modality"]
            print(
                f"| {name} | {len(rows)} | {sum(1 for r in rows if r.pictures)} | {seconds:.1f} "
                f"| {by['image']['tau_incl_bonus']:.3f} ({by['image']['prompts']}) "
                f"| {by['text']['tau_incl_bonus']:.3f} ({by['text']['prompts']}) | {ev['lossless']} |"
            )
        print(
            f"\ntau incl. bonus = 1 + accepted / verify steps (prompts in brackets); "
            f"{time.perf_counter() - began:.0f} s in all"
        )
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
