"""DSpark's and DFlash2's exports are speculators' own: speculators 0.9.0's `DSparkDraftModel` and
`DFlash2DraftModel`, in a venv of their own, load them with no key missing, unexpected or different, and
draft the same tokens as DraftDeck's drafter on the same target hidden states (one block, drafted as the
kind's heads choose: the Markov bias, the selector over the top-k)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import context_from_hidden_states
from tests.conftest import PROBES
from tests.support.drafter import tiny_target
from tests.support.eval import speculators_venv

torch.set_num_threads(1)


def _drafter(kind: str, shape: DrafterConfig) -> DFlashDrafter:
    """A drafter of `kind` with every weight drawn at random (the convolutions and heads too, which
    start as the identity and near zero), so that each of its paths decides the drafts."""
    drafter: DFlashDrafter
    if kind == "dspark":
        drafter = DSparkDrafter(DSparkConfig(**asdict(shape), markov_rank=8))
    else:
        drafter = DFlash2Drafter(DFlash2Config(**asdict(shape), selector_rank=8, selector_top_k=4))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return drafter.eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_speculators_own_class_loads_the_export_and_drafts_the_same_tokens(tmp_path: Path, kind: str) -> None:
    venv = speculators_venv()
    target = tiny_target(0, vocab_size=64, hidden=32, layers=4)
    target.model.save_pretrained(tmp_path / "target")  # the verifier the export names
    shape = DrafterConfig.from_target(
        target.config, layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=63
    )
    drafter = _drafter(kind, shape)
    verifier = Verifier(str(tmp_path / "target"), ("Qwen3ForCausalLM",))
    out = get_kind(kind).export(drafter, tmp_path / "export", "speculators", verifier)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 63, (1, 14), generator=g)
    anchor = 6
    with torch.no_grad():
        states = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    aux = context_from_hidden_states(states, [1, 3])
    torch.save({"aux": aux, "ids": ids, "anchor": anchor}, tmp_path / "in.pt")
    cmd = [str(venv / "bin" / "python"), str(PROBES / "dflash_family_speculators_probe.py"), str(out),
           str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["class"] == {"dspark": "DSparkDraftModel", "dflash2": "DFlash2DraftModel"}[kind]
    assert (report["missing_keys"], report["unexpected_keys"], report["mismatched_keys"]) == ([], [], [])
    assert report["layer_ids"] == [2, 4]  # hidden_states indices: z-lab's layer ids + 1
    theirs = torch.load(tmp_path / "out.pt", weights_only=True)["drafts"].tolist()
    source = DFlashSource(drafter, target, drafter.slots)
    committed = ids[0, : anchor + 1].tolist()
    source.begin(committed)
    source.observe(aux[0, :anchor])
    ours = source.propose(committed, drafter.slots - 1)
    assert ours == theirs and len(ours) == (4 if kind == "dspark" else 3)
