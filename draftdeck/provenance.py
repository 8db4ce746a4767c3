"""Who answered a row: the identity of the model that wrote its assistant turns.

Regeneration records it in every row it writes (``generation.answered_by``), tokenize counts rows by it
into the manifest (``provenance``), and training compares it with its target: "0 of 1,000 rows were
answered by this target" is the first thing to know about a drafter's data.

A local model folder is identified by its fingerprint (:func:`model_fingerprint`): the config and a
sample of every weight file, so that two models of one architecture trained apart differ, and a
copy of a folder is the same model. A served model is known only by the name the server lists; a
name is not proof of weights, so it is reported as a name, never counted as the target.

The token ids a model produced for its answers are kept with the vocabulary they belong to
(:func:`vocab_fingerprint`), so that tokenize can use them verbatim where its tokenizer is the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLE_BYTES = 1 << 18  # per window: four windows per weight file, ~1 MiB of reading per file


def model_fingerprint(folder: Path) -> str:
    """``sha256:<hex>`` over config.json and, per weight file (in name order), its name, size and four
    256 KiB windows (at 1/4, 1/2, 3/4 and the end). Reads ~1 MiB per weight file whatever its size."""
    folder = Path(folder)
    h = hashlib.sha256()
    h.update((folder / "config.json").read_bytes())
    weights = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    for p in weights:
        size = p.stat().st_size
        h.update(json.dumps([p.name, size]).encode())
        with p.open("rb") as f:
            for at in (size // 4, size // 2, 3 * size // 4, max(0, size - SAMPLE_BYTES)):
                f.seek(at)
                h.update(f.read(SAMPLE_BYTES))
    return "sha256:" + h.hexdigest()


def vocab_fingerprint(folder: Path) -> str | None:
    """``sha256:<hex>`` over what maps text to ids in ``tokenizer.json`` (model, added tokens,
    normaliser, pre-tokeniser), read as JSON so that two saves of one vocabulary agree; the chat
    template is not part of it (it changes the rendered text, which tokenize checks by decoding).
    None: the folder has no tokenizer.json."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_bytes())
    parts = {k: data.get(k) for k in ("model", "added_tokens", "normalizer", "pre_tokenizer")}
    return "sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ModelIdentity:
    """A model that answered rows: `name` (a local folder's absolute path, or the served model name),
    `fingerprint` (local folders only), `served` (answered by an OpenAI-compatible server)."""

    name: str
    fingerprint: str | None = None
    served: bool = False

    @classmethod
    def of_folder(cls, folder: Path) -> ModelIdentity:
        return cls(str(Path(folder).resolve()), model_fingerprint(folder))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fingerprint": self.fingerprint, "served": self.served}

    @classmethod
    def from_dict(cls, d: Any) -> ModelIdentity | None:
        """The identity a row records, or None when it records none (or something else)."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            return None
        fp = d.get("fingerprint")
        return cls(d["name"], fp if isinstance(fp, str) else None, bool(d.get("served")))

    def key(self) -> str:
        """A canonical text form (the unit rows are counted by)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> ModelIdentity | None:
        return cls.from_dict(json.loads(key))

    def describe(self) -> str:
        if self.fingerprint:
            return f"local model {self.name} ({self.fingerprint[:19]}…)"
        return f"served model {self.name!r}" if self.served else f"model {self.name!r}"


def answered_by(meta: dict[str, Any]) -> ModelIdentity | None:
    """The identity a converted row's metadata records (regenerate writes ``generation.answered_by``)."""
    gen = meta.get("generation")
    return ModelIdentity.from_dict(gen.get("answered_by")) if isinstance(gen, dict) else None


@dataclass(frozen=True)
class Answered:
    """Rows counted by who answered them: `by` (identity, rows) and `no_record` rows."""

    by: tuple[tuple[ModelIdentity, int], ...]
    no_record: int

    @property
    def rows(self) -> int:
        return self.no_record + sum(n for _, n in self.by)

    def by_fingerprint(self, fingerprint: str) -> int:
        return sum(n for m, n in self.by if m.fingerprint == fingerprint)

    def to_dict(self) -> dict[str, Any]:
        return {
            "answered_by": [{**m.to_dict(), "rows": n} for m, n in self.by],
            "no_record": self.no_record,
        }

    @classmethod
    def from_counts(cls, counts: dict[str, int]) -> Answered:
        """From rows per key (``""``: rows with no record)."""
        by = []
        for key, n in sorted(counts.items()):
            ident = ModelIdentity.from_key(key) if key else None
            if ident is not None:
                by.append((ident, n))
        known = sum(n for _, n in by)
        return cls(tuple(by), sum(counts.values()) - known)

    def versus(self, target_fingerprint: str) -> str:
        """One line for a training run: how many rows its target answered, and who answered the rest."""
        mine = self.by_fingerprint(target_fingerprint)
        others = [f"{n:,} by {m.describe()}" for m, n in self.by if m.fingerprint != target_fingerprint]
        if self.no_record:
            others.append(f"{self.no_record:,} with no record of who answered them")
        rest = f" ({'; '.join(others)})" if others else ""
        return f"{mine:,} of {self.rows:,} rows were answered by this target{rest}"
