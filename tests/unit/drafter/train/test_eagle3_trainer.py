"""An EAGLE-3 run end to end on a tiny learnable target (CPU): it trains (loss falls, the held-out walk
rises), its checkpoint carries the draft vocabulary of the training split and refuses to resume
under another, real speculative decoding is lossless and equals the walk over the target's own
answers, and both export formats read back as the trained drafter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.export.drafters import load_drafter
from draftdeck.drafter.export.folder import resolve_checkpoint
from draftdeck.drafter.export.params import ExportParams, run_export
from draftdeck.drafter.kinds.eagle3.export import load_eagle3
from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter
from draftdeck.drafter.train.data import TrainData
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from draftdeck.shards.tools import vocab_of_counts
from tests.support.drafter import greedy_text, learnable_target, write_dataset

torch.set_num_threads(1)
STEPS = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("eagle3")
    target = learnable_target(root / "target")
    ds = write_dataset(root / "ds", greedy_text(target, 48), target)
    params = TrainParams(
        inputs=[str(ds)], target=str(target), out=str(root / "run"), drafter="eagle3", ttt_steps=STEPS,
        draft_vocab_size=20, batch_size=8, lr=1e-2, max_steps=30, checkpoint_every=15, eval_every=15,
        log_every=5, heldout_fraction=0.15, device="cpu",
    )  # fmt: skip
    ctx = LocalContext(root / "ctx")
    report = run_train(params, ctx)
    return {"root": root, "target": target, "ds": ds, "params": params, "ctx": ctx, "report": report}


def _tau(ctx: LocalContext, walk: str) -> list[float]:
    acc, steps = ctx.series(f"heldout/{walk}/accepted"), ctx.series(f"heldout/{walk}/steps")
    return [1 + a / s for (_, a), (_, s) in zip(acc, steps, strict=True)]


def test_an_eagle3_run_trains_and_records_its_kind(trained: dict[str, Any]) -> None:
    ctx, root = trained["ctx"], trained["root"]
    loss = [v for _, v in ctx.series("train/loss")]
    assert loss[-1] < loss[0] / 5, loss
    assert _tau(ctx, "target_walked")[-1] > 2.0  # judged by the target's own answers, incl. bonus
    assert _tau(ctx, "walked")[-1] > 2.0
    for k in range(1, STEPS + 1):  # TTT step k - 1 is slot k: the charts' per-position series
        assert ctx.total(f"train/pos/{k}/total") > 0
    assert not ctx.series(f"train/pos/{STEPS + 1}/total")
    run = json.loads((root / "run/run.json").read_text())
    assert run["drafter"]["kind"] == "eagle3" and run["drafter"]["ttt_steps"] == STEPS
    assert "TTT steps" in run["loss"]
    said = [m for _, m, _, _ in ctx.events if m.startswith("drafter: ")]
    assert said == [
        f"drafter: EAGLE-3, {STEPS} TTT steps over 20 draft ids from the training split, covering"
        f" {run['drafter']['draft_vocab_coverage']:.1%} of the training split's trained tokens"
    ]
    assert run["memory"]["phase"] in ("training step", "held-out pass")
    assert trained["report"].rows_in == run["data"]["rows_in"]


def test_the_checkpoint_holds_the_training_splits_draft_vocabulary(trained: dict[str, Any]) -> None:
    drafter = load_drafter(trained["root"] / "run")
    assert isinstance(drafter, Eagle3Drafter)
    data = TrainData([trained["ds"]], heldout_fraction=0.15)
    want = vocab_of_counts(data.trained_token_counts(drafter.config.vocab_size), 20)
    assert torch.equal(drafter.d2t, torch.from_numpy(want.d2t))
    assert torch.equal(drafter.t2d, torch.from_numpy(want.t2d))
    assert int(drafter.t2d.sum()) == 20


def test_resume_refuses_a_checkpoint_with_another_draft_vocabulary(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    import shutil

    shutil.copytree(trained["root"] / "run", run)
    latest = max((run / "checkpoints").glob("step-*"))
    state = load_file(str(latest / "model.safetensors"))
    ids = state["t2d"].nonzero()[:, 0]
    moved = ids.clone()
    moved[-1] = int(torch.nonzero(~state["t2d"])[-1])  # one id swapped for another: a regenerated mapping
    moved, _ = moved.sort()
    state["t2d"] = torch.zeros_like(state["t2d"])
    state["t2d"][moved] = True
    state["d2t"] = moved - torch.arange(len(moved))
    save_file(state, str(latest / "model.safetensors"))
    params = trained["params"].model_copy(update={"out": str(run), "max_steps": 31})
    with pytest.raises(UsageError, match=r"draft vocabulary .* pin its mapping"):
        run_train(params, LocalContext(tmp_path / "ctx"))
    # the remedy the error names: the checkpoint's own mapping pinned, the run resumes on it
    pinned = params.model_copy(
        update={"draft_vocab": str(latest / "model.safetensors"), "draft_vocab_size": None}
    )
    with pytest.raises(UsageError, match=r"draft_vocab_size 19 but .* holds 20"):
        run_train(pinned.model_copy(update={"draft_vocab_size": 19}), LocalContext(tmp_path / "ctx"))
    ctx = LocalContext(tmp_path / "ctx")
    run_train(pinned, ctx)
    assert any(
        m.startswith("drafter: EAGLE-3, 3 TTT steps over 20 draft ids from /") for _, m, _, _ in ctx.events
    )
    newest = max((run / "checkpoints").glob("step-*"))
    assert newest.name != latest.name  # a step further
    resumed = load_drafter(newest)
    assert isinstance(resumed, Eagle3Drafter) and torch.equal(resumed.t2d, state["t2d"])
    said = json.loads((run / "run.json").read_text())["drafter"]["draft_vocab_from"]
    assert said.endswith("model.safetensors")


def test_eagle3_options_are_refused_on_a_dflash_run() -> None:
    """Not ignored: a DFlash run given a draft vocabulary or tapped layers says they are EAGLE-3's."""
    with pytest.raises(ValueError, match="draft_vocab: an EAGLE-3 option"):
        TrainParams(inputs=["x"], target="t", draft_vocab="v.npz")
    with pytest.raises(ValueError, match="draft_vocab, eagle3_layer_ids: EAGLE-3 options"):
        TrainParams(inputs=["x"], target="t", draft_vocab="v.npz", eagle3_layer_ids=[1, 2, 3])
    TrainParams(inputs=["x"], target="t", drafter="eagle3", draft_vocab="v.npz")


def test_real_decoding_is_lossless_and_equals_the_walk(trained: dict[str, Any]) -> None:
    root = trained["root"]
    params = EvalParams(
        checkpoint=str(root / "run"), target=str(trained["target"]), inputs=[str(trained["ds"])],
        out=str(root / "eval"), max_prompts=6, max_new_tokens=28, heldout_fraction=0.15, device="cpu",
    )  # fmt: skip
    ev = run_eval(params, LocalContext(root / "ectx")).extra["eval"]
    assert ev["drafter"] == "eagle3" and ev["block_size"] == STEPS + 1
    assert ev["lossless"] is True
    real = ev["methods"]["drafter"]["tau_incl_bonus_pooled"]
    assert real == pytest.approx(ev["walked"]["tau_incl_bonus"], abs=1e-9)  # the walk is that decoding
    assert real > 2.0 and real > ev["methods"]["untrained"]["tau_incl_bonus_pooled"] + 0.5
    # the run's held-out figures for this checkpoint beside real decoding on the prompts its target answered
    # (decoded as long as the rows' answers, 28 tokens: the run's target answered its prompts as long)
    training = ev["training"]
    assert training["target_judged_tau_incl_bonus"] == pytest.approx(
        training["real_tau_incl_bonus"], rel=0.05
    )
    sampled = run_eval(
        params.model_copy(update={"mode": "sampled", "temperature": 1.0, "out": str(root / "eval-sampled")}),
        LocalContext(root / "ectx-sampled"),
    ).extra["eval"]
    methods = sampled["methods"]  # the target samples, drafts accepted by the speculative-sampling rule
    assert sampled["lossless"] is None and sampled["training"] is None
    assert methods["drafter"]["tau_incl_bonus_pooled"] > methods["untrained"]["tau_incl_bonus_pooled"]


@pytest.mark.parametrize("fmt", ["auto", "sglang"])
def test_both_export_formats_read_back_as_the_trained_drafter(trained: dict[str, Any], fmt: str) -> None:
    root = trained["root"]
    out = root / f"export-{fmt}"
    report = run_export(
        ExportParams(inputs=[str(root / "run")], out=str(out), target=str(trained["target"]), format=fmt),
        LocalContext(root / f"xctx-{fmt}"),
    )
    assert report.extra["format"] == ("speculators" if fmt == "auto" else "sglang")
    served = {r["server"]: r for r in report.extra["served"]}
    assert served["vllm"]["problems"] == [] and f'num_speculative_tokens": {STEPS}' in served["vllm"]["flags"]
    assert (served["sglang"]["problems"] == []) == (fmt == "sglang")
    saved = load_drafter(resolve_checkpoint(root / "run")).state_dict()
    back = load_eagle3(out).state_dict()
    assert saved.keys() == back.keys()
    assert all(torch.equal(saved[k], back[k]) for k in saved)


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_rank(trained: dict[str, Any], tmp_path: Path, sharding: str) -> None:
    """Over 2 gloo ranks (each half the batch; the drafter whole on each, its gradients summed; under
    fsdp the target's layers sharded and its head and embedding split by vocabulary): the same
    losses, counts and weights as one rank at the same global batch."""
    from safetensors.torch import load_file

    from draftdeck.drafter.train.run import train

    base = trained["params"].model_copy(update={"max_steps": 4, "checkpoint_every": 4, "eval_every": 4})
    one, two = LocalContext(tmp_path / "c1"), LocalContext(tmp_path / "c2")
    train(base.model_copy(update={"out": str(tmp_path / "r1")}), one)
    record = train(base.model_copy(update={"out": str(tmp_path / "r2"), "devices": 2, "batch_size": 4}), two)
    assert record.sharding["strategy"] == "ddp" and "EAGLE-3" in record.sharding["why"]
    for name in ("train/loss", "heldout/loss"):
        a, b = dict(one.series(name)), dict(two.series(name))
        assert sorted(a) == sorted(b) and all(b[s] == pytest.approx(a[s], rel=1e-4) for s in a), name
    for name in (
        "train/pos/1/total",
        "train/pos/3/correct",
        "heldout/walked/steps",
        "heldout/walked/accepted",
    ):
        assert one.series(name) == two.series(name), name
    w1 = load_file(str(tmp_path / "r1/checkpoints/step-00000004/model.safetensors"))
    w2 = load_file(str(tmp_path / "r2/checkpoints/step-00000004/model.safetensors"))
    assert all(torch.allclose(w1[k].float(), w2[k].float(), atol=1e-5) for k in w1)
