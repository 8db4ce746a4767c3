# ruff: noqa: E402 - imports follow the sys.path fix
"""Sharded drafter training on the CPU (gloo): ranks x strategy, per-rank memory and step time.

    python benchmarks/train_sharded.py [--ranks 1,2,4] [--steps 6] [--seq 256] [--hidden 512]
    python benchmarks/train_sharded.py --device cuda --ranks 1,2,4,8 --hidden 2048 --seq 2048  # a GPU machine

One table, measured in one run: for 1 rank (none) and each of ddp and fsdp at 2 and 4 ranks, the
median training step (`Trainer.train_step` + the optimizer step; the global batch is the same at
every world size, so a step is the same work), each rank's peak memory (the process's high-water
RSS: weights, state, activations, the interpreter; on GPUs the allocator's peak), the planner's
figure for that rank (`draftdeck plan` for this shape: float32 and blocked attention on the CPU,
bf16 and flex on GPUs; within 30 % is the goal), the drafter's
state per rank (weights, gradients, AdamW moments: the local shards), and the frozen target's
weights per rank (fsdp shards its decoder layers, and its embedding and head by vocabulary). Goals (issue
33): fsdp's drafter state <= 1/N of one rank's + 10 %; fsdp's step >= 0.7x ddp's at 2 ranks; the
target per rank <= 1/N + one layer.

The world: a random-init Qwen3 target (hidden 512, 8 layers, vocabulary 8,192) and a 4-layer
drafter; rows of 256 tokens, 8 a step. Every rank gets one thread (this machine has 2 cores: at 4
ranks they share them, so step times there measure the contention too).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from benchmarks._train_world import build_world

GLOBAL_BATCH = 8


def _params(root: Path, world: int, strategy: str, args: argparse.Namespace) -> Any:
    from draftdeck.drafter.train.params import TrainParams

    return TrainParams(
        inputs=[str(root / "ds")], target=str(root / "target"), out=str(root / f"run-{world}-{strategy}"),
        block_size=8, layers=args.layers, anchors_per_seq=32, anchors_per_forward=32,
        batch_size=GLOBAL_BATCH // world, lr=1e-3, max_steps=10_000, heldout_fraction=0.0, truth_rows=0,
        devices=world, device=args.device, sharding=strategy, memory_check=False, loss="ce",
    )  # fmt: skip


def _high_water() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rank(rank: int, world: int, strategy: str, root: str, port: int, args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from draftdeck.drafter.train import sharding
    from draftdeck.drafter.train.launched import leave_process_group
    from draftdeck.drafter.train.memory import params_bytes
    from draftdeck.drafter.train.trainer import Trainer
    from draftdeck.jobs.context import LocalContext

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    tr = Trainer(
        _params(Path(root), world, strategy, args), LocalContext(Path(root) / f"ctx{rank}"), rank, world
    )
    times, state = [], {}
    for i in range(args.steps + 2):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tr.train_step()
        state = sharding.state_bytes(tr.drafter, tr.opt)  # gradients present: before zero_grad
        tr.opt.step()
        tr.sched.step()
        tr.opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:  # warm-up steps are not timed
            times.append(time.perf_counter() - t0)
    state = {**state, "optimizer": sharding.state_bytes(tr.drafter, tr.opt)["optimizer"]}
    mine = {
        "step_s": statistics.median(times),
        "peak": torch.cuda.max_memory_allocated() if cuda else _high_water(),
        "drafter_state": sum(state.values()),
        "target_weights": params_bytes(tr.target.model),
        "target_whole": sum(p.numel() * p.element_size() for p in tr.target.model.parameters()),
        "target_layer": max(params_bytes(layer) for layer in sharding.target_layers(tr.target.model))
        if not tr.target.sharded
        else 0,
        "strategy": tr.strategy,
    }
    every: list[Any] = [mine]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, mine)
        del tr  # (what holds the process group: freed before leaving it, see leave_process_group)
        leave_process_group()
    if rank == 0:
        Path(root, f"result-{world}-{strategy}.json").write_text(json.dumps(every))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _planned(root: Path, world: int, strategy: str, args: argparse.Namespace) -> int:
    from draftdeck.causal_lm import causal_lm_config
    from draftdeck.drafter.train.plan import plan, shape_of

    params = _params(root, world, strategy, args)
    e = 2 if args.device == "cuda" else 4
    shape = shape_of(params, seq_length=args.seq, element_size=e, world=world, heldout_rows=0)
    return plan(causal_lm_config(root / "target"), shape, None).strategies[strategy].per_rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="1,2,4", help="world sizes (1 runs unsharded)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--target-layers", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4, help="drafter layers")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank, NCCL")
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # unsharded, ddp and fsdp at 2 ranks, one timed step of a tiny target and drafter
        args.ranks, args.steps, args.seq, args.hidden, args.target_layers, args.layers = (
            "1,2",
            1,
            64,
            64,
            2,
            1,
        )
    root = Path(tempfile.mkdtemp(prefix="dd-bench-sharded-"))
    rows = GLOBAL_BATCH * (args.steps + 4)
    build_world(root, seq=args.seq, rows=rows, hidden=args.hidden, layers=args.target_layers,
                heads=8, kv_heads=4, vocab=8192)  # fmt: skip
    runs = [(1, "none")] + [(w, s) for w in map(int, args.ranks.split(",")) if w > 1 for s in ("ddp", "fsdp")]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for world, strategy in runs:
        mp.start_processes(_rank, args=(world, strategy, str(root), _free_port(), args), nprocs=world,
                           start_method="spawn")  # fmt: skip
        results[(world, strategy)] = json.loads((root / f"result-{world}-{strategy}.json").read_text())
    one = results[(1, "none")][0]
    where = "GPU (NCCL)" if args.device == "cuda" else "CPU (gloo, 1 thread per rank)"
    print(
        f"sharded drafter training, {where}, target Qwen3 {args.hidden} x "
        f"{args.target_layers} layers, drafter {args.layers} layers, {GLOBAL_BATCH} x {args.seq} tokens a"
        f" step, median of {args.steps} steps; per rank: the largest of the ranks"
    )
    head = ("ranks", "strategy", "s/step", "vs 1 rank", "peak/rank", "planned", "meas/plan",
            "drafter state", "of 1 rank", "target/rank")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("-" * (len(h) + 2) for h in head) + "|")
    for (world, strategy), ranks in results.items():
        step = max(r["step_s"] for r in ranks)
        peak = max(r["peak"] for r in ranks)
        state = max(r["drafter_state"] for r in ranks)
        planned = _planned(root, world, strategy, args)
        target = max(r["target_weights"] for r in ranks)
        cells = (
            str(world), strategy, f"{step:.3f}", f"{one['step_s'] / step:.2f}x", f"{peak / 2**20:,.0f} MiB",
            f"{planned / 2**20:,.0f} MiB", f"{peak / planned:.2f}", f"{state / 2**20:,.1f} MiB",
            f"{state / one['drafter_state']:.3f}", f"{target / 2**20:,.0f} MiB",
        )  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    for world in sorted({w for w, _ in results if w > 1}):
        ddp, fsdp = results[(world, "ddp")], results[(world, "fsdp")]
        speed = max(r["step_s"] for r in ddp) / max(r["step_s"] for r in fsdp)
        share = max(r["drafter_state"] for r in fsdp) / one["drafter_state"]
        print(
            f"{world} ranks: fsdp's drafter state {share:.3f} of one rank's (goal <= {1 / world + 0.1:.3f});"
            f" fsdp step {speed:.2f}x ddp's (goal >= 0.70)"
        )
        whole, layer = one["target_whole"], one["target_layer"]
        held = max(r["target_weights"] for r in fsdp)
        print(
            f"{world} ranks: fsdp's target {held / 2**20:,.1f} MiB per rank of {whole / 2**20:,.1f} MiB"
            f" (goal <= 1/N + one layer = {(whole / world + layer) / 2**20:,.1f} MiB)"
        )


if __name__ == "__main__":
    main()
