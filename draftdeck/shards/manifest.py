"""``manifest.json``: one typed record that the writer writes and every reader parses.

The tokenize job (in-process or chunked) and the tests write it through
``draftdeck.shards.store.write_metadata``; the shard reader, the CLI and the dataset pages read it
through :func:`read_manifest`. A key the project writes has one name here and nowhere else; a manifest
that lacks one, or holds the wrong type, is refused with the file and the key named.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftdeck.errors import InputError
from draftdeck.fileio import atomic_output
from draftdeck.provenance import Answered, ModelIdentity

MANIFEST = "manifest.json"
FORMAT = "draftdeck-shards"
FORMAT_VERSION = 1


@dataclass
class ShardInfo:
    filename: str
    rows: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}


@dataclass
class ImageFile:
    """One stored image of a dataset with images: ``images/<filename>``, its size and sha256 (the
    name is ``<sha256>.<ext>``: the checksum is checked against the name too)."""

    filename: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class TokenizerRef:
    """The tokenizer the ids belong to: its folder (None when the writer had none) and fingerprint."""

    path: str | None
    fingerprint: str
    vocab_size: int | None = None
    chat_template: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "chat_template": self.chat_template}  # fmt: skip


@dataclass
class Manifest:
    shards: list[ShardInfo]
    tokenizer: TokenizerRef | None = None
    inputs: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    mask_rule: str | None = None
    report: dict[str, Any] | None = None
    version: int = FORMAT_VERSION
    provenance: Answered | None = None  # rows by who answered them; None: written before it was kept
    # a dataset with images: every stored image file (None: a text dataset, whose manifest has no key)
    images: list[ImageFile] | None = None

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def tokenizer_dir(self, base: Path | None = None) -> Path:
        """The tokenizer folder the manifest names (relative paths from `base`). InputError when none."""
        if self.tokenizer is None or not self.tokenizer.path:
            raise InputError("the manifest names no tokenizer folder")
        path = Path(self.tokenizer.path).expanduser()
        return path if path.is_absolute() or base is None else base / path

    def to_dict(self) -> dict[str, Any]:
        out = self._to_dict()
        if self.images is not None:
            out["images"] = [f.to_dict() for f in self.images]
        return out

    def _to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "rows": self.rows,
            "shards": [s.to_dict() for s in self.shards],
            "tokenizer": self.tokenizer.to_dict() if self.tokenizer else None,
            "inputs": list(self.inputs),
            "parameters": dict(self.parameters),
            "mask_rule": self.mask_rule,
            "report": self.report,
            "provenance": self.provenance.to_dict() if self.provenance else None,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST) -> Manifest:
        """Parse what :meth:`to_dict` wrote. Raises InputError naming `where` and the bad key."""

        def bad(key: str, want: str) -> InputError:
            return InputError(f"{where}: {key} must be {want}")

        if not isinstance(data, dict):
            raise InputError(f"{where}: not a JSON object")
        if data.get("format") != FORMAT:
            raise bad("format", f"{FORMAT!r} (not written by DraftDeck?)")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise InputError(f"{where}: format version {version!r}; this DraftDeck reads {FORMAT_VERSION}")
        raw_shards = data.get("shards")
        if not isinstance(raw_shards, list):
            raise bad("shards", "a list")
        shards = []
        for i, s in enumerate(raw_shards):
            ok = (
                isinstance(s, dict)
                and isinstance(s.get("filename"), str)
                and isinstance(s.get("sha256"), str)
            )
            ok = ok and all(_is_int(s.get(k)) and s[k] >= 0 for k in ("rows", "bytes"))
            if not ok:
                raise bad(f"shards[{i}]", "an object with filename, rows, bytes and sha256")
            if Path(s["filename"]).name != s["filename"]:
                raise bad(f"shards[{i}].filename", "a file name inside the dataset folder")
            shards.append(ShardInfo(s["filename"], s["rows"], s["bytes"], s["sha256"]))
        rows = data.get("rows")
        if rows is not None and rows != sum(s.rows for s in shards):
            raise InputError(f"{where}: rows is {rows} but the shards hold {sum(s.rows for s in shards)}")
        tok = data.get("tokenizer")
        ref = None
        if tok is not None:
            if not isinstance(tok, dict) or not isinstance(tok.get("fingerprint"), str):
                raise bad("tokenizer", "null or an object with a fingerprint")
            for key, want in (("path", str), ("vocab_size", int), ("chat_template", str)):
                if tok.get(key) is not None and not isinstance(tok[key], want):
                    raise bad(f"tokenizer.{key}", f"null or a {want.__name__}")
            ref = TokenizerRef(
                tok.get("path"), tok["fingerprint"], tok.get("vocab_size"), tok.get("chat_template")
            )
        inputs = data.get("inputs")
        inputs = [] if inputs is None else inputs
        if not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs):
            raise bad("inputs", "a list of paths")
        parameters = data.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, dict):
            raise bad("parameters", "an object")
        mask_rule = data.get("mask_rule")
        if mask_rule is not None and not isinstance(mask_rule, str):
            raise bad("mask_rule", "null or a string")
        report = data.get("report")
        if report is not None and not isinstance(report, dict):
            raise bad("report", "null or an object")
        return cls(shards, ref, inputs, parameters, mask_rule, report, version, _provenance(data, where),
                   _images(data, where))  # fmt: skip


def _images(data: dict[str, Any], where: str) -> list[ImageFile] | None:
    raw = data.get("images")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InputError(f"{where}: images must be null or a list")
    out = []
    for i, f in enumerate(raw):
        ok = isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("sha256"), str)
        if not ok or not _is_int(f.get("bytes")) or Path(f["filename"]).name != f["filename"]:
            raise InputError(f"{where}: images[{i}] must be an object with filename, bytes and sha256")
        out.append(ImageFile(f["filename"], f["bytes"], f["sha256"]))
    return out


def _provenance(data: dict[str, Any], where: str) -> Answered | None:
    raw = data.get("provenance")
    if raw is None:
        return None
    bad = InputError(
        f"{where}: provenance must be null or {{answered_by: [{{name, fingerprint, rows}}], no_record}}"
    )
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("answered_by"), list)
        or not _is_int(raw.get("no_record"))
    ):
        raise bad
    by = []
    for entry in raw["answered_by"]:
        ident = ModelIdentity.from_dict(entry)
        if ident is None or not _is_int(entry.get("rows")):
            raise bad
        by.append((ident, entry["rows"]))
    return Answered(tuple(by), raw["no_record"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a dataset folder. InputError when it is missing, unreadable or malformed."""
    path = Path(folder) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{folder} is not a DraftDeck dataset (no {MANIFEST}; was the job finished?)"
        ) from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from exc
    return Manifest.from_dict(data, str(path))


def write_dataset_files(out_dir: Path, manifest: Manifest, features: dict[str, Any]) -> None:
    """dataset_info.json + state.json (what ``datasets.load_from_disk`` reads), then manifest.json, each
    atomically: the manifest comes last, so a folder with one is a finished dataset."""
    info = {
        "citation": "",
        "description": "DraftDeck tokenized chat data (input_ids, loss_mask)",
        "features": features,
        "homepage": "",
        "license": "",
    }
    with atomic_output(out_dir / "dataset_info.json", "w") as f:
        json.dump(info, f, indent=2)
    state: dict[str, Any] = {
        "_data_files": [{"filename": s.filename} for s in manifest.shards],
        "_fingerprint": secrets.token_hex(8),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    with atomic_output(out_dir / "state.json", "w") as f:
        json.dump(state, f, indent=2)
    with atomic_output(out_dir / MANIFEST, "w") as f:
        json.dump(manifest.to_dict(), f, indent=2, ensure_ascii=False)
