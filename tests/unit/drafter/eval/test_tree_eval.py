"""The eval job with --tree-budget on the tiny world: lossless, tau incl. bonus at least the chain's on
the same prompts, the tree and the verified tokens per step recorded in eval.json; the tree options
are refused without a budget, and a hybrid target's tree before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.support.eval import build_world, trained_checkpoint

torch.set_num_threads(1)
MAX_NEW = 24


def _eval(world: Any, checkpoint: Path, out: Path, **kw: Any) -> dict[str, Any]:
    params = EvalParams(inputs=[str(world.prompts)], target=str(world.target_dir), checkpoint=str(checkpoint),
                        max_new_tokens=MAX_NEW, **kw)  # fmt: skip
    ctx = LocalContext(out)
    run_eval(params, ctx)
    ev: dict[str, Any] = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    return ev


def test_a_tree_eval_is_lossless_records_its_tree_and_accepts_at_least_the_chain(tmp_path: Path) -> None:
    world = build_world(tmp_path / "world", n_prompts=4)
    checkpoint = trained_checkpoint(world, tmp_path / "drafter", max_new=MAX_NEW, steps=30)
    chain = _eval(world, checkpoint, tmp_path / "chain")
    tree = _eval(world, checkpoint, tmp_path / "tree", tree_budget=8, tree_topk=3)
    assert chain["tree"] is None and tree["tree"] == {"budget": 8, "topk": 3, "depth": 3}
    assert "8 nodes" in tree["tree_label"]
    assert tree["lossless"] is True and tree["methods"]["untrained"]["lossless"] is True
    drafted, chained = tree["methods"]["drafter"], chain["methods"]["drafter"]
    assert drafted["tau_incl_bonus_pooled"] >= chained["tau_incl_bonus_pooled"] > 1.0
    # each verify forward ran the anchor and up to 8 nodes; a chain of B = 4 ran 4
    c = drafted["counts"]
    assert c["verify_steps"] < c["verified"] <= 9 * c["verify_steps"]
    assert drafted["verified_per_step"] == pytest.approx(c["verified"] / c["verify_steps"])
    assert chained["counts"]["verified"] == chained["counts"]["verify_steps"] + chained["counts"]["proposed"]
    assert tree["methods"]["prompt_lookup"]["counts"]["verified"] > 0  # still a chain


def test_tree_options_need_a_budget() -> None:
    base = dict(inputs=["p.jsonl"], target="t", checkpoint="c")
    with pytest.raises(ValidationError, match="tree_budget > 0"):
        EvalParams(**base, tree_topk=3)
    with pytest.raises(ValidationError, match="tree_budget > 0"):
        EvalParams(**base, tree_depth=2)
    with pytest.raises(ValidationError, match="confidence_threshold"):
        EvalParams(**base, tree_budget=8, confidence_threshold=0.5)


def test_a_hybrid_targets_tree_is_refused_by_name_before_any_work(tmp_path: Path) -> None:
    target = tmp_path / "qwen35"
    tiny_causal_lm("qwen3_5", vocab_size=64).save_pretrained(target)
    out = tmp_path / "out"
    params = EvalParams(inputs=[str(tmp_path / "none.jsonl")], target=str(target),
                        checkpoint=str(tmp_path / "no"), out=str(out), tree_budget=8)  # fmt: skip
    with pytest.raises(UsageError, match=r"qwen3_5\w* hybrid.*linear_attention"):
        run_eval(params, LocalContext(tmp_path / "job"))
    assert not out.exists()  # refused before the checkpoint, the prompts or the output folder
