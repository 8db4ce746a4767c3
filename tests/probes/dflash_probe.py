"""Run inside the `dflash` 0.1.0 venv (not the project's): load an exported drafter folder into
z-lab's `DFlashDraftModel` and run it on saved inputs. Usage: python dflash_probe.py FOLDER IN OUT."""

import json
import sys

import torch
from dflash.model import DFlashDraftModel


def main(folder: str, inputs: str, out: str) -> None:
    model, info = DFlashDraftModel.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    model.eval()
    x = torch.load(inputs, weights_only=True)
    with torch.no_grad():
        hidden = model(
            position_ids=x["position_ids"],
            noise_embedding=x["noise_embedding"],
            target_hidden=x["target_hidden"],
        )
    torch.save({"hidden": hidden}, out)
    report = {
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": [str(k) for k in info.get("mismatched_keys", [])],
        "block_size": model.block_size,
        "target_layer_ids": list(model.target_layer_ids),
        "mask_token_id": model.mask_token_id,
        "class": type(model).__name__,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
