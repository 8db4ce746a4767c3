"""Drafter data: the split by conversation, epoch order, collation, and bad inputs refused before
any step with errors that name the file and the value."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from draftdeck.causal_lm import ModelFolderError
from draftdeck.drafter.model.config import DrafterConfigError
from draftdeck.drafter.train.data import (
    EmptySplitError,
    NoAnchorError,
    RowTooLongError,
    TokenizerMismatchError,
    TrainData,
    collate,
    is_heldout,
)
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.drafter.train.trainer import DeviceError
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import saved_target, write_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_target(tmp_path_factory.mktemp("t") / "target")


def _rows(n: int, length: int = 12) -> list[tuple[list[int], list[int]]]:
    return [([100 + (i + j) % 50 for j in range(length)], [0] * 3 + [1] * (length - 3)) for i in range(n)]


def _train(target: Path, ds: Path, out: Path, **kw: Any) -> LocalContext:
    ctx = LocalContext(out / "ctx")
    values: dict[str, Any] = dict(inputs=[str(ds)], target=str(target), out=str(out / "run"), block_size=4,
                                  batch_size=2, max_steps=2, heldout_fraction=0.3, device="cpu")  # fmt: skip
    values.update(kw)
    train(TrainParams(**values), ctx)
    return ctx


def test_split_is_by_conversation_and_deterministic(target: Path, tmp_path: Path) -> None:
    rows = _rows(40)
    ds = write_dataset(tmp_path / "ds", rows, target)
    a = TrainData([ds], heldout_fraction=0.25)
    b = TrainData([ds], heldout_fraction=0.25)
    assert [r.row for r in a.heldout] == [r.row for r in b.heldout] and 0 < len(a.heldout) < 40
    assert len(a.train) + len(a.heldout) == a.rows_in == 40
    assert all(is_heldout("gen.jsonl", r.row, 0.25) for r in a.heldout)
    assert sorted(a.epoch_order(0, 1).tolist()) == list(range(len(a.train)))
    assert a.epoch_order(0, 1).tolist() != a.epoch_order(0, 2).tolist()


def test_collate_pads_right_and_masks_padding() -> None:
    import numpy as np

    ids, att, lm = collate(
        [(np.array([5, 6, 7]), np.array([0, 1, 1])), (np.array([8]), np.array([1]))], pad_id=0
    )
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert att.tolist() == [[1, 1, 1], [1, 0, 0]] and lm.tolist() == [[0, 1, 1], [1, 0, 0]]


def test_a_dataset_from_another_tokenizer_is_refused_naming_both_fingerprints(
    target: Path, tmp_path: Path
) -> None:
    from draftdeck.chat.testing import generation_tags_tokenizer

    ds = write_dataset(tmp_path / "ds", _rows(20), generation_tags_tokenizer())
    with pytest.raises(TokenizerMismatchError) as e:
        _train(target, ds, tmp_path)
    assert str(ds) in str(e.value) and len(re.findall(r"fingerprint [0-9a-f]{64}", str(e.value))) == 2
    assert not (tmp_path / "run/checkpoints").exists()


def test_rows_without_anchor_too_long_rows_and_empty_heldout_are_refused(
    target: Path, tmp_path: Path
) -> None:
    no_anchor = write_dataset(tmp_path / "a", [([1, 2, 3, 4], [0, 1, 0, 1])] * 5, target)
    with pytest.raises(NoAnchorError, match="none of 5 rows has a DFlash anchor"):
        _train(target, no_anchor, tmp_path / "1")
    long = write_dataset(tmp_path / "b", _rows(10) + _rows(1, length=600), target)
    with pytest.raises(
        RowTooLongError, match=r"row gen\.jsonl:10 has 600 tokens, more than the target's 512"
    ):
        _train(target, long, tmp_path / "2")
    _train(target, long, tmp_path / "3", seq_length=64)  # truncation makes it usable
    few = write_dataset(tmp_path / "c", _rows(4), target)
    with pytest.raises(EmptySplitError, match="held-out split is empty"):
        _train(target, few, tmp_path / "4", heldout_fraction=0.001)


def test_settings_the_target_cannot_serve_are_refused(target: Path, tmp_path: Path) -> None:
    ds = write_dataset(tmp_path / "ds", _rows(20), target)
    with pytest.raises(DrafterConfigError, match=r"target_layer_ids \[9\] do not exist"):
        _train(target, ds, tmp_path / "1", target_layer_ids=[1, 9])
    with pytest.raises(ModelFolderError, match="does not exist"):
        _train(tmp_path / "nope", ds, tmp_path / "2")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="asks for a GPU"):
            _train(target, ds, tmp_path / "3", device="cuda")
        with pytest.raises(DeviceError, match="asks for a GPU"):
            _train(target, ds, tmp_path / "4", device="cuda", devices=2)
    with pytest.raises(ValidationError, match="extra_forbidden"):
        TrainParams(inputs=[str(ds)], target=str(target), out="x", block_szie=4)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="block_size"):
        TrainParams(inputs=[str(ds)], target=str(target), out="x", block_size=1)


def test_an_anchor_pair_never_straddles_two_rows() -> None:
    import numpy as np

    from draftdeck.drafter.train.data import _has_anchor

    masks = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=np.uint8)  # rows: [0 1] [1 0 1] [1 1] [0 1]
    offsets = np.array([0, 2, 5, 7, 9])
    assert _has_anchor(offsets, masks).tolist() == [False, False, True, False]


def test_the_split_does_not_depend_on_the_folder_the_data_lives_in() -> None:
    """Keyed on the absolute path, the same data split differently in another home or after a move
    (a held-out row of one tokenization a training row of the next)."""
    here = [is_heldout("/home/a/data/chat.jsonl", row, 0.3) for row in range(200)]
    assert here == [is_heldout("/tmp/elsewhere/chat.jsonl", row, 0.3) for row in range(200)]
    assert 30 < sum(here) < 90
