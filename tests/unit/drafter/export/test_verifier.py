"""Every kind whose export names its verifier (speculators' `speculators_config`: EAGLE-3, DFlash2,
DSpark) names the target the run's record names when no target is given, with the architectures of
its config.json, and refuses an export that could name none, with the flag to add. A run folder, its
checkpoints/ folder and one of its checkpoints all find the record."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.export.drafters import export_drafter
from draftdeck.drafter.export.params import ExportParams, run_export
from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import tiny_target_config

NAMING = ["eagle3", "dflash2", "dspark"]  # the kinds whose export names the verifier


def _drafter(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    target = tiny_target_config(vocab_size=64, hidden=32, layers=4)
    if kind == "eagle3":
        drafter = Eagle3Drafter(Eagle3Config.from_target(target.to_dict(), draft_vocab_size=16))
        ids = torch.arange(0, 64, 4)
        t2d = torch.zeros(64, dtype=torch.bool)
        t2d[ids] = True
        drafter.set_vocab(ids - torch.arange(16), t2d)
        return drafter.eval()
    shape = DrafterConfig.from_target(
        target, layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=63
    )
    if kind == "dspark":
        return DSparkDrafter(DSparkConfig(**asdict(shape), markov_rank=8)).eval()
    return DFlash2Drafter(DFlash2Config(**asdict(shape), selector_rank=8, selector_top_k=4)).eval()


def _run(root: Path, kind: str) -> tuple[Path, Path]:
    """A train run's folder as the trainer leaves it: a checkpoint in the kind's checkpoint format,
    checkpoints/index.json, and run.json naming the target (a folder with the target's config.json)."""
    target = root / "target"
    target.mkdir(parents=True)
    config = tiny_target_config(vocab_size=64, hidden=32, layers=4, architectures=["Qwen3ForCausalLM"])
    config.save_pretrained(target)
    run = root / "run"
    step = run / "checkpoints" / "step-00000002"
    fmt = "sglang" if kind == "eagle3" else "speculators"  # EAGLE-3 checkpoints are the flat format
    get_kind(kind).export(_drafter(kind), step, fmt, None)
    index = {"checkpoints": [{"step": 2, "path": step.name}], "best": 2}
    (run / "checkpoints" / "index.json").write_text(json.dumps(index))
    (run / "run.json").write_text(json.dumps({"target": str(target), "inputs": []}))
    return run, target


@pytest.mark.parametrize("kind", NAMING)
def test_an_export_names_the_runs_target_and_its_architectures(tmp_path: Path, kind: str) -> None:
    run, target = _run(tmp_path, kind)
    for i, given in enumerate((run, run / "checkpoints", run / "checkpoints" / "step-00000002")):
        out, _ = export_drafter(given, tmp_path / f"export-{i}")
        verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
        assert verifier == {"name_or_path": str(target), "architectures": ["Qwen3ForCausalLM"]}
    # the job says which target, and its launch lines name it: none of them reads <target>
    report = run_export(
        ExportParams(inputs=[str(run)], out=str(tmp_path / "job")), LocalContext(tmp_path / "c")
    )
    assert report.extra["target"] == str(target)
    served = {r["server"]: r for r in report.extra["served"]}
    assert all("<target>" not in r["flags"] for r in served.values())
    assert str(target) in served["vllm"]["flags"] and served["vllm"]["problems"] == []
    # a target given explicitly wins over the record
    other = tmp_path / "other"
    shutil.copytree(target, other)
    out, _ = export_drafter(run, tmp_path / "export-other", target=str(other))
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"][
        "name_or_path"
    ] == str(other)


@pytest.mark.parametrize("kind", NAMING)
def test_an_export_that_could_name_no_verifier_is_refused_with_the_flag_to_add(
    tmp_path: Path, kind: str
) -> None:
    run, target = _run(tmp_path, kind)
    shutil.rmtree(target)  # the run was trained on another machine
    with pytest.raises(UsageError, match=r"run\.json names the target .*not a folder here.*add --target"):
        export_drafter(run, tmp_path / "export")
    assert not (tmp_path / "export").exists()
    loose = tmp_path / "loose"  # a checkpoint copied out of its run: no record beside it
    shutil.copytree(run / "checkpoints" / "step-00000002", loose)
    with pytest.raises(UsageError, match=r"no run record .* add --target"):
        export_drafter(loose, tmp_path / "export")


def test_a_format_that_names_no_verifier_exports_without_one(tmp_path: Path) -> None:
    """EAGLE-3's flat format and DFlash's z-lab format name no verifier: no target is needed."""
    run, target = _run(tmp_path, "eagle3")
    shutil.rmtree(target)
    out, fmt = export_drafter(run, tmp_path / "flat", "sglang")
    assert fmt == "sglang" and "speculators_config" not in json.loads((out / "config.json").read_text())
    assert get_kind("dflash").verifier_formats == ()
    assert Verifier("t").to_dict() == {"name_or_path": "t", "architectures": []}
