"""The README's commands work as printed: every `draftdeck ...` line of its bash blocks names a
command that exists, and every option it uses is one that command takes (its --help lists it).

Running each one for real needs the user's files and models; what breaks a newcomer first is a
command or an option that the README names and the CLI no longer has, and that is what this checks."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"


def _commands() -> list[list[str]]:
    """The `draftdeck` invocations of the README's bash blocks, as argument lists."""
    lines, block = [], False
    text = ""
    for raw in README.read_text().splitlines():
        if raw.startswith("```"):
            block = raw.strip() == "```bash"
            continue
        if not block:
            continue
        text += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw + "\n"
    for line in text.splitlines():
        for part in line.split(";"):
            words = shlex.split(part.split(" #", 1)[0].replace("[", " ").replace("]", " ").replace("|", " "))
            while words and "=" in words[0]:  # VAR=value before the command
                words = words[1:]
            if words and words[0] == "draftdeck":
                lines.append(words[1:])
    return lines


def _path(words: list[str]) -> list[str]:
    """The command and its sub-commands: the leading words before the first argument or option."""
    groups = {"jobs": 1, "db": 1, "serving": 1}
    n = 1 + groups.get(words[0], 0)
    return words[:n]


def test_readme_commands_and_options_exist() -> None:
    commands = _commands()
    assert len(commands) >= 15, commands  # the README really was read
    helps: dict[tuple[str, ...], str] = {}
    missing = []
    for words in commands:
        path = tuple(_path(words))
        if path not in helps:
            argv = [sys.executable, "-m", "app.cli.main", *path, "--help"]
            env = {"COLUMNS": "200", "PATH": ""}
            r = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
            assert r.returncode == 0, f"draftdeck {' '.join(path)}: {r.stderr[-400:]}"
            helps[path] = r.stdout
        flags = {re.split("=", w)[0] for w in words if w.startswith("--")}
        missing += [f"draftdeck {' '.join(path)} {f}" for f in sorted(flags) if f not in helps[path]]
    assert missing == []


def test_the_data_the_readme_puts_in_the_checkout_stays_out_of_git() -> None:
    """The README tells users to put their files in ./data/ and the server keeps its state in ./var/:
    neither may end up in a commit."""
    for path in ("data/train.jsonl", "data/sub/a.parquet", "var/draftdeck.db"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT, timeout=30)
        assert r.returncode == 0, f"{path} is not ignored by .gitignore"
