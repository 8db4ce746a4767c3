"""SpecForge's offline records (`scripts/prepare_hidden_states.py`: rows_<g>-<g+N>/data_<i>.ckpt or
.ckpt.gz, torch.save'd dicts) taken in with --import: written here as SpecForge writes them, from the
tiny target's own forward, its layer order not ours, they train DFlash and EAGLE-3 runs whose every
loss and count equals the online run's; a DFlash-family record (no final state) is refused saying why,
and a record that would run code when unpickled is refused without running it."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.cache.build import dataset_rows
from draftdeck.drafter.train.cache.job import run_cache_hidden
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.errors import UsageError
from draftdeck.hidden.specforge import load_record
from draftdeck.jobs.context import LocalContext
from tests.unit.hidden.conftest import train_run

GROUP = 16  # SpecForge's file_group_size (2,000 by default): small, so that the rows span two groups


def specforge_records(world: dict[str, Path], out: Path, strategy: str, aux: list[int]) -> None:
    """Each dataset row's record as prepare_hidden_states.py --strategy `strategy` writes it: `aux` the
    HF hidden_states indices captured, concatenated along the last axis in that order; eagle3's
    hidden_state the final layer; every third record gzipped (its --compress)."""
    target = Target.load(world["target"], with_tokenizer=False)
    for i, (_, _, ids) in enumerate(dataset_rows([world["ds"]], None)):
        x = torch.from_numpy(ids)
        with torch.no_grad():
            hs = target.model(input_ids=x[None], output_hidden_states=True).hidden_states
        captured = torch.cat([hs[j] for j in aux], dim=-1)  # [1, T, k x hidden]
        record = {"input_ids": x, "loss_mask": torch.ones_like(x)}
        if strategy == "eagle3":
            record.update(aux_hidden_state=captured, hidden_state=hs[-1])
        else:
            record["hidden_states"] = captured
        group = out / f"rows_{i // GROUP * GROUP}-{i // GROUP * GROUP + GROUP}"
        group.mkdir(parents=True, exist_ok=True)
        if i % 3 == 2:
            buf = io.BytesIO()
            torch.save(record, buf)
            (group / f"data_{i}.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
        else:
            torch.save(record, group / f"data_{i}.ckpt")


def _import(world: dict[str, Path], src: Path, out: Path, stored: list[int]) -> None:
    params = CacheParams(
        inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), dtype="fp32",
        import_from=str(src), stored_layers=stored,
    )  # fmt: skip
    run_cache_hidden(params, LocalContext(out.with_name(out.name + "-ctx")))


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_specforge_eagle3_records_train_as_the_online_run(
    world: dict[str, Path], tmp_path: Path, drafter: str
) -> None:
    records, cache = world["root"] / "specforge-eagle3", world["root"] / "from-specforge"
    if not cache.exists():  # built once for both kinds
        specforge_records(world, records, "eagle3", aux=[1, 0])  # capture ids 0 and -1: not our order
        assert len(list(records.glob("rows_*"))) == 2 and list(records.rglob("*.ckpt.gz"))
        _import(world, records, cache, [1, 0, 2])
    online, _, _ = train_run(world, f"online-{drafter}-sf", drafter, truth_rows=0)
    cached, _, _ = train_run(world, f"specforge-{drafter}", drafter, hidden_states=str(cache))
    assert any(name == "train/loss" for _, name, _ in online) and cached == online


def test_a_dflash_record_has_no_final_state_and_is_refused_saying_so(
    world: dict[str, Path], tmp_path: Path
) -> None:
    specforge_records(world, tmp_path / "dflash", "dflash", aux=[1, 2])
    with pytest.raises(UsageError, match=r"DFlash-family record .* no final hidden state"):
        _import(world, tmp_path / "dflash", tmp_path / "cache", [1, 2])
    assert not (tmp_path / "cache").exists()


def test_records_missing_a_kind_s_layers_or_rows_are_refused(world: dict[str, Path], tmp_path: Path) -> None:
    specforge_records(world, tmp_path / "sf", "eagle3", aux=[0])  # the embeddings alone, then the final
    with pytest.raises(UsageError, match=r"reads hidden_states \[1\], which the files do not hold"):
        _import(world, tmp_path / "sf", tmp_path / "c1", [0, 2])
    with pytest.raises(UsageError, match="the record holds 2 layers"):
        _import(world, tmp_path / "sf", tmp_path / "c2", [0, 1, 2])
    specforge_records(world, tmp_path / "sf2", "eagle3", aux=[1, 0])
    next(tmp_path.joinpath("sf2").rglob("data_5.ckpt*")).unlink()  # a row SpecForge skipped (a NaN)
    with pytest.raises(UsageError, match=r"1 of \d+ rows have no SpecForge record .*\[5\]"):
        _import(world, tmp_path / "sf2", tmp_path / "c3", [1, 0, 2])


class _Payload:
    """What a hostile record could hold: unpickling it would call Path.touch (any callable could run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def test_a_record_that_would_run_code_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "data_0.ckpt"
    torch.save({"input_ids": torch.arange(4), "hook": _Payload(marker)}, path)
    with pytest.raises(UsageError, match="weights_only=True"):
        load_record(path)
    assert not marker.exists()
    buf = io.BytesIO()
    torch.save({"input_ids": torch.arange(4)}, buf)
    (tmp_path / "data_1.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
    assert torch.equal(load_record(tmp_path / "data_1.ckpt.gz")["input_ids"], torch.arange(4))
