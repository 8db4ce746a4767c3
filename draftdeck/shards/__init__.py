"""The Arrow shard store: writer (atomic), reader (memory-mapped, random access), manifest, statistics."""

from draftdeck.shards.store import ShardDataset, ShardRow, ShardWriter

__all__ = ["ShardDataset", "ShardRow", "ShardWriter"]
