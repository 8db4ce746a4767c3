"""Images in tokenize: a vision-language target's image processor, its chat template's image parts,
each image's placeholder expanded to the exact number of image tokens of its grid.

The target folder (``--tokenizer``) has a ``preprocessor_config.json``: it is a vision-language target
and rows with images are kept; without one, each such row is rejected as ``multimodal_content``, named
and counted (a text target cannot read an image). Per row with images:

1. :func:`item_images` (when the conversation becomes an :class:`~draftdeck.tokenize.rows.Item`): each
   message with images has its text cut at the ``<image>`` placeholders into content parts, a
   ``{"type": "image"}`` part in place of each one, as OpenAI and Qwen's processors give them to the chat
   template; the images themselves travel as JSON (a path, base64 data, or a URL, which is never read).
2. :meth:`ChunkImages.prepare`: every image loaded and checked (:func:`draftdeck.formats.images.check`:
   ``image_missing``, ``image_unreadable``, ``image_too_large``, ``image_url_unread``), its patch grid
   (t, h, w) from the image processor, the placeholders counted against the images
   (``image_placeholder_mismatch``); an image in an assistant answer is rejected as
   ``multimodal_content``: no drafter generates an image.
3. The template renders each image part as its tokens (Qwen3.5: ``<|vision_start|><|image_pad|>
   <|vision_end|>``). :meth:`ChunkImages.expand` repeats each ``<|image_pad|>`` t*h*w / merge_size^2
   times (what the processor's ``replace_image_token`` writes), every copy at the image part's
   character, so the loss mask (from characters) is 0 on all of them: they lie in a user turn. A row
   whose rendered image tokens are not as many as its images is rejected (``template_error``: the
   template dropped or repeated image parts).
4. :meth:`ChunkImages.fit` after truncation: an image cut in the middle is cut whole (with its start
   token), and the mask is set 0 on every image token and the vision start and end tokens. The mask
   check (every trained run decodes to its rendered text) runs as for text rows: no trained run holds
   an image token.

The grid is what the processor computes: for Qwen2-VL's family (Qwen2-VL to Qwen3.5, whose PIL
processor is ``Qwen2VLImageProcessorPil``) from the image's size through the processor's own
``smart_resize`` and settings, checked against a full ``preprocess`` on the first images a process
sees; any other processor runs its full ``preprocess``. torchvision's wheels on the package index are
GPU builds that do not load beside the CPU torch here, so the processor is always loaded with the PIL
backend (``backend="pil"``); the grid, and so the token count, is the same with either backend.

Stored per row (:mod:`draftdeck.shards.store`): ``images`` (the files' content-addressed names under
the dataset's ``images/``) and ``image_grid_thw`` (3 ints per image). The M-RoPE positions and
``mm_token_type_ids`` are not stored: both follow from the ids and the grids alone (the model's own
``get_rope_index`` computes the positions from ``input_ids`` and ``image_grid_thw``; an image token is
one whose id is the image token's), so the trainer recomputes them exactly, with the model's code,
and a dataset does not hold three more int64 per token.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from draftdeck.errors import InputError
from draftdeck.formats.common import RowRejected
from draftdeck.formats.model import IMAGE_PLACEHOLDER, Conversation, ImageRef

if TYPE_CHECKING:
    from draftdeck.chat.spans import RenderedRow
    from draftdeck.quality import Report
    from draftdeck.shards.manifest import ImageFile, ShardInfo
    from draftdeck.tokenize.encoders import Encoded


class ImageItem(Protocol):
    """What this module reads of a row to tokenize (draftdeck.tokenize.rows.Item is one), named here so
    that rows.py, which calls this module, is not imported back."""

    messages: list[dict[str, Any]]
    images: list[dict[str, Any]]  # item_images' entries: {"message": index, ...}


PREPROCESSOR_CONFIG = "preprocessor_config.json"
IMAGE_TOKEN, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
CHECKED_GRIDS = 4  # images per process whose fast grid is checked against the processor's preprocess
# Entries Vision's caches hold before they start again (~200 bytes each): forgetting only costs a
# picture's check again, and a name handed to the writer twice is written once (store_files)
MAX_REMEMBERED = 200_000


# -- 1. the conversation's images as an Item carries them ----------------------------------------------
def item_images(conv: Conversation, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn the placeholders of `messages` (the conversation's template dicts, changed in place) into
    content parts, and return the images as JSON-able dicts in order (``message``: its message's index,
    and one of ``path``, ``data`` (base64), ``url``; ``mime`` as declared)."""
    out: list[dict[str, Any]] = []
    for i, (msg, d) in enumerate(zip(conv.messages, messages, strict=True)):
        if not msg.images:
            continue
        d["content"] = content_parts(msg.content)
        for ref in msg.images:
            entry: dict[str, Any] = {"message": i, "mime": ref.mime}
            if ref.url is not None:
                entry["url"] = ref.url
            elif ref.data is not None:
                entry["data"] = base64.b64encode(ref.data).decode("ascii")
            else:
                entry["path"] = ref.path
            out.append(entry)
    return out


def content_parts(text: str) -> list[dict[str, Any]]:
    """`text` cut at each IMAGE_PLACEHOLDER: text parts, and an image part in place of each one."""
    parts: list[dict[str, Any]] = []
    for j, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if j:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _ref(entry: dict[str, Any]) -> ImageRef:
    data = entry.get("data")
    return ImageRef(path=entry.get("path"), data=base64.b64decode(data) if data is not None else None,
                    url=entry.get("url"), mime=entry.get("mime"))  # fmt: skip


# -- the target's image processor -----------------------------------------------------------------------
@dataclass
class Vision:
    """A vision-language target's image processor and its image tokens' ids."""

    processor: Any
    image_id: int
    start_id: int
    end_id: int
    merge_size: int
    checked: int = 0  # fast grids checked against a full preprocess in this process
    grids: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # by sha256
    # Images this job's process has checked, by what identifies their bytes (a file's path, size and
    # mtime; data's sha256) -> (stored name, grid): a picture a thousand rows share is read, decoded
    # and checked once, not a thousand times. And the names it has handed to the writer already.
    seen: dict[tuple[Any, ...], tuple[str, tuple[int, int, int]]] = field(default_factory=dict)
    emitted: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, folder: Path | str, tok: Any) -> Vision | None:
        """The target folder's image processor (PIL backend); None: no preprocessor_config.json (a
        text target). InputError when there is one that does not load, or the tokenizer lacks the
        image tokens."""
        folder = Path(folder)
        if not (folder / PREPROCESSOR_CONFIG).is_file():
            return None
        from draftdeck.chat.render import transformers_lock

        try:
            with transformers_lock:
                from transformers import AutoImageProcessor

                processor = AutoImageProcessor.from_pretrained(
                    str(folder), backend="pil", local_files_only=True
                )
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise InputError(
                f"{folder / PREPROCESSOR_CONFIG}: the image processor does not load ({why})"
            ) from exc
        # token_to_id, not get_vocab(): that builds a dict of the whole vocabulary (0.6 s for Qwen's)
        ids = [tok.backend_tokenizer.token_to_id(t) for t in (IMAGE_TOKEN, VISION_START, VISION_END)]
        missing = [t for t, i in zip((IMAGE_TOKEN, VISION_START, VISION_END), ids, strict=True) if i is None]
        if missing:
            raise InputError(f"{folder}: the tokenizer lacks the image tokens {', '.join(missing)}")
        merge = int(getattr(processor, "merge_size", 1) or 1)
        return cls(processor, ids[0], ids[1], ids[2], merge)

    @property
    def special_ids(self) -> np.ndarray:
        return np.asarray([self.image_id, self.start_id, self.end_id], dtype=np.int32)

    def grid(self, sha256: str, data: bytes, width: int, height: int) -> tuple[int, int, int]:
        """The image's (t, h, w) patch grid, as the processor computes it (cached by content)."""
        hit = self.grids.get(sha256)
        if hit is None:
            hit = self._fast_grid(width, height)
            if hit is None or self.checked < CHECKED_GRIDS:
                full = self._full_grid(data)
                if hit is not None and hit != full:
                    raise InputError(
                        f"the grid from the image's size {hit} differs from the processor's {full}"
                    )
                self.checked += hit is not None
                hit = full
            self.grids[sha256] = hit
        return hit

    def _fast_grid(self, width: int, height: int) -> tuple[int, int, int] | None:
        """Qwen2-VL's family: the grid from the size through the processor module's own smart_resize."""
        p = self.processor
        resize = getattr(sys.modules.get(type(p).__module__), "smart_resize", None)
        size = getattr(p, "size", None) or {}
        lo, hi = size.get("shortest_edge"), size.get("longest_edge")
        patch = getattr(p, "patch_size", None)
        if resize is None or not (lo and hi and patch) or not getattr(p, "do_resize", True):
            return None
        try:
            h, w = resize(height, width, factor=patch * self.merge_size, min_pixels=lo, max_pixels=hi)
        except ValueError as exc:  # an aspect ratio over the processor's limit
            raise RowRejected("image_unreadable", f"the image processor refuses it: {exc}") from None
        return 1, h // patch, w // patch

    def _full_grid(self, data: bytes) -> tuple[int, int, int]:
        import io

        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
        try:
            out = self.processor(images=[rgb])
        except ValueError as exc:
            raise RowRejected("image_unreadable", f"the image processor refuses it: {exc}") from None
        t, h, w = (int(v) for v in np.asarray(out["image_grid_thw"])[0])
        return t, h, w

    def forget_if_full(self) -> None:
        """Start the caches again past MAX_REMEMBERED entries: a job of a million distinct pictures
        must not hold a million of each in every process."""
        if max(len(self.seen), len(self.grids), len(self.emitted)) > MAX_REMEMBERED:
            self.seen.clear()
            self.grids.clear()
            self.emitted.clear()

    def tokens(self, grid: tuple[int, int, int]) -> int:
        """Image tokens of an image of `grid`: t*h*w patches, merge_size^2 to a token."""
        t, h, w = grid
        return t * h * w // (self.merge_size * self.merge_size)


@dataclass(slots=True)
class Picture:
    """One checked image of a row: its message, stored name, grid, token count and bytes."""

    message: int
    name: str
    grid: tuple[int, int, int]
    tokens: int
    ref: ImageRef
    data: bytes | None  # None: checked before in this process (Vision.seen), not read again


def _identity(ref: ImageRef) -> tuple[Any, ...] | None:
    """What identifies an image's bytes without reading a file: None for a URL or a missing file."""
    import hashlib
    import os

    if ref.data is not None:
        return ("data", hashlib.sha256(ref.data).hexdigest())
    if ref.path is not None:
        try:
            st = os.stat(ref.path)
        except OSError:
            return None
        return ("file", ref.path, st.st_size, st.st_mtime_ns)
    return None


@dataclass(slots=True)
class _RowImages:
    pictures: list[Picture]  # the images the row renders, in order


class ChunkImages:
    """The images of one chunk's rows, from the check to the stored names (see the module docstring)."""

    def __init__(self, vision: Vision | None, target: str, roots: tuple[str, ...] | None = None):
        from draftdeck.formats.images import ImageLimits

        self.vision = vision
        self.target = target
        self.limits = ImageLimits(roots=roots)  # image files only from `roots` (the service's data roots)
        self._items: dict[int, list[Picture]] = {}
        self._rows: dict[int, _RowImages] = {}
        self.bad: dict[int, str] = {}  # rendered row -> why it is rejected (template_error)
        self.files: dict[str, bytes] = {}  # name -> bytes of the images of the kept rows
        self._kept: dict[int, list[Picture]] = {}  # rendered row -> its pictures that fit

    def prepare(self, item: ImageItem) -> None:
        """Check `item`'s images; raise RowRejected with the code that rejects the row."""
        if not item.images:
            return
        if self.vision is None:
            raise RowRejected(
                "multimodal_content",
                f"the row holds {len(item.images)} image(s); the target {self.target} reads none "
                f"(no {PREPROCESSOR_CONFIG}: a text model)",
            )
        from draftdeck.formats.images import check

        for i, m in enumerate(item.messages):
            content = m.get("content")
            have = sum(1 for e in item.images if e["message"] == i)
            parts = sum(1 for p in content if p.get("type") == "image") if isinstance(content, list) else 0
            if have and parts != have:
                raise RowRejected(
                    "image_placeholder_mismatch",
                    f"message {i} has {have} image(s) and {parts} {IMAGE_PLACEHOLDER} placeholder(s)",
                )
            if have and m.get("role") != "user" and m.get("role") != "tool":
                raise RowRejected(
                    "multimodal_content",
                    f"message {i} ({m.get('role')}) holds an image: images are read in user turns; "
                    "no drafter generates one",
                )
        pictures = []
        self.vision.forget_if_full()
        seen = self.vision.seen
        for j, entry in enumerate(item.images):
            ref = _ref(entry)
            key = _identity(ref)
            hit = seen.get(key) if key is not None else None
            data = None
            if hit is None:
                got = check(ref, self.limits, where=f"image {j}")
                hit = got.name, self.vision.grid(got.sha256, got.data, got.width, got.height)
                data = got.data
                if key is not None:
                    seen[key] = hit
            name, grid = hit
            pictures.append(Picture(int(entry["message"]), name, grid, self.vision.tokens(grid), ref, data))
        self._items[id(item)] = pictures

    def expand(
        self, rendered: list[RenderedRow], encoded: list[Encoded], owners: Sequence[ImageItem]
    ) -> list[Encoded]:
        """Each image token of each row repeated to its image's token count (the copies at the same
        character); rows whose image tokens do not match their images go to :attr:`bad`."""
        if self.vision is None or not self._items:
            return encoded
        out = list(encoded)
        image_id = self.vision.image_id
        for k, (row, (ids, starts)) in enumerate(zip(rendered, encoded, strict=True)):
            pictures = self._items.get(id(owners[k]))
            if not pictures:
                continue
            if row.turn != -1:  # a split row renders the conversation through its answer only
                pictures = [p for p in pictures if p.message <= max(row.answers)]
            at = np.flatnonzero(ids == image_id)
            if len(at) != len(pictures):
                self.bad[k] = (
                    f"the chat template rendered {len(at)} {IMAGE_TOKEN} for {len(pictures)} image(s): "
                    "it drops or repeats image parts"
                )
                continue
            counts = np.ones(len(ids), dtype=np.int64)
            counts[at] = [p.tokens for p in pictures]
            out[k] = (np.repeat(ids, counts).astype(np.int32), np.repeat(starts, counts))
            self._rows[k] = _RowImages(pictures)
        return out

    def fit(
        self, k: int, ids: np.ndarray, mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[str], list[int]]:
        """Rendered row `k` as kept (after truncation): an image cut in the middle left out whole with
        its start token, the mask 0 on every image and vision token; its images' names and grids."""
        row = self._rows.get(k)
        if row is None or self.vision is None:
            return ids, mask, [], []
        # the runs of image tokens as they are now (the target's recorded ids may have moved them)
        at = np.flatnonzero(ids == self.vision.image_id)
        runs = np.split(at, np.flatnonzero(np.diff(at) > 1) + 1) if len(at) else []
        kept = [p for p, run in zip(row.pictures, runs, strict=False) if len(run) == p.tokens]
        if len(kept) < len(runs):  # an image cut by the truncation: cut before it and its start token
            start = int(runs[len(kept)][0])
            cut = start - 1 if start > 0 and ids[start - 1] == self.vision.start_id else start
            ids, mask = ids[:cut], mask[:cut]
        if len(ids) and ids[-1] == self.vision.start_id:  # a start token cut from its image's tokens
            ids, mask = ids[:-1], mask[:-1]
        mask = mask.copy()
        mask[np.isin(ids, self.vision.special_ids)] = 0
        self._kept[k] = kept
        return ids, mask, [p.name for p in kept], [v for p in kept for v in p.grid]

    def keep(self, k: int, report: Report) -> None:
        """Rendered row `k` is kept: the files of its images go to the writer (once per process), and the
        report counts its images and their tokens (``images``, ``image_tokens``)."""
        if self.vision is None or not self._kept.get(k):
            return
        report.counts["images"] += len(self._kept[k])
        report.counts["image_tokens"] += sum(p.tokens for p in self._kept[k])
        for p in self._kept[k]:
            if p.name not in self.vision.emitted:
                self.files[p.name] = p.data if p.data is not None else _read_again(p, self)
                self.vision.emitted.add(p.name)


def _read_again(p: Picture, images: ChunkImages) -> bytes:
    """The bytes of a picture checked earlier whose first rows were not kept: read and checked again."""
    from draftdeck.formats.images import check

    got = check(p.ref, images.limits)
    if got.name != p.name:
        raise InputError(f"{p.ref.path}: its bytes changed while the job ran ({p.name} -> {got.name})")
    return got.data


# -- the stored files ----------------------------------------------------------------------------------
def store_files(out_dir: Path, files: dict[str, bytes]) -> None:
    """Write each image once as ``out_dir/images/<name>`` (a temporary name, then the rename: a reader
    never sees half a file; an existing name is the same bytes). No fsync per file (6 ms each here, most
    of a job with pictures that never repeat): :func:`finalize` flushes them together, once, before the
    manifest makes the dataset finished."""
    if not files:
        return
    import os
    import tempfile

    from draftdeck.shards.store import IMAGES_DIR

    folder = Path(out_dir) / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = folder / name
        if path.is_file():
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{name[:16]}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def finalize(out_dir: Path, shards: Iterable[ShardInfo]) -> list[ImageFile] | None:
    """The image files the dataset's rows name, each checked against its name, for the manifest; the
    files no kept row names (an image of a rejected row) removed. None: a text dataset."""
    import hashlib

    import pyarrow as pa

    from draftdeck.errors import AccountingError
    from draftdeck.fileio import fsync_path
    from draftdeck.shards.manifest import ImageFile
    from draftdeck.shards.store import IMAGES_DIR, is_multimodal

    named: set[str] = set()
    multimodal = False
    for s in shards:
        with pa.memory_map(str(Path(out_dir) / s.filename), "r") as src:
            table = pa.ipc.open_stream(src).read_all()
        if is_multimodal(table.schema):
            multimodal = True
            named.update(x for names in table.column("images").to_pylist() for x in names)
    folder = Path(out_dir) / IMAGES_DIR
    if not multimodal:
        return None
    for path in folder.glob("*") if folder.is_dir() else ():
        if path.name not in named:
            path.unlink()
    out = []
    for name in sorted(named):
        path = folder / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise AccountingError(f"a row names the image {name}, which is not in {folder} ({exc})") from None
        digest = hashlib.sha256(data).hexdigest()
        if not name.startswith(digest + "."):
            raise AccountingError(f"{path}: its bytes hash to {digest}, not to its name")
        out.append(ImageFile(name, len(data), digest))
        fsync_path(path)  # written without an fsync (store_files): on disk before the manifest names it
    if out:
        fsync_path(folder)
    return out


def remove_images(out_dir: Path) -> None:
    """A failed run's image files (the output folder was empty when it began)."""
    import shutil

    from draftdeck.shards.store import IMAGES_DIR

    shutil.rmtree(Path(out_dir) / IMAGES_DIR, ignore_errors=True)
