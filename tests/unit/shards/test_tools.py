"""A draft vocabulary read from a file (`draftdeck vocab`'s, SpecForge's, a checkpoint's) is the
mapping written, checked against the target's vocabulary; a bad file is refused naming it and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from draftdeck.errors import InputError, UsageError
from draftdeck.shards.tools import read_draft_vocab, vocab_of_counts, write_draft_vocab
from tests.support.planted import Payload, plant_torch

COUNTS = np.array([0, 9, 3, 7, 0, 5, 1, 8, 2, 0, 4, 6], dtype=np.int64)  # a 12-id target


def _written(tmp_path: Path, suffix: str) -> Path:
    vocab = vocab_of_counts(COUNTS, 5)
    path = tmp_path / f"vocab{suffix}"
    tensors = {"d2t": torch.from_numpy(vocab.d2t), "t2d": torch.from_numpy(vocab.t2d)}
    if suffix == ".pt":  # SpecForge's vocab_mapping.pt
        torch.save(tensors, path)
    elif suffix == ".safetensors":  # a checkpoint: the drafter's weights beside the mapping
        save_file({**tensors, "fc.weight": torch.zeros(2, 2)}, str(path))
    else:
        write_draft_vocab(vocab, path)
    return path


@pytest.mark.parametrize("suffix", [".npz", ".json", ".pt", ".safetensors"])
def test_every_format_reads_back_the_mapping_written(tmp_path: Path, suffix: str) -> None:
    want = vocab_of_counts(COUNTS, 5)
    other = COUNTS[::-1].copy()  # the run's own counts: they give the coverage, not the ids
    got = read_draft_vocab(_written(tmp_path, suffix), other)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.d2t, want.d2t)
    assert np.array_equal(got.t2d, want.t2d) and got.t2d.dtype == bool
    assert list(got.ids) == [1, 3, 5, 7, 11]
    assert got.coverage == pytest.approx(other[want.ids].sum() / other.sum())
    assert np.array_equal(got.counts, other[want.ids])


def test_a_vocabulary_over_the_tokenizer_fits_a_target_whose_embedding_is_padded(tmp_path: Path) -> None:
    """`draftdeck vocab` counts over the tokenizer (10 ids here); the target's embedding has 12 rows:
    the two past the tokenizer are never drafted."""
    vocab = vocab_of_counts(COUNTS[:10], 4)
    write_draft_vocab(vocab, tmp_path / "v.npz")
    got = read_draft_vocab(tmp_path / "v.npz", COUNTS)
    assert len(got.t2d) == 12 and not got.t2d[10:].any() and np.array_equal(got.ids, vocab.ids)


def _json(tmp_path: Path, name: str, **body: object) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    return path


def test_a_bad_file_is_refused_naming_it_and_why(tmp_path: Path) -> None:
    v = vocab_of_counts(COUNTS, 5)
    d2t, t2d = v.d2t.tolist(), v.t2d.tolist()
    cases = {
        "t2d has 13 entries; the target's vocabulary has 12": _json(
            tmp_path, "long", d2t=d2t, t2d=[*t2d, False]
        ),
        "t2d marks 5 ids; d2t has 4": _json(tmp_path, "short", d2t=d2t[:4], t2d=t2d),
        "no t2d": _json(tmp_path, "half", d2t=d2t),
        "no such file": tmp_path / "absent.npz",
        "not the increasing list": _json(
            tmp_path, "moved", d2t=[d2t[0] + 1, *d2t[1:]], t2d=t2d
        ),  # ids 2, 3, ...
    }
    for reason, path in cases.items():  # each names the file
        with pytest.raises(InputError, match=reason) as e:
            read_draft_vocab(path, COUNTS)
        assert str(path) in str(e.value)
    garbled = tmp_path / "garbled.npz"
    garbled.write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"garbled\.npz: cannot read a draft vocabulary"):
        read_draft_vocab(garbled, COUNTS)
    listed = tmp_path / "listed.json"
    listed.write_text("[1, 2]")
    with pytest.raises(InputError, match="a mapping of d2t and t2d expected, not list"):
        read_draft_vocab(listed, COUNTS)
    with pytest.raises(UsageError, match=r"vocab\.txt: a draft vocabulary is draftdeck vocab's"):
        read_draft_vocab(tmp_path / "vocab.txt", COUNTS)


def test_a_planted_file_runs_nothing_and_is_refused_by_name(tmp_path: Path) -> None:
    """SpecForge's vocab_mapping.pt is a pickle: one made to call a function is refused, the call never
    made; an .npz holding a pickled object array likewise (numpy refuses it, named here)."""
    marker = tmp_path / "ran"
    v = vocab_of_counts(COUNTS, 5)
    pt = plant_torch(tmp_path / "vocab_mapping.pt", marker, d2t=torch.from_numpy(v.d2t))
    with pytest.raises(InputError, match=r"vocab_mapping\.pt: refused: it asks to run code .*posix\.mkdir"):
        read_draft_vocab(pt, COUNTS)
    npz = tmp_path / "objects.npz"
    np.savez(npz, d2t=np.array([Payload(marker)], dtype=object), t2d=v.t2d)
    with pytest.raises(InputError, match=r"objects\.npz: cannot read a draft vocabulary .*allow_pickle"):
        read_draft_vocab(npz, COUNTS)
    assert not marker.exists()
