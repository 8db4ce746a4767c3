"""`draftdeck demo --multimodal`: the vision-language path on the CPU, as jobs the dashboard shows
(issue 55).

A tiny random Qwen3.5-style VLM and a handful of generated pictures are written (draftdeck.drafter.
tiny_vlm); the VLM answers prompts about the pictures and text prompts greedily, its vision tower
reading each picture (in this process, one batched greedy pass: `regenerate --local` reads images too
now, docs/regenerate.md#images, but as a job it would add a step to the demo), and the conversations
are written in the shapes users bring images in (OpenAI `image_url` parts, LLaMA-Factory `<image>`
placeholders, text alone). Then three jobs, recorded as a worker records them:

    tokenize (the target's processor: each picture its grid's image tokens, loss mask 0 there)
      ->  train (a 1-layer DFlash drafter against the whole VLM, its tower frozen)
      ->  eval (real speculative decoding with the pictures in the prompts: lossless, tau on image
          prompts and on text prompts apart)

The last line is one JSON object with the figures, every tau incl. bonus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from app.cli.demo import _page_url, _run, demo_train_params, start_demo

# the random VLM's answers are short loops of its own tokens: a short run shows the drafter learn them
QUICK = {"prompts": 160, "max_new": 32, "train_steps": 120, "eval_prompts": 32}
FULL = {"prompts": 300, "max_new": 48, "train_steps": 200, "eval_prompts": 48}


def demo_multimodal(workdir: Path, *, quick: bool, seed: int, threads: int) -> None:
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.drafter.tiny_vlm import write_answered_conversations, write_tiny_images, write_tiny_vlm
    from draftdeck.tokenize.job import TokenizeParams

    size = QUICK if quick else FULL
    say = start_demo(workdir, threads)
    target = write_tiny_vlm(workdir / "world" / "target", seed=seed)
    pictures = write_tiny_images(workdir / "world" / "pictures", n=8, seed=seed)
    say(f"world ready: a tiny random Qwen3.5-style VLM ({target}), {len(pictures)} pictures")
    answers = workdir / "answers.jsonl"
    shapes = write_answered_conversations(target, pictures, size["prompts"], answers, max_new=size["max_new"],
                                          seed=seed)  # fmt: skip
    say(f"the VLM answered {size['prompts']} prompts: " + ", ".join(f"{n} {k}" for k, n in shapes.items()))
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
