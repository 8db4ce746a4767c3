"""A source row's images on the sample page: each message's text and images in the order they stood,
and the one image the page asks for by its number in the row.

The page never receives a path: it asks for "image k of row n", and the server reads the row again,
finds its k-th image (a file resolved against the source file's folder, or a data URI's bytes) and
serves it only when the file lies in the data roots (app/web checks) and PIL reads it as a format a
browser shows. A URL is shown as text, never loaded: neither the server nor the browser fetches it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftdeck.formats.common import IMAGE_PART_PREFIXES, ParseContext, ParseOptions, RowRejected
from draftdeck.formats.image_parts import ROW_IMAGE_KEYS, image_list
from draftdeck.formats.images import image_part
from draftdeck.formats.model import IMAGE_PLACEHOLDER, ImageRef
from draftdeck.paths import inside_roots

# a message's images: a reference, or why none could be made (a part that names no image)
Found = ImageRef | str


def is_image_part(part: Any) -> bool:
    kind = part.get("type") if isinstance(part, dict) else None
    return isinstance(kind, str) and kind.startswith(IMAGE_PART_PREFIXES)


def _listed(value: Any, where: str, ctx: ParseContext) -> list[Found]:
    try:
        return list(image_list(value, where, ctx))
    except RowRejected as exc:
        return [exc.reason]


def _own(m: dict[str, Any], text_key: str, ctx: ParseContext) -> list[Found]:
    """A message's own images: its image parts, then its `images` list."""
    found: list[Found] = []
    content = m.get(text_key)
    if isinstance(content, list):
        for i, part in enumerate(content):
            if is_image_part(part):
                try:
                    found.append(image_part(part, part["type"], f"part {i}", ctx))
                except RowRejected as exc:
                    found.append(exc.reason)
    if m.get("images"):
        found.extend(_listed(m["images"], "images", ctx))
    return found


def message_images(
    value: dict[str, Any], msgs: list[Any], text_key: str, texts: list[str], folder: str | None
) -> list[list[Found]]:
    """Per message, its images in order: its own, else its share of the row's `images` list (one per
    placeholder of its text, in order)."""
    ctx = ParseContext(ParseOptions(), base_dir=folder)
    pool: list[Found] = []
    for key in ROW_IMAGE_KEYS:
        if value.get(key):
            pool.extend(_listed(value[key], key, ctx))
    out = []
    for m, text in zip(msgs, texts, strict=True):
        own = _own(m, text_key, ctx) if isinstance(m, dict) else []
        if not own and pool:
            n = text.count(IMAGE_PLACEHOLDER)
            own, pool = pool[:n], pool[n:]
        out.append(own)
    return out


def shown(
    value: dict[str, Any],
    msgs: list[Any],
    text_key: str,
    texts: list[str],
    folder: str | None,
    roots: Sequence[Path] | None = None,
) -> tuple[list[list[dict[str, Any]]], list[ImageRef]]:
    """Per message, its parts for the page, and the row's images those parts number.

    Parts: ``{"kind": "text", "text"}``; ``{"kind": "image", "k", "name"}`` (the k-th of the images
    returned, which the image route finds again by reading the row the same way); ``{"kind": "url",
    "url"}`` (shown as text, never loaded); ``{"kind": "bad", "why"}``. A placeholder without an image
    stays text; an image without a placeholder is not shown (the reader rejects such a row). A file
    outside `roots` (None: anywhere) is a ``bad`` part whatever it is: the page never says whether a
    file there exists."""
    refs: list[ImageRef] = []
    out = []
    for text, images in zip(texts, message_images(value, msgs, text_key, texts, folder), strict=True):
        parts: list[dict[str, Any]] = []
        pieces = text.split(IMAGE_PLACEHOLDER)
        for i, piece in enumerate(pieces):
            # an image stands on a line of its own: the newline that joined it to its neighbours goes
            if i > 0 and i - 1 < len(images):
                piece = piece.removeprefix("\n")
            if i < len(pieces) - 1 and i < len(images):
                piece = piece.removesuffix("\n")
            if piece:
                parts.append({"kind": "text", "text": piece})
            if i == len(pieces) - 1:
                break
            if i >= len(images):
                parts.append({"kind": "text", "text": IMAGE_PLACEHOLDER})
                continue
            found = images[i]
            if isinstance(found, str):
                parts.append({"kind": "bad", "why": found})
            elif found.url is not None:
                parts.append({"kind": "url", "url": found.url})
            elif found.path is not None and not _within(found.path, roots):
                parts.append({"kind": "bad", "why": f"{found.path} is outside the data roots"})
            elif found.path is not None and not os.path.isfile(found.path):
                parts.append({"kind": "bad", "why": f"no image file at {found.path}"})
            else:
                parts.append({"kind": "image", "k": len(refs), "name": _name(found)})
                refs.append(found)
        out.append(_merged(parts))
    return out, refs


def _within(path: str, roots: Sequence[Path] | None) -> bool:
    return roots is None or inside_roots(Path(path).resolve(), roots)


def _name(ref: ImageRef) -> str:
    if ref.path is not None:
        return ref.path.rsplit("/", 1)[-1]
    return f"{ref.mime or 'inline image'}, {len(ref.data or b''):,} bytes"


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text parts as one (a placeholder left as text joins its neighbours)."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if p["kind"] == "text" and out and out[-1]["kind"] == "text":
            out[-1] = {"kind": "text", "text": out[-1]["text"] + p["text"]}
        else:
            out.append(p)
    return out
