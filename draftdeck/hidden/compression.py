"""How a hidden-state cache's shards are compressed, as options and manifests name it: torch-free, so the
job parameters that parse it (read by the web process, which never imports torch) can."""

from __future__ import annotations

ZSTD_LEVELS = range(1, 23)


def parse_compression(text: str | None) -> str | None:
    """``zstd`` or ``zstd:LEVEL`` (1-22; 3 when not given) as the manifest names it, ``zstd:3``; None or
    ``none``: uncompressed."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    codec, _, level = text.strip().lower().partition(":")
    if codec != "zstd" or (level and not level.isdigit()) or int(level or 3) not in ZSTD_LEVELS:
        raise ValueError(f"compression {text!r}: zstd or zstd:LEVEL (LEVEL 1-22), or none")
    return f"zstd:{int(level or 3)}"
