"""Each target architecture end to end on the CPU, past its sliding window
(`draftdeck.drafter.tiny_targets.end_to_end`): a tiny random model saved as a model folder with the
test tokenizer, its own greedy answers as the data (regenerate --local, then tokenize with its chat
template), `train` (pre-flight, target agreement, both walked taus), `eval` (greedy: lossless, and the
walk equals real decoding step for step; sampled), `export-drafter` read back. Qwen3.5 and Gemma 3
as published carry a vision tower: only their language model is loaded, and the logs say so. The same
path with the real Qwen3.6 vocabulary: benchmarks/targets.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdeck.drafter.tiny_targets import ARCHITECTURES, WITH_VISION, end_to_end


@pytest.mark.slow
@pytest.mark.parametrize("arch", [*ARCHITECTURES[1:], *WITH_VISION])  # [0], plain Qwen3, is every test's
def test_train_eval_export_past_the_window(arch: str, tmp_path: Path) -> None:
    from draftdeck.chat.testing import small_bpe_tokenizer

    run = end_to_end(arch, tmp_path, small_bpe_tokenizer())
    assert run.rows >= 8  # of 16 prompts: a random model may end an answer at once (rejected as empty)
    assert run.lossless and run.walk_equals_real and run.exported
    assert run.sampled_verify_steps > 0
    assert run.vision_parameters == 0
    assert ("vision tower's weights are not loaded" in run.loaded) == (arch in WITH_VISION)
    assert any(run.loaded in message for message in run.events)  # said in the job's log
