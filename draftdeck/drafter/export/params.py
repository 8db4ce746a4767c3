"""The `export-drafter` job: a checkpoint (or a train run's best one) in a format servers load: a DFlash
drafter in z-lab's (vLLM `"method": "dflash"`, SGLang `--speculative-algorithm DFLASH`), an EAGLE-3
drafter in speculators' (`vllm serve <dir>` alone) or SGLang's flat one (`--speculative-algorithm
EAGLE3`). Parameters defined once: the run page's Export button, the API and `draftdeck
export-drafter` take the same."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from pydantic import Field

from draftdeck.jobs.params import JobParams

if TYPE_CHECKING:
    from draftdeck.jobs.context import RunContext
    from draftdeck.quality import Report


class ExportParams(JobParams):
    inputs: list[str] = Field(
        min_length=1,
        max_length=1,
        description="a checkpoint folder, or a train run folder (its best checkpoint)",
    )
    out: str | None = Field(
        default=None,
        description="new folder for config.json + model.safetensors (default: in the job's folder)",
    )
    target: str | None = Field(
        default=None,
        description="the target's folder: its tokenizer checks the mask as SGLang resolves it",
    )
    format: Literal["auto", "speculators", "sglang"] = Field(
        default="auto",
        description="auto: z-lab's for DFlash, speculators' for EAGLE-3 (vllm serve <dir> loads it alone);"
        " sglang: EAGLE-3's flat format (midlayer.*), which SGLang and vLLM load",
    )
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("target",)


def run_export(params: ExportParams, ctx: RunContext) -> Report:
    """Export; the report counts the one checkpoint in and out, lists the two files written, and warns
    `served_config` where vLLM or SGLang would read the config otherwise than it was trained."""
    from draftdeck.drafter.export.drafters import export_drafter
    from draftdeck.drafter.export.eagle3 import trained_drafts
    from draftdeck.drafter.export.format import resolve_checkpoint
    from draftdeck.fileio import sha256_file
    from draftdeck.quality import Output, Report

    out = Path(params.out) if params.out else ctx.out_dir / "drafter"
    folder, fmt = export_drafter(Path(params.inputs[0]), out, params.format, params.target)
    drafts = trained_drafts(resolve_checkpoint(Path(params.inputs[0])))
    report = Report(rows_in=1, rows_out=1)
    weights, config = folder / "model.safetensors", folder / "config.json"
    for file in (weights, config):
        report.outputs.append(Output(str(file), 0, file.stat().st_size, sha256_file(file), kind="artifact"))
    ctx.event("info", f"exported {params.inputs[0]} to {folder} in {FORMAT_NAMES[fmt]}")
    served = _readings(folder, fmt, params.target, drafts)
    for reading in served:
        flags = reading.get("flags")
        ctx.event("info", f"{reading['server']}: " + (flags or f"taps hidden_states {reading.get('tapped')}"))
        for problem in reading["problems"]:
            report.warn("served_config", str(config), None, problem)
    report.extra["served"] = served
    report.extra["format"] = fmt
    report.check_accounting()
    return report


FORMAT_NAMES = {
    "zlab": "z-lab's DFlash format",
    "speculators": "speculators' EAGLE-3 format",
    "sglang": "the flat EAGLE-3 format SGLang and vLLM load",
}


def _readings(folder: Path, fmt: str, target: str | None, drafts: int) -> list[dict[str, Any]]:
    """How each server's loader reads the export: its problems, and its launch flags."""
    if fmt == "zlab":
        from draftdeck.drafter.export.servers import read_export

        return [asdict(r) | {"problems": list(r.problems)} for r in read_export(folder, target)]
    from draftdeck.drafter.export.eagle3 import eagle3_readings, launch_flags
    from draftdeck.drafter.model.eagle3_formats import Eagle3Format

    target_config = None
    if target is not None:
        from draftdeck.drafter.train.plan import target_config as read_config

        target_config = read_config(target)
    return [
        {
            **asdict(r),
            "tapped": list(r.tapped),
            "problems": list(r.problems),
            "flags": launch_flags(r.server, folder, cast("Eagle3Format", fmt), target, drafts),
        }
        for r in eagle3_readings(folder, target_config)
    ]
