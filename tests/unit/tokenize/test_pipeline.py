# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""The tokenize job end to end: files in, shards + report out; CLI commands; the job kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from draftdeck.errors import JobFailed, UsageError
from draftdeck.quality import Report
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_conversations, tokenize_files
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.conftest import real_file
from tests.support.tokenize import (  # noqa: F401
    FIXTURES,
    a,
    conv,
    id_runs,
    qwen_dir,
    qwen_tok,
    small_dir,
    small_tok,
    trained_runs,
    u,
)

CHAT = FIXTURES / "chat.jsonl"


def _rows(path: Path) -> list[dict[str, Any]]:
    ds = ShardDataset(path)
    return [ds.row(i) for i in range(len(ds))]


def _check_qwen_rows(tok: Any, rows: list[dict[str, Any]]) -> None:
    """Independent of our offsets: every trained run is one assistant output that ends with the
    end-of-turn token (and holds it once), holds no role header, and counts match the mask."""
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for r in rows:
        runs = id_runs(r["input_ids"], r["loss_mask"])
        assert runs, r
        assert r["n_trained"] == sum(r["loss_mask"]) > 0
        assert r["seq_len"] == len(r["input_ids"]) == len(r["loss_mask"])
        for run in runs:
            assert im_start not in run
            if not r["truncated"]:
                assert run[-1] == im_end and run.count(im_end) == 1, tok.decode(run)
        if r["turn"] >= 0:
            assert len(runs) == 1


def test_fixture_file_to_shards(tmp_path: Path, qwen_dir: Path, qwen_tok: Any) -> None:
    out = tmp_path / "ds"
    report = tokenize_files([CHAT], out, TokenizeOptions(qwen_dir, workers=1, verify_all=True, shard_rows=3))
    report.check_accounting()
    assert report.rows_in == 8
    assert report.rejected == {"no_user_turn": 1}  # conversion rejects the row with no user message
    assert report.rows_expanded == 1  # the two-turn reasoning conversation is split
    assert report.rows_out == 8
    assert report.extra["encoder"]["used"] == "tiktoken" and report.extra["encoder"]["verified_rows"] == 8
    assert report.formats["openai"] == 8
    rows = _rows(out)
    assert len(rows) == 8 and [len(o.path) > 0 for o in report.outputs] == [True] * 3
    assert [o.rows for o in report.outputs] == [3, 3, 2]
    _check_qwen_rows(qwen_tok, rows)
    assert {r["source"] for r in rows} == {str(CHAT)}
    assert [r["turn"] for r in rows if r["source_row"] == 2] == [0, 1]
    cjk = next(r for r in rows if r["source_row"] == 4)
    assert trained_runs(qwen_tok, cjk["input_ids"], cjk["loss_mask"]) == [
        "</think>\n\n你好！我是一个乐于助人的助手。🎉👍🏽<|im_end|>"  # noqa: RUF001
    ]
    look = next(r for r in rows if r["source_row"] == 5)
    assert look["input_ids"].count(qwen_tok.convert_tokens_to_ids("<|im_end|>")) == 2


def test_real_files_masks_check_out(tmp_path: Path, qwen_dir: Path, qwen_tok: Any) -> None:
    names = ["speculators__ultrachat_messages.jsonl", "SpecForge__tool_use_conversation.jsonl",
             "speculators__dolphin_reasoning.jsonl", "speculators__hermes_toolcall.jsonl",
             "speculators__sharegpt_multiturn.jsonl", "LLaMA-Factory__reason_tool_use_demo_50.jsonl",
             "torchtune__chat_tiny.json", "axolotl__conversation.json"]  # fmt: skip
    paths = [real_file(n) for n in names]
    report = tokenize_files(paths, tmp_path / "ds", TokenizeOptions(qwen_dir, workers=1, verify_all=True))
    report.check_accounting()
    assert "mask_mismatch" not in report.rejected
    assert report.warnings.get("encoder_mismatch", 0) == 0
    assert report.rows_out > 100
    rows = _rows(tmp_path / "ds")
    assert len(rows) == report.rows_out
    _check_qwen_rows(qwen_tok, rows)
    reasoning = [r for r in rows if "dolphin" in r["source"]]
    assert reasoning and all(
        len(trained_runs(qwen_tok, r["input_ids"], r["loss_mask"])[0].split("</think>")[0].strip()) > 0
        for r in reasoning
    )  # the reasoning trace is trained, not an empty think block


def test_truncation_right_and_drop(tmp_path: Path, small_dir: Path) -> None:
    long = conv(u("write"), a(" ".join(["word"] * 300)), line=1)
    short = conv(u("hi"), a("hello"), line=2)
    cut = conv(u(" ".join(["context"] * 200)), a("late answer"), line=3)  # the answer is past the limit
    r = tokenize_conversations(
        [long, short, cut], tmp_path / "right", TokenizeOptions(small_dir, seq_length=64)
    )
    assert r.warnings["truncated"] == 1 and r.rejected["no_trained_tokens"] == 1 and r.rows_out == 2
    rows = _rows(tmp_path / "right")
    assert rows[0]["seq_len"] == 64 and rows[0]["truncated"] and rows[0]["n_trained"] > 0
    assert not rows[1]["truncated"]
    d = tokenize_conversations(
        [long, short, cut], tmp_path / "drop", TokenizeOptions(small_dir, seq_length=64, truncation="drop")
    )
    assert d.rejected == {"too_long": 2} and d.rows_out == 1
    d.check_accounting()


def test_rows_longer_than_the_target_reads_are_counted_at_tokenize(tmp_path: Path, small_dir: Path) -> None:
    model = tmp_path / "model"  # a model folder: the tokenizer beside a config of 64 positions
    shutil.copytree(small_dir, model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 64}))
    rows = [conv(u("write"), a(" ".join(["word"] * 300)), line=1), conv(u("hi"), a("hello"), line=2)]
    r = tokenize_conversations(rows, tmp_path / "a", TokenizeOptions(model))
    assert (r.rows_out, dict(r.rejected)) == (1, {"longer_than_target": 1})
    reason = r.examples["longer_than_target"][0].reason
    assert f"> 64 (max_position_embeddings in {model}); --seq-length 64 cuts such rows to fit" in reason
    fits = tokenize_conversations(rows, tmp_path / "b", TokenizeOptions(model, seq_length=64))
    assert fits.rows_out == 2 and fits.warnings["truncated"] == 1
    told = tokenize_conversations(rows, tmp_path / "c", TokenizeOptions(small_dir, max_positions=64))
    assert told.rejected == {"longer_than_target": 1}  # a tokenizer alone: --max-positions says it


def test_prompt_only_rows_fail_by_default_pointing_to_regeneration(tmp_path: Path, qwen_dir: Path) -> None:
    with pytest.raises(JobFailed, match="generate the responses with the target model") as exc:
        tokenize_files(
            [FIXTURES / "prompt_only.jsonl"], tmp_path / "ds", TokenizeOptions(qwen_dir, workers=1)
        )
    assert isinstance(exc.value.report, Report)
    assert exc.value.report.rejected["no_assistant_turn"] == 1
    assert not (tmp_path / "ds" / "manifest.json").exists() and not list((tmp_path / "ds").glob("*.arrow"))
    report = tokenize_files(
        [FIXTURES / "prompt_only.jsonl"],
        tmp_path / "ds2",
        TokenizeOptions(qwen_dir, workers=1, on_missing="drop"),
    )
    assert report.rejected == {"no_assistant_turn": 1} and report.rows_out == 1


def test_strict_turns_warnings_into_failure(tmp_path: Path, small_dir: Path) -> None:
    convs = [conv(u("hi"), a(" ".join(["w"] * 100)))]
    with pytest.raises(JobFailed, match="truncated"):
        tokenize_conversations(convs, tmp_path / "ds", TokenizeOptions(small_dir, seq_length=16, strict=True))


def test_empty_output_fails(tmp_path: Path, qwen_dir: Path) -> None:
    with pytest.raises(JobFailed, match="no rows were written"):
        tokenize_conversations([conv(Message_system(), a("x"))], tmp_path / "ds", TokenizeOptions(qwen_dir))
    assert not (tmp_path / "ds").exists()  # no empty output folder left behind


def Message_system() -> Any:
    from draftdeck.formats.model import Message

    return Message("system", "s")


def test_non_empty_output_folder_is_refused(tmp_path: Path, small_dir: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        tokenize_conversations([conv(u("a"), a("b"))], tmp_path / "ds", TokenizeOptions(small_dir))


def test_two_workers_give_the_same_rows_as_one(tmp_path: Path, qwen_dir: Path) -> None:
    convs = [conv(u(f"question {i} " * (i % 7)), a(f"answer {i} " * (i % 5 + 1), f"why {i}"), line=i)
             for i in range(600)]  # fmt: skip
    one = tokenize_conversations(convs, tmp_path / "one", TokenizeOptions(qwen_dir, workers=1, chunk_size=50))
    two = tokenize_conversations(convs, tmp_path / "two", TokenizeOptions(qwen_dir, workers=2, chunk_size=50))
    assert one.rows_out == two.rows_out == 600
    a_rows, b_rows = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert a_rows == b_rows
    s1 = json.loads((tmp_path / "one" / "stats.json").read_text())
    s2 = json.loads((tmp_path / "two" / "stats.json").read_text())
    assert s1 == s2


# -- CLI ------------------------------------------------------------------------------------------
@pytest.fixture
def cli_env(dd_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from app.settings import get_settings

    monkeypatch.setenv("DRAFTDECK_DATA_ROOTS", f"{dd_home}:{FIXTURES}")
    get_settings.cache_clear()
    return dd_home


def test_cli_tokenize_inspect_vocab_export(
    cli_env: Path, tmp_path: Path, qwen_dir: Path, qwen_tok: Any
) -> None:
    from draftdeck.cli import app

    runner = CliRunner()
    out = tmp_path / "ds"
    rep = tmp_path / "report.json"
    res = runner.invoke(app, ["tokenize", str(CHAT), "--tokenizer", str(qwen_dir), "--out", str(out),
                              "--report", str(rep), "--shard-rows", "4", "--workers", "1", "-k",
                              "enable_thinking=true"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "rejected: no_user_turn" in res.output and "encoder: tiktoken" in res.output
    report = json.loads(rep.read_text())
    *shards, dataset = report["outputs"]
    assert report["rows_out"] == 8 and len(shards) == 2
    assert dataset["kind"] == "dataset" and dataset["path"] == str(out) and dataset["rows"] == 8
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["template_kwargs"] == {"enable_thinking": True}

    ds = ShardDataset(out)
    first = next(i for i in range(len(ds)) if ds.row(i)["source_row"] == 1)  # conversion may reorder rows
    res = runner.invoke(app, ["inspect", str(out), "--row", str(first)])
    assert res.exit_code == 0, res.output
    assert "[<|im_start|>]" in res.output and "↵" in res.output and "2·+·2·=·4." in res.output

    res = runner.invoke(app, ["inspect", str(out), "--row", "99"])
    assert res.exit_code == 2 and "out of range" in res.output

    vocab = tmp_path / "vocab.npz"
    res = runner.invoke(app, ["vocab", str(out), "--top", "32", "--out", str(vocab)])
    assert res.exit_code == 0, res.output
    v = np.load(vocab)
    assert v["d2t"].shape == (32,) and v["t2d"].shape == (len(qwen_tok),) and int(v["t2d"].sum()) == 32
    assert np.array_equal(np.arange(32) + v["d2t"], np.flatnonzero(v["t2d"]))
    im_end = qwen_tok.convert_tokens_to_ids("<|im_end|>")
    assert v["t2d"][im_end]  # trained once per assistant turn: among the most frequent

    jl = tmp_path / "rows.jsonl"
    res = runner.invoke(app, ["export", str(out), "--format", "speculators-jsonl", "--out", str(jl)])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in jl.read_text().splitlines()]
    assert len(lines) == len(ds) and lines[3] == {k: ds.row(3)[k] for k in ("input_ids", "loss_mask")}


def test_cli_tokenize_failure_exit_codes(cli_env: Path, tmp_path: Path, qwen_dir: Path) -> None:
    from draftdeck.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["tokenize", str(FIXTURES / "prompt_only.jsonl"), "--tokenizer", str(qwen_dir),
                              "--out", str(tmp_path / "ds"), "--workers", "1"])  # fmt: skip
    assert res.exit_code == 1 and "regeneration" in res.output.replace("\n", " ")
    assert not (tmp_path / "ds").exists()  # a failed tokenize leaves no (empty) output folder
    res = runner.invoke(app, ["tokenize", str(CHAT), "--tokenizer", str(tmp_path / "nope"), "--out",
                              str(tmp_path / "ds3")])  # fmt: skip
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
    not_tok = tmp_path / "model"  # a folder, but a model's config, not a tokenizer
    not_tok.mkdir()
    (not_tok / "config.json").write_text("{}")
    res = runner.invoke(app, ["tokenize", str(CHAT), "--tokenizer", str(not_tok), "--out",
                              str(tmp_path / "ds4")])  # fmt: skip
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "not a tokenizer folder: no tokenizer.json or tokenizer_config.json" in said
    assert "tiktoken" not in said and "sentencepiece" not in said
    res = runner.invoke(
        app, ["tokenize", "/etc/hostname", "--tokenizer", str(qwen_dir), "--out", str(tmp_path / "x")]
    )
    # in-process commands read any file the user can: this one is read, and is no chat data
    assert res.exit_code == 1 and "outside the data roots" not in res.output


# -- job kind -------------------------------------------------------------------------------------
def test_tokenize_job_kind_runs_through_the_worker(migrated: Path, monkeypatch: pytest.MonkeyPatch,
                                                   small_dir: Path) -> None:  # fmt: skip
    from sqlmodel import select

    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope
    from app.store.models import JobOutput
    from draftdeck.kinds import get_kind

    data = migrated / "data"
    (data / "chat.jsonl").write_bytes(CHAT.read_bytes())
    tok = data / "tok"
    tok.mkdir()
    for f in small_dir.iterdir():
        (tok / f.name).write_bytes(f.read_bytes())
    kind = get_kind("tokenize")
    assert kind.queue == "cpu"
    raw = {"inputs": str(data / "chat.jsonl"), "tokenizer": str(tok), "shard_rows": 5}
    params = kind.params.model_validate(raw).confined(get_settings().roots)
    with session_scope() as session:
        job = jobs.create_job(session, "tokenize", params.model_dump(), kind.queue)
    assert run_job(job.id or 0) == "handed-off"  # chunk tasks (app/run/chunks.py), run inline here
    from app.run.chunks import run_chunk

    assert [run_chunk(job.id or 0, i) for i in range(2)] == [
        "done",
        "succeeded",
    ]  # 7 conversations, 5 a chunk
    with session_scope() as session:
        done = jobs.get_job(session, job.id or 0)
        outputs = list(session.exec(select(JobOutput).where(JobOutput.job_id == job.id)))
    assert done is not None and done.result is not None
    assert done.result["rows_in"] == 8 and done.result["rows_out"] == 7  # prefix-stable ChatML: no split
    assert len(outputs) == 2 and sum(o.rows for o in outputs) == 7
    ds = ShardDataset(Path(outputs[0].path).parent)
    assert len(ds) == 7 and ds.manifest.parameters["shard_rows"] == 5
    # registered as a dataset by the success transition; the job page links to it (no GET wrote it)
    from fastapi.testclient import TestClient

    from app.store.models import Dataset
    from app.web.main import app

    with session_scope() as session:
        [dataset] = session.exec(select(Dataset).where(Dataset.job_id == job.id)).all()
    assert Path(dataset.path) == ds.path.resolve() and dataset.origin == "job"
    page = TestClient(app).get(f"/jobs/{job.id}").text
    assert f'href="/datasets/{dataset.id}"' in page


def test_decode_check_catches_tokens_that_do_not_give_back_the_text(tmp_path: Path, small_dir: Path) -> None:
    """A tokenizer whose decoder does not invert its encoder (here it rewrites 'h'): the trained runs no
    longer decode to the rendered assistant text, every such row is counted as mask_mismatch, and
    the policy fails the job."""
    spec = json.loads((small_dir / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [spec["decoder"], {"type": "Replace", "pattern": {
        "String": "h"}, "content": "H"}]}  # fmt: skip
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for f in small_dir.iterdir():
        (tok_dir / f.name).write_bytes(f.read_bytes())
    (tok_dir / "tokenizer.json").write_text(json.dumps(spec))
    convs = [conv(u("hi"), a("hello there"), line=1), conv(u("hi"), a("ok"), line=2)]
    with pytest.raises(JobFailed, match="mask_mismatch") as exc:
        tokenize_conversations(convs, tmp_path / "ds", TokenizeOptions(tok_dir, workers=1))
    report = exc.value.report
    assert isinstance(report, Report)
    assert report.rejected["mask_mismatch"] == 1 and report.rows_out == 1
    assert "Hello tHere" in report.examples["mask_mismatch"][0].reason
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_the_manifest_finds_its_tokenizer_from_another_folder_and_after_a_move(
    cli_env: Path, tmp_path: Path, small_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenized from the CLI with the tokenizer typed relative (`data/models/tok`): the manifest
    records where it is, `inspect` works from another folder, and once the folder moved inside the
    data roots it is found again by its fingerprint (by the CLI and the browser alike); an old
    manifest holding the path as typed still reads."""
    import shutil

    from draftdeck.browse.info import load_info
    from draftdeck.cli import app
    from draftdeck.shards.tokenizer_lookup import clear_cache

    project = tmp_path / "project"
    shutil.copytree(small_dir, project / "data" / "models" / "tok")
    monkeypatch.chdir(project)
    runner = CliRunner()
    res = runner.invoke(app, ["tokenize", str(CHAT), "--tokenizer", "data/models/tok", "--out", "var/ds",
                              "--workers", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = project / "var" / "ds"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["path"] == str((project / "data" / "models" / "tok").resolve())

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert runner.invoke(app, ["inspect", str(out), "--row", "0"]).exit_code == 0

    # The tokenizer moved (another machine's layout): its recorded folder is gone.
    roots = [tmp_path / "root"]
    (tmp_path / "root" / "tokenizers").mkdir(parents=True)
    moved = (project / "data" / "models" / "tok").rename(tmp_path / "root" / "tokenizers" / "small")
    clear_cache()
    res = runner.invoke(app, ["inspect", str(out), "--row", "0"])
    assert res.exit_code == 2 and "not on this machine" in " ".join(res.output.split())
    assert load_info(out).tokenizer_dir(roots=[project]) is None  # no folder there matches
    monkeypatch.setenv("DRAFTDECK_DATA_ROOTS", str(roots[0]))
    assert runner.invoke(app, ["inspect", str(out), "--row", "0"]).exit_code == 0
    assert load_info(out).tokenizer_dir(roots=roots) == str(moved.resolve())

    # A manifest written before the path was resolved: the path as typed, from the project folder.
    shutil.copytree(moved, project / "data" / "models" / "tok")
    manifest["tokenizer"]["path"] = "data/models/tok"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert load_info(out).tokenizer_dir() == str((project / "data" / "models" / "tok").resolve())


@pytest.mark.parametrize("middle", ["sharegpt", "parquet"])
def test_provenance_survives_conversion_twice_and_reaches_the_shards(
    tmp_path: Path, small_dir: Path, middle: str
) -> None:
    """Several files converted into one, that one converted again, then tokenized: every shard row
    names its original file and row (1-based line of a JSONL file, 0-based record of a JSON array),
    so per-source statistics see every original file, not the converted one."""
    import shutil

    from draftdeck.convert import convert

    fmt = FIXTURES.parent / "formats"
    originals = [tmp_path / "chat.jsonl", tmp_path / "sharegpt.json", tmp_path / "alpaca.json"]
    shutil.copy(CHAT, originals[0])
    shutil.copy(fmt / "sharegpt.json", originals[1])
    shutil.copy(fmt / "alpaca.json", originals[2])
    first = tmp_path / "merged.jsonl"
    convert(originals, first, "openai")
    rows = [json.loads(x) for x in first.read_text().splitlines()]
    assert {r["draftdeck_source"]["file"] for r in rows} == {str(p) for p in originals}
    second = tmp_path / f"again.{'parquet' if middle == 'parquet' else 'jsonl'}"
    convert([first], second, middle)  # the provenance of the first conversion is kept, not replaced
    out = tmp_path / "ds"
    tokenize_files([second], out, TokenizeOptions(small_dir, on_missing="drop", workers=1))
    ds = ShardDataset(out)
    got = {(ds.row(i)["source"], ds.row(i)["source_row"]) for i in range(len(ds))}
    want = {(r["draftdeck_source"]["file"], r["draftdeck_source"]["row"]) for r in rows}
    assert got <= want and {f for f, _ in got} == {str(p) for p in originals}
    assert (str(originals[0]), 1) in got  # chat.jsonl's first line
    stats = json.loads((out / "stats.json").read_text())
    assert str(second) not in json.dumps(stats) and str(originals[1]) in json.dumps(stats)
    # the job's chunk tasks (pickled items) carry the same provenance
    from draftdeck.tokenize.chunks import tokenize_files_chunked

    chunked = tmp_path / "chunked"
    opts = TokenizeOptions(small_dir, on_missing="drop", workers=1)
    tokenize_files_chunked([second], chunked, tmp_path / "parts", opts, chunk_rows=2)
    cds = ShardDataset(chunked)
    assert {(cds.row(i)["source"], cds.row(i)["source_row"]) for i in range(len(cds))} == got


def test_heavy_losses_reported_failed_past_half_and_alerted(tmp_path: Path, small_dir: Path) -> None:
    longs = [conv(u(f"write {i}"), a(" ".join(["word"] * 300)), line=i) for i in range(4)]
    shorts = [conv(u(f"hi {i}"), a(f"hello {i}"), line=10 + i) for i in range(6)]
    lost = [conv(u(" ".join(["context"] * 200)), a("late answer"), line=20 + i) for i in range(3)]
    opts = TokenizeOptions(
        small_dir, seq_length=64, max_rejected=0.5, alert_truncated=0.05, alert_rejected=0.05
    )
    r = tokenize_conversations(longs + shorts + lost, tmp_path / "ds", opts)
    losses = r.extra["losses"]
    assert (
        losses["truncated"]["rows"] == 4 and "4 of 13 rows truncated (30.8%)" in losses["truncated"]["alert"]
    )
    assert losses["rejected"]["rows"] == 3 and "alert" in losses["rejected"]
    assert [k for k, _ in opts.policy().loss_alerts(r)] == ["high_rejected", "high_truncation"]
    with pytest.raises(JobFailed, match=r"3 of 5 rows rejected \(60.0%\)"):
        tokenize_conversations(shorts[:2] + lost, tmp_path / "ds2", opts)


def _tokenize_job_alerts(data: Path, tok: Path, long_rows: int, rows: int) -> list[tuple[str, str]]:
    """Run a tokenize job (seq_length 64) over `rows` rows, `long_rows` of them cut; its alerts."""
    from sqlmodel import select

    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope
    from app.store.models import Alert
    from draftdeck.kinds import get_kind
    from draftdeck.tokenize.job import TokenizeParams

    src = data / f"c{long_rows}-{rows}.jsonl"
    answers = [" ".join(["word"] * (300 if i < long_rows else 3)) for i in range(rows)]
    lines = [{"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": text}]}
             for i, text in enumerate(answers)]  # fmt: skip
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    kind = get_kind("tokenize")
    raw = {"inputs": str(src), "tokenizer": str(tok), "seq_length": 64, "out": str(data / f"ds-{src.stem}")}
    params = kind.params.model_validate(raw).confined(get_settings().roots)
    assert isinstance(params, TokenizeParams)
    assert params.options().max_rejected == 0.5 and params.policy().alert_truncated == 0.05
    with session_scope() as session:
        job = jobs.create_job(session, "tokenize", params.model_dump(), kind.queue)
    assert run_job(job.id or 0) == "handed-off"
    assert run_chunk(job.id or 0, 0) == "succeeded"
    with session_scope() as session:
        return [(a.kind, a.message) for a in session.exec(select(Alert).where(Alert.job_id == job.id))]


def test_tokenize_job_alerts_on_truncation(migrated: Path, small_dir: Path) -> None:
    data = migrated / "data"
    tok = data / "tok"
    tok.mkdir()
    for f in small_dir.iterdir():
        (tok / f.name).write_bytes(f.read_bytes())
    # 1 of 15 (6.7 %): past the job's 5 %, under the dataset rule's fixed 10 %
    [(kind, message)] = _tokenize_job_alerts(data, tok, 1, 15)
    assert (
        kind == "high_truncation" and "1 of 15 rows truncated (6.7%), above the alert threshold 5%" in message
    )
    # 3 of 10: the dataset's own alert says it already; one alert of the kind per job
    [(kind, message)] = _tokenize_job_alerts(data, tok, 3, 10)
    assert kind == "high_truncation" and "3 of 10 rows (30%) were cut" in message
    assert _tokenize_job_alerts(data, tok, 0, 10) == []


def test_from_forces_one_shape_in_both_readers(tmp_path: Path, small_dir: Path) -> None:
    """`--from` reaches tokenize's reading (one process and chunk tasks): other shapes are rejected."""
    from draftdeck.tokenize.chunks import tokenize_files_chunked

    shapes = TEST_FIXTURES / "formats"
    paths = [shapes / "dolly.jsonl", shapes / "swift_turn_pairs.jsonl"]
    opts = TokenizeOptions(small_dir, workers=1, from_format="instruction_response")
    one = tokenize_files(paths, tmp_path / "one", opts)
    chunked = tokenize_files_chunked(paths, tmp_path / "two", tmp_path / "parts", opts, chunk_rows=1)
    for report in (one, chunked):
        assert report.rows_out == 2 and report.rejected == {"format_mismatch": 2}
        assert dict(report.formats) == {"instruction_response": 2}
        report.check_accounting()
    detected = tokenize_files(paths, tmp_path / "three", TokenizeOptions(small_dir, workers=1))
    assert detected.rows_out == 4 and dict(detected.formats) == {"instruction_response": 2, "turn_pairs": 2}


# -- the tokenizer, loaded once per process ---------------------------------------------------------
def test_a_second_job_loads_no_tokenizer_and_a_changed_one_loads_again(
    tmp_path: Path, small_dir: Path
) -> None:
    """Counted, not timed: the cache's loads and each report's `tokenizer_loads`. A copy of the same
    files elsewhere is the same tokenizer; a rewritten file is another."""
    import shutil

    from draftdeck.tokenize import loaded

    loaded.forget_all()
    copy = tmp_path / "copy"
    shutil.copytree(small_dir, copy)
    before = loaded.loads()
    reports = [
        tokenize_files([CHAT], tmp_path / f"ds{i}", TokenizeOptions(tok, workers=1))
        for i, tok in enumerate([small_dir, copy, small_dir])
    ]
    assert loaded.loads() - before == 1
    assert [r.extra["encoder"]["tokenizer_loads"] for r in reports] == [1, 0, 0]
    assert reports[0].extra["encoder"]["tokenizer_load_seconds"] > 0
    assert reports[1].extra["encoder"]["tokenizer_load_seconds"] == 0
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("}", ', "unused_note": 1}', 1))
    again = tokenize_files([CHAT], tmp_path / "ds3", TokenizeOptions(copy, workers=1))
    assert again.extra["encoder"]["tokenizer_loads"] == 1 and loaded.loads() - before == 2


def test_concurrent_first_loads_of_one_tokenizer_make_one_load(small_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from draftdeck.tokenize import loaded

    loaded.forget_all()
    before = loaded.loads()
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: loaded.load(small_dir, None, "auto"), range(6)))
    assert loaded.loads() - before == 1
    assert sum(fresh for _, fresh in results) == 1
    assert len({id(got) for got, _ in results}) == 1  # every caller got the one loaded copy


def test_the_tables_cache_keeps_the_most_recently_used_files(
    tmp_path: Path, small_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tables file per tokenizer and library versions: the folder is bounded, the least recently
    used (restored or written) removed first, so upgrades and many tokenizers do not pile up."""
    import os

    from draftdeck.tokenize import loaded

    monkeypatch.setenv("DRAFTDECK_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "tiktoken"
    folder.mkdir(parents=True)
    old = []
    for i in range(loaded.MAX_TABLES_FILES + 4):
        f = folder / f"old{i:02}.npz"
        f.write_bytes(b"x")
        os.utime(f, (1_000_000 + i, 1_000_000 + i))  # old00 the least recently used
        old.append(f)
    loaded.forget_all()
    loaded.load(small_dir, None, "auto")  # builds and saves its tables, then prunes
    kept = sorted(p.name for p in folder.glob("*.npz"))
    assert len(kept) == loaded.MAX_TABLES_FILES
    assert not {f.name for f in old[:5]} & set(kept)  # the five least recently used went
    assert {f.name for f in old[5:]} <= set(kept)
    (ours,) = set(kept) - {f.name for f in old}
    os.utime(folder / ours, (1, 1))  # as if unused for long: restoring it marks it used again
    loaded.forget_all()
    loaded.load(small_dir, None, "auto")
    assert (folder / ours).stat().st_mtime > 1_000_000 + 100
    assert loaded.prune_tables(folder, 1) and [p.name for p in folder.glob("*.npz")] == [ours]
    loaded.forget_all()


def test_draftdeck_cache_shows_the_tables_and_clears_them(
    tmp_path: Path, small_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from draftdeck.cli import app
    from draftdeck.tokenize import loaded

    monkeypatch.setenv("DRAFTDECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    loaded.forget_all()
    loaded.load(small_dir, None, "auto")
    (saved,) = (tmp_path / "cache" / "tiktoken").glob("*.npz")
    shown = CliRunner().invoke(app, ["cache"])
    assert shown.exit_code == 0, shown.output
    assert f"{tmp_path / 'cache' / 'tiktoken'}: 1 tables file" in shown.output
    assert saved.name in shown.output and "last used" in shown.output
    cleared = CliRunner().invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed 1 tables file" in cleared.output, cleared.output
    assert not saved.exists()
    builds = loaded.table_builds
    loaded.forget_all()
    loaded.load(small_dir, None, "auto")
    assert loaded.table_builds == builds + 1 and saved.exists()  # rebuilt when needed
    loaded.forget_all()


def test_a_later_process_restores_the_checked_tiktoken_tables(
    tmp_path: Path, small_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: the first load builds the tables and saves them; a load after the process
    forgot them (a new process) restores them, with the same ids; a damaged file is built again."""
    from draftdeck.tokenize import loaded

    monkeypatch.setenv("DRAFTDECK_CACHE", str(tmp_path / "cache"))
    text = "Hello <|im_start|>world, déjà vu 🎉\n  return x"
    loaded.forget_all()
    builds = loaded.table_builds
    first, _ = loaded.load(small_dir, None, "auto")
    assert first.fast is not None and loaded.table_builds == builds + 1
    (saved,) = (tmp_path / "cache" / "tiktoken").glob("*.npz")
    loaded.forget_all()
    again, fresh = loaded.load(small_dir, None, "auto")
    assert fresh and again.fast is not None and loaded.table_builds == builds + 1  # restored, not built
    assert again.fast.encode_one(text, [])[0].tolist() == first.fast.encode_one(text, [])[0].tolist()
    assert again.fast.specials == first.fast.specials and again.fast.nfc == first.fast.nfc
    saved.write_bytes(b"not an npz file")
    loaded.forget_all()
    rebuilt, _ = loaded.load(small_dir, None, "auto")
    assert loaded.table_builds == builds + 2 and rebuilt.fast is not None
    assert saved.read_bytes()[:2] == b"PK"  # replaced by a good one
    loaded.forget_all()
