"""What `draftdeck demo` costs, measured as a user runs it: the one source of the figures that the
README, the guide (docs/index.md) and `draftdeck demo --help` quote (tests/docs/test_demo_figures.py
holds them to these sentences). `python benchmarks/demo.py [--full]` measures them again; update the
numbers here, then the pages where that test says they differ.
"""

from __future__ import annotations

from dataclasses import dataclass

# where and when: a shared machine's figures are the machine's as much as the demo's
MEASURED_ON = "2 cores shared with other work (load average 3 to 5), 2026-12-06"


@dataclass(frozen=True)
class DemoCost:
    built_s: int  # a run on a home where its world was built before: the world reused
    built_mib: int  # peak RSS
    first_s: int | None = None  # the first run: the tiny world (tokenizer, target, prompts) built too
    first_mib: int | None = None


QUICK = DemoCost(built_s=117, built_mib=709, first_s=287, first_mib=832)
QUICK_EAGLE3 = DemoCost(built_s=652, built_mib=2277)  # `--quick --drafter eagle3` after `--quick`
FULL = DemoCost(built_s=311, built_mib=740, first_s=1035, first_mib=893)


def _minutes(seconds: int) -> str:
    return f"{seconds} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def cost(demo: DemoCost) -> str:
    """The sentence every page quotes for one demo."""
    assert demo.first_s is not None and demo.first_mib is not None, "measured on a built world only"
    return (
        f"{_minutes(demo.first_s)} the first time (peak RSS {demo.first_mib} MiB), "
        f"{_minutes(demo.built_s)} once its world is built ({demo.built_mib} MiB)"
    )


def cost_on_built(demo: DemoCost) -> str:
    """The sentence for a demo run on a world built earlier (`--drafter eagle3` after `--quick`)."""
    return f"{_minutes(demo.built_s)} on the quick demo's world (peak RSS {demo.built_mib} MiB)"


def help_line() -> str:
    """`demo --quick`'s help: the quick demo's cost."""
    return f"a smaller world and run: {cost(QUICK)}, on {MEASURED_ON}"
