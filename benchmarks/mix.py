"""Benchmark: `draftdeck mix` against a plain script that concatenates, shuffles and takes the head.

    python benchmarks/mix.py [--scales 0.01,0.11] [--repeat 2] [--keep]

The seeds' Qwen3.6-27B mix had eight sources (OpenOrca ~371K, Evol-CodeAlpaca 110K, Magicoder 75K,
Code-Alpaca 20K, agentic trajectories 100K, ShareGPT52K 45K, UltraChat 40K, OpenAssistant 39K);
`--scales` builds them at those fractions (0.01: 8,000 rows, the 1/100 scale; 0.11: 88,000 rows;
1.1: 880,000 rows, slow) from generated rows, each source in its own shape: question/answer, alpaca,
instruction/response, alpaca with input, OpenAI messages with tool calls, ShareGPT, OpenAI
multi-turn, and Anthropic content blocks. Each tool runs in its own subprocess:

- `plain script`: what the seeds did by hand: `json.loads` each line, map each shape to messages
  with one small function per shape, concatenate, `random.shuffle`, take the head, `json.dumps`. It
  checks nothing and counts nothing.
- `mix all, 1/2 workers`: a recipe taking `all` of every source: the same rows as the plain script
  (checked: the same answers, less the copies it removes), plus every check, the duplicate removal across
  sources, the composition table and the atomic write with its sha256.
- `mix quotas, 2 workers`: the seeds' shape as a recipe of quotas and weights (half of OpenOrca by
  weight, every other source a quota or all, one upsampled): the draw and interleaving.

Columns: seconds (best of --repeat), input rows/s, peak RSS (the sum over the process and its
workers, sampled every 10 ms) and speed = the plain script's seconds / the tool's, in the same round.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import TREE_FOOTER, TREE_RSS, TextPool  # the convert benchmark's text

ROOT = Path(__file__).resolve().parent
WORK = ROOT / ".work" / "mix"

# name, the seeds' rows, shape
SOURCES = (
    ("openorca", 371_000, "question_answer"),
    ("evol_codealpaca", 110_000, "alpaca"),
    ("magicoder", 75_000, "instruction_response"),
    ("code_alpaca", 20_000, "alpaca_input"),
    ("agentic", 100_000, "tool_calls"),
    ("sharegpt52k", 45_000, "sharegpt"),
    ("ultrachat", 40_000, "openai"),
    ("oasst", 39_000, "anthropic"),
)


def _row(shape: str, pool: TextPool, rng: random.Random, i: int) -> dict:
    if shape == "question_answer":
        return {"question": pool.text(1, 2), "answer": pool.text(1, 4)}
    if shape == "alpaca":
        return {"instruction": pool.text(1, 1), "input": "", "output": pool.text(1, 5)}
    if shape == "alpaca_input":
        return {"instruction": pool.text(1, 1), "input": pool.text(1, 1), "output": pool.text(1, 3)}
    if shape == "instruction_response":
        return {"instruction": pool.text(1, 2), "response": pool.text(1, 5)}
    if shape == "tool_calls":
        args = orjson.dumps({"q": pool.text(1, 1)[:60]}).decode()
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "search", "arguments": args}}
        return {"messages": [
            {"role": "user", "content": pool.text(1, 1)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": pool.text(1, 2)},
            {"role": "assistant", "content": pool.text(1, 3)},
        ], "tools": [{"type": "function", "function": {"name": "search"}}]}  # fmt: skip
    if shape == "sharegpt":
        conv = []
        for _ in range(rng.randint(1, 3)):
            conv += [{"from": "human", "value": pool.text(1, 2)}, {"from": "gpt", "value": pool.text(1, 4)}]
        return {"id": f"sg-{i}", "conversations": conv}
    if shape == "openai":
        msgs = []
        for _ in range(rng.randint(1, 4)):
            msgs += [
                {"role": "user", "content": pool.text(1, 2)},
                {"role": "assistant", "content": pool.text(1, 4)},
            ]
        return {"messages": msgs}
    return {"system": "Be helpful.", "messages": [  # anthropic
        {"role": "user", "content": [{"type": "text", "text": pool.text(1, 2)}]},
        {"role": "assistant", "content": [{"type": "text", "text": pool.text(1, 4)}]}]}  # fmt: skip


def generate(folder: Path, scale: float) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    pool = TextPool(rng, n=4000)  # at ~1M rows a few short conversations still repeat: the mix removes them
    total = 0
    for name, rows, shape in SOURCES:
        n = max(1, round(rows * scale))
        with open(folder / f"{name}.jsonl", "wb") as f:
            f.write(b"".join(orjson.dumps(_row(shape, pool, rng, i)) + b"\n" for i in range(n)))
        total += n
    return total


def recipe(folder: Path, quotas: bool, scale: float) -> Path:
    lines = ["seed: 1", "sources:"]
    for name, rows, _ in SOURCES:
        lines += [f"  - name: {name}", f"    inputs: [{folder / (name + '.jsonl')}]"]
        if not quotas:
            lines.append("    all: true")
        elif name == "openorca":
            lines.append("    weight: 0.5")
        elif name == "oasst":
            lines.append(f"    rows: {round(rows * scale * 1.5)}")  # upsampled: 1.5x what it holds
        elif name in ("evol_codealpaca", "magicoder"):
            lines.append(f"    rows: {round(rows * scale * 0.6)}")
        else:
            lines.append("    all: true")
    path = folder / ("quotas.yaml" if quotas else "all.yaml")
    path.write_text("\n".join(lines) + "\n")
    return path


PLAIN = (
    TREE_RSS
    + r"""
import json, random, sys
from pathlib import Path
def pair(q, a):
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
def alpaca(r):
    return pair(r["instruction"] + ("\n\n" + r["input"] if r.get("input") else ""), r["output"])
ROLES = {"human": "user", "gpt": "assistant"}
def sharegpt(r):
    return [{"role": ROLES[t["from"]], "content": t["value"]} for t in r["conversations"]]
def anthropic(r):
    text = [{"role": m["role"], "content": "".join(p["text"] for p in m["content"])} for m in r["messages"]]
    return [{"role": "system", "content": r["system"]}] + text
SHAPES = {
    "question_answer": lambda r: pair(r["question"], r["answer"]),
    "alpaca": alpaca, "alpaca_input": alpaca,
    "instruction_response": lambda r: pair(r["instruction"], r["response"]),
    "tool_calls": lambda r: r["messages"],
    "sharegpt": sharegpt,
    "openai": lambda r: r["messages"],
    "anthropic": anthropic,
}
folder, out = Path(sys.argv[1]), sys.argv[2]
rows = []
for name, shape in json.loads(sys.argv[3]):
    with open(folder / f"{name}.jsonl") as f:
        rows += [{"messages": SHAPES[shape](json.loads(line))} for line in f]
random.Random(1).shuffle(rows)
with open(out, "w") as f:
    for r in rows[: len(rows)]:
        f.write(json.dumps(r) + "\n")
print(len(rows), file=sys.stderr)
"""
    + TREE_FOOTER
)

MIX = (
    TREE_RSS
    + r"""
import sys
from pathlib import Path
from draftdeck.convert import ConvertOptions
from draftdeck.mix import Recipe, mix
path = Path(sys.argv[1])
options = ConvertOptions(workers=int(sys.argv[3]))
report = mix(Recipe.from_yaml(path.read_text(), str(path)), Path(sys.argv[2]), options=options)
print(report.rows_out, file=sys.stderr)
"""
    + TREE_FOOTER
)


def child(code: str, *args: str) -> tuple[float, int, int]:
    """(seconds, rows written, peak RSS in MB) of one child process and its workers."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr.decode()}")
    *_, rows, peak_kb = proc.stderr.decode().split()
    return elapsed, int(rows), int(peak_kb) // 1024


def answers(path: Path) -> Counter[str]:
    """Every row's answers: what the plain script and the mix must agree on."""
    out: Counter[str] = Counter()
    with open(path, "rb") as f:
        for line in f:
            msgs = orjson.loads(line)["messages"]
            out["\x00".join(m["content"] for m in msgs if m["role"] == "assistant")] += 1
    return out


def same_rows(plain: Path, mixed: Path) -> str:
    """ "yes" when the mix holds the plain script's rows, less only copies of rows it kept."""
    a, b = answers(plain), answers(mixed)
    extra = a - b
    if b - a or any(k not in b for k in extra):
        return "NO"
    n = sum(extra.values())
    return "yes" + (f", less {n:,} duplicates" if n else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--scales", default="0.01,0.11", help="fractions of the seeds' source sizes (0.01: 1/100)"
    )
    ap.add_argument("--repeat", type=int, default=2, help="rounds; each tool's best round is kept")
    ap.add_argument("--keep", action="store_true", help="keep the generated data under benchmarks/.work/mix/")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: checks the script runs, measures nothing",
    )
    args = ap.parse_args()
    if args.smoke:  # every source in its shape, every tool, one round (800 rows in all)
        args.scales, args.repeat = "0.001", 1
    shapes = json.dumps([(name, shape) for name, _, shape in SOURCES])
    table = []
    for scale in (float(s) for s in args.scales.split(",")):
        folder = WORK / f"scale-{scale:g}"
        if folder.exists():
            shutil.rmtree(folder)
        rows_in = generate(folder, scale)
        every, quotas = recipe(folder, False, scale), recipe(folder, True, scale)
        best: dict[str, tuple[float, int, int]] = {}
        tools = {
            "plain script": (PLAIN, str(folder), str(folder / "plain.jsonl"), shapes),
            "mix all, 1 worker": (MIX, str(every), str(folder / "all-1.jsonl"), "1"),
            "mix all, 2 workers": (MIX, str(every), str(folder / "all-2.jsonl"), "2"),
            "mix quotas, 2 workers": (MIX, str(quotas), str(folder / "quotas.jsonl"), "2"),
        }
        for _ in range(args.repeat):
            for name, (code, *rest) in tools.items():
                got = child(code, *rest)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
        same = same_rows(folder / "plain.jsonl", folder / "all-1.jsonl")
        identical = (folder / "all-1.jsonl").read_bytes() == (folder / "all-2.jsonl").read_bytes()
        plain_s = best["plain script"][0]
        for name, (sec, rows, rss) in best.items():
            table.append((f"{rows_in:,}", name, sec, rows_in / sec, rows, rss, plain_s / sec))
        print(f"scale {scale:g}: {rows_in:,} input rows; mix all = plain rows: {same}; 1 and 2 workers"
              f" byte-identical: {identical}", file=sys.stderr)  # fmt: skip
        if not args.keep:
            shutil.rmtree(folder)
    head = ("rows in", "tool", "seconds", "rows/s", "rows out", "peak MB", "speed")
    print("| {:>9} | {:<22} | {:>8} | {:>9} | {:>9} | {:>8} | {:>6} |".format(*head))
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rows_in_s, name, sec, rate, rows, rss, speed in table:
        print(
            f"| {rows_in_s:>9} | {name:<22} | {sec:8.2f} | {rate:9,.0f} | {rows:9,} | {rss:8} "
            f"| {speed:5.2f}x |"
        )


if __name__ == "__main__":
    main()
