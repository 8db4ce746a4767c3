"""Training on rows with images (issue 55): the whole tiny VLM as the target, its vision tower reading
each row's pictures (looked up by the row's tokens), the drafter reading its hidden states at every
position and trained on the answers alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import ImageInputError, ImageRowConflict
from draftdeck.drafter.tiny_vlm import (
    IMAGE_PAD,
    ImageRow,
    image_row,
    image_token_count,
    load_image_processor,
    write_image_dataset,
)
from draftdeck.drafter.train.data import DataError, TrainData, collate
from draftdeck.drafter.train.images import image_token_id
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext

torch.set_num_threads(1)
WORDS = ["red", "circle", "square", "blue", "green", "box", "ring", "sun", "dot", "line"]


def _rows(folder: Path, pictures: list[Path], n: int, swap: dict[int, Path] | None = None) -> list[ImageRow]:
    """`n` rows: most a question about one picture (row i: picture i % 6), every fourth text alone;
    `swap` replaces a row's picture."""
    from transformers import AutoTokenizer

    tok, processor = AutoTokenizer.from_pretrained(folder), load_image_processor(folder)
    rows = []
    for i in range(n):
        shown = [] if i % 4 == 3 else [(swap or {}).get(i, pictures[i % 6])]
        answer = " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(8 + i % 5))
        rows.append(image_row(tok, processor, f"What is in picture {i}?", answer, shown))
    return rows


def _context(target: Path, data: TrainData) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's context features (DFlash's tapped layers) over the first two rows: (ids, features)."""
    vlm = Target.load(target, vision=True)
    assert data.image_rows is not None
    vlm.attach_images(data.image_rows)
    ids, att, _ = collate([data.example(r) for r in data.train[:2]], 0)
    return ids, vlm.context_features(ids, att, [0, 2, 3])[1]


def test_changing_an_image_changes_the_hidden_states(
    tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    a = TrainData([write_image_dataset(tmp_path / "a", _rows(tiny_vlm, pictures, 2), tiny_vlm)],
                  heldout_fraction=0, image_token_id=image_token_id(tiny_vlm))  # fmt: skip
    # picture 6 has picture 0's size (the same grid, the same tokens) and shows something else
    swapped = _rows(tiny_vlm, pictures, 2, swap={0: pictures[6]})
    b = TrainData([write_image_dataset(tmp_path / "b", swapped, tiny_vlm)], heldout_fraction=0,
                  image_token_id=image_token_id(tiny_vlm))  # fmt: skip
    assert a.rows_with_images == b.rows_with_images == 2
    ids_a, ctx_a = _context(tiny_vlm, a)
    ids_b, ctx_b = _context(tiny_vlm, b)
    assert torch.equal(ids_a, ids_b)  # the same tokens: only the picture differs
    pad = int(ids_a[0].tolist().index(image_token_id(tiny_vlm) or -1))
    assert torch.equal(ctx_a[0, :pad], ctx_b[0, :pad])  # before the picture: the same
    assert not torch.allclose(ctx_a[0, pad:], ctx_b[0, pad:])  # the picture's tokens and every token after
    assert torch.equal(ctx_a[1], ctx_b[1])  # the other row's picture is the same
    # the language model alone (text-only loading) reads the image tokens' embedding, not the picture
    text = Target.load(tiny_vlm).context_features(ids_a, None, [0, 2, 3])[1]
    assert not torch.allclose(text[0, pad:], ctx_a[0, pad:])


def test_rows_the_images_cannot_be_told_apart_by_are_refused(
    tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    one = _rows(tiny_vlm, pictures, 1)
    other = _rows(tiny_vlm, pictures, 1, swap={0: pictures[6]})  # same tokens, another picture
    ds = write_image_dataset(tmp_path / "both", [*one, *other], tiny_vlm)
    with pytest.raises(ImageRowConflict, match="row 0"):
        TrainData([ds], heldout_fraction=0, image_token_id=image_token_id(tiny_vlm))
    with pytest.raises(DataError, match="no vision tower"):
        TrainData([write_image_dataset(tmp_path / "one", one, tiny_vlm)], heldout_fraction=0)


def test_a_prompt_two_rows_share_is_decoded_with_its_own_row(
    tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """The same question about two pictures of one size, answered differently: both rows train (each
    whole row is its own), their shared prompt is ambiguous by its tokens alone, and a caller that says
    the row gets that row's picture."""
    from transformers import AutoTokenizer

    tok, processor = AutoTokenizer.from_pretrained(tiny_vlm), load_image_processor(tiny_vlm)
    rows = [image_row(tok, processor, "What is drawn?", answer, [picture])
            for answer, picture in (("a red box", pictures[0]), ("a green ring", pictures[6]))]  # fmt: skip
    data = TrainData([write_image_dataset(tmp_path / "shared", rows, tiny_vlm)], heldout_fraction=0,
                     image_token_id=image_token_id(tiny_vlm))  # fmt: skip
    assert data.rows_with_images == 2 and data.image_rows is not None
    vlm = Target.load(tiny_vlm, vision=True)
    vlm.attach_images(data.image_rows)
    prompt = torch.tensor([rows[0].ids[: rows[0].mask.index(1)]])
    assert prompt[0].tolist() == rows[1].ids[: rows[1].mask.index(1)]  # the same tokens
    with pytest.raises(ImageInputError, match="which row's"):
        vlm.context_features(prompt, None, [0])
    seen = [vlm.vision_inputs(prompt, None, [data.images_of(ref)]) for ref in data.train]
    assert not torch.equal(seen[0]["pixel_values"], seen[1]["pixel_values"])
    assert torch.equal(seen[0]["image_grid_thw"], seen[1]["image_grid_thw"])
    with pytest.raises(ImageInputError, match="not one of the data's rows"):  # cut inside the picture
        vlm.context_features(prompt[:, :5], None, [0])


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_train_on_rows_with_images(
    drafter: str, tiny_vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    rows = _rows(tiny_vlm, pictures, 16)
    pad = _pad(tiny_vlm)
    for r in rows:  # each picture expanded to its grid's token count, none of them trained
        image = [i for i, t in enumerate(r.ids) if t == pad]
        assert len(image) == sum(image_token_count(g) for g in r.grids)
        assert all(r.mask[i] == 0 for i in image) and sum(r.mask) > 0
    ds = write_image_dataset(tmp_path / "data", rows, tiny_vlm)
    ctx = LocalContext(tmp_path / "job")
    train(TrainParams(inputs=[str(ds)], target=str(tiny_vlm), out=str(tmp_path / "run"), drafter=drafter,
                      **({"block_size": 4} if drafter == "dflash" else {}), batch_size=4, max_steps=2,
                      heldout_fraction=0.25, truth_rows=2,
                      truth_max_new_tokens=6, device="cpu"), ctx)  # fmt: skip
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["steps_done"] == 2
    assert run["data"]["rows_with_images"] == sum(1 for r in rows if r.pictures)
    messages = [m for _, m, _, _ in ctx.events]
    assert any("with its vision tower" in m for m in messages)
    # and decoded with the pictures in its prompts, lossless, for either kind
    from draftdeck.drafter.eval.evaluate import run_eval
    from draftdeck.drafter.eval.params import EvalParams

    eval_ctx = LocalContext(tmp_path / "eval")
    run_eval(EvalParams(inputs=[str(ds)], target=str(tiny_vlm), checkpoint=str(tmp_path / "run"),
                        max_new_tokens=8, heldout_fraction=0.25, max_prompts=4), eval_ctx)  # fmt: skip
    ev = json.loads((eval_ctx.out_dir / "eval.json").read_text())["eval"]
    assert ev["lossless"] is True and ev["drafter"] == drafter
    assert ev["by_modality"]["image"]["prompts"] > 0


def _pad(folder: Path) -> int:
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(IMAGE_PAD)
    assert isinstance(pad, int)
    return pad
