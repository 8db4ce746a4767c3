"""Where the readers find a row's images, and the checks every row with images passes.

The shapes read (each image becomes an :class:`ImageRef` of its message, and an IMAGE_PLACEHOLDER in
the message's text where it stood):

- OpenAI chat content parts ``{"type": "image_url", "image_url": {"url"} | "url"}`` and the Responses
  API's ``{"type": "input_image", "image_url"}``; the chat templates' ``{"type": "image", "image" |
  "url" | "path" | "base64"}``; an Anthropic ``{"type": "image", "source"}`` block. The address is a
  ``data:`` URI, a file path or ``file:`` URI (relative: to the input file's folder), or a URL, which
  is never fetched (``image_url_unread``, naming it). An OpenAI ``file_id`` is a file on OpenAI's
  servers: never fetched either.
- LLaMA-Factory, ms-swift and LLaVA rows: ``<image>`` placeholders in the turns' text and a row-level
  ``images`` list (LLaVA: one ``image``) of paths relative to the file (or data URIs, or Hugging Face
  image structs ``{"bytes", "path"}`` of a Parquet file), given to the placeholders in order.
- A message's own ``images`` list (what DraftDeck's Parquet output holds beside text with placeholders).

Audio and video stay refused as ``multimodal_content`` (no drafter here learns from them), and so do
images when the reader is told ``images="reject"`` (a text-only target). Every image of a kept row is
loaded and checked (:func:`draftdeck.formats.images.check`) and, with ``ParseOptions.images_dir``,
stored once in that content-addressed folder.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected
from draftdeck.formats.images import (
    ImageLimits,
    check_messages,
    image_part,
    ref_from_uri,
)
from draftdeck.formats.model import IMAGE_PLACEHOLDER, Conversation, ImageRef, Message

ROW_IMAGE_KEYS = ("images", "image")  # LLaMA-Factory / ms-swift, LLaVA
AV_KEYS = ("audios", "audio", "videos", "video")


def image_item(item: Any, where: str, ctx: ParseContext) -> ImageRef:
    """One entry of an ``images`` list: an address, or a Hugging Face image struct."""
    if isinstance(item, str):
        return ref_from_uri(item, ctx.base_dir, where)
    if isinstance(item, dict):
        if isinstance(item.get("bytes"), bytes | bytearray):
            return ImageRef(data=bytes(item["bytes"]))
        return image_part(item, "image", where, ctx)
    raise RowRejected("image_missing", f"{where} is a JSON {type(item).__name__}, not an image's address")


def image_list(value: Any, where: str, ctx: ParseContext) -> list[ImageRef]:
    """A list of images (a single address is a list of one)."""
    ctx.images = True
    items = value if isinstance(value, list) else [value]
    return [image_item(item, f"{where}[{i}]", ctx) for i, item in enumerate(items)]


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != []


def row_media(
    value: dict[str, Any], ctx: ParseContext, refused: str
) -> tuple[dict[str, Any], list[ImageRef] | None]:
    """A row that has a media key: (the row without its image list, the images it lists). Audio or
    video, and images under ``images="reject"``, refuse it as ``multimodal_content`` (`refused` says
    what it holds)."""
    if any(_present(value.get(k)) for k in AV_KEYS) or ctx.options.images != "keep":
        raise RowRejected("multimodal_content", f"the row holds {refused}; no drafter here learns from them")
    refs: list[ImageRef] = []
    rest = dict(value)
    for key in ROW_IMAGE_KEYS:
        if _present(value.get(key)):
            refs.extend(image_list(rest.pop(key), key, ctx))
    return rest, refs or None


def attach_row_images(convs: list[Conversation], refs: list[ImageRef]) -> None:
    """Give a row's image list to its placeholders, in order of the messages, in each conversation it
    gave. The placeholders must be as many as the images (and no message may hold image parts as
    well): else ``image_placeholder_mismatch``."""
    for conv in convs:
        if any(m.images for m in conv.messages):
            raise RowRejected(
                "image_placeholder_mismatch",
                "the row has both an images list and image parts in its messages: which goes where?",
            )
        counts = [m.content.count(IMAGE_PLACEHOLDER) for m in conv.messages]
        if sum(counts) != len(refs):
            raise RowRejected(
                "image_placeholder_mismatch",
                f"the row lists {len(refs)} image(s) and its text holds {sum(counts)} "
                f"{IMAGE_PLACEHOLDER} placeholder(s)",
            )
        at = 0
        for msg, n in zip(conv.messages, counts, strict=True):
            if n:
                msg.images = refs[at : at + n]
                at += n


def message_images(d: dict[str, Any], msg: Message, where: str, ctx: ParseContext) -> None:
    """A message's own ``images`` list (beside placeholders in its text): DraftDeck's Parquet output."""
    value = d.get("images")
    if not _present(value):
        return
    if ctx.options.images != "keep":
        raise RowRejected("multimodal_content", f"{where} holds images; they are refused (--images reject)")
    msg.images.extend(image_list(value, f"{where}.images", ctx))


def check_row(convs: list[Conversation], ctx: ParseContext) -> None:
    """Check every image of a row's conversations (placeholders, bytes, limits) and store them where
    the options say: RowRejected with an image code at the first fault."""
    opts = ctx.options
    limits = ImageLimits(opts.max_image_bytes, opts.max_image_pixels, opts.image_roots)
    for conv in convs:
        if any(m.images for m in conv.messages):
            check_messages(conv.messages, limits, "", opts.images_dir)
