"""Tiny random models of the architectures drafters are trained for, built offline from transformers'
own classes: the shapes that matter to DraftDeck (hybrid linear attention, sliding windows, mixtures of
experts) at a size a CPU runs in milliseconds; and the whole path from such a target to an exported
drafter (`end_to_end`). For tests and benchmarks; weights are random."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every family drafters are served for: plain Qwen3 (the reference); those whose cache needs more
# than a crop to undo rejected drafts, a recurrent state (hybrid Gated DeltaNet) or a sliding window;
# mixtures of experts; scaled rope (llama3, yarn); multi-head latent attention (DeepSeek-V3).
ARCHITECTURES = (
    "qwen3", "qwen3_5", "qwen3_next", "mistral", "gemma3", "llama3", "qwen3_moe", "gpt_oss", "deepseek_v3",
)  # fmt: skip
# Checkpoints published with a vision tower: Qwen3.5/3.6 (`Qwen3_5ForConditionalGeneration`, the hybrid
# text model) and Gemma 3 from 4B up (`Gemma3ForConditionalGeneration`)
WITH_VISION = ("qwen3_5_vision", "gemma3_vision")


def tiny_causal_lm(
    arch: str, *, vocab_size: int = 300, hidden: int = 64, layers: int = 4, window: int = 16, seed: int = 0
) -> Any:
    """A `...ForCausalLM` of `arch` in eval mode: `layers` decoder layers of width `hidden`, heads of 16,
    a sliding `window` where the architecture has one."""
    import torch
    import transformers as tf

    small: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 16, num_key_value_heads=max(1, hidden // 32), head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    linear: dict[str, Any] = dict(
        linear_num_value_heads=hidden // 16, linear_num_key_heads=max(1, hidden // 32),
        linear_key_head_dim=16, linear_value_head_dim=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    model: Any
    config: Any
    if arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**small))
    elif arch == "qwen3_5":  # three Gated DeltaNet layers for each gated full-attention layer
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**small, **linear))
    elif arch == "qwen3_5_vision":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                      patch_size=8, spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
        config = tf.Qwen3_5Config(text_config={**small, **linear}, vision_config=vision)
        model = tf.Qwen3_5ForConditionalGeneration(config)
    elif arch == "qwen3_next":  # the same hybrid, with a mixture of experts
        moe: dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2,
                   shared_expert_intermediate_size=hidden // 2)  # fmt: skip
        model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**small, **linear, **moe))
    elif arch == "mistral":  # every layer slides
        model = tf.MistralForCausalLM(tf.MistralConfig(**small, sliding_window=window))
    elif arch in ("gemma3", "gemma3_vision"):  # sliding layers beside global ones
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        text = dict(small, sliding_window=window, layer_types=types)
        if arch == "gemma3":
            model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**text))
        else:
            vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          image_size=28, patch_size=14)  # fmt: skip
            config = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
            model = tf.Gemma3ForConditionalGeneration(config)
    elif arch == "llama3":  # rope scaled as Llama 3.1 does
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=1024)  # fmt: skip
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**small, rope_parameters=rope))
    elif arch == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(
            tf.Qwen3MoeConfig(
                **small, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2
            )
        )
    elif arch == "gpt_oss":  # yarn rope, attention sinks, sliding layers beside full ones, experts
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        rope = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                    truncate=False, original_max_position_embeddings=128)  # fmt: skip
        config = tf.GptOssConfig(**small, num_local_experts=4, num_experts_per_tok=2, sliding_window=window,
                                 layer_types=types, rope_parameters=rope)  # fmt: skip
        model = tf.GptOssForCausalLM(config)
    elif arch == "deepseek_v3":  # multi-head latent attention: as many KV heads as query heads
        mla = dict(small, num_key_value_heads=small["num_attention_heads"])
        del mla["head_dim"]
        config = tf.DeepseekV3Config(
            **mla, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2, n_shared_experts=1,
            n_group=1, topk_group=1, first_k_dense_replace=1,
        )  # fmt: skip
        model = tf.DeepseekV3ForCausalLM(config)
    else:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join((*ARCHITECTURES, *WITH_VISION))}")
    if arch in MTP_ARCHITECTURES:  # built after the model: its weights are what they were without
        attach_mtp(model, seed)
    return model.eval()


# The architectures whose tiny targets carry an MTP layer, as the published checkpoints do (Qwen3.5/3.6:
# `mtp.*` weights, `mtp_num_hidden_layers: 1`)
MTP_ARCHITECTURES = ("qwen3_5",)


def attach_mtp(model: Any, seed: int) -> Any:
    """Give a Qwen3.5 causal LM its multi-token-prediction layer under the checkpoint's names (`mtp.fc`,
    `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`: a full-attention decoder
    layer of its own architecture, `mtp.norm`), drawn from a generator of its own (the model's weights and
    torch's global generator are untouched), and `mtp_num_hidden_layers: 1` in its config.
    `save_pretrained` writes it; transformers skips `mtp.*` when loading, as for the published models."""
    import torch
    from torch import nn
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    config = model.config.get_text_config()
    hidden, eps = config.hidden_size, config.rms_norm_eps
    full = max(i for i, t in enumerate(config.layer_types) if t == "full_attention")
    mtp = nn.Module()
    mtp.fc = nn.Linear(2 * hidden, hidden, bias=False)
    mtp.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
    mtp.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
    mtp.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full)])
    mtp.norm = Qwen3_5RMSNorm(hidden, eps=eps)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in mtp.parameters():  # matrices as the model's init; norms near their 1 + 0 start
            p.copy_(torch.randn(p.shape, generator=g) * (config.initializer_range if p.dim() > 1 else 0.1))
    model.mtp = mtp.to(next(model.parameters()).dtype)
    config.mtp_num_hidden_layers = 1
    return mtp


def mtp_step(model: Any, hidden: Any, embeds: Any, positions: Any) -> Any:
    """The attached MTP layer over (bsz, n) positions, through transformers' own layer (the reference
    DraftDeck's MTP drafter is tested against): `hidden` the target's last hidden states (or the layer's
    previous outputs), `embeds` the target's embedding of the tokens after them, at rope `positions`,
    causal. Its normed outputs (bsz, n, H): the LM head's input and the next draft's hidden state."""
    import torch

    mtp = model.mtp
    x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(embeds), mtp.pre_fc_norm_hidden(hidden)], dim=-1))
    n = x.shape[1]
    blocked = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    mask = torch.zeros(n, n, dtype=x.dtype, device=x.device).masked_fill(blocked, float("-inf"))[None, None]
    rope = model.model.rotary_emb(x, positions)
    out = mtp.layers[0](x, position_embeddings=rope, attention_mask=mask, position_ids=positions)
    return mtp.norm(out)


@dataclass
class EndToEnd:
    """What one architecture did on the path from files to an exported drafter (`end_to_end`)."""

    arch: str
    loaded: str
    vision_parameters: int  # of the target in memory: 0 where a vision tower was left out
    train_s_per_step: float
    plain_tokens_per_s: float
    speculative_tokens_per_s: float
    lossless: bool
    walk_equals_real: bool
    sampled_verify_steps: int  # of the sampled eval (temperature 1): it ran past rejected drafts
    exported: bool
    rows: int  # the dataset's: the prompts the target answered, tokenized with its chat template
    events: list[str]


WORDS = (
    "the", "drafter", "reads", "hidden", "states", "of", "its", "target", "and", "guesses", "a",
    "block", "of", "tokens", "ahead",
)  # fmt: skip


def _answered_and_tokenized(folder: Path, work: Path, prompts: int, new: int) -> tuple[Path, int]:
    """`prompts` user-only rows answered greedily by the target in `folder` (regenerate --local, at
    most `new` tokens, answers cut there kept) and tokenized with its tokenizer and chat template:
    (the dataset folder, its rows: fewer where an answer was empty)."""
    from draftdeck.jobs.context import LocalContext
    from draftdeck.regenerate.params import RegenerateParams
    from draftdeck.regenerate.run import run_regenerate
    from draftdeck.tokenize.job import TokenizeParams, tokenize_files

    asked, answered, data = work / "prompts.jsonl", work / "answered.jsonl", work / "data"
    lines = []
    for i in range(prompts):
        text = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 4))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"{i}: {text}?"}]}))
    asked.write_text("\n".join(lines) + "\n", encoding="utf-8")
    regenerate = RegenerateParams(
        inputs=[str(asked)],
        out=str(answered),
        local=str(folder),
        max_tokens=new,
        keep_cut_off=True,
        reasoning=False,  # a thinking template (Qwen3.6) would spend every token inside <think>
    )
    report = run_regenerate(regenerate, LocalContext(work / "regenerate-job"))
    tokenized = tokenize_files(TokenizeParams(inputs=[str(answered)], tokenizer=str(folder)), data)
    rows = tokenized.rows_out
    if not rows:  # a random model may end an answer at once: rejected as empty, and counted
        raise RuntimeError(
            f"{folder}: none of {prompts} prompts answered and tokenized: regenerate rejected "
            f"{dict(report.rejected)}, tokenize {dict(tokenized.rejected)}"
        )
    return data, rows


def end_to_end(
    arch: str, work: Path, tokenizer_dir: Path, *, prompts: int = 16, new: int = 20, window: int = 16,
    steps: int = 4, eval_prompts: int = 2,
) -> EndToEnd:  # fmt: skip
    """A tiny `arch` target saved with the tokenizer in `tokenizer_dir`; its own greedy answers to
    prompts (regenerate --local), tokenized with its chat template, as the dataset (prompt + answer
    longer than `window`); `steps` training steps; a greedy and a sampled eval of `eval_prompts`
    held-out rows; the export read back beside the checkpoint."""
    import torch
    from transformers import AutoTokenizer

    from draftdeck.drafter.eval.evaluate import run_eval
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.drafter.export.drafters import export_drafter, load_drafter
    from draftdeck.drafter.export.folder import resolve_checkpoint
    from draftdeck.drafter.model.target import Target
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import train
    from draftdeck.jobs.context import LocalContext

    folder = work / "target"
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny_causal_lm(arch, vocab_size=len(tok), window=window).save_pretrained(folder)
    tok.save_pretrained(folder)
    target = Target.load(folder)
    data, rows = _answered_and_tokenized(folder, work, prompts, new)
    run, train_ctx = work / "run", LocalContext(work / "train-job")
    began = time.perf_counter()
    train(
        TrainParams(
            inputs=[str(data)], target=str(folder), out=str(run), block_size=4, lr=3e-3, max_steps=steps,
            batch_size=4, anchors_per_seq=8, checkpoint_every=steps, eval_every=steps, heldout_fraction=0.3,
            device="cpu",
        ),
        train_ctx,
    )  # fmt: skip
    train_s = (time.perf_counter() - began) / steps
    eval_ctx = LocalContext(work / "eval-job")
    params = EvalParams(
        inputs=data, target=folder, checkpoint=run, max_new_tokens=new, heldout_fraction=0.3,
        max_prompts=eval_prompts,
    )  # fmt: skip
    run_eval(params, eval_ctx)
    ev = json.loads((eval_ctx.out_dir / "eval.json").read_text())["eval"]
    sampled_ctx = LocalContext(work / "eval-sampled-job")
    run_eval(params.model_copy(update={"mode": "sampled", "temperature": 1.0}), sampled_ctx)
    sampled = json.loads((sampled_ctx.out_dir / "eval.json").read_text())["eval"]["methods"]["drafter"]
    real = ev["methods"]["drafter"]
    walked = (ev["walked"]["accepted"], ev["walked"]["steps"])
    exported = load_drafter(export_drafter(run, work / "export")[0]).state_dict()
    saved = load_drafter(resolve_checkpoint(run)).state_dict()
    same = exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    return EndToEnd(
        arch=arch,
        loaded=target.loaded,
        vision_parameters=sum(
            p.numel() for n, p in target.model.named_parameters() if "visual" in n or "vision" in n
        ),
        train_s_per_step=train_s,
        plain_tokens_per_s=float(ev["target_only"]["tokens_per_s"]),
        speculative_tokens_per_s=float(real["tokens_per_s"]),
        lossless=bool(real["lossless"]),
        walk_equals_real=walked == (real["counts"]["accepted"], real["counts"]["verify_steps"]),
        sampled_verify_steps=int(sampled["counts"]["verify_steps"]),
        exported=same,
        rows=rows,
        events=[message for _, message, _, _ in train_ctx.events + eval_ctx.events],
    )
