"""Rows with images: every reader's shape read into Message.images, every rejection named and counted,
each output format written with the images stored once beside it, and read back the same."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.formats.images import image_bytes as ref_bytes
from draftdeck.formats.model import IMAGE_PLACEHOLDER, Conversation
from draftdeck.quality import Policy
from tests.unit.formats.imaging import data_uri, image_bytes, write_image
from tests.unit.formats.reading import read_file

RED, BLUE, GREEN = (200, 30, 40), (20, 40, 220), (30, 180, 60)


def _answer(text: str = "It shows colours.") -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def _text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def _mixed_file(root: Path) -> tuple[Path, dict[str, bytes]]:
    """A JSONL file of every shape of image row (kept ones first, then one row per rejection), its
    images in an `imgs/` folder beside it. Returns the file and the images' bytes by name."""
    data = root / "data"
    a = write_image(data / "imgs" / "a.png", RED)
    b = write_image(data / "imgs" / "b.jpg", BLUE, fmt="JPEG")
    inline = image_bytes(GREEN, size=(5, 5))
    rows: list[Any] = [
        # OpenAI image_url: a data URI between two texts
        {"messages": [_user(_text("Look: "), {"type": "image_url", "image_url": {"url": data_uri(inline)}},
                            _text(" what colour?")), _answer("Green.")]},
        # a path relative to the file, and file:// absolute; the Responses API's input_image
        {"messages": [_user({"type": "image_url", "image_url": "imgs/a.png"},
                            {"type": "input_image", "image_url": f"file://{b}"}, _text("Compare.")),
                      _answer("Red, then blue.")]},
        # the chat templates' {"type": "image", "image": ...}
        {"messages": [_user({"type": "image", "image": "imgs/b.jpg"}, _text("Colour?")), _answer("Blue.")]},
        # LLaMA-Factory: placeholders and an images list
        {"conversations": [{"from": "human", "value": "<image>first, <image>second: same?"},
                           {"from": "gpt", "value": "No."}], "images": ["imgs/a.png", "imgs/b.jpg"]},
        # LLaVA: one image
        {"id": "llava-1", "image": "imgs/a.png",
         "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                           {"from": "gpt", "value": "Red."}]},
        # Anthropic: a base64 image block
        {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(a.read_bytes()).decode()}},
            {"type": "text", "text": "And this?"}]}, {"role": "assistant", "content": "Red again."}]},
        # a text row beside them
        {"messages": [{"role": "user", "content": "No picture."}, _answer("Fine.")]},
        # rejections, one each
        {"messages": [_user({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                            _text("Cat?")), _answer()]},
        {"messages": [_user({"type": "image_url", "image_url": {"url": "imgs/gone.png"}}, _text("?")),
                      _answer()]},
        {"messages": [_user({"type": "image_url", "image_url": {"url": data_uri(b"GIF89a broken")}},
                            _text("?")), _answer()]},
        {"conversations": [{"from": "human", "value": "<image> only one placeholder"},
                           {"from": "gpt", "value": "x"}], "images": ["imgs/a.png", "imgs/b.jpg"]},
        {"messages": [{"role": "user", "content": "<audio>Say?"}, _answer()], "audios": ["clip.wav"]},
    ]  # fmt: skip
    path = data / "train.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path, {"a": a.read_bytes(), "b": b.read_bytes(), "inline": inline}


KEPT = 7
REJECTED = {
    "image_url_unread": 1,
    "image_missing": 1,
    "image_unreadable": 1,
    "image_placeholder_mismatch": 1,
    "multimodal_content": 1,
}


def _images(convs: list[Conversation]) -> list[list[tuple[str, bytes]]]:
    """Per conversation: each message's text and the bytes of its images, in order."""
    return [[(m.content, b"".join(ref_bytes(r) for r in m.images)) for m in conv.messages] for conv in convs]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_every_shape_is_read_and_every_fault_named(tmp_path: Path) -> None:
    path, img = _mixed_file(tmp_path)
    convs, report = read_file(path)
    assert (report.rows_in, len(convs)) == (KEPT + sum(REJECTED.values()), KEPT)
    assert dict(report.rejected) == REJECTED
    reasons = {code: ex[0].reason for code, ex in report.examples.items()}
    assert "https://example.com/cat.png" in reasons["image_url_unread"]
    assert str(path.parent / "imgs" / "gone.png") in reasons["image_missing"]
    assert "2 image(s)" in reasons["image_placeholder_mismatch"]
    per_row = _images(convs)
    assert per_row[0][0] == (f"Look: {IMAGE_PLACEHOLDER} what colour?", img["inline"])
    assert per_row[1][0] == (f"{IMAGE_PLACEHOLDER}{IMAGE_PLACEHOLDER}Compare.", img["a"] + img["b"])
    assert per_row[2][0] == (f"{IMAGE_PLACEHOLDER}Colour?", img["b"])
    assert per_row[3][0] == (
        f"{IMAGE_PLACEHOLDER}first, {IMAGE_PLACEHOLDER}second: same?",
        img["a"] + img["b"],
    )
    assert per_row[4][0] == (f"{IMAGE_PLACEHOLDER}\nWhat is it?", img["a"])
    assert per_row[5][0] == (f"{IMAGE_PLACEHOLDER}And this?", img["a"])
    assert per_row[6][0] == ("No picture.", b"")
    assert convs[4].meta == {"id": "llava-1"}  # the image key is read, not kept as a field
    assert all(not m.images for conv in convs for m in conv.messages if m.role == "assistant")


def test_images_refused_for_a_text_target(tmp_path: Path) -> None:
    path, _ = _mixed_file(tmp_path)
    convs, report = read_file(path, images="reject")
    assert len(convs) == 1 and convs[0].messages[0].content == "No picture."
    assert dict(report.rejected) == {"multimodal_content": 11}


def test_limits_reject_large_images(tmp_path: Path) -> None:
    path, _ = _mixed_file(tmp_path)
    # 8 x 6 (a, b) fit 48 pixels; the 5 x 5 inline image fits too: nothing more is rejected
    _, report = read_file(path, max_image_pixels=48)
    assert dict(report.rejected) == REJECTED
    _, report = read_file(path, max_image_pixels=47)  # a and b are over: only the inline row and text stay
    assert report.rows_out == 2 and report.rejected["image_too_large"] == 5


@pytest.mark.parametrize("to", ["openai", "sharegpt", "parquet"])
def test_each_format_stores_once_and_reads_back_the_same(tmp_path: Path, to: str) -> None:
    path, img = _mixed_file(tmp_path)
    before, _ = read_file(path)
    out = tmp_path / "out" / f"train.{'parquet' if to == 'parquet' else 'jsonl'}"
    report = convert([path], out, to)
    assert report.rows_out == KEPT and dict(report.rejected) == REJECTED
    stored = out.parent / "images"
    # three distinct images, each stored once under its hash, whatever the rows repeat
    assert sorted(p.name for p in stored.iterdir()) == sorted(
        [f"{_sha(img['a'])}.png", f"{_sha(img['b'])}.jpg", f"{_sha(img['inline'])}.png"]
    )
    after, again = read_file(out)
    assert again.rows_out == KEPT and not again.rejected
    assert _images(after) == _images(before)
    refs = [r for conv in after for m in conv.messages for r in m.images]
    assert refs and all(r.path is not None and Path(r.path).parent == stored for r in refs)
    # once more, from the converted file into the same folder: no image is written twice
    convert([out], out.parent / f"again.{out.suffix[1:]}", to)
    assert len(list(stored.iterdir())) == 3


def test_written_shapes(tmp_path: Path) -> None:
    path, img = _mixed_file(tmp_path)
    out = tmp_path / "o.jsonl"
    convert([path], out, "openai")
    first = orjson.loads(out.read_bytes().splitlines()[0])
    assert first["messages"][0]["content"] == [
        {"type": "text", "text": "Look: "},
        {"type": "image_url", "image_url": {"url": f"images/{_sha(img['inline'])}.png"}},
        {"type": "text", "text": " what colour?"},
    ]
    convert([path], tmp_path / "s.jsonl", "sharegpt")
    fourth = orjson.loads((tmp_path / "s.jsonl").read_bytes().splitlines()[3])
    assert fourth["conversations"][0]["value"] == "<image>first, <image>second: same?"
    assert fourth["images"] == [f"images/{_sha(img['a'])}.png", f"images/{_sha(img['b'])}.jpg"]


def test_workers_write_what_one_process_writes(tmp_path: Path) -> None:
    path, _ = _mixed_file(tmp_path)
    big = tmp_path / "data" / "big.jsonl"  # enough rows for several chunks, the images beside it
    big.write_bytes(path.read_bytes() * 40)
    one = convert([big], tmp_path / "one" / "o.jsonl", "openai", options=ConvertOptions(workers=1))
    two = convert(
        [big], tmp_path / "two" / "o.jsonl", "openai", options=ConvertOptions(workers=2, chunk_bytes=16 << 10)
    )
    assert one.rejected == two.rejected and one.rows_out == two.rows_out == 40 * KEPT
    assert (tmp_path / "one" / "o.jsonl").read_bytes() == (tmp_path / "two" / "o.jsonl").read_bytes()
    assert sorted(p.name for p in (tmp_path / "two" / "images").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "images").iterdir()
    )


def test_the_convert_command_keeps_or_refuses_images(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from app.cli.main import app

    path, _ = _mixed_file(tmp_path)

    def convert_command(out: str, *options: str) -> dict[str, Any]:
        """`draftdeck convert` of the mixed file to `out` with `options`: its report."""
        report = tmp_path / f"{out}.report.json"
        args = ["convert", str(path), "--out", str(tmp_path / out), *options, "--max-rejected", "1"]
        result = CliRunner().invoke(app, [*args, "--report", str(report)])
        assert result.exit_code == 0, result.output
        return dict(orjson.loads(report.read_bytes()))

    report = convert_command("text.jsonl", "--images", "reject")
    assert report["rows_out"] == 1 and report["rejected"] == {"multimodal_content": 11}
    assert not (tmp_path / "images").exists()
    report = convert_command("kept.jsonl", "--max-image-pixels", "47")
    assert report["rows_out"] == 2 and report["rejected"]["image_too_large"] == 5
    assert len(list((tmp_path / "images").iterdir())) == 1  # the inline image, the one kept


@pytest.mark.parametrize("to", ["openai", "parquet"])
def test_a_mix_keeps_its_sources_images_beside_it(tmp_path: Path, to: str) -> None:
    from draftdeck.mix import Recipe, mix

    path, _ = _mixed_file(tmp_path)
    recipe = Recipe.from_yaml(
        f"seed: 1\nto: {to}\nsources:\n  - name: pics\n    inputs: [{path}]\n    all: true\n",
        "recipe.yaml",
        base=tmp_path,
    )
    out = tmp_path / "mixed" / f"mix.{'parquet' if to == 'parquet' else 'jsonl'}"
    out.parent.mkdir()
    mix(recipe, out, policy=Policy(max_rejected=1.0))
    after, report = read_file(out)
    assert report.rows_out == KEPT and not report.rejected
    before, _ = read_file(path)
    assert sorted(map(repr, _images(after))) == sorted(map(repr, _images(before)))  # the mix shuffles rows
    assert len(list((out.parent / "images").iterdir())) == 3


def test_the_same_words_about_another_picture_are_no_duplicate(tmp_path: Path) -> None:
    a = write_image(tmp_path / "a.png", RED)
    b = write_image(tmp_path / "b.png", BLUE)

    def row(name: str) -> bytes:
        part = {"type": "image_url", "image_url": {"url": name}}
        return orjson.dumps({"messages": [_user(part, _text("Colour?")), _answer("A colour.")]}) + b"\n"

    path = tmp_path / "rows.jsonl"
    path.write_bytes(row(a.name) + row(b.name) + row(a.name))
    report = convert([path], tmp_path / "out" / "o.jsonl", "openai")
    assert report.rows_out == 3 and dict(report.warnings) == {"duplicate_conversation": 1}
    assert report.examples["duplicate_conversation"][0].line == 3


def test_gemini_image_parts(tmp_path: Path) -> None:
    png = image_bytes(RED)

    def row(part: dict[str, Any]) -> bytes:
        contents = [{"role": "user", "parts": [{"text": "What is it? "}, part]},
                    {"role": "model", "parts": [{"text": "Red."}]}]  # fmt: skip
        return orjson.dumps({"contents": contents}) + b"\n"

    path = tmp_path / "gemini.jsonl"
    path.write_bytes(
        row({"inlineData": {"mimeType": "image/png", "data": base64.b64encode(png).decode()}})
        + row({"inline_data": {"mime_type": "audio/wav", "data": "UklGRg=="}})
        + row({"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://bucket/cat.jpg"}})
    )
    convs, report = read_file(path)
    assert dict(report.rejected) == {"multimodal_content": 1, "image_url_unread": 1}
    assert "'audio/wav'" in report.examples["multimodal_content"][0].reason
    assert _images(convs) == [[(f"What is it? {IMAGE_PLACEHOLDER}", png), ("Red.", b"")]]
