"""The MTP kind: the target's own MTP layer read from its checkpoint (a target without one refused by name),
drafting as transformers' own layer does with the same weights, fine-tuned through the real trainer (the
eval lossless, real tau above the untouched head's, the walk equal to real decoding) and stitched back
into the verifier's checkpoint with nothing else changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
from draftdeck.drafter.export.drafters import export_drafter, load_drafter
from draftdeck.drafter.export.folder import resolve_checkpoint
from draftdeck.drafter.kinds import NAMES, get_kind
from draftdeck.drafter.kinds.mtp.checkpoint import from_target, stitched_differences, target_mtp_state
from draftdeck.drafter.kinds.mtp.source import MTPSource
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny import TargetShape, build_target, build_tokenizer, write_prompts
from draftdeck.drafter.tiny_targets import mtp_step, tiny_causal_lm
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.plan import Shape, plan
from draftdeck.drafter.train.run import train
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import saved_target, write_dataset
from tests.support.eval import prompt_ids

torch.set_num_threads(1)
MAX_NEW = 32
HYBRID = TargetShape(arch="qwen3_5", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                     max_position_embeddings=512)  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Qwen3.5 hybrid target trained briefly on the demo text, its MTP layer beside it (as the demo's),
    and its own greedy answers to 40 held-out prompts as a tokenized dataset."""
    root = tmp_path_factory.mktemp("mtp-world")
    tok = build_tokenizer(root / "tokenizer", vocab_size=512, n_texts=1000)
    folder = build_target(root / "target", tok, steps=80, shape=HYBRID, batch=8, seq_len=96, lr=1e-2)
    target = Target.load(folder)
    runner = TargetRunner(target, target.eos_ids())
    rows = []
    for line in write_prompts(root / "prompts.jsonl", 40, seed=1).read_text().splitlines():
        ids = prompt_ids(target.tokenizer, json.loads(line)["messages"])
        out = generate_plain(runner, ids, MAX_NEW).output_ids
        rows.append((ids + out, [0] * len(ids) + [1] * len(out)))
    return write_dataset(root / "data", rows, folder), folder


def test_a_target_without_an_mtp_layer_is_refused_by_name_before_any_work(tmp_path: Path) -> None:
    folder = saved_target(tmp_path / "qwen3")
    data = write_dataset(tmp_path / "data", [([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1])] * 8, folder)
    params = TrainParams(inputs=[str(data)], target=str(folder), out=str(tmp_path / "run"), drafter="mtp",
                         max_steps=2, batch_size=2, device="cpu")  # fmt: skip
    with pytest.raises(UsageError, match="has none") as refused:
        train(params, LocalContext(tmp_path / "job"))
    others = [n for n in NAMES if n != "mtp"]
    assert f"({', '.join(others)})" in str(refused.value) and len(others) >= 4
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(UsageError, match=f"instead \\({', '.join(others)}\\)"):  # the planner too
        plan(tiny_causal_lm("qwen3").config, Shape(drafter="mtp"), 8 << 30)
    hybrid = tiny_causal_lm("qwen3_5")
    planned = plan(hybrid.config, Shape(drafter="mtp", mtp_steps=5), 8 << 30)
    assert planned.trainable_params == sum(
        p.numel() for n, p in hybrid.named_parameters() if n.startswith("mtp.")
    )


def test_the_layer_drafts_what_transformers_own_layer_drafts_with_the_same_weights(tmp_path: Path) -> None:
    """A chain of 5 drafts from DraftDeck's source (cached keys, the chain's own dropped after) against a
    hand-rolled chain through transformers' Qwen3.5 decoder layer, rerun over the whole sequence of
    (hidden, next token) pairs at every draft, its own previous output as the hidden state."""
    model = tiny_causal_lm("qwen3_5", seed=3)
    model.save_pretrained(tmp_path / "target")
    target = Target(model, tmp_path / "target")
    drafter = from_target(tmp_path / "target", target.config)
    assert set(target_mtp_state(tmp_path / "target")) == {
        n for n in model.state_dict() if n.startswith("mtp.")
    }  # fmt: skip
    ids = torch.randint(0, 290, (1, 13), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        last = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    source = MTPSource(drafter, target)
    committed = ids[0].tolist()
    source.begin(committed[:4])
    source.observe(last[0, :4])  # two observations, as decoding feeds them verify step by verify step
    source.observe(last[0, 4:12])
    ours = source.propose(committed, 5)

    embed = model.get_input_embeddings()
    hidden, tokens = last[:, :12], ids[:, 1:13]
    theirs: list[int] = []
    with torch.no_grad():
        for _ in range(5):
            n = hidden.shape[1]
            out = mtp_step(model, hidden, embed(tokens), torch.arange(n)[None])
            token = model.lm_head(out[:, -1]).argmax(-1)
            theirs.append(int(token))
            hidden = torch.cat([hidden, out[:, -1:]], dim=1)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
    assert ours == theirs
    assert len(set(theirs)) > 1  # the chain moves: each draft read its predecessor's output


@pytest.mark.slow
def test_fine_tuned_beats_the_untouched_head_decodes_as_walked_and_stitches_back_only_mtp(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    dataset, target = world
    run = tmp_path / "run"
    train(
        TrainParams(
            inputs=[str(dataset)], target=str(target), out=str(run), drafter="mtp", mtp_steps=4, lr=3e-3,
            max_steps=30, batch_size=8, checkpoint_every=15, eval_every=15, heldout_fraction=0.3,
            device="cpu",
        ),
        LocalContext(tmp_path / "train-job"),
    )  # fmt: skip
    ctx = LocalContext(tmp_path / "eval-job")
    params = EvalParams(
        inputs=dataset, target=target, checkpoint=run, max_new_tokens=MAX_NEW, heldout_fraction=0.3
    )
    run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    real, untouched = ev["methods"]["drafter"], ev["methods"]["untrained"]
    assert ev["drafter"] == "mtp" and real["lossless"] is True and untouched["lossless"] is True
    assert untouched["tau_incl_bonus_pooled"] > 1.2  # the layer as it ships already drafts
    assert real["tau_incl_bonus_pooled"] > untouched["tau_incl_bonus_pooled"] + 0.3
    assert (ev["walked"]["accepted"], ev["walked"]["steps"]) == (
        real["counts"]["accepted"],
        real["counts"]["verify_steps"],
    )

    (tmp_path / "stitched").mkdir()  # as the export job makes its folder first: replaced whole
    stitched, fmt = export_drafter(run, tmp_path / "stitched")
    assert fmt == "stitched"
    assert stitched_differences(target, stitched) == []
    tampered = tmp_path / "tampered"  # the check sees one changed element outside mtp.*
    shutil.copytree(stitched, tampered)
    weights = load_file(str(tampered / "model.safetensors"))
    weights["model.norm.weight"][0] += 1e-3
    save_file(weights, str(tampered / "model.safetensors"))
    assert stitched_differences(target, tampered) == ["model.norm.weight: not byte-identical"]
    tuned = load_drafter(resolve_checkpoint(run))
    back = target_mtp_state(stitched)
    shipped = target_mtp_state(target)
    assert all(
        not torch.equal(back[k], shipped[k])
        for k in ("mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight")
    )
    reread = from_target(stitched, Target.load(stitched).config)
    assert all(
        torch.equal(a, b)
        for a, b in zip(reread.state_dict().values(), tuned.state_dict().values(), strict=True)
    )
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (stitched / name).read_bytes() == (target / name).read_bytes()

    alone, fmt = export_drafter(run, tmp_path / "alone", "speculators")
    config = json.loads((alone / "config.json").read_text())
    assert config["speculators_model_type"] == "mtp" and config["speculators_config"]["verifier"][
        "name_or_path"
    ] == str(target)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    flags = get_kind("mtp").served(stitched, "stitched", str(target), 5)
    assert '"method": "mtp", "num_speculative_tokens": 4' in flags[0]["flags"] and flags[0]["problems"] == []
