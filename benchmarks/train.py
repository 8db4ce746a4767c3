# ruff: noqa: E402 - imports follow the sys.path fix
"""Drafter training throughput on the CPU: DraftDeck's whole step against bare PyTorch.

    python benchmarks/train.py [--steps 12] [--seq 256] [--batch 4] [--anchors 32] [--block 8]

One table, measured in one run, the two alternating step by step (the machine is shared, so
alternation keeps the comparison fair):

- DraftDeck: `Trainer.train_step` + the optimizer step, i.e. reading rows from the shards, seeded
  anchors, block building, the target forward, the drafter forward/backward over flattened
  blocks, the counts (and their reduction), clipping.
- bare PyTorch: the same modules on the same batch with everything prepared in advance: target
  forward (hidden states), fc + drafter forward under the same mask, LM head on the same counted
  slots, weighted CE, backward, clipping, optimizer step.

The goal (issue 9) is >= 0.8x: the plumbing costs at most 20 %. The target is a random-init Qwen3
(hidden 128 x 4 layers) with the project's small test BPE; the drafter has 1 layer, context from
all 4 target layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
import tempfile
import time

import torch

from benchmarks._train_world import build_world


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # both paths, a couple of steps on short rows
        args.steps, args.seq, args.batch, args.anchors = 2, 64, 2, 8
    torch.set_num_threads(args.threads)

    from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
    from draftdeck.drafter.kinds.dflash.objective import build_blocks, sample_anchors, slot_weights
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.trainer import Trainer
    from draftdeck.jobs.context import LocalContext

    root = Path(tempfile.mkdtemp(prefix="dd-bench-train-"))
    target, ds = build_world(
        root, seq=args.seq, rows=args.batch * (2 * args.steps + 4), hidden=128, layers=4, heads=4, kv_heads=2
    )
    params = TrainParams(
        inputs=[str(ds)],
        target=str(target),
        out=str(root / "run"),
        block_size=args.block,
        anchors_per_seq=args.anchors,
        batch_size=args.batch,
        lr=1e-3,
        loss="ce",  # the baseline and the FLOPs counted are the cross-entropy step
        max_steps=10_000,
        heldout_fraction=0.0,
        device="cpu",
    )
    tr = Trainer(params, LocalContext(root / "ctx"))
    drafter, tgt = tr.drafter, tr.target
    assert isinstance(drafter, DFlashDrafter)  # the default kind; the bare side reads its attributes
    embed_weight = tgt.embedding.weight
    assert isinstance(embed_weight, torch.Tensor)

    # the bare side: one fixed batch, everything prepared outside the timed region
    ids = torch.stack([torch.from_numpy(tr.data.example(tr.data.train[i])[0]) for i in range(args.batch)])
    lm = torch.stack([torch.from_numpy(tr.data.example(tr.data.train[i])[1]) for i in range(args.batch)])
    anchors, valid = sample_anchors(lm, args.anchors, torch.Generator().manual_seed(0))
    bb = build_blocks(ids, lm, None, anchors, valid, args.block, drafter.mask_token_id)
    sel = bb.label_valid
    labels = bb.labels[sel]
    w = slot_weights(args.block, params.gamma).expand_as(sel)[sel]
    noise = torch.nn.functional.embedding(bb.block_ids, embed_weight)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)

    def bare() -> None:
        with torch.no_grad():
            hs = tgt.model(
                input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1
            ).hidden_states
            ctx = torch.cat([hs[i + 1] for i in drafter.target_layer_ids], dim=-1)
        h = drafter(
            position_ids=bb.position_ids,
            attention_mask=bb.layout,
            noise_embedding=noise,
            target_hidden=ctx,
        )
        logits = tgt.lm_head(h.view(*sel.shape, -1)[sel])
        loss = (w * torch.nn.functional.cross_entropy(logits, labels, reduction="none")).sum() / w.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def ours() -> None:
        tr.train_step()
        tr.opt.step()
        tr.sched.step()
        tr.opt.zero_grad(set_to_none=True)

    tokens = args.batch * args.seq
    times: dict[str, list[float]] = {"draftdeck": [], "bare": []}
    for i in range(args.steps + 2):
        for name, fn in (("draftdeck", ours), ("bare", bare)):
            t0 = time.perf_counter()
            fn()
            if i >= 2:  # warm-up steps are not timed
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"drafter train step, CPU ({args.threads} thread), target 128x4, drafter 1 layer, B={args.block}, "
        f"{args.batch} x {args.seq} tokens, {args.anchors} anchors/seq, median of {args.steps} steps"
    )
    print(f"| {'path':<34} | {'s/step':>8} | {'tokens/s':>9} | {'ratio':>6} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 11}|{'-' * 8}|")
    for name, label in (
        ("bare", "bare PyTorch fwd+bwd, same modules"),
        ("draftdeck", "DraftDeck whole step"),
    ):
        ratio = med["bare"] / med[name]
        print(f"| {label:<34} | {med[name]:>8.4f} | {tokens / med[name]:>9.0f} | {ratio:>5.2f}x |")


if __name__ == "__main__":
    main()
