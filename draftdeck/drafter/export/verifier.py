"""The target an export names as its verifier: the one given (`--target`), else the one the train run's
record names (run.json in the run folder the checkpoint came from), with the `architectures` of its
config.json. A format whose config names the verifier (speculators': `vllm serve <dir>` serves it and
speculators' `from_pretrained` loads it) is refused an export that could name none: a config with
`name_or_path: null` launches nothing, and speculators would try to download a verifier of no name."""

from __future__ import annotations

import json
from pathlib import Path

from draftdeck.drafter.export.folder import CONFIG
from draftdeck.drafter.kinds.base import DrafterKind, Verifier
from draftdeck.errors import UsageError

RUN_RECORD = "run.json"


def run_record_of(given: Path, checkpoint: Path) -> Path | None:
    """The run.json of the train run that `given` (a run folder, its checkpoints/ folder, or one of its
    checkpoints) names, whose best checkpoint or itself is `checkpoint`; None for a folder of no run
    (an export, a checkpoint copied elsewhere)."""
    given = Path(given)
    candidates = [given, given.parent] if given.name == "checkpoints" else [given]
    if checkpoint.parent.name == "checkpoints":  # <run>/checkpoints/step-N
        candidates.append(checkpoint.parent.parent)
    for folder in candidates:
        if (folder / RUN_RECORD).is_file():
            return folder / RUN_RECORD
    return None


def recorded_target(record: Path) -> str | None:
    """The target a run record names."""
    try:
        target = json.loads(record.read_text(encoding="utf-8")).get("target")
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"{record}: cannot read the run's record: {e}") from e
    return str(target) if target else None


def architectures_of(target: str) -> tuple[str, ...]:
    """The `architectures` of a target folder's config.json (none when it has no readable one)."""
    path = Path(target) / CONFIG
    try:
        names = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def export_verifier(
    given: Path, checkpoint: Path, target: str | None, kind: DrafterKind, fmt: str
) -> Verifier | None:
    """The verifier an export of `checkpoint` (named by the user as `given`) in `fmt` names: `target`
    when given, else the run record's target. Refused (UsageError naming the flag to add) when `fmt`
    names a verifier and none is known, or the record's target is not on this machine. None when the
    format names none and no target is known (its launch lines then say <target>)."""
    names = fmt in kind.verifier_formats
    if target is not None:
        return Verifier(target, architectures_of(target))
    record = run_record_of(given, checkpoint)
    recorded = recorded_target(record) if record is not None else None
    what = f"{kind.format_names.get(fmt, fmt)} names the target as its verifier"
    if recorded is not None and Path(recorded).is_dir():
        return Verifier(recorded, architectures_of(recorded))
    if not names:
        return None
    if recorded is not None:
        raise UsageError(
            f"{record} names the target {recorded}, which is not a folder here, and {what} (what `vllm"
            " serve <dir>` serves and speculators loads): add --target with the target's folder"
        )
    raise UsageError(
        f"{given}: {what} (what `vllm serve <dir>` serves and speculators loads), and no run record"
        f" ({RUN_RECORD} of the train run) beside this checkpoint names one: add --target with the"
        " target's folder"
    )
