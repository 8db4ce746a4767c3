"""The canonical conversation every reader produces and every writer and tokenizer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
# The field a converted row carries its original file and row in (OpenAI and ShareGPT JSONL: a
# top-level key, which trainers ignore; Parquet: inside `meta`): {"file": absolute path, "row": the
# 1-based line of a JSONL file, else the 0-based record}, what the shards' source/source_row hold.
# A row of a mix also names its mix source ("source": e.g. "chat"), which every writer keeps, so a mixed
# file converted or regenerated again still says where each row came from (the shards' mix_source).
PROVENANCE_KEY = "draftdeck_source"
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass(slots=True)
class ToolCall:
    """One tool call. `arguments` is the parsed JSON value; when the source held text that is not
    valid JSON, `arguments` is None and `raw_arguments` keeps the text as it was."""

    name: str
    arguments: Any = None
    raw_arguments: str | None = None
    id: str | None = None

    @property
    def arguments_valid(self) -> bool:
        return self.raw_arguments is None


# Where an image sits in a message's text: LLaMA-Factory's placeholder, which every reader writes in
# place of an image part, so a message's text keeps the images' order among its words. A message has as
# many placeholders as `images`; a row whose counts differ is rejected (`image_placeholder_mismatch`).
# A row without images keeps a literal "<image>" as text.
IMAGE_PLACEHOLDER = "<image>"


@dataclass(slots=True)
class ImageRef:
    """One image of a message, as the source gave it: exactly one of `path` (a local file, absolute),
    `data` (decoded bytes: a data URI, Anthropic base64) or `url` (http(s): never fetched, named). Once
    stored beside the shards, `sha256` names its content-addressed file (``images/<sha256>.<ext>``)."""

    path: str | None = None
    data: bytes | None = None
    url: str | None = None
    sha256: str | None = None
    mime: str | None = None  # as the source declared it ("image/png"), when it did


@dataclass(slots=True)
class Message:
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # for role == "tool": the call this result answers
    name: str | None = None  # tool name on tool results, or a participant name
    # A per-turn training flag from the source (OpenAI `weight`, xtuner `loss`, LLaMA-Factory
    # `loss_weight`, axolotl `weight`/`train`): False keeps an answer in the context and out of the
    # loss, True asks for it to be trained, None (no flag) trains assistant turns and nothing else.
    train: bool | None = None
    # Anthropic's `redacted_thinking`: the target's reasoning, encrypted. Kept so the row round-trips;
    # no template can show it, so it never reaches the tokens.
    redacted_reasoning: str | None = None
    is_error: bool = False  # a tool result that reports an error (Anthropic's `is_error`)
    # The token ids the answering model produced for this turn (regenerate records them): tokenize
    # trains on them as they are where they decode to the rendered turn, instead of re-encoding text.
    token_ids: list[int] | None = None
    # The message's images in order, one per IMAGE_PLACEHOLDER in `content` (empty: a text message)
    images: list[ImageRef] = field(default_factory=list)

    @property
    def trained(self) -> bool:
        """Whether this message's tokens are in the loss."""
        return self.role == "assistant" and self.train is not False

    @property
    def is_empty(self) -> bool:
        return not self.content.strip() and not (self.reasoning or "").strip() and not self.tool_calls


@dataclass(slots=True)
class SourceRef:
    """Where a conversation came from: file, 1-based line (JSONL) or 0-based index, and the row's id."""

    file: str
    line: int | None = None
    index: int | None = None
    id: str | None = None
    path: str | None = None  # for trees: which branch, e.g. "0.1.0"

    @property
    def where(self) -> str:
        loc = (
            f":{self.line}"
            if self.line is not None
            else (f"[{self.index}]" if self.index is not None else "")
        )
        return f"{self.file}{loc}" + (f"#{self.path}" if self.path else "")


@dataclass(slots=True)
class Conversation:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    source: SourceRef | None = None
    source_format: str = "unknown"  # detected family: a shape name of draftdeck.formats.detect
    meta: dict[str, Any] = field(default_factory=dict)  # fields kept verbatim that the model has no place for
    # the warning codes the checks gave this kept row (convert's reader): tokenize stores them per row
    warnings: list[str] = field(default_factory=list)

    def origin(self) -> tuple[str, int] | None:
        """(file, row) of the original data: the provenance a converted row carries (so a file
        converted twice still names the first one), else where this conversation was read."""
        src = self.source
        if src is None:
            return origin_of(self.meta.get(PROVENANCE_KEY), None, None)
        return origin_of(
            self.meta.get(PROVENANCE_KEY), src.file, src.line if src.line is not None else src.index
        )

    @property
    def mix_source(self) -> str:
        """The name of the mix source this row came from ("" when it is not from a mix)."""
        return mix_source_of(self.meta.get(PROVENANCE_KEY))

    def origin_record(self) -> dict[str, Any] | None:
        """The PROVENANCE_KEY value a writer gives this row (None: nothing is known of its origin)."""
        origin = self.origin()
        kept = self.meta.get(PROVENANCE_KEY)
        return None if origin is None else provenance_value(origin, self.mix_source, repeat_of(kept))

    @property
    def has_assistant(self) -> bool:
        return any(m.role == "assistant" for m in self.messages)

    @property
    def has_user(self) -> bool:
        return any(m.role == "user" for m in self.messages)


def origin_of(kept: Any, file: str | None, row: int | None) -> tuple[str, int] | None:
    """(file, row) of a row's original data: its kept PROVENANCE_KEY value when that is well formed,
    else `file` and `row` (where it was read), else None."""
    if isinstance(kept, dict):
        kept_file, kept_row = kept.get("file"), kept.get("row")
        if isinstance(kept_file, str) and kept_file and type(kept_row) is int:
            return kept_file, kept_row
    return (file, row) if file and row is not None else None


def mix_source_of(kept: Any) -> str:
    """The mix source name of a row's kept PROVENANCE_KEY value ("" when it has no well-formed one)."""
    name = kept.get("source") if isinstance(kept, dict) else None
    return name if isinstance(name, str) and name else ""


def repeat_of(kept: Any) -> int:
    """Which repeat of its row an upsampled mix row is (1, 2, ...; 0: the row itself, or not a mix's):
    a declared repeat is not a duplicate (its duplicate key counts it)."""
    n = kept.get("repeat") if isinstance(kept, dict) else None
    return n if type(n) is int and n > 0 else 0


def provenance_value(origin: tuple[str, int], mix_source: str = "", repeat: int = 0) -> dict[str, Any]:
    """The PROVENANCE_KEY value every writer writes: {"file", "row"}, "source" for a mix's row and
    "repeat" for a repeat an upsampled source gave."""
    out: dict[str, Any] = {"file": origin[0], "row": origin[1]}
    if mix_source:
        out["source"] = mix_source
    if repeat:
        out["repeat"] = repeat
    return out
