"""The shard store's columns and Arrow schema: the text one, and with images the two more.

Columns (speculators' names and meanings): ``input_ids`` list<int32>, ``loss_mask`` list<int64>
(1 = the token is trained), ``seq_len`` int64, plus ``source`` (input file), ``source_row``
(line or index in it), ``turn`` (the supervised assistant turn of a split row, -1 when every
assistant turn of the conversation is supervised), ``n_trained``, ``truncated`` and ``issues`` (the
warning codes the row carries, list<string>: what the sample view shows as badges) and ``mix_source``
(the name of the mix source a row came from, "" when it is not from a mix). Shards written before
either column have no such column: readers take a missing ``issues`` as none and a missing
``mix_source`` as "" (:func:`draftdeck.shards.store.row_mix_source`).

A dataset with images (a vision-language target's: :mod:`draftdeck.tokenize.vision`) has two more
columns after these, in every shard (:data:`IMAGE_COLUMNS`): ``images`` (list<string>: the file names,
``<sha256>.<ext>``, of the row's images under the folder's ``images/``, in order of appearance) and
``image_grid_thw`` (list<int32>: the processor's (t, h, w) patch grid of each image, flattened, three
per image). The image files are stored once under ``images/`` and listed in the manifest with their
sha256. A dataset without images has neither column: its schema is the text one, byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

# The columns as HF `datasets` features ("int32", or [element] for a list). The Arrow schema and
# dataset_info.json's features are spelled out from these here rather than built with datasets'
# Features: importing datasets costs ~0.5 s of a short command's start-up. The unit tests check that
# both match what datasets itself writes for the same features.
COLUMNS: dict[str, str | list[str]] = {
    "input_ids": ["int32"],
    "loss_mask": ["int64"],
    "seq_len": "int64",
    "source": "string",
    "source_row": "int64",
    "turn": "int32",
    "n_trained": "int64",
    "truncated": "bool",
    "issues": ["string"],
    "mix_source": "string",  # last: the columns before it keep their places in older shards
}
# A dataset with images: these two after COLUMNS (see the module's docstring)
IMAGE_COLUMNS: dict[str, str | list[str]] = {"images": ["string"], "image_grid_thw": ["int32"]}
_ARROW = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "bool": pa.bool_()}


def _feature(dtype: str | list[str]) -> dict[str, Any]:
    if isinstance(dtype, list):
        return {"feature": _feature(dtype[0]), "_type": "List"}
    return {"dtype": dtype, "_type": "Value"}


def _columns(multimodal: bool) -> dict[str, str | list[str]]:
    return {**COLUMNS, **IMAGE_COLUMNS} if multimodal else COLUMNS


def features(multimodal: bool = False) -> dict[str, Any]:
    """The columns as datasets' ``Features.to_dict()`` writes them (dataset_info.json); `multimodal`:
    with the image columns."""
    return {name: _feature(dtype) for name, dtype in _columns(multimodal).items()}


def schema(multimodal: bool = False) -> pa.Schema:
    """The shards' Arrow schema, with the ``huggingface`` metadata datasets reads its features from."""
    fields = [
        pa.field(name, pa.list_(_ARROW[dtype[0]]) if isinstance(dtype, list) else _ARROW[dtype])
        for name, dtype in _columns(multimodal).items()
    ]
    meta = {"huggingface": json.dumps({"info": {"features": features(multimodal)}})}
    return pa.schema(fields, metadata=meta)


def is_multimodal(arrow_schema: pa.Schema) -> bool:
    """Whether shards of `arrow_schema` hold the image columns."""
    return all(name in arrow_schema.names for name in IMAGE_COLUMNS)
