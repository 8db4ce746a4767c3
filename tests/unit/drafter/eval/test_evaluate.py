"""The eval job end to end on a tiny target: eval.json with tau incl. bonus (pooled and per
response), histogram, acceptance rate, per-position acceptance, speeds, losslessness for the
drafter and both baselines; metric points as counts; bad prompt rows rejected with reasons; the
walked tau of the checkpoint equals real greedy tau on the target's own outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import TargetRunner
from draftdeck.drafter.eval.versus import Real, RunFigures, decoder_mismatch, versus_training
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.conftest import PROBES
from tests.support.eval import TinyWorld, build_world, trained_checkpoint
from tests.support.provenance import assert_provenance

torch.set_num_threads(1)
MAX_NEW = 32


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> TinyWorld:
    return build_world(tmp_path_factory.mktemp("eval-world"), n_prompts=6)


@pytest.fixture(scope="module")
def checkpoint(world: TinyWorld, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_checkpoint(world, tmp_path_factory.mktemp("ckpt") / "drafter", max_new=MAX_NEW, steps=30)


def _run(world: TinyWorld, checkpoint: Path, tmp_path: Path, **kw) -> tuple[dict, LocalContext]:
    ctx = LocalContext(tmp_path / "job")
    params = EvalParams(
        inputs=kw.pop("inputs", world.prompts),
        target=world.target_dir,
        checkpoint=checkpoint,
        max_new_tokens=MAX_NEW,
        **kw,
    )
    report = run_eval(params, ctx)
    data = json.loads((ctx.out_dir / "eval.json").read_text())
    assert data["rows_in"] == report.rows_in
    return data, ctx


def test_greedy_eval_reports_counts_baselines_and_lossless(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    data, ctx = _run(world, checkpoint, tmp_path)
    ev = data["eval"]
    assert data["rows_in"] == data["rows_out"] == 6 and ev["block_size"] == 4
    assert ev["lossless"] is True
    assert "incl. bonus" in ev["tau_label"]
    for name in ("drafter", "untrained", "prompt_lookup"):
        m = ev["methods"][name]
        c = m["counts"]
        assert m["lossless"] is True and m["first_difference"] is None
        # +1 prefill token each; a last bonus past the stop is dropped (at most one per response)
        extra = c["accepted"] + c["verify_steps"] + c["responses"] - c["tokens"]
        assert 0 <= extra <= c["responses"]
        assert sum(c["hist_tau_incl_bonus"].values()) == c["verify_steps"]
        assert m["tau_incl_bonus_pooled"] == pytest.approx(
            (c["accepted"] + c["verify_steps"]) / c["verify_steps"]
        )
        assert m["acceptance_rate"] == pytest.approx(c["accepted"] / c["proposed"])
        # per-position (vLLM): drafts that accepted more than i tokens; they sum to tau - 1
        assert sum(m["per_pos_acceptance"]) == pytest.approx(m["tau_incl_bonus_pooled"] - 1)
        assert m["tokens_per_s"] > 0 and m["speedup_vs_target_only"] > 0
        # z-lab's convention: the tokens the steps produced (all but each prefill token) per step;
        # below tau incl. bonus by exactly the bonus tokens the stops dropped
        assert c["produced_by_steps"] == c["tokens"] - c["responses"]
        assert m["tokens_per_step"] == pytest.approx(c["produced_by_steps"] / c["verify_steps"])
        assert c["accepted"] + c["verify_steps"] - c["produced_by_steps"] == extra
    assert "vLLM" in ev["conventions"] and "z-lab" in ev["conventions"]
    assert (
        ev["methods"]["drafter"]["tau_incl_bonus_pooled"]
        > ev["methods"]["untrained"]["tau_incl_bonus_pooled"]
    )
    assert ev["methods"]["untrained"]["tau_incl_bonus_pooled"] < 1.3
    assert ev["target_only"]["tokens_per_s"] > 0
    assert_provenance(ev["provenance"])  # the versions and device that decided these figures
    assert ev["provenance"]["parameters"]["max_new_tokens"] == MAX_NEW
    # metric points are counts that sum to the report's
    dc = ev["methods"]["drafter"]["counts"]
    assert ctx.total("eval/accepted") == dc["accepted"] and ctx.total("eval/steps") == dc["verify_steps"]
    assert ctx.total("eval/produced") == dc["produced_by_steps"]
    assert ctx.total("eval/pos/0/accepted") == dc["per_pos_accepted_more_than"]["0"]
    assert ctx.total("eval/hist/4") == dc["hist_tau_incl_bonus"]["4"]


def test_walked_tau_equals_real_greedy_tau_on_the_targets_own_outputs(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    data, ctx = _run(world, checkpoint, tmp_path)
    ev = data["eval"]
    real = ev["methods"]["drafter"]
    assert 1.2 < real["tau_incl_bonus_pooled"] < 4  # a partly trained drafter: the comparison means something
    assert ev["walked"]["steps"] == real["counts"]["verify_steps"]
    assert ev["walked"]["accepted"] == real["counts"]["accepted"]
    assert ev["walked"]["tokens_per_step"] == pytest.approx(real["tokens_per_step"])  # both conventions agree
    assert ev["walked"]["hist_tau_incl_bonus"] == real["counts"]["hist_tau_incl_bonus"]
    assert ctx.alerts == []


def test_sampled_mode_is_not_checked_token_by_token_and_raises_no_alert(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    data, ctx = _run(world, checkpoint, tmp_path, mode="sampled", temperature=1.5, seed=3)
    m = data["eval"]["methods"]["drafter"]
    assert m["lossless"] is None and "in distribution" in m["first_difference"]
    assert m["counts"]["verify_steps"] > 0
    assert ctx.alerts == []  # walked (argmax) and sampled acceptance measure different things


def test_real_tau_per_mix_source_counts_sum_to_the_whole(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    """Prompts from two mix sources (their provenance names them): the drafter's counts per source, in
    eval.json and as metric points, add up to its counts over every prompt."""
    mixed = tmp_path / "mixed.jsonl"
    lines = [json.loads(x) for x in world.prompts.read_text().splitlines()[:4]]
    for i, row in enumerate(lines):
        row["draftdeck_source"] = {"file": "/orig.jsonl", "row": i + 1, "source": ("chat", "code")[i % 2]}
    mixed.write_text("".join(json.dumps(r) + "\n" for r in lines))
    data, ctx = _run(world, checkpoint, tmp_path, inputs=mixed)
    ev = data["eval"]
    by, whole = ev["by_source"], ev["methods"]["drafter"]["counts"]
    assert sorted(by) == ["chat", "code"] and sum(b["prompts"] for b in by.values()) == 4
    assert sum(b["accepted"] for b in by.values()) == whole["accepted"]
    assert sum(b["steps"] for b in by.values()) == whole["verify_steps"]
    for name, b in by.items():
        assert b["tau_incl_bonus"] == pytest.approx(1 + b["accepted"] / b["steps"])
        assert ctx.total(f"eval/source/{name}/accepted") == b["accepted"]
        assert ctx.total(f"eval/source/{name}/steps") == b["steps"]
    assert "by_source" not in _run(world, checkpoint, tmp_path, max_prompts=1)[0]["eval"]  # one source


def test_decoder_mismatch_names_both_figures_above_the_tolerance() -> None:
    gap, message = decoder_mismatch(2.0, 2.08, 0.05)
    assert gap == pytest.approx(0.04) and message is None
    gap, message = decoder_mismatch(2.0, 4.1, 0.05)
    assert gap == pytest.approx(1.05)
    assert message is not None and "2.000 incl. bonus" in message and "4.100 incl. bonus" in message
    assert decoder_mismatch(float("nan"), 2.0, 0.05)[1] is None


def _figures(
    data: tuple[int, int], judged: tuple[int, int] | None, matched: tuple[int, int] | None = None
) -> RunFigures:
    e: dict[str, object] = {"step": 40, "heldout_walked_accepted": data[0], "heldout_walked_steps": data[1]}
    if judged:
        e |= {"heldout_target_walked_accepted": judged[0], "heldout_target_walked_steps": judged[1]}
    if matched:
        e |= {"heldout_matched_walked_accepted": matched[0], "heldout_matched_walked_steps": matched[1]}
    return RunFigures(e)


def test_versus_training_calls_a_data_judged_tau_above_real_decoding_off_target_data() -> None:
    # real 2.0; data-judged 3.0 (+50 %), target-judged 2.04 (+2 %): the table's second row
    figures, alarm = versus_training(Real(2.0, 30), _figures((200, 100), (104, 100)), 0.05, 0.10)
    assert figures is not None and figures["data_judged_gap"] == pytest.approx(0.5)
    assert alarm is not None and alarm[0] == "data_not_target_output"
    named = (
        "real tau 2.000 (all 30 prompts)",
        "judged by the data 3.000",
        "by the target (its own answers) 2.040",
    )
    assert all(f in alarm[1] for f in named)
    # data-judged below real (the target's own sampled answers): no alarm
    assert versus_training(Real(2.0, 30), _figures((90, 100), (100, 100)), 0.05, 0.10)[1] is None
    # the target-judged estimate itself off: another kind, naming the same figures
    alarm = versus_training(Real(2.0, 30), _figures((100, 100), (150, 100)), 0.05, 0.10)[1]
    assert alarm is not None and alarm[0] == "training_estimate_off" and "+25.0%" in alarm[1]
    # an export (no run) or a run before this change (no target-judged counts)
    assert versus_training(Real(2.0, 30), None, 0.05, 0.10) == (None, None)
    assert versus_training(Real(2.0, 30), _figures((100, 100), None), 0.05, 0.10)[1] is None


def test_versus_training_compares_on_the_prompts_the_runs_target_answered() -> None:
    # over all 100 prompts real tau is 2.4; over the 20 the target answered, 2.0 as the run said
    real = Real(2.4, 100, same_tau=2.0, same_prompts=20)
    figures, alarm = versus_training(real, _figures((150, 100), (100, 100), matched=(101, 100)), 0.05, 0.10)
    assert alarm is None and figures is not None
    assert figures["real_over"] == "the 20 held-out prompts the run's target answered"
    assert figures["data_judged_tau_incl_bonus"] == pytest.approx(2.01)  # the same rows' data walk
    assert versus_training(Real(2.4, 100), _figures((150, 100), (100, 100)), 0.05, 0.10)[1] is not None


def test_bad_prompt_rows_are_rejected_with_reasons(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = world.prompts.read_text().splitlines()[:2]
    lines += [
        "{not json",
        "[1, 2]",
        json.dumps({"conversations": []}),
        json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}),
    ]
    bad.write_text("\n".join(lines) + "\n")
    data, _ = _run(world, checkpoint, tmp_path, inputs=bad)
    assert data["rows_in"] == 6 and data["rows_out"] == 2
    assert data["rejected"] == {"json_error": 1, "not_an_object": 1, "unknown_format": 1, "no_user_turn": 1}
    assert data["examples"]["json_error"][0]["line"] == 3
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{oops\n")
    with pytest.raises(UsageError, match="no prompt to evaluate"):
        _run(world, checkpoint, tmp_path, inputs=empty)


def test_params_forbid_unknown_fields_and_sampling_knobs_in_greedy_mode(world: TinyWorld) -> None:
    base = dict(inputs=world.prompts, target=world.target_dir, checkpoint=world.target_dir)
    with pytest.raises(ValueError, match="extra"):
        EvalParams.model_validate({**base, "temprature": 0.5})  # misspelt on purpose
    with pytest.raises(ValueError, match="sampled"):
        EvalParams(**base, temperature=0.5)
    with pytest.raises(ValueError):
        EvalParams(**base, block_size=1)


def test_zlabs_own_decoder_gives_the_same_outputs_and_steps(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    """Decode-level interop: z-lab's `dflash_generate` (in a venv of its own with `dflash`) and
    DraftDeck's decoder, the same trained, exported drafter and target, greedy: the same new tokens
    per prompt and the same verify steps; z-lab's acceptance lengths are DraftDeck's produced tokens."""
    import subprocess

    from draftdeck.drafter.eval.spec_decode import DecodeStats, generate_speculative
    from draftdeck.drafter.kinds.dflash.export import load_zlab
    from tests.support.eval import dflash_venv

    venv = dflash_venv()
    stop = world.target.eos_ids()
    spec = {"prompts": world.prompt_ids, "max_new_tokens": MAX_NEW, "stop": stop}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    probe = PROBES / "dflash_decode_probe.py"
    args = [str(venv / "bin" / "python"), str(probe), str(checkpoint), str(world.target_dir)]
    res = subprocess.run([*args, str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = json.loads((tmp_path / "out.json").read_text())

    drafter = load_zlab(checkpoint)
    runner = TargetRunner(world.target, stop)
    ours = DecodeStats(drafter.block_size)
    for ids, z in zip(world.prompt_ids, theirs, strict=True):
        source = DFlashSource(drafter, world.target, drafter.block_size)
        gen = generate_speculative(runner, source, ids, MAX_NEW, drafter.block_size)
        ours.add(gen)
        assert gen.output_ids == z["output"]
        assert gen.steps == len(z["acceptance_lengths"])
    steps = sum(len(z["acceptance_lengths"]) for z in theirs)
    zlab_tau = sum(sum(z["acceptance_lengths"]) for z in theirs) / steps
    assert ours.steps == steps > len(theirs) and ours.tokens_per_step == pytest.approx(zlab_tau)
    assert ours.tau_pooled >= ours.tokens_per_step  # vLLM's count adds the bonus a stop drops


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_served_eval_reports_served_tau_beside_offline_and_walked_on_the_same_prompts(
    world: TinyWorld, checkpoint: Path, tmp_path: Path, kind: str
) -> None:
    from tests.support.serving import spec_server

    with spec_server([3, 1, 2]) as server:
        data, _ = _run(world, checkpoint, tmp_path, served_url=server.url, served_kind=kind, served_model="m")
        sent = [body for _, body in server.requests]
    ev = data["eval"]
    served = ev["served"]
    assert served["prompts"] == ev["prompts"] == len(sent)
    # the very token ids decoded offline went to the server
    ids_key = "prompt" if kind == "vllm" else "input_ids"
    assert all(isinstance(b[ids_key], list) and all(isinstance(t, int) for t in b[ids_key]) for b in sent)
    # 32 tokens each: the prefill's, then steps of 4, 2, 3, ... tokens: 10 steps accepting 21 drafts
    assert served["completion_tokens"] == 32 * len(sent) and served["verify_steps"] == 10 * len(sent)
    if kind == "vllm":
        w = served["window"]
        assert (w["drafts"], w["accepted"]) == (10 * len(sent), 21 * len(sent)) and not served[
            "other_traffic"
        ]
        assert served["tau_incl_bonus"] == pytest.approx(1 + 21 / 10)
    else:
        assert served["tau_incl_bonus"] == pytest.approx(32 / 10)
    assert served["offline_real_tau_incl_bonus"] == ev["methods"]["drafter"]["tau_incl_bonus_pooled"]
    assert served["walked_tau_incl_bonus"] == ev["walked"]["tau_incl_bonus"]


def test_served_eval_needs_greedy_mode(world: TinyWorld, checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="served eval decodes greedily"):
        EvalParams(inputs=[str(world.prompts)], target=str(world.target_dir), checkpoint=str(checkpoint),
                   mode="sampled", served_url="http://127.0.0.1:9")  # fmt: skip
