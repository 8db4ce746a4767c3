"""An EAGLE-3 drafter in the two formats servers read, read back as each loader reads it.

- **speculators** (`speculators_model_type: eagle3`, architectures `Eagle3Speculator`): what
  `vllm serve <dir>` loads alone (the verifier named in `speculators_config`) and speculators'
  `Eagle3DraftModel` loads. Weights `layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`; the layer
  config under `transformer_layer_config` (llama); the tapped layers top-level in vLLM's convention
  (`eagle_aux_hidden_state_layer_ids`: the input of layer j, our index as it is).
- **sglang** (flat, architectures `LlamaForCausalLMEagle3`, SpecForge's export): what SGLang's
  `--speculative-algorithm EAGLE3` and vLLM load. Weights `midlayer.*` (SGLang matches names in its
  own tree and skips others silently, so a `layers.0.*` file would load nothing of the layer),
  `fc`, `norm`, `lm_head`, `d2t`, `t2d`; the tapped layers in `eagle_config` in SGLang's convention
  (the output of layer j - 1: our index minus one; SGLang adds one when capturing) and top-level in
  vLLM's (which reads the top-level key first, and either one unshifted: given SGLang's ids alone it
  would tap one layer lower, the field's off-by-one).

Both pin what the loaders otherwise guess (the field's pitfalls): `d2t` always written (without it
vLLM maps draft ids as the identity and acceptance collapses), the layer ids always written (a
server that guesses picks (2, L // 2, L - 3) of *its* target), `norm_before_residual` and the other
norm flags explicitly false (vLLM takes `norm_before_residual` as true when absent), and
`max_position_embeddings` the target's (2048 collapses acceptance on long prompts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.drafter.export.folder import CONFIG, WEIGHTS, CheckpointError, write_folder
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.eagle3.formats import (
    LAYER_PREFIX,
    Eagle3Format,
    config_from_hf,
    eagle3_config,
    eagle3_state,
)
from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter
from draftdeck.drafter.model.config import DrafterConfigError


def save_eagle3(
    drafter: Eagle3Drafter, out_dir: Path, fmt: Eagle3Format, verifier: Verifier | None = None
) -> Path:
    """Write `drafter` to `out_dir` in `fmt`, atomically."""
    config = eagle3_config(drafter.config, fmt, verifier)
    config["dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    return write_folder(Path(out_dir), eagle3_state(drafter, fmt), config)


def load_eagle3(folder: Path) -> Eagle3Drafter:
    """Read an export of either format back into our drafter: every key matched, none left over."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        cfg, fmt = config_from_hf(hf)
        state = load_file(str(folder / WEIGHTS))
    except (OSError, KeyError, TypeError, ValueError, DrafterConfigError) as e:
        raise CheckpointError(f"{folder}: not a readable EAGLE-3 export: {e!r}") from e
    prefix = LAYER_PREFIX[fmt]
    ours = {
        ("midlayer." + k.removeprefix(prefix) if k.startswith(prefix) else k): v for k, v in state.items()
    }
    drafter = Eagle3Drafter(cfg)
    missing, unexpected = drafter.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: keys missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter


@dataclass(frozen=True)
class Eagle3Reading:
    """What one server makes of an EAGLE-3 export: the layers it taps (its own indices, and ours),
    and the problems that would make it serve something other than what was trained."""

    server: str
    tapped: tuple[int, ...]  # hidden_states indices (ours) the server feeds the drafter
    problems: tuple[str, ...]


def eagle3_readings(folder: Path, target_config: Any = None) -> list[Eagle3Reading]:
    """vLLM's and SGLang's reading of an export (module doc's rules), checked against the trained
    drafter's config and, given, the target's (its max_position_embeddings)."""
    from safetensors import safe_open

    folder = Path(folder)
    hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        keys = set(f.keys())
    cfg, fmt = config_from_hf(hf)
    layer = hf.get("transformer_layer_config", hf)
    common = []
    if "d2t" not in keys:
        common.append("no d2t: draft ids are served as the identity over the first N target ids")
    target_max = int(getattr(target_config, "max_position_embeddings", 0) or 0)
    own_max = int(layer.get("max_position_embeddings", 0))
    if target_max and own_max < target_max:
        common.append(f"max_position_embeddings {own_max} is below the target's {target_max}")
    trained = cfg.aux_layer_ids
    vllm = list(common)
    if fmt == "speculators" and hf.get("norm_before_residual") is None:
        vllm.append("norm_before_residual absent: vLLM takes it as true, the drafter was trained without")
    # vLLM: the top-level ids, else eagle_config's, as they are; none: it guesses from its target
    top, nested = (
        hf.get("eagle_aux_hidden_state_layer_ids"),
        (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"),
    )
    vllm_ids = tuple(int(i) for i in (top or nested or ()))
    if not vllm_ids:
        vllm.append("no layer ids: vLLM guesses (2, L // 2, L - 3) of its target")
    elif vllm_ids != trained:
        vllm.append(f"vLLM taps hidden_states {list(vllm_ids)}, the drafter was trained on {list(trained)}")
    sglang = list(common)
    if fmt == "speculators":
        sglang.append(
            "a speculators-format export: SGLang matches midlayer.* names and loads no layer (export"
            " with --format sglang for SGLang)"
        )
    elif not any(k.startswith("midlayer.") for k in keys):
        sglang.append("no midlayer.* weights: SGLang would load no layer")
    sglang_ids = tuple(int(i) + 1 for i in nested) if nested else ()
    if fmt == "sglang" and sglang_ids != trained:
        sglang.append(
            f"SGLang taps hidden_states {list(sglang_ids)}, the drafter was trained on {list(trained)}"
        )
    return [Eagle3Reading("vllm", vllm_ids, tuple(vllm)), Eagle3Reading("sglang", sglang_ids, tuple(sglang))]


DEFAULT_DRAFTS = 3  # a chain's drafts when a folder does not say how it was trained (speculators' default)


def trained_drafts(folder: Path) -> int:
    """The chain's drafts a checkpoint was trained for (its drafter.json's TTT steps), else 3."""
    written = Path(folder) / "drafter.json"
    if not written.is_file():
        return DEFAULT_DRAFTS
    return int(json.loads(written.read_text(encoding="utf-8")).get("ttt_steps", DEFAULT_DRAFTS))


def launch_flags(server: str, folder: Path, fmt: Eagle3Format, target: str | None, drafts: int) -> str:
    """The command that serves the export with chains of `drafts` drafts (greedy, top-1)."""
    model = target or "<target>"
    if server == "vllm":
        if fmt == "speculators" and target is None:
            return f"vllm serve {folder}  (the verifier named in its speculators_config)"
        spec = f'{{"method": "eagle3", "model": "{folder}", "num_speculative_tokens": {drafts}}}'
        return f"vllm serve {model} --speculative-config '{spec}'"
    return (
        f"python -m sglang.launch_server --model-path {model} --speculative-algorithm EAGLE3"
        f" --speculative-draft-model-path {folder} --speculative-num-steps {drafts}"
        f" --speculative-eagle-topk 1 --speculative-num-draft-tokens {drafts + 1}"
    )
