"""Evaluation suites: the shipped files load and match their recorded checksums, a user's file is a suite
too (every row counted), multi-turn prompts are answered turn by turn after the target's own answers,
the template's settings are a recorded dimension, and the eval reports per suite, category and
context length with counts that sum to the whole."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from draftdeck.chat.templates import QWEN35_STYLE
from draftdeck.drafter.eval import suites
from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import DraftSource, Sampling, TargetRunner
from draftdeck.drafter.eval.suite_eval import ALL, decode_turns
from draftdeck.drafter.eval.tally import Decoded, decode
from draftdeck.drafter.export.drafters import load_drafter
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.errors import InputError
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from tests.support.eval import TinyWorld, build_world, trained_checkpoint

torch.set_num_threads(1)
MAX_NEW = 16


def _suite_file(path: Path, rows: list[dict[str, object]], tail: str = "") -> Path:
    """A user's suite: `rows` as JSONL at `path` (and `tail`, raw text after them)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


@pytest.mark.parametrize("name", suites.names())
def test_each_shipped_suite_matches_its_record(name: str) -> None:
    record = suites.sources()[name]
    report = Report()
    prompts = suites.load(name, report)
    assert len(prompts) == record["prompts"] == report.rows_in and not report.rejected
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
        assert p.turns and all(t.strip() for t in p.turns)
    assert counts == record["categories"] and sum(counts.values()) == record["prompts"]
    assert record["licence"] in ("Apache-2.0", "MIT") and len(record["commit"]) == 40
    assert (suites.HERE / f"{name}.LICENSE.txt").read_text().strip()


def test_the_published_shapes_are_kept() -> None:
    spec = suites.load("spec-bench", Report())
    assert {p.category for p in spec} == {
        "multi_turn",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    }
    assert all(len(p.turns) == 2 for p in spec if p.category == "multi_turn")  # MT-Bench's two turns
    gsm = suites.load("gsm8k", Report(), max_per_category=1)[0]
    assert gsm.turns[0].startswith("Janet") and gsm.turns[0].endswith("within \\boxed{}.")


def test_a_changed_suite_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy_dir = tmp_path / "suites"
    shutil.copytree(suites.HERE, copy_dir, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = copy_dir / "mt-bench.jsonl.gz"
    rows = gzip.decompress(path.read_bytes()).decode().splitlines()
    path.write_bytes(gzip.compress(("\n".join(rows[:-1]) + "\n").encode(), mtime=0))  # one question dropped
    monkeypatch.setattr(suites, "HERE", copy_dir)
    with pytest.raises(InputError, match=r"mt-bench\.jsonl\.gz: its sha256 differs"):
        suites.load("mt-bench", Report())


def test_a_users_file_is_a_suite_and_every_row_is_accounted_for(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows: list[dict[str, object]] = [
        {"category": "sql", "turns": ["List the tables.", "Now the views."]},
        {"category": "sql", "prompt": "Count the rows."},
        {"category": "sql", "prompt": "Third sql prompt, past the sample."},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"category": "sql", "turns": []},
    ]
    _suite_file(path, rows, "{not json\n")
    report = Report()
    got = suites.load(str(path), report, max_per_category=2)
    assert [(p.suite, p.category, p.turns) for p in got] == [
        ("mine", "sql", ("List the tables.", "Now the views.")),
        ("mine", "sql", ("Count the rows.",)),
        ("mine", suites.NO_CATEGORY, ("Hi",)),
    ]
    # the third sql row is past the sample (not read); the empty one was over it too; bad JSON rejected
    assert report.rows_in == 4 and dict(report.rejected) == {"json_error": 1}
    assert report.examples["json_error"][0].line == 6


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> TinyWorld:
    return build_world(tmp_path_factory.mktemp("suite-world"), n_prompts=4)


@pytest.fixture(scope="module")
def checkpoint(world: TinyWorld, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_checkpoint(world, tmp_path_factory.mktemp("ckpt") / "drafter", max_new=MAX_NEW, steps=20)


def test_a_multi_turn_prompt_is_answered_after_the_targets_own_answers(
    world: TinyWorld, checkpoint: Path
) -> None:
    target = world.target
    runner = TargetRunner(target, [world.eos_id])
    sources: dict[str, DraftSource] = {"drafter": DFlashSource(load_drafter(checkpoint), target, 4)}

    def decode_nth(ids: list[int], n: int) -> Decoded:
        return decode(runner, sources, ids, MAX_NEW, 4, Sampling(seed=n))

    prompt = suites.SuitePrompt("mine", "1", "chat", ("the fox eats", "and the owl"), "mine.jsonl", 1)
    tok = copy.copy(target.tokenizer)
    turns = {}
    for thinking in (True, False):
        tok.chat_template = QWEN35_STYLE  # a template where thinking on and off render otherwise
        report = Report()
        report.rows_in += 1
        turns[thinking] = list(decode_turns([prompt], tok, {"enable_thinking": thinking}, lambda ids: None,
                                            decode_nth, report))  # fmt: skip
        assert [t.turn for t in turns[thinking]] == [1, 2] and report.rows_out == 1
        first = tok.decode(turns[thinking][0].decoded.plain.output_ids, skip_special_tokens=True)
        history = [{"role": "user", "content": "the fox eats"}, {"role": "assistant", "content": first},
                   {"role": "user", "content": "and the owl"}]  # fmt: skip
        want = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=True, return_dict=False,
                                       enable_thinking=thinking)  # fmt: skip
        assert turns[thinking][1].ids == list(want)
    assert turns[True][0].ids != turns[False][0].ids  # the dimension changes what the target reads


def test_a_suite_eval_reports_per_category_and_context_length(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    rows: list[dict[str, object]] = [
        {"category": "animals", "turns": ["the cat eats", "and the dog"]},
        {"category": "animals", "prompt": "the owl sees"},
        {"category": "colours", "prompt": "red and blue"},
        {"category": "long", "prompt": " ".join(["word"] * 600)},
    ]
    mine = _suite_file(tmp_path / "mine.jsonl", rows)
    ctx = LocalContext(tmp_path / "job")
    params = EvalParams(suites=[f"{mine},mt-bench"], max_per_category=1, target=str(world.target_dir),
                        checkpoint=str(checkpoint), max_new_tokens=MAX_NEW,
                        template_kwargs={"enable_thinking": False})  # fmt: skip
    assert params.suites == [str(mine), "mt-bench"]
    report = run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    assert ev["template_kwargs"] == {"enable_thinking": False} and ev["drafter"] == "dflash"
    assert ev["suite_sources"]["mt-bench"]["repo"] == "lm-sys/FastChat"
    # one prompt a category read; the long one rejected (past the target's 512 positions), named
    assert (report.rows_in, report.rows_out, dict(report.rejected)) == (3 + 8, 10, {"too_long": 1})
    assert report.examples["too_long"][0].line == 4
    mine_figs = ev["suites"]["mine"]
    assert mine_figs["animals"]["turns"] == 2 and mine_figs["colours"]["turns"] == 1
    categories = suites.sources()["mt-bench"]["categories"]
    assert set(ev["suites"]["mt-bench"]) == {*categories, ALL} and len(categories) == 8
    drafter = ev["methods"]["drafter"]["counts"]
    # the parts sum to the whole: categories to their suite, suites to the eval, context buckets to the steps
    whole = 0
    for figs in ev["suites"].values():
        parts = [f["methods"]["drafter"]["counts"] for cat, f in figs.items() if cat != ALL]
        total = figs[ALL]["methods"]["drafter"]["counts"]
        for key in ("verify_steps", "accepted", "tokens"):
            assert sum(p[key] for p in parts) == total[key]
        whole += total["verify_steps"]
    assert (
        whole
        == drafter["verify_steps"]
        == sum(c["verify_steps"] for c in drafter["by_context_length"].values())
    )
    assert drafter["accepted"] == sum(c["accepted"] for c in drafter["by_context_length"].values())
    assert all(int(k) & (int(k) - 1) == 0 for k in drafter["by_context_length"])  # powers of two
    assert ev["training"] is None and ev["lossless"] is True


def test_a_served_suite_eval_gives_the_servers_tau_per_category(
    world: TinyWorld, checkpoint: Path, tmp_path: Path
) -> None:
    from tests.support.serving import spec_server

    rows: list[dict[str, object]] = [
        {"category": "animals", "turns": ["the cat eats", "and the dog"]},
        {"category": "colours", "prompt": "red"},
    ]
    mine = _suite_file(tmp_path / "mine.jsonl", rows)
    ctx = LocalContext(tmp_path / "job")
    with spec_server([3, 1, 2]) as server:
        params = EvalParams(suites=[str(mine)], target=str(world.target_dir), checkpoint=str(checkpoint),
                            max_new_tokens=MAX_NEW, served_url=server.url, served_model="m")  # fmt: skip
        run_eval(params, ctx)
        sent = [body["prompt"] for _, body in server.requests]
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    served = ev["served"]
    by_cat = served["by_category"]["mine"]
    # one window per category, in order; the turns sent are the ones decoded offline, each once
    assert (
        {c: f["prompts"] for c, f in by_cat.items()}
        == {"animals": 2, "colours": 1}
        == {c: ev["suites"]["mine"][c]["turns"] for c in ("animals", "colours")}
    )
    assert served["prompts"] == len(sent) == 3
    assert served["verify_steps"] == sum(f["verify_steps"] for f in by_cat.values())
    assert served["window"]["drafts"] == served["verify_steps"] and not served["other_traffic"]


def test_a_suite_file_over_http_must_lie_in_the_data_roots(tmp_path: Path) -> None:
    from draftdeck.errors import PathNotAllowedError

    inside = _suite_file(tmp_path / "mine.jsonl", [{"category": "a", "prompt": "hi"}])
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_text(inside.read_text())
    base = {"target": str(tmp_path), "checkpoint": str(tmp_path)}
    confined = EvalParams(suites=["mt-bench", str(inside)], **base).confined([tmp_path])
    assert confined.suites == ["mt-bench", str(inside.resolve())]  # a shipped name stays a name
    with pytest.raises(PathNotAllowedError):
        EvalParams(suites=[str(outside)], **base).confined([tmp_path])
    with pytest.raises(ValueError, match="unknown suite 'mt_bench'"):
        EvalParams(suites=["mt_bench"], **base)
