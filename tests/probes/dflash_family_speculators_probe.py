"""Run inside the `speculators` 0.9.0 venv (not the project's): load a DFlash-family export (dspark or
dflash2, speculators' format) into speculators' own class of that kind (which loads the verifier's
embedding and head from the target folder the config names), run its backbone over one block anchored
at a given position of saved inputs (the target's tapped hidden states, the token ids), and draft that
block as its kind's heads choose: DSpark's Markov bias, DFlash2's selector over the top-k. Usage:
python PROBE FOLDER IN OUT."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

CLASSES = {
    "dspark": (DSparkDraftModel, DSparkSpeculatorConfig),
    "dflash2": (DFlash2DraftModel, DFlash2SpeculatorConfig),
}


def main(folder: str, inputs: str, out: str) -> None:
    kind = json.loads(Path(folder, "config.json").read_text())["speculators_model_type"]
    model_class, config_class = CLASSES[kind]
    config = config_class.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # no flex compile on the CPU
    model = model_class.from_pretrained(folder, config=config, dtype=torch.float32)
    saved = load_file(f"{folder}/model.safetensors")
    # its from_pretrained takes the verifier's embedding and head only where their buffers read NaN,
    # which freshly allocated memory need not: take what the export leaves out from the verifier the
    # config names, as its trainer does (the checkpoint's own values are kept)
    model._load_verifier_weights(
        overwrite_embed_tokens="embed_tokens.weight" not in saved,
        overwrite_lm_head="lm_head.weight" not in saved,
    )
    model.eval()
    held = model.state_dict()
    ignored = {
        "verifier_norm.weight",
        "verifier_lm_head.weight",
        "embed_tokens.weight",
        "lm_head.weight",
        "t2d",
        "d2t",
    }  # the verifier's, loaded apart (a full vocabulary: the head is the verifier's)
    x = torch.load(inputs, weights_only=True)
    ids, anchor = x["ids"], int(x["anchor"])
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, anchor] = 1  # the one eligible anchor: the block is there
    with torch.no_grad():
        hidden, logits, _, _, _ = model._backbone_forward(
            x["aux"],
            ids,
            loss_mask,
            torch.zeros(1, ids.shape[1], x["aux"].shape[-1] // len(model.target_layer_ids)),
            torch.zeros_like(ids),
            max_anchors=1,
        )
        drafts, previous = [], int(ids[0, anchor])
        first = 0 if config.sample_from_anchor else 1
        for k in range(first, config.block_size):
            prev = torch.tensor([[previous]])
            if kind == "dspark":
                bias = model.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden[:, k : k + 1])
                token = int((logits[0, k] + bias[0, 0]).argmax())
            else:
                candidates, scores = model.candidate_selector.select(
                    logits[0, k : k + 1], hidden[0, k : k + 1], prev[0]
                )
                token = int(candidates[0, scores[0].argmax()])
            drafts.append(token)
            previous = token
    torch.save({"drafts": torch.tensor(drafts)}, out)
    report = {
        "class": type(model).__name__,
        "missing_keys": sorted(set(held) - set(saved) - ignored),
        "unexpected_keys": sorted(set(saved) - set(held)),
        "mismatched_keys": sorted(k for k in saved if k in held and not torch.equal(saved[k], held[k])),
        "layer_ids": list(model.target_layer_ids),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
