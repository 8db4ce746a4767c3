"""A drafter folder, whatever its kind: a `config.json` and a `model.safetensors`, written atomically (the
folder is assembled under a temporary name beside the destination and renamed into place, so a reader
sees the old export or the new one, never half of one), and the checkpoint a path names (a checkpoint
folder, or a train run's best)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from draftdeck.errors import UsageError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


class CheckpointError(UsageError):
    """A drafter folder that cannot be read (missing files, a config of no known kind, keys that differ)."""


def read_config(folder: Path) -> dict[str, Any]:
    """A drafter folder's config.json, as a mapping."""
    path = Path(folder) / CONFIG
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from e
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path}: a JSON object expected, not {type(hf).__name__}")
    return hf


def write_folder(out_dir: Path, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> Path:
    """`state` as model.safetensors and `config` as config.json in `out_dir`, atomically (module doc)."""
    from safetensors.torch import save_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def resolve_checkpoint(path: Path) -> Path:
    """The drafter folder `path` names: a checkpoint (config.json + model.safetensors, what the
    trainer writes per step and what `export_drafter` writes), or a train run folder / its
    `checkpoints/` folder, resolved to the best checkpoint by held-out tau (else the latest)."""
    from draftdeck.drafter.train.checkpoint import CheckpointStore

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: the checkpoint folder does not exist")
    if (path / CONFIG).is_file():
        return path
    run = path.parent if path.name == "checkpoints" else path
    store = CheckpointStore(run)
    if not store.index_path.is_file():
        raise CheckpointError(
            f"{path}: neither a drafter checkpoint (no {CONFIG}) nor a train run (no checkpoints/index.json)"
        )
    idx = store.index()
    entry = next((c for c in idx.checkpoints if c["step"] == idx.best), None)
    if entry is not None:
        return store.dir / entry["path"]
    latest = store.latest()
    if latest is None:
        raise CheckpointError(f"{store.index_path}: the run has no checkpoint yet")
    return latest
