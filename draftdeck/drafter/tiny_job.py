"""The `tiny-target` kind: a tiny trained target to try the whole path on a CPU (a tokenizer, a Qwen3
or Qwen3.5/3.6-hybrid causal LM trained on demo conversations, and held-out prompts), as a job with
progress, so the dashboard shows it being built (`draftdeck demo` runs it once per home and size)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from draftdeck.jobs.params import JobParams

if TYPE_CHECKING:
    from draftdeck.jobs.context import RunContext
    from draftdeck.quality import Report

READY = "ready"  # written last: a folder without it is a build that did not finish


class TinyTargetParams(JobParams):
    out: str | None = Field(
        default=None,
        title="Folder",
        description="new folder for tokenizer/, target/ and prompts.jsonl (default: in the job's folder)",
    )
    arch: Literal["qwen3", "qwen3_5"] = Field(
        default="qwen3", description="Qwen3, or the Qwen3.5/3.6 hybrid (Gated DeltaNet + gated attention)"
    )
    target_steps: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="training steps of the target (about 4 a second on a CPU core)",
    )
    prompts: int = Field(default=160, ge=1, le=1_000_000, description="distinct held-out prompts to write")
    seed: int = Field(default=0, ge=0, description="seed of the tokenizer's text, the target and the prompts")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("arch", "target_steps", "prompts")


def is_built(folder: Path) -> bool:
    return (folder / READY).is_file()


def run_tiny_target(params: TinyTargetParams, ctx: RunContext) -> Report:
    """Build into `out` (emptied first: a build that did not finish leaves nothing to trust); the
    progress is the target's training steps. The report counts the prompts written."""
    from draftdeck.drafter.tiny import build_tiny_demo
    from draftdeck.fileio import sha256_file
    from draftdeck.quality import Output, Report

    out = Path(params.out) if params.out else ctx.out_dir / "tiny-target"
    shutil.rmtree(out, ignore_errors=True)

    def progress(step: int, steps: int) -> None:
        ctx.progress(step, steps, "steps")
        ctx.check_cancelled()

    ctx.event("info", f"building a tiny {params.arch} target in {out} ({params.target_steps} training steps)")
    world = build_tiny_demo(
        out, target_steps=params.target_steps, n_prompts=params.prompts, seed=params.seed, arch=params.arch,
        log=lambda line: ctx.event("info", line), progress=progress,
    )  # fmt: skip
    (out / READY).write_text("built\n", encoding="utf-8")
    report = Report(rows_in=params.prompts, rows_out=params.prompts)
    report.outputs.append(
        Output(str(world.prompts), params.prompts, world.prompts.stat().st_size, sha256_file(world.prompts))
    )
    weights = world.target_dir / "model.safetensors"
    report.outputs.append(
        Output(str(weights), 0, weights.stat().st_size, sha256_file(weights), kind="artifact")
    )
    report.extra = {
        "target": str(world.target_dir),
        "tokenizer": str(world.tokenizer_dir),
        "arch": params.arch,
    }
    return report
