"""Run inside the `speculators` 0.9.0 venv (not the project's): load an EAGLE-3 export in the
speculators format into speculators' own `Eagle3DraftModel` (which loads the verifier's embedding
from the target folder the config names) and draft on saved inputs (the target's tapped states, the
next tokens). Usage: python PROBE FOLDER IN OUT."""

import json
import sys

import torch
from safetensors.torch import load_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def main(folder: str, inputs: str, out: str) -> None:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # no flex compile on the CPU
    model = Eagle3DraftModel.from_pretrained(folder, config=config, dtype=torch.float32)
    # its from_pretrained takes the verifier's embedding only where the buffer reads NaN, which freshly
    # allocated memory need not (near-zero garbage once made a draft differ at one position): take it
    # from the verifier the config names, as its trainer does; the checkpoint's values are kept
    model._load_verifier_weights(overwrite_embed_tokens=True)
    model.eval()
    # its from_pretrained gives no loading info: compare the file with what the model now holds
    saved = load_file(f"{folder}/model.safetensors")
    held = model.state_dict()
    ignored = {"verifier_norm.weight", "verifier_lm_head.weight"}  # the verifier's, loaded apart
    x = torch.load(inputs, weights_only=True)
    with torch.no_grad():  # the embedding is the verifier's, loaded from the folder the config names
        drafts = model(
            hidden_states=x["aux"],
            input_ids=x["next_ids"],
            document_ids=torch.zeros_like(x["next_ids"]),
            ttt_steps=int(x["steps"]),
        )
    torch.save({"drafts": torch.stack([d[0] for d in drafts])}, out)
    report = {
        "class": type(model).__name__,
        "missing_keys": sorted(set(held) - set(saved) - ignored),
        "unexpected_keys": sorted(set(saved) - set(held)),
        "mismatched_keys": sorted(k for k in saved if k in held and not torch.equal(saved[k], held[k])),
        "layer_ids": list(model.target_layer_ids),
        "d2t": model.d2t.tolist() if model.d2t is not None else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
