"""draftdeck.formats.images: addresses, checks with their named rejections, the content-addressed store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from draftdeck.formats.common import RowRejected
from draftdeck.formats.images import (
    ImageLimits,
    check,
    check_messages,
    is_stored_name,
    ref_from_uri,
    store,
)
from draftdeck.formats.model import ImageRef, Message
from draftdeck.issue_codes import CODES
from tests.unit.formats.imaging import data_uri, image_bytes, write_image


def code_of(fn, *args, **kwargs) -> str:
    with pytest.raises(RowRejected) as exc:
        fn(*args, **kwargs)
    assert exc.value.code in CODES  # every rejection is a documented issue code
    return exc.value.code


class TestAddresses:
    def test_data_uri_decodes_to_the_bytes(self):
        data = image_bytes()
        ref = ref_from_uri(data_uri(data), None, "x")
        assert ref.data == data and ref.mime == "image/png" and ref.path is None

    def test_relative_path_and_file_uri_resolve_against_the_base(self, tmp_path: Path):
        assert ref_from_uri("img/a.png", str(tmp_path), "x").path == str(tmp_path / "img" / "a.png")
        assert ref_from_uri("file:img/a.png", str(tmp_path), "x").path == str(tmp_path / "img" / "a.png")
        assert ref_from_uri(f"file://{tmp_path}/b%20c.png", "/elsewhere", "x").path == str(
            tmp_path / "b c.png"
        )
        assert ref_from_uri("/abs/d.png", str(tmp_path), "x").path == "/abs/d.png"

    def test_urls_are_kept_unread(self):
        for url in ("https://example.com/a.png", "http://x/y.jpg", "s3://bucket/k.png", "file://host/a.png"):
            ref = ref_from_uri(url, None, "x")
            assert ref.url == url and ref.path is None and ref.data is None
            assert code_of(check, ref) == "image_url_unread"

    def test_broken_data_uri_is_unreadable(self):
        assert code_of(ref_from_uri, "data:image/png;base64", None, "x") == "image_unreadable"


class TestChecks:
    def test_real_format_is_sniffed_and_hashed(self, tmp_path: Path):
        path = write_image(tmp_path / "photo.png", fmt="JPEG")  # a JPEG under a .png name
        ref = ImageRef(path=str(path), mime="image/png")
        checked = check(ref)
        assert (checked.format, checked.ext, checked.mime) == ("JPEG", "jpg", "image/jpeg")
        assert checked.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert ref.sha256 is None  # not stored: nothing names a file yet
        name = store(ref, tmp_path / "images")
        assert (name, ref.sha256, ref.mime) == (f"{checked.sha256}.jpg", checked.sha256, "image/jpeg")
        assert (checked.width, checked.height) == (8, 6)

    def test_missing_unreadable_and_truncated(self, tmp_path: Path):
        assert code_of(check, ImageRef(path=str(tmp_path / "nope.png"))) == "image_missing"
        assert code_of(check, ImageRef(path=str(tmp_path))) == "image_missing"  # a folder
        assert code_of(check, ImageRef(data=b"not an image at all")) == "image_unreadable"
        whole = image_bytes(size=(64, 64), fmt="PNG")
        assert code_of(check, ImageRef(data=whole[: len(whole) // 2])) == "image_unreadable"

    def test_limits_on_bytes_and_pixels(self, tmp_path: Path):
        path = write_image(tmp_path / "a.png", size=(40, 30))
        size = path.stat().st_size
        assert code_of(check, ImageRef(path=str(path)), ImageLimits(max_bytes=size - 1)) == "image_too_large"
        assert (
            code_of(check, ImageRef(data=path.read_bytes()), ImageLimits(max_bytes=size - 1))
            == "image_too_large"
        )
        assert (
            code_of(check, ImageRef(path=str(path)), ImageLimits(max_pixels=40 * 30 - 1)) == "image_too_large"
        )
        assert check(ImageRef(path=str(path)), ImageLimits(max_bytes=size, max_pixels=40 * 30)).width == 40

    def test_placeholders_must_match_images(self, tmp_path: Path):
        ref = ImageRef(data=image_bytes())
        good = [Message("user", "<image>what is this?", images=[ref]), Message("assistant", "red")]
        assert check_messages(good) == 1
        bad = [Message("user", "<image><image>two?", images=[ImageRef(data=image_bytes())])]
        assert code_of(check_messages, bad) == "image_placeholder_mismatch"


class TestStore:
    def test_stored_once_under_its_hash(self, tmp_path: Path):
        data = image_bytes(fmt="JPEG")
        folder = tmp_path / "images"
        names = {store(ImageRef(data=data), folder) for _ in range(3)}
        name = names.pop()
        assert not names and is_stored_name(name) and name.endswith(".jpg")
        assert os.listdir(folder) == [name]  # one file, no temporary left behind
        assert (folder / name).read_bytes() == data
        other = store(ImageRef(data=image_bytes(color=(1, 2, 3))), folder)
        assert other != name and sorted(os.listdir(folder)) == sorted([name, other])

    def test_stored_names_only(self):
        good = hashlib.sha256(b"x").hexdigest() + ".png"
        assert is_stored_name(good)
        for bad in ("../" + good, good.upper(), good + "/x", "a.png", good[:-4] + ".p/g", good[:-4]):
            assert not is_stored_name(bad)
