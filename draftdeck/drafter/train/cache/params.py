"""`CacheParams`: the parameters of a `cache-hidden` job (CLI, API, form)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from draftdeck.drafter.kinds import DrafterName
from draftdeck.hidden.compression import parse_compression
from draftdeck.jobs.params import JobParams, inputs_field, strict_field

StoreDtype = Literal["bf16", "fp16", "fp32"]
CacheFormat = Literal["draftdeck", "speculators"]


class CacheParams(JobParams):
    inputs: list[str] = inputs_field("Dataset folders (DraftDeck shards) whose rows the target reads")
    target: str = Field(description="Local HF folder of the target model (a causal LM) and its tokenizer")
    out: str = Field(description="New cache folder (refused when it exists and is not empty)")
    drafter: list[DrafterName] = Field(
        default_factory=lambda: ["dflash", "eagle3"],
        description="Drafter kinds the cache serves: it stores the union of the target layers each reads"
        " (each kind's default layers for this target)",
    )
    layers: int = Field(
        1, ge=1, le=64, description="DFlash drafter layers (its default target layers follow)"
    )
    layer_ids: list[int] | None = Field(
        None,
        description="Target layer ids to store besides the kinds' (Target's ids: hidden_states[i + 1])",
    )
    dtype: StoreDtype = Field("bf16", description="Stored precision of the hidden states")
    compress: str | None = Field(
        None,
        description="zstd or zstd:LEVEL (1-22, 3 by default): shards stored compressed, lossless (each row"
        " a zstd frame of its byte planes), read by training as the plain ones; none: uncompressed",
    )
    format: CacheFormat = Field(
        "draftdeck",
        description="draftdeck = shards + manifest; speculators = also hidden_states/hs_<i>.safetensors"
        " as speculators' and vLLM's offline files ([tokens, layers, hidden], the last the final layer)",
    )
    import_from: str | None = Field(
        None,
        description="Take in a folder of speculators/vLLM hs_<i>.safetensors, or SpecForge's records"
        " (rows_*/data_<i>.ckpt[.gz], --strategy eagle3), row i = dataset row i, instead of running the"
        " target's layers",
        json_schema_extra={"cli_flag": "--import"},
    )
    stored_layers: list[int] | None = Field(
        None,
        description="With --import: the HF hidden_states indices of the files' layers in file order"
        " (speculators' launch config), the final layer last",
    )
    seq_length: int | None = Field(
        None, ge=2, le=1 << 24, description="Cut rows at this many tokens, as the train run will"
    )
    check_rows: int = Field(
        4, ge=0, le=10_000, description="First rows compared with a live forward of the target"
    )
    strict: bool = strict_field()
    shard_mb: int = Field(1024, ge=1, le=1 << 20, description="Megabytes of hidden states per shard")
    batch_tokens: int = Field(
        8192,
        ge=1,
        le=1 << 24,
        description="Tokens per target forward at most: rows of one length among nearby rows run together"
        " (no padding, so each row's states are those of its forward alone); 1: one row a forward",
    )

    chunk_rows: int = Field(
        256,
        ge=1,
        le=1 << 30,
        description="Rows per chunk task when workers run the job: each chunk builds a slice of the cache,"
        " any worker takes it, and the last merges them (the CLI builds in one process, or one slice a"
        " rank under torchrun)",
    )

    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target", "import_from")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)

    @field_validator("compress")
    @classmethod
    def _compression(cls, value: str | None) -> str | None:
        return parse_compression(value)  # "zstd:3"; raises ValueError naming the forms it reads

    @model_validator(mode="after")
    def _check(self) -> CacheParams:
        if self.layer_ids is not None and (not self.layer_ids or min(self.layer_ids) < 0):
            raise ValueError("layer_ids must be a non-empty list of layer indexes >= 0")
        if (self.import_from is None) != (self.stored_layers is None):
            raise ValueError("import and stored_layers go together: the files' layers must be named")
        if self.import_from is not None and self.format != "draftdeck":
            raise ValueError("import writes a DraftDeck cache (format draftdeck)")
        return self
