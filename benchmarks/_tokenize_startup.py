# ruff: noqa: E501 - the child scripts and the table lines read best unwrapped
"""Start-up of tokenize: the whole command and a worker's jobs, against one tokenizer load (used by
benchmarks/tokenize.py, which prints this table; `--startup-only` prints only it).

Every row runs in fresh processes, measured in one run:
- one tokenizer load: a fresh interpreter timing ``load_tokenizer`` (transformers' import included),
  timed inside that process: its interpreter start and exit are not counted, while the command's are;
- ``draftdeck tokenize`` on N conversations: the whole command as a user runs it (interpreter start,
  imports, tokenizer and tiktoken tables, the job, the shards), wall clock from outside: once with
  an empty tables cache (the tables built and checked), then with the tables an earlier run saved;
- a worker's first job (cold pool process: imports preloaded by the worker's main process, as
  workers/tasks.py does, then the tokenizer loaded by the job) and its second job (warm: the
  process kept the tokenizer), both through the chunk tasks' code (plan, chunk, finish).
Start-up = the row's time minus one tokenizer load. Goal: at most 2 s for the command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

LOAD = """
import sys, time
t = time.perf_counter()
from draftdeck.chat.render import load_tokenizer
load_tokenizer(sys.argv[1])
print(time.perf_counter() - t)
"""

WORKER = """
import json, sys, time
from pathlib import Path
from draftdeck.tokenize import loaded
from draftdeck.tokenize.chunks import tokenize_files_chunked
from draftdeck.tokenize.pipeline import TokenizeOptions
loaded.preload_imports()  # what the worker's main process did before forking this pool process
src, tok, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
out = []
for job in (1, 2):
    t = time.perf_counter()
    r = tokenize_files_chunked([src], work / f"ds{job}", work / f"parts{job}", TokenizeOptions(tok, workers=1), 10_000)
    out.append({"seconds": time.perf_counter() - t, "loads": r.extra["encoder"]["tokenizer_loads"], "rows": r.rows_out})
print(json.dumps(out))
"""


CACHE: dict[str, str] = {}  # DRAFTDECK_CACHE for the children: a folder of this benchmark's own


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "TRANSFORMERS_VERBOSITY": "error", **CACHE}


def _python(root: Path, code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(root),
                          cwd=root, check=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def _command(root: Path, src: Path, tok: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "draftdeck.cli", "tokenize", str(src), "--tokenizer", str(tok),
                    "--out", str(out)], capture_output=True, env=_env(root), cwd=root, check=True)  # fmt: skip
    return time.perf_counter() - t


def startup_table(
    root: Path,
    work: Path,
    tok: Path,
    write_input: Callable[[int, Path], None],
    reps: int = 2,
    sizes: tuple[int, ...] = (31, 200),
) -> list[str]:
    """The table's lines. Each timing is the best of `reps` runs (the machine is shared); the command
    on each of `sizes` conversations (the first size also with an empty tables cache and for the worker)."""
    work.mkdir(parents=True, exist_ok=True)
    inputs = {}
    for n in sizes:
        inputs[n] = work / f"startup-{n}.jsonl"
        write_input(n, inputs[n])
    CACHE["DRAFTDECK_CACHE"] = str(work / "cache")
    shutil.rmtree(work / "cache", ignore_errors=True)  # the first command builds the tiktoken tables
    load = min(float(_python(root, LOAD, str(tok))) for _ in range(reps))
    rows: list[tuple[str, float]] = [("one tokenizer load (fresh process)", load)]
    first = sizes[0]
    built = _command(root, inputs[first], tok, work / "out")
    rows.append((f"draftdeck tokenize, {first}, tables built (1st)", built))
    for n, src in inputs.items():
        rows.append(
            (
                f"draftdeck tokenize, {n} conversations",
                min(_command(root, src, tok, work / "out") for _ in range(reps)),
            )
        )
    jobs = []
    for _ in range(reps):
        shutil.rmtree(work / "worker", ignore_errors=True)
        (work / "worker").mkdir()
        jobs.append(json.loads(_python(root, WORKER, str(inputs[first]), str(tok), str(work / "worker"))))
    cold = min(j[0]["seconds"] for j in jobs)
    warm = min(j[1]["seconds"] for j in jobs)
    loads = (jobs[0][0]["loads"], jobs[0][1]["loads"])
    rows.append((f"worker, first job ({first}; cold process)", cold))
    rows.append((f"worker, second job ({first}; warm process)", warm))
    lines = [
        f"| {'start-up':44} | {'wall s':>7} | {'minus one load':>15} | {'/ one load':>10} |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in rows:
        lines.append(f"| {name:44} | {seconds:>7.2f} | {seconds - load:>15.2f} | {seconds / load:>9.2f}x |")
    worst = max(s for name, s in rows if name.endswith("conversations")) - load
    lines.append(
        f"goal: the command's start-up (minus one load; tables saved by an earlier run) <= 2 s: {'met' if worst <= 2 else 'NOT met'} ({worst:.2f} s); "
        f"tokenizer loads reported by the worker's first and second job: {loads[0]} and {loads[1]} (goal 1 and 0)"
    )
    return lines
