# ruff: noqa: E402 - imports follow the sys.path fix
"""DFlash beside EAGLE-3 on the demo world, on this CPU: the same data, the same training wall time.

    python benchmarks/drafters.py [--quick] [--workdir DIR]

Steps, as a user runs them: build the demo world (its target, seed 0), answer its prompts with the
target (`regenerate --local`, greedy) and tokenize them; train a DFlash drafter exactly as `draftdeck
demo` does; time a few EAGLE-3 steps (`draftdeck demo --drafter eagle3`'s settings: chains of 7, as
many drafts as DFlash's blocks of 8) and train it for the steps that take DFlash's training time;
then as many steps as DFlash (the demo's EAGLE-3 run); evaluate each checkpoint with real speculative
decoding on the same held-out prompts. One table, one
run: training s/step and time, peak memory, the held-out walked tau judged by the target (its own
answers), real tau, the walk's gap to real decoding on the same outputs, and speculative / target-only
tokens/s. Every tau counts the bonus token (vLLM's counters).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from app.cli.demo import demo_train_params
from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.tiny import build_tiny_demo
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.run import run_regenerate
from draftdeck.tokenize.job import TokenizeParams
from draftdeck.tokenize.job import run as run_tokenize

FULL = {"target_steps": 600, "prompts": 1000, "max_new": 128, "train_steps": 400, "eval_prompts": 100}
QUICK = {"target_steps": 200, "prompts": 160, "max_new": 96, "train_steps": 100, "eval_prompts": 32}
PROBE_STEPS = 10  # EAGLE-3 steps timed to match DFlash's training time: the second window of 5 (warm)


def _last(ctx: LocalContext, name: str) -> float:
    return ctx.series(name)[-1][1]


def _train_seconds(ctx: LocalContext) -> float:
    """Seconds spent in training steps (held-out passes and checkpoints apart): each logged window's
    mean step time times its steps."""
    points = ctx.series("train/step_seconds")
    total, prev = 0.0, 0
    for step, seconds in points:
        total += seconds * (step - prev)
        prev = step
    return total


def train(root: Path, kind: str, dataset: Path, target: Path, steps: int) -> tuple[Path, LocalContext, float]:
    run = root / f"run-{kind}-{steps}"
    shutil.rmtree(run, ignore_errors=True)  # trained afresh, never resumed
    ctx = LocalContext(root / "ctx" / run.name)
    started = time.perf_counter()
    run_train(demo_train_params(kind, [str(dataset)], str(target), run, steps, seed=0), ctx)
    return run, ctx, time.perf_counter() - started


def evaluate(root: Path, run: Path, dataset: Path, target: Path, size: dict) -> dict:
    report = run_eval(EvalParams(
        inputs=[str(dataset)], target=str(target), checkpoint=str(run), out=str(root / f"eval-{run.name}"),
        max_new_tokens=size["max_new"], max_prompts=size["eval_prompts"], heldout_fraction=0.1, seed=0,
    ), LocalContext(root / "ctx" / f"eval-{run.name}"))  # fmt: skip
    return report.extra["eval"]


def row(kind: str, budget: str, ctx: LocalContext, wall: float, ev: dict) -> dict:
    steps = ctx.series("train/loss")[-1][0]
    drafter = ev["methods"]["drafter"]
    return {
        "drafter": "DFlash, blocks of 8" if kind == "dflash" else "EAGLE-3, chains of 7",
        "budget": budget,
        "steps": steps,
        "s_step": _train_seconds(ctx) / steps,
        "train_s": _train_seconds(ctx),
        "wall_s": wall,
        "peak": max(v for _, v in ctx.series("train/peak_memory_mib")),
        "walked": 1
        + _last(ctx, "heldout/target_walked/accepted") / _last(ctx, "heldout/target_walked/steps"),
        "real": drafter["tau_incl_bonus_pooled"],
        "eval_walked": ev["walked"]["tau_incl_bonus"],
        "speedup": drafter.get("speedup_vs_target_only"),
        "untrained": ev["methods"]["untrained"]["tau_incl_bonus_pooled"],
        "lookup": ev["methods"]["prompt_lookup"]["tau_incl_bonus_pooled"],
        "lossless": ev["lossless"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick demo's world and run")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the world and runs here")
    args = ap.parse_args()
    size = QUICK if args.quick else FULL
    torch.set_num_threads(2)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        world = build_tiny_demo(root / "world", target_steps=size["target_steps"], n_prompts=size["prompts"])
        target, answers, dataset = world.target_dir, root / "answers.jsonl", root / "dataset"
        if not dataset.exists():
            run_regenerate(RegenerateParams(
                inputs=[str(world.prompts)], out=str(answers), local=str(target), device="cpu",
                max_tokens=size["max_new"], temperature=0.0, concurrency=16, reasoning=False,
                keep_cut_off=True,
            ), LocalContext(root / "ctx" / "regen"))  # fmt: skip
            run_tokenize(TokenizeParams(inputs=[str(answers)], tokenizer=str(target), out=str(dataset)),
                         LocalContext(root / "ctx" / "tok"))  # fmt: skip
        rows = []
        d_run, d_ctx, d_wall = train(root, "dflash", dataset, target, size["train_steps"])
        _, probe, _ = train(root, "eagle3", dataset, target, PROBE_STEPS)
        e_steps = max(1, round(_train_seconds(d_ctx) / _last(probe, "train/step_seconds")))
        e_run, e_ctx, e_wall = train(root, "eagle3", dataset, target, e_steps)
        rows.append(row("dflash", "-", d_ctx, d_wall, evaluate(root, d_run, dataset, target, size)))
        rows.append(
            row("eagle3", "DFlash's time", e_ctx, e_wall, evaluate(root, e_run, dataset, target, size))
        )
        if e_steps != size["train_steps"]:  # and as many steps as DFlash: `draftdeck demo --drafter eagle3`
            s_run, s_ctx, s_wall = train(root, "eagle3", dataset, target, size["train_steps"])
            rows.append(
                row("eagle3", "DFlash's steps", s_ctx, s_wall, evaluate(root, s_run, dataset, target, size))
            )
    print(
        f"\nDFlash and EAGLE-3 on the demo world ({size['prompts']} prompts, {size['eval_prompts']} eval"
        f" prompts), the same training time (then EAGLE-3 for as many steps), 1 layer each, batch 32;"
        f" every tau incl. bonus"
        f" ({time.monotonic() - started:.0f} s)\n"
    )
    head = ("drafter", "budget", "steps", "train s/step", "train s", "run wall s", "peak MiB",
            "walked tau (target)",
            "real tau", "walked/real", "eval walk = real", "spec/target tok/s", "untrained tau",
            "prompt lookup tau", "lossless")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        print(
            f"| {r['drafter']} | {r['budget']} | {r['steps']} | {r['s_step']:.3f} | {r['train_s']:.0f}"
            f" | {r['wall_s']:.0f}"
            f" | {r['peak']:.0f} | {r['walked']:.3f} | {r['real']:.3f} | {r['walked'] / r['real'] - 1:+.1%}"
            f" | {r['eval_walked'] / r['real'] - 1:+.1%} | {speed} | {r['untrained']:.3f} | {r['lookup']:.3f}"
            f" | {r['lossless']} |"
        )
    d, e = rows[:2]
    print(
        f"\nEAGLE-3 / DFlash at the same training time: real tau {e['real'] / d['real']:.2f}x,"
        f" train s/step {e['s_step'] / d['s_step']:.2f}x,"
        f" peak memory {e['peak'] / d['peak']:.2f}x. walked tau (target): the last held-out pass, walked over"
        " the target's own greedy answers to held-out prompts. walked/real: against the eval's real tau on"
        " every eval prompt; eval walk = real: the eval's walk over the outputs it decoded, against its real"
        " decoding of them (0 % when the walk is that decoding)."
    )


if __name__ == "__main__":
    main()
