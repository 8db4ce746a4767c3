"""The demo world's half of benchmarks/hidden_cache.py: `draftdeck demo --quick`'s world (its trained
Qwen3 target, its prompts answered by the target and tokenized), a cache built once per storage option,
and the demo's DFlash and EAGLE-3 runs (`demo_train_params`: 1 layer, 7 drafts a step, batch 32)
trained online and from the caches, each in a process of its own (its peak RSS its own).

Three tables: (1) a cache built once trains DFlash and EAGLE-3 with the online run's losses and counts
(every metric point but wall time and memory compared), lower peak memory and the wall time saved;
(2) each storage option's bytes per token on this world and on a Qwen3.6-27B-class shape, its build,
its read throughput (every row read as a run reads it), and what it does to learning: the final loss
and the real greedy tau (the project's eval: speculative decoding against the target on held-out
prompts) against the fp32 run's; (3) written into `zstd_ratios` for size.py's estimate.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the metric points that wall time and memory make differ between two equal runs
TIMED = (
    "train/tokens_per_s",
    "train/step_seconds",
    "train/peak_memory_mib",
    "heldout/seconds",
    "heldout/peak_memory_mib",
)
# a Qwen3.6-27B-class text config (../shared/DOMAIN.md): 64 layers, hidden 5,120; EAGLE-3's 3 taps + final
BIG_HIDDEN, BIG_TAPPED, BIG_ALL = 5120, 4, 65
# storage options: (name, dtype, compression); fp32 is the reference every difference is taken from
OPTIONS = [
    ("fp32", "fp32", None),
    ("bf16", "bf16", None),
    ("fp16", "fp16", None),
    ("bf16 + zstd", "bf16", "zstd:3"),
    ("fp16 + zstd", "fp16", "zstd:3"),
    ("fp32 + zstd", "fp32", "zstd:3"),
]
SMOKE_OPTIONS = ["fp32", "bf16 + zstd"]  # the smoke: the path, two caches
# the options trained from; zstd is lossless (tests/unit/hidden/test_compressed.py: rows bit-equal), so
# bf16 + zstd is trained once to show it, and fp16/fp32 + zstd learn what fp16/fp32 do
LEARN = ["fp32", "bf16", "fp16", "bf16 + zstd"]


def demo_world(root: Path, smoke: bool) -> tuple[Path, Path]:
    """(target, dataset): the quick demo's world, or the smoke's small one; kept under `root`."""
    from app.cli.demo import QUICK
    from benchmarks._smoke import smoke_world
    from draftdeck.drafter.tiny import build_tiny_demo
    from draftdeck.jobs.context import LocalContext
    from draftdeck.regenerate.params import RegenerateParams
    from draftdeck.regenerate.run import run_regenerate
    from draftdeck.tokenize.job import TokenizeParams
    from draftdeck.tokenize.job import run as run_tokenize

    prompts, max_new = (40, 16) if smoke else (QUICK["prompts"], QUICK["max_new"])
    dataset = root / "dataset"
    if dataset.exists() and (root / "world" / "target").exists():  # a kept --workdir's world
        return root / "world" / "target", dataset
    if smoke:
        world = smoke_world(root / "world", n_prompts=prompts)
    else:
        world = build_tiny_demo(root / "world", target_steps=QUICK["target_steps"], n_prompts=prompts)
    if not dataset.exists():
        answers = root / "answers.jsonl"
        run_regenerate(
            RegenerateParams(
                inputs=[str(world.prompts)],
                out=str(answers),
                local=str(world.target_dir),
                device="cpu",
                max_tokens=max_new,
                temperature=0.0,
                concurrency=16,
                reasoning=False,
                keep_cut_off=True,
            ),
            LocalContext(root / "ctx" / "regen"),
        )
        run_tokenize(
            TokenizeParams(inputs=[str(answers)], tokenizer=str(world.target_dir), out=str(dataset)),
            LocalContext(root / "ctx" / "tok"),
        )
    return world.target_dir, dataset


def build(target: Path, ds: Path, out: Path, dtype: str, compress: str | None) -> tuple[dict, float]:
    from draftdeck.drafter.train.cache.job import run_cache_hidden
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.jobs.context import LocalContext

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    params = CacheParams(inputs=[str(ds)], target=str(target), out=str(out), dtype=dtype, compress=compress)
    report = run_cache_hidden(params, LocalContext(out.with_name(out.name + "-ctx")))
    return report.extra, time.perf_counter() - t0


def read_rate(cache: Path, repeats: int) -> tuple[float, float]:
    """(MB/s of states as a run receives them, rows/s): every row read as a run reads it (its shard's
    bytes, decompressed when compressed), best of `repeats` passes (the files in the page cache)."""
    from draftdeck.hidden.store import HiddenCache

    c = HiddenCache(cache)
    entries = list(c.by_row.values())
    best, size = float("inf"), 0
    for _ in range(repeats):
        t0, size = time.perf_counter(), 0
        for e in entries:
            h = c.hidden(e)
            size += h.numel() * h.element_size()
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e6, len(entries) / best


def child(spec: dict[str, Any]) -> None:
    """One demo training run in this process: its metric points, wall time and peak RSS as JSON."""
    import torch

    from app.cli.demo import demo_train_params
    from draftdeck.drafter.train.device import peak_bytes
    from draftdeck.drafter.train.run import run_train
    from draftdeck.jobs.context import LocalContext

    torch.set_num_threads(int(spec["threads"]))
    params = demo_train_params(
        spec["drafter"], [spec["ds"]], spec["target"], Path(spec["out"]), spec["steps"], 0
    )
    params = params.model_copy(update={"truth_rows": 0, "hidden_states": spec["cache"]})
    ctx = LocalContext(Path(spec["out"]) / "ctx")
    t0 = time.perf_counter()
    run_train(params, ctx)
    wall = time.perf_counter() - t0
    points = sorted((p.step, p.name, p.value) for p in ctx.points if p.name not in TIMED)
    steps = [v for _, v in ctx.series("train/step_seconds")]
    print(
        json.dumps({"points": points, "wall": wall, "peak": peak_bytes(torch.device("cpu")), "steps": steps})
    )


def train(script: Path, spec: dict[str, Any]) -> dict[str, Any]:
    shutil.rmtree(spec["out"], ignore_errors=True)  # trained afresh, never resumed
    res = subprocess.run(
        [sys.executable, str(script), "--demo-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode:
        raise SystemExit(f"demo run {spec['drafter']} ({spec['cache']}) failed:\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    got["loss"] = [v for _, name, v in got["points"] if name == "train/loss"][-1]
    got["s_step"] = statistics.median(got["steps"][1:] or got["steps"])
    return got


def tau(root: Path, run: Path, ds: Path, target: Path, prompts: int, max_new: int) -> float:
    """Real greedy tau (the bonus token counted, as vLLM's counters) of `run`'s checkpoint on held-out
    prompts: the project's eval, the drafter alone (no baselines)."""
    from draftdeck.drafter.eval.evaluate import run_eval
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.jobs.context import LocalContext

    name = f"eval-{run.name}"
    report = run_eval(
        EvalParams(
            inputs=[str(ds)],
            target=str(target),
            checkpoint=str(run),
            out=str(root / name),
            max_new_tokens=max_new,
            max_prompts=prompts,
            heldout_fraction=0.1,
            seed=0,
            baselines=False,
        ),
        LocalContext(root / "ctx" / name),
    )
    return float(report.extra["eval"]["methods"]["drafter"]["tau_incl_bonus_pooled"])


def differs(a: list, b: list) -> str:
    """'equal' when every (step, name, value) agrees; else whether every count (an integer-valued
    point: accepted, correct, total...) agrees, and how far apart the other points are (a padded online
    micro-batch's forward differs from each row's unpadded cached one by the kernels' rounding)."""
    if a == b:
        return "equal, bit for bit"
    if [(s, n) for s, n, _ in a] != [(s, n) for s, n, _ in b]:
        return "other points"
    apart = [(x[2], y[2]) for x, y in zip(a, b, strict=True) if x != y]
    counts = [p for p in apart if float(p[0]).is_integer() and float(p[1]).is_integer()]
    gap = max(abs(x - y) / max(abs(x), 1e-12) for x, y in apart)
    said = "every count equal" if not counts else f"{len(counts)} counts DIFFER"
    return f"{said}; {len(apart)} of {len(a)} sums and losses within {gap:.1e} (relative)"


def run(script: Path, root: Path, smoke: bool, steps: int, threads: int, kinds: list[str]) -> dict[str, Any]:
    """Everything the demo tables show; prints them."""
    from app.cli.demo import QUICK

    t0 = time.perf_counter()
    target, ds = demo_world(root, smoke)
    world_s = time.perf_counter() - t0
    options = [o for o in OPTIONS if not smoke or o[0] in SMOKE_OPTIONS]
    caches: dict[str, tuple[Path, dict, float]] = {}
    for name, dtype, compress in options:
        out = root / ("cache-" + name.replace(" + ", "-"))
        extra, seconds = build(target, ds, out, dtype, compress)
        caches[name] = (out, extra, seconds)
    spec = {"target": str(target), "ds": str(ds), "steps": steps, "threads": threads}
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for kind in kinds:  # online and from the fp32 cache: equal losses, lower memory
        for mode, cache in (("online", None), ("fp32", caches["fp32"][0])):
            out = root / f"run-{kind}-{mode}"
            runs[(kind, mode)] = train(
                script, {**spec, "drafter": kind, "out": str(out), "cache": str(cache) if cache else None}
            )
    eval_prompts, max_new = (2, 16) if smoke else (QUICK["eval_prompts"], 64)
    taus: dict[tuple[str, str], float] = {}
    learners = kinds[:1]  # the storage options' effect on learning: the first kind's runs (time)
    for kind in learners:
        for name, (cache, _, _) in caches.items():
            if name not in LEARN:
                continue
            if name != "fp32" and (kind, name) not in runs:
                out = root / f"run-{kind}-{name.replace(' + ', '-')}"
                runs[(kind, name)] = train(
                    script, {**spec, "drafter": kind, "out": str(out), "cache": str(cache)}
                )
            run_dir = root / f"run-{kind}-{name.replace(' + ', '-')}"
            taus[(kind, name)] = tau(root, run_dir, ds, target, eval_prompts, max_new)
    _print_equal(runs, caches, kinds, steps, world_s)
    _print_storage(root, caches, runs, taus, learners, target)
    return {"caches": caches, "runs": runs, "taus": taus}


def _print_equal(runs: dict, caches: dict, kinds: list[str], steps: int, world_s: float) -> None:
    build_s = caches["fp32"][2]
    print(
        f"\ndemo world (draftdeck demo --quick's, built in {world_s:.0f} s); the demo's runs,"
        f" {steps} steps, batch 32; the fp32 cache built once in {build_s:.1f} s serves both kinds\n"
    )
    print(
        "| drafter | run | losses and counts vs online | final loss | s/step | wall s | peak RSS MiB |"
        " wall saved vs online |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        on, off = runs[(kind, "online")], runs[(kind, "fp32")]
        for mode, r in (("online", on), ("from the fp32 cache", off)):
            same = "-" if r is on else differs(on["points"], r["points"])
            saved = (
                "-"
                if r is on
                else f"{on['wall'] - r['wall']:+.1f} s ({(on['wall'] - r['wall']) / on['wall']:.0%})"
            )
            print(
                f"| {kind} | {mode} | {same} | {r['loss']:.4f} | {r['s_step']:.3f} | {r['wall']:.1f} |"
                f" {r['peak'] / 2**20:,.0f} | {saved} |"
            )


def _print_storage(root: Path, caches: dict, runs: dict, taus: dict, kinds: list[str], target: Path) -> None:
    from draftdeck.causal_lm import causal_lm_config

    config = causal_lm_config(target)
    all_layers = int(config.num_hidden_layers) + 1
    stored = len(caches["fp32"][1]["layers"])
    hidden = int(config.hidden_size)
    plain_mb = read_rate(caches["fp32"][0], 3)[0]
    print(
        f"\nstorage options on the demo world (hidden {hidden}, {stored} stored layers of {all_layers});"
        " loss and tau against the fp32 run of the same kind; read: every row as a run reads it\n"
    )
    head = "| storage | B/token (demo) | 27B-class B/token | build s | read MB/s | zstd ratio |"
    head += "".join(f" {k} loss diff | {k} tau (diff) |" for k in kinds)
    print(head)
    print("|---|" + "---:|" * (5 + 2 * len(kinds)))
    width = {"fp32": 4, "bf16": 2, "fp16": 2}
    print(
        f"| fp32, every layer (hidden_states 0..{all_layers - 1}) | {all_layers * hidden * 4:,} (computed) |"
        f" {BIG_ALL * BIG_HIDDEN * 4:,} | - | - | - |" + " - | - |" * len(kinds)
    )
    for name, (cache, extra, seconds) in caches.items():
        dtype = str(extra["dtype"])
        raw = BIG_TAPPED * BIG_HIDDEN * width[dtype]
        # a plain cache's bytes are its states' (and the ids: under 0.5 %): 1 for the computed 27B figure
        ratio = _states_bytes(extra, hidden) / float(extra["bytes"]) if extra.get("compression") else 1.0
        mb, _ = read_rate(cache, 3) if name != "fp32" else (plain_mb, 0.0)
        cells = [
            f"{float(extra['bytes_per_token']):,.0f}",
            f"{raw / ratio:,.0f}",
            f"{seconds:.1f}",
            f"{mb:,.0f}",
            f"x{ratio:.2f}" if extra.get("compression") else "-",
        ]
        for kind in kinds:
            if (kind, name) not in runs:  # lossless: it learns what its dtype's plain cache does
                cells += ["as " + dtype, "as " + dtype]
                continue
            loss = runs[(kind, name)]["loss"] - runs[(kind, "fp32")]["loss"]
            t, t0 = taus[(kind, name)], taus[(kind, "fp32")]
            if name == "fp32":
                cells += [f"{runs[(kind, 'fp32')]['loss']:.4f}", f"{t:.3f}"]
            else:
                cells += [f"{loss:+.1e}", f"{t:.3f} ({t - t0:+.3f})"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    ratios = {str(e["dtype"]): _states_bytes(e, hidden) / float(e["bytes"]) for _, e, _ in caches.values()
              if e.get("compression")}  # fmt: skip
    print(
        "\nzstd:3 ratios (byte planes) on the demo world, for size.py's ZSTD_RATIOS: "
        + ", ".join(f"{d} x{r:.2f}" for d, r in ratios.items())
    )


def _states_bytes(extra: dict, hidden: int) -> float:
    """The bytes of a cache's states uncompressed: tokens x layers x hidden x bytes per value."""
    width = {"fp32": 4, "bf16": 2, "fp16": 2}[str(extra["dtype"])]
    return float(extra["tokens"]) * len(extra["layers"]) * hidden * width
