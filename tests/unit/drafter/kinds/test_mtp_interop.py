"""The MTP kind's speculators export is speculators' own: 0.9.0's `MTPDraftModel`, in a venv of its own,
loads it with no key missing, unexpected or different (its embedding and LM head read from the verifier
the config names), and drafts what DraftDeck's MTP layer drafts on the same target hidden states: the
first draft at every position (its own teacher-forced forward) and a chain of 5 after the last."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.mtp.checkpoint import from_target
from draftdeck.drafter.kinds.mtp.source import MTPSource
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from tests.conftest import PROBES
from tests.support.eval import speculators_venv

torch.set_num_threads(1)


@pytest.mark.slow
def test_speculators_own_class_loads_the_mtp_export_and_drafts_the_same_tokens(tmp_path: Path) -> None:
    venv = speculators_venv()
    model = tiny_causal_lm("qwen3_5", seed=4)
    model.save_pretrained(tmp_path / "target")  # the verifier the export names, its embedding and head
    target = Target(model, tmp_path / "target")
    drafter = from_target(tmp_path / "target", target.config)
    drafter.drafts = 4
    verifier = Verifier(str(tmp_path / "target"), ("Qwen3_5ForCausalLM",))
    out = get_kind("mtp").export(drafter, tmp_path / "export", "speculators", verifier)
    ids = torch.randint(0, 290, (1, 15), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    torch.save({"hidden": hidden, "ids": ids, "chain": 5}, tmp_path / "in.pt")
    cmd = [str(venv / "bin" / "python"), str(PROBES / "mtp_speculators_probe.py"), str(out),
           str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["class"] == "MTPDraftModel" and report["steps"] == 4
    assert (report["missing_keys"], report["unexpected_keys"], report["mismatched_keys"]) == ([], [], [])
    assert report["target_layer_ids"] == [4]  # hidden_states[L]: the target's last, after its norm
    theirs = torch.load(tmp_path / "out.pt", weights_only=True)

    drafter.share_head(target.lm_head)
    with torch.no_grad():
        step0 = drafter.logits(drafter.ttt(hidden, target.embed(ids), 1)[0]).argmax(-1)[0]
    first = theirs["first"].tolist()
    assert step0[: len(first)].tolist() == first and len(first) == 15 - 4 - 1
    source = MTPSource(drafter, target)
    committed = ids[0].tolist()
    source.begin(committed)
    source.observe(hidden[0, :14])
    assert source.propose(committed, 5) == theirs["chain"].tolist()
