# ruff: noqa: E402 - imports follow the sys.path fix
"""Drafter training at real lengths: the dense reference against the block-sparse path, per shape.

    python benchmarks/train_long.py [--vocab 32768] [--steps 3] [--device cpu|cuda]

One table, measured in one run: for T in {512, 2,048, 4,096} and A in {64, 512} anchors (B = 16,
batch 1), one drafter step (forward + backward through `dflash_loss`, on a stand-in target context:
random hidden states of the right shape, a random embedding and LM head) with

- dense: SDPA under the dense (A*B) x (T + A*B) mask and the LM head over every counted slot at
  once (the trainer before issue 18, kept as the reference);
- sparse: the trainer's defaults where the benchmark runs: blocked attention on the CPU (flex,
  compiled, on a GPU), the LM head in chunks of slots, `anchors_per_forward` (32) anchors per
  forward and backward with the context's part of the drafter computed once (`dflash_backward`).

The drafter is mid-size: hidden 1,024, 8 heads of 128, intermediate 3,072, 1 layer, context from 4
target layers. Each case runs in its own process so that its peak (RSS on the CPU, max allocated on
a GPU) is its own: `peak` is what the step adds to what was held before it. Time: the median over
`--steps` steps after one warm-up. Goals (issue 18): at T = 4,096, A = 512 peak >= 5x lower and step
>= 1.5x faster; no case slower than dense by more than 10 %.

    python benchmarks/train_long.py --losses ce,kl,ce+kl [--shapes 4096:512]

measures the sparse path once per training loss instead (issue 34): the KL reads the target's final
hidden states (a stand-in of the right shape) and its logits at every slot; its peak and time beside
the CE's, per shape.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import statistics
import subprocess
import time

import torch

SHAPES = [(512, 64), (512, 512), (2048, 64), (2048, 512), (4096, 64), (4096, 512)]


def run_case(
    t: int, a: int, path: str, vocab: int, steps: int, device_name: str, loss: str = "ce"
) -> dict[str, float]:
    from torch import nn

    from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
    from draftdeck.drafter.kinds.dflash.objective import (
        dflash_backward,
        dflash_loss,
        label_weight_sum,
        sample_anchors,
    )
    from draftdeck.drafter.model.attention import resolve_backend
    from draftdeck.drafter.model.config import DrafterConfig
    from draftdeck.drafter.train.device import in_use_bytes, peak_bytes, reset_peak
    from draftdeck.drafter.train.params import TrainParams

    torch.manual_seed(0)
    device = torch.device(device_name)
    h, n_ids = 1024, 4
    cfg = DrafterConfig(
        hidden_size=h, vocab_size=vocab, layers=1, num_attention_heads=8, num_key_value_heads=8, head_dim=128,
        intermediate_size=3 * h, num_target_layers=8, target_layer_ids=(1, 3, 5, 7), mask_token_id=vocab - 1,
        block_size=16, max_position_embeddings=32768,
    )  # fmt: skip
    drafter = DFlashDrafter(cfg).to(device)
    embedding = nn.Embedding(vocab, h).to(device).requires_grad_(False)
    head = nn.Linear(h, vocab, bias=False).to(device).requires_grad_(False)
    ids = torch.randint(0, vocab - 1, (1, t), device=device)
    lm = torch.ones(1, t, dtype=torch.long, device=device)
    lm[:, : t // 8] = 0  # a prompt, then the answer
    att = torch.ones_like(lm)
    context = torch.randn(1, t, n_ids * h, device=device)
    anchors, valid = sample_anchors(lm, a, torch.Generator().manual_seed(0))
    norm = label_weight_sum(lm, anchors, valid, 16, 7.0)
    attention = "dense" if path == "dense" else resolve_backend("auto", device)
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    per = TrainParams.model_fields["anchors_per_forward"].default
    mix = TrainParams(inputs=["-"], target="-", loss=loss).mix
    teacher = torch.randn(1, t, h, device=device) if mix.needs_teacher else None  # the target's final states

    def step() -> None:
        with amp:
            if path == "dense":  # one forward over every anchor, every logit at once
                res = dflash_loss(
                    drafter, embedding, head, context, ids, lm, att, anchors, valid, 7.0, normalizer=norm,
                    attention="dense", chunked_head=False,
                )  # fmt: skip
                res.loss.backward()
            else:  # as the trainer does: anchors_per_forward at a time, the context's part once
                dflash_backward(
                    drafter, embedding, head, context, ids, lm, att, anchors, valid, 7.0, normalizer=norm,
                    anchors_per_forward=per, attention=attention, teacher=teacher, mix=mix,
                )  # fmt: skip
        drafter.zero_grad(set_to_none=True)
        sync()

    held = in_use_bytes(device)
    reset_peak(device)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        step()
        if i:  # the first step warms up (and compiles, on a GPU)
            times.append(time.perf_counter() - t0)
    return {
        "seconds": statistics.median(times),
        "peak": float(peak_bytes(device) - held),
        "anchors": int(valid.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    ap.add_argument("--losses", default="", help="e.g. ce,kl,ce+kl: the sparse path once per training loss")
    ap.add_argument("--shapes", default="", help="T:A,... instead of every shape (e.g. 4096:512)")
    ap.add_argument("--loss", default="ce", help=argparse.SUPPRESS)
    ap.add_argument("--case", nargs=3, metavar=("T", "A", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    a = ap.parse_args()
    if a.smoke:  # one short shape, dense and sparse (or each loss), one timed step, a small vocabulary
        a.shapes, a.vocab, a.steps = a.shapes or "128:8", 2048, 1
    shapes = (
        [(int(t), int(n)) for t, n in (x.split(":") for x in a.shapes.split(","))] if a.shapes else SHAPES
    )
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.case:
        t, n, path = int(a.case[0]), int(a.case[1]), a.case[2]
        print(json.dumps(run_case(t, n, path, a.vocab, a.steps, a.device, a.loss)))
        return

    def measure(t: int, n: int, path: str, loss: str = "ce") -> dict[str, float]:
        cmd = [sys.executable, __file__, "--case", str(t), str(n), path, "--vocab", str(a.vocab),
               "--steps", str(a.steps), "--device", a.device, "--threads", str(a.threads),
               "--loss", loss]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))

    if a.losses:
        losses = a.losses.split(",")
        print(
            f"drafter step (forward + backward) per training loss, {a.device}, torch {torch.__version__}: the"
            f" sparse path, hidden 1,024, 1 layer, B = 16, batch 1, vocab {a.vocab:,}; median of {a.steps}"
            f" steps; ratios against the first loss given ({losses[0]}), measured in this run"
        )
        base_name = losses[0]
        cols = [f"{x} s/step | {x} MiB" for x in losses]
        cols += [f"{x}/{base_name} time | {x}/{base_name} peak" for x in losses[1:]]
        print("| T | A | " + " | ".join(cols) + " |")
        print("|--:|--:|" + "--:|" * (2 * len(losses) + 2 * (len(losses) - 1)))
        for t, n in shapes:
            got = {x: measure(t, n, "sparse", x) for x in losses}
            base = got[losses[0]]
            cells = [f"{got[x]['seconds']:.3f} | {got[x]['peak'] / 2**20:,.0f}" for x in losses]
            cells += [
                f"{got[x]['seconds'] / base['seconds']:.2f}x | {got[x]['peak'] / max(base['peak'], 1):.2f}x"
                for x in losses[1:]
            ]
            print(f"| {t:,} | {int(base['anchors'])} | " + " | ".join(cells) + " |", flush=True)
        return

    sparse_name = "blocked" if a.device == "cpu" else "flex"
    print(
        f"drafter step (forward + backward), {a.device}, torch {torch.__version__}: hidden 1,024, 8 heads, "
        f"1 layer, B = 16, batch 1, vocab {a.vocab:,}; sparse = {sparse_name} attention + chunked LM head; "
        f"median of {a.steps} steps"
    )
    print("| T | A | dense s/step | sparse s/step | speed-up | dense MiB | sparse MiB | memory ratio |")
    print("|--:|--:|-------------:|--------------:|---------:|----------:|-----------:|-------------:|")
    for t, n in shapes:
        dense, sparse = measure(t, n, "dense"), measure(t, n, "sparse")
        print(
            f"| {t:,} | {int(sparse['anchors'])} | {dense['seconds']:.3f} | {sparse['seconds']:.3f} | "
            f"{dense['seconds'] / sparse['seconds']:.2f}x | {dense['peak'] / 2**20:,.0f} | "
            f"{sparse['peak'] / 2**20:,.0f} | {dense['peak'] / max(sparse['peak'], 1):.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
