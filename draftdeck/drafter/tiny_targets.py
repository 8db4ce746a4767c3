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

# The architectures whose cache needs more than a crop to undo rejected drafts: a recurrent state
# (hybrid Gated DeltaNet) or a sliding window; and plain Qwen3, the reference.
ARCHITECTURES = ("qwen3", "qwen3_5", "qwen3_next", "mistral", "gemma3")
# Qwen3.5/3.6 as published: `Qwen3_5ForConditionalGeneration`, the hybrid text model under a vision tower
PUBLISHED = "qwen3_5_vision"


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
    if arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**small))
    elif arch == "qwen3_5":  # three Gated DeltaNet layers for each gated full-attention layer
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**small, **linear))
    elif arch == PUBLISHED:
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
    elif arch == "gemma3":  # sliding layers beside global ones
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**small, sliding_window=window, layer_types=types))
    else:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join((*ARCHITECTURES, PUBLISHED))}")
    return model.eval()


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
    exported: bool
    events: list[str]


def end_to_end(
    arch: str, work: Path, tokenizer_dir: Path, *, prompts: int = 8, prompt_len: int = 12, new: int = 20,
    window: int = 16, steps: int = 4,
) -> EndToEnd:  # fmt: skip
    """A tiny `arch` target saved with the tokenizer in `tokenizer_dir`; its own greedy answers to
    random prompts as a dataset (prompt + answer longer than `window`); `steps` training steps; a
    greedy eval of the held-out rows; the export read back beside the checkpoint."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from draftdeck.chat.render import tokenizer_fingerprint
    from draftdeck.drafter.eval.evaluate import run_eval
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
    from draftdeck.drafter.export.format import export_drafter, load_zlab, resolve_checkpoint
    from draftdeck.drafter.model.target import Target
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import train
    from draftdeck.jobs.context import LocalContext
    from draftdeck.shards.store import ShardRow, ShardWriter, write_pretokenized_metadata

    folder = work / "target"
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny_causal_lm(arch, vocab_size=len(tok) + 8, window=window).save_pretrained(folder)
    tok.save_pretrained(folder)
    target = Target.load(folder)
    runner = TargetRunner(target, target.eos_ids())
    g = torch.Generator().manual_seed(0)
    writer = ShardWriter(work / "data", shard_rows=64)
    for i in range(prompts):
        ids = torch.randint(3, len(tok) - 8, (prompt_len,), generator=g).tolist()
        out = generate_plain(runner, ids, new).output_ids
        mask = [0] * prompt_len + [1] * len(out)
        writer.add(ShardRow(np.asarray(ids + out, np.int32), np.asarray(mask, np.uint8), "gen", i, -1, False))
    template = tok.chat_template or ""
    fingerprint = tokenizer_fingerprint(folder, template, {})
    data = work / "data"
    write_pretokenized_metadata(
        data, writer.close(), fingerprint=fingerprint, chat_template=template, tokenizer_path=folder
    )
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
    params = EvalParams(inputs=data, target=folder, checkpoint=run, max_new_tokens=new, heldout_fraction=0.3)
    run_eval(params, eval_ctx)
    ev = json.loads((eval_ctx.out_dir / "eval.json").read_text())["eval"]
    real = ev["methods"]["drafter"]
    walked = (ev["walked"]["accepted"], ev["walked"]["steps"])
    exported = load_zlab(export_drafter(run, work / "export")).state_dict()
    saved = load_zlab(resolve_checkpoint(run)).state_dict()
    same = exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    return EndToEnd(
        arch=arch,
        loaded=target.loaded,
        vision_parameters=sum(p.numel() for n, p in target.model.named_parameters() if "visual" in n),
        train_s_per_step=train_s,
        plain_tokens_per_s=float(ev["target_only"]["tokens_per_s"]),
        speculative_tokens_per_s=float(real["tokens_per_s"]),
        lossless=bool(real["lossless"]),
        walk_equals_real=walked == (real["counts"]["accepted"], real["counts"]["verify_steps"]),
        exported=same,
        events=[message for _, message, _, _ in train_ctx.events + eval_ctx.events],
    )
