# ruff: noqa: E402 - imports follow the sys.path fix
"""Every drafter kind on the demo world, on this CPU: the same data, the same steps, the same training time.

    python benchmarks/drafters.py [--quick] [--workdir DIR] [--kinds dflash,eagle3,dflash2,dspark,peagle,mtp]

Steps, as a user runs them: build the demo world (its target, seed 0), answer its prompts with the
target (`regenerate --local`, greedy) and tokenize them; train each kind exactly as `draftdeck demo
--drafter KIND` does (1 layer, 7 drafts a step: DFlash and DFlash2 blocks of 8, DSpark blocks of 7
drafting from the anchor, EAGLE-3 chains of 7) for the same steps; then each kind again for the steps
that take DFlash's training time (from its own s/step); evaluate every checkpoint with real speculative
decoding on the same held-out prompts, greedy and sampled at T = 1, DSpark also with its blocks stopped
by its confidence head. One table, one run: training s/step and time, peak memory, the held-out walked
tau judged by the target (its own answers), real tau greedy and at T = 1, the walk's gap to real
decoding, and speculative / target-only tokens/s. Every tau counts the bonus token (vLLM's counters).

The world's target is the demo's Qwen3 unless a chosen kind needs another (MTP reads the target's own
MTP layer: the demo's Qwen3.5 hybrid has one): then every kind trains against that one target, so the
rows stay comparable. MTP's "untrained" figure is its untouched head (the target's MTP layer as
shipped), its row the same layer fine-tuned.
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

import multiprocessing  # after the sys.path fix: it imports `tokenize`, which benchmarks/ shadows
from concurrent.futures import ProcessPoolExecutor

import torch

from app.cli.demo import demo_train_params
from benchmarks._smoke import smoke_world
from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.kinds import NAMES, get_kind
from draftdeck.drafter.tiny import build_tiny_demo
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.run import run_regenerate
from draftdeck.tokenize.job import TokenizeParams
from draftdeck.tokenize.job import run as run_tokenize

FULL = {"target_steps": 600, "prompts": 1000, "max_new": 128, "train_steps": 400, "eval_prompts": 100}
QUICK = {"target_steps": 200, "prompts": 160, "max_new": 96, "train_steps": 100, "eval_prompts": 32}
# The tests' check that the script runs (both budgets, both evals, the confidence rows) on the small
# world of benchmarks/_smoke.py, measuring nothing; 40 prompts keep held-out rows (heldout_fraction 0.1).
SMOKE = {"prompts": 40, "max_new": 16, "train_steps": 2, "eval_prompts": 2}
# DFlash (the clock) and DSpark (confidence-scheduled rows): the other kinds take the same path here,
# and EAGLE-3's training alone costs more than the rest of the smoke (their own tests cover them)
SMOKE_KINDS = "dflash,dspark"
REFERENCE = "dflash"  # the kind whose training time the others get
THRESHOLD = 0.5  # DSpark's confidence cut: a block stops where the product of its confidences falls below


SERIES = ("train/loss", "train/step_seconds", "train/peak_memory_mib", "heldout/target_walked/accepted",
          "heldout/target_walked/steps")  # fmt: skip


class Recorded:
    """What a training run reported, as the rows read it (`series`)."""

    def __init__(self, series: dict[str, list[tuple[int, float]]]):
        self._series = series

    def series(self, name: str) -> list[tuple[int, float]]:
        return self._series[name]


def _last(ctx: Recorded, name: str) -> float:
    return ctx.series(name)[-1][1]


def _train_seconds(ctx: Recorded) -> float:
    """Seconds spent in training steps (held-out passes and checkpoints apart): each logged window's
    mean step time times its steps."""
    points = ctx.series("train/step_seconds")
    total, prev = 0.0, 0
    for step, seconds in points:
        total += seconds * (step - prev)
        prev = step
    return total


def _train_alone(
    kind: str, dataset: Path, target: Path, run: Path, steps: int, ctx_dir: Path, threads: int = 2
) -> tuple:
    """One run in a process of its own: its peak memory is its own, not what earlier runs left behind."""
    torch.set_num_threads(threads)
    ctx = LocalContext(ctx_dir)
    started = time.perf_counter()
    run_train(demo_train_params(kind, [str(dataset)], str(target), run, steps, seed=0), ctx)
    return {name: ctx.series(name) for name in SERIES}, time.perf_counter() - started


def train(
    root: Path, kind: str, dataset: Path, target: Path, steps: int, threads: int = 2
) -> tuple[Path, Recorded, float]:
    run = root / f"run-{kind}-{steps}"
    shutil.rmtree(run, ignore_errors=True)  # trained afresh, never resumed
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        series, wall = pool.submit(
            _train_alone, kind, dataset, target, run, steps, root / "ctx" / run.name, threads
        ).result()
    return run, Recorded(series), wall


def evaluate(root: Path, run: Path, dataset: Path, target: Path, size: dict, **mode: object) -> dict:
    name = f"eval-{run.name}-{mode.get('mode', 'greedy')}"
    report = run_eval(EvalParams(
        inputs=[str(dataset)], target=str(target), checkpoint=str(run), out=str(root / name),
        max_new_tokens=size["max_new"], max_prompts=size["eval_prompts"], heldout_fraction=0.1, seed=0,
        **mode,
    ), LocalContext(root / "ctx" / name))  # fmt: skip
    return report.extra["eval"]


def forwards_per_step(kind: str, block: int) -> int:
    """Drafter forwards per verify step, by construction: a chain drafted token by token runs one per
    draft; a block (DFlash family) or P-EAGLE's parallel chain runs one."""
    return block - 1 if get_kind(kind).chain and kind != "peagle" else 1


def row(kind: str, budget: str, ctx: Recorded, wall: float, greedy: dict, sampled: dict) -> dict:
    steps = ctx.series("train/loss")[-1][0]
    drafter = greedy["methods"]["drafter"]
    demo = demo_train_params(kind, ["-"], "-", Path("-"), 1, 0)
    block = get_kind(kind).slots(demo.model_dump())
    return {
        "drafter": get_kind(kind).drafting(block),
        "forwards": forwards_per_step(kind, block),
        "tok_s": drafter.get("tokens_per_s"),
        "budget": budget,
        "steps": steps,
        "s_step": _train_seconds(ctx) / steps,
        "train_s": _train_seconds(ctx),
        "wall_s": wall,
        "peak": max(v for _, v in ctx.series("train/peak_memory_mib")),
        "walked": 1
        + _last(ctx, "heldout/target_walked/accepted") / _last(ctx, "heldout/target_walked/steps"),
        "real": drafter["tau_incl_bonus_pooled"],
        "sampled": sampled["methods"]["drafter"]["tau_incl_bonus_pooled"],
        "eval_walked": greedy["walked"]["tau_incl_bonus"],
        "speedup": drafter.get("speedup_vs_target_only"),
        "untrained": greedy["methods"]["untrained"]["tau_incl_bonus_pooled"],
        "lookup": greedy["methods"]["prompt_lookup"]["tau_incl_bonus_pooled"],
        "lossless": greedy["lossless"],
        "scheduled": greedy["methods"].get("drafter_scheduled"),
        "scheduled_sampled": sampled["methods"].get("drafter_scheduled"),
    }


def _line(r: dict) -> str:
    speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
    tok_s = "-" if r["tok_s"] is None else f"{r['tok_s']:.0f}"
    return (
        f"| {r['drafter']} | {r['forwards']} | {r['budget']} | {r['steps']} | {r['s_step']:.3f}"
        f" | {r['train_s']:.0f}"
        f" | {r['wall_s']:.0f} | {r['peak']:.0f} | {r['walked']:.3f} | {r['real']:.3f} | {r['sampled']:.3f}"
        f" | {r['walked'] / r['real'] - 1:+.1%} | {r['eval_walked'] / r['real'] - 1:+.1%} | {tok_s} | {speed}"
        f" | {r['untrained']:.3f} | {r['lookup']:.3f} | {r['lossless']} |"
    )


def _scheduled(r: dict) -> str | None:
    """DSpark's confidence-scheduled decoding beside its full blocks (the same checkpoint)."""
    s, t = r["scheduled"], r["scheduled_sampled"]
    if s is None:
        return None
    c = s["counts"]
    return (
        f"| {r['drafter']}, stopped by confidence < {THRESHOLD} | 1 | {r['budget']} | {r['steps']} | | | | |"
        f" | {s['tau_incl_bonus_pooled']:.3f} | {t['tau_incl_bonus_pooled']:.3f} | | | |"
        f" {s.get('speedup_vs_target_only', float('nan')):.2f}x ({c['proposed'] / c['verify_steps']:.2f}"
        f" drafts a step) | | | {s.get('lossless')} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick demo's world and run")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the world and runs here")
    ap.add_argument(
        "--kinds",
        default="",
        help=f"the kinds compared (DFlash always: the clock; default {','.join(NAMES)})",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    chosen = args.kinds or (SMOKE_KINDS if args.smoke else ",".join(NAMES))
    kinds = [REFERENCE] + [k for k in chosen.split(",") if k and k != REFERENCE]
    size = SMOKE if args.smoke else QUICK if args.quick else FULL
    # the smoke runs beside other tests: one thread (two threads on two busy cores ran 4x slower)
    threads = 1 if args.smoke else 2
    torch.set_num_threads(threads)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        needed = {get_kind(k).demo_target for k in kinds} - {None}
        if len(needed) > 1:
            ap.error(
                f"the kinds need different targets ({', '.join(sorted(map(str, needed)))}): compare apart"
            )
        arch = str(needed.pop()) if needed else "qwen3"
        if args.smoke:
            world = smoke_world(root / "world", n_prompts=size["prompts"])
        else:
            world = build_tiny_demo(
                root / "world", target_steps=size["target_steps"], n_prompts=size["prompts"], arch=arch
            )
        target, answers, dataset = world.target_dir, root / "answers.jsonl", root / "dataset"
        if not dataset.exists():
            run_regenerate(RegenerateParams(
                inputs=[str(world.prompts)], out=str(answers), local=str(target), device="cpu",
                max_tokens=size["max_new"], temperature=0.0, concurrency=16, reasoning=False,
                keep_cut_off=True,
            ), LocalContext(root / "ctx" / "regen"))  # fmt: skip
            run_tokenize(TokenizeParams(inputs=[str(answers)], tokenizer=str(target), out=str(dataset)),
                         LocalContext(root / "ctx" / "tok"))  # fmt: skip

        def measured(kind: str, steps: int, budget: str) -> dict:
            run, ctx, wall = train(root, kind, dataset, target, steps, threads)
            confident = get_kind(kind).confidence  # the demo's drafters have their kind's default heads
            threshold = {"confidence_threshold": THRESHOLD} if confident else {}
            greedy = evaluate(root, run, dataset, target, size, **threshold)
            sampled = evaluate(root, run, dataset, target, size, mode="sampled", temperature=1.0, **threshold)
            return row(kind, budget, ctx, wall, greedy, sampled)

        same_steps = {k: measured(k, size["train_steps"], "same steps") for k in kinds}
        clock = same_steps[REFERENCE]["train_s"]
        same_time: dict[str, dict] = {}
        close: dict[str, int] = {}
        for k in kinds[1:]:  # as many steps as take DFlash's training time, at the kind's own s/step
            steps = max(1, round(clock / same_steps[k]["s_step"]))
            if abs(steps - size["train_steps"]) > 0.05 * size["train_steps"]:
                same_time[k] = measured(k, steps, "DFlash's time")
            else:  # within 5 % of the same steps: that row is its same-time row too
                close[k] = steps
    print(
        f"\nDrafter kinds on the demo world (its {arch} target, {size['prompts']} prompts,"
        f" {size['eval_prompts']} eval prompts),"
        f" {size['train_steps']} steps each, then each for DFlash's training time; 1 layer, batch 32,"
        f" 7 drafts a step; every tau incl. bonus ({time.monotonic() - started:.0f} s)\n"
    )
    head = ("drafter", "drafter forwards / verify step", "budget", "steps", "train s/step", "train s",
            "run wall s", "peak MiB",
            "walked tau (target)", "real tau greedy", "real tau T=1", "walked/real", "eval walk = real",
            "spec tok/s", "spec/target tok/s", "untrained tau", "prompt lookup tau", "lossless")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for k in kinds:
        for r in (same_steps[k], same_time.get(k)):
            if r is None:
                continue
            print(_line(r))
            if (scheduled := _scheduled(r)) is not None:
                print(scheduled)
    for k, steps in close.items():
        print(
            f"({k} at DFlash's training time: {steps} steps, within 5 % of {size['train_steps']}:"
            " its same-steps row)"
        )
    d = same_steps[REFERENCE]
    print("\nAgainst DFlash at the same steps (real tau greedy, T = 1; train s/step; peak memory):")
    for k in kinds[1:]:
        r = same_steps[k]
        print(
            f"  {k}: tau {r['real'] / d['real']:.2f}x, {r['sampled'] / d['sampled']:.2f}x;"
            f" s/step {r['s_step'] / d['s_step']:.2f}x; peak {r['peak'] / d['peak']:.2f}x"
        )
    print(
        "\nwalked tau (target): the last held-out pass, walked over the target's own greedy answers to"
        " held-out prompts. walked/real: against the eval's real greedy tau on every eval prompt; eval walk ="
        " real: the eval's walk over the outputs it decoded, against its real decoding of them (0 % when the"
        " walk is that decoding). DSpark drafts from the anchor: its blocks of 7 draft 7 tokens, as DFlash's"
        " blocks of 8. Peak MiB: on the CPU the training process's peak RSS (each run in a process of its"
        " own). Stopped by confidence: the same checkpoint, each block cut where the product of its"
        " confidence head's probabilities falls below the threshold (vLLM PR #47808)."
    )


if __name__ == "__main__":
    main()
