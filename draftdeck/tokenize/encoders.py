"""Encoders: rendered text in, token ids and each token's start character out.

:class:`HFEncoder` is the reference: the model's own HF fast tokenizer, one batched call per batch
of rows, offsets from that same call.

:class:`TiktokenEncoder` is the fast path for byte-level BPE vocabularies that tiktoken can
represent (the Qwen family). It is built from the HF tokenizer's own ``tokenizer.json`` (vocabulary,
merges, split pattern, added tokens) and only when the structure is provably the same algorithm:

- BPE model, byte-level alphabet, no dropout / unk / byte-fallback / subword prefixes;
- pre-tokenizer ``Split(pattern, isolated) + ByteLevel(use_regex=False)`` or GPT-2's ``ByteLevel``;
- merge order equals token-id order (tiktoken merges by the rank of the merged token, HF by merge
  index: the same when ranks are the ids);
- normaliser none or NFC (rows whose text is not already NFC go to the HF encoder);
- added tokens without lstrip / rstrip / single-word options.

Token ids are then checked against HF on a sample of every job's rows (all rows with
``--verify-all``); a mismatch makes the job start again on the HF encoder (see the pipeline).

Offsets: tiktoken returns ids only. The bytes of every token are known, so a token's start byte is
the running sum of the byte lengths of the tokens before it (their concatenation is the UTF-8 text,
exactly, for a byte-level BPE); start bytes map to characters through the UTF-8 lead bytes. A token
that starts inside a multi-byte character starts at that character, as in HF's offsets.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from draftdeck.tokenize.bytelevel import byte_translation, to_bytes, token_bytes

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

Encoded = tuple[np.ndarray, np.ndarray]  # (ids int32, char starts int64)
Literal = list[tuple[int, int]]


class EncoderUnsupported(Exception):
    """The tokenizer cannot be represented by the fast encoder (the reason says why)."""


_NO_SPECIALS: frozenset[str] = frozenset()  # tiktoken reads it each call: no new set per segment


def pieces(text: str, literal: Literal) -> list[tuple[int, int, bool]]:
    """Split `text` at the literal ranges: (start, end, as_text) pieces covering the whole text."""
    out: list[tuple[int, int, bool]] = []
    pos = 0
    for a, b in literal:
        if a > pos:
            out.append((pos, a, False))
        out.append((a, b, True))
        pos = b
    if pos < len(text) or not out:
        out.append((pos, len(text), False))
    return out


def char_starts_from_bytes(text: str, byte_starts: np.ndarray) -> np.ndarray:
    if text.isascii():
        return byte_starts
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
    return char_of_byte[byte_starts]


def _starts(offsets: list[tuple[int, int]]) -> np.ndarray:
    """The start of each (start, end) offset pair HF gives: read straight from the tuples (not through
    a (n, 2) array of them, which costs more than the reading on the rows the HF encoder verifies)."""
    return np.fromiter(map(itemgetter(0), offsets), dtype=np.int64, count=len(offsets))


class HFEncoder:
    name = "hf"

    def __init__(self, tok: Any):
        self.tok = tok
        self.backend = tok.backend_tokenizer
        self.normalizer = self.backend.normalizer

    def _as_text(self, text: str) -> Encoded:
        """Encode ignoring every added token (as HF's `_encode_without_added_tokens`), with offsets."""
        norm = self.normalizer.normalize_str(text) if self.normalizer is not None else text
        if len(norm) != len(text):
            raise EncoderUnsupported("normalisation changed the length of a literal piece")
        pre = self.backend.pre_tokenizer
        splits = [p for p, _ in pre.pre_tokenize_str(norm)] if pre is not None else [norm]
        ids = [t.id for piece in splits for t in self.backend.model.tokenize(piece)]
        return np.asarray(ids, dtype=np.int32), self._fix_byte_starts(text, ids)

    def _fix_byte_starts(self, text: str, ids: list[int]) -> np.ndarray:
        lens = np.fromiter((len(self.token_bytes(i)) for i in ids), dtype=np.int64, count=len(ids))
        return char_starts_from_bytes(text, np.cumsum(lens) - lens)

    def token_bytes(self, i: int) -> bytes:
        return token_bytes(self.backend, i)

    def encode(self, texts: Sequence[str], literals: Sequence[Literal]) -> list[Encoded]:
        plain = [i for i, lit in enumerate(literals) if not lit]
        out: list[Encoded | None] = [None] * len(texts)
        if plain:
            encs = self.backend.encode_batch([texts[i] for i in plain], add_special_tokens=False)
            for i, enc in zip(plain, encs, strict=True):
                out[i] = (np.asarray(enc.ids, dtype=np.int32), _starts(enc.offsets))
        for i, lit in enumerate(literals):
            if lit:
                out[i] = self._encode_pieces(texts[i], lit)
        return out  # type: ignore[return-value]

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of `texts` (rows without literal ranges), without offsets: ``encode_batch_fast``
        (tokenizers >= 0.21), about twice as fast as :meth:`encode`'s call with offsets.

        What the fast encoder's check reads for a sampled row of ASCII text after the first chunk: on
        ASCII text a byte-level token's start character is its start byte, the sum of the byte lengths
        of the tokens before it, which is what the fast encoder writes. So with the ids equal, HF's
        offsets can differ from ours only by a rule that moves them on every row (``trim_offsets``),
        which the first chunk's full check (ids and offsets of every row) finds. Rows with other
        characters (multi-byte, normalised) or literal ranges keep the full check."""
        batch = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        return [enc.ids for enc in batch(list(texts), add_special_tokens=False)]

    def _encode_pieces(self, text: str, literal: Literal) -> Encoded:
        ids: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        for a, b, as_text in pieces(text, literal):
            if as_text:
                pid, pst = self._as_text(text[a:b])
            else:
                enc = self.backend.encode(text[a:b], add_special_tokens=False)
                pid = np.asarray(enc.ids, dtype=np.int32)
                pst = _starts(enc.offsets)
            ids.append(pid)
            starts.append(pst + a)
        return np.concatenate(ids).astype(np.int32), np.concatenate(starts).astype(np.int64)


class TiktokenEncoder:
    name = "tiktoken"

    def __init__(self, tok: Any):
        # Built once per process per tokenizer (see draftdeck.tokenize.loaded), but that once is part of
        # every command's start-up: each step below runs in C (orjson, str.translate, bytes.join,
        # numpy) rather than a Python loop per character, ~0.7 s instead of ~2.6 s for 248k tokens.
        import orjson

        spec = orjson.loads(tok.backend_tokenizer.to_str())
        self.nfc = _check_structure(spec)
        pattern = _pattern(spec)
        model = spec["model"]
        vocab: dict[str, int] = model["vocab"]
        table = byte_translation()
        try:
            raw = [t.translate(table).encode("latin-1") for t in vocab]
            ranks = dict(zip(raw, vocab.values(), strict=True))
        except UnicodeEncodeError as exc:
            bad = next(t for t in vocab if not _is_byte_level(t))
            raise EncoderUnsupported(f"vocabulary token {bad!r} is not byte-level") from exc
        if len(ranks) != len(vocab):
            raise EncoderUnsupported("two vocabulary entries decode to the same bytes")
        if any(bytes([b]) not in ranks for b in range(256)):
            raise EncoderUnsupported("the vocabulary lacks some single bytes")
        _check_merge_order(model, vocab)
        self.specials: dict[str, int] = {}
        for added in spec.get("added_tokens") or []:
            if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
                raise EncoderUnsupported(f"added token {added['content']!r} has strip/single-word options")
            self.specials[added["content"]] = added["id"]
        # an added token whose text is also a vocabulary entry at the same id is fine; at another id it is not
        for content, i in self.specials.items():
            r = ranks.get(content.encode("utf-8"))
            if r is not None and r != i:
                raise EncoderUnsupported(f"added token {content!r} shadows vocabulary id {r}")
            if r is not None:
                del ranks[content.encode("utf-8")]
        self._setup(pattern, ranks)

    def state(self) -> dict[str, np.ndarray]:
        """Everything :meth:`restore` needs, as arrays (``np.savez``): the checks above need not run
        again for the same tokenizer files (see :mod:`draftdeck.tokenize.loaded`)."""
        is_rank = np.zeros(len(self.token_len), dtype=bool)
        is_rank[list(self.enc._mergeable_ranks.values())] = True
        meta = {"pattern": self.enc._pat_str, "nfc": self.nfc, "specials": self.specials}
        return {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), "is_rank": is_rank,
                "token_len": self.token_len, "token_bytes": self.token_bytes}  # fmt: skip

    @classmethod
    def restore(cls, state: dict[str, np.ndarray]) -> TiktokenEncoder:
        meta = json.loads(state["meta"].tobytes())
        self = cls.__new__(cls)
        self.nfc = bool(meta["nfc"])
        self.specials = {str(k): int(v) for k, v in meta["specials"].items()}
        flat = state["token_bytes"].tobytes()
        off = np.zeros(len(state["token_len"]) + 1, dtype=np.int64)
        np.cumsum(state["token_len"], out=off[1:])
        bounds = off.tolist()
        ranks = {flat[bounds[i] : bounds[i + 1]]: i for i in np.flatnonzero(state["is_rank"]).tolist()}
        self._setup(str(meta["pattern"]), ranks)
        return self

    def _setup(self, pattern: str, ranks: dict[bytes, int]) -> None:
        """The encoder and the tables from checked `ranks` (token bytes -> id) and `self.specials`."""
        import tiktoken

        self.enc = tiktoken.Encoding(
            "draftdeck", pat_str=pattern, mergeable_ranks=ranks, special_tokens=self.specials
        )
        self.allowed = set(self.specials)
        core = getattr(self.enc, "_core_bpe", None)  # looked up once: _encode_ordinary runs per segment
        self._to_buffer = getattr(core, "encode_to_tiktoken_buffer", None)
        self._special_ids = {s: np.asarray([i], dtype=np.uint32) for s, i in self.specials.items()}
        longest_first = sorted(self.specials, key=len, reverse=True)
        # added tokens that are a prefix of another one: where they occur, matching order matters
        self.ambiguous = tuple(
            a for a in self.specials if any(b != a and b.startswith(a) for b in self.specials)
        )
        self.special_re = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")
        self.special_split = re.compile(f"({self.special_re.pattern})").split  # keeps the tokens
        n = max(max(ranks.values()), max(self.specials.values(), default=0)) + 1
        by_id = [b""] * n  # every token's bytes by id (b"" for unused ids)
        for b, r in ranks.items():
            by_id[r] = b
        for sp, i in self.specials.items():
            by_id[i] = sp.encode("utf-8")
        self.token_len = np.fromiter(map(len, by_id), dtype=np.int64, count=n)
        # every token's bytes in one array, for decoding runs without a Python loop per token
        self.byte_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.token_len, out=self.byte_off[1:])
        self.token_bytes = np.frombuffer(b"".join(by_id), dtype=np.uint8)

    def decode_bytes(self, ids: Sequence[int] | np.ndarray) -> bytes:
        """The byte-level decoder: the concatenated bytes of `ids`."""
        arr = np.asarray(ids, dtype=np.int64)
        lens = self.token_len[arr]
        total = int(lens.sum())
        if not total:
            return b""
        # index of every output byte in the flat table: each token's start, then +0, +1, ...
        starts = self.byte_off[arr]
        run_start = np.cumsum(lens) - lens
        index = np.repeat(starts - run_start, lens) + np.arange(total)
        return self.token_bytes[index].tobytes()

    def usable(self, text: str) -> bool:
        return not self.nfc or unicodedata.is_normalized("NFC", text)

    def _segments(self, text: str, cache: dict[str, np.ndarray] | None) -> list[int]:
        """Ids of `text` with added tokens matched where they occur (see :meth:`_parts`)."""
        parts: list[np.ndarray] = []
        self._parts(text, cache, parts)
        return np.concatenate(parts).tolist() if parts else []

    def _parts(self, text: str, cache: dict[str, np.ndarray] | None, parts: list[np.ndarray]) -> None:
        """Append the ids of `text` to `parts`, with added tokens matched where they occur (leftmost,
        longest first, as HF's added-vocabulary matcher), the text between them encoded on its own: HF
        splits on added tokens before pre-tokenising, so this is the same encoding, and a segment seen
        before in `cache` (a system prompt, the shared turns of split rows) need not be encoded again."""
        # one C call splits the text: [segment, added token, segment, ..., segment] (segments maybe
        # empty); per segment the loop below is a lookup, not a match object and two slices
        split = self.special_split(text)
        special = self._special_ids
        if cache is None:
            for j in range(0, len(split) - 1, 2):
                if split[j]:
                    parts.append(self._encode_ordinary(split[j]))
                parts.append(special[split[j + 1]])
            if split[-1]:
                parts.append(self._encode_ordinary(split[-1]))
            return
        get = cache.get
        for j in range(0, len(split), 2):
            segment = split[j]
            if segment:
                got = get(segment)
                if got is None:
                    got = cache[segment] = self._encode_ordinary(segment)
                parts.append(got)
            if j + 1 < len(split):
                parts.append(special[split[j + 1]])

    def _encode_ordinary(self, segment: str) -> np.ndarray:
        """Ids of `segment` as plain text (no added token matched), as a uint32 array."""
        if self._to_buffer is not None:
            # tiktoken's own buffer (encode_to_numpy's path): no Python list of ints; with no special
            # token allowed this is encode_ordinary
            return np.frombuffer(self._to_buffer(segment, _NO_SPECIALS), dtype=np.uint32)
        return np.asarray(self.enc.encode_ordinary(segment), dtype=np.uint32)

    def encode_one(self, text: str, literal: Literal, cache: dict[str, np.ndarray] | None = None) -> Encoded:
        """Ids and char starts of `text`; `literal` ranges are plain text even if they spell an added
        token. `cache` maps text segments (between added tokens) to their ids: reuse it across the rows
        of a batch, so that text they share (the turns split rows repeat, a system prompt) is encoded
        once."""
        parts: list[np.ndarray] = []
        if not literal:
            self._parts(text, cache, parts)
        else:
            for a, b, as_text in pieces(text, literal):
                if as_text:
                    parts.append(self._encode_ordinary(text[a:b]))
                else:
                    self._parts(text[a:b], cache, parts)
        arr = np.concatenate(parts, dtype=np.int32, casting="unsafe") if parts else np.zeros(0, np.int32)
        lens = self.token_len[arr]
        return arr, char_starts_from_bytes(text, np.cumsum(lens) - lens)


def _check_structure(spec: dict[str, Any]) -> bool:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise EncoderUnsupported(f"model type {model.get('type')!r} is not BPE")
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise EncoderUnsupported(f"BPE option {key}={model.get(key)!r} is not supported")
    if model.get("byte_fallback"):
        raise EncoderUnsupported("byte_fallback BPE is not byte-level")
    norm = spec.get("normalizer")
    if norm is not None and norm.get("type") != "NFC":
        raise EncoderUnsupported(f"normalizer {norm.get('type')!r} is not supported")
    dec = spec.get("decoder") or {}
    if dec.get("type") != "ByteLevel":
        raise EncoderUnsupported(f"decoder {dec.get('type')!r} is not ByteLevel")
    return norm is not None


def _pattern(spec: dict[str, Any]) -> str:
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise EncoderUnsupported("ByteLevel pre-tokenizer with add_prefix_space or without regex")
        return GPT2_PATTERN
    if pre.get("type") == "Sequence":
        items = pre.get("pretokenizers") or []
        if (
            len(items) == 2
            and items[0].get("type") == "Split"
            and items[1].get("type") == "ByteLevel"
            and not items[1].get("use_regex", True)
            and not items[1].get("add_prefix_space")
            and str(items[0].get("behavior", "")).lower() == "isolated"
            and not items[0].get("invert")
            and "Regex" in (items[0].get("pattern") or {})
        ):
            return str(items[0]["pattern"]["Regex"])
    raise EncoderUnsupported(
        f"pre-tokenizer {json.dumps(pre)[:200]} is not a byte-level split tiktoken can run"
    )


def _is_byte_level(token: str) -> bool:
    try:
        to_bytes(token)
    except UnicodeEncodeError:
        return False
    return True


def _check_merge_order(model: dict[str, Any], vocab: dict[str, int]) -> None:
    """tiktoken merges by the rank of the merged token, HF by merge index: the same iff the merged
    tokens' ids rise with the merge index. (Byte-level tokens map one to one to their bytes, so the
    merged token is looked up by its text: no byte conversion per merge.)"""
    merges = model.get("merges") or []
    merged = [vocab.get(m.replace(" ", "", 1) if isinstance(m, str) else m[0] + m[1], -1) for m in merges]
    if -1 in merged:
        raise EncoderUnsupported("a merge produces a token outside the vocabulary")
    if merged and bool((np.diff(np.asarray(merged, dtype=np.int64)) < 0).any()):
        raise EncoderUnsupported("merge order differs from token-id order")
