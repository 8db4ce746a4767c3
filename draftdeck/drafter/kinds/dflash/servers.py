"""An exported drafter's `config.json` read as vLLM's and SGLang's DFlash loaders read it: which mask
id each fills the draft block with, which target layers it taps, how many tokens it drafts, and the
flags that launch it. A mask id other than the trained one fails silently at serving (acceptance
collapses, nothing errors), so the export compares each reading with what the drafter was trained on.

The loaders read (public source, 2026):

- **vLLM**, main after PR #40727 (April 2026): `vllm/config/speculative.py`,
  `model_executor/models/qwen3_dflash.py`, `v1/spec_decode/llm_base_proposer.py`,
  `v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`. Architecture `DFlashDraftModel`. The mask is
  `dflash_config.mask_token_id`, else a top-level `mask_token_id`. The tapped layers are
  `eagle_aux_hidden_state_layer_ids` as they are, else `dflash_config.target_layer_ids` + 1 (vLLM
  taps the residual stream entering layer i, DFlash names the layer whose output it reads). The `fc`
  input is `target_hidden_size` (else `hidden_size`) times the layers. The block size is not read: the
  query block is 1 + `num_speculative_tokens`, so a drafter trained with block B is served with B - 1.
- **SGLang, first DFlash** (PR #22077, commit 7f151c5): the mask only by its text,
  `dflash_config.mask_token` (default ``<|MASK|>``), looked up in the target's tokenizer and added to
  it when missing (the new token's id is ``len(tokenizer)``); the layers `dflash_config.target_layer_ids`
  (+1 in the target's capture hook); the block `dflash_config.block_size`, else `block_size`, else 16,
  and `--speculative-num-draft-tokens` is the block, anchor included.
- **SGLang, newer** (`speculative/dflash_utils.parse_dflash_draft_config`, commit 00731f0): a numeric
  `dflash_config.mask_token_id` first (an int below the target's vocabulary, refused when the
  tokenizer has the mask text at another id), else the text as above; `num_target_layers` bounds the
  layer ids (without it, the drafter's own layer count does, and a deep target's ids are refused).

We write every key each of them needs (DrafterConfig.to_hf_dict), and no
`eagle_aux_hidden_state_layer_ids`: vLLM uses it unchecked, and its meaning moved with #40727.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from draftdeck.drafter.model.config import DEFAULT_MASK_TOKEN

SGLANG_DEFAULT_BLOCK = 16


@dataclass(frozen=True)
class Reading:
    """What one server makes of the config: `mask_token_id` None where it cannot tell (no tokenizer
    given) or would refuse; `problems` say what differs from the trained drafter, or why it refuses."""

    server: str
    source: str  # the loader version read
    mask_token_id: int | None
    mask_from: str
    tapped_layers: tuple[int, ...]  # the server's own layer indices
    draft_tokens: int  # the value of the server's draft-token setting
    flags: str
    problems: tuple[str, ...] = field(default_factory=tuple)


def _dflash(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    dflash = hf.get("dflash_config")
    return dflash if isinstance(dflash, Mapping) else {}


def _block(hf: Mapping[str, Any]) -> int:
    return int(_dflash(hf).get("block_size") or hf.get("block_size") or SGLANG_DEFAULT_BLOCK)


def vllm_reading(hf: Mapping[str, Any], folder: str, block: int | None = None) -> Reading:
    dflash, problems = _dflash(hf), []
    mask = dflash.get("mask_token_id", hf.get("mask_token_id"))
    if mask is None:
        problems.append("vLLM refuses a DFlash drafter with no mask_token_id")
    aux = hf.get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(aux) if aux else tuple(int(i) + 1 for i in dflash.get("target_layer_ids") or ())
    block = block or _block(hf)
    spec = f'{{"method": "dflash", "model": "{folder}", "num_speculative_tokens": {block - 1}}}'
    return Reading(
        "vLLM", "main, after PR #40727", None if mask is None else int(mask), "dflash_config.mask_token_id",
        layers, block - 1, f"--speculative-config '{spec}'", tuple(problems),
    )  # fmt: skip


def _mask_by_text(text: str, tokenizer: Any) -> tuple[int, str]:
    """SGLang's lookup of the mask text: the tokenizer's mask token, else the vocabulary, else the token
    is added (`add_special_tokens`), which gives it the next id, len(tokenizer)."""
    if getattr(tokenizer, "mask_token", None) == text and tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id), f"the tokenizer's mask token {text!r}"
    found = tokenizer.get_vocab().get(text)
    if found is not None:
        return int(found), f"{text!r} in the target's vocabulary"
    return len(tokenizer), f"{text!r} added to the target's tokenizer"


def sglang_reading(
    hf: Mapping[str, Any],
    folder: str,
    tokenizer: Any,
    vocab_size: int,
    *,
    numeric_mask: bool,
    block: int | None = None,
) -> Reading:
    """SGLang's reading, newer (`numeric_mask`: mask_token_id first) or its first DFlash (text only)."""
    dflash, problems = _dflash(hf), []
    text = str(dflash.get("mask_token") or DEFAULT_MASK_TOKEN)
    number = dflash.get("mask_token_id") if numeric_mask else None
    mask: int | None = None
    mask_from = "needs the target's tokenizer"
    if number is not None:
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < vocab_size:
            problems.append(f"SGLang refuses mask_token_id {number!r}: not an id below {vocab_size}")
        else:
            mask, mask_from = int(number), "dflash_config.mask_token_id"
            known = tokenizer.get_vocab().get(text) if tokenizer is not None else None
            if known is not None and known != mask:
                problems.append(
                    f"SGLang refuses to start: the tokenizer has {text!r} at id {known}, not {mask}"
                )
    elif tokenizer is not None:
        mask, mask_from = _mask_by_text(text, tokenizer)
        if mask >= vocab_size:
            problems.append(f"SGLang refuses mask id {mask}: the target's embedding has {vocab_size} rows")
    ids = tuple(int(i) for i in dflash.get("target_layer_ids") or ())
    bound = None  # the first DFlash checks the ids against the running target only
    if numeric_mask:
        bound = dflash.get("num_target_layers") or hf.get("num_target_layers") or hf.get("num_hidden_layers")
    if bound is not None and any(not 0 <= i < int(bound) for i in ids):
        problems.append(f"SGLang refuses target_layer_ids {list(ids)}: out of range for {bound} layers")
    block = block or _block(hf)
    return Reading(
        "SGLang", "newer, commit 00731f0" if numeric_mask else "first DFlash, commit 7f151c5",
        mask, mask_from, tuple(i + 1 for i in ids), block,
        f"--speculative-algorithm DFLASH --speculative-draft-model-path {folder} "
        f"--speculative-num-draft-tokens {block}",
        tuple(problems),
    )  # fmt: skip


def readings(
    hf: Mapping[str, Any], folder: str, tokenizer: Any = None, block: int | None = None
) -> list[Reading]:
    """Every server's reading, each with a problem added where it would fill the block with another
    mask id than the trained one (`dflash_config.mask_token_id`). `block`: the verify block to serve
    with when not the config's (a sweep's recommended point), in the draft-token flags."""
    trained = _dflash(hf).get("mask_token_id")
    vocab = int(hf.get("vocab_size") or 0)
    out = []
    for r in (
        vllm_reading(hf, folder, block),
        sglang_reading(hf, folder, tokenizer, vocab, numeric_mask=True, block=block),
        sglang_reading(hf, folder, tokenizer, vocab, numeric_mask=False, block=block),
    ):
        if r.mask_token_id is not None and r.mask_token_id != trained:
            mismatch = (
                f"{r.server} ({r.source}) fills the draft block with id {r.mask_token_id} "
                f"({r.mask_from}), the drafter was trained with {trained}: acceptance would collapse"
            )
            r = replace(r, problems=(*r.problems, mismatch))
        out.append(r)
    return out


def read_export(folder: Any, target: Any = None, block: int | None = None) -> list[Reading]:
    """The readings of an export folder, with the tokenizer of the `target` folder when one is given
    (SGLang resolves the mask's text with it; without it, that reading says so)."""
    import json
    from pathlib import Path

    hf = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    tokenizer = None
    if target is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(target))
    return readings(hf, str(folder), tokenizer, block)
