# ruff: noqa: E402, E501, SIM905 - imports follow the sys.path fix; data literals
"""Benchmark: DraftDeck's tokenize job against raw encoders, on the real Qwen3.6 vocabulary.

    python benchmarks/tokenize.py [--conversations 20000] [--workers 0] [--no-peer] [--seq-length 65536]
        [--startup-only]

Start-up (benchmarks/_tokenize_startup.py; printed last, measured first): the whole `draftdeck
tokenize` command on 31 and 200 conversations and a worker's first and second job, each minus one
tokenizer load in a fresh process.

Input: synthetic OpenAI-shape conversations (a mix of lengths, 1-3 turns, prose and code, some with
reasoning) plus the real files of ../shared/datasets/real/ when present, written as one JSONL file
under benchmarks/.work/. Tokenizer: the real Qwen3.6 vocabulary with DraftDeck's strict,
think-stripping Qwen3.5-style template (draftdeck.chat.testing).

Rows of the table:
- DraftDeck: the whole job (read + convert + render every prefix + encode + mask + decode check +
  write shards + stats), conversations per second and input MB per second;
- raw HF: the HF fast tokenizer's batch encode of the fully rendered conversations (rendering not
  timed), both cores (Rust threads);
- raw tiktoken: tiktoken's encode_batch of the same texts, both cores (threads);
- speculators 0.9.0 ``prepare-data`` (the peer, benchmarks/_tokenize_peer.py; ``--no-peer`` skips it): installed on demand into
  benchmarks/.work/speculators-venv (gitignored; ~1.5 GB, reused when present) with DOMAIN.md's CPU
  recipe. 0.9.0 tokenizes only through a vLLM server's ``POST /v1/chat/completions/render``; with no
  vLLM here, benchmarks/_render_server.py (loopback, 127.0.0.1) serves it with the same tokenizer
  folder and strict template (its ids are checked against HF ``apply_chat_template`` before the run).
  The peer reads the same conversations, written as ShareGPT ``conversations`` rows (not timed); its
  time is the whole command (process start, imports, tokenizer load, render of every turn, shuffle,
  save), its CPU that of the command, its 2 workers and the render server.

Each row gives wall-clock throughput and throughput per CPU-second (the machine is shared: other
work lowers wall-clock numbers, not CPU-time ones), and the rows and tokens it produced.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = ROOT / "benchmarks" / ".work"

from benchmarks._tokenize_peer import PEER, RenderServer, check_server, peer_install, run_peer, write_sharegpt
from benchmarks._tokenize_startup import startup_table

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
    parts: list[str] = []
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


def write_synthetic(n: int, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in synthetic(n, seed=n):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_input(n: int, with_real: bool = True) -> tuple[Path, list[Path]]:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"synthetic-{n}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in synthetic(n):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    if not with_real or not REAL.exists():
        return path, []
    real = sorted(p for p in REAL.glob("*.json*") if "mt_bench" not in p.name)
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
    ap.add_argument("--no-peer", action="store_true", help=f"skip {PEER} (and its on-demand install)")
    ap.add_argument("--startup-only", action="store_true", help="only the start-up table (about a minute)")
    ap.add_argument("--peer-workers", type=int, default=2, help="prepare-data --num-preprocessing-workers")
    ap.add_argument("--seq-length", type=int, default=65536,
                    help="prepare-data --seq-length (it needs one; DraftDeck runs without a limit)")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:  # every row but the peer's (its install is 1.5 GB), synthetic rows only, one run each
        args.conversations, args.no_peer = 60, True

    from draftdeck.chat.render import ChatRenderer, conversation_dicts, load_tokenizer
    from draftdeck.chat.testing import qwen36_tokenizer, small_bpe_tokenizer
    from draftdeck.convert import read_conversations
    from draftdeck.quality import Report
    from draftdeck.tokenize.encoders import TiktokenEncoder
    from draftdeck.tokenize.pipeline import TokenizeOptions, _load, tokenize_files

    load = os.getloadavg()
    # smoke: the project's small BPE (a load of the real 248K vocabulary is seconds in each of the
    # start-up table's fresh processes); the same template rules and encoders
    tok_dir = small_bpe_tokenizer() if args.smoke else qwen36_tokenizer()
    # Start-up first, in fresh processes, before anything else loads the machine.
    # smoke: each start-up row once, the command on 31 conversations only (every run loads the real vocabulary)
    smoke: dict[str, Any] = {"reps": 1, "sizes": (31,)} if args.smoke else {}
    startup = startup_table(ROOT, WORK / "startup", tok_dir, write_synthetic, **smoke)
    if args.startup_only:
        print("\n".join(startup))
        return
    synth, real = build_input(args.conversations, with_real=not args.smoke)
    inputs = [synth, *real]
    mb = sum(p.stat().st_size for p in inputs) / 1e6

    # The peer's install comes first so that its download/IO does not overlap the timed runs.
    peer_cli, peer_why = (None, "skipped (--no-peer)") if args.no_peer else peer_install()

    # Rendered texts for the raw encoders (rendering is not timed for them).
    tok = load_tokenizer(tok_dir)
    renderer = ChatRenderer.from_tokenizer(tok)
    texts = []
    conversations = list(read_conversations(inputs, Report()))
    convs = len(conversations)
    for c in conversations:
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

    hf_tokens = 0
    t0, c0 = time.perf_counter(), _cpu()
    for i in range(0, len(texts), 1024):
        enc = tok(texts[i : i + 1024], add_special_tokens=False)
        hf_tokens += sum(map(len, enc["input_ids"]))
    hf, hf_cpu = time.perf_counter() - t0, _cpu() - c0

    tk_tokens = 0
    t0, c0 = time.perf_counter(), _cpu()
    for i in range(0, len(texts), 1024):
        ids = fast.enc.encode_batch(
            texts[i : i + 1024], num_threads=os.cpu_count() or 2, allowed_special="all"
        )
        tk_tokens += sum(map(len, ids))
    tk, tk_cpu = time.perf_counter() - t0, _cpu() - c0

    peer = None
    check = ""
    if peer_cli is not None:
        data = WORK / f"peer-sharegpt-{args.conversations}.jsonl"
        write_sharegpt(conversations, data)  # not timed, like the raw encoders' rendering
        server = None
        try:
            server = RenderServer(tok_dir)  # stands for the vLLM server: started and loaded before timing
            check = check_server(server, tok, data)
            server.reset()
            print(f"running {PEER} on {convs:,} conversations ({args.peer_workers} workers)...", flush=True)
            peer = run_peer(peer_cli, tok_dir, data, args.seq_length, args.peer_workers, server)
        except Exception as exc:
            peer_why = f"failed: {exc}"
        finally:
            if server is not None:
                server.close()

    # name, conversations, wall s, CPU s, rows out, tokens out
    rows = [
        ("DraftDeck tokenize (whole job)", convs, dd, dd_cpu, report.rows_out, report.extra["tokens"]),
        ("raw HF fast tokenizer batch encode", len(texts), hf, hf_cpu, len(texts), hf_tokens),
        ("raw tiktoken encode_batch", len(texts), tk, tk_cpu, len(texts), tk_tokens),
    ]
    if peer is not None:
        rows.append((PEER, convs, peer["wall"], peer["cpu"], peer["rows"], peer["tokens"]))
    print(f"\n{convs:,} conversations ({mb:.1f} MB input, {len(real)} real files + synthetic), "
          f"{report.rows_out:,} rows out ({report.rows_expanded:,} from split turns), "
          f"{report.extra['tokens']:,} tokens, encoder {report.extra['encoder']['used']}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"| {'':34} | {'wall s':>7} | {'conv/s':>7} | {'MB/s':>6} | {'ratio':>7} | {'CPU s':>7} | {'conv/CPU-s':>10} | "
          f"{'ratio':>7} | {'rows out':>8} | {'tokens out':>11} |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    dd_rate, dd_cpu_rate = convs / dd, convs / dd_cpu
    for name, n, wall, cpu, n_rows, n_tokens in rows:
        print(f"| {name:34} | {wall:>7.1f} | {n / wall:>7,.0f} | {mb / wall:>6.2f} | {dd_rate / (n / wall):>6.2f}x | "
              f"{cpu:>7.1f} | {n / cpu:>10,.0f} | {dd_cpu_rate / (n / cpu):>6.2f}x | {n_rows:>8,} | {n_tokens:>11,} |")  # fmt: skip
    if peer is None:
        print(f"{PEER:34} not run: {peer_why}")
    print("ratio: DraftDeck's throughput divided by the row's (DraftDeck / row)")
    rate = [n / wall for _, n, wall, *_ in rows]
    goal_peer = "not measured" if peer is None else ("met" if rate[0] >= 10 * rate[3] else "NOT met")
    print(
        f"goals (wall clock): >= 1.5x raw HF ({'met' if rate[0] >= 1.5 * rate[1] else 'NOT met'}), "
        f">= 0.6x raw tiktoken ({'met' if rate[0] >= 0.6 * rate[2] else 'NOT met'}), "
        f">= 10x {PEER} ({goal_peer}); "
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
    print(f"DraftDeck: {report.extra['trained_tokens']:,} trained tokens")
    if peer is not None:
        print(
            f"peer: {peer['wall']:.1f} s wall, {peer['cpu']:.1f} CPU-s (of which the render stand-in "
            f"{peer['server_cpu']:.1f}), {peer['renders']:,} renders ({peer['render_errors']:,} refused by the "
            f"template), {peer['failed_convs']:,} conversations skipped, {peer['trained']:,} trained tokens, "
            f"longest row {peer['longest']:,} tokens (--seq-length {args.seq_length:,}); "
            f"first to last render {peer['render_span']:.1f} s (the rest: start, imports, load, shuffle, save); "
            f"its ShareGPT input {peer['input_mb']:.1f} MB (MB/s above is over the same {mb:.1f} MB as the other rows)"
        )
        own = peer["cpu"] - peer["server_cpu"]
        print(
            f"peer without the render stand-in's CPU (a vLLM server would spend its own): {own:.1f} CPU-s, "
            f"{convs / own:,.0f} conv/CPU-s, DraftDeck {dd_cpu_rate / (convs / own):.2f}x"
        )
        print(f"peer: one row per assistant turn, every earlier turn re-rendered as context; {check}")
    print()
    print("\n".join(startup))


if __name__ == "__main__":
    main()
