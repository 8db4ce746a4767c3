"""Every script in benchmarks/ runs at its --smoke size: share 2 of tests/support/benchmark_smoke.py's
(see test_benchmarks_smoke.py)."""

import pytest

from tests.support.benchmark_smoke import smoke_test

pytestmark = pytest.mark.slow

test_benchmark_runs_at_its_smoke_size_and_prints_its_table = smoke_test(2)
