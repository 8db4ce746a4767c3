"""Benchmark: `draftdeck convert --to sharegpt` against the seed's plain line-by-line `json` script.

    python benchmarks/convert.py [--sizes 50,200] [--repeat 3] [--keep]

Generates mixed, real-shaped chat JSONL under benchmarks/.work/ (mostly OpenAI messages and ShareGPT,
some alpaca, query/response and tool-call rows; markdown, code with quotes/backslashes/newlines, a share
of non-ASCII text, a few dummy "OK." answers), then times, each in its own subprocess:

- `plain`: the seed's approach: `json.loads` per line, map messages -> conversations, `json.dumps`.
  It only knows `messages` rows and skips the others (the seed crashed on them).
- `draftdeck 1 worker` / `draftdeck 2 workers`: `draftdeck.convert.convert(..., to="sharegpt",
  options=ConvertOptions(workers=N))`: every row detected, checked, counted, written atomically with its
  sha256; with 2 workers, 4 MiB ranges of the file are converted in 2 worker processes (plain rows
  that pass every check on a fast path) and the parent keeps the cross-row decisions (duplicates,
  placeholders, policy) and writes the same bytes in input order.
- `orjson floor` (reference): orjson parse + serialize of every row, sha256 and write, and nothing else:
  the ceiling for any single-process Python converter of the same data. `orjson floor x2`: the same
  in 2 processes, each on one half of the file (cut at a newline), each writing its own file: the
  ceiling for any 2-process converter.

Columns: wall seconds (best of --repeat), MB/s and rows/s over the input size and input rows, CPU
seconds (user + sys of the child and its own children), peak RSS, speedup = the plain script's seconds
/ the tool's, measured in the same round, and `vs floor` = the orjson floor's seconds / the tool's in
each round (issue 56's goal: >= 0.8 for `draftdeck 1 worker`).

Each child runs as an installed package does, from compiled bytecode: an untimed import first writes
it under benchmarks/.work/pycache (PYTHONPYCACHEPREFIX; a shell with PYTHONDONTWRITEBYTECODE=1 would
otherwise compile every draftdeck module again in each timed run, ~0.07 s that no user pays).

Peak RSS is the child's VmHWM for one process; for several processes it is the peak of the *sum* of the
resident sets of the child and all its descendants, sampled every 10 ms (forked workers share pages with
their parent, so the sum overcounts a little). The machine may be shared: run it a few times and compare
ratios from the same round.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent
WORK = ROOT / ".work"

# Peak RSS of the child's own address space (VmHWM): unlike ru_maxrss it does not inherit the
# resident pages of the parent that forked it.
FOOTER = r"""
import sys
with open("/proc/self/status") as _f:
    print([l.split()[1] for l in _f if l.startswith("VmHWM")][0], file=sys.stderr)
"""

PLAIN = (
    r"""
import json, sys
role_map = {"user": "human", "assistant": "gpt", "system": "system"}
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        if not line.strip():
            continue
        row = json.loads(line)
        if "messages" not in row:
            continue
        conversations = []
        for msg in row["messages"]:
            conversations.append({"from": role_map.get(msg["role"], msg["role"]), "value": msg["content"]})
        out.write(json.dumps({"conversations": conversations}) + "\n")
"""
    + FOOTER
)

# Reference, not a converter: orjson parse + serialize of every row, sha256 and write, no logic at all.
# It bounds what any single-process Python converter of this data can reach.
FLOOR = (
    r"""
import sys, orjson, hashlib
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as out:
    buf = []
    for line in f:
        if line.strip():
            buf.append(orjson.dumps(orjson.loads(line), option=orjson.OPT_APPEND_NEWLINE))
        if len(buf) >= 1000:
            data = b"".join(buf); h.update(data); out.write(data); buf.clear()
    data = b"".join(buf); h.update(data); out.write(data)
"""
    + FOOTER
)

# Sums the resident sets of this process and all its descendants every 10 ms (workers come and go).
TREE_RSS = r"""
import os, threading, time
_peak = [0]
def _rss_tree(pid):
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = int([l.split()[1] for l in f if l.startswith("VmRSS")][0])
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    total += _rss_tree(int(child))
    except (OSError, IndexError, ValueError):
        pass
    return total
def _sample():
    while True:
        _peak[0] = max(_peak[0], _rss_tree(os.getpid()))
        time.sleep(0.01)
threading.Thread(target=_sample, daemon=True).start()
"""

TREE_FOOTER = r"""
import sys
_peak[0] = max(_peak[0], _rss_tree(os.getpid()))
print(_peak[0], file=sys.stderr)
"""

DRAFTDECK = r"""
import sys
from pathlib import Path
from draftdeck.convert import ConvertOptions, convert
report = convert([Path(sys.argv[1])], Path(sys.argv[2]), "sharegpt", options=ConvertOptions(workers=WORKERS))
print(report.rows_in, report.rows_out, sum(report.rejected.values()), file=sys.stderr)
"""

DRAFTDECK_1 = DRAFTDECK.replace("WORKERS", "1") + FOOTER
DRAFTDECK_2 = TREE_RSS + DRAFTDECK.replace("WORKERS", "2") + TREE_FOOTER

# Two processes, each parsing + serializing one half of the file (cut at a newline) into its own file.
FLOOR_2 = (
    TREE_RSS
    + r"""
import sys, os, orjson, hashlib
src, dst = sys.argv[1], sys.argv[2]
size = os.path.getsize(src)
with open(src, "rb") as f:
    f.seek(size // 2)
    f.readline()
    mid = f.tell()
def half(start, end, out):
    h = hashlib.sha256()
    with open(src, "rb") as f, open(out, "wb") as o:
        f.seek(start)
        buf = []
        while f.tell() < end:
            line = f.readline()
            if line.strip():
                buf.append(orjson.dumps(orjson.loads(line), option=orjson.OPT_APPEND_NEWLINE))
            if len(buf) >= 1000:
                data = b"".join(buf); h.update(data); o.write(data); buf.clear()
        data = b"".join(buf); h.update(data); o.write(data)
pids = []
for start, end, out in ((0, mid, dst), (mid, size, dst + ".2")):
    pid = os.fork()
    if pid == 0:
        half(start, end, out)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
os.unlink(dst + ".2")
"""
    + TREE_FOOTER
)

WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the of and to in is that for it as with was on be by this are from at or an have not but can which "
    "function return value error data model training token sequence batch layer loss gradient memory "
    "request response server client latency cache index query table column schema file path config"
).split()
UNICODE = [
    "café",
    "naïve",
    "résumé",
    "—",
    "“quoted”",
    "中文文本",
    "日本語",
    "한국어",
    "emoji 🚀",
    "Ünïcödé",
    "…",
]
CODE = [
    'def f(x):\n    """Return x."""\n    return x * 2\n',
    'for (int i = 0; i < n; i++) {\n    printf("%d\\n", a[i]);\n}\n',
    'const re = /\\d+\\.\\d*/g;\nconsole.log("path: C:\\\\Users\\\\me");\n',
    "SELECT name, COUNT(*) FROM users WHERE email LIKE '%@x.com' GROUP BY name;\n",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": "b\\"c"}}\n',
]


class TextPool:
    """Pre-generated paragraphs assembled at random: fast, and realistic in escapes and scripts."""

    def __init__(self, rng: random.Random, n: int = 400):
        self.rng = rng
        self.paragraphs = [self._paragraph() for _ in range(n)]

    def _paragraph(self) -> str:
        rng = self.rng
        words = [rng.choice(WORDS) for _ in range(rng.randint(15, 90))]
        if rng.random() < 0.3:
            for _ in range(rng.randint(1, 4)):
                words.insert(rng.randrange(len(words)), rng.choice(UNICODE))
        text = " ".join(words).capitalize() + "."
        r = rng.random()
        if r < 0.25:
            text += f"\n\n```\n{rng.choice(CODE)}```"
        elif r < 0.4:
            text = "- " + text.replace(". ", ".\n- ")
        elif r < 0.5:
            text = f'He said "{text}" and then\ttabbed.'
        return text

    def text(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        return "\n\n".join(self.rng.choice(self.paragraphs) for _ in range(n))


def _row(pool: TextPool, rng: random.Random, i: int) -> dict:
    r = rng.random()
    if r < 0.5:  # OpenAI messages
        msgs = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.4 else []
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": pool.text(1, 2)})
            msgs.append({"role": "assistant", "content": pool.text(1, 6)})
        if rng.random() < 0.03:
            msgs[-1]["content"] = "OK."  # the seeds' dummy answers
        return {"messages": msgs}
    if r < 0.85:  # ShareGPT
        conv = []
        for _ in range(rng.randint(1, 3)):
            conv.append({"from": "human", "value": pool.text(1, 2)})
            conv.append({"from": "gpt", "value": pool.text(1, 6)})
        return {"id": f"sg-{i}", "conversations": conv}
    if r < 0.93:  # alpaca
        return {
            "instruction": pool.text(1, 1),
            "input": "" if rng.random() < 0.6 else pool.text(1, 1),
            "output": pool.text(1, 5),
        }
    if r < 0.97:  # tool calls
        return {
            "messages": [
                {"role": "user", "content": pool.text(1, 1)},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {
                                "name": "search",
                                "arguments": orjson.dumps({"query": pool.text(1, 1)[:80]}).decode(),
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"call_{i}", "content": pool.text(1, 2)},
                {"role": "assistant", "content": pool.text(1, 3)},
            ],
            "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
        }
    return {"query": pool.text(1, 1), "response": pool.text(1, 4)}


def generate(path: Path, megabytes: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    pool = TextPool(rng)
    target = megabytes * 1_000_000
    size = rows = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        buf: list[bytes] = []
        while size < target:
            line = orjson.dumps(_row(pool, rng, rows)) + b"\n"
            buf.append(line)
            size += len(line)
            rows += 1
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
    tmp.replace(path)
    return rows


TOOLS = (
    ("plain json script", PLAIN),
    ("orjson floor", FLOOR),
    ("orjson floor x2", FLOOR_2),
    ("draftdeck 1 worker", DRAFTDECK_1),
    ("draftdeck 2 workers", DRAFTDECK_2),
)


def child_env() -> dict[str, str]:
    """The children's environment: bytecode written and read under benchmarks/.work/pycache."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(WORK / "pycache")
    return env


def run(code: str, src: Path, dst: Path) -> tuple[float, float, int, str]:
    """(seconds, CPU seconds, peak RSS in MB, stderr) of one child process (and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(src), str(dst)], capture_output=True, check=False, env=child_env()
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.decode()
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{err}")
    *rest, hwm_kb = err.strip().splitlines()
    return elapsed, cpu, int(hwm_kb) // 1024, "\n".join(rest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,200", help="input sizes in MB, comma-separated (default 50,200)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="rounds per size; the best round of each tool is kept"
    )
    ap.add_argument("--keep", action="store_true", help="keep the outputs under benchmarks/.work/")
    ap.add_argument("--smoke", action="store_true", help="1 MB, one round: the tests' check")
    args = ap.parse_args()
    if args.smoke:  # the tests' size (tests/project/test_benchmarks_smoke.py): every tool, one range
        args.sizes, args.repeat = "1", 1
    WORK.mkdir(exist_ok=True)
    # compiled once, untimed (see the module docstring)
    warm = "import draftdeck.convert, draftdeck.convert.parallel, draftdeck.formats.detect"
    subprocess.run([sys.executable, "-c", warm], check=True, env=child_env())
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    for mb in sizes:
        src = WORK / f"mixed-{mb}mb.jsonl"
        if not src.exists():
            t = time.perf_counter()
            generate(src, mb)
            print(f"generated {src.name} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        nbytes = src.stat().st_size
        with open(src, "rb") as f:
            rows = sum(1 for line in f if line.strip())
        best: dict[str, tuple[float, float, int, str]] = {}
        ratios: dict[str, list[float]] = {name: [] for name, _ in TOOLS}
        floor: dict[str, list[float]] = {name: [] for name, _ in TOOLS}
        for _ in range(args.repeat):
            secs: dict[str, float] = {}
            for name, code in TOOLS:
                out = WORK / f"out-{name.replace(' ', '_')}-{mb}.jsonl"
                r = run(code, src, out)
                secs[name] = r[0]
                if name not in best or r[0] < best[name][0]:
                    best[name] = r
                if not args.keep:
                    out.unlink(missing_ok=True)
            for name in secs:  # speedups within one round: the machine's load changes between rounds
                ratios[name].append(secs["plain json script"] / secs[name])
                floor[name].append(secs["orjson floor"] / secs[name])
        for name, (wall, cpu, rss, err) in best.items():
            results.append((mb, nbytes, rows, name, wall, cpu, rss, err, ratios[name], floor[name]))
    print()
    print(
        f"| {'input':>6} | {'rows':>7} | {'tool':<20} | {'seconds':>7} | {'MB/s':>6} | {'rows/s':>7}"
        f" | {'CPU s':>6} | {'peak RSS':>9} | {'speedup (best)':>14} | {'per round':>18}"
        f" | {'vs floor, per round':>19} |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    plain: dict[int, float] = {}
    for mb, nbytes, rows, name, wall, cpu, rss, _, rounds, floors in results:
        if name.startswith("plain"):
            plain[mb] = wall
        shown = " ".join(f"{r:.2f}" for r in rounds)
        to_floor = " ".join(f"{r:.2f}" for r in floors)
        print(
            f"| {nbytes / 1e6:>4.0f}MB | {rows:>7,} | {name:<20} | {wall:>7.2f} | "
            f"{nbytes / 1e6 / wall:>6.1f} | {rows / wall:>7,.0f} | {cpu:>6.2f} | {rss:>6} MB | "
            f"{plain[mb] / wall:>13.2f}x | {shown:>18} | {to_floor:>19} |"
        )
    print(
        "\nspeedup (best): the plain script's best seconds / the tool's best; per round: the same ratio in"
        " each round; vs floor: the orjson floor's seconds / the tool's in each round (goal for 1 worker:"
        " >= 0.8). Peak RSS of '2 workers' and 'x2': the sum over the process tree (sampled)."
    )
    for mb, _, _, name, _, _, _, err, _, _ in results:
        if err and name.startswith("draftdeck"):
            rin, rout, rej = err.split()[-3:]
            print(f"  {name} {mb} MB: rows in {rin}, out {rout}, rejected {rej}")


if __name__ == "__main__":
    main()
