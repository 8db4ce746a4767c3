"""SpecForge's offline records (its ``scripts/prepare_hidden_states.py``) read as cache rows.

The layout, as SpecForge writes it (read at its commit a6b6b02, August 2026): one file per dataset
row ``<out>/rows_<g>-<g + N>/data_<i>.ckpt`` (``.ckpt.gz`` with ``--compress``: gzip around the same
bytes), ``i`` the row's index in the dataset, ``N`` the group size (2,000). Each file is a dict of
tensors written by ``torch.save``, its keys chosen by ``--strategy``:

- ``eagle3``: ``input_ids`` [T], ``loss_mask`` [T], ``aux_hidden_state`` [1, T, k x hidden] (the
  capture layers' states concatenated along the last axis in capture order: SGLang's capture of layer
  ``j`` is decoder layer ``j``'s output, HF ``hidden_states[j + 1]``) and ``hidden_state`` [1, T,
  hidden] (the final layer after the norm: SpecForge's target head is the LM head alone over it).
- ``dflash`` (and ``domino``, ``dspark``): ``input_ids``, ``loss_mask`` and ``hidden_states``
  [1, T, k x hidden] or [T, k x hidden] (the draft config's ``target_layer_ids``, concatenated the same
  way); no final state, which DraftDeck's losses read (the LM head over it): such records are refused
  with that reason.

A record is read with ``torch.load(weights_only=True)``: tensors and plain containers only, never
arbitrary pickled code (a record that needs more is refused, not run). ``loss_mask`` is not read: the
dataset's own loss mask is the one training uses; ``input_ids`` are checked against the dataset's."""

from __future__ import annotations

import gzip
import io
import pickle
import re
from pathlib import Path

import torch

from draftdeck.errors import UsageError

RECORD = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
AUX_KEYS = ("aux_hidden_state", "hidden_states")  # eagle3's, then the DFlash family's
FINAL_KEY = "hidden_state"  # eagle3's final layer; the DFlash family's records have none


def find_records(folder: Path) -> dict[int, Path]:
    """Each dataset row's record under `folder` (its rows_* groups, or the folder itself), by index."""
    found: dict[int, Path] = {}
    for path in sorted(Path(folder).rglob("data_*.ckpt*")):
        m = RECORD.match(path.name)
        if m is None:
            continue
        i = int(m.group(1))
        if i in found:
            raise UsageError(f"{folder}: row {i} has two records ({found[i].name} and {path.name})")
        found[i] = path
    return found


def load_record(path: Path) -> dict[str, torch.Tensor]:
    """One record's tensors, unpickled with weights_only=True (tensors and plain containers alone)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(
            f"{path}: not a SpecForge record of tensors (read with weights_only=True, which unpickles no"
            f" code): {first}"
        ) from e
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise UsageError(f"{path}: not a dict of tensors, as SpecForge's records are")
    return data


def record_layers(data: dict[str, torch.Tensor], hidden: int, where: Path) -> tuple[torch.Tensor, bool]:
    """([T, layers, hidden] in the record's order: the concatenated layers, then the final one when
    the record has it; whether it has it)."""
    aux_key = next((k for k in AUX_KEYS if k in data), None)
    if aux_key is None or "input_ids" not in data:
        raise UsageError(f"{where}: no input_ids or {' / '.join(AUX_KEYS)} (keys: {sorted(data)})")
    aux = data[aux_key]
    aux = aux[0] if aux.dim() == 3 and aux.shape[0] == 1 else aux
    if aux.dim() != 2 or aux.shape[1] % hidden:
        raise UsageError(
            f"{where}: {aux_key} of shape {tuple(data[aux_key].shape)}, not [1, T, k x {hidden}]"
        )
    layers = [aux.reshape(aux.shape[0], -1, hidden)]
    final = data.get(FINAL_KEY) if aux_key != FINAL_KEY else None
    if final is not None:
        final = final[0] if final.dim() == 3 and final.shape[0] == 1 else final
        if tuple(final.shape) != (aux.shape[0], hidden):
            raise UsageError(
                f"{where}: {FINAL_KEY} of shape {tuple(data[FINAL_KEY].shape)}, not [1, T, {hidden}]"
            )
        layers.append(final[:, None])
    return torch.cat(layers, dim=1), final is not None


def check_first(path: Path, file_layers: list[int], final: int, hidden: int) -> None:
    """The first record against `file_layers` (HF hidden_states indices of its layers in file order):
    as many layers as it holds, and the final layer there (a DFlash-family record has none: refused,
    saying so)."""
    data = load_record(path)
    states, has_final = record_layers(data, hidden, path)
    if not has_final:
        raise UsageError(
            f"{path}: a SpecForge DFlash-family record ({', '.join(sorted(data))}): it holds no final hidden"
            f" state (hidden_states[{final}], after the norm), which the losses read through the LM head;"
            " prepare the records with --strategy eagle3 (its hidden_state is the final layer), or build"
            " the cache here with cache-hidden"
        )
    if states.shape[1] != len(file_layers):
        raise UsageError(
            f"{path}: the record holds {states.shape[1]} layers ({states.shape[1] - 1} concatenated in"
            f" aux_hidden_state, then hidden_state), stored_layers names {len(file_layers)}: {file_layers}"
        )
    if file_layers[-1] != final:
        raise UsageError(
            f"stored_layers {file_layers}: a SpecForge record's last layer is its hidden_state, the final"
            f" layer (hidden_states[{final}]): name it last"
        )


def read_row(path: Path, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([T, layers, hidden] in the record's layer order, the record's input_ids)."""
    data = load_record(path)
    states, _ = record_layers(data, hidden, path)
    return states, data["input_ids"].reshape(-1)
