"""Benchmark: tokenizing rows with images against a vision-language target (issue 55), the tokenize half
of benchmarks/multimodal.py.

    python benchmarks/multimodal_tokenize.py [--rows 2000] [--distinct 50] [--workers 1] [--smoke]

One run, the same conversations each time (Qwen3.5/3.6's real vocabulary, the tiny VLM's template
rendering image parts as Qwen3.5's), tokenized into a dataset folder:

- `text only`: the rows with their `<image>` placeholders left as plain text (a text dataset);
- `1 image, tiny VLM`: each row's user turn holds one of `--distinct` generated pictures (64 to 128
  pixels a side: 16 to 64 image tokens) read by the tiny VLM's processor (draftdeck.drafter.tiny_vlm);
- `1 image, Qwen3.5 processor`: one of `--distinct` 640 x 480 JPEG photos-like pictures read by an
  image processor with Qwen3.5's own settings (16-pixel patches, 2 x 2 merge: 300 image tokens each);
- `2 images, Qwen3.5 processor`: two such pictures a row;
- `no picture repeats`: `--unique` rows, each its own picture (nothing is checked once for many rows).

Columns: seconds, rows/s, the ratio to the text rows' rows/s, image occurrences and distinct images,
the bytes the dataset's `images/` folder holds per distinct image, and what the same images would take
as bytes in an Arrow column (one copy per row that shows it) against the content-addressed files.
`grid` rows: the time per image of the grid from the image's size (the processor's own smart_resize)
against the processor's full preprocess (decode, resize, normalise, patchify), which tokenize needs
only to check the first few.
"""

# ruff: noqa: E402 - imports follow the sys.path fix
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize: the script's folder leaves the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.formats.model import Conversation, ImageRef, Message
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import tokenize_conversations

# Qwen3.5's preprocessor_config.json, as the published models have it
QWEN35_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def target(folder: Path, processor: dict | None) -> Path:
    """A tokenizer folder with the VLM template, and `processor` as its preprocessor_config.json."""
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), folder)
    if processor is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


def photos(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """`n` 640 x 480 JPEGs with smooth gradients and noise (a photo's entropy, roughly)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:480, 0:640]
    out = []
    for i in range(n):
        base = np.stack([(x * (i + 1)) % 256, (y * (i + 3)) % 256, ((x + y) * (i + 2)) % 256], axis=-1)
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        path = folder / f"photo-{i}.jpg"
        Image.fromarray(noisy).save(path, format="JPEG", quality=85)
        out.append(path)
    return out


def conversations(
    n: int, pictures: list[Path] | None, per_row: int, seed: int = 0, *, each_own: bool = False
) -> list[Conversation]:
    """`n` rows of `per_row` pictures drawn from `pictures` (`each_own`: row i shows picture i)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        marks = " ".join(["<image>"] * per_row)
        if each_own and pictures:
            refs = [ImageRef(path=str(pictures[i]))]
        else:
            refs = [ImageRef(path=str(rng.choice(pictures))) for _ in range(per_row)] if pictures else []
        question = f"{marks}\nDescribe what you see in picture set {i}, and count the shapes in it."
        answer = f"I see {rng.randint(2, 9)} shapes in set {i}: circles and boxes in several colours."
        out.append(
            Conversation(messages=[Message("user", question, images=refs), Message("assistant", answer)])
        )
    return out


def run(name: str, convs: list[Conversation], folder: Path, out: Path, workers: int) -> dict:
    opts = TokenizeOptions(tokenizer=folder, workers=workers)
    tokenize_conversations(convs[:4], out.with_name(out.name + "-warm"), opts)  # load the tokenizer once
    started = time.perf_counter()
    report = tokenize_conversations(convs, out, opts)
    seconds = time.perf_counter() - started
    files = list((out / "images").glob("*")) if (out / "images").is_dir() else []
    occurrences = sum(len(m.images) for c in convs for m in c.messages)
    stored = sum(f.stat().st_size for f in files)
    per_row = sum(Path(r.path).stat().st_size for c in convs for m in c.messages for r in m.images if r.path)
    return {"name": name, "rows": report.rows_out, "seconds": seconds, "rows_s": report.rows_out / seconds,
            "images": occurrences, "distinct": len(files), "stored": stored, "per_row": per_row}  # fmt: skip


def grid_times(pictures: list[Path], folder: Path, repeat: int) -> tuple[float, float]:
    from transformers import AutoTokenizer

    from draftdeck.tokenize.vision import Vision

    vision = Vision.load(folder, AutoTokenizer.from_pretrained(str(folder)))
    assert vision is not None
    from PIL import Image

    sizes, datas = [], []
    for p in pictures:
        with Image.open(p) as img:
            sizes.append(img.size)
        datas.append(p.read_bytes())
    t0 = time.perf_counter()
    for _ in range(repeat):
        for w, h in sizes:
            vision._fast_grid(w, h)
    fast = (time.perf_counter() - t0) / (repeat * len(sizes))
    t0 = time.perf_counter()
    for data in datas:
        vision._full_grid(data)
    full = (time.perf_counter() - t0) / len(datas)
    return fast, full


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--distinct", type=int, default=50, help="distinct pictures the rows draw from")
    ap.add_argument("--unique", type=int, default=300, help="rows of the last run, each its own picture")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="20 rows, 4 pictures: the path, not a measure")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.distinct, args.unique = 20, 4, 6
    work = Path(tempfile.mkdtemp(prefix="mm-tokenize-"))
    try:
        text_target = target(work / "text-target", None)
        tiny = target(work / "tiny-target", tiny_vlm.preprocessor_config())
        qwen = target(work / "qwen-target", QWEN35_PROCESSOR)
        small = tiny_vlm.write_tiny_images(work / "pictures", n=args.distinct)
        big = photos(work / "photos", args.distinct)
        unique = photos(work / "unique", args.unique, seed=1)
        runs = [
            run("text only", conversations(args.rows, None, 1), text_target, work / "o-text", args.workers),
            run("1 image, tiny VLM", conversations(args.rows, small, 1), tiny, work / "o-tiny", args.workers),
            run(
                "1 image, Qwen3.5 processor",
                conversations(args.rows, big, 1),
                qwen,
                work / "o-q1",
                args.workers,
            ),
            run(
                "2 images, Qwen3.5 processor",
                conversations(args.rows, big, 2),
                qwen,
                work / "o-q2",
                args.workers,
            ),
            run(
                f"1 image, Qwen3.5 processor, no picture repeats ({args.unique} rows)",
                conversations(args.unique, unique, 1, each_own=True),
                qwen,
                work / "o-u",
                args.workers,
            ),
        ]
        fast, full = grid_times(big, qwen, repeat=100)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = runs[0]["rows_s"]
    print(f"{args.rows} rows, {args.distinct} distinct pictures per kind, {args.workers} worker(s)\n")
    print(
        "| data | rows out | s | rows/s | vs text | image occurrences | distinct files | bytes per stored "
        "image | bytes stored | bytes as a per-row column | stored / per-row |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        per_image = r["stored"] / r["distinct"] if r["distinct"] else 0
        share = f"{r['stored'] / r['per_row']:.3f}" if r["per_row"] else "-"
        speed = f"{r['rows_s']:,.0f} | {r['rows_s'] / base:.2f}x"
        print(
            f"| {r['name']} | {r['rows']:,} | {r['seconds']:.2f} | {speed} | {r['images']:,} "
            f"| {r['distinct']:,} "
            f"| {per_image:,.0f} | {r['stored']:,} | {r['per_row']:,} | {share} |"
        )
    print(
        f"\ngrid of a 640 x 480 image: from its size {fast * 1e6:,.1f} us, by the processor's full "
        f"preprocess {full * 1e3:,.2f} ms ({full / fast:,.0f}x)"
    )


if __name__ == "__main__":
    main()
