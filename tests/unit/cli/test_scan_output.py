"""What `draftdeck scan` prints: the summary title on its own line, user text never read as markup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _scan(home: Path, target: Path, columns: int = 400) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COLUMNS": str(columns),
        "DRAFTDECK_HOME": str(home),
        "DRAFTDECK_DATA_ROOTS": str(home),
    }
    return subprocess.run(
        [sys.executable, "-m", "draftdeck.cli", "scan", str(target)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_long_title_is_one_line_not_wrapped_to_the_table(tmp_path: Path) -> None:
    target = tmp_path / "data" / "regenerated_by_the_target_model_at_temperature_zero.jsonl"
    target.parent.mkdir()
    target.write_text('{"a": 1}\n{"a": 2}\n[3]\n')
    r = _scan(tmp_path, target)
    assert r.returncode == 1, r.stderr  # convert would keep none of its rows: a failed pre-flight
    lines = r.stdout.splitlines()
    assert lines[0] == f"scan {target}"  # the table is ~30 columns wide; the title is not cut to it
    assert any(line.split() == ["in", "│", "3"] for line in lines)
    assert any(line.split() == ["rejected:", "not_an_object", "│", "1"] for line in lines)
    assert "key sets" in lines


def test_paths_that_look_like_markup_are_printed_as_they_are(tmp_path: Path) -> None:
    odd = tmp_path / "data" / "[" / "x]rows.jsonl"  # the path holds "[/x]": a closing tag to rich
    odd.parent.mkdir(parents=True)
    odd.write_text('{"a": 1}\n[1]\n')
    r = _scan(tmp_path, odd)
    assert r.returncode == 1, r.stderr  # nothing convert would keep: a failed pre-flight, still printed
    assert f"scan {odd}" in r.stdout
    assert f"{odd}:2: a JSON list, not an object" in r.stdout
    empty = odd.with_name("x]empty.jsonl")
    empty.write_text("")
    r = _scan(tmp_path, empty)
    assert r.returncode == 1
    assert f"failed: {empty}: empty input (0 bytes, no rows)" in r.stderr
    r = _scan(tmp_path, odd.with_name("x]missing.jsonl"))
    assert r.returncode == 2
    assert "[/x]missing.jsonl: no such file" in r.stderr
    assert "Traceback" not in r.stderr


def _scan_args(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "DRAFTDECK_HOME": str(home), "DRAFTDECK_DATA_ROOTS": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "draftdeck.cli", "scan", *args],
        cwd=home, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _row(question: str, answer: str | None = None) -> str:
    turns = [{"role": "user", "content": question}] + (
        [{"role": "assistant", "content": answer}] if answer is not None else []
    )
    return json.dumps({"messages": turns})


def test_preflight_figures_are_printed(tmp_path: Path) -> None:
    target = tmp_path / "data" / "mixed.jsonl"
    target.parent.mkdir()
    lines = [_row(f"q{i}", "Sure") for i in range(3)] + [_row("only a question")]
    lines += [json.dumps({"instruction": "Say hi", "context": "", "response": "hi"})]
    lines += [json.dumps({"images": ["x.png"], "messages": [{"role": "user", "content": "<image>[red]?"}]})]
    lines += [json.dumps({"[bold]odd[/]": 1})]
    target.write_text("\n".join(lines) + "\n")
    r = _scan_args(tmp_path, str(target), "--report", str(tmp_path / "scan.json"))
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert "shapes" in r.stdout.splitlines()
    assert ["openai", "│", "4"] in rows and ["instruction_response", "│", "1"] in rows
    assert "convert would keep 4 of 7 rows" in r.stdout
    assert "convert would reject" in r.stdout.splitlines()
    assert f"no_assistant_turn │    1 │ {target}:4: no assistant message" in r.stdout
    missing = target.parent / "x.png"  # images are read (relative to the file) and checked
    assert (
        f"image_missing     │    1 │ {target}:6: image 1 of message 0 (user): no image file at {missing}"
        in (r.stdout)
    )
    assert (
        f"unknown_format    │    1 │ {target}:7: no known chat shape has the keys: [bold]odd[/]" in r.stdout
    )
    assert "prompt-only rows: 1 " in r.stdout
    assert ["'sure'", "│", "3", "│", "kept"] in rows
    assert ["[bold]odd[/]", "│", "1"] in rows  # a key set printed as it is, never read as markup
    report = json.loads((tmp_path / "scan.json").read_text())
    assert report["would_keep"] == 4 and report["prompt_only"] == 1
    assert report["rows_in"] + report["rows_expanded"] == report["rows_out"] + sum(
        report["rejected"].values()
    )


def test_from_forces_a_shape_and_an_unknown_one_is_a_usage_error(tmp_path: Path) -> None:
    target = tmp_path / "data" / "rows.jsonl"
    target.parent.mkdir()
    target.write_text(
        _row("q", "a long answer here") + "\n" + json.dumps({"input": "2+2", "output": "4"}) + "\n"
    )
    r = _scan_args(tmp_path, str(target), "--from", "query_response")
    assert r.returncode == 0, r.stderr
    assert f"format_mismatch │    1 │ {target}:1: not query_response (which needs" in r.stdout
    r = _scan_args(tmp_path, str(target), "--from", "llava")
    assert r.returncode == 2
    said = " ".join(r.stderr.split())
    assert "--from: 'llava' is not one of openai, sharegpt, anthropic" in said
    assert "Value error" not in said
    r = _scan_args(tmp_path, str(target), "--from", "sharegtp")  # a typo: the closest choice is named
    assert r.returncode == 2
    assert "(did you mean sharegpt?)" in " ".join(r.stderr.split())
