"""The README and the documentation pages work as printed: every `draftdeck ...` line of their bash blocks
names a command that exists, and every option it uses is one that command takes (its --help lists it).

Running each one for real needs the user's files and models; what breaks a newcomer first is a
command or an option that the docs name and the CLI no longer has, and that is what this checks. Beside
it: the README stays a landing page (size, links that resolve), and the code paths the docs name exist."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))
README_MAX_BYTES = 10_240


def _bash_lines(path: Path) -> list[str]:
    """The lines of a page's bash blocks, continuation lines (`\\`) joined."""
    text, block = "", False
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("```"):
            block = raw.strip() == "```bash"
            continue
        if not block:
            continue
        text += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw + "\n"
    return text.splitlines()


def _commands(path: Path) -> list[list[str]]:
    """The `draftdeck` invocations of a page's bash blocks, as argument lists."""
    out = []
    for line in _bash_lines(path):
        if line.lstrip().startswith("#"):
            continue  # a comment line (a batch script's #SBATCH too) may hold anything
        line = line.split(" #", 1)[0]  # a comment may hold anything, quotes included
        for part in line.split(";"):
            words = shlex.split(part.replace("[", " ").replace("]", " ").replace("|", " "))
            while words and "=" in words[0]:  # VAR=value before the command
                words = words[1:]
            if words and words[0] == "draftdeck":
                out.append(words[1:])
    return out


def _path(words: list[str]) -> list[str]:
    """The command and its sub-commands: the leading words before the first argument or option."""
    groups = {"jobs": 1, "db": 1, "serving": 1}
    n = 1 + groups.get(words[0], 0)
    return words[:n]


def test_every_page_is_read() -> None:
    names = {p.name for p in PAGES}
    assert {"index.md", "convert.md", "tokenize.md", "train.md", "eval.md", "jobs.md"} <= names, names


# One process reads every command's --help through the real entry point (typer's runner, 200 columns):
# a process per command cost 20 s.
HELPS = """
import json, sys
from typer.testing import CliRunner
from app.cli.main import app
out = {}
for cmd in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200)
    out[" ".join(cmd)] = [r.exit_code, r.output]
print(json.dumps(out))
"""


def _helps(cmds: set[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[int, str]]:
    argv = [sys.executable, "-c", HELPS, json.dumps(sorted(cmds))]
    r = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={"PATH": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    return {tuple(k.split(" ")): (code, text) for k, (code, text) in json.loads(r.stdout).items()}


def test_docs_commands_and_options_exist() -> None:
    commands = {path: _commands(path) for path in [README, *PAGES]}
    assert len(commands[README]) >= 5, commands[README]  # the README's path from files to a drafter
    assert sum(map(len, commands.values())) >= 40, commands  # the pages really were read
    helps = _helps({tuple(_path(words)) for found in commands.values() for words in found})
    missing = []
    for path, found in commands.items():
        for words in found:
            cmd = tuple(_path(words))
            code, text = helps[cmd]
            assert code == 0, f"{path.name}: draftdeck {' '.join(cmd)}: {text[-400:]}"
            flags = {re.split("=", w)[0] for w in words if w.startswith("--")}
            missing += [f"{path.name}: draftdeck {' '.join(cmd)} {f}" for f in sorted(flags) if f not in text]
    assert missing == []


def test_the_data_the_readme_puts_in_the_checkout_stays_out_of_git() -> None:
    """The README tells users to put their files in ./data/ and the server keeps its state in ./var/;
    the docs build writes ./site/: none of them may end up in a commit."""
    for path in ("data/train.jsonl", "data/sub/a.parquet", "var/draftdeck.db", "site/index.html"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT, timeout=30)
        assert r.returncode == 0, f"{path} is not ignored by .gitignore"


def test_readme_is_a_landing_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes; at most {README_MAX_BYTES:,}: move detail to docs/"
    )


def test_readme_links_resolve() -> None:
    """Every relative link or image of the README points at a file of the checkout."""
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    assert any(t.startswith("docs/") for t in targets), targets
    broken = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, an anchor of the README itself
        if not (REPO_ROOT / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert broken == [], f"README.md links to missing files: {broken}"


_PREFIXES = ("draftdeck/", "app/", "workers/", "benchmarks/", "tests/", "scripts/", "migrations/")


def test_code_paths_the_docs_name_exist() -> None:
    """A path in backticks (`app/store/state.py`, `draftdeck/cli/options.py:job_command`) names a file or
    folder of the checkout: a module that moves must take its documentation with it."""
    missing = []
    for path in [README, *PAGES]:
        for quoted in re.findall(r"`([^`\s]+)`", path.read_text(encoding="utf-8")):
            name = quoted.split(":", 1)[0]
            if not name.startswith(_PREFIXES) or "<" in name or "*" in name:
                continue
            if any(part.startswith(".") for part in Path(name).parts):  # tests/.tokenizers/: built locally
                continue
            if not (REPO_ROOT / name).exists():
                missing.append(f"{path.name}: {quoted}")
    assert missing == []


# `python benchmarks/NAME.py ARGS` as the docs print it, in a bash block or in inline code (a code span
# may wrap onto the next line); the arguments end at a comment or the next command.
_BENCH = re.compile(r"\bpython3?\s+(benchmarks/[\w./-]+\.py)([^`]*)")


def _bench_commands(path: Path) -> list[tuple[str, list[str]]]:
    """The `python benchmarks/...` invocations of a page: (script, its arguments)."""
    # the inline code outside fenced blocks (whose backticks would pair with the wrong ones)
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]
    found = []
    for piece in [*_bash_lines(path), *spans]:
        for script, rest in _BENCH.findall(piece):
            rest = re.split(r"\s#|;|&&|\|", rest, maxsplit=1)[0]
            found.append((script, shlex.split(rest.replace("[", " ").replace("]", " "))))
    return found


# One process parses each invocation with the script's own argparse parser and stops there (the
# benchmark never runs): an unknown option or a bad value exits 2 with argparse's message. `--help`
# after the options would not do: argparse prints the help and exits 0 before it rejects an unknown one.
PARSES = """
import argparse, contextlib, io, json, runpy, sys

class Parsed(BaseException):  # not an Exception: a script's own `except Exception` does not catch it
    pass

def parse_args(self, args=None, namespace=None):
    PARSE(self, args, namespace)
    raise Parsed

PARSE, argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_args, parse_args
out, path = {}, list(sys.path)
for script, argv in json.loads(sys.argv[1]):
    sys.argv, err = [script, *argv], io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        said = "ran to its end without parsing its arguments"
    except Parsed:
        said = ""
    except SystemExit as exc:
        said = f"exit {exc.code}: {err.getvalue()[-400:]}"
    sys.path[:] = path  # a script's import-path fix stays its own
    out[json.dumps([script, argv])] = said
print(json.dumps(out))
"""


def test_docs_benchmark_commands_run_with_the_options_they_print() -> None:
    """Every `python benchmarks/...` line of the README and the pages names a script of the checkout
    whose argparse accepts the options and values printed with it: a figure the docs quote stays
    reproducible with the command beside it (issue 56)."""
    commands = {path: _bench_commands(path) for path in [README, *PAGES]}
    every = {(script, tuple(argv)) for found in commands.values() for script, argv in found}
    assert len(every) >= 20, every  # the pages really were read
    assert any(argv for _, argv in every), every  # and their options with them
    missing = sorted({script for script, _ in every if not (REPO_ROOT / script).is_file()})
    assert missing == [], f"the docs run benchmarks that do not exist: {missing}"
    argv = [sys.executable, "-c", PARSES, json.dumps(sorted(every))]
    r = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])
    refused = []
    for path, found in commands.items():
        for script, args in found:
            why = said[json.dumps([script, args])]
            refused += [f"{path.name}: python {' '.join([script, *args])}: {why}"] if why else []
    assert refused == [], "\n".join(refused)
