"""`convert` itself: inputs to one output file, the policy applied, an empty output always an error."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from draftdeck.convert.options import ConvertOptions
from draftdeck.convert.parallel import write_converted
from draftdeck.convert.reading import read_conversations
from draftdeck.errors import JobFailed, UsageError
from draftdeck.formats.images import IMAGES_DIR
from draftdeck.formats.writers import TARGETS, Writer
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Policy, Report, empty_output


def check_out(inputs: Sequence[Path], out: Path, roots: Sequence[Path] = ()) -> None:
    """Refuse an output that would replace an input, a data root or a folder, before anything runs:
    a convert writing over its own input would destroy the rows it rejected."""
    target = out.expanduser().resolve()
    for path in inputs:
        source = path.expanduser().resolve()
        if target == source or (source.is_dir() and target.is_relative_to(source)):
            raise UsageError(f"{out}: the output is the input {path}; choose a new file")
    if any(target == Path(r).resolve() for r in roots):
        raise UsageError(f"{out}: the output is a data root; choose a file inside it")
    if target.is_dir():
        raise UsageError(f"{out}: the output is an existing folder; give a file name")


def convert(
    inputs: Sequence[Path],
    out: Path,
    to: str,
    policy: Policy | None = None,
    options: ConvertOptions | None = None,
    progress: Progress = no_progress,
    *,
    display_out: str | None = None,
) -> Report:
    """Convert `inputs` into one file `out` of format `to` ("openai", "sharegpt" or "parquet").

    ``options.workers`` > 1 converts large JSONL inputs in that many worker processes (not for
    Parquet output); the output bytes and the report are those of one worker. A JSONL target is
    written through the workers' record path even with one worker (then all in this process): its
    fast path (:mod:`draftdeck.convert.fast`) writes the usual rows without the canonical model.
    Parquet is written from :func:`read_conversations`, whose conversations give the same rows.

    Returns the report when the policy passes. Raises :class:`JobFailed` (carrying the report) when it
    does not, and always when no row was written: then no output file is left behind.
    """
    if to not in TARGETS:
        raise UsageError(f"unknown target format {to!r}; choose one of {', '.join(TARGETS)}")
    if not inputs:
        raise UsageError("no input files given")
    check_out(inputs, out)
    opts = options or ConvertOptions()
    if policy is not None:
        opts.policy = policy
    if opts.images_dir is None:  # kept images are stored once, in images/ beside the output
        opts = replace(opts, images_dir=str(out.expanduser().resolve().parent / IMAGES_DIR))
    pol = opts.policy
    report = Report()
    started = time.monotonic()
    report.extra.update({"to": to, "inputs": [str(p) for p in inputs]})
    writer = Writer(out, to, report)
    with writer:
        if to != "parquet":  # JSONL targets: the record path, whose plain rows skip the canonical model
            write_converted(inputs, writer, report, opts, to, progress)
        else:
            for conv in read_conversations(inputs, report, opts, progress):
                writer.write(conv)
                report.rows_out += 1
        report.check_accounting()
        report.extra["losses"] = pol.losses(report)
        failures = pol.failures(report)
        if failures:
            report.extra["elapsed_s"] = round(time.monotonic() - started, 3)
            raise JobFailed(_failure_message(report, failures, inputs), report)
    assert writer.output is not None
    if display_out:
        writer.output.path = display_out
    report.outputs.append(writer.output)
    report.extra["elapsed_s"] = round(time.monotonic() - started, 3)
    report.check_accounting()
    return report


def _failure_message(report: Report, failures: list, inputs: Sequence[Path]) -> str:
    reasons = "; ".join(f.reason for f in failures[:5])
    if report.rows_out == 0:
        head = empty_output(report, inputs)
        if report.rejected.get("unknown_format"):
            ex = report.examples.get("unknown_format", [])
            if ex:
                head += f"; e.g. {ex[0].reason}"
        return head + "; no output file was written"
    return f"policy failed: {reasons}; no output file was written"
