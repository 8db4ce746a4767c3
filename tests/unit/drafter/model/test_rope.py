"""The drafter's rope, from its target's: scaled kinds carried over and computed as transformers
computes them for the exported config (what z-lab's loader, vLLM and SGLang read), partial rotary
dropped, run-time scaling replaced by the default rope."""

from __future__ import annotations

import pytest
import torch

from draftdeck.drafter.kinds.dflash.export import config_from_hf
from draftdeck.drafter.model.config import DrafterConfig, DrafterConfigError
from draftdeck.drafter.model.layers import RotaryEmbedding
from draftdeck.drafter.tiny_targets import tiny_causal_lm


def _drafter(arch: str) -> DrafterConfig:
    return DrafterConfig.from_target(tiny_causal_lm(arch).config, mask_token_id=1, block_size=4)


@pytest.mark.parametrize("arch", ["gpt_oss", "llama3"])
def test_a_scaled_rope_is_the_targets_and_matches_transformers(arch: str) -> None:
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    target = tiny_causal_lm(arch).config.rope_parameters
    config = _drafter(arch)
    assert config.rope_parameters == target  # kind, scaling and base
    hf = config.to_hf_dict()
    assert hf["rope_parameters"] == target
    assert hf["rope_scaling"] == {k: v for k, v in target.items() if k != "rope_theta"}
    positions = torch.arange(0, 4000, 7)[None]
    x = torch.zeros(1, 1, config.head_dim)
    ours = RotaryEmbedding(config)(x, positions)
    theirs = Qwen3RotaryEmbedding(Qwen3Config(**hf))(x, positions)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, theirs, strict=True))
    if arch == "gpt_oss":  # yarn's attention factor scales cos and sin
        assert ours[0].abs().max() > 1.01
    assert config_from_hf(hf).rope_parameters == config.rope_parameters  # the export reads back


def test_partial_rotary_and_per_layer_ropes() -> None:
    qwen35 = _drafter("qwen3_5")  # rotates a quarter of its target's heads; the drafter rotates all
    assert qwen35.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert "partial_rotary_factor" not in str(qwen35.to_hf_dict())
    gemma = _drafter("gemma3")  # a rope per layer type: the full-attention layers' base
    assert gemma.rope_parameters == {"rope_type": "default", "rope_theta": 1_000_000.0}
    assert gemma.to_hf_dict()["rope_scaling"] is None


def test_a_rope_that_changes_at_run_time_becomes_the_default_and_unknown_kinds_are_refused() -> None:
    cfg = tiny_causal_lm("qwen3").config.to_dict()
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 5e5}
    config = DrafterConfig.from_target(cfg, mask_token_id=1)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 5e5}
    with pytest.raises(DrafterConfigError, match="rope_type 'longrope'"):
        DrafterConfig.from_dict({**config.to_dict(), "rope_parameters": {"rope_type": "longrope"}})
    old = {k: v for k, v in config.to_dict().items() if k != "rope_parameters"}  # an earlier checkpoint
    assert DrafterConfig.from_dict(old).rope_parameters == {"rope_type": "default", "rope_theta": 5e5}
