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

from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.eagle3.export import eagle3_readings, load_eagle3, save_eagle3
from draftdeck.drafter.kinds.eagle3.formats import FORMATS
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter

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
    verifier = Verifier("/models/target", ("Qwen3ForCausalLM",))
    out = save_eagle3(drafter, tmp_path / fmt, fmt, verifier=verifier)  # type: ignore[arg-type]
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
        assert cfg["speculators_config"]["verifier"] == {
            "name_or_path": "/models/target",
            "architectures": ["Qwen3ForCausalLM"],
        }
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


@pytest.mark.slow
def test_speculators_own_class_loads_the_export_and_drafts_the_same_tokens(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import PROBES
    from tests.support.drafter import tiny_target
    from tests.support.eval import speculators_venv

    venv = speculators_venv()
    target = tiny_target(0, vocab_size=64, hidden=32, layers=8)  # the verifier the export names
    target.model.save_pretrained(tmp_path / "target")
    drafter, steps, t = _drafter(), 3, 12
    verifier = Verifier(str(tmp_path / "target"), ("Qwen3ForCausalLM",))
    out = save_eagle3(drafter, tmp_path / "export", "speculators", verifier=verifier)
    g = torch.Generator().manual_seed(3)
    aux, ids = torch.randn(1, t, 3 * 32, generator=g), torch.randint(0, 64, (1, t), generator=g)
    next_ids = torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], dim=1)  # position t takes x[t + 1]
    torch.save({"aux": aux, "next_ids": next_ids, "steps": steps}, tmp_path / "in.pt")
    cmd = [str(venv / "bin" / "python"), str(PROBES / "eagle3_speculators_probe.py"), str(out),
           str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["class"] == "Eagle3DraftModel" and report["unexpected_keys"] == []
    assert report["mismatched_keys"] == [] and set(report["missing_keys"]) <= {"embed_tokens.weight"}
    assert report["layer_ids"] == [2, 4, 5] and report["d2t"] == drafter.d2t.tolist()
    theirs = torch.load(tmp_path / "out.pt", weights_only=True)["drafts"]  # (steps, T) draft ids
    with torch.no_grad():
        hidden = drafter.ttt(aux, target.embed(ids), steps)
    for k, h in enumerate(hidden):
        inside = t - (k + 1)  # past the row each pads its own way
        logits = drafter.logits(h)[0][:inside]
        ours, other = logits.argmax(-1), theirs[k, :inside]
        # the same draft, or (an untrained drafter's near-tie, summed in another order) one whose
        # logit is ours' within float error
        gap = logits.gather(-1, ours[:, None])[:, 0] - logits.gather(-1, other[:, None])[:, 0]
        assert bool(((ours == other) | (gap < 1e-5)).all()), (k, ours.tolist(), other.tolist(), gap.tolist())
        assert int((ours != other).sum()) <= 1, (k, ours.tolist(), other.tolist())
