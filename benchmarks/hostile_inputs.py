"""Small files that used to take the machine down, through `draftdeck convert` as a user runs it.

    python benchmarks/hostile_inputs.py [--workdir DIR]

Each file is converted in a process of its own (`draftdeck convert FILE --out ... --workers 1`) and its
peak RSS read from the kernel (wait4's ru_maxrss of that child). The files: a 200 KB `.json` of 100,000 `[`
then 100,000 `]` (ijson took 20 GB and an OOM kill on it), one JSON array item of 20 MB among small
ones (over --max-row-bytes), and a CSV whose one cell holds 10 MB of text. Printed: each file's size,
rows kept and rejected per reason, the peak and the peak's ratio to the file and to the 500 MB bound
the safety issue set. A plain 200 KB JSONL file is the baseline the others are held to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BOUND = 500 * 2**20  # the bound on the convert's peak


def _row(i: int, question: str = "") -> dict:
    return {"messages": [{"role": "user", "content": question or f"question {i}"},
                         {"role": "assistant", "content": f"answer number {i}"}]}  # fmt: skip


def _files(root: Path) -> dict[str, tuple[Path, list[str]]]:
    """The inputs, written once: name -> (path, convert's extra options)."""
    root.mkdir(parents=True, exist_ok=True)
    plain = root / "plain.jsonl"
    plain.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(2_000)))
    nested = root / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    array = root / "array-with-a-20mb-item.json"
    items = [_row(i) for i in range(100)] + [_row(100, "x" * 20_000_000)] + [_row(i) for i in range(101, 200)]
    array.write_text(json.dumps(items))
    cell = root / "csv-with-a-10mb-cell.csv"
    with cell.open("w") as f:
        f.write("prompt,response\n")
        f.write('"' + "y" * 10_000_000 + '",fine\n')
        f.writelines(f"question {i},answer number {i}\n" for i in range(100))
    return {
        "plain 2,000-row JSONL": (plain, []),
        "200 KB nested JSON": (nested, []),
        "JSON array, one 20 MB item (--max-row-bytes 1 MB)": (array, ["--max-row-bytes", "1000000"]),
        "CSV, one 10 MB cell": (cell, []),
    }


def _convert(path: Path, extra: list[str], out: Path) -> tuple[int, dict, float]:
    """(peak RSS bytes, the report, seconds) of one convert in a child process of its own."""
    report_path = out.with_suffix(".report.json")
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "draftdeck.cli", "convert", str(path), "--out", str(out), "--to", "openai",
         "--max-rejected", "1", "--workers", "1", "--report", str(report_path), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )  # fmt: skip
    assert child.stderr is not None
    said = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)  # this child's own usage: its peak RSS
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if not report_path.exists():  # a file wholly rejected fails the job (empty output) but still reports
        raise SystemExit(f"convert {path} failed:\n{said[-2000:]}")
    return usage.ru_maxrss * 1024, json.loads(report_path.read_text()), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None, help="keep the files here")
    # The full run is the smoke: four converts of about a second each, and the files' sizes are the point
    # (a smaller item or cell would not cross --max-row-bytes or the reader's buffers).
    ap.add_argument("--smoke", action="store_true", help="the same run (seconds already): for the tests")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        files = _files(root / "inputs")
        rows = []
        (root / "out").mkdir(parents=True, exist_ok=True)
        for name, (path, extra) in files.items():
            peak, report, seconds = _convert(path, extra, root / "out" / (path.stem + ".jsonl"))
            rows.append((name, path.stat().st_size, report, peak, seconds))
    base = rows[0][3]
    print(
        "\n| input | size | rows out | rejected (reason: rows) | peak RSS | vs plain | vs 500 MB bound | s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, size, report, peak, seconds in rows:
        rejected = ", ".join(f"{k}: {v}" for k, v in (report.get("rejected") or {}).items()) or "-"
        print(
            f"| {name} | {size / 2**20:.2f} MiB | {report.get('rows_out')} | {rejected}"
            f" | {peak / 2**20:.0f} MiB | {peak / base:.2f}x | {peak / BOUND:.2f} | {seconds:.1f} |"
        )
    print(
        "\nPeak RSS: each convert process's own, from the kernel (wait4's ru_maxrss). Before the fix the"
        " nested file alone took 20 GB and an OOM kill (ijson)."
    )


if __name__ == "__main__":
    main()
