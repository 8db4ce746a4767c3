"""Run inside the `speculators` 0.9.0 venv (not the project's): load an MTP export in the speculators
format into speculators' own `MTPDraftModel` (which loads the verifier's embedding and LM head from the
target folder the config names) and draft on saved inputs (the target's last hidden states, the ids):

- its own teacher-forced forward's first step: the first draft at every position;
- a chain of `chain` drafts after the last position, through its own MTP layer, rotary embedding,
  causal mask and position ids (`_prepare_mtp_position_ids`), rerun over the whole sequence of
  (hidden, next token) pairs at every draft with its previous output as the hidden state: what a
  decoded chain attends to.

Usage: python PROBE FOLDER IN OUT."""

import json
import sys

import torch
from safetensors.torch import load_file
from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig
from speculators.models.mtp.core import _prepare_mtp_position_ids
from transformers.masking_utils import create_causal_mask


def chain(model: MTPDraftModel, hidden: torch.Tensor, ids: torch.Tensor, n: int) -> list[int]:
    tc = model.config.transformer_layer_config
    tokens, drafts = ids[:, 1:], []
    hidden = hidden[:, : tokens.shape[1]]
    for _ in range(n):
        length = hidden.shape[1]
        positions, rotary = _prepare_mtp_position_ids(torch.arange(length)[None], length, tc.model_type)
        embeds = model.embed_tokens(tokens)
        mask = create_causal_mask(
            config=tc, inputs_embeds=hidden, attention_mask=None, past_key_values=None, position_ids=positions
        )
        out = model.mtp_layers[0](
            hidden_states=hidden,
            token_embeddings=embeds,
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=model.rotary_emb(hidden, rotary),
        )
        token = model.lm_head(out[:, -1]).argmax(-1)
        drafts.append(int(token))
        hidden = torch.cat([hidden, out[:, -1:]], dim=1)
        tokens = torch.cat([tokens, token[:, None]], dim=1)
    return drafts


def main(folder: str, inputs: str, out: str) -> None:
    config = MTPSpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    model = MTPDraftModel.from_pretrained(folder, config=config, dtype=torch.float32)
    model.eval()
    saved = load_file(f"{folder}/model.safetensors")
    held = model.state_dict()
    verifiers = {"embed_tokens.weight", "lm_head.weight"}  # the verifier's, loaded from its folder
    x = torch.load(inputs, weights_only=True)
    with torch.no_grad():
        logits, _, _ = model(input_ids=x["ids"], hidden_states=x["hidden"])
        first = logits[0].argmax(-1)[0]
        drafts = chain(model, x["hidden"], x["ids"], int(x["chain"]))
    torch.save({"first": first, "chain": torch.tensor(drafts)}, out)
    report = {
        "class": type(model).__name__,
        "missing_keys": sorted(set(held) - set(saved) - verifiers),
        "unexpected_keys": sorted(set(saved) - set(held)),
        "mismatched_keys": sorted(k for k in saved if k in held and not torch.equal(saved[k], held[k])),
        "steps": config.num_speculative_steps,
        "target_layer_ids": list(model.target_layer_ids),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
