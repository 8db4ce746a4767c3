"""A P-EAGLE drafter in speculators' format (`speculators_model_type: peagle`, architectures
`PEagleSpeculator`), read back, and each server's reading of it.

The format is EAGLE-3's speculators format (`draftdeck.drafter.kinds.eagle3.formats`: `layers.0.*`,
`fc`, `norm`, `lm_head`, `d2t`, `t2d`, the layer config under `transformer_layer_config`, the tapped
layers in vLLM's convention, the norm flags pinned false) plus `mask_hidden` (1, 1, 3 Ht) and the mask
token: `mask_token_id` as speculators' `PEagleSpeculatorConfig` names it, and `pard_token`, the name
vLLM's parallel drafting reads (it refuses a config without `pard_token` or `ptd_token_id`). The
chain's drafts are speculators' `proposal_methods[0].speculative_tokens` (its `num_depths`).
`embed_requires_grad` is written false: DraftDeck trains with the target's embedding frozen (speculators
trains it by default), so the export carries none and every loader takes the verifier's.

vLLM serves it as EAGLE-3 with parallel drafting (`"method": "eagle3", "parallel_drafting": true`, as the
published P-EAGLE checkpoints are served; KINDS.md's "vLLM peagle" is that path). SGLang has no parallel
drafting for EAGLE-3: its EAGLE3 would run the layer as a sequential chain, which this drafter was not
trained for, so its reading says so and gives no launch line.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftdeck.drafter.export.folder import CONFIG, WEIGHTS, CheckpointError, write_folder
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.eagle3.formats import config_from_hf, eagle3_config, eagle3_state
from draftdeck.drafter.kinds.peagle.model import PEagleConfig, PEagleDrafter
from draftdeck.drafter.model.config import DrafterConfigError

LAYER = "layers.0."


def peagle_config(cfg: PEagleConfig, verifier: Verifier | None = None) -> dict[str, Any]:
    """speculators' P-EAGLE config.json (module doc); `verifier`: the target it names (None: a
    checkpoint's, which names none)."""
    config = eagle3_config(cfg, "speculators", verifier)
    spec = config["speculators_config"]
    spec["algorithm"] = "peagle"
    spec["proposal_methods"] = [{"proposal_type": "greedy", "speculative_tokens": cfg.num_depths}]
    return {
        **config,
        "speculators_model_type": "peagle",
        "architectures": ["PEagleSpeculator"],
        "mask_token_id": cfg.mask_token_id,
        "pard_token": cfg.mask_token_id,
        "embed_requires_grad": False,
    }


def config_of(hf: dict[str, Any]) -> PEagleConfig:
    """Our config from a P-EAGLE config.json: EAGLE-3's reading of the same fields, plus the mask token
    and the chain's drafts."""
    if hf.get("speculators_model_type") != "peagle":
        raise DrafterConfigError("config.json is not a speculators P-EAGLE config")
    base, _ = config_from_hf({**hf, "speculators_model_type": "eagle3"})  # the fields EAGLE-3's format shares
    drafts = int(hf["speculators_config"]["proposal_methods"][0]["speculative_tokens"])
    return PEagleConfig(**asdict(base), mask_token_id=int(hf["mask_token_id"]), num_depths=drafts)


def save_peagle(drafter: PEagleDrafter, out_dir: Path, verifier: Verifier | None = None) -> Path:
    """Write `drafter` to `out_dir` in speculators' format, atomically."""
    config = peagle_config(drafter.config, verifier)
    config["dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    return write_folder(Path(out_dir), eagle3_state(drafter, "speculators"), config)


def load_peagle(folder: Path) -> PEagleDrafter:
    """Read an export (`layers.0.*`) or a training checkpoint (`midlayer.*`) back: every key matched,
    none left over."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        cfg = config_of(json.loads((folder / CONFIG).read_text(encoding="utf-8")))
        state = load_file(str(folder / WEIGHTS))
    except (OSError, KeyError, IndexError, TypeError, ValueError, DrafterConfigError) as e:
        raise CheckpointError(f"{folder}: not a readable P-EAGLE export: {e!r}") from e
    ours = {("midlayer." + k.removeprefix(LAYER) if k.startswith(LAYER) else k): v for k, v in state.items()}
    drafter = PEagleDrafter(cfg)
    missing, unexpected = drafter.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: keys missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter


def served(folder: Path, target: str | None, block: int) -> list[dict[str, Any]]:
    """vLLM's and SGLang's readings of an export drafting `block - 1` tokens a step: the drafts each
    serves, what it reads otherwise than trained, and the launch line."""
    from safetensors import safe_open

    folder = Path(folder)
    hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        keys = set(f.keys())
    drafts = block - 1
    vllm = []
    if "mask_hidden" not in keys:
        vllm.append("no mask_hidden: vLLM fills the parallel positions with zeros")
    if "d2t" not in keys:
        vllm.append("no d2t: draft ids are served as the identity over the first N target ids")
    if hf.get("pard_token") is None and hf.get("ptd_token_id") is None:
        vllm.append("no pard_token: vLLM refuses parallel drafting without the mask token")
    model = target or "<target>"
    spec = (
        f'{{"method": "eagle3", "model": "{folder}", "num_speculative_tokens": {drafts},'
        ' "parallel_drafting": true}'
    )
    return [
        {"server": "vllm", "drafts": drafts, "problems": vllm,
         "flags": f"vllm serve {model} --speculative-config '{spec}'"},
        {"server": "sglang", "drafts": 0, "flags": "",
         "problems": ["SGLang has no parallel drafting for EAGLE-3: its EAGLE3 runs a sequential chain"]},
    ]  # fmt: skip
