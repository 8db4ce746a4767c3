"""EAGLE-3 export in both formats: every weight under the names each loader matches (none left
unmatched on the way back), the layer ids in each server's convention, the pinned flags, and the
readings flag each pitfall a config could still hit."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftdeck.drafter.export.eagle3 import FORMATS, eagle3_readings, load_eagle3, save_eagle3
from draftdeck.drafter.model.eagle3 import Eagle3Config, Eagle3Drafter

TARGET = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "intermediate_size": 48, "num_hidden_layers": 8, "vocab_size": 64,
          "max_position_embeddings": 4096}  # fmt: skip


def _drafter() -> Eagle3Drafter:
    torch.manual_seed(0)
    d = Eagle3Drafter(Eagle3Config.from_target(TARGET, draft_vocab_size=16))
    ids = torch.arange(0, 64, 4)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[ids] = True
    d.set_vocab(ids - torch.arange(16), t2d)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # a norm loaded wrongly shows
    return d.eval()


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_round_trips_with_every_key_matched(tmp_path: Path, fmt: str) -> None:
    drafter = _drafter()
    out = save_eagle3(drafter, tmp_path / fmt, fmt, verifier="/models/target")  # type: ignore[arg-type]
    keys = set(load_file(str(out / "model.safetensors")))
    layer = "layers.0." if fmt == "speculators" else "midlayer."
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert {k for k in keys if ".self_attn." in k or ".mlp." in k or "norm" in k} - {"norm.weight"} == {
        layer + k for k in (
            "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
            *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        )
    }  # fmt: skip
    back = load_eagle3(out)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    cfg = json.loads((out / "config.json").read_text())
    if fmt == "speculators":
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM's convention: ours
        assert all(
            cfg[f] is False for f in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
        )
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == "/models/target"
    else:
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang's: one less
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and cfg["norm_before_residual"] is False
    vllm, sglang = eagle3_readings(out, SimpleNamespace(max_position_embeddings=4096))
    assert vllm.tapped == (2, 4, 5) and vllm.problems == ()
    if fmt == "sglang":
        assert sglang.tapped == (2, 4, 5) and sglang.problems == ()
    else:
        assert "loads no layer" in sglang.problems[0]


def test_the_readings_flag_what_would_serve_another_drafter(tmp_path: Path) -> None:
    out = save_eagle3(_drafter(), tmp_path / "flat", "sglang")
    cfg = json.loads((out / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]  # SGLang's ids alone: vLLM reads them unshifted
    cfg["max_position_embeddings"] = 2048
    (out / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(out / "model.safetensors"))
    del state["d2t"]
    save_file(state, str(out / "model.safetensors"))
    vllm, sglang = eagle3_readings(out, SimpleNamespace(max_position_embeddings=32768))
    assert vllm.tapped == (1, 3, 4)
    assert any(
        "vLLM taps hidden_states [1, 3, 4], the drafter was trained on [2, 4, 5]" in p for p in vllm.problems
    )
    for reading in (vllm, sglang):
        assert any("no d2t" in p for p in reading.problems)
        assert any("max_position_embeddings 2048 is below the target's 32768" in p for p in reading.problems)
    with pytest.raises(Exception, match="keys missing \\['d2t'\\]"):
        load_eagle3(out)
