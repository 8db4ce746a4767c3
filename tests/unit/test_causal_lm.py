"""A model folder as a target: checked from its config before any weight is read; a checkpoint
published with a vision tower gives its language model only, with the same logits; weights the
checkpoint lacks are refused, never left at their random initial values."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from draftdeck.causal_lm import ModelFolderError, causal_lm_config, load_causal_lm
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from tests.support.drafter import saved_target


def test_what_is_not_a_decoder_only_causal_lm_is_refused_by_name(tmp_path: Path) -> None:
    from transformers import BartConfig, ViTConfig

    vit = tmp_path / "vit"
    ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(vit)
    with pytest.raises(ModelFolderError, match=f"{re.escape(str(vit))}: not a causal language model: vit"):
        Target.load(vit)
    bart = tmp_path / "bart"
    BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, vocab_size=100).save_pretrained(bart)
    with pytest.raises(ModelFolderError, match="bart is an encoder-decoder model"):
        causal_lm_config(bart)  # from the config alone: no weights exist in this folder
    with pytest.raises(ModelFolderError, match=r"no config\.json"):
        Target.load(tmp_path)
    loaded = Target.load(saved_target(tmp_path / "ok"))
    assert loaded.tokenizer is not None and not loaded.model.training


def test_a_checkpoint_published_with_a_vision_tower_gives_its_language_model(tmp_path: Path) -> None:
    whole = tiny_causal_lm("gemma3_vision")  # Gemma3ForConditionalGeneration, embedding and head tied
    whole.save_pretrained(tmp_path / "gemma")
    model, loaded = load_causal_lm(tmp_path / "gemma")
    assert type(model).__name__ == "Gemma3ForCausalLM" and "vision tower's weights are not loaded" in loaded
    assert not any("vision" in name for name, _ in model.named_parameters())
    ids = torch.tensor([[5, 9, 2, 7, 30, 11]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, whole(input_ids=ids).logits, atol=1e-5)


def test_weights_missing_from_the_checkpoint_are_refused(tmp_path: Path) -> None:
    tiny_causal_lm("qwen3").save_pretrained(tmp_path / "qwen3")
    tiny_causal_lm("mistral").save_pretrained(tmp_path / "mistral")  # no q/k norms
    shutil.copy(tmp_path / "mistral" / "model.safetensors", tmp_path / "qwen3" / "model.safetensors")
    with pytest.raises(
        ModelFolderError, match=r"8 of Qwen3ForCausalLM's weights are not in the checkpoint \(model"
    ):
        load_causal_lm(tmp_path / "qwen3")
