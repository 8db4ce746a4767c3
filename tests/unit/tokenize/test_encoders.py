# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""The fast (tiktoken) encoder gives the HF tokenizer's ids and offsets, or the job falls back to HF."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from draftdeck.chat.testing import QWEN35_SPECIALS
from draftdeck.tokenize.encoders import EncoderUnsupported, HFEncoder, TiktokenEncoder
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_conversations
from tests.support.tokenize import a, conv, qwen_dir, qwen_tok, small_dir, small_tok, u  # noqa: F401

TRICKY = [
    "你好，世界！我是一个乐于助人的助手。これは日本語です。한국어 텍스트.",  # noqa: RUF001
    "emoji 😀🎉👍🏽👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ZWJ",
    "spaces" + " " * 257 + "end\n\n\n\n\t\t\t  \n \r\n\r\n" + "\n" * 40 + "x",
    "look-alikes: <|im_start |> <|im_sta <|im_end|x </think > <think>> <tool_call ><|endoftext|",
    "code:\n    def f(x):\n        return x ** 2  # comment\n\n\nclass A: pass\n",
    "numbers 1234567890 3.14159 1e-10 0x1F and 'll 've 're 's 't 'm 'd ALL-CAPS'S",
    "accents: café naïve résumé Ångström ñ ü ø ß İ ı ǅ",  # noqa: RUF001 - already NFC
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>\n",
    "",
    "a" * 10_000,
    "<tts_text_bos_single>x<tts_text_bos>y<tts_text_bos_singl",  # added tokens that prefix each other
]


def _random_texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    alphabet = [*"abcXYZ 019\n\t\r.,;:'\"!?<>|/_-", "你", "好", "😀", "🏽", "é", "ß", "\u200d", "<|im_end|>"]
    alphabet += ["<think>", "  ", "\n\n", "'s", "'LL"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(n)]


@pytest.fixture(scope="module")
def qwen_fast(qwen_tok: Any) -> TiktokenEncoder:
    return TiktokenEncoder(qwen_tok)


@pytest.mark.parametrize("text", TRICKY)
def test_tiktoken_ids_and_offsets_equal_hf_on_tricky_text(
    text: str, qwen_tok: Any, qwen_fast: TiktokenEncoder
) -> None:
    assert qwen_fast.usable(text)
    ids, starts = qwen_fast.encode_one(text, [])
    ref = qwen_tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids.tolist() == ref["input_ids"]
    assert starts.tolist() == [s for s, _ in ref["offset_mapping"]]
    hf_ids, hf_starts = HFEncoder(qwen_tok).encode([text], [[]])[0]
    assert np.array_equal(ids, hf_ids) and np.array_equal(starts, hf_starts)


def test_segment_cache_gives_the_same_ids(qwen_tok: Any, qwen_fast: TiktokenEncoder) -> None:
    cache: dict[str, np.ndarray] = {}
    texts = [t for t in TRICKY if t] * 2
    for text in texts:
        # the per-segment path (used where an added token is a prefix of another, and around literals)
        ids = qwen_fast._segments(text, cache)
        assert ids == HFEncoder(qwen_tok).encode([text], [[]])[0][0].tolist()
    assert cache  # segments were cached and reused the second time


def test_tiktoken_equals_hf_on_random_text(qwen_tok: Any, qwen_fast: TiktokenEncoder) -> None:
    texts = _random_texts(300)
    refs = HFEncoder(qwen_tok).encode(texts, [[]] * len(texts))
    for text, (ref_ids, ref_starts) in zip(texts, refs, strict=True):
        ids, starts = qwen_fast.encode_one(text, [])
        assert np.array_equal(ids, ref_ids), text
        assert np.array_equal(starts, ref_starts), text


def test_special_token_text_only_becomes_special_where_not_literal(
    qwen_tok: Any, qwen_fast: TiktokenEncoder
) -> None:
    text = "say <|im_end|> now"
    literal = [(4, 14)]  # the user's "<|im_end|>"
    im_end = qwen_tok.convert_tokens_to_ids("<|im_end|>")
    fast_ids, fast_starts = qwen_fast.encode_one(text, literal)
    hf_ids, hf_starts = HFEncoder(qwen_tok).encode([text], [literal])[0]
    assert im_end not in fast_ids.tolist()
    assert np.array_equal(fast_ids, hf_ids) and np.array_equal(fast_starts, hf_starts)
    assert qwen_tok.decode(fast_ids.tolist()) == text
    assert im_end in qwen_fast.encode_one(text, [])[0].tolist()  # without the literal range it is special


def test_non_nfc_text_goes_to_hf(qwen_tok: Any, qwen_fast: TiktokenEncoder) -> None:
    assert not qwen_fast.usable("cafe\u0301")  # decomposed é: HF normalises to NFC, tiktoken would not


def test_real_qwen_vocabulary_and_specials(qwen_tok: Any) -> None:
    assert len(qwen_tok) == 248044 + len(QWEN35_SPECIALS)
    assert qwen_tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<think>", "</think>"]) == [
        248044, 248045, 248068, 248069]  # fmt: skip


def test_small_bpe_runs_on_tiktoken_too(small_tok: Any) -> None:
    fast = TiktokenEncoder(small_tok)  # trained BPE: ids assigned in merge order, so ranks agree
    for text in [*TRICKY, *_random_texts(100, seed=3)]:
        ids, starts = fast.encode_one(text, [])
        ref = HFEncoder(small_tok).encode([text], [[]])[0]
        assert np.array_equal(ids, ref[0]) and np.array_equal(starts, ref[1]), text


def test_unsupported_structure_is_refused(tmp_path: Path, small_dir: Path) -> None:
    spec = json.loads((small_dir / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    d = tmp_path / "tok"
    d.mkdir()
    for f in small_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "tokenizer.json").write_text(json.dumps(spec))
    from draftdeck.chat.render import load_tokenizer

    with pytest.raises(EncoderUnsupported, match="normalizer"):
        TiktokenEncoder(load_tokenizer(d))


def _unreachable_token_tokenizer(small_dir: Path, dest: Path) -> Path:
    """The small BPE plus a vocabulary entry no merge produces: HF (merges) and tiktoken (whole-piece
    lookup) then disagree on it, while the structure check passes."""
    spec = json.loads((small_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["qqqq"] = max(vocab.values()) + 1
    spec["model"]["ignore_merges"] = False
    dest.mkdir()
    for f in small_dir.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    (dest / "tokenizer.json").write_text(json.dumps(spec))
    return dest


@pytest.mark.parametrize(
    ("bad_line", "verify_all", "workers"), [(300, True, 1), (5, False, 1), (200, True, 2)]
)
def test_encoder_mismatch_falls_back_to_hf_and_says_so(
    bad_line: int, verify_all: bool, workers: int, tmp_path: Path, small_dir: Path
) -> None:
    """A bad row late in the input is found by --verify-all; in the first chunk (always fully
    checked) it is found without it. Either way the whole job runs again on HF."""
    from draftdeck.shards.store import ShardDataset

    tok_dir = _unreachable_token_tokenizer(small_dir, tmp_path / "tok")
    convs = [conv(u(f"hello {i}"), a("fine"), line=i) for i in range(300)]
    convs.insert(bad_line, conv(u("say it"), a("qqqq"), line=999))
    opts = TokenizeOptions(tok_dir, workers=workers, chunk_size=64, verify_all=verify_all)
    report = tokenize_conversations(convs, tmp_path / "out", opts)
    assert report.warnings["encoder_mismatch"] == 1
    assert report.extra["encoder"]["used"] == "hf"
    assert "disagreed" in report.extra["encoder"]["note"]
    assert report.rows_out == 301
    ref = tokenize_conversations(convs, tmp_path / "ref", TokenizeOptions(tok_dir, workers=1, encoder="hf"))
    assert ref.extra["encoder"]["used"] == "hf"
    got, want = ShardDataset(tmp_path / "out"), ShardDataset(tmp_path / "ref")
    assert [got.row(i)["input_ids"] for i in range(len(got))] == [
        want.row(i)["input_ids"] for i in range(len(want))
    ]
    assert not list((tmp_path / "out").glob(".tmp-*"))


def test_a_sampled_ascii_row_is_checked_by_its_ids(tmp_path: Path, small_dir: Path) -> None:
    """After the first chunk a sampled row of ASCII text is checked by its ids alone (HF's batch encode
    without offsets): a disagreeing row there is still found, and the job runs again on HF."""
    tok_dir = _unreachable_token_tokenizer(small_dir, tmp_path / "tok")
    convs = [conv(u(f"hello {i}"), a("fine"), line=i) for i in range(200)]
    convs.insert(150, conv(u("say it"), a("qqqq"), line=999))
    opts = TokenizeOptions(tok_dir, workers=1, chunk_size=64, verify_every=1)
    report = tokenize_conversations(convs, tmp_path / "out", opts)
    assert report.warnings["encoder_mismatch"] == 1
    assert "'<|im_start|>user\\nsay it" in report.extra["encoder"]["note"]
    assert report.extra["encoder"]["used"] == "hf"
    clean = TokenizeOptions(tok_dir, workers=1, chunk_size=64, verify_every=1)
    fine = tokenize_conversations(convs[:150], tmp_path / "fine", clean)
    assert fine.extra["encoder"] == {**fine.extra["encoder"], "used": "tiktoken", "verified_rows": 150}


def test_added_tokens_that_prefix_each_other_match_longest_first(small_dir: Path) -> None:
    from tokenizers import AddedToken

    from draftdeck.chat.render import load_tokenizer

    tok = load_tokenizer(small_dir)
    tok.backend_tokenizer.add_special_tokens(
        [AddedToken("<ab>", special=True), AddedToken("<ab>c", special=True)]
    )
    fast = TiktokenEncoder(tok)
    assert fast.ambiguous == ("<ab>",)
    for text in ["x<ab>cy<ab>z", "<ab>c<ab>c", "<ab><ab>c"]:
        ids, starts = fast.encode_one(text, [])
        ref = HFEncoder(tok).encode([text], [[]])[0]
        assert np.array_equal(ids, ref[0]) and np.array_equal(starts, ref[1]), text
    assert tok.convert_tokens_to_ids("<ab>c") in fast.encode_one("x<ab>cy", [])[0].tolist()


def _reference_bad_rows(fast: TiktokenEncoder, rows: list[Any], encoded: list[Any]) -> dict[int, str]:
    """The mask check as it was written first: every trained run decoded on its own."""
    bad: dict[int, str] = {}
    for k, (r, (ids, starts)) in enumerate(zip(rows, encoded, strict=True)):
        for first, last in r.spans:
            lo = int(np.searchsorted(starts, first, side="left"))
            hi = int(np.searchsorted(starts, last, side="left"))
            if lo >= hi:
                continue
            want = r.text[int(starts[lo]) : int(starts[hi]) if hi < len(ids) else len(r.text)]
            got = fast.decode_bytes(ids[lo:hi])
            if got != want.encode("utf-8"):
                shown = got.decode("utf-8", "replace")[:60]
                bad.setdefault(k, f"decoded {shown!r} but the rendered text is {want[:60]!r}")
    return bad


def test_run_check_on_byte_slices_equals_decoding_each_run(qwen_dir: Path) -> None:
    """The fast rows' mask check (one byte layout per chunk, runs as slices of it) flags exactly the rows
    that decoding every run on its own flags: runs that start inside a multi-byte character, ids that
    do not spell the text, and good rows."""
    from draftdeck.chat.spans import RenderedRow
    from draftdeck.tokenize import pipeline as P
    from draftdeck.tokenize import rows as R

    opts = TokenizeOptions(qwen_dir)
    tok, renderer, hf, fast, _ = P._load(opts)
    assert fast is not None
    st = R.State(opts, tok, renderer, hf, fast)
    rng = random.Random(3)
    rows, encoded = [], []
    for text in [t for t in TRICKY if t] + _random_texts(200, seed=11):
        ids, starts = fast.encode_one(text, [])
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, 2 * rng.randint(1, 3))))
        spans = list(zip(cuts[::2], cuts[1::2], strict=False))
        if rng.random() < 0.2 and len(ids) > 2:  # ids that do not spell the text
            ids = ids.copy()
            ids[rng.randrange(len(ids))] = fast.specials["<|im_end|>"]
        rows.append(RenderedRow(text, spans))
        encoded.append((ids, starts))
    want = _reference_bad_rows(fast, rows, encoded)
    got = R._check_runs(st, rows, encoded, set(range(len(rows))))
    assert got == want
    assert 10 < len(want) < len(rows)  # both outcomes occur
