# ruff: noqa: E402 - imports follow the sys.path fix
"""Drafter training on a lent GPU: a mid-size config for a few minutes, tokens/s and model FLOP use.

    python benchmarks/train_gpu.py [--seconds 120] [--device cuda] [--peak-tflops 989]

Runs the real trainer (`Trainer.train_step` + optimizer step, bf16 autocast) on a random-init
Qwen3 target (default hidden 1024 x 8 layers, vocab 32,768, seq 2,048) and synthetic shards, with
a 2-layer drafter, B = 16, 256 anchors per sequence. Prints one table: steps, s/step, target
tokens/s, estimated model FLOPs per step and utilisation against `--peak-tflops` (H200 dense bf16:
989). The FLOP count is analytic (matmuls only): target forward over all tokens (no LM head);
drafter forward + backward (x3) over the block queries, its context k/v and fc over the context,
dense attention of A*B queries over T + A*B keys (sdpa computes the masked entries too); the LM head
on the counted slots (forward + input gradient, x2). `--device cpu --tiny` checks the script here.

Sharded training (ranks x strategy, per-rank peak against the planner): `python
benchmarks/train_sharded.py --device cuda --ranks 1,2,4,8` on a machine with that many GPUs.

Then, on a GPU, the table of `benchmarks/train_long.py` (dense against sparse per T and A, bf16, flex
attention compiled), so that the first run on a GPU measures it at once (`--no-long` skips it).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import tempfile
import time
from typing import Any

import torch

from benchmarks._train_world import build_world


def build(root: Path, a: argparse.Namespace) -> tuple[Path, Path]:
    heads = max(a.hidden // 128, 2)
    return build_world(
        root, seq=a.seq, rows=a.batch * 64, hidden=a.hidden, layers=a.target_layers, heads=heads,
        kv_heads=max(heads // 4, 1), vocab=a.vocab,
    )  # fmt: skip


def flops_per_step(tr: Any, a: argparse.Namespace) -> float:
    t_cfg, d = tr.target.config, tr.drafter.config  # the DFlash drafter's DrafterConfig
    h, t, b, v = d.hidden_size, a.seq, a.batch, d.vocab_size
    q = min(a.anchors, t) * d.block_size
    t_params = sum(
        p.numel() for n, p in tr.target.model.named_parameters() if "embed" not in n and "lm_head" not in n
    )
    target = 2 * t_params * t + 2 * t * t * h * t_cfg.num_hidden_layers  # causal attention: half of 4*T^2*H
    kv = 2 * d.num_key_value_heads * d.head_dim
    layer = 2 * (h * d.num_attention_heads * d.head_dim * 2 + h * kv + 3 * h * d.intermediate_size)
    drafter = d.layers * (layer * q + 2 * h * kv * t + 4 * q * (t + q) * h) + 2 * d.context_size * h * t
    head = 2 * 2 * h * v * min(a.anchors, t) * (d.block_size - 1)
    return float(b * (target + 3 * drafter + head))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--target-layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=256)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a small config, to check the script on a CPU")
    ap.add_argument("--no-long", action="store_true", help="skip benchmarks/train_long.py's table")
    ap.add_argument("--smoke", action="store_true", help="--device cpu --tiny for a second: the tests' check")
    a = ap.parse_args()
    if a.smoke:  # the CPU side of the script (world, trainer, FLOP count, table) on any machine
        a.device, a.tiny, a.seconds, a.no_long = "cpu", True, 1.0, True
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "no CUDA device here: this benchmark is for a lent GPU (--device cpu --tiny checks the script)"
        )
    if a.tiny:
        a.hidden, a.target_layers, a.vocab, a.seq, a.batch, a.anchors, a.block = 64, 4, 2048, 128, 2, 16, 8

    from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.trainer import Trainer
    from draftdeck.jobs.context import LocalContext

    root = Path(tempfile.mkdtemp(prefix="dd-bench-train-gpu-"))
    target, ds = build(root, a)
    params = TrainParams(
        inputs=[str(ds)],
        target=str(target),
        out=str(root / "run"),
        block_size=a.block,
        layers=a.layers,
        anchors_per_seq=a.anchors,
        batch_size=a.batch,
        lr=6e-4,
        loss="ce",  # the baseline and the FLOPs counted are the cross-entropy step
        max_steps=1_000_000,
        heldout_fraction=0.0,
        device=a.device,
    )
    tr = Trainer(params, LocalContext(root / "ctx"))
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def step() -> None:
        tr.train_step()
        tr.opt.step()
        tr.sched.step()
        tr.opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up
        step()
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        step()
        n += 1
    sync()
    dt = (time.perf_counter() - t0) / n
    flops = flops_per_step(tr, a)
    mem = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else float("nan")
    assert isinstance(tr.drafter, DFlashDrafter)  # the default kind
    vocab = tr.drafter.config.vocab_size
    print(
        f"drafter training, {a.device}: target {a.hidden}x{a.target_layers} vocab {vocab}, "
        f"drafter {a.layers} layers, B={a.block}, {a.batch} x {a.seq} tokens, {a.anchors} anchors/seq"
    )
    print("| steps | s/step | target tokens/s | model TFLOP/step | TFLOP/s | MFU | peak GiB |")
    print("|------:|-------:|----------------:|-----------------:|--------:|----:|---------:|")
    print(
        f"| {n} | {dt:.4f} | {a.batch * a.seq / dt:,.0f} | {flops / 1e12:.3f} | {flops / dt / 1e12:.1f} | "
        f"{flops / dt / (a.peak_tflops * 1e12):.1%} | {mem:.1f} |"
    )
    if a.device == "cuda" and not a.no_long:
        import subprocess

        print(flush=True)
        long = Path(__file__).resolve().parent / "train_long.py"
        subprocess.run([sys.executable, str(long), "--device", "cuda", "--vocab", str(a.vocab)], check=True)


if __name__ == "__main__":
    main()
