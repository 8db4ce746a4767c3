"""Training runs as the trainer and the eval leave them: a `train` job with its metric points (names of
draftdeck/jobs/context.py, counts as counts), run.json and checkpoints/index.json in its folder, and
`eval` jobs with eval.json and the alert the eval raises when real decoding and the run's figures
disagree (draftdeck.drafter.eval.evaluate.versus_training). For page tests, browser tests and screenshots."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.store.metrics import record_points
from app.store.models import Alert, Job
from draftdeck.drafter.eval.versus import Real, RunFigures, versus_training
from draftdeck.jobs.context import MetricPoint

BLOCK = 4
HELDOUT_EVERY = 50


def walked_accepted(progress: float, verify: int) -> int:
    """Accepted draft tokens over `verify` verify steps of a held-out pass (tau = 1 + it / verify)."""
    return round(verify * (0.3 + 1.6 * progress))


def target_accepted(progress: float, verify: int) -> int:
    """The same over the target's own answers: a little below (the data is near, not exactly, its output)."""
    return round(0.92 * walked_accepted(progress, verify))


def step_points(
    step: int, rng: random.Random, *, lr_peak: float = 3e-3, steps: int = 1000
) -> list[MetricPoint]:
    """The points a training step writes (and, every HELDOUT_EVERY steps, a held-out pass)."""
    tokens = (step + 1) * 8192
    progress = step / max(steps, 1)
    loss = 6.0 * math.exp(-3 * progress) + 1.2 + rng.gauss(0, 0.06)
    if step == steps // 3:
        loss *= 3  # a spike the min/max band must keep
    pts = [
        MetricPoint(step, "train/loss", loss, tokens),
        MetricPoint(
            step,
            "train/lr",
            lr_peak * min(1.0, (step + 1) / 50) * (0.5 + 0.5 * math.cos(math.pi * progress)),
            tokens,
        ),
        MetricPoint(step, "train/grad_norm", 1.5 * math.exp(-progress) + abs(rng.gauss(0, 0.2)), tokens),
        MetricPoint(step, "train/tokens_per_s", 9000 + rng.gauss(0, 300), tokens),
    ]
    for k in range(1, BLOCK):
        p = max(0.05, min(0.95, (0.3 + 0.6 * progress) * (0.85 ** (k - 1))))
        total = 64
        pts.append(MetricPoint(step, f"train/pos/{k}/correct", float(round(total * p)), tokens))
        pts.append(MetricPoint(step, f"train/pos/{k}/total", float(total), tokens))
    if step % HELDOUT_EVERY == 0:
        verify = 200
        accepted = walked_accepted(progress, verify)
        anchor = float(min(round(accepted * 1.6), verify * (BLOCK - 1)))  # optimistic, capped at B - 1
        pts += [
            MetricPoint(step, "heldout/loss", loss + 0.15, tokens),
            MetricPoint(step, "heldout/walked/accepted", float(accepted), tokens),
            MetricPoint(step, "heldout/walked/steps", float(verify), tokens),
            MetricPoint(step, "heldout/anchor/accepted", anchor, tokens),
            MetricPoint(step, "heldout/anchor/blocks", float(verify), tokens),
            MetricPoint(
                step, "heldout/target_walked/accepted", float(target_accepted(progress, verify)), tokens
            ),
            MetricPoint(step, "heldout/target_walked/steps", float(verify), tokens),
            MetricPoint(step, "heldout/agreement/tokens", 4000.0, tokens),
            MetricPoint(step, "heldout/agreement/matches", 3720.0, tokens),
            MetricPoint(step, "heldout/agreement/prob_sum", 3480.0, tokens),
            MetricPoint(step, "heldout/agreement/expected_sum", 3560.0, tokens),
        ]
        mean = 1 + accepted / verify
        weights = [math.exp(-((n - mean) ** 2)) for n in range(1, BLOCK + 1)]
        for n, w in enumerate(weights, start=1):
            pts.append(
                MetricPoint(step, f"heldout/hist/{n}", float(round(verify * w / sum(weights))), tokens)
            )
    return pts


def make_run(
    session: Session,
    jobs_dir: Path,
    *,
    steps: int = 400,
    status: str = "running",
    params: dict[str, Any] | None = None,
    seed: int = 0,
    checkpoint_every: int = 100,
) -> int:
    """A train job with `steps` steps of points, run.json and a checkpoint index; returns its id."""
    defined: dict[str, Any] = {
        "target": "/models/qwen3-tiny",
        "block_size": BLOCK,
        "lr": 3e-3,
        "seed": seed,
        "layers": 1,
    } | (params or {})
    job = Job(kind="train", params=defined, status=status, queue="gpu")
    session.add(job)
    session.commit()
    assert job.id is not None
    out = jobs_dir / str(job.id)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    # run.json as the trainer writes it: `drafter` is the drafter's config, its kind said for EAGLE-3
    eagle3 = {"kind": "eagle3", "ttt_steps": defined.get("ttt_steps", 7), "draft_vocab_size": 32000,
              "draft_vocab_coverage": 0.973, "draft_vocab_from": defined.get("draft_vocab")}  # fmt: skip
    config = eagle3 if defined.get("drafter") == "eagle3" else {"block_size": defined["block_size"]}
    (out / "run.json").write_text(
        json.dumps(defined | {"world_size": 1, "mask_token_id": 151669, "drafter": config})
    )
    rng = random.Random(seed)
    batch: list[MetricPoint] = []
    for step in range(steps):
        batch += step_points(step, rng, lr_peak=float(defined["lr"]), steps=max(steps, 1000))
        if len(batch) > 5000:
            record_points(session, job.id, batch)
            batch = []
    record_points(session, job.id, batch)
    write_index(out, list(range(checkpoint_every, steps, checkpoint_every)), max(steps, 1000))
    return job.id


def write_index(out: Path, ckpt_steps: list[int], total_steps: int) -> None:
    """checkpoints/index.json with walked counts that rise with the step; best = the highest tau."""
    entries: list[dict[str, Any]] = [
        {
            "step": s,
            "path": str(out / "checkpoints" / f"step-{s:08d}"),
            "heldout_walked_accepted": walked_accepted(s / total_steps, 200),
            "heldout_walked_steps": 200,
            "heldout_target_walked_accepted": target_accepted(s / total_steps, 200),
            "heldout_target_walked_steps": 200,
        }
        for s in ckpt_steps
    ]
    best = max(entries, key=lambda e: e["heldout_walked_accepted"])["step"] if entries else None
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    (out / "checkpoints" / "index.json").write_text(json.dumps({"checkpoints": entries, "best": best}))


def make_eval(
    session: Session,
    jobs_dir: Path,
    run_id: int,
    step: int,
    real_tau: float,
    data_tau: float,
    target_tau: float | None = None,
    tokens_per_step: float | None = None,
    per_pos: list[int] | None = None,
    served_tau: float | None = None,
) -> int:
    """A succeeded eval job of the run's checkpoint at `step`, with eval.json holding the run's taus for
    it (judged by the data and, unless None, by the target) and the alert the eval raises on them;
    with `tokens_per_step`, the drafter's counts over 100 verify steps in both conventions; with
    `per_pos`, how many of those 100 steps accepted more than i draft tokens; with `served_tau`, a
    served eval's figure on the same prompts. The baselines: the untrained drafter at 1.0, prompt
    lookup at 1.2; 30 tokens/s against target-only decoding's 20."""
    ckpt = jobs_dir / str(run_id) / "checkpoints" / f"step-{step:08d}"
    job = Job(
        kind="eval", params={"checkpoint": str(ckpt), "mode": "greedy"}, status="succeeded", queue="gpu"
    )
    session.add(job)
    session.commit()
    assert job.id is not None
    out = jobs_dir / str(job.id)
    out.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "step": step,
        "heldout_walked_accepted": 1000 * (data_tau - 1),
        "heldout_walked_steps": 1000,
    }
    if target_tau is not None:
        entry |= {
            "heldout_target_walked_accepted": 1000 * (target_tau - 1),
            "heldout_target_walked_steps": 1000,
        }
    training, alarm = versus_training(Real(real_tau, 100), RunFigures(entry), 0.05, 0.10)
    drafter: dict[str, Any] = {"tau_incl_bonus_pooled": real_tau, "tokens_per_s": 30.0}
    if tokens_per_step is not None:
        counts = {"verify_steps": 100, "accepted": round(100 * (real_tau - 1)),
                  "produced_by_steps": round(100 * tokens_per_step)}  # fmt: skip
        drafter |= {"counts": counts, "tokens_per_step": tokens_per_step}
    if per_pos is not None:
        drafter.setdefault("counts", {"verify_steps": 100})["per_pos_accepted_more_than"] = {
            str(i): n for i, n in enumerate(per_pos)
        }
    (out / "eval.json").write_text(
        json.dumps(  # the layout draftdeck/drafter/eval/evaluate.py writes
            {
                "eval": {
                    "methods": {  # the baselines decoded the same prompts
                        "drafter": drafter,
                        "untrained": {"tau_incl_bonus_pooled": 1.0},
                        "prompt_lookup": {"tau_incl_bonus_pooled": 1.2},
                    },
                    "target_only": {"tokens_per_s": 20.0},
                    "walked": {"tau_incl_bonus": real_tau},  # the decoder check: equal
                    "training": training,
                    **({"served": {"tau_incl_bonus": served_tau}} if served_tau is not None else {}),
                }
            }
        )
    )
    if alarm is not None:
        session.add(Alert(job_id=job.id, kind=alarm[0], message=alarm[1]))
        session.commit()
    return job.id
