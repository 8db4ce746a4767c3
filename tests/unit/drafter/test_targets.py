"""Each target architecture end to end on the CPU, past its sliding window: a tiny random model saved
as a model folder with the test tokenizer, its own greedy answers as the data, `train` (pre-flight,
target agreement, both walked taus), `eval` (greedy: lossless, and the walk equals real decoding
step for step), `export-drafter` read back. Qwen3.5 as published carries a vision tower: only its
language model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
from draftdeck.drafter.export.format import export_drafter, load_zlab, resolve_checkpoint
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import PUBLISHED, tiny_causal_lm
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import write_dataset

PROMPTS, PROMPT_LEN, NEW, WINDOW = 8, 12, 20, 16  # prompt + answer pass the window


def _folder(arch: str, folder: Path) -> Path:
    from transformers import AutoTokenizer

    from draftdeck.chat.testing import small_bpe_tokenizer

    tok = AutoTokenizer.from_pretrained(small_bpe_tokenizer())
    tiny_causal_lm(arch, vocab_size=len(tok) + 8, layers=4, window=WINDOW).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("arch", [PUBLISHED, "qwen3_next", "mistral", "gemma3"])
def test_train_eval_export_past_the_window(arch: str, tmp_path: Path) -> None:
    folder = _folder(arch, tmp_path / "target")
    target = Target.load(folder)
    assert not [n for n, _ in target.model.named_parameters() if "visual" in n]  # the text model only
    assert ("vision tower's weights are not loaded" in target.loaded) == (arch == PUBLISHED)
    runner = TargetRunner(target, target.eos_ids())
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(PROMPTS):
        ids = torch.randint(3, target.config.vocab_size - 8, (PROMPT_LEN,), generator=g).tolist()
        out = generate_plain(runner, ids, NEW).output_ids
        rows.append((ids + out, [0] * PROMPT_LEN + [1] * len(out)))
    data = write_dataset(tmp_path / "data", rows, folder)
    run = tmp_path / "run"
    train(
        TrainParams(
            inputs=[str(data)], target=str(folder), out=str(run), block_size=4, lr=3e-3, max_steps=4,
            batch_size=4, anchors_per_seq=8, checkpoint_every=4, eval_every=4, heldout_fraction=0.3,
            device="cpu",
        ),
        train_ctx := LocalContext(tmp_path / "train-job"),
    )  # fmt: skip
    assert any(target.loaded in message for _, message, _, _ in train_ctx.events)  # said in the job's log
    record = json.loads((run / "run.json").read_text())
    assert record["steps_done"] == 4 and record["drafter"]["num_target_layers"] == 4

    ctx = LocalContext(tmp_path / "eval-job")
    params = EvalParams(inputs=data, target=folder, checkpoint=run, max_new_tokens=NEW, heldout_fraction=0.3)
    run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    real = ev["methods"]["drafter"]
    assert real["lossless"] is True
    walked = (ev["walked"]["accepted"], ev["walked"]["steps"])
    assert walked == (real["counts"]["accepted"], real["counts"]["verify_steps"])

    exported = export_drafter(run, tmp_path / "export")
    hf = json.loads((exported / "config.json").read_text())
    assert hf["dflash_config"]["target_layer_ids"] == record["drafter"]["target_layer_ids"]
    a, b = load_zlab(exported), load_zlab(resolve_checkpoint(run))
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
