"""What an exported drafter was trained on (text, or text and images: issue 55), and how a
vision-language target is served with it.

A drafter trained on text alone is served on image prompts too, and its acceptance there is what a user
needs to know before serving it so; the export records the run's data beside the weights
(`trained_on.json`: servers read only config.json and the weights) and in the job's log. A target with
a vision tower is served whole: the drafter's flags are the text target's, plus the server's own for
images.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftdeck.fileio import atomic_output

TRAINED_ON = "trained_on.json"


def trained_on(record: Path | None) -> dict[str, Any] | None:
    """From a train run's run.json: `data` ("text" or "text + images"), the rows with images and the
    rows; None without a record (an export of a copied checkpoint)."""
    if record is None:
        return None
    try:
        data = json.loads(record.read_text(encoding="utf-8")).get("data") or {}
    except (OSError, ValueError):
        return None
    with_images = int(data.get("rows_with_images") or 0)
    return {
        "data": "text + images" if with_images else "text",
        "rows_with_images": with_images,
        "rows": int(data.get("rows_in") or 0),
        "run": str(record.parent),
    }


def write_trained_on(folder: Path, record: dict[str, Any]) -> Path:
    path = folder / TRAINED_ON
    with atomic_output(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


def vlm_serving_lines(target: str | None) -> list[str]:
    """For a target folder with a vision tower: how vLLM and SGLang serve it with images beside the
    drafter's flags; none for a text target or a hub name not on this machine."""
    if not target:
        return []
    config = Path(target) / "config.json"
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if "vision_config" not in raw:
        return []
    return [
        "a vision-language target: serve it whole (its vision tower and image processor come from the"
        " target folder); the drafter reads the language model's hidden states at every position, image"
        " tokens included",
        "vLLM: add --limit-mm-per-prompt '{\"image\": N}' to bound the pictures a prompt may hold",
        "SGLang: add --enable-multimodal",
    ]
