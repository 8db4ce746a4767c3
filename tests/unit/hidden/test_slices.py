"""A cache built in slices of rows and merged (the service's chunk tasks, a launcher's ranks) holds what
one process builds, row for row: the same ids and bit-equal states at fp32, the same manifest but for
where the shards are cut; two torchrun ranks (gloo) build it so; slices that disagree are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.cache.slices import build_slice, merge_slices, rank_rows, slice_rows
from draftdeck.hidden.store import MANIFEST, CacheError, HiddenCache
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from tests.browser.harness import free_port
from tests.conftest import REPO_ROOT


def _params(world: dict[str, Path], out: Path, **kw: object) -> CacheParams:
    return CacheParams(
        inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), **{"dtype": "fp32", **kw}
    )


def assert_same_cache(one: Path, other: Path) -> None:
    a, b = HiddenCache(one), HiddenCache(other)
    keep = ("layers", "num_layers", "hidden_size", "dtype", "seq_length", "datasets", "target_fingerprint")
    assert {k: getattr(a.mf, k) for k in keep} == {k: getattr(b.mf, k) for k in keep}
    assert (a.mf.rows, a.mf.tokens, a.mf.bytes > 0) == (b.mf.rows, b.mf.tokens, True)
    assert sorted(a.by_row) == sorted(b.by_row) and len(a.by_row) == a.mf.rows
    for key, e in a.by_row.items():
        f = b.by_row[key]
        assert torch.equal(a.ids(e), b.ids(f)), key
        assert torch.equal(a.hidden(e), b.hidden(f)), key  # bit-equal: each row its own forward at fp32
    assert a.verify_checksums() == [] and b.verify_checksums() == []


def test_rows_are_cut_into_slices_and_shares_that_cover_them_once() -> None:
    assert slice_rows(24, 10) == [range(0, 10), range(10, 20), range(20, 24)]
    assert [rank_rows(7, r, 3) for r in range(3)] == [range(0, 3), range(3, 5), range(5, 7)]
    assert [len(rank_rows(1, r, 2)) for r in range(2)] == [1, 0]


def test_slices_merged_hold_the_single_process_cache(
    world: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    params = _params(world, tmp_path / "merged", check_rows=12)
    ctx = LocalContext(tmp_path / "ctx")
    report, folders = Report(), []
    for k, rows in enumerate(slice_rows(24, 10)):
        folders.append(tmp_path / f"slice-{k}")
        part = build_slice(params, rows, folders[-1], ctx)
        assert (part.rows_in, part.rows_out) == (len(rows), len(rows))
        # the whole cache's first 12 rows are compared with a live forward, by the slices holding them
        assert part.extra["live_checked_rows"] == len(set(rows) & set(range(12)))
        report.merge(part)
    report.outputs = []
    merged = merge_slices(params, folders, report, seconds=1.0)
    assert (merged.rows_in, merged.rows_out) == (24, 24) and merged.extra["slices"] == 3
    assert len(json.loads((tmp_path / "merged" / MANIFEST).read_text())["shards"]) == 3
    assert not any(f.exists() for f in folders)
    assert_same_cache(cache, tmp_path / "merged")


def test_slices_that_disagree_are_refused_naming_what_differs(world: dict[str, Path], tmp_path: Path) -> None:
    ctx = LocalContext(tmp_path / "ctx")
    a = build_slice(_params(world, tmp_path / "x"), range(0, 2), tmp_path / "a", ctx)
    b = build_slice(_params(world, tmp_path / "x", dtype="bf16"), range(2, 4), tmp_path / "b", ctx)
    a.merge(b)
    a.outputs = []
    with pytest.raises(CacheError, match="its dtype differ from the first slice's"):
        merge_slices(_params(world, tmp_path / "out"), [tmp_path / "a", tmp_path / "b"], a, seconds=1.0)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_torchrun_ranks_build_the_single_process_cache(
    world: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ranked"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "-m", "draftdeck.cli", "cache-hidden", str(world["ds"]),
           "--target", str(world["target"]), "--out", str(out), "--dtype", "fp32"]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert "768 tokens" in res.stdout  # rank 0 speaks for the build: the whole cache's figures
    assert len(json.loads((out / MANIFEST).read_text())["shards"]) == 2  # one slice a rank
    assert not out.with_name("ranked.ranks").exists()
    assert_same_cache(cache, out)
