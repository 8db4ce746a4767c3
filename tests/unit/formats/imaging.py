"""Real image files for the image tests: small PNGs and JPEGs drawn with PIL, each different."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image


def image_bytes(
    color: tuple[int, int, int] = (200, 30, 40), size: tuple[int, int] = (8, 6), fmt: str = "PNG"
) -> bytes:
    img = Image.new("RGB", size, color)
    img.putpixel((0, 0), (color[2], color[0], color[1]))  # not one flat colour: a real decode
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def write_image(
    path: Path, color: tuple[int, int, int] = (200, 30, 40), fmt: str = "PNG", size: tuple[int, int] = (8, 6)
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(color, size, fmt))
    return path


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
