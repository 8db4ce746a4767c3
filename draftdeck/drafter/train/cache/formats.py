"""The field's offline files, both ways: speculators' and vLLM's ``hidden_states/hs_<i>.safetensors``
(one per sample: ``hidden_states`` [tokens, layers, hidden], the tapped layers in order then the last,
and ``token_ids`` [tokens]; speculators/data_generation/offline.py checks them on load).

`write_speculators` writes a cache's rows so (row i of the datasets, in order, is ``hs_<i>``);
`import_speculators` takes such a folder in as a cache: the files' layers (`stored_layers`, HF
``hidden_states`` indices in file order, as speculators' launch config names them) mapped to the
cache's order, refused with the reason when a chosen kind's layers or the final layer are not there,
every row checked as a built one is and the first rows compared with a live forward of the target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.cache.build import (
    announce,
    dataset_rows,
    fill,
    kind_layer_ids,
    manifest_for,
    sized,
)
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.errors import UsageError
from draftdeck.hidden.store import HiddenCache
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Report

FOLDER = "hidden_states"


def write_speculators(cache: Path, paths: list[Path]) -> int:
    """``<cache>/hidden_states/hs_<i>.safetensors`` for every cached row; the files written."""
    from safetensors.torch import save_file

    c = HiddenCache(cache)
    folder = cache / FOLDER
    folder.mkdir(exist_ok=True)
    n = 0
    for index, (di, row, _) in enumerate(dataset_rows(paths, c.mf.seq_length)):
        e = c.by_row.get((di, row))
        if e is None:
            continue  # left out by the policy: counted in the report
        tensors = {"hidden_states": c.hidden(e).contiguous(), "token_ids": c.ids(e).long().contiguous()}
        save_file(tensors, str(folder / f"hs_{index}.safetensors"))
        n += 1
    return n


def import_speculators(params: CacheParams, ctx: RunContext) -> Report:
    from draftdeck.causal_lm import causal_lm_config

    assert params.import_from is not None and params.stored_layers is not None  # the params' validator
    src = Path(params.import_from)
    folder = src / FOLDER if (src / FOLDER).is_dir() else src
    config = causal_lm_config(params.target)
    final, hidden = int(config.num_hidden_layers), int(config.hidden_size)
    file_layers = list(params.stored_layers)
    if final not in file_layers:
        raise UsageError(
            f"stored_layers {file_layers}: the final layer (hidden_states[{final}]) is not among them; the"
            " losses read it (speculators stores it last)"
        )
    wanted = [i + 1 for i in kind_layer_ids(params, config)]
    missing = sorted(set(wanted) - set(file_layers))
    if missing:
        raise UsageError(
            f"{src}: drafter {' and '.join(params.drafter)} reads hidden_states {missing}, which the files do"
            f" not hold (they hold {file_layers}): import for the kinds they serve (--drafter), or regenerate"
        )
    layers = [*sorted(set(file_layers) - {final}), final]
    order = [file_layers.index(j) for j in layers]  # the files' slots, in the cache's order
    plan = sized(params.inputs, params.seq_length, layers, hidden, params.dtype)
    absent = [i for i in range(plan.rows) if not (folder / f"hs_{i}.safetensors").is_file()]
    if absent:
        raise UsageError(
            f"{folder}: {len(absent)} of {plan.rows} rows have no hs_<i>.safetensors (first: {absent[:5]})"
        )
    announce(ctx, Path(params.out), plan)
    target = Target.load(params.target) if params.check_rows else None  # the live check's forward
    mf = manifest_for(params, final, hidden, layers)
    mf.source = f"imported from {src} (stored_layers {file_layers})"

    def read(index: int, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file

        data = load_file(str(folder / f"hs_{index}.safetensors"))
        hs, got = data.get("hidden_states"), data.get("token_ids")
        if hs is None or got is None:
            raise UsageError(f"{folder}/hs_{index}.safetensors: no hidden_states or token_ids")
        if hs.dim() == 3 and hs.shape[1] == len(file_layers):
            hs = hs[:, order]
        return hs, got

    return fill(params, ctx, plan, mf, target, read)
