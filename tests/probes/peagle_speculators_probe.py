"""Run inside the `speculators` 0.9.0 venv (not the project's): load a P-EAGLE export into speculators'
own `PEagleDraftModel` (the verifier's embedding from the target folder the config names)
and draft on saved inputs (the target's tapped states, the next tokens) at every depth of every chain.

Its forward trains: it draws its chains by COD sampling and returns a loss, no drafts. The probe gives
it every chain instead (its `generate_cod_sample_indices` replaced by the saved anchors and depths, in
its own order: depth by depth) and reads its head's logits as it computes them (a forward hook), so
its whole forward (the mask token, `mask_hidden`, the rope positions, its attention mask) drafts.
Usage: python PROBE FOLDER IN OUT."""

import json
import sys

import speculators.models.peagle.core as core
import torch
from safetensors.torch import load_file
from speculators.losses import resolve_loss_config
from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig


def main(folder: str, inputs: str, out: str) -> None:
    config = PEagleSpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # no flex compile on the CPU
    model = PEagleDraftModel.from_pretrained(folder, config=config, dtype=torch.float32)
    # its from_pretrained takes the verifier's embedding only where the buffer reads NaN, which freshly
    # allocated memory need not: take it from the verifier the config names, as its trainer does (the
    # export, as EAGLE-3's, carries no embedding; its checkpoint values are kept, lm_head included)
    model._load_verifier_weights(overwrite_embed_tokens=True)
    model.eval()
    saved = load_file(f"{folder}/model.safetensors")
    held = model.state_dict()
    ignored = {"verifier_norm.weight", "verifier_lm_head.weight"}  # the verifier's, loaded apart
    x = torch.load(inputs, weights_only=True)
    anchors, depths = x["anchors"], x["depths"]
    core.generate_cod_sample_indices = lambda **_: (anchors, depths)
    logits = []
    model.lm_head.register_forward_hook(lambda _m, _i, o: logits.append(o.detach()))
    t = x["next_ids"].shape[1]
    with torch.no_grad():
        model(
            hidden_states=x["aux"],
            input_ids=x["next_ids"],
            document_ids=torch.zeros_like(x["next_ids"]),
            loss_mask=torch.ones(1, t),
            verifier_last_hidden_states=torch.randn(1, t, model.hidden_size),  # its loss's, not read here
            num_depths=int(depths.max()) + 1,
            loss_config=resolve_loss_config("kl_div", "eager"),  # the fused one is a GPU kernel
        )
    torch.save({"drafts": logits[0][0].argmax(-1), "logits": logits[0][0]}, out)
    report = {
        "class": type(model).__name__,
        "missing_keys": sorted(set(held) - set(saved) - ignored),
        "unexpected_keys": sorted(set(saved) - set(held)),
        "mismatched_keys": sorted(k for k in saved if k in held and not torch.equal(saved[k], held[k])),
        "layer_ids": list(model.target_layer_ids),
        "mask_token_id": model.mask_token_id,
        "d2t": model.d2t.tolist() if model.d2t is not None else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
