# ruff: noqa: E402 - imports follow the sys.path fix
"""Speculative decoding on the tiny demo world, on this CPU: tau incl. bonus and tokens/s of a
trained drafter, the untrained drafter and prompt lookup against target-only decoding, measured in
one run (every method decodes the same prompts with the same target, interleaved per prompt).

    python benchmarks/eval_decode.py [--target-steps 300] [--train-prompts 300] [--train-steps 150]
                                     [--eval-prompts 30] [--max-new 64] [--block 8] [--workdir DIR]
    python benchmarks/eval_decode.py --rollback [--reps 3]

--rollback measures what undoing rejected drafts costs where the cache cannot simply be cut: tiny
random targets of one shape, every architecture of tiny_targets (Qwen3 for reference; hybrid Qwen3.5
and Qwen3-Next, whose Gated DeltaNet layers keep their state after every verified position; Mistral,
Gemma 3 and gpt-oss past their sliding window; the rest only cropped), each decoding the same prompt
plainly and speculatively with drafts of its own greedy output in which every third token is wrong;
the speed-up of each is divided by Qwen3's ("vs Qwen3's"), and the tokens run twice to roll a state
back ("replayed", 0 where states are selected) are shown per output token.

Steps: build the tiny world (BPE 2,048, Qwen3 128 x 4 trained for --target-steps); the target
answers --train-prompts demo prompts greedily (its own output, as regeneration would give); those
rows become a DraftDeck dataset; the real trainer trains a 1-layer drafter on it (context from all
4 target layers); the eval job decodes --eval-prompts held-out demo prompts. Prints one table.
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

import numpy as np
import torch

from draftdeck.chat.render import tokenizer_fingerprint
from draftdeck.drafter.eval.evaluate import read_prompts, run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import (
    ReferenceDrafts,
    TargetRunner,
    generate_plain,
    generate_speculative,
)
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny import build_tiny_demo, write_prompts
from draftdeck.drafter.tiny_targets import ARCHITECTURES, tiny_causal_lm
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from draftdeck.shards.store import ShardRow, ShardWriter, write_pretokenized_metadata


def answered_dataset(target_dir: Path, prompts: Path, out: Path, max_new: int) -> tuple[Path, int]:
    """The target's greedy answers to `prompts` as a DraftDeck dataset (mask = the answer)."""
    target = Target.load(target_dir)
    runner = TargetRunner(target, [int(target.tokenizer.eos_token_id)])
    writer = ShardWriter(out, shard_rows=1000)
    tokens = 0
    for i, p in enumerate(read_prompts(prompts, target.tokenizer, 10**9, Report())):
        answer = generate_plain(runner, p.ids, max_new).output_ids
        ids = p.ids + answer
        mask = [0] * len(p.ids) + [1] * len(answer)
        writer.add(
            ShardRow(np.asarray(ids, np.int32), np.asarray(mask, np.uint8), str(prompts), i, -1, False)
        )
        tokens += len(answer)
    template = target.tokenizer.chat_template or ""
    fingerprint = tokenizer_fingerprint(target_dir, template, {})
    write_pretokenized_metadata(
        out, writer.close(), fingerprint=fingerprint, chat_template=template, tokenizer_path=target_dir
    )
    return out, tokens


def cache_kind(model: Any) -> str:
    """How the cache of `model` goes back to the accepted prefix after a rejection, from the layers its
    config declares (so every architecture tiny_targets lists gets a row)."""
    config = getattr(model.config, "text_config", model.config)
    types = set(getattr(config, "layer_types", None) or [])
    if "linear_attention" in types:
        return "recurrent: per-position states, selected"
    if "sliding_attention" in types:
        return "sliding + full: recorded, cut" if "full_attention" in types else "sliding: recorded, cut"
    if getattr(config, "sliding_window", None):  # no layer types: every layer slides (Mistral)
        return "sliding: recorded, cut"
    return "cropped"


def rollback_table(reps: int) -> None:
    """Speculative vs plain decoding per architecture, the same drafts pattern for all (see --rollback)."""
    prompt_len, new, block, window = 256, 96, 8, 64
    print(
        f"tiny random targets (hidden 256, 4 layers, vocabulary 4,096), prompt {prompt_len} + {new} new "
        f"tokens, B = {block}, sliding window {window}, every third draft token wrong, greedy, 1 torch "
        f"thread, best CPU time of {reps}"
    )
    print()
    print("| target | cache | plain tokens/CPU-s | speculative tokens/CPU-s | speed-up | vs Qwen3's "
          "| tau incl. bonus | replayed / output tokens | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    reference = None
    for arch in ARCHITECTURES:
        model = tiny_causal_lm(arch, vocab_size=4096, hidden=256, window=window)
        runner = TargetRunner(Target(model), [])
        prompt = torch.randint(3, 4096, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        want = generate_plain(runner, prompt, new).output_ids  # also warms this model up, untimed
        plains, specs = [], []
        for _ in range(reps):  # interleaved, so that a busy spell on a shared machine hits both
            plains.append(generate_plain(runner, prompt, new))
            specs.append(
                generate_speculative(runner, ReferenceDrafts(want, wrong_every=3), prompt, new, block)
            )
        plain_tps = new / min(g.cpu_seconds for g in plains)
        spec_tps = new / min(g.cpu_seconds for g in specs)
        speedup = spec_tps / plain_tps
        reference = reference or speedup  # ARCHITECTURES starts with Qwen3, whose cache is only cropped
        s = specs[0]
        print(
            f"| {arch} | {cache_kind(model)} | {plain_tps:.0f} | {spec_tps:.0f} | {speedup:.2f}x | "
            f"{speedup / reference:.2f} | {s.tau:.2f} | {s.replayed / new:.2f} | "
            f"{all(g.output_ids == want for g in plains + specs)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--train-prompts", type=int, default=300)
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--eval-prompts", type=int, default=30)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--rollback", action="store_true", help="only the table of rollback costs per architecture"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # 80 rows keep held-out ones (heldout_fraction 0.05); --rollback: 1 rep
        args.target_steps, args.train_prompts, args.train_steps = 5, 80, 2
        args.eval_prompts, args.max_new, args.reps = 2, 8, 1
    torch.set_num_threads(1)
    if args.rollback:
        rollback_table(args.reps)
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dd-eval-bench-"))
    t0 = time.perf_counter()
    world = build_tiny_demo(
        work, target_steps=args.target_steps, target_seconds=None, n_prompts=args.eval_prompts
    )
    t_world = time.perf_counter() - t0
    train_prompts = write_prompts(work / "train_prompts.jsonl", args.train_prompts, seed=99)
    data, gen_tokens = answered_dataset(world.target_dir, train_prompts, work / "data", args.max_new)
    t_data = time.perf_counter() - t0 - t_world
    run = work / "run"
    train(
        TrainParams(
            inputs=[str(data)],
            target=str(world.target_dir),
            out=str(run),
            block_size=args.block,
            layers=1,
            lr=3e-3,
            max_steps=args.train_steps,
            batch_size=32,
            anchors_per_seq=8,
            gamma=4.0,
            checkpoint_every=args.train_steps,
            eval_every=args.train_steps,
            heldout_fraction=0.05,
            device="cpu",
        ),
        LocalContext(work / "train-job"),
    )
    t_train = time.perf_counter() - t0 - t_world - t_data
    ctx = LocalContext(work / "eval-job")
    run_eval(
        EvalParams(
            inputs=world.prompts,
            target=world.target_dir,
            checkpoint=run,
            max_new_tokens=args.max_new,
            max_prompts=args.eval_prompts,
        ),
        ctx,
    )
    t_eval = time.perf_counter() - t0 - t_world - t_data - t_train
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    base = ev["target_only"]["tokens_per_s"]
    print(
        f"tiny demo world: target trained {args.target_steps} steps; {args.train_prompts} answered prompts "
        f"({gen_tokens} tokens); drafter {args.train_steps} steps; eval {ev['prompts']} held-out prompts x "
        f"{args.max_new} new tokens, B = {ev['block_size']}, greedy, 1 torch thread"
    )
    print(f"time: world {t_world:.0f} s, answers {t_data:.0f} s, train {t_train:.0f} s, eval {t_eval:.0f} s")
    print()
    print(
        "| method | tau incl. bonus (pooled) | tau incl. bonus (per response) | acceptance rate "
        "| tokens/s | vs target-only | tokens/CPU-s | vs target-only | lossless |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cpu_base = ev["target_only"]["tokens_per_cpu_s"]
    print(f"| target only | 1 | 1 | - | {base:.0f} | 1.00x | {cpu_base:.0f} | 1.00x | - |")
    for name, m in ev["methods"].items():
        print(
            f"| {name} | {m['tau_incl_bonus_pooled']:.2f} | {m['tau_incl_bonus_per_response_mean']:.2f} | "
            f"{m['acceptance_rate']:.1%} | {m['tokens_per_s']:.0f} | {m['tokens_per_s'] / base:.2f}x "
            f"| {m['tokens_per_cpu_s']:.0f} | {m['tokens_per_cpu_s'] / cpu_base:.2f}x | {m['lossless']} |"
        )
    w = ev["walked"]
    print(f"| walked (same checkpoint) | {w['tau_incl_bonus']:.2f} | - | - | - | - | - | - | - |")
    print()
    print(
        "per-position acceptance (drafter, vLLM's: drafts that accepted more than i tokens / drafts):",
        ", ".join(f"{p:.2f}" for p in ev["methods"]["drafter"]["per_pos_acceptance"]),
    )
    print(f"alerts: {ctx.alerts or 'none'}")


if __name__ == "__main__":
    main()
