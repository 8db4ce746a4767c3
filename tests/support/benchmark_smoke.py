"""Every script in benchmarks/ still runs and prints its table (issue 56): nothing else runs them, so a
figure the docs quote could stop being reproducible unseen (eval_decode.py --rollback crashed, KeyError).

Each script a user runs (benchmarks/*.py less the `_*.py` helpers: found by globbing, so a new script
without a `--smoke` size fails here) runs with `--smoke`, its own smallest size: the same code path and
the same table, measuring nothing: seconds where it can be, about a minute where a script's point
is fresh processes (train_sharded's ranks, the demo's runs, drafters' training processes). Asserted:
exit 0 and a markdown table on stdout (a header row, its `|---|` rule and at least one row of as many
cells), the table the full size prints.

benchmarks/serve_gpu.py needs vLLM (and a GPU): where vLLM is absent, its smoke is that it says so and
exits 2 without a traceback, before it touches anything."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCRIPTS = sorted(p for p in (REPO_ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
# Modes of a script that print a table of their own, smoked too: eval_decode's rollback table is the
# one that crashed unseen (KeyError 'llama3').
MODES = {"eval_decode.py": [["--rollback"]]}
RUNS: list[tuple[Path, list[str]]] = [(p, []) for p in SCRIPTS] + [
    (p, mode) for p in SCRIPTS for mode in MODES.get(p.name, [])
]
# A script that needs what this machine may lack: (the module it needs, what it says when it is absent).
NEEDS = {"serve_gpu.py": ("vllm", "vLLM is not installed here")}
RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def markdown_table(text: str) -> list[list[str]]:
    """The first markdown table of `text`: its header and rows as cells; [] when there is none."""
    lines = [line.strip() for line in text.splitlines()]
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and lines[i].endswith("|") and RULE.match(lines[i + 1]):
            table = [lines[i]]
            table += _rows_after(lines, i + 2)
            return [[cell.strip() for cell in row.strip("|").split("|")] for row in table]
    return []


def _rows_after(lines: list[str], start: int) -> list[str]:
    rows = []
    for line in lines[start:]:
        if not (line.startswith("|") and line.endswith("|")):
            break
        rows.append(line)
    return rows


PARTS = 3  # the runs are spread over PARTS test files: `make test` hands a whole file to one worker


def part(k: int) -> list[tuple[Path, list[str]]]:
    """The k-th of PARTS shares of the runs, round robin over the sorted scripts (the slow ones, about
    a minute each, are demo, drafters, train_sharded and tokenize: no share gets more than two)."""
    return RUNS[k::PARTS]


def smoke_test(k: int) -> Callable[..., None]:
    """The test of share k, for a test module to bind to a test_ name."""

    @pytest.mark.timeout(400)
    @pytest.mark.parametrize(("script", "mode"), part(k), ids=[" ".join([p.name, *m]) for p, m in part(k)])
    def test_benchmark_runs_at_its_smoke_size_and_prints_its_table(
        script: Path, mode: list[str], tmp_path: Path
    ) -> None:
        run_smoke(script, mode, tmp_path)

    return test_benchmark_runs_at_its_smoke_size_and_prints_its_table


def run_smoke(script: Path, mode: list[str], tmp_path: Path) -> None:
    """Run `script --smoke *mode` as a user would and check its table."""
    # One thread a process (torch, BLAS): the smokes run beside other tests, and on two busy cores a
    # second thread made a tiny target's training 4x slower, not faster.
    env = {
        **os.environ,
        "DRAFTDECK_HOME": str(tmp_path / "home"),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    env["TMPDIR"] = str(tmp_path)  # the scripts' mkdtemp worlds and runs go with the test's folder
    for var in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN"):  # the embedded defaults, as `make bench`
        env.pop(var, None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", *mode], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=380,
    )  # fmt: skip
    command = " ".join([script.name, "--smoke", *mode])
    said = f"{command} exited {done.returncode} in {time.monotonic() - started:.0f} s"
    print(said)  # the wall time of each, shown with -rA or -s: the smoke sizes are kept cheap by hand
    output = f"{said}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    module, message = NEEDS.get(script.name, ("", ""))
    if module and importlib.util.find_spec(module) is None:
        assert done.returncode == 2 and message in done.stderr, output
        assert "Traceback" not in done.stderr, output
        return
    assert done.returncode == 0, output
    table = markdown_table(done.stdout)
    assert len(table) >= 2, f"no markdown table (header, |---| rule, rows) on stdout:\n{output}"
    head, rows = table[0], table[1:]
    assert all(len(row) == len(head) for row in rows), output
    assert all(any(cell for cell in row) for row in rows), output
