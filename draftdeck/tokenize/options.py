"""What one tokenize run is told: :class:`TokenizeOptions` (the pipeline and the per-chunk row work
both read it, so it lives apart from both)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftdeck.chat.coverage import DROPPED
from draftdeck.errors import UsageError
from draftdeck.issue_codes import Action
from draftdeck.quality import LOSSES, Policy, Rule


@dataclass
class TokenizeOptions:
    tokenizer: Path
    chat_template: Path | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    seq_length: int | None = None
    max_positions: int | None = None  # most tokens the target reads (None: its config's, if beside)
    truncation: Literal["right", "drop"] = "right"
    on_missing: Literal["error", "drop"] = "error"
    shard_rows: int = 10_000
    verify_all: bool = False
    verify_every: int = 32
    strict: bool = False
    max_rejected: float | None = None  # fail past this share of rejected rows (the job's default: 0.5)
    alert_rejected: float | None = None  # alert thresholds (draftdeck.quality.LOSSES)
    alert_duplicated: float | None = None
    alert_truncated: float | None = None
    encoder: Literal["auto", "hf", "tiktoken"] = "auto"
    from_format: str | None = None  # one input shape every row must have (draftdeck.formats.detect)
    columns: dict[str, str] = field(default_factory=dict)  # a declared mapping (draftdeck.formats.columns)
    tags: dict[str, str] = field(default_factory=dict)
    tool_tags: Literal["parse", "keep"] = "parse"  # Hermes tags in text (draftdeck.formats.hermes)
    preference: Literal["chosen", "reject"] = "chosen"  # preference rows (draftdeck.formats.preference)
    # parts the template may drop on purpose (draftdeck.chat.coverage): warned, the row kept
    template_may_drop: list[str] = field(default_factory=list)
    workers: int = 0  # 0: one per CPU core
    chunk_size: int = 256
    # the folders image files may be read from: the service's data roots (None: any, as for the CLI)
    image_roots: tuple[str, ...] | None = None

    def reading(self) -> dict[str, Any]:
        """What reading the inputs is told (:func:`draftdeck.tokenize.inputs.read_inputs`)."""
        return {"strict": self.strict, "from_format": self.from_format, "tool_tags": self.tool_tags,
                "preference": self.preference, "columns": self.columns, "tags": self.tags,
                "image_roots": self.image_roots}  # fmt: skip

    def check(self) -> None:
        if self.seq_length is not None and self.seq_length < 2:
            raise UsageError("--seq-length must be at least 2")
        if self.truncation not in ("right", "drop"):
            raise UsageError(f"--truncation must be right or drop, not {self.truncation!r}")
        if self.on_missing not in ("error", "drop"):
            raise UsageError(f"--on-missing must be error or drop, not {self.on_missing!r}")
        if self.shard_rows < 1:
            raise UsageError("--shard-rows must be at least 1")
        unknown = set(self.template_may_drop) - set(DROPPED)
        if unknown:
            raise UsageError(
                f"template_may_drop: {', '.join(sorted(unknown))} is not a part; parts: {', '.join(DROPPED)}"
            )
        if self.encoder not in ("auto", "hf", "tiktoken"):
            raise UsageError(f"encoder must be auto, hf or tiktoken, not {self.encoder!r}")

    def policy(self) -> Policy:
        """The job's verdict on the finished report: strict, the rejected share, the alert shares."""
        alerts = {k: getattr(self, k) for k in LOSSES}
        policy = Policy.build(None, self.strict, self.max_rejected, **alerts)
        for part in self.template_may_drop:
            policy.rules[DROPPED[part]] = Rule(Action.WARN)
        return policy

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("image_roots")  # where the service let it read, not how the dataset was made
        d["tokenizer"] = str(self.tokenizer)
        d["chat_template"] = str(self.chat_template) if self.chat_template else None
        return d
