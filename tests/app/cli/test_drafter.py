"""`draftdeck train` and `export-drafter` as a user runs them, each in a process of its own, on a tiny
target: a chat file is refused before the target is loaded, with the tokenize command to run; no
library progress bar in the output; an EAGLE-3 export without --target names the run's target as its
verifier, or is refused with the flag to add."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WIDE = {**os.environ, "COLUMNS": "400"}  # one line per message: the assertions read whole sentences


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "draftdeck.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=WIDE, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random target, its own greedy answers as a dataset folder, and a 2-step EAGLE-3 run."""
    from tests.support.drafter import greedy_rows, saved_target, write_dataset

    root = tmp_path_factory.mktemp("cli")
    target = saved_target(root / "target")
    data = write_dataset(root / "ds", greedy_rows(target, 16, gen_len=16), target)
    run = _cli(
        "train", str(data), "--target", str(target), "--out", str(root / "run"), "--drafter", "eagle3",
        "--max-steps", "2", "--batch-size", "4", "--draft-vocab-size", "16", "--ttt-steps", "2",
        "--eval-every", "2", "--checkpoint-every", "2", "--heldout-fraction", "0.25", "--device", "cpu",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return {"root": root, "target": target, "run": root / "run", "train": run}


def test_training_loads_the_target_without_a_progress_bar(trained: dict[str, Any]) -> None:
    said = trained["train"].stderr
    assert "pre-flight" in said  # the target was loaded and ran
    assert "Loading weights" not in said and "%|" not in said


def test_run_json_records_the_command_line_that_started_the_run(trained: dict[str, Any]) -> None:
    prov = json.loads((trained["run"] / "run.json").read_text())["provenance"]
    command = prov["command"]  # sys.argv of `python -m draftdeck.cli train ...`
    assert command[1] == "train" and command[command.index("--out") + 1] == str(trained["run"])
    assert prov["parameters"]["drafter"] == "eagle3" and prov["world_size"] == 1 and prov["device"] == "cpu"


def test_a_chat_file_is_refused_before_the_target_loads(trained: dict[str, Any], tmp_path: Path) -> None:
    chat = tmp_path / "data.jsonl"
    chat.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    )
    refused = _cli("train", str(chat), "--target", str(trained["target"]), "--out", str(tmp_path / "run"))
    assert refused.returncode == 2
    said = " ".join(refused.stderr.split())
    assert f"{chat} is a file, not a dataset folder" in said
    assert (
        f"draftdeck tokenize {chat} --tokenizer {trained['target']} --out {tmp_path / 'data-tokens'}" in said
    )
    assert "Not a directory" not in said and "Loading weights" not in said
    assert not any((tmp_path / "run").glob("*"))  # nothing written (the folder is the console's log's)


def test_an_eagle3_export_names_the_runs_target_or_asks_for_one(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    target = trained["target"]
    done = _cli("export-drafter", str(trained["run"]), "--out", str(tmp_path / "export"))
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["speculators_config"]["verifier"] == {
        "name_or_path": str(target),
        "architectures": ["Qwen3ForCausalLM"],
    }
    assert f"the target: {target} (the run's record names it" in done.stdout
    assert f"vllm serve {target} " in done.stdout and "<target>" not in done.stdout
    # the run moved to a machine without its target: refused, naming the flag to add
    moved = tmp_path / "moved"
    shutil.copytree(trained["run"], moved)
    record = json.loads((moved / "run.json").read_text())
    record["target"] = str(tmp_path / "elsewhere")
    (moved / "run.json").write_text(json.dumps(record))
    refused = _cli("export-drafter", str(moved), "--out", str(tmp_path / "export2"))
    assert refused.returncode == 2 and "add --target" in " ".join(refused.stderr.split())
    assert not (tmp_path / "export2" / "config.json").exists()
