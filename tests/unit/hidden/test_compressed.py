"""Compressed caches (`--compress zstd[:LEVEL]`): lossless (every row's states bit-equal to the plain
cache's, a run from it trains as the run from the plain cache does), smaller on disk, checksummed and
refused when damaged; the disk said before the build is the compressed estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.train.cache.job import run_cache_hidden
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.cache.size import ZSTD_RATIOS, Projection
from draftdeck.hidden.compression import parse_compression
from draftdeck.hidden.store import MANIFEST, CacheError, HiddenCache
from draftdeck.jobs.context import LocalContext
from tests.unit.hidden.conftest import train_run

_BUILT: dict[Path, LocalContext] = {}  # each cache built once for the module's tests, with its log


def _build(world: dict[str, Path], name: str, **given: object) -> tuple[Path, LocalContext]:
    out = world["root"] / name
    if out not in _BUILT:
        params = CacheParams(inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), **given)
        _BUILT[out] = LocalContext(world["root"] / f"{name}-ctx")
        run_cache_hidden(params, _BUILT[out])
    return out, _BUILT[out]


def test_compressed_rows_equal_the_plain_ones_bit_for_bit(world: dict[str, Path]) -> None:
    plain_dir, _ = _build(world, "bf16-plain", dtype="bf16")
    zstd_dir, ctx = _build(world, "bf16-zstd", dtype="bf16", compress="zstd:5")
    plain, zstd = HiddenCache(plain_dir), HiddenCache(zstd_dir)
    mf = json.loads((zstd_dir / MANIFEST).read_text())
    assert (mf["compression"], mf["version"]) == ("zstd:5", 2)
    assert json.loads((plain_dir / MANIFEST).read_text())["version"] == 1  # older readers read it
    assert plain.by_row.keys() == zstd.by_row.keys() and len(plain.by_row) > 0
    for key, e in plain.by_row.items():
        a, b = plain.hidden(e), zstd.hidden(zstd.by_row[key])
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
        assert torch.equal(plain.ids(e), zstd.ids(zstd.by_row[key]))
    assert zstd.mf.bytes < plain.mf.bytes
    assert zstd.verify_checksums() == []
    said = [m for level, m, _, _ in ctx.events if level == "info" and "stored with zstd:5" in m]
    assert len(said) == 1  # the disk said before the build names the compressed estimate


def test_a_run_from_the_compressed_cache_equals_the_run_from_the_plain_one(world: dict[str, Path]) -> None:
    plain_dir, _ = _build(world, "bf16-plain", dtype="bf16")
    zstd_dir, _ = _build(world, "bf16-zstd", dtype="bf16", compress="zstd:5")
    plain, _, _ = train_run(world, "from-bf16-plain", "dflash", hidden_states=str(plain_dir))
    zstd, _, _ = train_run(world, "from-bf16-zstd", "dflash", hidden_states=str(zstd_dir))
    assert any(name == "train/loss" for _, name, _ in plain) and zstd == plain


def test_a_damaged_frame_is_refused(world: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    zstd_dir, _ = _build(world, "bf16-zstd", dtype="bf16", compress="zstd:5")
    bad = tmp_path / "bad"
    shutil.copytree(zstd_dir, bad)
    shard = sorted(bad.glob("hidden-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-40:-20] = bytes(20)  # inside the last row's frame (the ids and offsets come first)
    shard.write_bytes(bytes(data))
    cache = HiddenCache(bad)
    assert cache.verify_checksums() == [shard.name]
    last = max(cache.by_row.values(), key=lambda e: (e.shard, e.start))
    with pytest.raises(CacheError, match="frame"):
        cache.hidden(last)


def test_the_compression_setting_and_the_disk_it_projects() -> None:
    assert parse_compression("zstd") == "zstd:3" and parse_compression("ZSTD:19") == "zstd:19"
    assert parse_compression(None) is None and parse_compression("none") is None
    for bad in ("gzip", "zstd:0", "zstd:23", "zstd:x"):
        with pytest.raises(ValueError, match="zstd or zstd:LEVEL"):
            parse_compression(bad)
    plain = Projection(10, 1000, [2, 5, 8], 64, "bf16")
    packed = Projection(10, 1000, [2, 5, 8], 64, "bf16", compression="zstd:3")
    assert plain.bytes == packed.bytes == 1000 * 3 * 64 * 2
    assert plain.disk_bytes == plain.bytes  # the disk check reads the figure of what is written
    assert packed.disk_bytes == packed.zstd_bytes == int(packed.bytes / ZSTD_RATIOS["bf16"])
    assert "stored with zstd:3" in packed.said() and "with --compress zstd about" in plain.said()
    twice = Projection(10, 1000, [2, 5, 8], 64, "fp32", copies=2, compression="zstd:3")
    one = 1000 * 3 * 64 * 4  # speculators' files beside the cache are never compressed
    assert twice.disk_bytes == int(one / ZSTD_RATIOS["fp32"]) + one


def test_the_command_compresses_and_says_so(world: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdeck.cli import app

    out = tmp_path / "cache"
    args = ["cache-hidden", str(world["ds"]), "--target", str(world["target"]), "--out", str(out),
            "--drafter", "dflash", "--compress", "zstd:7"]  # fmt: skip
    done = CliRunner().invoke(app, args, env={"COLUMNS": "400", "DRAFTDECK_HOME": str(tmp_path / "home")})
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "stored with zstd:7: about" in text and "bf16, zstd:7), hidden_states [1, 2]" in text
    assert json.loads((out / MANIFEST).read_text())["compression"] == "zstd:7"
    refused = CliRunner().invoke(app, [*args[:-1], "gzip"])
    assert refused.exit_code != 0 and "zstd or zstd:LEVEL" in " ".join(refused.output.split())
