"""What `draftdeck scan` prints: the summary title on its own line, user text never read as markup."""

from __future__ import annotations

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
    assert r.returncode == 0, r.stderr
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
    assert r.returncode == 0, r.stderr
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
