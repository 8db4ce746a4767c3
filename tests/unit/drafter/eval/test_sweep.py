"""The sweep: its grid read as typed eval options and refused by name; the Pareto front and the
recommendation on points whose answer is known; one real sweep on the tiny world whose rows are the
evals of the same points and whose flags serve the recommended block."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.sweep_front import (
    RULE,
    Point,
    _with_options,
    pareto_front,
    recommend,
    serving_flags,
)
from draftdeck.drafter.eval.sweep_params import SweepParams, sweepable
from draftdeck.drafter.kinds import get_kind
from draftdeck.jobs.context import LocalContext
from tests.support.sweep import MAX_NEW, RealSweep, real_sweep

torch.set_num_threads(1)
BASE = {"inputs": ["ckpt"], "target": "target", "prompts": ["prompts.jsonl"]}


def _refusal(**kw: Any) -> str:
    with pytest.raises(ValidationError) as e:
        SweepParams.model_validate({**BASE, **kw})
    return str(e.value)


def test_the_grid_is_typed_by_the_evals_own_fields_and_every_combination_is_a_point() -> None:
    p = SweepParams.model_validate(
        {**BASE, "mode": "sampled", "grid": ["block_size=none,4", "temperature=0.5,1"]}
    )
    assert p.points() == [
        {"block_size": None, "temperature": 0.5}, {"block_size": None, "temperature": 1.0},
        {"block_size": 4, "temperature": 0.5}, {"block_size": 4, "temperature": 1.0},
    ]  # fmt: skip
    ev = p.point_params(p.points()[3])
    assert (ev.block_size, ev.temperature, ev.mode, ev.checkpoint, ev.inputs) == (
        4, 1.0, "sampled", "ckpt", ["prompts.jsonl"]
    )  # fmt: skip
    # every scalar eval option but paths and the served comparison's; the tree options too, once there
    assert {"block_size", "mode", "temperature", "confidence_threshold", "seed"} <= set(sweepable())
    assert not {"target", "checkpoint", "out", "inputs", "served_url"} & set(sweepable())


def test_chains_and_trees_sweep_in_one_grid_the_chain_once_its_tree_shape_unset() -> None:
    p = SweepParams.model_validate({**BASE, "grid": ["tree_budget=0,16", "tree_topk=2,4"]})
    assert p.points() == [
        {"tree_budget": 0, "tree_topk": None}, {"tree_budget": 16, "tree_topk": 2},
        {"tree_budget": 16, "tree_topk": 4},
    ]  # fmt: skip
    assert p.point_params(p.points()[0]).tree_topk is None
    # without the budget on the grid, a top-k grid shapes no tree: refused as the eval refuses it
    assert "give tree_budget > 0" in _refusal(grid=["tree_topk=2,4"])


def test_a_bad_grid_is_refused_by_name_before_work() -> None:
    said = _refusal(grid=["draft_depth=2,3"])
    assert "'draft_depth' is not a sweepable eval option" in said and "block_size" in said
    assert "grid block_size=1: Input should be greater than or equal to 2" in _refusal(
        grid=["block_size=1,4"]
    )
    assert "grid mode=beam" in _refusal(grid=["mode=greedy,beam"])
    assert "write PARAM=V1,V2" in _refusal(grid=["block_size"])
    assert "a value is repeated" in _refusal(grid=["block_size=4,4"])
    assert "block_size is given twice" in _refusal(grid=["block_size=2", "block_size=4"])
    assert "also given as an option" in _refusal(block_size=4, grid=["block_size=2,8"])
    # a combination the eval refuses names the point
    said = _refusal(grid=["temperature=0.5,1"])
    assert "grid point temperature=0.5" in said and "mode 'sampled' only" in said


def test_the_command_refuses_a_bad_grid_by_name_before_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdeck.cli import app

    args = ["sweep", "ckpt", "--target", "t", "--prompts", "p.jsonl", "--grid", "tree_size=8,16"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")], terminal_width=200)
    said = " ".join(res.output.split())  # the console wraps at its width
    assert (
        res.exit_code == 2 and "'tree_size' is not a sweepable eval option" in said and "tree_budget" in said
    )
    assert not (tmp_path / "out").exists()


def _pt(n: int, tau_x2: int, tps: float, lossless: bool | None = True) -> Point:
    """A point of tau `tau_x2 / 2` over 2 steps and `tps` tokens over one second."""
    return Point(n, {"block_size": n}, f"points/{n}/eval.json", "drafter", 4, tau_x2 - 2, 2, None,
                 int(tps), 1.0, 100, 1.0, lossless)  # fmt: skip


def test_the_front_keeps_what_no_point_beats_on_both_and_the_fastest_lossless_point_is_recommended() -> None:
    points = [_pt(0, 6, 300), _pt(1, 8, 200), _pt(2, 5, 250), _pt(3, 8, 150), _pt(4, 4, 400, False)]
    # 2 is beaten by 0 (faster, higher tau); 3 by 1; 4 is fastest but lost the target's output
    assert [p.point for p in pareto_front(points)] == [4, 0, 1]
    assert points[1].tau == 4.0 and points[1].speedup == 2.0
    best = recommend(points)
    assert best is not None and best.point == 0
    assert "lossless" in RULE and "never recommended" in RULE
    sampled = [_pt(0, 6, 300, None), _pt(1, 8, 500, None)]  # lossless in distribution: both may serve
    assert recommend(sampled) == sampled[1]
    assert recommend([_pt(0, 6, 300, False)]) is None


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> RealSweep:
    return real_sweep(tmp_path_factory.mktemp("sweep"))


def test_a_real_sweep_writes_one_row_per_point_equal_to_the_eval_of_that_point(
    swept: RealSweep, tmp_path: Path
) -> None:
    stored = swept.result  # sweep.json: the report the run returned, but the file it lists (itself)
    assert stored["sweep"] == json.loads(json.dumps(swept.report["sweep"])) and stored["rows_out"] == 4
    assert [o["path"] for o in swept.report["outputs"]] == [str(swept.out / "sweep.json")]
    sweep = stored["sweep"]
    points = [Point.from_json(p) for p in sweep["points"]]
    assert [p.params for p in points] == [
        {"block_size": 2, "mode": "greedy"}, {"block_size": 2, "mode": "sampled"},
        {"block_size": 4, "mode": "greedy"}, {"block_size": 4, "mode": "sampled"},
    ]  # fmt: skip
    # a point's row is its eval's: the same counts as an eval run alone at that point
    for p in (points[2], points[3]):
        alone = EvalParams(inputs=[str(swept.world.prompts)], target=str(swept.world.target_dir),
                           checkpoint=str(swept.checkpoint), max_new_tokens=MAX_NEW, **p.params)  # fmt: skip
        ev = run_eval(alone, LocalContext(tmp_path / str(p.point))).extra["eval"]
        again = Point.from_eval(p.point, p.params, p.eval_json, ev)
        counts = ("accepted", "verify_steps", "verified", "tokens", "target_tokens", "lossless", "block_size")
        assert {k: getattr(again, k) for k in counts} == {k: getattr(p, k) for k in counts}
        # the eval alone decodes its baselines too; the sweep's points skip them (a third of the work)
        point_eval = json.loads((swept.out / p.eval_json).read_text())["eval"]
        assert list(ev["methods"]) == ["drafter", "untrained", "prompt_lookup"]
        assert list(point_eval["methods"]) == ["drafter"]
    assert [p.lossless for p in points] == [True, None, True, None]
    assert all(p.tau is not None and p.tau >= 1 and p.tokens_per_s for p in points)
    # a chain verifies the anchor and the block's drafts: at most the block a step (fewer near the end)
    assert all(p.verified_per_step is not None and 1 < p.verified_per_step <= p.block_size for p in points)
    assert sweep["pareto"] == [p.point for p in pareto_front(points)]
    best = recommend(points)
    assert best is not None and sweep["recommended"] == best.point
    # the flags serve the recommended point's block: vLLM drafts block - 1, SGLang's block counts the anchor
    vllm = next(r for r in sweep["serving"] if r["server"] == "vLLM")
    assert f'"num_speculative_tokens": {best.block_size - 1}' in vllm["flags"]
    assert all(f"--speculative-num-draft-tokens {best.block_size}" in r["flags"]
               for r in sweep["serving"] if r["server"] == "SGLang")  # fmt: skip
    assert "carry over to a GPU" in sweep["note"] and sweep["device"] == "cpu" and sweep["clock"] == "cpu"
    # the job's progress counts every point's prompts; its log names the point a line is about
    assert swept.ctx.last_progress == (4 * 3, 4 * 3, "prompts")
    assert any(m.startswith("point 4/4 (block_size 4, mode sampled): ") for _, m, _, _ in swept.ctx.events)


def test_a_tree_point_is_served_with_the_kinds_tree_options_or_says_none_is_known(swept: RealSweep) -> None:
    tree = {"budget": 8, "topk": 2, "depth": 3}
    point = Point(
        0, {"tree_budget": 8}, "points/0/eval.json", "drafter", 4, 6, 2, 18, 8, 1.0, 8, 1.0, True, tree
    )
    readings = serving_flags(point, str(swept.checkpoint), str(swept.world.target_dir))
    sglang = [r for r in readings if r["server"] == "SGLang"]
    assert sglang and all(r["flags"].endswith("--speculative-ddtree-budget 8") for r in sglang)
    vllm = next(r for r in readings if r["server"] == "vLLM")
    assert "ddtree" not in vllm["flags"] and any("these flags serve chains" in p for p in vllm["problems"])
    # EAGLE-3's tree in SGLang: depth in steps, top-k, verified nodes with the root; vLLM knows none
    eagle3 = get_kind("eagle3")
    assert eagle3.tree_flags("sglang", tree) == (
        "--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 9"
    )
    assert eagle3.tree_flags("vllm", tree) is None
    # appended to the chain's line, the tree's options replace the values it gave them
    chain = "launch --speculative-algorithm EAGLE3 --speculative-eagle-topk 1 --speculative-num-steps 7"
    assert _with_options(chain, "--speculative-num-steps 3 --speculative-eagle-topk 2") == (
        "launch --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 2"
    )
