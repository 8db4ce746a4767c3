"""Building small tokenized datasets for the dataset-page tests: a tiny byte-level BPE tokenizer trained
here (no downloads), ChatML rows with assistant loss masks, and a dataset directory in the shape the
tokenizer job writes (HF `save_to_disk` Arrow + manifest.json + stats.json)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "hello world, this is a small test of the tokenizer.\n",
    "user assistant system tool\n",
    "The quick brown fox jumps over the lazy dog. def f(x):\n\treturn x + 1\n",
    "Quantum computing uses qubits; classical computing uses bits.\n",
]


def build_tokenizer(directory: Path) -> Path:
    """Train a ~400-token byte-level BPE and save it as a HF fast tokenizer. CJK and emoji stay split
    into several byte tokens, which is what the chip grouping must handle."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def encode_chat(tok: Any, messages: list[dict[str, str]], max_len: int | None = None) -> dict[str, Any]:
    """ChatML: `<|im_start|>role\\ncontent<|im_end|>\\n`; assistant content and its <|im_end|> are trained."""
    ids: list[int] = []
    mask: list[int] = []
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    for m in messages:
        head = [start, *tok.encode(m["role"] + "\n", add_special_tokens=False)]
        body = [*tok.encode(m["content"], add_special_tokens=False), end]
        tail = tok.encode("\n", add_special_tokens=False)
        trained = 1 if m["role"] == "assistant" else 0
        ids += head + body + tail
        mask += [0] * len(head) + [trained] * len(body) + [0] * len(tail)
    truncated = max_len is not None and len(ids) > max_len
    if truncated:
        ids, mask = ids[:max_len], mask[:max_len]
    return {"input_ids": ids, "loss_mask": mask, "truncated": bool(truncated)}


def write_dataset(
    directory: Path,
    rows: list[dict[str, Any]],
    tokenizer_dir: Path | None,
    report: dict[str, Any] | None = None,
    shard_rows: int = 4,
) -> Path:
    """Write `rows` (dicts with input_ids, loss_mask, truncated, source, source_row, turn) with the
    project's shard writer and statistics, as the tokenize job does (several shards, manifest, stats)."""
    from draftdeck.shards.manifest import Manifest, TokenizerRef
    from draftdeck.shards.stats import Stats
    from draftdeck.shards.store import ShardRow, ShardWriter, write_metadata

    writer = ShardWriter(directory, shard_rows=shard_rows)
    vocab = 1 + max((max(r["input_ids"]) for r in rows if r["input_ids"]), default=0)
    stats = Stats(vocab_size=vocab)
    for r in rows:
        row = ShardRow(
            np.asarray(r["input_ids"], dtype=np.int32),
            np.asarray(r["loss_mask"], dtype=np.uint8),
            r.get("source", "unknown"),
            r.get("source_row", 0),
            r.get("turn", 0),
            bool(r.get("truncated", False)),
        )
        writer.add(row)
        stats.add(row.input_ids, row.loss_mask, row.source)
    shards = writer.close()
    stats.write(directory)
    n = len(rows)
    empty_report = {
        "rows_in": n,
        "rows_out": n,
        "rows_expanded": 0,
        "rejected": {},
        "warnings": {},
        "examples": {},
    }
    tokenizer = TokenizerRef(str(tokenizer_dir) if tokenizer_dir else None, "test-tiny-bpe")
    write_metadata(directory, Manifest(shards, tokenizer, report=report or empty_report))
    return directory


HOSTILE = [
    "<script>alert('xss-script')</script>",
    "<img src=x onerror=\"alert('xss-img')\">",
    "<a href=\"javascript:alert('xss-link')\">click me</a>",
    "{{ 7*7 }} {% if true %}jinja{% endif %} ${7*7}",
]


def sample_conversations() -> list[list[dict[str, str]]]:
    """Conversations covering plain text, whitespace, CJK, emoji, hostile markup and several turns."""
    return [
        [
            {"role": "user", "content": "hello world"},
            {"role": "assistant", "content": "hello user, this is a test."},
        ],
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "tabs\tand  spaces\nnewline"},
            {"role": "assistant", "content": "def f(x):\n\treturn x + 1\n"},
        ],
        [
            {"role": "user", "content": "中文 and emoji 🙂👍🏽"},
            {"role": "assistant", "content": "好的 🙂 done"},
        ],
        [{"role": "user", "content": HOSTILE[0]}, {"role": "assistant", "content": HOSTILE[1]}],
        [{"role": "user", "content": HOSTILE[2]}, {"role": "assistant", "content": HOSTILE[3]}],
        [
            {"role": "user", "content": "quantum?"},
            {"role": "assistant", "content": "Quantum computing uses qubits."},
            {"role": "user", "content": "and classical?"},
            {"role": "assistant", "content": "classical uses bits."},
        ],
    ]


def build_chat_dataset(
    root: Path, name: str = "chat-tok", max_len: int | None = None, tokenizer_dir: Path | None = None
) -> dict[str, Path]:
    """A source JSONL file, a tokenizer and a dataset made from them (one row per assistant turn)."""
    tok_dir = tokenizer_dir or root / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        build_tokenizer(tok_dir)
    tok = load_tokenizer(tok_dir)
    src = root / "data" / "chats.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    convs = sample_conversations()
    src.write_text(
        "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in convs), encoding="utf-8"
    )
    rows = []
    for i, conv in enumerate(convs):
        cuts = [j for j, m in enumerate(conv) if m["role"] == "assistant"]
        for turn, cut in enumerate(cuts):
            row = encode_chat(tok, conv[: cut + 1], max_len)
            row.update(source=str(src), source_row=i + 1, turn=turn)  # JSONL: the 1-based line
            rows.append(row)
    ds_dir = write_dataset(root / "datasets" / name, rows, tok_dir)
    return {"tokenizer": tok_dir, "source": src, "dataset": ds_dir}


def stop_group(proc: subprocess.Popen[Any], timeout: float = 15) -> None:
    """Stop a server started in its own process group: SIGTERM, then SIGKILL after `timeout` s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_web(home: Path, roots: Path, log: Path, port: int) -> subprocess.Popen[bytes]:
    """`draftdeck web` (the command a user runs) on `port` with its own home, in its own process
    group, once /healthz answers (its output appended to `log`)."""
    import urllib.request

    from tests.browser.harness import REPO_ROOT

    env = {**os.environ, "DRAFTDECK_HOME": str(home), "DRAFTDECK_DATA_ROOTS": str(roots)}
    for var in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN", "DRAFTDECK_HOST"):
        env.pop(var, None)
    exe = str(Path(sys.executable).parent / "draftdeck")
    with open(log, "ab") as out:
        proc = subprocess.Popen([exe, "web", "--port", str(port)], cwd=REPO_ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_group(proc)
                raise RuntimeError(f"draftdeck web did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def web_server(home: Path, roots: Path, log: Path) -> Iterator[str]:
    """`draftdeck web` on a free port with its own home; yields its URL once /healthz answers, and stops
    its process group after."""
    from tests.browser.harness import free_port

    port = free_port()
    proc = start_web(home, roots, log, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc)
