"""Rows read as the readers read them, for the format tests: one JSON row parsed, or a file read
through read_conversations with its report's accounting checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftdeck.convert import ConvertOptions, read_conversations
from draftdeck.formats.common import ParseContext, ParseOptions
from draftdeck.formats.detect import parse
from draftdeck.formats.model import Conversation
from draftdeck.quality import Report


def parse_row(row: dict[str, Any], **opts: Any) -> tuple[str, list[Conversation], dict[str, str]]:
    """`row`'s family, its conversations and the warnings it raised, read with ParseOptions(**opts)."""
    ctx = ParseContext(ParseOptions(**opts))
    family, convs = parse(row, ctx)
    return family, convs, ctx.warnings


def read_file(path: Path, **opts: Any) -> tuple[list[Conversation], Report]:
    """Every conversation of `path` read with ConvertOptions(**opts), and the report, its counts checked."""
    report = Report()
    convs = list(read_conversations([path], report, ConvertOptions(**opts)))
    report.rows_out = len(convs)
    report.check_accounting()
    return convs, report
