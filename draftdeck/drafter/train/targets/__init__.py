"""The config.json of a few popular targets, as their publishers ship them (no weights), so that
`draftdeck plan --target qwen3.6-27b` plans one without a download. A name is looked up without regard
to case, and the hub's own name reads too (`Qwen/Qwen3-8B`: its last part). Package data: setup.py
ships the files in the wheel."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# each bundled name and the hub repository its config.json is (the file is <name>.json here)
BUNDLED = {
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3.6-27b": "Qwen/Qwen3.6-27B",
}


def names() -> list[str]:
    return sorted(BUNDLED)


def bundled(name: str) -> Path | None:
    """The bundled config.json a target's name (or hub name, or a path ending in either) names; None
    when none is bundled."""
    key = Path(name.strip()).name.lower().removesuffix(".json")
    return HERE / f"{key}.json" if key in BUNDLED else None


def described(path: Path) -> str:
    """A bundled config in words: "DraftDeck's copy of Qwen/Qwen3-8B's config.json"."""
    return f"DraftDeck's copy of {BUNDLED[path.stem]}'s config.json"
