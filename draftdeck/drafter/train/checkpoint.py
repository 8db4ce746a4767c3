"""Checkpoints written atomically, an index with a best pointer that never moves to a worse one.

Layout under ``<out>/checkpoints/``::

    step-00000100/  model.safetensors   the drafter's state_dict (z-lab's keys)
                    config.json         DrafterConfig.to_hf_dict() (z-lab / vLLM / SGLang config)
                    drafter.json        DrafterConfig.to_dict()
                    training.pt         optimizer, scheduler, RNG states
                    state.json          step, data position, tokens seen, held-out figures
    index.json      {"checkpoints": [{"step", "path", "heldout_walked_accepted", "heldout_walked_steps",
                    "heldout_target_walked_accepted", "heldout_target_walked_steps",
                    "heldout_agreement_tokens", "heldout_agreement_matches",
                    "heldout_agreement_prob_sum"}], "best": step or null}

The best checkpoint is the one with the highest held-out tau judged by the target (the walk over its
own answers: the estimate of real decoding), or judged by the data where that was not measured.

A checkpoint is written into a temporary folder (every file fsynced), then renamed into place and
the parent fsynced; only then is index.json replaced (atomically). A write that fails midway (a
full disk) removes the temporary folder and leaves the previous checkpoint and index untouched.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftdeck.errors import DraftDeckError, InputError
from draftdeck.fileio import atomic_output, load_torch


class CheckpointWriteError(DraftDeckError):
    """A checkpoint could not be written; the previous one is intact."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def bytes_writer(data: bytes) -> Any:
    """A checkpoint file's writer (`CheckpointStore.save`) for bytes in hand."""
    return lambda f: f.write(data)


def torch_writer(obj: Any) -> Any:
    """A checkpoint file's writer for `torch.save` of `obj`."""

    def write(f: Any) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        f.write(buf.getvalue())

    return write


def load_training_state(path: Path) -> dict[str, Any]:
    """A checkpoint's training.pt (optimizer, scheduler, RNG states), read without running code: the
    types it holds are tensors and plain data, and numpy's RNG state (an array, its dtype)."""
    from numpy._core.multiarray import _reconstruct

    allow = [_reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]
    remedy = (
        "resume only from run folders you trust; to train on, start the run again with a new --out (its"
        " model.safetensors holds the weights, read without code)"
    )
    state = load_torch(path, remedy, allow)
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "rng"} <= state.keys():
        raise InputError(f"{path}: not a training state DraftDeck writes (optimizer, scheduler, rng)")
    return state


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Index:
    checkpoints: list[dict[str, Any]]
    best: int | None

    @staticmethod
    def tau(entry: dict[str, Any]) -> float | None:
        """The entry's held-out tau incl. bonus: judged by the target when measured, else by the data."""
        for kind in ("heldout_target_walked", "heldout_walked"):
            steps = entry.get(f"{kind}_steps")
            if steps:
                return 1 + entry[f"{kind}_accepted"] / steps
        return None

    def add(self, entry: dict[str, Any]) -> None:
        """Append, and move `best` only to a strictly better held-out tau (`tau`)."""
        self.checkpoints = [c for c in self.checkpoints if c["step"] != entry["step"]] + [entry]
        new = self.tau(entry)
        if new is None:
            return
        current = next((c for c in self.checkpoints if c["step"] == self.best), None)
        old = self.tau(current) if current else None
        if old is None or new > old:
            self.best = entry["step"]

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoints": self.checkpoints, "best": self.best}


class CheckpointStore:
    def __init__(self, out: Path, keep: int = 3):
        self.dir = Path(out) / "checkpoints"
        self.keep = keep

    @property
    def index_path(self) -> Path:
        return self.dir / "index.json"

    def index(self) -> Index:
        if not self.index_path.is_file():
            return Index([], None)
        d = json.loads(self.index_path.read_text(encoding="utf-8"))
        return Index(list(d["checkpoints"]), d.get("best"))

    def latest(self) -> Path | None:
        idx = self.index()
        if not idx.checkpoints:
            return None
        last = max(idx.checkpoints, key=lambda c: c["step"])
        return self.dir / last["path"]

    def save(
        self,
        step: int,
        files: dict[str, Any],
        heldout: dict[str, float] | None,
    ) -> Path:
        """Write one checkpoint. `files` maps a file name to a callable writing its bytes to a
        binary file object. `heldout`: the held-out figures (`Counts.index_figures`) or None."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / step_name(step)
        tmp = self.dir / f".tmp-{step_name(step)}-{os.getpid()}"
        for stale in self.dir.glob(".tmp-step-*"):  # left by a writer killed mid-write (one writer per run)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.mkdir()
            for name, write in files.items():
                _write(tmp / name, write)
            _fsync_dir(tmp)
            if final.exists():  # a step written before a crash that the index never recorded
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            idx = self.index()
            entry: dict[str, Any] = {"step": step, "path": final.name}
            entry.update(
                heldout if heldout else {"heldout_walked_accepted": None, "heldout_walked_steps": None}
            )
            idx.add(entry)
            self._prune(idx)
            with atomic_output(self.index_path, "w") as f:
                json.dump(idx.to_dict(), f, indent=2)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(
                f"could not write checkpoint {final}: {e}; the previous checkpoint is intact"
            ) from e
        self._remove_pruned(idx)
        return final

    def _prune(self, idx: Index) -> None:
        ordered = sorted(idx.checkpoints, key=lambda c: c["step"])
        keep = {c["step"] for c in ordered[-self.keep :]}
        if idx.best is not None:
            keep.add(idx.best)
        self._pruned = [c for c in ordered if c["step"] not in keep]
        idx.checkpoints = [c for c in ordered if c["step"] in keep]

    def _remove_pruned(self, idx: Index) -> None:
        for c in getattr(self, "_pruned", []):
            shutil.rmtree(self.dir / c["path"], ignore_errors=True)
        self._pruned = []
