"""Export to z-lab's format: config.json (Qwen3 + dflash_config) and model.safetensors, written
atomically; it loads back into ours and, in a venv of its own, into the `dflash` package's
DFlashDraftModel with no missing or unexpected key and the same outputs (within 1e-5)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.export.drafters import export_drafter
from draftdeck.drafter.export.folder import CheckpointError
from draftdeck.drafter.kinds.dflash.export import load_zlab, save_zlab
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from tests.conftest import PROBES
from tests.support.drafter import tiny_drafter_config, tiny_target
from tests.support.eval import dflash_venv

torch.set_num_threads(1)
PROBE = PROBES / "dflash_probe.py"


def _drafter(layers: int = 2, block_size: int = 8) -> DFlashDrafter:
    target = tiny_target(seed=1)
    torch.manual_seed(2)
    drafter = DFlashDrafter(tiny_drafter_config(target, layers=layers, block_size=block_size)).eval()
    with torch.no_grad():  # norms away from 1, so a norm loaded wrongly shows
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return drafter


def _inputs(drafter: DFlashDrafter, ctx_len: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    b, h = drafter.block_size, drafter.config.hidden_size
    return {
        "target_hidden": torch.randn(1, ctx_len, drafter.config.context_size, generator=g),
        "noise_embedding": torch.randn(1, b, h, generator=g),
        "position_ids": torch.arange(ctx_len + b)[None],
    }


def test_export_writes_zlab_config_and_weights_atomically(tmp_path: Path) -> None:
    drafter = _drafter()
    out = save_zlab(drafter, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["model_type"] == "qwen3"
    assert hf["dflash_config"] == {
        "block_size": 8,
        "target_layer_ids": list(drafter.target_layer_ids),
        "mask_token_id": drafter.mask_token_id,
        "num_target_layers": 4,
    }  # no mask_token: this drafter was made without a tokenizer, so no text names its mask id
    assert hf["block_size"] == 8 and hf["num_target_layers"] == 4 and hf["target_hidden_size"] == 64
    back = load_zlab(out)
    x = _inputs(drafter)
    with torch.no_grad():
        assert torch.equal(back(**x), drafter(**x))
    # a second export replaces the first whole, and leaves no temporary folder behind
    again, fmt = export_drafter(out, tmp_path / "export")
    assert fmt == "zlab"
    assert again == out and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_loading_refuses_a_folder_that_is_not_a_drafter(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_zlab(tmp_path)
    out = save_zlab(_drafter(), tmp_path / "e")
    hf = json.loads((out / "config.json").read_text())
    del hf["dflash_config"]
    (out / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="no dflash_config"):
        load_zlab(out)


@pytest.mark.slow
def test_export_loads_into_the_dflash_package_with_identical_outputs(tmp_path: Path) -> None:
    venv = dflash_venv()
    drafter = _drafter()
    out = save_zlab(drafter, tmp_path / "export")
    x = _inputs(drafter)
    torch.save(x, tmp_path / "inputs.pt")
    res = subprocess.run(
        [
            str(venv / "bin" / "python"),
            str(PROBE),
            str(out),
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "out.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["class"] == "DFlashDraftModel"
    assert (
        report["missing_keys"] == [] and report["unexpected_keys"] == [] and report["mismatched_keys"] == []
    )
    assert report["block_size"] == drafter.block_size
    assert report["target_layer_ids"] == list(drafter.target_layer_ids)
    assert report["mask_token_id"] == drafter.mask_token_id
    theirs = torch.load(tmp_path / "out.pt", weights_only=True)["hidden"]
    with torch.no_grad():
        ours = drafter(**x)
    assert theirs.shape == ours.shape
    assert torch.allclose(theirs, ours, atol=1e-5, rtol=0), (theirs - ours).abs().max()
