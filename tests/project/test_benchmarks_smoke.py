"""Every script in benchmarks/ runs at its --smoke size and prints its table: the first of
tests/support/benchmark_smoke.py's shares, and the checks of the check itself (the shares are spread
over three files so that `make test`'s workers, a file each, run them side by side)."""

from __future__ import annotations

import pytest

from tests.support.benchmark_smoke import PARTS, RUNS, SCRIPTS, markdown_table, part, smoke_test

pytestmark = pytest.mark.slow

test_benchmark_runs_at_its_smoke_size_and_prints_its_table = smoke_test(0)


def test_the_table_check_reads_a_table_and_refuses_a_rule_less_one() -> None:
    assert markdown_table("x\n| a | b |\n|---|--:|\n| 1 | 2 |\n\nafter") == [["a", "b"], ["1", "2"]]
    assert markdown_table("| a | b |\n| 1 | 2 |") == []
    assert markdown_table("  a | b\n----+---\n  1 | 2") == []


def test_every_script_is_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"truth.py", "drafters.py", "eval_decode.py", "train_gpu.py", "serve_gpu.py"} <= names, names
    assert not any(name.startswith("_") for name in names)


def test_the_shares_hold_every_run_once() -> None:
    shares = [run for k in range(PARTS) for run in part(k)]
    assert sorted(map(str, shares)) == sorted(map(str, RUNS))
