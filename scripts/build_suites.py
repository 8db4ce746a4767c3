"""Rebuild the evaluation suites DraftDeck ships (draftdeck/drafter/eval/suites/) from their upstream
repositories, at the commits recorded below, so that anyone can check them:

    git clone https://github.com/hemingkx/Spec-Bench mirrors/Spec-Bench   # (and the three others)
    python scripts/build_suites.py mirrors/

Each suite becomes ``NAME.jsonl.gz`` (one prompt a line: ``id``, ``category``, ``turns``; gzip with no
timestamp, so a rebuild is byte-identical), its upstream licence ``NAME.LICENSE.txt``, and an entry of
``sources.json``: the repository, commit,
path, licence, how a prompt was made from a record, and the file's sha256 (which the tests check).
Only permissively licensed sets are shipped.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "draftdeck" / "drafter" / "eval" / "suites"
GSM8K_ASK = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_ASK = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
)
# Spec-Bench's first 80 questions are MT-Bench's: the paper reports them as one category
MT_BENCH_CATEGORIES = {
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
}  # fmt: skip


def _spec_bench(r: dict[str, Any]) -> dict[str, Any]:
    category = "multi_turn" if r["category"] in MT_BENCH_CATEGORIES else r["category"]
    return {"id": str(r["question_id"]), "category": category, "turns": r["turns"]}


def _mt_bench(r: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(r["question_id"]), "category": r["category"], "turns": r["turns"]}


def _gsm8k(r: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"test-{n}", "category": "math", "turns": [r["question"] + GSM8K_ASK]}


def _humaneval(r: dict[str, Any]) -> dict[str, Any]:
    return {"id": r["task_id"], "category": "code", "turns": [HUMANEVAL_ASK + r["prompt"] + "```"]}


SUITES: dict[str, dict[str, Any]] = {
    "spec-bench": {
        "repo": "hemingkx/Spec-Bench",
        "folder": "Spec-Bench",
        "commit": "fd2c1cd7d2201ef71db4c5f4e455008f017967bf",
        "path": "data/spec_bench/question.jsonl",
        "licence": "Apache-2.0",
        "make": _spec_bench,
        "description": "480 questions in six categories (Xia et al. 2024): multi-turn conversation"
        " (MT-Bench's 80, two turns), translation, summarisation, QA, math reasoning, RAG",
        "prompt": "the record's turns as they are; MT-Bench's eight categories reported as multi_turn",
    },
    "mt-bench": {
        "repo": "lm-sys/FastChat",
        "folder": "FastChat",
        "commit": "0e6d3e4beaab66f4d3f93db72541a4abab8af28d",
        "path": "fastchat/llm_judge/data/mt_bench/question.jsonl",
        "licence": "Apache-2.0",
        "make": _mt_bench,
        "description": "80 two-turn questions in eight categories (Zheng et al. 2023)",
        "prompt": "the record's turns as they are",
    },
    "gsm8k": {
        "repo": "openai/grade-school-math",
        "folder": "grade-school-math",
        "commit": "3101c7d5072418e28b9008a6636bde82a006892c",
        "path": "grade_school_math/data/test.jsonl",
        "licence": "MIT",
        "make": _gsm8k,
        "description": "the 1,319 grade-school maths word problems of the test split (Cobbe et al. 2021)",
        "prompt": "the question, then " + json.dumps(GSM8K_ASK) + " (as Qwen's and z-lab's evaluations ask)",
    },
    "humaneval": {
        "repo": "openai/human-eval",
        "folder": "human-eval",
        "commit": "6d43fb980f9fee3c892a914eda09951f772ad10d",
        "path": "data/HumanEval.jsonl.gz",
        "licence": "MIT",
        "make": _humaneval,
        "description": "164 Python function-completion problems (Chen et al. 2021)",
        "prompt": json.dumps(HUMANEVAL_ASK)
        + " + the problem's prompt + a closing fence (as z-lab's benchmark asks)",
    },
}


def _records(mirror: Path, commit: str, path: str) -> Iterator[dict[str, Any]]:
    show = ["git", "-C", str(mirror), "show", f"{commit}:{path}"]
    raw = subprocess.run(show, capture_output=True, check=True)
    data = gzip.decompress(raw.stdout) if path.endswith(".gz") else raw.stdout
    for line in io.StringIO(data.decode("utf-8")):
        if line.strip():
            yield json.loads(line)


def build(mirrors: Path) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    sources: dict[str, Any] = {}
    for name, s in SUITES.items():
        make: Callable[..., dict[str, Any]] = s["make"]
        records = _records(mirrors / s["folder"], s["commit"], s["path"])
        rows = [make(r, n) if make is _gsm8k else make(r) for n, r in enumerate(records)]
        text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode()
        blob = gzip.compress(text, compresslevel=9, mtime=0)
        (OUT / f"{name}.jsonl.gz").write_bytes(blob)
        licence = subprocess.run(["git", "-C", str(mirrors / s["folder"]), "show", f"{s['commit']}:LICENSE"],
                                 capture_output=True, check=True).stdout  # fmt: skip
        (OUT / f"{name}.LICENSE.txt").write_bytes(licence)  # shipped beside the data it covers
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["category"]] = counts.get(r["category"], 0) + 1
        sources[name] = {
            "file": f"{name}.jsonl.gz", "prompts": len(rows), "categories": counts,
            "sha256": hashlib.sha256(blob).hexdigest(), "url": f"https://github.com/{s['repo']}",
            **{k: s[k] for k in ("repo", "commit", "path", "licence", "description", "prompt")},
        }  # fmt: skip
    (OUT / "sources.json").write_text(json.dumps(sources, indent=2, ensure_ascii=False) + "\n")
    return sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mirrors", type=Path, help="a folder holding clones of the four repositories")
    for name, s in build(ap.parse_args().mirrors).items():
        print(f"{name}: {s['prompts']} prompts, {len(s['categories'])} categories, sha256 {s['sha256'][:16]}")


if __name__ == "__main__":
    main()
