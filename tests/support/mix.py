"""Five small sources in five shapes (OpenAI, ShareGPT, Alpaca, Anthropic, Parquet) with one row
that is in two sources, one row no reader knows and rows a filter drops, and a recipe over them with
quotas, weights, all and one upsampled source."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_sources(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    chat = [
        {
            "messages": [
                {"role": "user", "content": f"tell me about topic {i}"},
                {"role": "assistant", "content": f"Topic {i} is a fine topic, and here is why."},
            ]
        }
        for i in range(60)
    ]
    sharegpt = [
        {
            "conversations": [
                {"from": "human", "value": f"question number {i}?"},
                {"from": "gpt", "value": f"The answer to {i} is {i * 7}."},
            ]
        }
        for i in range(30)
    ]
    # the same conversation as chat's row 3 (line 4), in another shape: removed, counted against chat
    sharegpt.append(
        {
            "conversations": [
                {"from": "human", "value": "tell me about topic 3"},
                {"from": "gpt", "value": "Topic 3 is a fine topic, and here is why."},
            ]
        }
    )
    alpaca = [
        {"instruction": f"Write the word {i} in letters.", "input": "", "output": f"word-{i}"}
        for i in range(40)
    ]
    alpaca.append({"bad": "no chat shape has this key"})
    claude = [
        {
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": f"summarise case {i}"}]},
                {"role": "assistant", "content": [{"type": "text", "text": f"Case {i}: settled."}]},
            ],
        }
        for i in range(10)
    ]
    # two rows of four turns: the recipe's max_turns 2 filters them out
    claude += [
        {
            "messages": [
                {"role": "user", "content": f"long {i}"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": f"b {i}"},
            ]
        }
        for i in range(2)
    ]
    paths = {
        "chat": folder / "chat.jsonl",
        "sharegpt": folder / "sharegpt.jsonl",
        "alpaca": folder / "alpaca.jsonl",
        "claude": folder / "claude.jsonl",
        "table": folder / "table.parquet",
    }
    _jsonl(paths["chat"], chat)
    _jsonl(paths["sharegpt"], sharegpt)
    _jsonl(paths["alpaca"], alpaca)
    _jsonl(paths["claude"], claude)
    table = pa.table(
        {
            "messages": [
                [
                    {"role": "user", "content": f"table row {i}"},
                    {"role": "assistant", "content": f"Row {i} of the table."},
                ]
                for i in range(25)
            ]
        }
    )
    pq.write_table(table, paths["table"])
    return paths


RECIPE = """\
seed: 11
sources:
  - name: chat
    inputs: [chat.jsonl]
    rows: 20
  - name: sharegpt
    inputs: [sharegpt.jsonl]
    weight: 0.3
  - name: alpaca
    inputs: [alpaca.jsonl]
    all: true
  - name: claude
    inputs: [claude.jsonl]
    rows: 25
    max_turns: 2
  - name: table
    inputs: [table.parquet]
    weight: 0.1
"""
