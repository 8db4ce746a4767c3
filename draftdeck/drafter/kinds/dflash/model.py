"""`DFlashDrafter`: the DFlash draft model, written to be state-dict and call compatible with z-lab's
`DFlashDraftModel` (the `dflash` package), so that export is a plain safetensors save of
`state_dict()` plus `DrafterConfig.to_hf_dict()` as `config.json`.

Architecture (DOMAIN.md, DFlash):

- target context: the hidden states of `target_layer_ids`, concatenated, (bsz, C, n_ids * H) ->
  `fc` (bias-free linear to H) -> `hidden_norm` (RMSNorm);
- every decoder layer (Qwen3-style: RMSNorm, attention with per-head q/k RMSNorm and rotary
  embeddings, RMSNorm, SwiGLU MLP, residuals) attends from the block positions only (queries) to
  [context ; block] (keys and values: the context enters every layer through that layer's own
  k_proj / v_proj);
- a final `norm`; logits through the target's frozen LM head (`compute_logits`).

The block is ``[anchor token, MASK x (B-1)]`` embedded with the target's embedding (`noise_embedding`).
With no `attention_mask` every query sees every key (inference: the context is everything committed
before the anchor and the block is bidirectional); training passes a mask that confines each
flattened block to its own slots and to context strictly before its anchor
(`draftdeck.drafter.kinds.dflash.objective`).

State-dict keys (identical to z-lab's): ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``,
``layers.{i}.input_layernorm.weight``, ``layers.{i}.post_attention_layernorm.weight``,
``layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (+ ``.bias`` when attention_bias),
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``.
The rotary inverse frequencies are a non-persistent buffer, as in HF.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from draftdeck.drafter.model.attention import BlockLayout
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.head import HeadOut, head_argmax, head_loss
from draftdeck.drafter.model.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix


class Attention(nn.Module):
    """Block queries attend to [context ; block] keys; the context shares k_proj/v_proj/k_norm."""

    def __init__(self, cfg: DrafterConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = cfg.head_dim
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.scaling = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, proj: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        return proj(x).view(x.shape[0], x.shape[1], heads, self.head_dim)

    def keys_values(
        self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of `x` (bsz, L, H): (bsz, Hkv, L, D) each. Training
        takes the context's once per batch (they are the same for all its blocks) and the blocks'
        apart: a row-wise split of `forward`'s over [context ; block]."""
        cos, sin = position_embeddings
        k = self.k_norm(self._heads(self.k_proj, x, self.kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj, x, self.kv_heads).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def block_attention(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        layout: BlockLayout,
        context_kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Training's flattened blocks (positions: the blocks' own), block-sparse over `layout`."""
        bsz, q_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        q = apply_rope(
            self.q_norm(self._heads(self.q_proj, hidden_states, self.heads)).transpose(1, 2), cos, sin
        )
        k, v = self.keys_values(hidden_states, position_embeddings)
        out = layout.attend(q, context_kv[0], k, context_kv[1], v, self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))

    def forward(
        self,
        hidden_states: torch.Tensor,
        target_hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        bsz, q_len, _ = hidden_states.shape
        ctx_len = target_hidden.shape[1]
        q = self.q_norm(self.q_proj(hidden_states).view(bsz, q_len, self.heads, self.head_dim)).transpose(
            1, 2
        )
        kv_in = torch.cat([target_hidden, hidden_states], dim=1)
        k = self.k_norm(
            self.k_proj(kv_in).view(bsz, ctx_len + q_len, self.kv_heads, self.head_dim)
        ).transpose(1, 2)
        v = self.v_proj(kv_in).view(bsz, ctx_len + q_len, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q = apply_rope(q, cos[:, -q_len:], sin[:, -q_len:])
        k = apply_rope(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx, {"sin": sin, "cos": cos})
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = attention_mask[..., : k.shape[-2]]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, scale=self.scaling, enable_gqa=self.heads != self.kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def context_keys_values(
        self, context: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of the context (training: once per micro-batch). A method
        of the layer, not of its attention, so that a sharded layer gathers its weights for it."""
        return self.self_attn.keys_values(context, position_embeddings)

    def sublayer(
        self, name: str, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The attention's or the MLP's output for its normed input `x` (`name`: "attention" or "mlp"):
        `run(x)`; DFlash2 wraps each in a local convolution over the block's slots."""
        return run(x)

    def block_forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        layout: BlockLayout,
        context_kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn.block_attention(x, position_embeddings, layout, context_kv)

        h = hidden_states + self.sublayer("attention", self.input_layernorm(hidden_states), attend)
        return h + self.sublayer("mlp", self.post_attention_layernorm(h), self.mlp)

    def forward(
        self,
        hidden_states: torch.Tensor,
        target_hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(x, target_hidden, position_embeddings, attention_mask, past_key_values)

        h = hidden_states + self.sublayer("attention", self.input_layernorm(hidden_states), attend)
        return h + self.sublayer("mlp", self.post_attention_layernorm(h), self.mlp)


class DFlashDrafter(nn.Module):
    """The DFlash drafter (see the module docstring).

    Attributes mirror z-lab's: `config` (a `DrafterConfig`), `target_layer_ids`, `block_size`,
    `mask_token_id`.
    """

    def __init__(self, config: DrafterConfig, *, initializer_range: float = 0.02):
        super().__init__()
        self.config = config
        self.target_layer_ids = list(config.target_layer_ids)
        self.block_size = config.block_size
        self.mask_token_id = config.mask_token_id
        # training only: recompute each layer's activations in the backward (memory for time)
        self.gradient_checkpointing = False
        self.layers = nn.ModuleList([self.decoder_layer(config, i) for i in range(config.layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.fc = nn.Linear(config.context_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        for m in self.modules():  # HF's Qwen3 init: normal(0, 0.02) weights, zero biases, unit norms
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=initializer_range)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(
        self,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | BlockLayout | None = None,
        noise_embedding: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Hidden states of the block positions, after the final norm.

        - `target_hidden`: (bsz, C, n_ids * H) raw concatenated target features (fc + norm here);
        - `noise_embedding`: (bsz, Q, H) the embedded block(s), Q = B at inference, A * B when A
          blocks are flattened for training;
        - `position_ids`: (bsz, C + Q) positions of the context keys, then of the block queries;
        - `attention_mask`: None (everything visible) or (bsz|1, 1, Q, C + Q) bool (True = visible)
          or additive float, or a `BlockLayout` (training's flattened blocks, block-sparse);
        - `past_key_values`: an HF `Cache` (e.g. `DynamicCache`) to append this call's keys and
          values to, as z-lab's decoding loop does (crop it to the committed length after a round).

        Returns (bsz, Q, H).
        """
        if noise_embedding is None or target_hidden is None:
            raise ValueError("DFlashDrafter needs noise_embedding and target_hidden")
        if isinstance(attention_mask, BlockLayout):  # training's flattened blocks
            ctx_len = target_hidden.shape[1]
            kv = self.context_kv(target_hidden, position_ids[:, :ctx_len])
            return self.block_forward(noise_embedding, position_ids[:, ctx_len:], attention_mask, kv)
        hidden = noise_embedding
        context = self.hidden_norm(self.fc(target_hidden))
        pos = self.rotary_emb(hidden, position_ids)
        cache = past_key_values if use_cache or past_key_values is not None else None
        for layer in self.layers:
            hidden = layer(hidden, context, pos, attention_mask, cache)
        return self.norm(hidden)

    def decoder_layer(self, config: DrafterConfig, index: int) -> DecoderLayer:
        """One decoder layer (DFlash2's wraps its sublayers in convolutions)."""
        return DecoderLayer(config, index)

    # -- what the DFlash family's kinds change (DSpark, DFlash2 override these) -------------------------
    sample_from_anchor = False  # slot j drafts the token j + 1 after the anchor (else j after it)
    fsdp_methods: tuple[str, ...] = ()  # methods that read the drafter's own heads' weights (sharding)

    @property
    def shift(self) -> int:
        return int(self.sample_from_anchor)

    @property
    def slots(self) -> int:
        """The verify block its drafts are counted in: the anchor, then B - 1 (or B) drafts."""
        return self.block_size + self.shift

    def block_features(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor | None:
        """What the drafter's own heads read per slot of whole blocks: `hidden` (..., slots, H) the
        verify block's final hidden states, `previous` (..., slots) each slot's previous token; None
        when it has no heads (DFlash). Computed over whole blocks: a head may carry a state from slot
        to slot (DSpark's recurrent Markov head)."""
        return None

    def slot_loss(
        self,
        head: nn.Module,
        hidden: torch.Tensor,
        previous: torch.Tensor,
        features: torch.Tensor | None,
        labels: torch.Tensor,
        weights: torch.Tensor,
        *,
        teacher: torch.Tensor | None = None,
        mix: Mix | tuple[float, float] = CE_ONLY,
        chunked: bool = True,
    ) -> HeadOut:
        """Each counted slot's loss and draft from its final hidden state (N, H) through the target's
        `head`; `previous` (N,) each slot's previous token and `features` (N, F) its row of
        `block_features`, which DFlash does not read."""
        return head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunked=chunked)

    def slot_choice(
        self, head: nn.Module, hidden: torch.Tensor, previous: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        """(N,) each slot's draft, its previous token known (the walk's teacher-forced drafts)."""
        return head_argmax(head, hidden)

    def choose_drafts(
        self, head: nn.Module, hidden: torch.Tensor, anchor: int, want: int, threshold: float = 0.0
    ) -> list[int]:
        """Up to `want` drafts of one block whose final hidden states are `hidden` (B, H), in order
        (decoding: each draft's previous token is the one drafted before it); `threshold`: a drafter
        with a confidence head stops where it falls below (DFlash has none)."""
        first = 1 - self.shift  # drafting from the anchor: its own slot drafts too
        return [int(t) for t in head_argmax(head, hidden[first : first + want]).tolist()]

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, m) for m in self.layers]

    def context_kv(
        self, target_hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context keys and values for training: `target_hidden` (bsz, T, n_ids * H),
        `position_ids` (bsz, T). The same for all the blocks of a batch (see `block_forward`)."""
        context = self.hidden_norm(self.fc(target_hidden))
        pos = self.rotary_emb(context, position_ids)
        return [layer.context_keys_values(context, pos) for layer in self.decoder_layers]

    def block_forward(
        self,
        noise_embedding: torch.Tensor,
        position_ids: torch.Tensor,
        layout: BlockLayout,
        context_kv: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Training's forward over flattened blocks: (bsz, A*B, H) embedded blocks at `position_ids`
        (bsz, A*B), block-sparse over `layout`, against `context_kv` -> (bsz, A*B, H) after the
        final norm. With `gradient_checkpointing` each layer is recomputed in the backward."""
        hidden = noise_embedding
        pos = self.rotary_emb(hidden, position_ids)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer, kv in zip(self.decoder_layers, context_kv, strict=True):
            if recompute:
                hidden = checkpoint(layer.block_forward, hidden, pos, layout, kv, use_reentrant=False)
            else:
                hidden = layer.block_forward(hidden, pos, layout, kv)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Logits through the target's (frozen) LM head: (..., H) -> (..., V)."""
        return output_head(hidden)
