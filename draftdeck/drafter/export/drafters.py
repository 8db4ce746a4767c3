"""A drafter folder of any kind: loaded by the kind its config.json names (draftdeck.drafter.kinds) and
exported in a format of that kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftdeck.drafter.export.folder import read_config, resolve_checkpoint
from draftdeck.drafter.export.verifier import export_verifier
from draftdeck.drafter.kinds import DrafterKind, kind_of_config
from draftdeck.errors import UsageError


def folder_kind(folder: Path) -> DrafterKind:
    """The kind of the drafter in a checkpoint or export folder."""
    return kind_of_config(read_config(folder), Path(folder) / "config.json")


def load_drafter(checkpoint: Path, *, device: Any = "cpu") -> Any:
    """A drafter from a checkpoint, an export, or a train run folder (its best checkpoint), of the kind
    its config.json names, in eval mode on `device`."""
    folder = resolve_checkpoint(checkpoint)
    return folder_kind(folder).load(folder, device)


def export_drafter(
    checkpoint_dir: Path, out_dir: Path, fmt: str = "auto", target: str | None = None
) -> tuple[Path, str]:
    """Export a checkpoint (or a train run's best) to `out_dir` (atomically) in `fmt`, one of its kind's
    formats (auto: its first). Where a format names the verifier it is `target`, else the target of the
    run the checkpoint came from (draftdeck.drafter.export.verifier). Returns the folder and the format
    written."""
    folder = resolve_checkpoint(checkpoint_dir)
    kind = folder_kind(folder)
    chosen = kind.formats[0] if fmt == "auto" else fmt
    if chosen not in kind.formats:
        raise UsageError(
            f"format {fmt}: a {kind.title} drafter exports as {' or '.join(kind.formats)} (auto)"
        )
    verifier = export_verifier(Path(checkpoint_dir), folder, target, kind, chosen)
    return kind.export(kind.load(folder), out_dir, chosen, verifier), chosen
