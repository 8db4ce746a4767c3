"""The parameters of a `regenerate` job (the CLI, the job system and tests build the same model)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import Field, model_validator

from draftdeck.formats.detect import FormatName
from draftdeck.jobs.params import (
    JobParams,
    alert_field,
    columns_field,
    from_format_field,
    inputs_field,
    loss_thresholds,
    max_rejected_field,
    tags_field,
)
from draftdeck.quality import Policy


class RegenerateParams(JobParams):
    """Regenerate the assistant turns of `inputs` with a target model; write OpenAI JSONL to `out`.

    Exactly one backend: `endpoints` (OpenAI-compatible servers, round-robin) or `local` (a model
    folder generated with transformers in this process).
    """

    inputs: list[str] = inputs_field("data files or folders of any shape convert reads")
    out: str = Field(min_length=1, description="output OpenAI messages JSONL (written atomically)")
    endpoints: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="base URLs of OpenAI-compatible servers (with or without /v1); repeat for round-robin",
        json_schema_extra={"cli_flag": "--endpoint"},
    )
    model: str | None = Field(None, description="model name as the server lists it in /v1/models")
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description="environment variable holding the servers' bearer token, read where the job runs"
        " (the key itself never enters the parameters, the job row, the rows or the report)",
    )
    local: str | None = Field(None, description="a model folder to generate with transformers instead")
    device: str = Field("cpu", description="torch device of the local backend (cpu, cuda, cuda:1)")
    max_tokens: int = Field(1024, ge=1, le=1_000_000, description="most tokens per answer")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    seed: int | None = Field(None, ge=0, description="sampling seed sent with every request")
    concurrency: int = Field(8, ge=1, le=1024, description="requests in flight (local: batch size)")
    timeout_s: float = Field(120.0, gt=0, le=86_400, description="seconds per request before it fails")
    retries: int = Field(4, ge=0, le=100, description="retries on 429, 5xx and connection errors")
    backoff_s: float = Field(0.5, ge=0, le=600, description="first retry delay; doubles, with jitter")
    reasoning: bool = Field(
        True, description="ask for reasoning (enable_thinking); off: reasoning in the content is rejected"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to the chat template (overrides `reasoning`)"
    )
    keep_cut_off: bool = Field(False, description="keep answers cut at max_tokens (warned, not rejected)")
    max_rejected: float | None = max_rejected_field()
    alert_rejected: float | None = alert_field("rejected")
    alert_duplicated: float | None = alert_field("a duplicate prompt")
    alert_truncated: float | None = alert_field("an answer kept cut at max_tokens (keep_cut_off)")
    from_format: FormatName | None = from_format_field()
    columns: dict[str, str] = columns_field()
    tags: dict[str, str] = tags_field()

    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "local")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = (
        "local",
        "endpoints",
        "model",
        "max_tokens",
        "temperature",
        "reasoning",
    )

    def policy(self) -> Policy:
        return Policy.build(None, False, self.max_rejected, **loss_thresholds(self))

    @model_validator(mode="after")
    def _one_backend(self) -> RegenerateParams:
        if bool(self.endpoints) == bool(self.local):
            raise ValueError("give either endpoints (with a model) or a local model folder, not both")
        if self.endpoints and not self.model:
            raise ValueError("a model name is required with endpoints")
        return self

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def template_kwargs(self) -> dict[str, Any]:
        return {"enable_thinking": self.reasoning, **self.chat_template_kwargs}

    def sampling(self) -> dict[str, Any]:
        """What every output row and the report record about how its answers were made."""
        return {
            "model": self.model or self.local,
            "backend": "local" if self.local else "openai",
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "reasoning": self.reasoning,
            "chat_template_kwargs": self.template_kwargs(),
        }
