"""Building a cache on the tiny world: the manifest names the target, the dataset, the layers and every
shard (with its sha256); the disk it takes is said before the target loads and a disk that cannot hold
it is refused; speculators' files written here pass speculators 0.9.0's own offline check; files
written in another layer order are taken in and mapped to the cache's order; a cache with a NaN, an
all-zero layer or another row's ids is refused with each code and its count, on import and on load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftdeck.drafter.model.cached_target import CachedTarget
from draftdeck.drafter.train.cache.build import dataset_rows
from draftdeck.drafter.train.cache.job import run_cache_hidden
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.cache.size import check_disk
from draftdeck.errors import JobFailed, UsageError
from draftdeck.hidden.store import MANIFEST, CacheError, HiddenCache
from draftdeck.jobs.context import LocalContext
from tests.conftest import PROBES
from tests.support.eval import speculators_venv
from tests.unit.hidden.conftest import vllm_files


def _params(world: dict[str, Path], out: Path, **kw: object) -> CacheParams:
    return CacheParams(inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), **kw)


@pytest.fixture(scope="module")
def built(world: dict[str, Path]) -> dict[str, object]:
    out = world["root"] / "cache-spec"
    ctx = LocalContext(world["root"] / "spec-ctx")
    report = run_cache_hidden(_params(world, out, dtype="bf16", format="speculators"), ctx)
    return {"out": out, "ctx": ctx, "report": report}


def test_the_manifest_names_target_data_layers_and_checksummed_shards(
    world: dict[str, Path], built: dict[str, object]
) -> None:
    out, ctx, report = Path(str(built["out"])), built["ctx"], built["report"]
    assert isinstance(ctx, LocalContext)
    mf = json.loads((out / MANIFEST).read_text())
    # DFlash reads target layers 0, 1 of the 2-layer target, EAGLE-3 hidden_states 0, 1, 2: the union
    assert mf["layers"] == [0, 1, 2] and mf["num_layers"] == 2 and mf["dtype"] == "bf16"
    assert mf["rows"] == 24 and mf["tokens"] == 24 * 32
    assert mf["bytes"] == sum(s["bytes"] for s in mf["shards"]) > 24 * 32 * 3 * 64 * 2
    assert mf["datasets"][0]["path"] == str(world["ds"].resolve())
    assert HiddenCache(out).verify_checksums() == []
    said = [m for _, m, _, _ in ctx.events if m.startswith("the cache takes")]
    assert said and "24 rows, 768 tokens x 3 layers x 64 hidden x 2 bytes (bf16) x 2" in said[0]
    assert ctx.last_progress == (24, 24, "rows")
    assert ctx.series("cache/tokens_per_s")[-1][1] > 0
    assert report.rows_out == 24 and report.extra["live_checked_rows"] == 4  # type: ignore[attr-defined]
    assert report.extra["speculators_files"] == 24  # type: ignore[attr-defined]


def test_a_disk_that_cannot_hold_it_is_refused_naming_both_figures(tmp_path: Path) -> None:
    import shutil

    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(UsageError, match=rf"takes .* \({free * 4:,} bytes\) but its disk has .* \({free:,}"):
        check_disk(tmp_path / "new" / "cache", free * 4)


@pytest.mark.slow
def test_speculators_own_offline_check_accepts_the_files(
    world: dict[str, Path], built: dict[str, object], tmp_path: Path
) -> None:
    venv = speculators_venv()
    ids = [row.tolist() for _, _, row in dataset_rows([world["ds"]], None)]
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    folder = Path(str(built["out"])) / "hidden_states"
    cmd = [str(venv / "bin" / "python"), str(PROBES / "hidden_speculators_probe.py"), str(folder),
           str(tmp_path / "ids.json"), str(tmp_path / "out.json")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got == {"found": list(range(24)), "corrupt": {}, "passed": 24, "failed": {}}


def test_files_in_another_layer_order_are_taken_in_as_the_built_cache(
    world: dict[str, Path], tmp_path: Path
) -> None:
    vllm_files(world, tmp_path / "vllm", [1, 0, 2])
    built = tmp_path / "built"
    run_cache_hidden(_params(world, built, dtype="fp32"), LocalContext(tmp_path / "c1"))
    imported = tmp_path / "imported"
    report = run_cache_hidden(
        _params(world, imported, dtype="fp32", import_from=str(tmp_path / "vllm"), stored_layers=[1, 0, 2]),
        LocalContext(tmp_path / "c2"),
    )
    assert report.rows_out == 24 and report.extra["live_checked_rows"] == 4
    a, b = HiddenCache(built), HiddenCache(imported)
    assert b.mf.layers == a.mf.layers == [0, 1, 2] and b.mf.source.startswith("imported from")
    for key, e in a.by_row.items():  # the same states in the same order, bit for bit
        assert torch.equal(a.hidden(e), b.hidden(b.by_row[key]))
    with pytest.raises(
        UsageError, match=r"drafter eagle3 reads hidden_states \[0\], which the files do not hold"
    ):
        run_cache_hidden(
            _params(world, tmp_path / "no", drafter=["eagle3"], import_from=str(tmp_path / "vllm"),
                    stored_layers=[1, 2]), LocalContext(tmp_path / "c3"),
        )  # fmt: skip
    with pytest.raises(UsageError, match=r"the final layer \(hidden_states\[2\]\) is not among them"):
        run_cache_hidden(
            _params(world, tmp_path / "no", drafter=["dflash"], import_from=str(tmp_path / "vllm"),
                    stored_layers=[1, 0, 3]), LocalContext(tmp_path / "c4"),
        )  # fmt: skip


def test_a_nan_a_zero_layer_and_another_rows_ids_are_refused_with_their_counts(
    world: dict[str, Path], built: dict[str, object], tmp_path: Path
) -> None:
    import shutil

    files = tmp_path / "files"
    shutil.copytree(Path(str(built["out"])) / "hidden_states", files)

    def spoil(i: int, how: str) -> None:
        d = load_file(str(files / f"hs_{i}.safetensors"))
        if how == "nan":
            d["hidden_states"][3, 1, 5] = float("nan")
        elif how == "zero":
            d["hidden_states"][:, 0] = 0
        else:
            d["token_ids"][7] += 1
        save_file(d, str(files / f"hs_{i}.safetensors"))

    for i, how in ((5, "nan"), (9, "zero"), (11, "zero"), (13, "ids")):
        spoil(i, how)
    out = tmp_path / "refused"
    with pytest.raises(JobFailed) as caught:
        run_cache_hidden(
            _params(world, out, import_from=str(files), stored_layers=[0, 1, 2]), LocalContext(tmp_path / "c")
        )
    report = caught.value.report
    assert dict(report.warnings) == {"hidden_nonfinite": 1, "hidden_zero_layer": 2, "hidden_ids_mismatch": 1}  # type: ignore[attr-defined]
    assert "first difference at token 7" in report.examples["hidden_ids_mismatch"][0].reason  # type: ignore[attr-defined]
    assert not out.exists() and not out.with_name("refused.partial").exists()


def test_a_spoiled_row_is_refused_when_a_run_reads_it(
    world: dict[str, Path], built: dict[str, object], tmp_path: Path
) -> None:
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(Path(str(built["out"])), cache)
    shard = cache / json.loads((cache / MANIFEST).read_text())["shards"][0]["filename"]
    d = load_file(str(shard))
    d["hidden"][32:64, 1] = 0  # row 1's middle layer: all zero, as vLLM's hybrid models wrote it
    save_file(d, str(shard), metadata={"format": "pt"})  # the same bytes long: only the values differ
    t = CachedTarget.open(cache, world["target"])
    rows = [torch.from_numpy(ids) for _, _, ids in dataset_rows([world["ds"]], None)]
    assert t.teacher_forced(rows[0][None], None, [0]).context.abs().sum() > 0  # row 0 is untouched
    with pytest.raises(CacheError, match="hidden_zero_layer: a row of 32 tokens: stored layer 1 is all zero"):
        t.teacher_forced(rows[1][None], None, [0])


def test_the_command_says_the_disk_before_it_runs_and_the_throughput_after(
    world: dict[str, Path], tmp_path: Path
) -> None:
    import os
    import sys

    out = tmp_path / "cache"
    cmd = [sys.executable, "-m", "draftdeck.cli", "cache-hidden", str(world["ds"]), "--target",
           str(world["target"]), "--out", str(out), "--drafter", "dflash", "--dtype", "fp16"]  # fmt: skip
    env = {**os.environ, "COLUMNS": "400", "DRAFTDECK_HOME": str(tmp_path / "home")}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    said = res.stdout.splitlines()
    assert said[0].startswith(
        "the cache takes 192.0 KiB (196,608 bytes): 24 rows, 768 tokens x 2 layers x 64 hidden x 2 bytes"
        " (fp16); with --compress zstd about "
    )
    assert "hidden_states [1, 2]" in said[-1] and "rows/s" in said[-1] and "MB/s" in said[-1]
    assert json.loads((out / MANIFEST).read_text())["dtype"] == "fp16"


def test_rows_of_one_length_share_a_forward_and_keep_their_own_states(
    world: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    """The 24 rows of 32 tokens: one forward for all (the default 8,192 tokens), 12 of two rows, or one
    row a forward: every row's stored states bit-equal at fp32, unpadded."""
    report = run_cache_hidden(_params(world, tmp_path / "one", dtype="fp32", batch_tokens=1),
                              LocalContext(tmp_path / "one-ctx"))  # fmt: skip
    pairs = run_cache_hidden(_params(world, tmp_path / "two", dtype="fp32", batch_tokens=64),
                             LocalContext(tmp_path / "two-ctx"))  # fmt: skip
    assert report.extra["forwards"] == 24 and pairs.extra["forwards"] == 12
    one, two, whole = HiddenCache(tmp_path / "one"), HiddenCache(tmp_path / "two"), HiddenCache(cache)
    assert len(one.by_row) == len(whole.by_row) == 24
    for key, e in one.by_row.items():
        alone = one.hidden(e)
        assert torch.equal(alone, whole.hidden(whole.by_row[key]))
        assert torch.equal(alone, two.hidden(two.by_row[key]))
