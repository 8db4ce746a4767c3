# ruff: noqa: E402 - imports follow the sys.path fix
"""Training from a hidden-state cache against training online, on the CPU: the tables of issue 51.

    python benchmarks/hidden_cache.py [--part all|world|demo] [--workdir DIR] [--demo-steps 100]
        [--steps 12] [--hidden 512] [--layers 8] [--seq 256] [--rows 96]

The demo world (benchmarks/_hidden_demo.py): `draftdeck demo --quick`'s world, its cache built once per
storage option (fp32, bf16, fp16, each also with --compress zstd), the demo's DFlash and EAGLE-3 runs
online and from the fp32 cache (losses and counts compared, peak memory, wall time saved), and each
option's bytes per token (there and for a Qwen3.6-27B-class shape), read throughput, and the final loss
and real greedy tau a DFlash run trained from it reaches against the fp32 run's.

The training benchmarks' world (benchmarks/_train_world.py: a random-init Qwen3 target with the
project's small test BPE, synthetic rows): the cache built once (`cache-hidden`, fp32 and bf16, rows of
one length batched; and fp32 one row a forward, as builds ran before: rows/s, tokens/s); then a DFlash
and an EAGLE-3 run train `--steps` steps online and from the fp32 cache, each in a process of its own
so that its peak RSS (VmHWM) is its own: s/step (median of the steps after the first), peak memory,
and the target forward time a run from the cache saves per step.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time

from benchmarks import _hidden_demo
from benchmarks._train_world import build_world

SMOKE = {"steps": 2, "hidden": 64, "layers": 2, "seq": 48, "rows": 24}
BIG_HIDDEN, BIG_LAYERS = 5120, 4  # Qwen3.6-27B-class: 3 EAGLE-3 taps + the final layer


def child(spec: dict[str, object]) -> None:
    """One training run in this process: print its s/step figures and peak RSS as JSON."""
    import torch

    from draftdeck.drafter.train.device import peak_bytes
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import run_train
    from draftdeck.jobs.context import LocalContext

    torch.set_num_threads(1)
    extra = {"ttt_steps": 3} if spec["drafter"] == "eagle3" else {"block_size": 8, "anchors_per_seq": 16}
    params = TrainParams(
        inputs=[str(spec["ds"])], target=str(spec["target"]), out=str(spec["out"]), drafter=spec["drafter"],
        batch_size=4, max_steps=int(str(spec["steps"])), log_every=1, eval_every=10**6,
        checkpoint_every=10**6, heldout_fraction=0.1, heldout_max_rows=4, truth_rows=0, device="cpu",
        memory_check=False, hidden_states=spec["cache"], **extra,
    )  # fmt: skip
    ctx = LocalContext(Path(str(spec["out"])) / "ctx")
    run_train(params, ctx)
    steps = [v for _, v in ctx.series("train/step_seconds")]
    print(json.dumps({"steps": steps, "peak": peak_bytes(torch.device("cpu"))}))


def run_child(spec: dict[str, object]) -> dict[str, float]:
    res = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, check=False
    )
    if res.returncode:
        raise SystemExit(f"training run {spec['drafter']} failed:\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    steps = got["steps"][1:] or got["steps"]
    return {"s_step": statistics.median(steps), "peak": got["peak"]}


def build(
    target: Path, ds: Path, out: Path, dtype: str, batch_tokens: int = 8192
) -> tuple[dict[str, object], float]:
    from draftdeck.drafter.train.cache.job import run_cache_hidden
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.jobs.context import LocalContext

    shutil.rmtree(out, ignore_errors=True)  # a kept --workdir's earlier build
    t0 = time.perf_counter()
    report = run_cache_hidden(
        CacheParams(
            inputs=[str(ds)], target=str(target), out=str(out), dtype=dtype, batch_tokens=batch_tokens
        ),
        LocalContext(out.with_name(out.name + "-ctx")),
    )
    return report.extra, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--smoke", action="store_true", help="the smallest size: the path runs, nothing measured")
    ap.add_argument(
        "--part", choices=("all", "world", "demo"), default="all",
        help="world: the training benchmarks' world alone; demo: the demo world's tables alone",
    )  # fmt: skip
    ap.add_argument("--demo-steps", type=int, default=100, help="the demo runs' steps (the quick demo's)")
    ap.add_argument("--demo-kinds", default="dflash,eagle3")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the worlds, caches and runs here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--demo-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    if a.demo_child:
        _hidden_demo.child(json.loads(a.demo_child))
        return
    size = SMOKE if a.smoke else {k: getattr(a, k) for k in SMOKE}
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = a.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if a.part != "world":
            # the smoke runs beside other tests: one thread, DFlash alone, 2 steps
            kinds = ["dflash"] if a.smoke else a.demo_kinds.split(",")
            # one thread: two threads on two shared, busy cores ran several times slower, not faster
            steps, threads = (2, 1) if a.smoke else (a.demo_steps, 1)
            _hidden_demo.run(Path(__file__), root / "demo", a.smoke, steps, threads, kinds)
            if a.part == "demo":
                return
            print()
        root = root / "world"
        h = int(size["hidden"])
        target, ds = build_world(
            root, seq=int(size["seq"]), rows=int(size["rows"]), hidden=h, layers=int(size["layers"]),
            heads=max(h // 64, 1), kv_heads=max(h // 128, 1),
        )  # fmt: skip
        built = {d: build(target, ds, root / f"cache-{d}", d) for d in ("fp32", "bf16")}
        seq = int(size["seq"])
        builds = {
            f"fp32, rows of {seq}, one row a forward": build(target, ds, root / "alone", "fp32", 1),
            f"fp32, rows of {seq}, batched": built["fp32"],
            f"bf16, rows of {seq}, batched": built["bf16"],
        }
        # short rows (chat turns): there a forward's own cost, not its arithmetic, sets the pace
        short_seq, short_rows = max(seq // 8, 8), 4 * int(size["rows"])
        short_target, short_ds = build_world(
            root / "short", seq=short_seq, rows=short_rows, hidden=h, layers=int(size["layers"]),
            heads=max(h // 64, 1), kv_heads=max(h // 128, 1),
        )  # fmt: skip
        for bt, how in ((1, "one row a forward"), (8192, "batched")):
            cache = root / f"short-{bt}"
            builds[f"fp32, rows of {short_seq}, {how}"] = build(short_target, short_ds, cache, "fp32", bt)
        rows = []
        for drafter in ("dflash",) if a.smoke else ("dflash", "eagle3"):  # the smoke: one kind's path
            figures = {}
            for mode in ("online", "cache"):
                spec = {"drafter": drafter, "target": str(target), "ds": str(ds), "steps": size["steps"],
                        "out": str(root / f"run-{drafter}-{mode}"),
                        "cache": str(root / "cache-fp32") if mode == "cache" else None}  # fmt: skip
                figures[mode] = run_child(spec)
            on, off = figures["online"], figures["cache"]
            saved = on["s_step"] - off["s_step"]
            for mode, f in figures.items():
                rows.append(
                    f"| {drafter} | {mode} | {f['s_step']:.3f} | {f['peak'] / 2**20:,.0f} | "
                    + (f"{saved:+.3f} ({saved / on['s_step']:.0%})" if mode == "cache" else "-")
                    + " |"
                )
        world = f"target {h} hidden x {size['layers']} layers, {size['rows']} rows x {size['seq']} tokens"
        print(f"world: {world}; {size['steps']} steps, batch 4, 1 thread\n")
        print("| drafter | run | s/step | peak RSS MiB | target forward saved s/step |")
        print("|---|---|---:|---:|---:|")
        print("\n".join(rows))
        print()
        print("| cache build | forwards | rows/s | tokens/s | MB/s | job s (loading, read-back check) |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, (extra, seconds) in builds.items():  # batched: rows of one length, 8,192 tokens a forward
            print(
                f"| {name} | {extra['forwards']} | {extra['cache/rows_per_s']:,.1f} |"
                f" {extra['cache/tokens_per_s']:,.0f} | {extra['cache/mb_per_s']:,.1f} | {seconds:.1f} |"
            )
        print(f"\nstored layers {built['fp32'][0]['layers']}")
        print()
        n_layers = len(built["fp32"][0]["layers"])  # type: ignore[arg-type]
        print("| storage | this world B/token | 27B-class B/token (5,120 x 4 layers) |")
        print("|---|---:|---:|")
        for d, width in (("fp32", 4), ("bf16", 2)):
            per = float(built[d][0]["bytes_per_token"])  # type: ignore[arg-type]
            print(
                f"| {d} | {per:,.0f} (stored, {n_layers} layers x {h}) |"
                f" {BIG_HIDDEN * BIG_LAYERS * width:,} |"
            )
        print("\n(compressed storage, fp16, and what each does to the loss and tau: the demo world's table)")


if __name__ == "__main__":
    main()
