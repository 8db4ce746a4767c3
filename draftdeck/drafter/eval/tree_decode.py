"""Tree verification: one target forward checks a whole draft tree (`tree.DraftTree`), the longest path
the target agrees with is committed, and the target's KV cache keeps exactly that path.

The verify input is the anchor then every node, in the tree's order; a node sits at position
anchor + its depth and attends to the committed prefix, the anchor and its own ancestors (a 4D
additive mask, one per attention kind: a sliding-window layer's sees only its window of the prefix, as
its cache hands it over). After the step each attention layer's cache holds the prefix and then every
verified input; the entries of the anchor and the accepted nodes are moved down to follow the prefix
and the rest dropped (`keep_path`): full attention, multi-head latent attention (its cache holds keys
and values like any other) and sliding windows (past recording keeps the whole block until the cut,
see TargetRunner.new_cache).

A recurrent state (Gated DeltaNet in Qwen3.5/3.6 and Qwen3-Next, Mamba-style layers) folds the tokens
in order: it cannot hold two branches at once, so a tree over a hybrid target is refused by name
(`tree_refusal`) before any work, and `generate_tree` refuses such a cache too.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import DynamicCache

from draftdeck.drafter.eval.spec_decode import (
    DraftSource,
    Generation,
    Sampling,
    TargetRunner,
    prefill,
    sampling_probs,
    seeded_generator,
)
from draftdeck.drafter.eval.tree import DraftTree, TreeShape, accept_greedy, accept_sampled_tree

RECURRENT_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_next", "bamba", "falcon_h1",
                         "jamba", "zamba", "zamba2", "granitemoehybrid", "nemotron_h", "lfm2")  # fmt: skip


@runtime_checkable
class TreeSource(DraftSource, Protocol):
    """A draft source that can also propose a tree."""

    def propose_tree(self, committed: list[int], shape: TreeShape) -> DraftTree:
        """A draft tree to follow `committed` (prompt + generated so far), within `shape`."""


def tree_refusal(config: Any) -> str | None:
    """Why a target of this HF config cannot verify trees (None: it can): a recurrent layer's state."""
    text = getattr(config, "text_config", None) or config
    model_type = str(getattr(text, "model_type", ""))
    types = list(getattr(text, "layer_types", None) or [])
    # a linear-attention layer (Gated DeltaNet) or any layer that is no attention (Mamba, convolution)
    recurrent = sorted({t for t in types if "linear" in t or "attention" not in t})
    if model_type in RECURRENT_MODEL_TYPES or recurrent:
        what = f" ({', '.join(recurrent)} layers)" if recurrent else ""
        return (
            f"tree verification: the target is a {model_type} hybrid{what} whose recurrent state folds "
            "tokens in order and cannot hold a tree's branches at once; verify chains (tree_budget 0)"
        )
    return None


def _tree_mask(
    tree: DraftTree, cache: DynamicCache, start: int, layer: int, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """(1, 1, n, kv) additive mask of the verify input (the anchor at `start`, then the nodes) over what
    cache layer `layer` hands its attention: the prefix (a sliding layer's window of it) and the input."""
    n = len(tree) + 1
    kv_length, kv_offset = cache.get_mask_sizes(n, layer)
    seen = kv_length - n  # prefix keys handed over: positions kv_offset .. start - 1
    depths = torch.tensor([0, *tree.depths], device=device)
    q_pos = start + depths
    allowed = torch.zeros(n, kv_length, dtype=torch.bool, device=device)
    k_pos = torch.arange(kv_offset, kv_offset + seen, device=device)
    kind: Any = cache.layers[layer]
    window = kind.sliding_window if getattr(kind, "is_sliding", False) else None
    prefix = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        prefix &= (q_pos[:, None] - k_pos[None, :]) < window
    allowed[:, :seen] = prefix
    for i in range(n):  # a node sees itself and its ancestors; the anchor (input 0) is everyone's
        at = i - 1
        allowed[i, seen + i] = True
        while at >= 0:
            at = tree.parents[at]
            allowed[i, seen + at + 1] = True
    mask = torch.zeros(n, kv_length, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def verify_tree(
    runner: TargetRunner, anchor: int, tree: DraftTree, start: int, cache: DynamicCache,
    layer_ids: list[int] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Logits (1 + nodes, V) after the anchor (at `start`) and after each node, in one forward; context
    features of the same inputs if asked."""
    model, device = runner.model, runner.device
    dtype = next(model.parameters()).dtype
    sliding = [i for i, layer in enumerate(cache.layers) if getattr(layer, "is_sliding", False)]
    full = [i for i in range(len(cache.layers)) if i not in sliding]
    masks = {kind: _tree_mask(tree, cache, start, ids[0], dtype, device)
             for kind, ids in (("full_attention", full), ("sliding_attention", sliding)) if ids}  # fmt: skip
    mask: Any = masks if len(masks) > 1 else next(iter(masks.values()))
    ids = torch.tensor([[anchor, *tree.tokens]], dtype=torch.long, device=device)
    positions = (start + torch.tensor([0, *tree.depths], device=device))[None]
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                output_hidden_states=layer_ids is not None, **{runner.cache_kwarg: cache})  # fmt: skip
    from draftdeck.drafter.model.target import context_from_hidden_states

    feats = context_from_hidden_states(out.hidden_states, layer_ids)[0] if layer_ids is not None else None
    return out.logits[0].float(), feats


def keep_path(cache: DynamicCache, verified: int, kept: list[int]) -> None:
    """After a verify forward of `verified` inputs, keep of them only the inputs `kept` (indices, in
    order) in every attention layer's cache, right after the prefix; then trim sliding windows."""
    layers: list[Any] = list(cache.layers)  # the attention layers' kinds differ in what they hold
    for layer in layers:
        if getattr(layer, "recurrent_states", None) or getattr(layer, "conv_states", None):
            raise ValueError("a recurrent layer's state cannot keep one path of a tree (tree_refusal)")
        if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
            continue
        idx = torch.tensor(kept, dtype=torch.long, device=layer.keys.device) + layer.keys.shape[-2] - verified
        for name in ("keys", "values"):
            t = getattr(layer, name)
            setattr(
                layer, name, torch.cat([t[..., : t.shape[-2] - verified, :], t.index_select(-2, idx)], -2)
            )
        if getattr(layer, "indexer_keys", None) is not None and layer.indexer_keys.numel():  # DSA indexers
            t = layer.indexer_keys
            i = torch.tensor(kept, dtype=torch.long, device=t.device) + t.shape[1] - verified
            layer.indexer_keys = torch.cat([t[:, : t.shape[1] - verified], t.index_select(1, i)], 1)
        if hasattr(layer, "cumulative_length"):  # a sliding layer counts every position it saw
            layer.cumulative_length -= verified - len(kept)
    cache.crop(0)  # what past recording kept beyond a window goes


@torch.inference_mode()
def generate_tree(
    target: TargetRunner,
    source: TreeSource,
    prompt_ids: list[int],
    max_new_tokens: int,
    shape: TreeShape,
    sampling: Sampling = Sampling(),
) -> Generation:
    """Speculative decoding of one prompt with a draft tree of `shape` per verify step. tau per step
    counts the accepted path and the bonus; `Generation.verified` counts the inputs each verify forward
    ran (the anchor and every node)."""
    refused = tree_refusal(target.model.config)
    if refused is not None:
        raise ValueError(refused)
    gen = seeded_generator(sampling)
    begin, cpu = time.perf_counter(), time.process_time()
    layer_ids = source.layer_ids
    cache, committed = prefill(target, source, prompt_ids, sampling, gen)
    result = Generation(output_ids=[], seconds=0.0)
    n_out = 1
    stopped = committed[-1] in target.eos_ids
    while not stopped and n_out < max_new_tokens:
        anchor_pos = len(committed) - 1
        # no deeper than the tokens still allowed; a bonus past them is dropped
        limit = TreeShape(shape.budget, shape.topk, min(shape.depth, max_new_tokens - n_out))
        tree = source.propose_tree(committed, limit)
        logits, feats = verify_tree(target, committed[-1], tree, anchor_pos, cache, layer_ids)
        if sampling.greedy:
            path, nxt = accept_greedy(tree, logits.argmax(dim=-1).tolist())
        else:
            path, nxt = accept_sampled_tree(
                tree, sampling_probs(logits, sampling.temperature, sampling.top_p), gen
            )
        new = [*(tree.tokens[i] for i in path), nxt]
        cut = max_new_tokens - n_out  # a stop cuts the new tokens, as in generate_speculative
        for j, token in enumerate(new):
            if token in target.eos_ids:
                cut, stopped = min(cut, j + 1), True
                break
        new = new[:cut]
        produced = len(new)
        committed.extend(new)
        n_out += produced
        result.steps += 1
        result.accepted += min(len(path), produced)
        result.proposed += len(tree)
        result.verified += len(tree) + 1
        result.step_taus.append(min(len(path), produced) + 1)
        result.step_contexts.append(anchor_pos + 1)
        # the anchor's and the accepted nodes' entries; the last new token is the next anchor
        kept = [0, *(i + 1 for i in path)][:produced]
        keep_path(cache, len(tree) + 1, kept)
        source.observe(feats[kept] if feats is not None else None)
    result.output_ids = committed[len(prompt_ids) :]
    result.seconds = time.perf_counter() - begin
    result.cpu_seconds = time.process_time() - cpu
    return result
