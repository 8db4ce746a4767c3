"""Benchmark: `draftdeck convert --to sharegpt` against the seed's plain line-by-line `json` script.

    python benchmarks/convert.py [--sizes 50,200] [--keep]

Generates mixed, real-shaped chat JSONL under benchmarks/.work/ (mostly OpenAI messages and ShareGPT,
some alpaca, query/response and tool-call rows; markdown, code with quotes/backslashes/newlines, a share
of non-ASCII text, a few dummy "OK." answers), then times, each in its own subprocess:

- `plain`: the seed's approach: `json.loads` per line, map messages -> conversations, `json.dumps`.
  It only knows `messages` rows and skips the others (the seed crashed on them).
- `draftdeck`: `draftdeck.convert.convert(..., to="sharegpt")`: every row detected, checked, counted,
  written atomically with its sha256.
- `orjson floor` (reference): orjson parse + serialize of every row, sha256 and write, and nothing else:
  the ceiling for any single-process Python converter of the same data.

MB/s and rows/s are over the input size and the input rows; peak RSS is the child's VmHWM.
"""

from __future__ import annotations

import argparse
import random
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

DRAFTDECK = (
    r"""
import sys
from pathlib import Path
from draftdeck.convert import convert
report = convert([Path(sys.argv[1])], Path(sys.argv[2]), "sharegpt")
print(report.rows_in, report.rows_out, sum(report.rejected.values()), file=sys.stderr)
"""
    + FOOTER
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


def run(code: str, src: Path, dst: Path) -> tuple[float, int, str]:
    """(seconds, peak RSS in MB, stderr) of one child process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    err = proc.stderr.decode()
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{err}")
    *rest, hwm_kb = err.strip().splitlines()
    return elapsed, int(hwm_kb) // 1024, "\n".join(rest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,200", help="input sizes in MB, comma-separated (default 50,200)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool and size; the best is kept")
    ap.add_argument("--keep", action="store_true", help="keep the outputs under benchmarks/.work/")
    args = ap.parse_args()
    WORK.mkdir(exist_ok=True)
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
        best: dict[str, tuple[float, int, str]] = {}
        for _ in range(args.repeat):
            for name, code in (
                ("plain json script", PLAIN),
                ("orjson floor", FLOOR),
                ("draftdeck convert", DRAFTDECK),
            ):
                out = WORK / f"out-{name.split()[0]}-{mb}.jsonl"
                r = run(code, src, out)
                if name not in best or r[0] < best[name][0]:
                    best[name] = r
                if not args.keep:
                    out.unlink(missing_ok=True)
        for name, (secs, rss, err) in best.items():
            results.append((mb, nbytes, rows, name, secs, rss, err))
    print()
    print(
        f"{'input':>8} {'rows':>9} {'tool':<19} {'seconds':>8} {'MB/s':>8} {'rows/s':>9}"
        f" {'peak RSS':>9} {'speedup':>8}"
    )
    plain_secs: dict[int, float] = {}
    for mb, nbytes, rows, name, secs, rss, _ in results:
        if name.startswith("plain"):
            plain_secs[mb] = secs
        speed = f"{plain_secs[mb] / secs:.2f}x" if mb in plain_secs else ""
        print(
            f"{nbytes / 1e6:>6.0f}MB {rows:>9,} {name:<19} {secs:>8.2f} {nbytes / 1e6 / secs:>8.1f} "
            f"{rows / secs:>9,.0f} {rss:>6} MB {speed:>8}"
        )
    for mb, _, _, name, _, _, err in results:
        if err and name.startswith("draftdeck"):
            rin, rout, rej = err.split()[-3:]
            print(f"  draftdeck {mb} MB: rows in {rin}, out {rout}, rejected {rej}")


if __name__ == "__main__":
    main()
