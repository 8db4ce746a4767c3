"""Regeneration with images in the rows: a local VLM reads them (the tiny VLM world), an OpenAI-compatible
server is sent them as data URI content parts in place, a text-only target refuses them by name."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftdeck.drafter.tiny_vlm import (
    image_token_count,
    load_image_processor,
    write_tiny_images,
    write_tiny_vlm,
)
from draftdeck.errors import JobFailed
from draftdeck.formats.images import DEFAULT_LIMITS, ref_from_uri
from draftdeck.jobs.context import LocalContext
from draftdeck.regenerate import RegenerateParams, run_regenerate
from draftdeck.regenerate.images import data_uri
from draftdeck.regenerate.local import LocalBackend
from draftdeck.regenerate.testing import tiny_qwen3
from tests.support.regen_standin import StandIn, completion, standin


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "target", seed=0)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_tiny_images(tmp_path_factory.mktemp("pictures"), n=6)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _input(folder: Path, first: Path, second: Path) -> Path:
    """Three prompts: OpenAI image_url parts (a path), a LLaMA-Factory <image> row, and text alone."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": str(first)}},
            {"type": "text", "text": "this picture?"},
        ]}]},
        {"messages": [{"role": "user", "content": "<image>Describe the shapes."}], "images": [str(second)]},
        {"messages": [{"role": "user", "content": "Tell me a story."}]},
    ]  # fmt: skip
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _params(vlm: Path, src: Path, out: Path) -> RegenerateParams:
    return RegenerateParams(inputs=[str(src)], out=str(out), local=str(vlm), max_tokens=12, temperature=0,
                            keep_cut_off=True)  # fmt: skip  # (a random model seldom stops by itself)


def _local(vlm: Path, src: Path, out: Path, ctx: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    report = run_regenerate(_params(vlm, src, out), LocalContext(ctx))
    counts = {"rows_out": report.rows_out, "rejected": sum(report.rejected.values())}
    return _rows(out), {**counts, "prompt_tokens": report.extra["regenerate"]["prompt_tokens"]}


def _image_tokens(vlm: Path, picture: Path) -> int:
    from PIL import Image

    with Image.open(picture) as image:
        grid = load_image_processor(vlm)([image.convert("RGB")], return_tensors="pt")["image_grid_thw"][0]
    return image_token_count(grid)


def _inline(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's image paths as the data URIs the walk sends."""
    for m in messages:
        for part in m["content"]:
            if part["type"] == "image_url":
                ref = ref_from_uri(part["image_url"]["url"], None, "test")
                part["image_url"]["url"] = data_uri(ref, DEFAULT_LIMITS)
    return messages


def _image_urls(row: dict[str, Any]) -> list[str]:
    return [
        p["image_url"]["url"]
        for m in row["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]


def test_a_local_vlm_answers_rows_with_images_and_the_output_keeps_them(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    rows, counts = _local(vlm, _input(tmp_path / "a", pictures[0], pictures[1]), tmp_path / "a.jsonl",
                          tmp_path / "ctx-a")  # fmt: skip
    assert counts["rows_out"] == 3 and counts["rejected"] == 0
    for row in rows:
        answer = row["messages"][-1]
        assert answer["role"] == "assistant" and answer["token_ids"]
    # the written rows point at the stored images beside the output, which are the pictures' bytes
    first, second = _image_urls(rows[0]), _image_urls(rows[1])
    assert len(first) == 1 and len(second) == 1 and _image_urls(rows[2]) == []
    assert (tmp_path / first[0]).read_bytes() == pictures[0].read_bytes()
    assert (tmp_path / second[0]).read_bytes() == pictures[1].read_bytes()
    # another picture (another size) in the first row: the prompt sent holds its own image token count
    other, again = _local(vlm, _input(tmp_path / "b", pictures[2], pictures[1]), tmp_path / "b.jsonl",
                          tmp_path / "ctx-b")  # fmt: skip
    grown = _image_tokens(vlm, pictures[2]) - _image_tokens(vlm, pictures[0])
    assert grown != 0 and again["prompt_tokens"] - counts["prompt_tokens"] == grown
    # the rows without it are answered as before (greedy)
    assert [r["messages"][-1]["token_ids"] for r in other[1:]] == [
        r["messages"][-1]["token_ids"] for r in rows[1:]
    ]


def test_the_local_vlm_reads_each_rows_own_pixels(vlm: Path, pictures: list[Path], tmp_path: Path) -> None:
    """What reaches the vision tower (a forward hook on it) is each picture's processed pixels."""
    seen: list[Any] = []
    src = _input(tmp_path / "in", pictures[0], pictures[1])
    backend = LocalBackend(_params(vlm, src, tmp_path / "out.jsonl"))
    tower = backend.model.get_submodule("model.visual")
    tower.register_forward_hook(lambda module, args, out: seen.append(args[0].clone()))

    async def ask(picture: Path) -> None:
        await backend.preflight()
        try:
            parts = [{"type": "image_url", "image_url": {"url": str(picture)}}, {"type": "text", "text": "?"}]
            conv = {"role": "user", "content": parts}
            await backend.chat(_inline([conv]), [])
        finally:
            await backend.aclose()

    from PIL import Image

    processor = load_image_processor(vlm)
    for picture in (pictures[0], pictures[3]):
        asyncio.run(ask(picture))
        with Image.open(picture) as image:
            expected = processor([image.convert("RGB")], return_tensors="pt")["pixel_values"]
        assert torch.equal(seen[-1], expected.to(seen[-1].dtype))
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])


def test_a_text_target_refuses_rows_with_images_by_name(pictures: list[Path], tmp_path: Path) -> None:
    target = tiny_qwen3(tmp_path / "qwen3")
    src = _input(tmp_path / "in", pictures[0], pictures[1])
    params = RegenerateParams(inputs=[str(src)], out=str(tmp_path / "out.jsonl"), local=str(target),
                              max_tokens=4, temperature=0, max_rejected=1.0, keep_cut_off=True)  # fmt: skip
    try:
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    except JobFailed as exc:  # the text row's random answer may be empty: the job's verdict aside
        assert exc.report is not None
        report = exc.report  # type: ignore[assignment]
    assert report.rejected["multimodal_content"] == 2
    assert report.rows_in == 3


def test_a_server_is_sent_each_image_as_a_data_uri_in_place(pictures: list[Path], tmp_path: Path) -> None:
    def answer(messages: list[dict[str, Any]], n: int) -> Any:
        return completion("a picture")

    src = _input(tmp_path / "in", pictures[0], pictures[1])
    with standin(StandIn(answer)) as server:
        params = RegenerateParams(inputs=[str(src)], out=str(tmp_path / "out.jsonl"), endpoints=[server.url],
                                  model="m", concurrency=1)  # fmt: skip
        run_regenerate(params, LocalContext(tmp_path / "ctx"))
    sent = sorted(server.requests, key=lambda b: json.dumps(b["messages"]))
    by_text = {json.dumps(b["messages"][0]["content"])[:40]: b["messages"][0]["content"] for b in sent}
    parts = next(c for c in by_text.values() if isinstance(c, list) and c[0].get("text") == "What is in")
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    url = parts[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == pictures[0].read_bytes()
    placeholder = next(c for c in by_text.values() if isinstance(c, list) and c[0]["type"] == "image_url")
    assert [p["type"] for p in placeholder] == ["image_url", "text"]
    assert base64.b64decode(placeholder[0]["image_url"]["url"].split(",", 1)[1]) == pictures[1].read_bytes()
    assert "Tell me a story." in [c for c in by_text.values() if isinstance(c, str)]
    rows = _rows(tmp_path / "out.jsonl")
    assert [len(_image_urls(r)) for r in rows] == [1, 1, 0]  # the written rows keep their images


def test_a_server_that_refuses_images_rejects_the_row_as_multimodal(
    pictures: list[Path], tmp_path: Path
) -> None:
    def answer(messages: list[dict[str, Any]], n: int) -> Any:
        if any(isinstance(m["content"], list) for m in messages):
            return 400, {"error": {"message": "Qwen3ForCausalLM is not a multimodal model"}}
        return completion("a story")

    src = _input(tmp_path / "in", pictures[0], pictures[1])
    with standin(StandIn(answer)) as server:
        params = RegenerateParams(inputs=[str(src)], out=str(tmp_path / "out.jsonl"), endpoints=[server.url],
                                  model="m", concurrency=1, max_rejected=1.0)  # fmt: skip
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    assert report.rows_out == 1
    assert dict(report.rejected) == {"multimodal_content": 2}


def test_a_services_job_sends_no_image_from_outside_its_data_roots(
    pictures: list[Path], tmp_path: Path
) -> None:
    """With data roots (a job run by the service), a row naming a picture elsewhere is rejected as
    image_outside_roots and nothing of it is sent; a picture inside the roots is sent."""
    inside = tmp_path / "roots" / "inside.png"
    inside.parent.mkdir()
    inside.write_bytes(pictures[1].read_bytes())
    src = _input(tmp_path / "roots" / "in", pictures[0], inside)  # picture 0 lies outside the roots

    def answer(messages: list[dict[str, Any]], n: int) -> Any:
        return completion("a picture")

    with standin(StandIn(answer)) as server:
        params = RegenerateParams(inputs=[str(src)], out=str(tmp_path / "roots" / "out.jsonl"),
                                  endpoints=[server.url], model="m", concurrency=1)  # fmt: skip
        ctx = LocalContext(tmp_path / "ctx", file_roots=(str(tmp_path / "roots"),))
        report = run_regenerate(params, ctx)
    assert dict(report.rejected) == {"image_outside_roots": 1} and report.rows_out == 2
    sent = [p["image_url"]["url"] for b in server.requests for m in b["messages"]
            if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]  # fmt: skip
    assert [base64.b64decode(u.split(",", 1)[1]) for u in sent] == [pictures[1].read_bytes()]
