"""The export read back as vLLM's and SGLang's DFlash loaders read it (kinds/dflash/servers.py):
the mask id each fills the block with, the layers it taps, the draft-token setting and the flags.
SGLang resolves a mask by its text through the target's tokenizer, adding it when missing: that step
runs here on the real tokenizer, and the id it gives must be the one the drafter was trained with."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from draftdeck.causal_lm import read_model_config
from draftdeck.drafter.export.params import ExportParams, run_export
from draftdeck.drafter.kinds.dflash.export import load_zlab, save_zlab
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.servers import read_export
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import saved_target

torch.set_num_threads(1)


def _export(tmp_path: Path, mask_token_id: int | None = None) -> tuple[Path, Path]:
    target = saved_target(tmp_path / "target")
    cfg = DrafterConfig.from_target(
        read_model_config(target), tokenizer=AutoTokenizer.from_pretrained(target),
        layers=1, block_size=8, mask_token_id=mask_token_id,
    )  # fmt: skip
    return save_zlab(DFlashDrafter(cfg), tmp_path / "export"), target


def _added_mask_id(target: Path, text: str) -> int:
    """What SGLang's first DFlash does with a mask text the vocabulary lacks, on the real tokenizer."""
    tok = AutoTokenizer.from_pretrained(target)
    tok.add_special_tokens({"mask_token": text})
    return int(tok.mask_token_id)


def test_an_unused_row_mask_is_named_so_that_adding_the_text_gives_the_trained_id(tmp_path: Path) -> None:
    out, target = _export(tmp_path)
    hf = json.loads((out / "config.json").read_text())
    trained = hf["dflash_config"]["mask_token_id"]
    assert trained == len(AutoTokenizer.from_pretrained(target)) < hf["vocab_size"]  # the first free row
    assert hf["dflash_config"]["mask_token"] == "<|MASK|>"
    assert _added_mask_id(target, "<|MASK|>") == trained
    vllm, sglang_new, sglang_first = read_export(out, target)
    assert [r.mask_token_id for r in (vllm, sglang_new, sglang_first)] == [trained] * 3
    assert sglang_first.mask_from == "'<|MASK|>' added to the target's tokenizer"
    assert [r.problems for r in (vllm, sglang_new, sglang_first)] == [(), (), ()]
    # vLLM taps the stream entering layer i+1; SGLang's target hook adds the same 1
    ids = hf["dflash_config"]["target_layer_ids"]
    assert vllm.tapped_layers == sglang_first.tapped_layers == tuple(i + 1 for i in ids)
    # vLLM's block is 1 + num_speculative_tokens; SGLang's draft tokens are the block itself
    assert (vllm.draft_tokens, sglang_new.draft_tokens) == (7, 8)
    assert f'"model": "{out}", "num_speculative_tokens": 7' in vllm.flags
    assert sglang_new.flags.endswith(f"--speculative-draft-model-path {out} --speculative-num-draft-tokens 8")
    # the extra keys change nothing for our own loader
    assert load_zlab(out).config.mask_token == "<|MASK|>"


def test_a_mask_that_is_a_real_token_is_named_by_its_own_text(tmp_path: Path) -> None:
    out, target = _export(tmp_path, mask_token_id=0)
    hf = json.loads((out / "config.json").read_text())
    assert hf["dflash_config"]["mask_token"] == "<|endoftext|>"
    readings = read_export(out, target)
    assert [r.mask_token_id for r in readings] == [0, 0, 0]
    assert readings[2].mask_from == "'<|endoftext|>' in the target's vocabulary"
    assert all(not r.problems for r in readings)


def test_a_mask_no_text_leads_to_is_a_warning_for_the_sglang_that_reads_only_text(tmp_path: Path) -> None:
    out, target = _export(tmp_path, mask_token_id=645)  # a spare row, but not the first one
    hf = json.loads((out / "config.json").read_text())
    assert "mask_token" not in hf["dflash_config"]
    first = read_export(out, target)[2]
    assert first.mask_token_id == _added_mask_id(target, "<|MASK|>") == 642
    assert first.problems == (
        "SGLang (first DFlash, commit 7f151c5) fills the draft block with id 642 ('<|MASK|>' added to the "
        "target's tokenizer), the drafter was trained with 645: acceptance would collapse",
    )
    # the export job says so in its report, under a code a policy can make an error
    ctx = LocalContext(tmp_path / "job")
    report = run_export(ExportParams(inputs=[str(out)], out=str(tmp_path / "again"), target=str(target)), ctx)
    assert report.warnings["served_config"] == 1 and report.rows_out == 1
    assert "trained with 645" in report.examples["served_config"][0].reason
    # without the target, SGLang's text lookup cannot be checked, and the reading says so
    assert read_export(out)[2].mask_from == "needs the target's tokenizer"


def test_a_tokenizer_with_the_mask_text_at_another_id_is_refused_as_sglang_refuses_it(tmp_path: Path) -> None:
    out, target = _export(tmp_path, mask_token_id=645)
    tok = AutoTokenizer.from_pretrained(target)
    tok.add_special_tokens({"additional_special_tokens": ["<|MASK|>"]})
    tok.save_pretrained(target)
    newer = read_export(out, target)[1]
    assert newer.problems == ("SGLang refuses to start: the tokenizer has '<|MASK|>' at id 642, not 645",)
