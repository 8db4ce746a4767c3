"""The tally's speed-up against its definition: target-only time over speculative time for the same
tokens, pooled over prompts, from Generation timings whose answer is known. The eval's own tests can
only say the speed-up is positive (real timings on a shared machine), which a swapped ratio passes."""

from __future__ import annotations

import pytest

from draftdeck.drafter.eval.spec_decode import Generation
from draftdeck.drafter.eval.tally import Decoded, Tally


def _gen(tokens: int, seconds: float, cpu_seconds: float) -> Generation:
    return Generation(output_ids=list(range(tokens)), seconds=seconds, cpu_seconds=cpu_seconds)


def test_speedup_is_target_only_time_over_speculative_time() -> None:
    tally = Tally(block=4, greedy=True)
    # Two prompts of 12 and 8 tokens. Target alone: 20 tokens in 5 s wall (4 tok/s), 10 CPU s (2 tok/CPU s).
    # The drafter: the same 20 tokens in 1.25 s wall (16 tok/s), 2.5 CPU s (8 tok/CPU s): 4x both ways.
    # Untrained drafts: 20 tokens in 10 s wall and 40 CPU s, slower than the target alone.
    tally.add(
        Decoded(_gen(12, 3.0, 6.0), {"drafter": _gen(12, 1.0, 2.0), "untrained": _gen(12, 4.0, 16.0)}),
        {"prompt": 0},
    )
    tally.add(
        Decoded(_gen(8, 2.0, 4.0), {"drafter": _gen(8, 0.25, 0.5), "untrained": _gen(8, 6.0, 24.0)}),
        {"prompt": 1},
    )
    methods = tally.method_entries()
    assert methods["drafter"]["speedup_vs_target_only"] == pytest.approx(4.0)
    assert methods["drafter"]["cpu_speedup_vs_target_only"] == pytest.approx(4.0)
    assert methods["untrained"]["speedup_vs_target_only"] == pytest.approx(0.5)
    assert methods["untrained"]["cpu_speedup_vs_target_only"] == pytest.approx(0.25)
    # a method not decoded (baselines off) has no entry, rather than figures of nothing
    assert list(methods) == ["drafter", "untrained"]
    assert methods["drafter"]["lossless"] is True
