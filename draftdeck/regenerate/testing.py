"""A tiny Qwen3 target and a `transformers serve` process for tests and benchmarks (offline, CPU).

The model is random-initialised (its answers are noise, which is all regeneration tests need: real
finish reasons, real token counts, real HTTP). It uses the project's small BPE tokenizer with a
Qwen3-style template, so the server's reasoning parser splits ``<think>`` blocks.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from draftdeck.chat import templates
from draftdeck.chat.testing import small_bpe_tokenizer

STOP_BAND = (350, 650)


def tiny_qwen3(out: Path, *, seed: int = 0, layers: int = 1, hidden: int = 32) -> Path:
    """Write a tiny random Qwen3 causal LM with the small BPE tokenizer into `out` (built once)."""
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(small_bpe_tokenizer(chat_template=templates.QWEN35_STYLE)))
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        initializer_range=0.5,  # large weights: greedy answers vary with the prompt
    )
    model = Qwen3ForCausalLM(config).eval()
    # Stop on the end-of-turn token or on any of a band of ordinary tokens, so that greedy answers
    # end by themselves after a few tokens on some prompts and run to max_tokens on others.
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = [eos, *range(STOP_BAND[0], STOP_BAND[1])]
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def transformers_cli() -> list[str]:
    exe = Path(sys.executable).with_name("transformers")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "transformers.cli.transformers"]


@contextlib.contextmanager
def transformers_serve(
    model_dir: Path, port: int | None = None, *, log: Path | None = None, wait_s: float = 120.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``transformers serve MODEL_DIR`` offline on the CPU; yield (base URL, process)."""
    port = port or free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    argv = [*transformers_cli(), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--device", "cpu", "--log-level", "warning"]
    sink = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {proc.returncode}" + _tail(log))
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not answer within {wait_s:.0f}s" + _tail(log))
            time.sleep(0.25)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log:
            sink.close()  # type: ignore[union-attr]


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + log.read_text(errors="replace")[-2000:]
