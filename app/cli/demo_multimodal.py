"""`draftdeck demo --multimodal`: the vision-language path on the CPU, as jobs the dashboard shows
(issue 55).

A tiny random Qwen3.5-style VLM and a handful of generated pictures are written (draftdeck.drafter.
tiny_vlm), and prompts about the pictures and text prompts, in the shapes users bring images in
(OpenAI `image_url` parts, LLaMA-Factory `<image>` placeholders, text alone). Then four jobs, recorded
as a worker records them:

    regenerate (--local: the VLM answers greedily, its vision tower reading each picture)
      ->  tokenize (the target's processor: each picture its grid's image tokens, loss mask 0 there)
      ->  train (a 1-layer DFlash drafter against the whole VLM, its tower frozen)
      ->  eval (real speculative decoding with the pictures in the prompts: lossless, tau on image
          prompts and on text prompts apart)

The last line is one JSON object with the figures, every tau incl. bonus.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import typer

from app.cli.demo import _page_url, _run, demo_train_params, start_demo

# the random VLM's answers are short loops of its own tokens: a short run shows the drafter learn them
QUICK = {"prompts": 160, "max_new": 32, "train_steps": 120, "eval_prompts": 32}
FULL = {"prompts": 300, "max_new": 48, "train_steps": 200, "eval_prompts": 48}


def demo_multimodal(workdir: Path, *, quick: bool, seed: int, threads: int) -> None:
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.drafter.tiny_vlm import write_tiny_images, write_tiny_vlm
    from draftdeck.regenerate import RegenerateParams
    from draftdeck.tokenize.job import TokenizeParams

    size = QUICK if quick else FULL
    say = start_demo(workdir, threads)
    target = write_tiny_vlm(workdir / "world" / "target", seed=seed)
    pictures = write_tiny_images(workdir / "world" / "pictures", n=8, seed=seed)
    say(f"world ready: a tiny random Qwen3.5-style VLM ({target}), {len(pictures)} pictures")
    prompts, answers = workdir / "prompts.jsonl", workdir / "answers.jsonl"
    shapes = write_prompts(pictures, size["prompts"], prompts, seed=seed)
    say(f"{size['prompts']} prompts: " + ", ".join(f"{n} {k}" for k, n in shapes.items()))
    _run("regenerate", RegenerateParams(
        inputs=[str(prompts)], out=str(answers), local=str(target), max_tokens=size["max_new"], temperature=0,
        keep_cut_off=True, concurrency=16,  # a random model's answers often run to max_tokens
    ), say)  # fmt: skip
    dataset = workdir / "dataset"
    _run("tokenize", TokenizeParams(inputs=[str(answers)], tokenizer=str(target), out=str(dataset)), say)
    params = demo_train_params(
        "dflash", [str(dataset)], str(target), workdir / "run", size["train_steps"], seed
    )
    train_id, _ = _run("train", params.model_copy(update={"batch_size": 16, "truth_rows": 8}), say)
    say(f"run page: {_page_url(f'/runs/{train_id}')}")
    _run("eval", EvalParams(
        inputs=[str(dataset)], target=str(target), checkpoint=str(workdir / "run"), out=str(workdir / "eval"),
        max_new_tokens=size["max_new"], max_prompts=size["eval_prompts"], heldout_fraction=0.1, seed=seed,
    ), say)  # fmt: skip
    say(f"done in {say.elapsed():.0f} s; every tau counts the bonus token (vLLM's convention)")
    typer.echo(json.dumps(summary(workdir)))


def write_prompts(pictures: list[Path], n: int, out: Path, *, seed: int = 0) -> dict[str, int]:
    """`n` prompt-only rows written to `out` as JSONL, by turns: a question about a picture as OpenAI
    `image_url` parts (the file's path), one as a LLaMA-Factory `<image>` row (its `images` list
    relative to `out`), and a text prompt. Returns the rows of each shape."""
    rng = random.Random(seed)
    counts = {"image_url": 0, "<image>": 0, "text": 0}
    lines = []
    for i in range(n):
        what = rng.choice(["shapes", "colours", "corners", "background", "largest shape"])
        row: dict[str, Any]
        if i % 3 == 2:
            row, shape = {"messages": [{"role": "user", "content": f"Tell me a story, {i}."}]}, "text"
        else:
            picture, question = (
                pictures[rng.randrange(len(pictures))],
                f"Tell me about the {what} in picture {i}.",
            )
            if i % 3 == 0:
                parts = [
                    {"type": "image_url", "image_url": {"url": str(picture)}},
                    {"type": "text", "text": question},
                ]
                row, shape = {"messages": [{"role": "user", "content": parts}]}, "image_url"
            else:
                relative = os.path.relpath(picture, out.parent)
                row = {"messages": [{"role": "user", "content": f"<image>{question}"}], "images": [relative]}
                shape = "<image>"
        lines.append(json.dumps(row))
        counts[shape] += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts


def summary(workdir: Path) -> dict[str, Any]:
    """The figures: real tau on image prompts and on text prompts, the baselines, losslessness."""
    ev = json.loads((workdir / "eval" / "eval.json").read_text())["eval"]
    run = json.loads((workdir / "run" / "run.json").read_text())
    methods, by = ev["methods"], ev["by_modality"]
    return {
        "rows": run["data"]["rows_in"],
        "rows_with_images": run["data"].get("rows_with_images", 0),
        "eval_tau": methods["drafter"]["tau_incl_bonus_pooled"],
        "eval_tau_image_prompts": by["image"]["tau_incl_bonus"],
        "eval_tau_text_prompts": by["text"]["tau_incl_bonus"],
        "image_prompts": by["image"]["prompts"],
        "text_prompts": by["text"]["prompts"],
        "untrained_tau": methods["untrained"]["tau_incl_bonus_pooled"],
        "prompt_lookup_tau": methods["prompt_lookup"]["tau_incl_bonus_pooled"],
        "lossless": bool(ev["lossless"]),
    }
