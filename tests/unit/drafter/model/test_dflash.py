"""The drafter's config, target access and model: z-lab's key names and indexing, shapes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.model.config import DrafterConfig, DrafterConfigError, default_target_layer_ids
from draftdeck.drafter.model.target import Target
from tests.support.drafter import saved_target, tiny_drafter_config, tiny_target

torch.set_num_threads(1)

ZLAB_LAYER_KEYS = {
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
}


def test_default_layer_ids_spread_like_zlab_and_every_layer_for_small_targets() -> None:
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(4, 1) == [0, 1, 2, 3]
    assert default_target_layer_ids(5, 3) == [0, 1, 2, 3, 4]


def test_state_dict_keys_are_zlabs() -> None:
    target = tiny_target()
    drafter = DFlashDrafter(tiny_drafter_config(target, layers=2))
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    expected |= {f"layers.{i}.{k}" for i in range(2) for k in ZLAB_LAYER_KEYS}
    assert set(drafter.state_dict()) == expected
    assert drafter.state_dict()["fc.weight"].shape == (64, 4 * 64)


def test_context_features_are_layer_outputs_at_index_id_plus_one() -> None:
    target = tiny_target()
    ids = torch.randint(0, 299, (2, 7))
    seen: list[torch.Tensor] = []
    hook = target.model.model.layers[1].register_forward_hook(lambda m, i, o: seen.append(o))
    logits, feats = target.context_features(ids, None, [1, 2], with_logits=True)
    hook.remove()
    assert logits is not None and logits.shape == (2, 7, 300)
    assert feats.shape == (2, 7, 128)
    out = seen[0][0] if isinstance(seen[0], tuple) else seen[0]
    torch.testing.assert_close(feats[..., :64], out)  # id 1 = the output of decoder layer 1
    assert target.context_features(ids, None, [1])[0] is None


def test_forward_shapes_and_no_mask_equals_all_visible_mask() -> None:
    target = tiny_target()
    cfg = tiny_drafter_config(target, block_size=4)
    drafter = DFlashDrafter(cfg).eval()
    ids = torch.randint(0, 299, (2, 6))
    _, feats = target.context_features(ids, None, cfg.target_layer_ids)
    block = torch.full((2, 4), cfg.mask_token_id)
    block[:, 0] = ids[:, -1]
    pos = torch.arange(10).expand(2, 10)
    h = drafter(position_ids=pos, noise_embedding=target.embed(block), target_hidden=feats)
    assert h.shape == (2, 4, 64)
    full = torch.ones(2, 1, 4, 10, dtype=torch.bool)
    h2 = drafter(
        position_ids=pos, attention_mask=full, noise_embedding=target.embed(block), target_hidden=feats
    )
    torch.testing.assert_close(h, h2)
    logits = drafter.compute_logits(h, target.lm_head)
    assert logits.shape == (2, 4, 300)
    assert not any(p.requires_grad for p in target.model.parameters())


def test_hf_dict_carries_dflash_config_and_round_trips() -> None:
    target = tiny_target()
    cfg = tiny_drafter_config(target, layers=2, block_size=8)
    hf = cfg.to_hf_dict()
    assert hf["dflash_config"] == {
        "block_size": 8,
        "target_layer_ids": [0, 1, 2, 3],
        "mask_token_id": 299,
        "num_target_layers": 4,
    }
    assert hf["num_hidden_layers"] == 2 and hf["num_target_layers"] == 4
    assert DrafterConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_settings_the_target_cannot_serve_are_refused_naming_the_value() -> None:
    target = tiny_target()
    with pytest.raises(DrafterConfigError, match=r"target_layer_ids \[4\].*layers 0\.\.3"):
        tiny_drafter_config(target, target_layer_ids=[1, 4])
    with pytest.raises(DrafterConfigError, match="block_size 1"):
        tiny_drafter_config(target, block_size=1)
    with pytest.raises(DrafterConfigError, match=r"block_size 1024 exceeds .* 512"):
        tiny_drafter_config(target, block_size=1024)
    with pytest.raises(DrafterConfigError, match=r"mask_token_id 300 .*explicit"):
        tiny_drafter_config(target, mask_token_id=300)


def test_mask_id_resolution_order_is_recorded(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = saved_target(tmp_path / "t")
    tok = AutoTokenizer.from_pretrained(folder)
    cfg = Target.load(folder, with_tokenizer=False).config
    by_draft = DrafterConfig.from_target(
        cfg, tokenizer=tok, draft_config={"dflash_config": {"mask_token_id": 7}}
    )
    assert (by_draft.mask_token_id, by_draft.mask_token_source) == (7, "draft_config")
    unused = DrafterConfig.from_target(cfg, tokenizer=tok)
    assert (unused.mask_token_id, unused.mask_token_source) == (len(tok), "unused_embedding_row")
    tok.add_special_tokens({"mask_token": "<|mask|>"})
    masked = DrafterConfig.from_target(cfg, tokenizer=tok)
    assert (masked.mask_token_id, masked.mask_token_source) == (tok.mask_token_id, "tokenizer_mask_token")
