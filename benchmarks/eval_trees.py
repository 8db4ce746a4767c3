# ruff: noqa: E402 - imports follow the sys.path fix
"""Chain vs tree verification on the tiny demo world, on this CPU: a DFlash and an EAGLE-3 drafter
trained on the same answers, each evaluated by the eval job with chains (one block or chain of 7
drafts a step) and with draft trees of 8, 16 and 32 nodes, on the same held-out prompts.

    python benchmarks/eval_trees.py [--target-steps 300] [--train-prompts 300] [--train-steps 150]
                                    [--eval-prompts 20] [--max-new 64] [--topk 4] [--workdir DIR]

Columns: tau incl. bonus (pooled), the tokens each verify forward ran (anchor + drafts or nodes: the
target's work per step), tokens/s of speculative decoding and of the target alone, and whether the
greedy output equalled plain greedy decoding on every prompt. Then each run's sweep (`draftdeck sweep`,
grid tree_budget=8,16,32 x tree_topk=2,4 on the same prompts): its Pareto points of tau and tokens/s
(per CPU second here), the recommended one and the SGLang and vLLM flags for it. On a CPU the target
pays for every verified token, so tokens/s falls as the tree grows; a GPU verifies a tree of a few
dozen nodes for about the price of one token, so there tau and verified tokens per step carry over and
tokens/s does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.eval_decode import answered_dataset
from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.sweep import run_sweep
from draftdeck.drafter.eval.sweep_front import Point
from draftdeck.drafter.eval.sweep_params import SweepParams
from draftdeck.drafter.tiny import build_tiny_demo, write_prompts
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext

BUDGETS = (0, 8, 16, 32)  # 0: the chain
SWEEP_GRID = ["tree_budget=8,16,32", "tree_topk=2,4"]  # a tree's top-k needs a budget: chains are above


def trained(kind: str, target: Path, data: Path, out: Path, steps: int) -> Path:
    """A 1-layer drafter of `kind` trained `steps` steps, 7 drafts a step (the demo's options)."""
    own: dict[str, Any] = {"block_size": 8, "anchors_per_seq": 8} if kind == "dflash" else {"ttt_steps": 7}
    train(
        TrainParams(
            inputs=[str(data)],
            target=str(target),
            out=str(out),
            drafter=kind,
            layers=1,
            lr=3e-3,
            max_steps=steps,
            batch_size=32,
            checkpoint_every=steps,
            eval_every=steps,
            heldout_fraction=0.05,
            device="cpu",
            **own,
        ),
        LocalContext(out.parent / f"{out.name}-job"),
    )
    return out


def evaluated(prompts: Path, target: Path, run: Path, out: Path, args: Any, budget: int) -> dict[str, Any]:
    tree = {"tree_budget": budget, "tree_topk": args.topk} if budget else {}
    ctx = LocalContext(out)
    params = EvalParams(inputs=[str(prompts)], target=str(target), checkpoint=str(run),
                        max_new_tokens=args.max_new, max_prompts=args.eval_prompts, **tree)  # fmt: skip
    run_eval(params, ctx)
    ev: dict[str, Any] = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    return ev


def swept(prompts: Path, target: Path, run: Path, out: Path, args: Any) -> dict[str, Any]:
    """The run's sweep over SWEEP_GRID (sweep.json's `sweep`)."""
    params = SweepParams.model_validate({
        "inputs": [str(run)], "target": str(target), "prompts": [str(prompts)], "grid": SWEEP_GRID,
        "max_new_tokens": args.max_new, "max_prompts": args.eval_prompts, "out": str(out),
    })  # fmt: skip
    sweep: dict[str, Any] = run_sweep(params, LocalContext(out.parent / f"{out.name}-job")).extra["sweep"]
    return sweep


def print_pareto(sweeps: dict[str, dict[str, Any]]) -> None:
    print()
    print(f"each run's sweep ({' x '.join(SWEEP_GRID)}): its Pareto points of tau and tokens/s, tokens"
          " per CPU second; * recommended (the fastest lossless point)")  # fmt: skip
    print()
    print("| drafter | tree budget | top-k | tau incl. bonus | verified tokens / step | tokens/s "
          "| target-only tokens/s | speed-up | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, sweep in sweeps.items():
        points = {p["point"]: Point.from_json(p) for p in sweep["points"]}
        for n in sweep["pareto"]:
            p, mark = points[n], "*" if n == sweep["recommended"] else ""
            print(
                f"| {kind}{mark} | {p.params['tree_budget']} | {p.params['tree_topk']} | {p.tau or 0:.2f} | "
                f"{p.verified_per_step or 0:.1f} | {p.tokens_per_s or 0:.0f} | "
                f"{p.target_tokens_per_s or 0:.0f} | {p.speedup or 0:.2f}x | {p.lossless} |"
            )
    for kind, sweep in sweeps.items():
        for reading in sweep["serving"]:
            print(f"{kind} recommended, {reading['server']}: {reading['flags']}")
            for problem in reading["problems"]:
                print(f"    ({problem})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--train-prompts", type=int, default=300)
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--eval-prompts", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # 80 rows keep held-out ones (heldout_fraction 0.05)
        args.target_steps, args.train_prompts, args.train_steps = 5, 80, 2
        args.eval_prompts, args.max_new = 2, 8
    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dd-trees-bench-"))
    t0 = time.perf_counter()
    world = build_tiny_demo(work, target_steps=args.target_steps, n_prompts=args.eval_prompts)
    train_prompts = write_prompts(work / "train_prompts.jsonl", args.train_prompts, seed=99)
    data, gen_tokens = answered_dataset(world.target_dir, train_prompts, work / "data", args.max_new)
    runs = {kind: trained(kind, world.target_dir, data, work / f"run-{kind}", args.train_steps)
            for kind in ("dflash", "eagle3")}  # fmt: skip
    t_train = time.perf_counter() - t0
    rows = []
    for kind, run in runs.items():
        for budget in BUDGETS:
            ev = evaluated(world.prompts, world.target_dir, run, work / f"eval-{kind}-{budget}", args, budget)
            rows.append((kind, budget, ev))
    sweeps = {kind: swept(world.prompts, world.target_dir, run, work / f"sweep-{kind}", args)
              for kind, run in runs.items()}  # fmt: skip
    t_eval = time.perf_counter() - t0 - t_train
    print(
        f"tiny demo world: target trained {args.target_steps} steps; {args.train_prompts} answered prompts "
        f"({gen_tokens} tokens); 1-layer drafters trained {args.train_steps} steps, 7 drafts a step; eval "
        f"{rows[0][2]['prompts']} held-out prompts x {args.max_new} new tokens, greedy, tree top-k "
        f"{args.topk}, depth 7, 1 torch thread, this CPU"
    )
    print(f"time: world, answers and training {t_train:.0f} s, evals and sweeps {t_eval:.0f} s")
    print()
    print("| drafter | verify | tau incl. bonus | verified tokens / step | tokens/s | target-only tokens/s "
          "| speed-up | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for kind, budget, ev in rows:
        m, base = ev["methods"]["drafter"], ev["target_only"]["tokens_per_s"]
        verify = f"tree of {budget}" if budget else f"chain (B = {ev['block_size']})"
        print(
            f"| {kind} | {verify} | {m['tau_incl_bonus_pooled']:.2f} | {m['verified_per_step']:.1f} | "
            f"{m['tokens_per_s']:.0f} | {base:.0f} | {m['tokens_per_s'] / base:.2f}x | {m['lossless']} |"
        )

    print_pareto(sweeps)


if __name__ == "__main__":
    main()
