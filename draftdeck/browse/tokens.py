"""Token chips: one per token, coloured by the loss mask, with whole characters and turn roles.

A byte-level BPE token may hold part of a character (an emoji is often two or three tokens). Each
character is shown whole on the chip where it starts; the tokens that only finish it are marked as
continuations, with their bytes in the tooltip. Whitespace and control characters are made visible.

An image's tokens (a vision-language target's ``<|image_pad|>``, repeated once per merged patch of its
grid: draftdeck.tokenize.vision) are drawn as ONE chip, "image · 64 tokens", never trained: 64 chips
that all say the same would bury the text around them (:func:`fold_images`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from draftdeck.tokenize.bytelevel import token_bytes

ROLE_STARTS = frozenset({"<|im_start|>", "<|start_header_id|>", "<start_of_turn>"})
IMAGE_TOKENS = frozenset({"<|image_pad|>"})  # a vision-language target's image tokens (Qwen's name)


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TokenTable:
    """Token id -> raw bytes (or a special token's label), cached per id. Thread-safe for reading."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.size = len(self.tok)
        # only the decoder's JSON: the whole tokenizer's (to_str) costs a second for a 150K vocabulary
        backend_decoder = self.tok.backend_tokenizer.decoder
        decoder = json.loads(backend_decoder.__getstate__()) if backend_decoder is not None else {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders") or []}
        self.byte_level = "ByteLevel" in kinds
        self.special: dict[int, str] = {}
        self.added: dict[int, str] = {}
        for tid, added in self.tok.added_tokens_decoder.items():
            (self.special if added.special else self.added)[tid] = added.content
        self._bytes: dict[int, bytes | None] = {}
        self._pieces: dict[int, tuple[str | None, bytes, str | None, str | None]] = {}

    def piece(self, tid: int) -> tuple[str | None, bytes, str | None, str | None]:
        """(special label, raw bytes, text when the bytes are whole UTF-8 on their own, that text made
        visible), cached per id: the common token costs one dict lookup."""
        hit = self._pieces.get(tid)
        if hit is None:
            label = self.label(tid)
            if label is not None:
                hit = (label, b"", None, None)
            else:
                data = self.piece_bytes(tid)
                try:
                    whole: str | None = data.decode("utf-8")
                except UnicodeDecodeError:
                    whole = None
                hit = (None, data, whole, visible(whole) if whole else None)
            self._pieces[tid] = hit
        return hit

    def label(self, tid: int) -> str | None:
        """A special token's label, or None for an ordinary piece of text."""
        if tid in self.special:
            return self.special[tid]
        if tid in self.added and self.added[tid].startswith("<") and self.added[tid].endswith(">"):
            return self.added[tid]
        if not 0 <= tid < self.size:
            return f"<unknown id {tid}>"
        return None

    def piece_bytes(self, tid: int) -> bytes:
        cached = self._bytes.get(tid)
        if cached is not None:
            return cached
        if tid in self.added:
            out = self.added[tid].encode()
        else:
            text = self.tok.backend_tokenizer.id_to_token(tid)
            if not isinstance(text, str):
                out = b""
            elif self.byte_level:
                out = token_bytes(self.tok.backend_tokenizer, tid)
            else:
                m = _BYTE_FALLBACK.match(text)
                out = bytes([int(m.group(1), 16)]) if m else text.replace("\u2581", " ").encode()
        self._bytes[tid] = out
        return out

    def decode(self, batch: list[list[int]]) -> list[str]:
        return self.tok.batch_decode(batch, skip_special_tokens=False)


_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def visible(text: str) -> str:
    """Whitespace and control characters made visible; everything else unchanged."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32:
            out.append(chr(0x2400 + ord(ch)))
        elif ch == "\x7f":
            out.append("␡")
        else:
            out.append(ch)
    return "".join(out)


def _utf8_len(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


@dataclass(slots=True)
class Chip:
    pos: int
    id: int
    mask: int
    text: str = ""  # what the chip shows
    raw: str = ""  # the text the token stands for (tooltip)
    kind: str = "text"  # text | special | cont (bytes that finish a character shown on an earlier chip)
    newline: bool = False
    anchor: bool = False
    edge: bool = False  # the mask changes here
    role: str | None = None  # a turn starts here, for this role
    diff: bool = False  # compare view: the other dataset's mask differs at this position
    span: int = 1  # tokens the chip stands for (an image's: its token count)
    image: str | None = None  # an image chip: the stored file's name (None: not known)

    @property
    def cls(self) -> str:
        parts = ["tok", "tr" if self.mask else "cx", self.kind]
        if self.anchor:
            parts.append("anchor")
        if self.edge:
            parts.append("edge")
        if self.diff:
            parts.append("diff")
        return " ".join(parts)


def chips_for(ids: list[int], mask: list[int], table: TokenTable) -> list[Chip]:
    """One chip per token. Characters split over several byte-level tokens are shown whole on the
    token where they start; the tokens that only finish them are marked as continuations."""
    n = len(ids)
    chips = [Chip(pos=i, id=int(ids[i]), mask=int(mask[i]) if i < len(mask) else 0) for i in range(n)]
    texts = [""] * n
    pending = bytearray()
    owners: list[int] = []
    own: list[bytes] = [b""] * n

    def drain(final: bool) -> None:
        while pending:
            need = _utf8_len(pending[0])
            if need == 0:
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            if len(pending) < need:
                if not final:
                    return
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            try:
                ch = bytes(pending[:need]).decode("utf-8")
            except UnicodeDecodeError:
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            texts[owners[0]] += ch
            del pending[:need], owners[:need]

    shown: list[str | None] = [None] * n  # visible text, when known from the per-id cache
    for i, chip in enumerate(chips):
        label, data, whole, vis = table.piece(chip.id)
        if label is not None:
            drain(final=True)
            chip.kind = "special"
            chip.text = chip.raw = label
            continue
        if not data:
            continue
        own[i] = data
        if not pending and whole is not None:  # the usual case: the token is whole characters
            texts[i] = whole
            shown[i] = vis
            continue
        pending.extend(data)
        owners.extend([i] * len(data))
        drain(final=False)
    drain(final=True)

    role_from: int | None = None
    for i, chip in enumerate(chips):
        if chip.kind != "special":
            chip.raw = texts[i]
            if texts[i]:
                chip.text = shown[i] or visible(texts[i])
                chip.newline = texts[i].endswith("\n")
            elif own[i]:
                chip.kind = "cont"
                chip.text = "+"
                chip.raw = f"bytes {own[i].hex(' ')}: the rest of a character shown on an earlier chip"
        chip.edge = i > 0 and chip.mask != chips[i - 1].mask
        chip.anchor = bool(chip.mask) and i + 1 < n and bool(chips[i + 1].mask)
        if chip.kind == "special" and chip.text in ROLE_STARTS:
            role_from = i
            continue
        if role_from is not None and (chip.kind == "special" or "\n" in texts[i]):
            name = "".join(texts[j] for j in range(role_from + 1, i + 1)).strip()
            chips[role_from].role = name or "turn"
            role_from = None
    if role_from is not None:
        chips[role_from].role = "".join(texts[j] for j in range(role_from + 1, n)).strip() or "turn"
    return chips


def fold_images(chips: list[Chip], images: list[str] | None = None) -> list[Chip]:
    """Each run of an image's tokens as one ``image`` chip that spans them: at the run's first position,
    its mask 0 unless a token of it is trained (which tokenize never writes), its text "image · N
    tokens", and `images[k]` (the row's stored names, in order) as the k-th run's file. A chat template
    writes each image between its start and end tokens, so a run is one image."""
    out: list[Chip] = []
    i = 0
    while i < len(chips):
        c = chips[i]
        if not (c.kind == "special" and c.text in IMAGE_TOKENS):
            out.append(c)
            i += 1
            continue
        j = i + 1
        while j < len(chips) and chips[j].kind == "special" and chips[j].text == c.text:
            j += 1
        n, k = j - i, sum(1 for x in out if x.kind == "image")
        name = images[k] if images and k < len(images) else None
        out.append(Chip(pos=c.pos, id=c.id, mask=max(x.mask for x in chips[i:j]), kind="image", span=n,
                        text=f"image · {n:,} token{'s' if n != 1 else ''}", image=name,
                        raw=f"{name or 'an image'}: {n:,} image tokens ({c.text}), not trained",
                        edge=c.edge, role=c.role, diff=any(x.diff for x in chips[i:j])))  # fmt: skip
        i = j
    return out


def id_chips(ids: list[int], mask: list[int]) -> list[Chip]:
    """Chips that show token ids, for a dataset whose tokenizer is not on this machine."""
    chips = [Chip(pos=i, id=t, mask=mask[i] if i < len(mask) else 0, text=str(t), raw=str(t))
             for i, t in enumerate(ids)]  # fmt: skip
    for i, c in enumerate(chips):
        c.edge = i > 0 and c.mask != chips[i - 1].mask
        c.anchor = bool(c.mask) and i + 1 < len(chips) and bool(chips[i + 1].mask)
    return chips
