"""The sample page's source panel shows a row's images as thumbnails where they stood, served only from
the data roots (or the dataset's own images/ folder); a URL is shown as text and never loaded."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.datasets import build_tokenizer, encode_chat, load_tokenizer, write_dataset
from tests.support.web import form_token
from tests.unit.formats.imaging import data_uri, image_bytes, write_image


@pytest.fixture
def client(migrated: Path) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app()) as c:
        c.get("/datasets")  # sets the CSRF cookie
        yield c


def _registered(client: Any, path: Path) -> int:
    r = client.post("/datasets", data={"path": str(path), "csrf": form_token(client)}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return int(r.headers["location"].rsplit("/", 1)[1])


def _dataset(client: Any, migrated: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """A dataset of two rows whose source rows hold images: a file in the data roots, a URL, inline
    data (row 0), and a file outside the roots (row 1)."""
    data = migrated / "data"
    a = write_image(data / "imgs" / "a.png", (200, 30, 40))
    outside = write_image(tmp_path / "elsewhere" / "o.png", (1, 2, 3))  # not under a data root
    inline = image_bytes((30, 180, 60), fmt="JPEG")
    rows = [
        {"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<script>alert(1)</script> look: "},
                {"type": "image_url", "image_url": {"url": "imgs/a.png"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
                {"type": "image_url", "image_url": {"url": data_uri(inline, "image/jpeg")}},
                {"type": "image_url", "image_url": {"url": "imgs/gone.png"}}]},
            {"role": "assistant", "content": "Red, unknown, green."}]},
        {"conversations": [{"from": "human", "value": "<image>far away?"}, {"from": "gpt", "value": "Yes."}],
         "images": [str(outside)]},
    ]  # fmt: skip
    source = data / "rows.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    tok = build_tokenizer(tmp_path / "tok")
    tokenized = [
        {**encode_chat(load_tokenizer(tok), [{"role": "assistant", "content": "hi"}]),
         "source": str(source), "source_row": line}
        for line in (1, 2)
    ]  # fmt: skip
    ds = write_dataset(migrated / "datasets" / "vlm", tokenized, tok)
    return _registered(client, ds), {"a": a.read_bytes(), "inline": inline, "ds": ds}


def test_thumbnails_in_place_urls_as_text_and_paths_confined(
    client: Any, migrated: Path, tmp_path: Path
) -> None:
    ds_id, files = _dataset(client, migrated, tmp_path)
    panel = client.get(f"/datasets/{ds_id}/rows/0/source").text
    base = f"/datasets/{ds_id}/rows/0/source/images/"
    # in place: after the text that preceded it, the URL shown as text between the two images
    text_at = panel.index("look: ")
    first, second = panel.index(f'<img src="{base}0"'), panel.index(f'<img src="{base}1"')
    url_at = panel.index("image URL, not loaded: ")
    assert text_at < first < url_at < second
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panel and "<script>alert" not in panel
    assert 'src="https://' not in panel and "https://example.com/x.png" in panel
    r = client.get(f"{base}0")
    assert r.status_code == 200 and r.content == files["a"] and r.headers["content-type"] == "image/png"
    assert r.headers["x-content-type-options"] == "nosniff"
    r = client.get(f"{base}1")
    assert r.status_code == 200 and r.content == files["inline"] and r.headers["content-type"] == "image/jpeg"
    assert client.get(f"{base}2").status_code == 404  # the URL is no image the server reads
    assert f"image: no image file at {migrated / 'data' / 'imgs' / 'gone.png'}" in panel  # a note, no <img>
    # a file outside the data roots is never served, though the row names it, and the page does not
    # say whether it exists: a note, no <img> that would answer 403 for a file there and 404 for none
    far = client.get(f"/datasets/{ds_id}/rows/1/source").text
    assert "is outside the data roots" in far and f"/datasets/{ds_id}/rows/1/source/images/" not in far
    assert client.get(f"/datasets/{ds_id}/rows/1/source/images/0").status_code == 403
    # the dataset's own images/ folder: stored names only
    stored = files["ds"] / "images"
    stored.mkdir()
    name = f"{hashlib.sha256(files['a']).hexdigest()}.png"
    (stored / name).write_bytes(files["a"])
    assert client.get(f"/datasets/{ds_id}/images/{name}").content == files["a"]
    for bad in ("..%2F..%2Fetc%2Fpasswd", "a.png", name.upper()):
        assert client.get(f"/datasets/{ds_id}/images/{bad}").status_code == 404
