"""A proposed mapping for rows no reader recognises: it reads the row it was made from, and scan offers
it (report, failure message, CLI figures) for the most common unreadable key set."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from draftdeck.cli.data import print_scan_figures
from draftdeck.convert.scan import scan_paths
from draftdeck.errors import JobFailed
from draftdeck.formats.columns import parse_mapped
from draftdeck.formats.common import ParseContext, ParseOptions
from draftdeck.formats.suggest import option_text, suggest_mapping
from tests.conftest import FIXTURES

MEDICAL = {"Question": "A 40-year-old has chest pain. Next step?", "Complex_CoT": "Think of the ECG first.",
           "Response": "Get an ECG."}  # fmt: skip


def _read(row: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    found = suggest_mapping(row)
    assert found is not None
    columns, tags = found
    ctx = ParseContext(ParseOptions(columns=tuple(columns.items()), tags=tuple(tags.items())))
    [conv] = parse_mapped(row, ctx)
    return [(m.role, m.content, m.reasoning) for m in conv.messages]


def test_named_fields_become_user_reasoning_and_answer() -> None:
    assert suggest_mapping(MEDICAL) == (
        {"prompt": "Question", "reasoning": "Complex_CoT", "response": "Response"}, {})  # fmt: skip
    assert _read(MEDICAL) == [("user", MEDICAL["Question"], None),
                              ("assistant", "Get an ECG.", "Think of the ECG first.")]  # fmt: skip


def test_two_text_fields_are_prompt_then_answer_and_turns_get_their_tags() -> None:
    assert _read({"src": "Hallo Welt", "tgt": "Hello world"}) == [
        ("user", "Hallo Welt", None), ("assistant", "Hello world", None)]  # fmt: skip
    assert _read({"de": "Hallo Welt", "en": "Hello world"})[1] == ("assistant", "Hello world", None)
    dialog = {"dialog": [{"speaker": "client", "text": "hi there"}, {"speaker": "bot", "text": "hello!"}]}
    tags = {"role_tag": "speaker", "content_tag": "text", "user_tag": "client", "assistant_tag": "bot"}
    assert suggest_mapping(dialog) == ({"messages": "dialog"}, tags)
    assert _read(dialog) == [("user", "hi there", None), ("assistant", "hello!", None)]


def test_no_proposal_without_a_user_turn() -> None:
    assert suggest_mapping({"id": 3, "score": 0.5}) is None
    assert suggest_mapping({"a": "x", "b": "y", "c": "z"}) is None  # three unnamed texts: no guess
    assert option_text({"prompt": "My Field"}, {}) == "--columns 'prompt=My Field'"


def test_scan_offers_the_mapping_for_the_unreadable_rows(tmp_path: Path) -> None:
    path = tmp_path / "med.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello " * 9}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in [MEDICAL, MEDICAL, chat]))
    report = scan_paths([path])
    proposal = report.extra["suggested_mapping"]
    assert (proposal["keys"], proposal["rows"]) == (["Complex_CoT", "Question", "Response"], 2)
    assert proposal["options"] == (
        "--columns prompt=Question --columns reasoning=Complex_CoT --columns response=Response"
    )
    out = io.StringIO()
    print_scan_figures(report.to_dict(), Console(file=out, width=200))
    assert "would read with" in out.getvalue()
    assert f"\n  {proposal['options']}\n" in out.getvalue()  # the flags on a line of their own
    path.write_text(json.dumps(MEDICAL) + "\n")
    with pytest.raises(JobFailed, match="declare their fields with --columns: prompt=Question reasoning="):
        scan_paths([path])
    readable = tmp_path / "chat.jsonl"
    readable.write_text(json.dumps(chat) + "\n")
    assert "suggested_mapping" not in scan_paths([readable]).extra


MEDICAL_PAIRS = FIXTURES / "formats" / "medical_reasoning_pairs.jsonl"
MEDICAL_FLAGS = "--columns prompt=Question --columns reasoning=Complex_CoT --columns response=Response"


def test_rows_read_by_a_short_pair_beside_long_text_get_the_mapping_that_reads_it(tmp_path: Path) -> None:
    """Issue 49: rows with a one-letter `question` / `answer` pair beside the long `Question` /
    `Complex_CoT` / `Response` were read by the pair, the long text left with a warning, and scan
    proposed nothing. The text left is far longer than the text read: scan proposes the mapping, in its
    report and as the exact flags `draftdeck scan` prints on a line of their own."""
    report = scan_paths([MEDICAL_PAIRS])
    assert (report.rows_out, dict(report.formats)) == (6, {"query_response": 6})
    proposal = report.extra["suggested_mapping"]
    assert (proposal["why"], proposal["options"], proposal["rows"]) == ("unread_text", MEDICAL_FLAGS, 6)
    assert proposal["unread_chars"] >= 3 * proposal["read_chars"] and proposal["unread_rows"] == 6
    # the proposal read as given: every row, with its long question, reasoning and answer
    ctx_columns = ParseOptions(columns=tuple(proposal["columns"].items()))
    rows = [json.loads(line) for line in MEDICAL_PAIRS.read_text().splitlines()]
    for row in rows:
        [conv] = parse_mapped(row, ParseContext(ctx_columns))
        assert [(m.content, m.reasoning) for m in conv.messages] == [
            (row["Question"], None), (row["Response"], row["Complex_CoT"])]  # fmt: skip
    env = {
        **os.environ,
        "COLUMNS": "80",
        "DRAFTDECK_HOME": str(tmp_path),
        "DRAFTDECK_DATA_ROOTS": str(tmp_path),
    }
    data = tmp_path / MEDICAL_PAIRS.name
    data.write_bytes(MEDICAL_PAIRS.read_bytes())
    cli = subprocess.run([sys.executable, "-m", "draftdeck.cli", "scan", str(data)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "read by the wrong fields" in cli.stdout
    assert f"  {MEDICAL_FLAGS}" in cli.stdout.splitlines()  # whole at 80 columns: a user copies it


def test_a_long_side_field_beside_the_text_read_is_no_misreading(tmp_path: Path) -> None:
    """A long note beside a longer conversation is warned about, not a reason to read other fields."""
    answer = "Take the ECG first, then troponin. " * 20
    row = {"question": "Chest pain: what first?", "answer": answer, "Notes": "Reviewed by two doctors. " * 10}
    path = tmp_path / "notes.jsonl"
    path.write_text(json.dumps(row) + "\n")
    report = scan_paths([path])
    assert report.warnings["unused_text_field"] == 1 and "suggested_mapping" not in report.extra
