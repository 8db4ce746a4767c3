"""The target checkpoint's own MTP layer: read from its folder (`from_target`), and written back into a
copy of it with the fine-tuned weights (`stitch`: every other tensor byte for byte the original's,
checked before the folder is published; speculators' `stitch-mtp` and SpecForge's
`merge_mtp_to_base.py` do the same job).

A checkpoint is one `model.safetensors` or shards named by `model.safetensors.index.json`; its `mtp.*`
tensors are read alone (the rest of a large target is never loaded)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.export.folder import CheckpointError
from draftdeck.drafter.kinds.mtp.model import MTPConfig, MTPDrafter, mtp_layer_count, native, ours
from draftdeck.drafter.model.config import DrafterConfigError
from draftdeck.errors import UsageError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PREFIX = "mtp."


def weight_files(folder: Path) -> dict[str, str]:
    """Every tensor name of a checkpoint folder -> the safetensors file holding it."""
    index = folder / INDEX
    if index.is_file():
        return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    single = folder / SINGLE
    if not single.is_file():
        raise CheckpointError(f"{folder}: no {SINGLE} or {INDEX}")
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), SINGLE)


def no_mtp_message(folder: Path | str, why: str) -> str:
    """The refusal of a target without MTP layers, naming the kinds that need none."""
    from draftdeck.drafter.kinds import NAMES

    others = ", ".join(n for n in NAMES if n != "mtp")
    return (
        f"--drafter mtp fine-tunes the target's own MTP layer, and {folder} has none ({why}): train one"
        f" of the kinds that need none instead ({others})"
    )


def target_mtp_state(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's `mtp.*` tensors under their own names (UsageError when it has none)."""
    from safetensors import safe_open

    files = weight_files(folder)
    names = sorted(n for n in files if n.startswith(PREFIX))
    if not names:
        raise UsageError(no_mtp_message(folder, "no mtp.* weights in its checkpoint"))
    state: dict[str, torch.Tensor] = {}
    for file in sorted({files[n] for n in names}):
        with safe_open(str(folder / file), "pt") as f:
            state.update({n: f.get_tensor(n) for n in names if files[n] == file})
    return state


def from_target(folder: Path | str, target_config: Any) -> MTPDrafter:
    """The target's MTP layer as it ships (UsageError naming the kinds that need none when the target
    has no MTP layer)."""
    folder = Path(folder)
    if mtp_layer_count(target_config) == 0:
        raise UsageError(no_mtp_message(folder, "its config declares no mtp_num_hidden_layers"))
    try:
        drafter = MTPDrafter(MTPConfig.from_target(target_config))
    except DrafterConfigError as e:
        raise UsageError(f"--drafter mtp: {folder}: {e}") from e
    drafter.verifier = str(folder)
    return load_into(drafter, folder)


def load_into(drafter: MTPDrafter, folder: Path) -> MTPDrafter:
    """`drafter` with the MTP layer of the checkpoint in `folder`: every weight of the layer read,
    none left over, in float32."""
    state = target_mtp_state(folder)
    try:
        renamed = {ours(k): v for k, v in state.items()}
    except KeyError as e:
        raise UsageError(f"--drafter mtp: {folder}: {e.args[0]} (one MTP layer, Qwen3.5's names)") from e
    missing, unexpected = drafter.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise UsageError(
            f"--drafter mtp: {folder}: its MTP layer does not match its config: missing"
            f" {sorted(native(k) for k in missing)}, unexpected {sorted(native(k) for k in unexpected)}"
        )
    return drafter.float()


# the files of a model folder that are not its weights: copied as they are
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def stitch(drafter: MTPDrafter, verifier: Path, out: Path) -> Path:
    """A copy of the `verifier` folder with `drafter`'s weights as its `mtp.*` tensors (in the
    original's dtype), every other file copied and every other tensor checked byte for byte equal to
    the original's; written beside `out` and moved there when checked (replacing what `out` held)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    verifier, out = Path(verifier), Path(out)
    files = weight_files(verifier)
    new = {native(k): v.detach().cpu() for k, v in drafter.state_dict().items()}
    absent = sorted(set(new) - set(files))
    if absent:
        raise CheckpointError(f"{verifier}: the fine-tuned layer's {absent} are not in its checkpoint")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for item in verifier.iterdir():  # config, tokenizer, generation config, the index: as they are
        if item.is_file() and item.name not in set(files.values()):
            shutil.copy2(item, work / item.name)
    for file in sorted(set(files.values())):
        with safe_open(str(verifier / file), "pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle)
        for k in tensors:
            if k in new:
                if new[k].shape != tensors[k].shape:
                    raise CheckpointError(
                        f"{k}: fine-tuned {tuple(new[k].shape)}, the verifier's {tuple(tensors[k].shape)}"
                    )
                tensors[k] = new[k].to(tensors[k].dtype).contiguous()
        save_file(tensors, str(work / file), metadata=metadata)
    problems = stitched_differences(verifier, work)
    if problems:
        shutil.rmtree(work)
        raise CheckpointError(
            f"the stitched checkpoint differs from {verifier} outside mtp.*: {problems[:5]}"
        )
    if out.exists():  # an earlier export (or the job's empty folder): replaced whole, as write_folder does
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        shutil.rmtree(old)
    os.replace(work, out)
    return out


def stitched_differences(original: Path, stitched: Path) -> list[str]:
    """What differs between two checkpoints outside `mtp.*`: a tensor's name, dtype, shape or bytes
    (empty: only the MTP layer differs)."""
    from safetensors import safe_open

    mine, theirs = weight_files(original), weight_files(stitched)
    problems = [f"{k}: only in one" for k in sorted(set(mine) ^ set(theirs))]
    shared = sorted(k for k in set(mine) & set(theirs) if not k.startswith(PREFIX))
    for a_file, b_file in sorted({(mine[k], theirs[k]) for k in shared}):
        with safe_open(str(original / a_file), "pt") as a, safe_open(str(stitched / b_file), "pt") as b:
            for k in (k for k in shared if (mine[k], theirs[k]) == (a_file, b_file)):
                x, y = a.get_tensor(k), b.get_tensor(k)
                same = x.dtype == y.dtype and x.shape == y.shape
                if not (
                    same and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
                ):
                    problems.append(f"{k}: not byte-identical")
    return problems
