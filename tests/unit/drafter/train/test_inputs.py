"""The train job refuses inputs that are not dataset folders before it loads the target
(draftdeck.drafter.train.preflight.check_inputs): a chat file, a folder without manifest.json, a path
that does not exist, each named, with the `draftdeck tokenize` command that makes a dataset folder of
chat data. The target here is a folder with no model in it: loading it first would fail on the target."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from draftdeck.drafter.train.data import DataError
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _train(tmp_path: Path, *inputs: Path) -> str:
    no_model = tmp_path / "target"
    no_model.mkdir(exist_ok=True)
    params = TrainParams(inputs=[str(p) for p in inputs], target=str(no_model), out=str(tmp_path / "run"))
    with pytest.raises(DataError) as refused:
        run_train(params, LocalContext(tmp_path / "ctx"))
    assert not (tmp_path / "run").exists()  # refused before anything was written
    return str(refused.value)


def test_a_chat_file_is_refused_with_the_tokenize_command(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(CHAT) + "\n")
    said = _train(tmp_path, data)
    assert f"{data} is a file, not a dataset folder" in said
    command = shlex.join(
        [
            "draftdeck",
            "tokenize",
            str(data),
            "--tokenizer",
            str(tmp_path / "target"),
            "--out",
            str(tmp_path / "data-tokens"),
        ]
    )
    assert f"Tokenize it first: {command}; then train on {tmp_path / 'data-tokens'}" in said


def test_a_folder_without_a_manifest_and_a_missing_path_are_each_named(tmp_path: Path) -> None:
    chats = tmp_path / "chats"  # chat files in a folder: tokenize reads the folder
    chats.mkdir()
    (chats / "a.jsonl").write_text(json.dumps(CHAT) + "\n")
    empty, missing = tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    said = _train(tmp_path, chats, empty, missing)
    assert f"{chats} has no manifest.json: not a dataset folder `draftdeck tokenize` wrote" in said
    assert f"{empty} has no manifest.json" in said and f"{missing} does not exist" in said
    # only the folder with chat data in it is named in the command: tokenize reads nothing in the empty one
    assert f"draftdeck tokenize {chats} --tokenizer" in said and f"tokenize {chats} {empty}" not in said
