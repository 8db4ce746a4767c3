"""A drafter folder of either kind: loaded by what its config.json says (DFlash's `dflash_config`, else
one of EAGLE-3's two formats) and exported in a format of its kind. Above both formats' modules
(`format` for z-lab's DFlash, `eagle3` for EAGLE-3's), which know nothing of each other."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftdeck.drafter.export.eagle3 import load_eagle3, save_eagle3
from draftdeck.drafter.export.format import CONFIG, CheckpointError, load_zlab, resolve_checkpoint, save_zlab
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.model.eagle3 import Eagle3Drafter
from draftdeck.drafter.model.eagle3_formats import FORMATS
from draftdeck.errors import UsageError


def load_drafter(checkpoint: Path, *, device: str | torch.device = "cpu") -> DFlashDrafter | Eagle3Drafter:
    """A drafter from a checkpoint, an export, or a train run folder (its best checkpoint): DFlash
    (a `dflash_config`) or EAGLE-3 (either format `draftdeck.drafter.export.eagle3` writes)."""
    folder = resolve_checkpoint(checkpoint)
    if is_dflash(folder):
        return load_zlab(folder, device=device)
    return load_eagle3(folder).to(device).eval()


def is_dflash(folder: Path) -> bool:
    """Whether a drafter folder's config.json is DFlash's (else it is read as EAGLE-3's)."""
    try:
        hf = json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / CONFIG}: cannot read: {e}") from e
    return isinstance(hf, dict) and "dflash_config" in hf


def export_drafter(
    checkpoint_dir: Path, out_dir: Path, fmt: str = "auto", verifier: str | None = None
) -> tuple[Path, str]:
    """Export a checkpoint (or a train run's best) to `out_dir` (atomically): a DFlash drafter in
    z-lab's format; an EAGLE-3 drafter in `fmt`, speculators' (auto) or SGLang's flat one, `verifier`
    the target named in speculators' config. Returns the folder and the format written."""
    drafter = load_drafter(checkpoint_dir)
    if isinstance(drafter, DFlashDrafter):
        if fmt not in ("auto", "zlab"):
            raise UsageError(f"format {fmt}: a DFlash drafter exports in z-lab's format (auto)")
        return save_zlab(drafter, out_dir), "zlab"
    chosen = "speculators" if fmt == "auto" else fmt
    if chosen not in FORMATS:
        raise UsageError(f"format {fmt}: an EAGLE-3 drafter exports as {' or '.join(FORMATS)}")
    return save_eagle3(drafter, out_dir, chosen, verifier), chosen  # type: ignore[arg-type]
