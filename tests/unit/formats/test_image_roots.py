"""Image files only from the data roots when given roots (a job run by the service): outside, after
symlinks and `..` are resolved, is `image_outside_roots`, whether or not the file is there; inside is
read as before; without roots (the CLI) any file is read."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.formats.common import RowRejected
from draftdeck.formats.images import ImageLimits, check, ref_from_uri
from draftdeck.formats.model import ImageRef
from tests.unit.formats.imaging import write_image


def _rejection(ref: ImageRef, limits: ImageLimits) -> RowRejected:
    with pytest.raises(RowRejected) as exc:
        check(ref, limits)
    return exc.value


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "data"
    return {
        "root": root,
        "inside": write_image(root / "imgs" / "a.png", (200, 30, 40)),
        "outside": write_image(tmp_path / "secret" / "s.png", (1, 2, 3)),
    }


def test_outside_is_refused_naming_the_roots_inside_is_read(world: dict[str, Path]) -> None:
    root, outside = world["root"], world["outside"]
    limits = ImageLimits(roots=(str(root),))
    assert check(ImageRef(path=str(world["inside"])), limits).data == world["inside"].read_bytes()
    for address in (str(outside), f"file://{outside}", "../secret/s.png", "imgs/../../secret/s.png"):
        ref = ref_from_uri(address, str(root), "x")
        got = _rejection(ref, limits)
        assert got.code == "image_outside_roots" and str(root) in got.reason, address
    # a file that is not there is refused the same way: the roots say nothing of what lies outside
    assert _rejection(ImageRef(path=str(outside.parent / "no.png")), limits).code == "image_outside_roots"
    # without roots (the CLI on the user's own files) the same file is read
    assert check(ImageRef(path=str(outside))).data == outside.read_bytes()
    # a path no filesystem takes is a rejection with or without roots, not a crash
    for given in (limits, ImageLimits()):
        assert _rejection(ImageRef(path=str(root / "a\x00.png")), given).code == "image_unreadable"


def test_a_link_inside_is_judged_by_where_it_points(world: dict[str, Path]) -> None:
    root = world["root"]
    limits = ImageLimits(roots=(str(root),))
    (root / "out.png").symlink_to(world["outside"])
    (root / "in.png").symlink_to(world["inside"])
    (root / "dir").symlink_to(world["outside"].parent, target_is_directory=True)
    for name in ("out.png", "dir/s.png"):
        got = _rejection(ImageRef(path=str(root / name)), limits)
        assert got.code == "image_outside_roots" and str(world["outside"]) in got.reason
    assert check(ImageRef(path=str(root / "in.png")), limits).data == world["inside"].read_bytes()


def test_convert_workers_reject_outside_rows_and_copy_nothing(world: dict[str, Path], tmp_path: Path) -> None:
    """The roots reach the parallel reader's worker processes: each outside row counted, its file not
    copied into the output's images/."""
    root = world["root"]
    rows = []
    for i in range(6):
        image = "imgs/a.png" if i % 2 else str(world["outside"])
        turns = [{"from": "human", "value": f"<image>row {i}?"}, {"from": "gpt", "value": f"answer {i}"}]
        rows.append({"conversations": turns, "images": [image]})
    src = root / "rows.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "out" / "rows.jsonl"
    opts = ConvertOptions(workers=2, chunk_bytes=200, image_roots=(str(root),))
    report = convert([src], out, "sharegpt", options=opts)
    assert report.extra["parallel"]["chunks"] > 1  # the rows were read by the worker processes
    assert report.rows_out == 3 and dict(report.rejected) == {"image_outside_roots": 3}
    stored = [p.read_bytes() for p in (out.parent / "images").iterdir()]
    assert stored == [world["inside"].read_bytes()]
