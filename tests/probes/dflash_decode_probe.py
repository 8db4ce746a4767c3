"""Run inside the `dflash` 0.1.0 venv (not the project's): greedy speculative decoding with z-lab's own
`dflash_generate`, an exported drafter and its target. Usage: python dflash_decode_probe.py DRAFTER
TARGET SPEC OUT, SPEC a JSON file {"prompts": [[ids]], "max_new_tokens": N, "stop": [ids]}; OUT gets,
per prompt, the new token ids and the tokens each verify step produced (`acceptance_lengths`)."""

import json
import sys
import time

import dflash.model as zlab
import torch
from transformers import AutoModelForCausalLM

# z-lab's timers synchronise CUDA; on the CPU a plain clock (the test's adaptation, not the product's)
zlab._cuda_time = time.perf_counter


def main(drafter_dir: str, target_dir: str, spec_path: str, out: str) -> None:
    torch.manual_seed(0)
    model = zlab.DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with open(spec_path) as f:
        spec = json.load(f)
    results = []
    for ids in spec["prompts"]:
        r = zlab.dflash_generate(
            model,
            target,
            torch.tensor([ids]),
            spec["max_new_tokens"],
            spec["stop"],
            temperature=0.0,
            return_stats=True,
        )
        results.append(
            {"output": r.output_ids[0, len(ids) :].tolist(), "acceptance_lengths": r.acceptance_lengths}
        )
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
