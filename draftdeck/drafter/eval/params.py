"""The `eval` job's parameters, defined once (CLI options, the JSON API and the job form derive from it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from draftdeck.drafter.train.params import OFF_TARGET_TOLERANCE
from draftdeck.jobs.params import JobParams


class EvalParams(JobParams):
    """Real speculative decoding of a drafter checkpoint against its target, with baselines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: list[str] = Field(
        default_factory=list,
        max_length=1,
        description="Prompts: a tokenized dataset folder (its held-out split is used) or a JSONL file "
        "of OpenAI `messages` rows (trailing assistant turns are dropped; the prompt ends at the last "
        "user turn). Not with --suite.",
    )
    suites: list[str] = Field(
        default_factory=list,
        description="Evaluation suites instead of a prompt set (INPUT), reported per suite and category: "
        "spec-bench, mt-bench, gsm8k, humaneval (shipped), or a JSONL file of prompts with a category; "
        "NAME[,NAME] or the option repeated.",
        json_schema_extra={"cli_flag": "--suite"},
    )
    max_per_category: int | None = Field(
        default=None, ge=1, le=1_000_000, description="With --suite: the first N prompts of each category."
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Chat template variables KEY=VALUE the prompts are rendered with, e.g. "
        "enable_thinking=false (suites and prompt files; a tokenized dataset's prompts are rendered "
        "already); recorded with the eval's figures.",
        json_schema_extra={"cli_short": "-k"},
    )
    target: str = Field(description="The target model: a local HF causal-LM folder with its tokenizer.")
    checkpoint: str = Field(
        description="The drafter checkpoint folder (z-lab's format: config.json + safetensors)."
    )
    out: str | None = Field(
        default=None, description="Folder for eval.json; the job's own output folder when not given."
    )
    mode: Literal["greedy", "sampled"] = Field(
        default="greedy",
        description="greedy: argmax, output must equal plain greedy decoding; sampled: the target samples "
        "and drafts are accepted by speculative sampling (lossless in distribution).",
    )
    temperature: float = Field(
        default=1.0, gt=0.0, le=10.0, description="Sampling temperature (sampled mode)."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (sampled mode).")
    max_new_tokens: int = Field(
        default=128, ge=1, le=32768, description="Tokens generated per prompt at most."
    )
    max_prompts: int = Field(
        default=100, ge=1, le=1_000_000, description="Prompts evaluated at most (in order)."
    )
    block_size: int | None = Field(
        default=None,
        ge=2,
        le=128,
        description="Verify block size B (anchor + B-1 drafts); the drafter's own block size when not given.",
    )
    tree_budget: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Tree verification: the draft-tree nodes one verify step checks (the anchor not counted;"
        " 0: a chain, one block or chain of drafts per step). DFlash-family drafters grow DDTree's tree"
        " (the budget's most probable paths over the block's per-position top-k), EAGLE-3 drafters"
        " EAGLE-2's dynamic tree; the drafter's own chain is always in it. Not for a hybrid (recurrent)"
        " target.",
    )
    tree_topk: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="With --tree-budget: the candidates per tree node (per position for DFlash; the"
        " frontier width and each node's children for EAGLE-3); 4 when not given.",
    )
    tree_depth: int | None = Field(
        default=None,
        ge=1,
        le=127,
        description="With --tree-budget: the tree's levels at most, up to the verify block's drafts"
        " (block size - 1, its default).",
    )
    confidence_threshold: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="A drafter with a confidence head (DSpark): decode also with each block stopped where the"
        " product of its drafts' confidences falls below this (confidence-scheduled verification, vLLM"
        " PR #47808), reported as drafter_scheduled beside drafter.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of sampling and of the untrained baseline drafter.")
    baselines: bool = Field(
        default=True,
        description="Decode the same prompts with the baselines too (an untrained drafter of the same shape,"
        " or an MTP's untouched head, and prompt lookup): the floors the drafter's tau is read against."
        " Off, the eval decodes a third as much (a sweep's points skip them by default).",
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|cuda(:\d+)?|mps)$",
        description="Where the target and the drafter run: cpu, cuda, cuda:N or mps.",
    )
    heldout_fraction: float = Field(
        default=0.02,
        gt=0.0,
        lt=1.0,
        description="For a dataset folder: the fraction of conversations the train job held out (its "
        "heldout_fraction); the same conversations are evaluated.",
    )
    tau_tolerance: float = Field(
        default=0.05,
        gt=0.0,
        le=1.0,
        description="Relative difference between real greedy tau and the walks that should equal it (over "
        "its own outputs: decoder_mismatch; the run's tau judged by the target: training_estimate_off), "
        "both incl. bonus, above which an alert is raised.",
    )
    off_target_tolerance: float = Field(
        default=OFF_TARGET_TOLERANCE,
        gt=0.0,
        le=10.0,
        description="Alert data_not_target_output when the tau judged by the data on the run's held-out "
        "split is above real greedy tau by more than this share.",
    )
    served_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Served eval: the base URL of a vLLM or SGLang server serving this drafter; the same "
        "prompts are sent to it (greedy) and its tau on exactly them is reported beside the offline one.",
    )
    served_kind: Literal["vllm", "sglang"] = Field(default="vllm", description="The served server's kind.")
    served_metrics_url: str | None = Field(
        default=None, pattern=r"^https?://", description="Its /metrics (vLLM; default: the base URL's)."
    )
    served_model: str | None = Field(default=None, description="The model name it serves (vLLM).")
    served_token_env: str | None = Field(
        default=None, description="Environment variable holding its bearer token."
    )

    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target", "checkpoint")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = (
        "inputs", "suites", "max_per_category", "template_kwargs", "mode", "max_prompts", "max_new_tokens",
    )  # fmt: skip

    @field_validator("suites", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`spec-bench,mt-bench` as two suites, wherever it is given (the CLI, the form, the API)."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [part.strip() for v in value for part in v.split(",") if part.strip()]
        return value

    def _map_paths(self, resolve: Callable[[str, bool], Path]) -> Self:
        """A suite that is not a shipped one is a file: confined to the data roots like any input."""
        from draftdeck.drafter.eval.suites import names

        shipped = set(names())
        mapped = super()._map_paths(resolve)
        files = [s if s in shipped else str(resolve(s, True)) for s in self.suites]
        return mapped.model_copy(update={"suites": files})

    @model_validator(mode="after")
    def _sampling_only_when_sampled(self) -> EvalParams:
        if bool(self.inputs) == bool(self.suites):
            raise ValueError("give one prompt source: INPUT (a dataset folder or a prompt file) or --suite")
        if self.max_per_category is not None and not self.suites:
            raise ValueError("max_per_category applies to --suite only")
        from draftdeck.drafter.eval.suites import names

        for name in self.suites:  # a name that is no shipped suite and does not look like a file
            if name not in names() and "/" not in name and not name.endswith((".jsonl", ".json")):
                shipped = ", ".join(names())
                raise ValueError(f"unknown suite {name!r}: shipped are {shipped}, or give a JSONL file")
        if self.mode == "greedy" and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError(
                "temperature and top_p apply to mode 'sampled' only; greedy mode takes the argmax"
            )
        if self.tree_budget == 0 and (self.tree_topk is not None or self.tree_depth is not None):
            raise ValueError("tree_topk and tree_depth shape a draft tree: give tree_budget > 0 with them")
        if self.tree_budget and self.confidence_threshold is not None:
            raise ValueError(
                "confidence_threshold schedules chain blocks; it is not combined with tree_budget"
            )
        if self.tree_budget and self.served_url:
            raise ValueError("served_url: the served comparison decodes chains; not with tree_budget")
        if self.served_url and self.mode != "greedy":
            raise ValueError("served_url: the served eval decodes greedily; use mode 'greedy'")
        return self
