"""What one convert (or tokenize, scan, regenerate) read may be told: :class:`ConvertOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftdeck.convert.placeholders import MODES, PlaceholderRule
from draftdeck.errors import UsageError
from draftdeck.formats.columns import check_mapping
from draftdeck.formats.common import IMAGE_MODES, ParseOptions
from draftdeck.formats.detect import check_format_name
from draftdeck.formats.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.quality import Policy

PROGRESS_EVERY_ROWS = 2048
TOOL_TAGS = ("parse", "keep")
PREFERENCE = ("chosen", "reject")


@dataclass
class ConvertOptions:
    """Options of reading and checking. Defaults suit training data (prompt-only rows rejected)."""

    policy: Policy = field(default_factory=Policy)
    allow_prompt_only: bool = False  # yield rows with no assistant turn (for regeneration)
    tree_paths: str = "all"  # "all": one conversation per leaf; "best": the best-ranked path only
    from_format: str | None = None  # one shape every row must have (draftdeck.formats.detect); None: detect
    tool_tags: str = "parse"  # Hermes <tool_call>/<tool_response> text: parse into structure, or keep as text
    preference: str = "chosen"  # a preference row: its chosen conversation, or reject the row
    # a declared column mapping (draftdeck.formats.columns): it reads every row instead of detection
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    placeholders: str = "reject"  # what a placeholder row becomes: reject | strip | keep
    placeholder_min_rows: int = 32
    placeholder_min_share: float = 0.2
    placeholder_filler_rows: int = 3
    placeholder_max_chars: int = 24
    placeholder_buffer: int = 4096
    check_duplicates: bool = True
    # convert only: worker processes for JSONL inputs larger than one chunk (1: all in this process);
    # see draftdeck.convert.parallel. Output and report are the same for any number of workers.
    workers: int = 1
    chunk_bytes: int = 4 << 20
    # images in the rows (draftdeck.formats.image_parts): keep (read, check, store in images_dir) or
    # reject (multimodal_content, for a text-only target); the limits of one image
    images: str = "keep"
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    images_dir: str | None = None  # where kept images are stored (convert: images/ beside its output)
    # the folders image files may be read from: the service's data roots (None: any, as for the CLI)
    image_roots: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"workers must be at least 1, not {self.workers}")
        if self.chunk_bytes < 1:
            raise UsageError("chunk_bytes must be positive")
        if self.tree_paths not in ("all", "best"):
            raise UsageError(f"tree paths must be 'all' or 'best', not {self.tree_paths!r}")
        try:
            check_format_name(self.from_format)
            check_mapping(self.columns, self.tags)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if self.placeholder_min_rows < 2:
            raise UsageError("placeholder_min_rows must be at least 2")
        if self.placeholder_filler_rows < 1:
            raise UsageError("placeholder_filler_rows must be at least 1")
        if not 0 <= self.placeholder_min_share <= 1:
            raise UsageError("placeholder_min_share must be between 0 and 1")
        if self.tool_tags not in TOOL_TAGS:
            raise UsageError(f"tool_tags must be one of {', '.join(TOOL_TAGS)}, not {self.tool_tags!r}")
        if self.preference not in PREFERENCE:
            raise UsageError(f"preference must be one of {', '.join(PREFERENCE)}, not {self.preference!r}")
        if self.images not in IMAGE_MODES:
            raise UsageError(f"images must be one of {', '.join(IMAGE_MODES)}, not {self.images!r}")
        if self.max_image_bytes < 1 or self.max_image_pixels < 1:
            raise UsageError("the image limits (max_image_bytes, max_image_pixels) must be positive")
        if self.placeholders not in MODES:
            raise UsageError(f"placeholders must be one of {', '.join(MODES)}, not {self.placeholders!r}")

    def parse_options(self) -> ParseOptions:
        """What each row's parser is told (the one-process reader and the workers alike)."""
        return ParseOptions(
            tree_paths=self.tree_paths,
            from_format=self.from_format,
            tool_tags=self.tool_tags,
            preference=self.preference,
            columns=tuple(self.columns.items()),
            tags=tuple(self.tags.items()),
            images=self.images,
            max_image_bytes=self.max_image_bytes,
            max_image_pixels=self.max_image_pixels,
            images_dir=self.images_dir,
            image_roots=self.image_roots,
        )

    @property
    def placeholder_rule(self) -> PlaceholderRule:
        return PlaceholderRule(
            self.placeholder_min_rows, self.placeholder_min_share, self.placeholder_filler_rows
        )
