"""The tiny VLM world, written once for the package's tests: a random Qwen3.5-style VLM folder and a
handful of generated pictures (`draftdeck.drafter.tiny_vlm`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdeck.drafter.tiny_vlm import write_tiny_images, write_tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "target", seed=0)


@pytest.fixture(scope="session")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    # 8: pictures 0 and 6 share a size (one grid) and differ in what they show
    return write_tiny_images(tmp_path_factory.mktemp("pictures"), n=8, seed=0)
