"""Images in a regeneration request: a user turn's pictures sent to the target as OpenAI content parts.

The reader has already checked each image (placeholders, bytes, limits, the data roots) and stored it in
``images/`` beside the output, so the written row points there. A request cannot point there (the
server is elsewhere), so each image is sent as a ``data:<mime>;base64,...`` URI in its placeholder's
place, its bytes read again through the checked loader (:func:`draftdeck.formats.images.check`) with
the job's roots. A URL is never fetched: the reader rejected such rows as ``image_url_unread``.

The local backend decodes the same data URIs back into pictures (:func:`pictures_of`), so both backends
take one request shape.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from draftdeck.formats.common import RowRejected as BadImage
from draftdeck.formats.images import ImageLimits, check, data_uri_ref, to_pil
from draftdeck.formats.model import ImageRef, Message
from draftdeck.formats.writers import content_parts
from draftdeck.regenerate.answer import RowRejected


def data_uri(ref: ImageRef, limits: ImageLimits) -> str:
    """The image as a data URI of its checked bytes and their sniffed type; a file gone or changed
    since the reader checked it rejects the row with the image code, as the reader would."""
    try:
        checked = check(ref, limits)
    except BadImage as exc:
        raise RowRejected(exc.code, exc.reason) from None
    return f"data:{checked.mime};base64,{base64.b64encode(checked.data).decode()}"


def with_inline_images(request: list[dict[str, Any]], history: list[Message], limits: ImageLimits) -> None:
    """Give each message of `request` (OpenAI messages written from `history`, one each) that has images
    content parts whose image URLs are data URIs, in the placeholders' order."""
    for sent, msg in zip(request, history, strict=True):
        if not msg.images:
            continue
        parts = content_parts(msg)
        refs = iter(msg.images)
        for part in parts:
            if part["type"] == "image_url":
                part["image_url"] = {"url": data_uri(next(refs), limits)}
        sent["content"] = parts


def has_image_parts(messages: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
        for m in messages
    )


def pictures_of(messages: list[dict[str, Any]]) -> list[Any]:
    """The RGB pictures of a request's data URI image parts, in order (what a processor takes)."""
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") == "image_url":
                out.append(to_pil(data_uri_ref(part["image_url"]["url"], "image part")))
    return out


def reads_images(folder: str | Path) -> bool:
    """Whether a local target folder is a vision-language model: an image processor and a vision tower."""
    from draftdeck.causal_lm import read_model_config

    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "preprocessor_config.json").is_file():
        return False
    return "vision_config" in read_model_config(folder)
