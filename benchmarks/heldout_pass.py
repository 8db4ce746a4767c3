# ruff: noqa: E402 - imports follow the sys.path fix
"""The held-out pass at real lengths against a training step on the same rows.

    python benchmarks/heldout_pass.py [--rows 8] [--seq 1024] [--anchors 128] [--hidden 256] [--reps 2]
    python benchmarks/heldout_pass.py --seq 4096 --anchors 512 --hidden 1024  # issue 33's shape (long)

One table, measured in one run (about 11 minutes on 2 cores), on a batch of `--rows` rows (the
trainer's held-out batch is 8) of `--seq` tokens (an eighth of each a
prompt, the rest one assistant span) with Qwen3.6's vocabulary size (248,320), a random-init Qwen3
target (2 layers) and a 2-layer drafter, B = 16:

- a training step: the target's context, `dflash_backward` over `--anchors` sampled anchors (the
  trainer's objective, anchors per forward as it defaults), the AdamW step;
- the former held-out pass: a block drafted at every eligible anchor, every slot through the head
  (the loss, per-slot counts and anchor-mean over all of them), then the walk over those runs;
- the held-out pass now (`draftdeck.drafter.train.walked.heldout_pass`, as the trainer calls it):
  every slot through the head at a seeded sample of `--heldout-anchors` anchors per row (loss,
  per-slot counts, expected acceptance, anchor-mean; the trainer's `heldout_anchors`), slot 1 alone
  at the other anchors, and the whole block again only where the walk reaches an anchor whose slot 1
  was right.

Target agreement is off in both passes (it reads the target's head once per position either way).
Each row's answer is planted from the drafter's own drafts (at each anchor the walk visits, a random
number of the block's drafts, uniform over 0..`--max-run`, then a token it did not draft), so that
the walk accepts runs of every length and "the same tau" is a real check. Goal (issue 33): the
held-out pass over a row costs no more than one training step on it, with the same walked tau to the
last digit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

VOCAB = 248_320  # Qwen3.6's
BLOCK = 16
GAMMA = 7.0


def _world(
    rows: int, seq: int, hidden: int, max_run: int, seed: int = 0
) -> tuple[Any, Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
    from draftdeck.drafter.model.config import DrafterConfig
    from draftdeck.drafter.model.target import Target

    torch.manual_seed(seed)
    config = Qwen3Config(
        hidden_size=hidden, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
        head_dim=hidden // 8, intermediate_size=3 * hidden, vocab_size=VOCAB,
        max_position_embeddings=max(seq * 2, 4096), tie_word_embeddings=False,
    )  # fmt: skip
    target = Target(Qwen3ForCausalLM(config).eval())
    cfg = DrafterConfig.from_target(
        target.config, layers=2, block_size=BLOCK, target_layer_ids=[0, 1], mask_token_id=VOCAB - 1
    )
    drafter = DFlashDrafter(cfg).eval()
    ids = torch.randint(0, VOCAB - 1, (rows, seq))
    lm = torch.zeros_like(ids)
    lm[:, seq // 8 :] = 1
    att = torch.ones_like(ids)
    rng = np.random.default_rng(seed)
    for r in range(rows):
        ids[r : r + 1] = _plant(drafter, target, ids[r : r + 1].clone(), seq // 8, seq - 1, max_run, rng)
    return drafter, target, ids, att, lm


@torch.no_grad()
def _plant(
    drafter: Any, target: Any, ids: torch.Tensor, g: int, e: int, max_run: int, rng: np.random.Generator
) -> torch.Tensor:
    """`ids` (1, T) with the answer g..e rewritten so that the walk from g accepts a random run at every
    step: at each visited anchor p, the first k of the block's drafts (k uniform over 0..max_run),
    then a token not drafted."""
    p = g
    while p < e:
        _, ctx = target.context_features(ids[:, :p], None, drafter.target_layer_ids)
        block = torch.tensor([[int(ids[0, p])] + [drafter.mask_token_id] * (BLOCK - 1)])
        h = drafter(
            position_ids=torch.arange(p + BLOCK)[None], noise_embedding=target.embed(block), target_hidden=ctx
        )
        drafts = target.lm_head(h[0, 1:]).argmax(-1).tolist()
        k = min(int(rng.integers(0, max_run + 1)), e - p)
        ids[0, p + 1 : p + 1 + k] = torch.tensor(drafts[:k], dtype=ids.dtype)
        if k < BLOCK - 1 and p + 1 + k <= e:  # the first draft the target rejects
            ids[0, p + 1 + k] = (drafts[k] + 1 + int(rng.integers(0, VOCAB - 2))) % (VOCAB - 1)
        p += 1 + k
    return ids


def _train_step(
    drafter: Any, target: Any, batch: tuple[torch.Tensor, ...], anchors: int
) -> Callable[[], None]:
    from draftdeck.drafter.kinds.dflash.objective import dflash_backward, label_weight_sum, sample_anchors
    from draftdeck.drafter.train.params import TrainParams

    ids, att, lm = batch
    a, v = sample_anchors(lm, anchors, torch.Generator().manual_seed(0))  # `anchors` per row
    norm = label_weight_sum(lm, a, v, BLOCK, GAMMA)
    opt = torch.optim.AdamW(drafter.parameters(), lr=0.0)  # lr 0: the drafter stays as planted
    per = TrainParams.model_fields["anchors_per_forward"].default

    def step() -> None:
        drafter.train()
        with torch.no_grad():
            _, ctx = target.context_features(ids, att, drafter.target_layer_ids)
        dflash_backward(
            drafter, target.embedding, target.lm_head, ctx, ids, lm, att, a, v, GAMMA, norm,
            anchors_per_forward=per,
        )  # fmt: skip
        opt.step()
        opt.zero_grad(set_to_none=True)
        drafter.eval()

    return step


@torch.no_grad()
def _every_anchor_pass(drafter: Any, target: Any, batch: tuple[torch.Tensor, ...]) -> Any:
    """The held-out pass before issue 33: every eligible anchor drafted, every slot through the head."""
    from draftdeck.drafter.kinds.dflash.memory import HELDOUT_ANCHORS_PER_CHUNK as CHUNK
    from draftdeck.drafter.kinds.dflash.objective import all_anchors, block_loss, build_blocks, drafter_hidden
    from draftdeck.drafter.train.counts import Counts
    from draftdeck.drafter.train.walked import walk

    ids, att, lm = batch
    tf = target.teacher_forced(ids, att, drafter.target_layer_ids)
    anchors, valid = all_anchors(lm)
    runs = torch.full(ids.shape, -1, dtype=torch.long)
    total = Counts(BLOCK)
    for i in range(0, anchors.shape[1], CHUNK):
        a, v = anchors[:, i : i + CHUNK], valid[:, i : i + CHUNK]
        blocks = build_blocks(ids, lm, att, a, v, BLOCK, drafter.mask_token_id)
        hidden = drafter_hidden(drafter, target.embedding, tf.context, blocks)
        res = block_loss(target.lm_head, hidden, blocks, GAMMA, teacher=tf.last_hidden)
        total = total + res.counts
        rows = torch.arange(a.shape[0])[:, None].expand_as(a)
        runs[rows[v], a[v]] = res.runs[v]
    return total + walk(runs.numpy(), lm.numpy(), BLOCK)


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--rows", type=int, default=8, help="rows of the batch (a training step's, a held-out batch)"
    )
    ap.add_argument("--seq", type=int, default=1024, help="tokens of each row")
    ap.add_argument("--anchors", type=int, default=128, help="anchors per row: training's, the pass's sample")
    ap.add_argument("--hidden", type=int, default=256, help="the target's and the drafter's width")
    ap.add_argument(
        "--heldout-anchors", type=int, default=None,
        help="the pass's sample per row (default: anchors / 8, as the trainer's defaults, 64 of 512)",
    )  # fmt: skip
    ap.add_argument("--max-run", type=int, default=BLOCK - 1, help="the longest planted accepted run")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions of each (the median is shown)")
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # short rows, a narrow model: the real vocabulary (the head's cost) stays
        args.rows, args.seq, args.anchors, args.hidden, args.reps = 1, 32, 8, 64, 1
    sample = args.heldout_anchors or max(1, args.anchors // 8)

    from draftdeck.drafter.kinds.dflash.walked import heldout_pass

    t0 = time.perf_counter()
    drafter, target, ids, att, lm = _world(args.rows, args.seq, args.hidden, args.max_run)
    print(
        f"world built, the answers planted from the drafter's drafts: {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    batch = (ids, att, lm)
    step = _train_step(drafter, target, batch, args.anchors)
    step()  # warm-up
    s_step, _ = _timed(step, args.reps)
    s_old, old = _timed(lambda: _every_anchor_pass(drafter, target, batch), 1)  # slow: once
    s_new, new = _timed(
        lambda: heldout_pass(drafter, target, [batch], GAMMA, judge=False, anchors_per_row=sample)[0],
        args.reps,
    )
    print(
        f"\n{args.rows} rows of {args.seq:,} tokens ({int(lm.sum()):,} in the answers), vocabulary {VOCAB:,},"
        f" hidden {args.hidden:,}, B = {BLOCK}, {args.anchors} anchors per row; median of {args.reps} (the"
        " pass before: once); tau incl. bonus\n"
    )
    print("| what | s | vs a training step | walked tau | verify steps | loss |")
    print("|------|---|--------------------|------------|--------------|------|")
    print(f"| a training step ({args.anchors} anchors per row) | {s_step:.2f} | 1.00x | | | |")
    for name, s, c in (
        ("held-out pass, every slot at every anchor (before)", s_old, old),
        (f"held-out pass, every slot at {sample} anchors per row, then the walk's (now)", s_new, new),
    ):
        print(
            f"| {name} | {s:.2f} | {s / s_step:.2f}x | {c.tau_walked:.6f} | {c.walked_steps:,}"
            f" | {c.loss:.4f} |"
        )
    same = (old.walked_accepted, old.walked_steps, old.walked_hist) == (
        new.walked_accepted,
        new.walked_steps,
        new.walked_hist,
    )
    print(
        f"\nheld-out pass now / a training step: {s_new / s_step:.2f} (goal <= 1.00);"
        f" before: {s_old / s_step:.2f};"
        f" now vs before {s_old / s_new:.1f}x faster; the same walk (accepted, steps, histogram): {same}"
    )


if __name__ == "__main__":
    main()
