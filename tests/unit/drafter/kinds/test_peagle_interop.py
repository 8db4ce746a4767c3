"""speculators 0.9.0's own `PEagleDraftModel`, in a venv of its own, loads DraftDeck's P-EAGLE export
with no key missing, unexpected or different, and drafts the same tokens as DraftDeck's drafter at every
depth of every chain on the same target states (tests/probes/peagle_speculators_probe.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.peagle.model import PEagleConfig, PEagleDrafter, dense_anchors
from draftdeck.drafter.kinds.peagle.walked import mask_embedding
from tests.conftest import PROBES
from tests.support.drafter import tiny_target
from tests.support.eval import speculators_venv

torch.set_num_threads(1)


@pytest.mark.slow
def test_speculators_own_class_loads_the_export_and_drafts_the_same_tokens(tmp_path: Path) -> None:
    venv = speculators_venv()
    target = tiny_target(0, vocab_size=64, hidden=32, layers=8)  # the verifier the export names
    target.model.save_pretrained(tmp_path / "target")
    depths, t = 4, 12
    torch.manual_seed(0)
    cfg = PEagleConfig.of_target(
        target.config, draft_vocab_size=16, aux_layer_ids=None, mask_token_id=61, num_depths=depths
    )
    drafter = PEagleDrafter(cfg)
    ids = torch.arange(0, 64, 4)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[ids] = True
    drafter.set_vocab(ids - torch.arange(16), t2d)
    with torch.no_grad():  # every weight drawn, the norms too: each path decides the drafts
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    drafter.eval()
    verifier = Verifier(str(tmp_path / "target"), ("Qwen3ForCausalLM",))
    out = get_kind("peagle").export(drafter, tmp_path / "export", "speculators", verifier)
    g = torch.Generator().manual_seed(3)
    aux, x = torch.randn(1, t, 3 * 32, generator=g), torch.randint(0, 60, (1, t), generator=g)
    next_ids = torch.cat([x[:, 1:], x.new_zeros(1, 1)], dim=1)  # the pair at t takes x[t + 1]
    # every chain at every depth, in speculators' order (depth by depth), inside the row
    anchors = torch.cat([torch.arange(t - d) for d in range(depths)])
    depth = torch.cat([torch.full((t - d,), d) for d in range(depths)])
    torch.save({"aux": aux, "next_ids": next_ids, "anchors": anchors, "depths": depth}, tmp_path / "in.pt")
    cmd = [str(venv / "bin" / "python"), str(PROBES / "peagle_speculators_probe.py"), str(out),
           str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["class"] == "PEagleDraftModel" and report["unexpected_keys"] == []
    assert report["mismatched_keys"] == [] and set(report["missing_keys"]) <= {"embed_tokens.weight"}
    assert report["layer_ids"] == list(cfg.aux_layer_ids) and report["mask_token_id"] == 61
    assert report["d2t"] == drafter.d2t.tolist()
    theirs = torch.load(tmp_path / "out.pt", weights_only=True)["drafts"]
    with torch.no_grad():
        mask_embed = mask_embedding(drafter, target, torch.float32)
        hidden = drafter.parallel(aux, target.embed(x), mask_embed, dense_anchors(1, t, depths, aux.device))
    ours = torch.cat([drafter.logits(h[0, : t - d]).argmax(-1) for d, h in enumerate(hidden)])
    # the row's last pair has no next token (each pads it its own way): every other element compared
    inside = torch.ones_like(ours, dtype=torch.bool)
    inside[t - 1] = False
    assert ours[inside].tolist() == theirs[inside].tolist()
    assert len(set(ours.tolist())) > 3  # drafts that differ by chain and depth: the comparison can fail
