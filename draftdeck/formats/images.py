"""Images in the data: where an image part points (a data URI, a file, a URL), its bytes, the checks
that reject a row naming why, and the content-addressed store beside a dataset.

Every reader turns an image part into an :class:`~draftdeck.formats.model.ImageRef`; :func:`check`
loads its bytes and proves it is an image a processor can open; :func:`store` writes it once as
``<sha256>.<ext>`` in an images folder, so a picture shared by a thousand rows is one file.

The rejections, each an issue code of :mod:`draftdeck.quality`:

- ``image_missing``: the file named is not there (or is not a file);
- ``image_unreadable``: the bytes are not an image PIL can decode (or the data URI is not base64);
- ``image_too_large``: over :class:`ImageLimits` (bytes, or width x height in pixels);
- ``image_url_unread``: an http(s) or other remote URL. DraftDeck never fetches one: a dataset that
  trains differently on each run, and a server that can be made to fetch for others, are worse than
  a rejection that names the URL (download the images and point at the files instead);
- ``image_outside_roots``: a file outside :attr:`ImageLimits.roots` (the service's data roots), after
  symlinks and ``..`` are resolved. A row is data someone submitted: without this, a job run by the
  service would copy any image file the worker can read (``/root/...``, ``../../x.png``) into its output.

An http URL is never fetched here or anywhere else; a file path is read as given (absolute, after the
reader resolved it against the input file's folder), or, with roots, as the real path it resolves to.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, unquote_to_bytes, urlparse

from draftdeck.formats.model import IMAGE_PLACEHOLDER, ImageRef, Message
from draftdeck.formats.rejected import RowRejected, keys_of
from draftdeck.paths import inside_roots

# The folder of stored images beside a written file (convert's output) or a dataset's shards: one folder
# per place, shared by every file written there (content-addressed: nothing in it is duplicated), and
# the name LLaMA-Factory's datasets use. Written rows point at ``images/<sha256>.<ext>``.
IMAGES_DIR = "images"

# What a browser shows in an <img> (the sample page serves only these)
BROWSER_EXTENSIONS = frozenset({"jpg", "png", "gif", "webp", "bmp"})
_REMOTE_SCHEMES = ("http", "https", "ftp", "s3", "gs", "hf", "az", "abfs")


class ImageSite(Protocol):
    """What reading an image part needs of the reader's context (a ParseContext is one): the input
    file's folder, which relative paths are relative to, and a flag that the rows hold images."""

    images: bool
    base_dir: str | None


# 20 MiB: OpenAI's own limit on one image input; larger files are scans or raw photos that a processor
# shrinks to a few megapixels anyway (draftdeck.formats.images checks both limits).
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
# 8192 x 8192: far above what Qwen's processors keep (about 12.8 megapixels before resizing), and below
# PIL's decompression-bomb guard (about 89 megapixels), which would otherwise warn first.
DEFAULT_MAX_IMAGE_PIXELS = 8192 * 8192


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What image a row may hold: at most `max_bytes` of encoded file and `max_pixels` of width x
    height; a file only from inside `roots` (absolute folders; None: any file this process can read,
    as for the CLI run by a user on their own files; the service gives its data roots)."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    roots: tuple[str, ...] | None = None


DEFAULT_LIMITS = ImageLimits()


@dataclass(frozen=True, slots=True)
class CheckedImage:
    """An image that passed :func:`check`: its bytes, their sha256, the real format (sniffed from the
    bytes, whatever the file's name or the declared mime said) and its size."""

    data: bytes
    sha256: str
    format: str  # PIL's name: "PNG", "JPEG"...
    width: int
    height: int

    @property
    def mime(self) -> str:
        from PIL import Image

        Image.init()  # PIL fills its MIME table as it loads its format plugins
        return Image.MIME.get(self.format) or f"image/{self.format.lower()}"

    @property
    def ext(self) -> str:
        return extension_of(self.mime)

    @property
    def name(self) -> str:
        """The stored file's name: ``<sha256>.<ext>``."""
        return f"{self.sha256}.{self.ext}"


# -- where a part points ---------------------------------------------------------------------------
def ref_from_uri(uri: str, base_dir: str | None, where: str) -> ImageRef:
    """An image part's address as an ImageRef: a ``data:`` URI decoded, an http(s) (or other remote)
    URL kept unread, a ``file:`` URI or a bare path resolved against `base_dir` (the input file's
    folder; None: the working directory)."""
    if not isinstance(uri, str) or not uri.strip():
        raise RowRejected("image_missing", f"{where} names no image (an empty address)")
    uri = uri.strip()
    head = uri[:16].lower()
    if head.startswith("data:"):
        return data_uri_ref(uri, where)
    scheme = urlparse(uri).scheme.lower() if ":" in head else ""
    if scheme in _REMOTE_SCHEMES or ("://" in head and scheme not in ("file", "")):
        return ImageRef(url=uri)
    if scheme == "file":
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            return ImageRef(url=uri)  # a file on another host: as remote as http
        return ImageRef(path=resolve_path(unquote(parsed.path), base_dir))
    return ImageRef(path=resolve_path(uri, base_dir))


def resolve_path(path: str, base_dir: str | None) -> str:
    """`path` absolute: a relative path is relative to `base_dir` (the input file's folder)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base_dir or os.getcwd()) / p
    return os.path.normpath(p)


def data_uri_ref(uri: str, where: str) -> ImageRef:
    """``data:[<mime>][;base64],<payload>`` decoded to bytes (the mime kept as declared)."""
    header, sep, payload = uri.partition(",")
    if not sep:
        raise RowRejected("image_unreadable", f"{where} is a data URI without a comma (no payload)")
    params = header[5:].split(";")
    mime = params[0].strip().lower() or None
    try:
        if "base64" in (p.strip().lower() for p in params[1:]):
            import base64  # (here: rows with images are rare; binascii.Error is a ValueError)

            data = base64.b64decode(payload.strip(), validate=False)
        else:
            data = unquote_to_bytes(payload)
    except ValueError as exc:
        raise RowRejected(
            "image_unreadable", f"{where} is a data URI whose base64 is broken ({exc})"
        ) from None
    return ImageRef(data=data, mime=mime)


def base64_ref(payload: Any, mime: Any, where: str) -> ImageRef:
    """Anthropic's ``{"type": "base64", "media_type", "data"}`` source as an ImageRef."""
    if not isinstance(payload, str) or not payload:
        raise RowRejected("image_unreadable", f"{where} holds no base64 data")
    import base64

    try:
        data = base64.b64decode(payload.strip(), validate=False)
    except ValueError as exc:
        raise RowRejected("image_unreadable", f"{where} holds broken base64 ({exc})") from None
    return ImageRef(data=data, mime=mime if isinstance(mime, str) else None)


def describe(ref: ImageRef) -> str:
    """The image as a reason names it: its URL, its path, or its size in bytes."""
    if ref.url is not None:
        return ref.url if len(ref.url) <= 200 else ref.url[:197] + "..."
    if ref.path is not None:
        return ref.path
    return f"{len(ref.data or b'')} bytes of {ref.mime or 'image'} data"


# -- bytes and checks ------------------------------------------------------------------------------
def image_bytes(ref: ImageRef, limits: ImageLimits = DEFAULT_LIMITS, where: str = "image") -> bytes:
    """The image's encoded bytes. A URL is never fetched: ``image_url_unread``; a path that is not a
    file: ``image_missing``; more bytes than the limit: ``image_too_large`` (a file is not read then)."""
    if ref.url is not None:
        raise RowRejected("image_url_unread", f"{where} is a URL, which DraftDeck never fetches: {ref.url}")
    if ref.data is not None:
        data = ref.data
    elif ref.path is not None:
        # confined first: whether a file outside the roots exists is none of the row's business
        path = confined(ref.path, limits.roots, where)
        try:
            size = os.stat(path).st_size
            if not os.path.isfile(path):
                raise FileNotFoundError(path)
        except (FileNotFoundError, NotADirectoryError):
            raise RowRejected("image_missing", f"{where}: no image file at {ref.path}") from None
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            raise RowRejected("image_unreadable", f"{where}: {ref.path!r} cannot be read ({exc})") from None
        if size > limits.max_bytes:
            raise RowRejected(
                "image_too_large", f"{where}: {ref.path} is {size:,} bytes (limit {limits.max_bytes:,})"
            )
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise RowRejected("image_unreadable", f"{where}: {ref.path} cannot be read ({exc})") from None
    else:
        raise RowRejected("image_missing", f"{where} names no image (no path, data or URL)")
    if len(data) > limits.max_bytes:
        raise RowRejected(
            "image_too_large", f"{where}: {describe(ref)} is {len(data):,} bytes (limit {limits.max_bytes:,})"
        )
    return data


def confined(path: str, roots: tuple[str, ...] | None, where: str = "image") -> str:
    """The file to read for `path`: with `roots`, its real path (symlinks and ``..`` resolved, so a
    link inside a root that points outside is outside, and the file checked is the file read), which
    must lie inside one of them, else ``image_outside_roots`` naming the roots; `path` itself when
    `roots` is None."""
    if roots is None:
        return path
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
        raise RowRejected("image_unreadable", f"{where}: {path!r} cannot be resolved ({exc})") from None
    if inside_roots(real, [Path(r).resolve() for r in roots]):
        return str(real)
    meant = "" if str(real) == path else f" (it resolves to {real})"
    raise RowRejected(
        "image_outside_roots",
        f"{where}: {path}{meant} is outside the data roots ({', '.join(roots)}); a job run by the "
        "service reads image files only there",
    )


def check_bytes(data: bytes, limits: ImageLimits = DEFAULT_LIMITS, where: str = "image") -> CheckedImage:
    """Prove `data` is an image PIL decodes whole (verify, then a full load: a truncated JPEG passes
    verify alone) within the pixel limit; its real format sniffed from the bytes."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                fmt, (width, height) = img.format or "", img.size
                if width * height > limits.max_pixels:
                    raise RowRejected(
                        "image_too_large",
                        f"{where} is {width} x {height} pixels (limit {limits.max_pixels:,} pixels)",
                    )
                img.verify()
            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except RowRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise RowRejected("image_too_large", f"{where}: {exc}") from None
    except UnidentifiedImageError:
        raise RowRejected(
            "image_unreadable", f"{where} is not an image PIL can open ({_magic(data)})"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # PIL's errors for broken data
        raise RowRejected("image_unreadable", f"{where} is a broken {fmt or 'image'} file ({exc})") from None
    if not fmt:
        raise RowRejected("image_unreadable", f"{where}: PIL opened it but names no format")
    return CheckedImage(data, hashlib.sha256(data).hexdigest(), fmt, width, height)


def _magic(data: bytes) -> str:
    return f"{len(data)} bytes starting {data[:8]!r}" if data else "no bytes"


def check(ref: ImageRef, limits: ImageLimits = DEFAULT_LIMITS, where: str = "image") -> CheckedImage:
    """Load and check one image (`ref` is left as it is: its sha256 names a stored file, which only
    :func:`store` writes). Raises RowRejected with one of the image codes."""
    return check_bytes(image_bytes(ref, limits, where), limits, f"{where} ({describe(ref)})")


def has_images(messages: list[Message]) -> bool:
    return any(m.images for m in messages)


def check_placeholders(messages: list[Message], where: str = "") -> None:
    """In a conversation with images, every message has as many IMAGE_PLACEHOLDERs as images, or no one
    can say which image goes where: ``image_placeholder_mismatch``. (Without images, a literal
    "<image>" is text.)"""
    if not has_images(messages):
        return
    for i, msg in enumerate(messages):
        placeholders = msg.content.count(IMAGE_PLACEHOLDER)
        if placeholders != len(msg.images):
            raise RowRejected(
                "image_placeholder_mismatch",
                f"{where}message {i} ({msg.role}) has {len(msg.images)} image(s) and "
                f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s)",
            )


def check_messages(
    messages: list[Message],
    limits: ImageLimits = DEFAULT_LIMITS,
    where: str = "",
    folder: str | Path | None = None,
) -> int:
    """Check a conversation's placeholders and every image; with `folder`, store each there (see
    :func:`store`). Returns the number of images. `where` prefixes the reasons."""
    check_placeholders(messages, where)
    n = 0
    for i, msg in enumerate(messages):
        for j, ref in enumerate(msg.images):
            checked = check(ref, limits, f"{where}image {j + 1} of message {i} ({msg.role})")
            if folder is not None:
                _stored(ref, checked, folder)
            n += 1
    return n


# -- the content-addressed store -------------------------------------------------------------------
def store(ref: ImageRef, folder: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> str:
    """Write the image once as ``<folder>/<sha256>.<ext>`` and return that name; `ref.sha256` and
    `ref.mime` then name the stored file (its real format, whatever the source declared).

    Atomic: the bytes go to a temporary file in `folder`, then take the name with os.replace, so a
    reader never sees half a file and two writers of the same image (two worker processes) leave one.
    An existing file of that name is the same content (the name is its hash): it is not written again,
    and an image already stored there is not even read again."""
    name = stored_name(ref)
    if name is not None and (Path(folder) / name).is_file():
        return name
    return _stored(ref, check(ref, limits), folder)


def _stored(ref: ImageRef, checked: CheckedImage, folder: str | Path) -> str:
    name = store_checked(checked, folder)
    ref.sha256, ref.mime = checked.sha256, checked.mime
    return name


def store_checked(checked: CheckedImage, folder: str | Path) -> str:
    folder = Path(folder)
    name = checked.name
    final = folder / name
    if final.is_file():
        return name
    folder.mkdir(parents=True, exist_ok=True)
    import tempfile  # (here: a convert without images never needs it)

    fd, tmp = tempfile.mkstemp(prefix=f".{checked.sha256[:16]}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(checked.data)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return name


def stored_name(ref: ImageRef) -> str | None:
    """The name of the file :func:`store` wrote for `ref` (None: not stored)."""
    if ref.sha256 is None:
        return None
    return f"{ref.sha256}.{extension_of(ref.mime)}"


def extension_of(mime: str | None) -> str:
    """The stored file's extension for a (real, sniffed) mime type."""
    sub = (mime or "").partition("/")[2].lower()
    return {"jpeg": "jpg", "mpo": "jpg", "x-ms-bmp": "bmp", "x-icon": "ico", "vnd.microsoft.icon": "ico"}.get(
        sub, sub
    ) or "bin"


def is_stored_name(name: str) -> bool:
    """Whether `name` has the shape of a stored image's name (a sha256 in hex, a dot, an extension):
    what the sample page's image route serves, and nothing else."""
    stem, dot, ext = name.partition(".")
    return (
        bool(dot)
        and len(stem) == 64
        and all(c in "0123456789abcdef" for c in stem)
        and 1 <= len(ext) <= 5
        and ext.isalnum()
        and ext.isascii()
        and ext.islower()
    )


def address(ref: ImageRef) -> str:
    """What a writer puts where the image goes: ``images/<name>`` (relative to the written file's
    folder) once stored there, else the source's own address (its absolute path, its URL, or a data
    URI of its bytes)."""
    name = stored_name(ref)
    if name is not None:
        return f"{IMAGES_DIR}/{name}"
    if ref.path is not None:
        return ref.path
    if ref.url is not None:
        return ref.url
    import base64

    return (
        f"data:{ref.mime or 'application/octet-stream'};base64,{base64.b64encode(ref.data or b'').decode()}"
    )


def to_pil(ref: ImageRef, limits: ImageLimits = DEFAULT_LIMITS) -> Any:
    """The image as an RGB PIL image (what an image processor takes), checked first."""
    from PIL import Image

    checked = check(ref, limits)
    with Image.open(io.BytesIO(checked.data)) as img:
        return img.convert("RGB")


# -- an image content part as the readers meet it ---------------------------------------------------
def image_part(part: dict[str, Any], kind: str, where: str, ctx: ImageSite) -> ImageRef:
    """The image of one content part (OpenAI, Responses API, chat-template or Anthropic shape)."""
    ctx.images = True
    source = part.get("source")
    if isinstance(source, dict):
        return anthropic_source(source, f"{where}.source", ctx)
    for key in ("image_url", "url", "image", "path"):
        value = part.get(key)
        if isinstance(value, dict):
            if isinstance(value.get("bytes"), bytes | bytearray):  # a Hugging Face image struct
                return ImageRef(data=bytes(value["bytes"]))
            value = value.get("url", value.get("path"))
        if isinstance(value, str) and value:
            return ref_from_uri(value, ctx.base_dir, f"{where}.{key}")
    b64 = part.get("base64", part.get("data"))
    if isinstance(b64, str):
        return base64_ref(b64, part.get("mime_type", part.get("media_type")), f"{where}.base64")
    inner = part.get(kind)
    file_id = part.get("file_id") or (inner.get("file_id") if isinstance(inner, dict) else None)
    if isinstance(file_id, str):
        raise RowRejected(
            "image_url_unread", f"{where} names OpenAI file {file_id!r}, which DraftDeck never fetches"
        )
    raise RowRejected("image_missing", f"{where} is a {kind!r} part that names no image ({keys_of(part)})")


def anthropic_source(source: dict[str, Any], where: str, ctx: ImageSite) -> ImageRef:
    """An Anthropic image block's ``source``: base64 data, a URL (never fetched) or a Files API id."""
    ctx.images = True
    kind = source.get("type")
    if kind == "base64":
        return base64_ref(source.get("data"), source.get("media_type"), where)
    if kind == "url" and isinstance(source.get("url"), str):
        return ref_from_uri(source["url"], ctx.base_dir, where)
    if kind == "file":
        raise RowRejected(
            "image_url_unread",
            f"{where} names Anthropic file {source.get('file_id')!r}, which DraftDeck never fetches",
        )
    raise RowRejected("image_missing", f"{where} is a {kind!r} source, which holds no image DraftDeck reads")
