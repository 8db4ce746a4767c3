"""Conversations from input files, for the tokenize job: the conversion pipeline's reader.

``draftdeck.convert.read_conversations`` detects every known chat shape and counts the reading
stage (rows in, expanded, rejected) into its report; the tokenize stage counts rows out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from draftdeck.formats.model import Conversation
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Report


def read_inputs(
    paths: Sequence[Path],
    report: Report,
    progress: Progress = no_progress,
    *,
    strict: bool = False,
    from_format: str | None = None,
    tool_tags: str = "parse",
    preference: str = "chosen",
    columns: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    image_roots: tuple[str, ...] | None = None,
) -> Iterator[Conversation]:
    """Conversations of `paths`; prompt-only rows are rejected as ``no_assistant_turn``; with
    `from_format` every row must have that shape (else ``format_mismatch``); with `image_roots`, an
    image file outside them is ``image_outside_roots``."""
    from draftdeck.convert import ConvertOptions, read_conversations
    from draftdeck.quality import Policy

    options = ConvertOptions(
        policy=Policy(strict=strict), from_format=from_format, tool_tags=tool_tags, preference=preference,
        columns=dict(columns or {}), tags=dict(tags or {}), image_roots=image_roots,
    )  # fmt: skip
    return read_conversations(list(paths), report, options, progress)
