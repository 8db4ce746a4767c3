"""The `export-drafter` job: a checkpoint (or a train run's best one) in a format servers load: a DFlash
drafter in z-lab's (vLLM `"method": "dflash"`, SGLang `--speculative-algorithm DFLASH`), an EAGLE-3
drafter in speculators' (`vllm serve <dir>` alone) or SGLang's flat one (`--speculative-algorithm
EAGLE3`). Parameters defined once: the run page's Export button, the API and `draftdeck
export-drafter` take the same."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

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
        description="the target's folder (default: the one the train run's record names): the verifier"
        " speculators' format names, and its tokenizer checks the mask as SGLang resolves it",
    )
    format: Literal["auto", "speculators", "sglang", "stitched"] = Field(
        default="auto",
        description="auto: z-lab's for DFlash, speculators' for EAGLE-3 (vllm serve <dir> loads it alone),"
        " stitched for MTP; sglang: EAGLE-3's flat format (midlayer.*), which SGLang and vLLM load;"
        " stitched: MTP's fine-tuned mtp.* written into a copy of the target's checkpoint",
    )
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("target",)


def run_export(params: ExportParams, ctx: RunContext) -> Report:
    """Export; the report counts the one checkpoint in and out, lists the two files written, and warns
    `served_config` where vLLM or SGLang would read the config otherwise than it was trained."""
    from draftdeck.drafter.export.drafters import export_drafter, folder_kind
    from draftdeck.drafter.export.folder import read_config, resolve_checkpoint
    from draftdeck.drafter.export.verifier import export_verifier
    from draftdeck.fileio import sha256_file
    from draftdeck.quality import Output, Report

    out = Path(params.out) if params.out else ctx.out_dir / "drafter"
    folder, fmt = export_drafter(Path(params.inputs[0]), out, params.format, params.target)
    checkpoint = resolve_checkpoint(Path(params.inputs[0]))
    kind = folder_kind(checkpoint)
    # the target given, or the run's (the export named it where its format names one): the launch lines
    verifier = export_verifier(Path(params.inputs[0]), checkpoint, params.target, kind, fmt)
    target = verifier.name_or_path if verifier else None
    block = kind.verify_block(checkpoint, read_config(checkpoint))
    report = Report(rows_in=1, rows_out=1)
    weights, config = folder / "model.safetensors", folder / "config.json"
    for file in (weights, config):
        report.outputs.append(Output(str(file), 0, file.stat().st_size, sha256_file(file), kind="artifact"))
    ctx.event("info", f"exported {params.inputs[0]} to {folder} in {kind.format_names[fmt]}")
    if verifier and params.target is None:
        ctx.event("info", f"the target: {target} (the run's record names it)")
    served = kind.served(folder, fmt, target, block)
    for reading in served:
        flags = reading.get("flags")
        ctx.event("info", f"{reading['server']}: " + (flags or f"taps hidden_states {reading.get('tapped')}"))
        for problem in reading["problems"]:
            report.warn("served_config", str(config), None, problem)
    report.extra["served"] = served
    # what the drafter was trained on (text, or text + images), and a VLM target's serving flags
    from draftdeck.drafter.export.verifier import run_record_of
    from draftdeck.drafter.export.vision import trained_on, vlm_serving_lines, write_trained_on

    record = trained_on(run_record_of(Path(params.inputs[0]), checkpoint))
    if record is not None:
        write_trained_on(folder, record)
        ctx.event("info", f"trained on {record['data']} ({record['rows_with_images']} rows with images)")
    report.extra["trained_on"] = record
    report.extra["vlm_serving"] = vlm_serving_lines(target)
    report.extra["format"] = fmt
    report.extra["drafter"] = kind.name
    report.extra["target"] = target
    report.check_accounting()
    return report
