"""The target as a run from a hidden-state cache sees it (`--hidden-states CACHE`): its embedding and
LM head in memory, its decoder layers not loaded; `teacher_forced` and `context_features` serve the
cached hidden states of each unpadded row of the micro-batch (looked up by its token ids, so that any
batch, order or rank finds its rows), the logits from the head over the cached final hidden state.

The cache holds each row's forward alone: a micro-batch of rows of one length gets bit-equal
features at fp32 on the CPU; a padded one gets each row's unpadded forward, which differs from the
padded forward by the kernels' rounding (about 1e-6 at fp32)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftdeck.causal_lm import LANGUAGE_MODEL_KEYS, ModelFolderError, causal_lm_config
from draftdeck.drafter.model.target import Target, TargetPass
from draftdeck.hidden.checks import row_issues
from draftdeck.hidden.store import CacheError, HiddenCache, row_key
from draftdeck.provenance import model_fingerprint

# what a run from the cache says at its start: its truth_rows is 0 when not given (TrainParams)
NO_TRUTH_FROM_CACHE = (
    "truth_rows 0: a run from a hidden-state cache has no target decoder layers to check target agreement"
    " or answer held-out prompts, so the tau judged by the target is not measured (the held-out tau judged"
    " by the data is)"
)


class HeadOnly(nn.Module):
    """What a run from the cache keeps of the target: its config, embedding and LM head."""

    def __init__(self, config: Any, embedding: nn.Embedding, head: nn.Linear, generation_config: Any):
        super().__init__()
        self.config, self.generation_config = config, generation_config
        self.embed_tokens, self.lm_head = embedding, head

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def _weights(folder: Path, wanted: set[str]) -> dict[str, torch.Tensor]:
    """The tensors `wanted` (the causal LM's names) from the folder's safetensors files, read alone."""
    from safetensors import safe_open

    got: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                name = key
                for pattern, repl in LANGUAGE_MODEL_KEYS.items():
                    name = re.sub(pattern, repl, name)
                if name in wanted:
                    got[name] = f.get_tensor(key)
    return got


def load_head_only(folder: Path, device: torch.device | str, dtype: torch.dtype | None) -> HeadOnly:
    """The target's embedding and head from `folder` without its decoder layers (built on the meta
    device to learn their names, then only those two tensors read)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = causal_lm_config(folder)
    with torch.device("meta"):
        whole = AutoModelForCausalLM.from_config(config)
    names = {id(m): n for n, m in whole.named_modules()}
    emb, head = whole.get_input_embeddings(), whole.get_output_embeddings()
    if type(emb) is not nn.Embedding or type(head) is not nn.Linear:
        raise ModelFolderError(
            f"{folder}: {type(emb).__name__} / {type(head).__name__}: a run from a hidden-state cache reads"
            " targets with a plain embedding and linear head"
        )
    e_name, h_name = names[id(emb)] + ".weight", names[id(head)] + ".weight"
    got = _weights(folder, {e_name, h_name})
    if e_name not in got:
        raise ModelFolderError(f"{folder}: no {e_name} in its safetensors files")
    if h_name not in got and not getattr(config.get_text_config(), "tie_word_embeddings", False):
        raise ModelFolderError(f"{folder}: no {h_name} in its safetensors files and the head is not tied")
    w = got[e_name].to(device, dtype or got[e_name].dtype)
    embedding = nn.Embedding(w.shape[0], w.shape[1], _weight=w)
    hw = got[h_name].to(device, w.dtype) if h_name in got else w
    lm_head = nn.Linear(hw.shape[1], hw.shape[0], bias=False, device=device, dtype=w.dtype)
    lm_head.weight = nn.Parameter(hw, requires_grad=False)
    try:
        gen = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except OSError:
        gen = GenerationConfig.from_model_config(config)
    return HeadOnly(config, embedding, lm_head, gen)


class CachedTarget(Target):
    """A `Target` whose forward is the cache's (`HiddenCache`)."""

    def __init__(self, model: nn.Module, cache: HiddenCache, folder: Path, tokenizer: Any):
        super().__init__(
            model, folder, tokenizer, loaded="embedding and LM head (hidden states from the cache)"
        )
        self.cache = cache

    @classmethod
    def open(
        cls, cache: str | Path, folder: str | Path, *, device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> CachedTarget:  # fmt: skip
        """The cache of `folder`'s target: refused, before anything else is read, when it was built
        from another target (its fingerprint)."""
        from transformers import AutoTokenizer

        folder = Path(folder)
        c = HiddenCache(cache)
        have = model_fingerprint(folder)
        if c.mf.target_fingerprint != have:
            raise CacheError(
                f"{cache}: built from the target {c.mf.target} ({c.mf.target_fingerprint}), not {folder}"
                f" ({have}): build a cache from this target"
            )
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return cls(load_head_only(folder, device, dtype), c, folder, tok)

    def check_run(self, data: Any, layer_ids: list[int]) -> None:
        """Refuse, naming what differs, a cache that does not hold this run's rows and layers: another
        dataset (its manifest), another cut (seq_length), layers the drafter reads that are missing."""
        mf = self.cache.mf
        missing = [i for i in layer_ids if i + 1 not in mf.layers]
        if missing:
            raise CacheError(
                f"{self.cache.folder}: the drafter reads target layers {missing} (hidden_states "
                f"{[i + 1 for i in missing]}), the cache holds hidden_states {mf.layers}: build it for"
                " this kind"
            )
        shas = [d["manifest_sha256"] for d in mf.datasets]
        where: dict[int, int] = {}
        for di, (path, sha) in enumerate(zip(data.paths, data.manifest_sha256(), strict=True)):
            if sha not in shas:
                raise CacheError(
                    f"{self.cache.folder}: built from datasets {[d['path'] for d in mf.datasets]}, not {path}"
                    f" (its manifest.json's sha256 is none of theirs): another tokenization"
                )
            where[di] = shas.index(sha)
        for ref in [*data.train, *data.heldout]:
            e = self.cache.by_row.get((where[ref.dataset], ref.row))
            if e is None or e.end - e.start != ref.length:
                held = "no entry" if e is None else f"{e.end - e.start} tokens"
                raise CacheError(
                    f"{self.cache.folder}: row {ref.row} of {data.paths[ref.dataset]} is read as {ref.length}"
                    f" tokens, the cache holds {held} (built with seq_length {mf.seq_length})"
                )

    def _rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(bsz, T, stored layers, hidden): each row's cached states at its attended positions, 0
        elsewhere."""
        mf, dtype = self.cache.mf, self.model.embed_tokens.weight.dtype
        bsz, t = input_ids.shape
        out = torch.zeros(bsz, t, len(mf.layers), mf.hidden_size, dtype=dtype)
        for i in range(bsz):
            at = (
                attention_mask[i].bool().cpu()
                if attention_mask is not None
                else torch.ones(t, dtype=torch.bool)
            )
            ids = input_ids[i].cpu()[at]
            e = self.cache.by_ids.get(row_key(ids))
            if e is None:
                raise CacheError(
                    f"{self.cache.folder}: no entry for a row of {len(ids)} tokens: not this dataset's"
                )
            hidden = self.cache.hidden(e)
            issues = row_issues(hidden, self.cache.ids(e), ids, len(mf.layers), mf.hidden_size)
            if issues:
                code, reason = issues[0]
                raise CacheError(f"{self.cache.folder}: {code}: a row of {len(ids)} tokens: {reason}")
            out[i, at] = hidden.to(dtype)
        return out.to(self.device)

    def _context(self, states: torch.Tensor, layer_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
        return torch.cat([states[:, :, self.cache.mf.slot(i)] for i in layer_ids], dim=-1)

    @torch.no_grad()
    def teacher_forced(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        layer_ids: list[int] | tuple[int, ...],
    ) -> TargetPass:
        states = self._rows(input_ids, attention_mask)
        last = states[:, :, -1]
        return TargetPass(self._context(states, layer_ids), last, self.lm_head(last[:, -1:]))

    @torch.no_grad()
    def context_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
        layer_ids: list[int] | tuple[int, ...], *, with_logits: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
        states = self._rows(input_ids, attention_mask)
        logits = self.lm_head(states[:, :, -1]) if with_logits else None
        return logits, self._context(states, layer_ids)


def load_target(folder: str, cache: str | None, *, device: torch.device, dtype: torch.dtype | None) -> Target:
    """The run's target: whole, or from `cache` without its decoder layers."""
    if cache is None:
        return Target.load(folder, device=device, dtype=dtype)
    return CachedTarget.open(cache, folder, device=device, dtype=dtype)


def check_cache(target: Target, data: Any, layer_ids: list[int]) -> None:
    """Before any step: a cached target's cache holds the run's rows and layers (a whole target: nothing)."""
    if isinstance(target, CachedTarget):
        target.check_run(data, layer_ids)
