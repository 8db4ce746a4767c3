"""`draftdeck demo`: the whole path on a CPU in minutes, as jobs the dashboard shows.

A tiny world is built first (a BPE tokenizer, a 4-layer Qwen3 target trained briefly on structured
demo text, prompts it never saw); then four jobs run in this process, each recorded in the configured
database exactly as a worker would record it (state history, events, metric points, outputs):

    regenerate (the target answers the prompts)  ->  tokenize (its chat template, exact masks)
      ->  train (a 1-layer DFlash drafter, or with --drafter eagle3 an EAGLE-3 one, held-out walked
          tau as it goes)
      ->  eval (real speculative decoding, the untrained drafter and prompt lookup beside it)

Its last line of output is one JSON object with the figures, every tau incl. bonus. Start
`draftdeck up` on the same home (or `DATABASE_URL`) to watch the jobs and the run's charts live.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import typer

from app.run.job import run_job
from app.store import records
from app.store.db import session_scope
from draftdeck.drafter.kinds import get_kind as get_drafter_kind
from draftdeck.drafter.tiny import TinyDemo
from draftdeck.drafter.train.params import TrainParams
from draftdeck.jobs.params import JobParams
from draftdeck.kinds import get_kind

# Measured on a quiet 2-core CPU (issue 9): ~120 s of target training, 1,000 prompts x 128 greedy
# tokens, B = 8, 32 sequences x 8 anchors per step at lr 3e-3; the whole path in about 4.5 minutes.
# QUICK: a target trained long enough that it ends its answers (80 steps looped past max_tokens on
# 12 % of the prompts: a truncation alert) and enough drafter steps to learn them, so that the short
# run shows the drafter's point: real tau ~3.0 against prompt lookup's ~1.35 (80 target and 40
# drafter steps gave 1.62 against 1.50). Its eval takes every held-out prompt (23 of the 32 asked
# for): real decoding then runs over the very prompts the run's walk was judged on, and the two agree
# (on a subset of 12 they drifted up to 8 % apart with the data, and raised training_estimate_off).
FULL = {"target_steps": 600, "prompts": 1000, "max_new": 128, "train_steps": 400, "eval_prompts": 100}
QUICK = {"target_steps": 200, "prompts": 160, "max_new": 96, "train_steps": 100, "eval_prompts": 32}


def demo_world(size: dict[str, int], seed: int, arch: str, rebuild: bool, say: Any) -> TinyDemo:
    """The tiny world (tokenizer, target, prompts) of this size, seed and target architecture: built
    once under the home's demo-worlds/ by a `tiny-target` job (minutes on a CPU, its progress on the
    dashboard), reused by every later demo unless `rebuild`."""
    from app.settings import get_settings
    from draftdeck.drafter.tiny_job import TinyTargetParams, is_built

    steps, prompts = size["target_steps"], size["prompts"]
    folder = get_settings().home_dir / "demo-worlds" / f"{arch}-target{steps}-prompts{prompts}-seed{seed}"
    if is_built(folder) and not rebuild:
        say(f"reusing the tiny world built earlier in {folder} (--rebuild-world builds it again)")
    else:
        say(f"building the tiny world in {folder} (tokenizer, {arch} target trained {steps} steps)")
        params = TinyTargetParams(out=str(folder), arch=arch, target_steps=steps, prompts=prompts, seed=seed)
        _run("tiny-target", params, say)
    return TinyDemo(folder / "tokenizer", folder / "target", folder / "prompts.jsonl")


def _run(kind_name: str, params: JobParams, say: Any) -> tuple[int, dict[str, Any]]:
    """Record a job of `kind_name` and run it here; return its id and result, or exit 1 naming it."""
    kind = get_kind(kind_name)
    with session_scope() as session:
        job = records.create_job(session, kind.name, params.model_dump(mode="json"), kind.queue_for(params))
        job_id = job.id or 0
    started = time.monotonic()
    say(f"job {job_id} {kind_name}: running")
    stop = threading.Event()
    watcher = threading.Thread(target=_say_progress, args=(job_id, kind_name, say, stop), daemon=True)
    watcher.start()
    try:
        status = run_job(job_id, in_process=True)
    finally:
        stop.set()
        watcher.join()
    with session_scope() as session:
        done = records.get_job(session, job_id)
        assert done is not None
        result, error = dict(done.result or {}), done.error
    say(f"job {job_id} {kind_name}: {status} in {time.monotonic() - started:.0f} s")
    if status != "succeeded":
        say(f"job {job_id} {kind_name} failed: {error}")
        raise typer.Exit(1)
    return job_id, result


def _say_progress(job_id: int, kind_name: str, say: Any, stop: threading.Event, every: float = 15.0) -> None:
    """Every `every` seconds while the job runs, a line with its progress, rate and the time left:
    on a slow machine a user can tell it from a hung demo."""
    first: tuple[float, int] | None = None
    while not stop.wait(every):
        with session_scope() as session:
            job = records.get_job(session, job_id)
            if job is None:
                return
            done, total, unit = job.progress_done, job.progress_total, job.progress_unit
        now = time.monotonic()
        if first is None or done < first[1]:
            first = (now, done)
            continue
        rate = (done - first[1]) / max(now - first[0], 1e-9)
        left = f", about {(total - done) / rate:.0f} s left" if total and rate > 0 else ""
        of = f"/{total:,}" if total else ""
        say(f"job {job_id} {kind_name}: {done:,}{of} {unit}, {rate:.2g} {unit}/s{left}")


def _quiet_libraries() -> None:
    """The demo prints one line per phase: transformers' and the hub's own progress bars would
    interleave with them."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _set_threads(threads: int) -> str:
    """Give torch `threads` threads, or as many as there are idle cores (every job runs in this
    process); say how many and why. The tiny models' matrices are too small to gain from threads
    that would compete with other work for the same cores."""
    import torch

    from draftdeck.drafter.train.device import idle_cpu_cores

    chosen = threads or idle_cpu_cores()
    torch.set_num_threads(chosen)
    if threads:
        return f"torch threads: {chosen} (--threads)"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return f"torch threads: {chosen}, the idle cores of {os.cpu_count()} (load {load:.1f}; --threads to set)"


class DemoLog:
    """The demo's progress lines on stderr, each stamped with the seconds since the demo began."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, line: str) -> None:
        typer.echo(f"[{self.elapsed():6.1f} s] {line}", err=True)


def start_demo(workdir: Path, threads: int) -> DemoLog:
    """Refuse a workdir an earlier demo holds, quiet the libraries' own progress bars and set torch's
    threads (said as the first line): what every demo does before its world is built."""
    if (workdir / "run").exists() or (workdir / "answers.jsonl").exists():
        raise typer.BadParameter(f"{workdir} holds an earlier demo: remove it or pass another --workdir")
    say = DemoLog()
    _quiet_libraries()
    say(_set_threads(threads))
    return say


def _page_url(path: str) -> str:
    """The full address of a page on the server `draftdeck up` runs on this home, or how to open it."""
    from app.cli.address import recorded
    from app.settings import get_settings

    settings = get_settings()
    url = recorded(settings.home_dir)
    if url:
        return f"{url}{path}"
    return f"http://{settings.host}:{settings.port}{path} (start `draftdeck up` on this home to open it)"


def free_workdir(home: Path) -> Path:
    """The home's demo/, or demo-2/, demo-3/, ... when an earlier demo holds it: running the demo again
    just works (its world is reused), and the earlier run stays to compare."""
    n = 1
    while True:
        folder = home / ("demo" if n == 1 else f"demo-{n}")
        if not (folder / "run").exists() and not (folder / "answers.jsonl").exists():
            return folder
        n += 1


def demo(
    workdir: Path | None,
    *,
    quick: bool = False,
    seed: int = 0,
    target_arch: str = "qwen3",
    rebuild_world: bool = False,
    drafter: str = "dflash",
    threads: int = 0,
) -> None:
    """Run the whole path on the CPU (tiny target, regenerate, tokenize, train, eval) as jobs, with
    `threads` torch threads (0: the cores idle at the start)."""
    from app.settings import get_settings
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.regenerate.params import RegenerateParams
    from draftdeck.tokenize.job import TokenizeParams

    size = QUICK if quick else FULL
    workdir = free_workdir(get_settings().home_dir) if workdir is None else workdir.resolve()
    say = start_demo(workdir, threads)
    needed = get_drafter_kind(drafter).demo_target
    if needed is not None and needed != target_arch:
        say(f"--drafter {drafter} needs the demo's {needed} target, not {target_arch}: building on it")
        target_arch = needed
    world = demo_world(size, seed, target_arch, rebuild_world, say)
    say(f"world ready: tokenizer, target, {size['prompts']:,} distinct prompts")
    target = str(world.target_dir)
    _run("regenerate", RegenerateParams(
        inputs=[str(world.prompts)], out=str(workdir / "answers.jsonl"), local=target, device="cpu",
        max_tokens=size["max_new"], temperature=0.0, concurrency=16, reasoning=False, keep_cut_off=True,
    ), say)  # fmt: skip
    dataset = workdir / "dataset"
    _run("tokenize", TokenizeParams(inputs=[str(workdir / "answers.jsonl")], tokenizer=target,
                                    out=str(dataset)), say)  # fmt: skip
    train_id, _ = _run("train", demo_train_params(
        drafter, [str(dataset)], target, workdir / "run", size["train_steps"], seed
    ), say)  # fmt: skip
    say(f"run page: {_page_url(f'/runs/{train_id}')}")
    _run("eval", EvalParams(
        inputs=[str(dataset)], target=target, checkpoint=str(workdir / "run"), out=str(workdir / "eval"),
        max_new_tokens=size["max_new"], max_prompts=size["eval_prompts"], heldout_fraction=0.1, seed=seed,
    ), say)  # fmt: skip
    summary = _summary(workdir, train_id)
    say(f"done in {say.elapsed():.0f} s; every tau counts the bonus token (vLLM's convention)")
    typer.echo(json.dumps(summary))


def demo_train_params(
    drafter: str, inputs: list[str], target: str, out: Path, steps: int, seed: int
) -> TrainParams:
    """The demo's train job: a 1-layer drafter of the kind asked for, drafting 7 tokens a step (DFlash
    blocks of 8, EAGLE-3 chains of 7: its kind's `demo` options), on the same data, steps and batch."""
    kind: dict[str, Any] = dict(get_drafter_kind(drafter).demo)
    return TrainParams(
        inputs=inputs, target=target, out=str(out), drafter=drafter, layers=1, batch_size=32, lr=3e-3,
        warmup_ratio=0.05, max_steps=steps, device="cpu", seed=seed, heldout_fraction=0.1,
        checkpoint_every=max(10, steps // 4), eval_every=max(10, steps // 4), log_every=5, **kind,
    )  # fmt: skip


def _summary(workdir: Path, train_job: int) -> dict[str, Any]:
    """The figures the demo promises, from what the jobs wrote: the run's checkpoint index (walked
    held-out tau of the best checkpoint), its run record, and eval.json (real decoding)."""
    ev = json.loads((workdir / "eval" / "eval.json").read_text())["eval"]
    index = json.loads((workdir / "run" / "checkpoints" / "index.json").read_text())
    best = next((c for c in index["checkpoints"] if c["step"] == index["best"]), None)
    heldout = 1 + best["heldout_walked_accepted"] / best["heldout_walked_steps"] if best else None
    steps = best.get("heldout_target_walked_steps") if best else None
    judged = 1 + best["heldout_target_walked_accepted"] / steps if best and steps else None
    methods = ev["methods"]
    return {
        "train_tau": _train_estimate(train_job),
        "heldout_tau": heldout,  # judged by the data
        "heldout_tau_target": judged,  # judged by the target (the walk over its own answers)
        "eval_tau": methods["drafter"]["tau_incl_bonus_pooled"],  # incl. bonus, as vLLM's counters
        "eval_tokens_per_step": methods["drafter"].get("tokens_per_step"),  # as z-lab's benchmark
        "untrained_tau": methods["untrained"]["tau_incl_bonus_pooled"],
        "prompt_lookup_tau": methods["prompt_lookup"]["tau_incl_bonus_pooled"],
        # wall-clock tokens/s against target-only decoding; a tiny target on a CPU gains little from
        # fewer target forwards, so tau is the figure to judge the drafter by here
        "eval_speedup": methods["drafter"].get("speedup_vs_target_only"),
        "lossless": bool(ev["lossless"]),
        "checkpoint": str(workdir / "run" / "checkpoints" / best["path"] if best else workdir / "run"),
    }


def _train_estimate(train_job: int) -> float | None:
    """The optimistic training-time figure (mean over random anchors of 1 + the leading correct run)
    of the last held-out evaluation, read from the metric store: shown beside real decoding, never
    instead of it."""
    from sqlmodel import select

    from app.store.models import MetricSeries

    with session_scope() as session:
        series = session.exec(select(MetricSeries).where(MetricSeries.job_id == train_job)).all()
        rows = {s.name: s.last_value for s in series}
    blocks, accepted = rows.get("heldout/anchor/blocks"), rows.get("heldout/anchor/accepted")
    return 1 + accepted / blocks if blocks and accepted is not None else None
