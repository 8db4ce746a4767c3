"""The `export-drafter` job: a checkpoint (or a train run's best one) in z-lab's DFlash format, which vLLM
(`"method": "dflash"`) and SGLang (`--speculative-algorithm DFLASH`) load. Parameters defined once:
the run page's Export button, the API and `draftdeck export-drafter` take the same."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

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
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("target",)


def run_export(params: ExportParams, ctx: RunContext) -> Report:
    """Export; the report counts the one checkpoint in and out, lists the two files written, and warns
    `served_config` where vLLM or SGLang would read the config otherwise than it was trained."""
    from draftdeck.drafter.export.format import export_drafter
    from draftdeck.drafter.export.servers import read_export
    from draftdeck.fileio import sha256_file
    from draftdeck.quality import Output, Report

    out = Path(params.out) if params.out else ctx.out_dir / "drafter"
    folder = export_drafter(Path(params.inputs[0]), out)
    report = Report(rows_in=1, rows_out=1)
    weights, config = folder / "model.safetensors", folder / "config.json"
    for file in (weights, config):
        report.outputs.append(Output(str(file), 0, file.stat().st_size, sha256_file(file), kind="artifact"))
    ctx.event("info", f"exported {params.inputs[0]} to {folder} (z-lab DFlash format)")
    served = read_export(folder, params.target)
    for reading in served:
        ctx.event("info", f"{reading.server} ({reading.source}): {reading.flags}")
        for problem in reading.problems:
            report.warn("served_config", str(config), None, problem)
    report.extra["served"] = [asdict(r) for r in served]
    report.check_accounting()
    return report
