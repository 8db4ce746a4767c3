# ruff: noqa: E402, E501, SIM905 - imports follow the sys.path fix; data literals
"""Benchmark: DraftDeck's tokenize job against raw encoders, on the real Qwen3.6 vocabulary.

    python benchmarks/tokenize.py [--conversations 20000] [--workers 0]

Input: synthetic OpenAI-shape conversations (a mix of lengths, 1-3 turns, prose and code, some with
reasoning) plus the real files of ../shared/datasets/real/ when present, written as one JSONL file
under benchmarks/.work/. Tokenizer: the real Qwen3.6 vocabulary with DraftDeck's strict,
think-stripping Qwen3.5-style template (draftdeck.chat.testing).

Rows of the table:
- DraftDeck: the whole job (read + convert + render every prefix + encode + mask + decode check +
  write shards + stats), conversations per second and input MB per second;
- raw HF: the HF fast tokenizer's batch encode of the fully rendered conversations (rendering not
  timed), both cores (Rust threads);
- raw tiktoken: tiktoken's encode_batch of the same texts, both cores (threads).

Each row gives wall-clock throughput and throughput per CPU-second (the machine is shared: other
work lowers wall-clock numbers, not CPU-time ones).

The speculators 0.9.0 peer is not run here (it needs its own 1.5 GB venv and a render server); the
table says so.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the stdlib `tokenize` module, which transformers imports: drop the script's
# folder from the import path before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import random
import shutil
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = ROOT / "benchmarks" / ".work"
REAL = ROOT.parent / "shared" / "datasets" / "real"

WORDS = ("the of and to in is that for it as with was on be by this are from at or an have not which but "
         "model token data value function return result number list string error file time first each "
         "because however therefore compute check answer question example method train draft").split()  # fmt: skip
CODE = [
    "def {n}(xs):\n    total = 0\n    for x in xs:\n        if x % 2 == 0:\n            total += x * x\n    return total\n",
    "class {N}:\n    def __init__(self, size: int) -> None:\n        self.size = size\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n        return len(self.items)\n",
    'for (int i = 0; i < n; ++i) {{\n    sum += a[i] * b[i];\n}}\nprintf("%d\\n", sum);\n',
    "SELECT name, COUNT(*) AS n FROM users WHERE created_at > '2024-01-01' GROUP BY name ORDER BY n DESC;\n",
]


def _prose(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    out, line = [], []
    for i, w in enumerate(words):
        line.append(w)
        if rng.random() < 0.08 or i == len(words) - 1:
            s = " ".join(line)
            out.append(s[0].upper() + s[1:] + ".")
            line = []
    return " ".join(out)


def _answer(rng: random.Random, size: int) -> str:
    parts = []
    while sum(map(len, parts)) < size:
        if rng.random() < 0.35:
            name = rng.choice(WORDS)
            parts.append("```python\n" + rng.choice(CODE).format(n=name, N=name.title()) + "```")
        else:
            parts.append(_prose(rng, rng.randint(15, 60)))
    return "\n\n".join(parts)


def synthetic(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        size = rng.choice([150, 300, 600, 900, 1500, 3000])
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": "You are a helpful coding assistant."})
        for _turn in range(rng.choice([1, 1, 2, 3])):
            msgs.append({"role": "user", "content": _prose(rng, rng.randint(8, 40)) + "?"})
            m = {"role": "assistant", "content": _answer(rng, size)}
            if rng.random() < 0.3:
                m["reasoning_content"] = _prose(rng, rng.randint(20, 120))
            msgs.append(m)
        rows.append({"messages": msgs})
    return rows


def build_input(n: int) -> tuple[Path, list[Path]]:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"synthetic-{n}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in synthetic(n):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    real = sorted(p for p in REAL.glob("*.json*") if "mt_bench" not in p.name) if REAL.exists() else []
    return path, real


def _cpu() -> float:
    """CPU seconds used so far by this process (all threads) and its reaped children."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()

    from draftdeck.chat.render import ChatRenderer, conversation_dicts, load_tokenizer
    from draftdeck.chat.testing import qwen36_tokenizer
    from draftdeck.convert import read_conversations
    from draftdeck.quality import Report
    from draftdeck.tokenize.encoders import TiktokenEncoder
    from draftdeck.tokenize.pipeline import TokenizeOptions, _load, tokenize_files

    load = os.getloadavg()
    tok_dir = qwen36_tokenizer()
    synth, real = build_input(args.conversations)
    inputs = [synth, *real]
    mb = sum(p.stat().st_size for p in inputs) / 1e6

    # Rendered texts for the raw encoders (rendering is not timed for them).
    tok = load_tokenizer(tok_dir)
    renderer = ChatRenderer.from_tokenizer(tok)
    texts = []
    convs = 0
    for c in read_conversations(inputs, Report()):
        convs += 1
        try:
            texts.append(renderer.render(conversation_dicts(c), c.tools, False))
        except Exception:
            continue
    fast = TiktokenEncoder(tok)

    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    opts = TokenizeOptions(tok_dir, workers=args.workers)
    t0 = time.perf_counter()
    _load(opts)  # tokenizer + tiktoken tables, once per process (kept for the next job): not timed
    load_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), _cpu()
    report = tokenize_files(inputs, out, opts)
    dd, dd_cpu = time.perf_counter() - t0, _cpu() - c0

    t0, c0 = time.perf_counter(), _cpu()
    for i in range(0, len(texts), 1024):
        tok(texts[i : i + 1024], add_special_tokens=False)
    hf, hf_cpu = time.perf_counter() - t0, _cpu() - c0

    t0, c0 = time.perf_counter(), _cpu()
    for i in range(0, len(texts), 1024):
        fast.enc.encode_batch(texts[i : i + 1024], num_threads=os.cpu_count() or 2, allowed_special="all")
    tk, tk_cpu = time.perf_counter() - t0, _cpu() - c0

    rows = [
        ("DraftDeck tokenize (whole job)", convs / dd, mb / dd, convs / dd_cpu),
        ("raw HF fast tokenizer batch encode", len(texts) / hf, mb / hf, len(texts) / hf_cpu),
        ("raw tiktoken encode_batch", len(texts) / tk, mb / tk, len(texts) / tk_cpu),
    ]
    print(f"\n{convs:,} conversations ({mb:.1f} MB input, {len(real)} real files + synthetic), "
          f"{report.rows_out:,} rows out ({report.rows_expanded:,} from split turns), "
          f"{report.extra['tokens']:,} tokens, encoder {report.extra['encoder']['used']}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'':38} {'conv/s':>9} {'MB/s':>7} {'ratio':>7}  {'conv/CPU-s':>10} {'ratio':>7}")
    for name, cps, mbs, cpu in rows:
        print(
            f"{name:38} {cps:>9,.0f} {mbs:>7.2f} {rows[0][1] / cps:>6.2f}x  {cpu:>10,.0f} {rows[0][3] / cpu:>6.2f}x"
        )
    print(
        f"goals (wall clock): >= 1.5x raw HF ({'met' if rows[0][1] >= 1.5 * rows[1][1] else 'NOT met'}), "
        f">= 0.6x raw tiktoken ({'met' if rows[0][1] >= 0.6 * rows[2][1] else 'NOT met'}); "
        f"load average before the run {load[0]:.1f} (other work on the machine lowers every wall-clock row)"
    )
    print(
        f"DraftDeck's one-time load of the tokenizer and its tiktoken tables ({load_s:.1f} s) is not timed, "
        "like the raw encoders' own loading"
    )
    print(
        "conv/CPU-s: conversations per second of CPU time (user + system, all threads and worker processes), "
        "which other load on the machine does not change much"
    )
    print(
        "speculators 0.9.0 peer: not run (needs its own ~1.5 GB venv and a render-server stand-in; "
        "DOMAIN.md reports 224 conv/s on this machine for 30K similar conversations)"
    )


if __name__ == "__main__":
    main()
