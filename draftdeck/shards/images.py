"""A dataset's images, as the shard store reads and writes them (the columns and the folder are
described in :mod:`draftdeck.shards.schema`): the rows' stored image files and grids, and text shards
given the image columns when a dataset turns out to hold images."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from draftdeck.errors import InputError
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.shards.manifest import Manifest, ShardInfo

IMAGES_DIR = "images"  # the folder of a dataset's image files (draftdeck.formats.images writes the same)


class ImageRows:
    """The image readers of :class:`~draftdeck.shards.store.ShardDataset` (a dataset with images)."""

    path: Path
    manifest: Manifest

    if TYPE_CHECKING:

        def row(self, n: int) -> dict[str, Any]: ...

    @property
    def images_dir(self) -> Path:
        """Where the dataset's image files are (``images/``; absent for a text dataset)."""
        return self.path / IMAGES_DIR

    def image_path(self, name: str) -> Path:
        """The file of a stored image named in a row's ``images``. InputError for a name that is not a
        file name inside ``images/``, or that the manifest does not list."""
        listed = {f.filename for f in self.manifest.images or []}
        if Path(name).name != name or name not in listed:
            raise InputError(f"{name!r} is not an image of this dataset")
        return self.images_dir / name

    def row_images(self, n: int) -> list[tuple[Path, tuple[int, int, int]]]:
        """Row `n`'s images in order of appearance: (the stored file, its (t, h, w) patch grid)."""
        row = self.row(n)
        names, flat = row.get("images") or [], row.get("image_grid_thw") or []
        if len(flat) != 3 * len(names):
            raise InputError(f"row {n}: {len(names)} images but {len(flat)} grid values (3 per image)")
        return [
            (self.image_path(name), (flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]))
            for i, name in enumerate(names)
        ]


def with_image_columns(table: pa.Table, text: pa.Schema, want: pa.Schema) -> pa.Table:
    """`table` (text rows, of schema `text`) with the image columns, empty: schema `want`."""
    if table.schema.names == want.names:
        return table.cast(want)
    n = table.num_rows
    text_table = table.select(text.names).cast(text)
    arrays = [
        *text_table.columns,
        pa.array([[]] * n, pa.list_(pa.string())),
        pa.array([[]] * n, pa.list_(pa.int32())),
    ]
    return pa.Table.from_arrays(arrays, schema=want)


def write_table(path: Path, table: pa.Table) -> ShardInfo:
    """Write `table` as one shard (one record batch) at `path`, atomically."""
    with atomic_output(path) as f, pa.ipc.new_stream(f, table.schema) as w:
        for batch in table.combine_chunks().to_batches():
            w.write_batch(batch)
    return ShardInfo(path.name, table.num_rows, path.stat().st_size, sha256_file(path))
