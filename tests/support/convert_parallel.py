"""Convert with one process and with worker processes, on generated files of every kind of row the
converter treats differently: for the tests of draftdeck.convert's worker processes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from draftdeck.convert import ConvertOptions, convert
from draftdeck.quality import Report


def comparable(report: Report) -> dict[str, Any]:
    d = report.to_dict()
    d.pop("elapsed_s", None)
    d.pop("parallel", None)
    d["outputs"] = [{k: v for k, v in o.items() if k != "path"} for o in d["outputs"]]
    return d


def convert_both(
    tmp_path: Path, paths: list[Path], to: str = "sharegpt", chunk_bytes: int = 2048, **opts: Any
) -> tuple[Report, Report]:
    """Convert with 1 and 2 workers; assert the same output bytes and reports; return both reports."""
    one = convert(paths, tmp_path / f"w1-{to}.jsonl", to, options=ConvertOptions(workers=1, **opts))
    two = convert(
        paths,
        tmp_path / f"w2-{to}.jsonl",
        to,
        options=ConvertOptions(workers=2, chunk_bytes=chunk_bytes, **opts),
    )
    assert (tmp_path / f"w1-{to}.jsonl").read_bytes() == (tmp_path / f"w2-{to}.jsonl").read_bytes()
    assert comparable(one) == comparable(two)
    assert "parallel" not in one.extra
    return one, two


def chat_row(user: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        **extra,
    }


def mixed_rows(rng: random.Random, n: int) -> list[bytes]:
    """Lines of every kind the converter treats differently, duplicates and placeholders included."""
    texts = [
        "plain text",
        "café — naïve “quoted”",
        "中文文本 日本語 한국어",
        "emoji 🚀🚀",
        'code "x\\n" \\ y',
    ]
    lines: list[bytes] = []
    for i in range(n):
        t = f"{rng.choice(texts)} {i}"
        r = rng.random()
        if r < 0.3:
            row: Any = chat_row(t, f"answer {t} " * rng.randint(1, 4))
        elif r < 0.45:
            row = {
                "id": f"sg{i}",
                "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": t * 3}],
            }
        elif r < 0.52:
            row = chat_row(
                f"dup question {i % 5}", "the same long answer every time, long enough"
            )  # duplicates
        elif r < 0.6:
            row = chat_row(t, rng.choice(["OK.", "ok", "Sure!"]))  # placeholder candidates
        elif r < 0.64:
            row = {"instruction": t, "input": "", "output": "an alpaca answer " * 2}
        elif r < 0.67:
            row = {"prompt": {"text": t, "role": "prompter", "replies": [
                {"text": "first reply", "role": "assistant", "rank": 0},
                {"text": "second reply", "role": "assistant", "rank": 1},
            ]}}  # fmt: skip
        elif r < 0.7:
            row = chat_row(
                t, f"kept {t} long answer", conversations="a kept field the sharegpt target reserves"
            )
        elif r < 0.73:
            row = {"messages": [{"role": "user", "content": t}, {"role": "user", "content": "again"}]}
        elif r < 0.75:
            row = {"messages": [{"role": "assistant", "content": t}]}  # no user turn: rejected
        elif r < 0.77:
            row = {"messages": [
                {"role": "user", "content": t},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": "result"},
                {"role": "assistant", "content": "done " + t},
            ]}  # fmt: skip
        elif r < 0.79:
            row = {"question": t}  # prompt-only: rejected unless allowed
        elif r < 0.81:
            row = {"unknown": t}
        elif r < 0.83:
            row = [1, 2]  # not an object
        elif r < 0.85:
            lines.append(b"{not json " + t.encode() + b"\n")
            continue
        elif r < 0.86:
            lines.append(b'{"messages": "\xff\xfe broken bytes"}\n')
            continue
        elif r < 0.9:
            lines.append(b"\n" if rng.random() < 0.5 else b"   \r\n")
            continue
        else:
            row = chat_row(t, "<think>some reasoning</think>the answer " + t)
        lines.append(orjson.dumps(row) + (b"\r\n" if rng.random() < 0.05 else b"\n"))
    return lines


def mixed_file(path: Path, n: int = 1500, seed: int = 3, tail: bytes = b"") -> Path:
    rng = random.Random(seed)
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(mixed_rows(rng, n)) + tail)
    return path
