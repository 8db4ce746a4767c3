"""The frozen target model: a local HF causal-LM folder whose hidden states condition the drafter.

Hidden-state indexing follows z-lab's `extract_context_feature`: HF returns
``hidden_states[0]`` = the embeddings and ``hidden_states[i + 1]`` = the output of decoder layer i,
so target layer id i reads ``hidden_states[i + 1]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftdeck.causal_lm import ModelFolderError, load_causal_lm
from draftdeck.drafter.model.vision import ImageRows, RowImage, VisionInputs
from draftdeck.drafter.model.vocab_parallel import ShardedEmbedding, VocabShard, embed_rows


def load_vision_language_model(folder: Path, dtype: torch.dtype | None) -> tuple[Any, str]:
    """(the whole vision-language model of `folder` in eval mode, what is in memory, for the job's log)."""
    from transformers import AutoModelForImageTextToText

    try:
        model: Any = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as e:
        raise ModelFolderError(
            f"{folder}: cannot load a vision-language model (for data with images): {e}"
        ) from e
    return model.eval(), f"{type(model).__name__}, with its vision tower (frozen): the data has images"


def context_from_hidden_states(
    hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor], layer_ids: list[int] | tuple[int, ...]
) -> torch.Tensor:
    """Concatenate the outputs of `layer_ids` along the feature axis: (bsz, T, len(ids) * hidden)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@dataclass
class TargetPass:
    """What one teacher-forced target forward gives: `context` (bsz, T, n_ids * H), `last_hidden`
    (bsz, T, H) after the final norm, `last_logits` (bsz, 1, V)."""

    context: torch.Tensor
    last_hidden: torch.Tensor
    last_logits: torch.Tensor


class Target:
    """A frozen causal LM in eval mode, with its embedding and LM head exposed for the drafter.

    `Target.load(folder)` loads offline (`draftdeck.causal_lm.load_causal_lm`); `Target(model)` wraps a model
    already in memory (tests). No parameter requires grad.
    """

    def __init__(
        self, model: nn.Module, folder: Path | None = None, tokenizer: Any = None, loaded: str | None = None
    ):
        self.model: Any = model  # an HF PreTrainedModel: its attributes are not typed as nn.Module's
        self.folder = folder
        self.tokenizer = tokenizer
        # a checkpoint with a vision tower: its text config (the language model alone, or the whole VLM)
        config: Any = self.model.config
        self.config: Any = config.get_text_config() if hasattr(config, "get_text_config") else config
        # a VLM loaded whole (`load(..., vision=True)`): its rows' images, set by `attach_images`
        self.vision: VisionInputs | None = None
        # what of the folder is in memory, for the job's log
        self.loaded = loaded or type(model).__name__
        # its decoder layers sharded across the ranks (`draftdeck.drafter.train.sharding.shard_target`):
        # every forward is then a collective, run by every rank alike
        self.sharded = False
        # its embedding and head split by vocabulary across the ranks (`vocab_parallel`), or None
        self.vocab: VocabShard | None = None
        model.eval()
        model.requires_grad_(False)

    @classmethod
    def load(
        cls,
        folder: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        with_tokenizer: bool = True,
        vision: bool = False,
    ) -> Target:
        """`vision`: the whole vision-language model (its vision tower frozen, as the rest), for data
        with images (`attach_images`); else its language model alone."""
        from transformers import AutoTokenizer

        folder = Path(folder)
        model, loaded = (
            load_vision_language_model(folder, dtype) if vision else load_causal_lm(folder, dtype=dtype)
        )
        tokenizer = None
        if with_tokenizer:
            try:
                tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            except (OSError, ValueError) as e:
                raise ModelFolderError(f"{folder}: cannot load the target's tokenizer: {e}") from e
        model.to(device)
        return cls(model, folder, tokenizer, loaded=loaded)

    @property
    def device(self) -> torch.device:
        return next(self.embedding.parameters()).device

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 0)

    @property
    def embedding(self) -> nn.Module:
        """The target's input embedding (frozen): the drafter embeds its block with it (an
        `nn.Embedding`, or this rank's slice of it)."""
        emb = self.model.get_input_embeddings()
        assert isinstance(emb, nn.Embedding | ShardedEmbedding)
        return emb

    @contextmanager
    def same_rows(self) -> Iterator[None]:
        """Within it every rank passes the target the same rows (a split vocabulary gathers none)."""
        with self.vocab.same_rows() if self.vocab is not None else nullcontext():
            yield

    @property
    def lm_head(self) -> nn.Module:
        """The target's output head (frozen): the drafter's logits go through it."""
        head = getattr(self.model, "lm_head", None)
        return head if head is not None else self.model.get_output_embeddings()

    def eos_ids(self) -> list[int]:
        """The ids that end an answer: the tokenizer's eos and the generation config's."""
        ids = set()
        for value in (
            getattr(self.tokenizer, "eos_token_id", None),
            self.model.generation_config.eos_token_id,
        ):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(v) for v in value)
        if not ids:
            raise ModelFolderError(
                f"{self.folder}: the target's tokenizer and generation config name no eos token"
            )
        return sorted(ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed_rows(self.embedding, input_ids)

    def attach_images(self, rows: ImageRows) -> None:
        """Give a target loaded with `vision=True` the images of the rows it will be run on: each
        forward then passes its rows' pixels, grids and token types to the model, which injects the
        vision tower's features at the image tokens and computes its M-RoPE positions."""
        if not hasattr(self.model.config, "vision_config"):
            raise ModelFolderError(f"{self.folder}: the data has images but the target has no vision tower")
        if self.vision is None:
            assert self.folder is not None, "a target with images is loaded from its folder"
            self.vision = VisionInputs(self.folder, self.model.config, rows)
        elif self.vision.rows is not rows:
            for key, images in rows.by_key.items():
                self.vision.rows.by_key.setdefault(key, images)
                if key in rows.where:
                    self.vision.rows.where.setdefault(key, rows.where[key])

    def vision_inputs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
        images: Sequence[Sequence[RowImage]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The model's image inputs for these rows ({}: no images, or a text-only target); `images`: each
        row's, where the caller knows them (else looked up by the rows' tokens)."""
        return {} if self.vision is None else self.vision.batch(input_ids, attention_mask, images)

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_to_keep: int
    ) -> Any:
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=logits_to_keep,
            **self.vision_inputs(input_ids, attention_mask),
        )

    @torch.no_grad()
    def teacher_forced(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        layer_ids: list[int] | tuple[int, ...],
    ) -> TargetPass:
        """One target forward over (bsz, T) ids for a held-out pass: the drafter's context features,
        the final hidden states (the LM head's input, for `draftdeck.drafter.train.truth`) and the logits of
        the last position (what the head is checked against)."""
        out = self._forward(input_ids, attention_mask, 1)
        hs = out.hidden_states
        return TargetPass(context_from_hidden_states(hs, layer_ids), hs[-1], out.logits)

    @torch.no_grad()
    def context_features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        layer_ids: list[int] | tuple[int, ...],
        *,
        with_logits: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One target forward over (bsz, T) ids: (logits (bsz, T, V) or None, the concatenated
        hidden states of `layer_ids`, (bsz, T, len(layer_ids) * hidden))."""
        out = self._forward(input_ids, attention_mask, 0 if with_logits else 1)
        return (out.logits if with_logits else None), context_from_hidden_states(out.hidden_states, layer_ids)
