"""`mix`: a recipe's sources into one converted file, every row accounted for per source.

1. **Convert** each source (its own ``from``) with convert itself, into a temporary JSONL file next
   to the output: the same readers, checks, placeholder rule, policy and workers, so a mix of 1 and 2
   workers writes the same bytes. Convert's own duplicate check is off: the mix removes duplicates
   across every source at once (step 2).
2. **Count** one pass over each converted file: the source's filters, and a 64-bit key of the
   normalised conversation (:func:`draftdeck.mix.rows.duplicate_key`). Exact duplicates are found
   over all sources together with one stable sort of the keys (8 bytes a row): the first copy in
   recipe order is kept, each later one is counted against the source that kept it.
3. **Plan** the rows per source from these counts (:mod:`draftdeck.mix.plan`), draw them (a seeded
   choice per source; upsampled sources repeat every row and draw the rest), and **write** them,
   interleaved in a seeded order, reading each converted file in order (never all rows in memory).

Rows in = rows taken + rejected + duplicates + not sampled, for each source and for the mix.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftdeck.convert import ConvertOptions, check_out, convert
from draftdeck.errors import AccountingError, JobFailed
from draftdeck.formats.common import ParseContext
from draftdeck.formats.detect import parse
from draftdeck.formats.images import IMAGES_DIR
from draftdeck.formats.writers import Writer
from draftdeck.mix.plan import plan_rows
from draftdeck.mix.recipe import MixSource, Recipe
from draftdeck.mix.rows import (
    SHAPES,
    Shape,
    duplicate_key,
    facts,
    filter_reason,
    named_line,
    origin,
    with_source,
)
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Policy, Report

AVAILABLE, FILTERED, DUPLICATE = 0, 1, 2
DEDUP = "exact: xxh3-64 of the normalised messages (role, stripped text, reasoning, tool calls, flag)"


@dataclass
class _Source:
    """One source through the mix: its converted file, its report and what each of its rows became."""

    spec: MixSource
    path: Path
    report: Report
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    keys: array = field(default_factory=lambda: array("Q"))  # of its rows left after the filters
    # per row (2 + 4 + 4 bytes): what the composition table sums over the rows written
    row_turns: array = field(default_factory=lambda: array("H"))
    row_chars: array = field(default_factory=lambda: array("I"))
    row_answer_chars: array = field(default_factory=lambda: array("I"))
    against: Counter[str] = field(default_factory=Counter)  # duplicates, by the source that kept them
    available: int = 0
    take: int = 0
    sampled: int = 0  # distinct rows taken
    turns: int = 0  # over the rows written (repeats included)
    chars: int = 0
    answer_chars: int = 0


def mix(
    recipe: Recipe,
    out: Path,
    policy: Policy | None = None,
    options: ConvertOptions | None = None,
    progress: Progress = no_progress,
) -> Report:
    """Write the mix of `recipe` to `out` (its ``to`` shape) and return the report, whose
    ``extra["mix"]`` is the composition table. `options`: how each source is read (workers, limits;
    ``from_format`` is each source's ``from``). Raises JobFailed when a source or the mix fails the
    policy, and always when the mix would be empty; UsageError when the amounts cannot be met."""
    pol = policy or Policy()
    base = options or ConvertOptions()
    started = time.monotonic()
    check_recipe_out(recipe, out)
    if base.images_dir is None:  # the sources' images go to images/ beside the mix, not its work folder
        base = replace(base, images_dir=str(out.expanduser().resolve().parent / IMAGES_DIR))
    jsonl = recipe.to if recipe.to != "parquet" else "openai"
    shape = SHAPES[jsonl]
    written = Report()  # what the writer itself counts (a field Parquet cannot hold)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.mix-", dir=out.parent))
    try:
        sources = [_convert(s, work / f"{i}.jsonl", jsonl, pol, base, progress)
                   for i, s in enumerate(recipe.sources)]  # fmt: skip
        for src in sources:
            _count(src, shape)
        _deduplicate(sources, shape)
        for src, take in zip(sources, plan_rows(recipe, [s.available for s in sources]), strict=True):
            full, part = divmod(take, src.available) if src.available else (0, 0)
            src.take, src.sampled = take, src.available if full else part
        _write(recipe, sources, out, written, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = Report()
    for src in sources:
        _account(src)
        report.merge(src.report)
    report.merge(written)
    report.extra["mix"] = _composition(recipe, sources)
    report.extra["losses"] = pol.losses(report)
    report.check_accounting()
    failures = pol.failures(report)
    if failures:
        out.unlink(missing_ok=True)
        raise JobFailed("mix failed: " + "; ".join(f.reason for f in failures[:5]) + "; no output was kept",
                        report)  # fmt: skip
    report.extra["elapsed_s"] = round(time.monotonic() - started, 3)
    return report


def _convert(
    spec: MixSource, path: Path, to: str, pol: Policy, base: ConvertOptions, progress: Progress
) -> _Source:
    opts = ConvertOptions(**{**base.__dict__, "policy": pol, "from_format": spec.from_format,
                             "columns": spec.columns, "tags": spec.tags,
                             "check_duplicates": False})  # fmt: skip
    try:
        rep = convert([Path(p) for p in spec.inputs], path, to, options=opts, progress=progress)
    except JobFailed as exc:
        raise JobFailed(f"source {spec.name!r}: {exc}", exc.report) from None
    rep.outputs.clear()  # the temporary file is not an output of the mix
    return _Source(spec, path, rep)


def _count(src: _Source, shape: Shape) -> None:
    """The pass over a converted file: each row's filter verdict, and the keys of those it keeps."""
    status = bytearray()
    keys, spec, rep = src.keys, src.spec, src.report
    turns, chars, answers = src.row_turns, src.row_chars, src.row_answer_chars
    filtered = bool(spec.filters)
    with open(src.path, "rb") as f:
        for line in f:
            row = orjson.loads(line)
            fact = facts(row, shape)
            turns.append(min(fact.turns, 0xFFFF))
            chars.append(min(fact.chars, 0xFFFFFFFF))
            answers.append(min(fact.answer_chars, 0xFFFFFFFF))
            why = filter_reason(spec, fact) if filtered else None
            if why is not None:
                file, at = origin(row)
                rep.reject("filtered_out", file, at, f"source {spec.name!r}: {why}")
                status.append(FILTERED)
                continue
            status.append(AVAILABLE)
            keys.append(duplicate_key(row, shape))
    src.status = np.frombuffer(bytes(status), dtype=np.uint8).copy()


def _deduplicate(sources: list[_Source], shape: Shape) -> None:
    """Mark every copy of a conversation after its first (recipe order, then file order) a duplicate,
    counted against the source that kept the first. Memory: the keys, one stable argsort and the
    sorted keys (24 bytes a row) for the moment of the sort; then only the duplicates' indices."""
    starts = np.cumsum([0, *(len(s.keys) for s in sources)])  # each source's first index in `keys`
    keys = np.concatenate([np.frombuffer(s.keys, dtype=np.uint64) for s in sources])
    for s in sources:
        s.keys = array("Q")  # the memory goes back once the keys are in one array
    order = np.argsort(keys, kind="stable")  # equal keys keep their order: the first copy comes first
    ordered = keys[order]
    del keys
    later = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1  # sorted positions of the later copies
    dups = order[later]
    kept = order[np.searchsorted(ordered, ordered[later], side="left")]
    del order, ordered
    by_input = np.argsort(dups, kind="stable")  # in input order: the examples are the first ones
    dups, kept = dups[by_input], kept[by_input]
    dup_src = np.searchsorted(starts, dups, side="right") - 1
    kept_src = np.searchsorted(starts, kept, side="right") - 1
    # per source with duplicates or the first ones' originals: the row of each of its keys (taken
    # before any row is marked, while the keys are still the rows available)
    involved = set(np.unique(dup_src).tolist()) | set(kept_src[:5].tolist())
    rows = {i: np.flatnonzero(sources[i].status == AVAILABLE) for i in involved}

    def where(g: int, i: int) -> tuple[int, int]:
        return i, int(rows[i][g - starts[i]])

    first = zip(
        dups[:5].tolist(), dup_src[:5].tolist(), kept[:5].tolist(), kept_src[:5].tolist(), strict=True
    )
    examples = [(where(g, i), where(k, j)) for g, i, k, j in first]
    for i in np.unique(dup_src).tolist():
        mine = dup_src == i
        sources[i].status[rows[i][dups[mine] - starts[i]]] = DUPLICATE
        pairs, n = np.unique(kept_src[mine], return_counts=True)
        for j, k in zip(pairs.tolist(), n.tolist(), strict=True):
            sources[i].against[sources[j].spec.name] += k
    _duplicate_examples(sources, shape, examples)
    for s in sources:
        s.available = int(np.count_nonzero(s.status == AVAILABLE))


def _duplicate_examples(
    sources: list[_Source], shape: Shape, pairs: list[tuple[tuple[int, int], tuple[int, int]]]
) -> None:
    """The first duplicates' reasons, naming the row each copies (read back from the converted files):
    `pairs` of ((source, row) of the copy, (source, row) of the row kept)."""
    wanted: dict[int, set[int]] = {}
    for copy, first in pairs:
        for i, n in (copy, first):
            wanted.setdefault(i, set()).add(n)
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for i, lines in wanted.items():
        last = max(lines)
        with open(sources[i].path, "rb") as f:
            for n, line in enumerate(f):
                if n in lines:
                    rows[(i, n)] = orjson.loads(line)
                if n >= last:
                    break
    for (i, a), (j, b) in pairs:
        file, at = origin(rows[(i, a)])
        kfile, kat = origin(rows[(j, b)])
        where = f"{kfile}:{kat}" if kat is not None else kfile
        kept_by, name = sources[j].spec.name, sources[i].spec.name
        why = f"source {name!r}: the same conversation as source {kept_by!r} ({where})"
        sources[i].report.reject("duplicate_removed", file, at, why)  # the examples; _account adds the rest


def _stream(src: _Source, rng: np.random.Generator) -> Generator[tuple[bytes, int]]:
    """The converted lines `src` gives, in file order, each with its repeat number (0: the row's first
    time): every available row once per full pass, then a draw of the rest
    (:meth:`numpy.random.Generator.choice` without replacement). Sums the facts of the rows it gives."""
    full, part = divmod(src.take, src.available) if src.available else (0, 0)
    chosen = np.zeros(src.available, dtype=bool)
    if part:
        chosen[rng.choice(src.available, part, replace=False)] = True
    status = src.status.tobytes()
    turns, chars, answers = src.row_turns, src.row_chars, src.row_answer_chars
    for p in range(full + (1 if part else 0)):
        last = p == full
        with open(src.path, "rb") as f:
            k = 0
            for n, line in enumerate(f):
                if status[n] != AVAILABLE:
                    continue
                if not last or chosen[k]:
                    src.turns += turns[n]
                    src.chars += chars[n]
                    src.answer_chars += answers[n]
                    yield line, p
                k += 1


def _write(recipe: Recipe, sources: list[_Source], out: Path, report: Report, progress: Progress) -> None:
    streams = [
        _stream(s, np.random.default_rng([recipe.seed, zlib.crc32(s.spec.name.encode())])) for s in sources
    ]
    order = np.repeat(np.arange(len(sources), dtype=np.uint16), [s.take for s in sources])
    np.random.default_rng([recipe.seed, len(sources)]).shuffle(order)
    total = len(order)
    names = [s.spec.name.encode() for s in sources]
    parquet = recipe.to == "parquet"
    with Writer(out, recipe.to, report) as writer:
        for n, i in enumerate(_items(order)):
            line, repeat = next(streams[i])
            if parquet:
                row = with_source(orjson.loads(line), names[i].decode(), repeat)
                writer.write(_conversation(row, str(out.expanduser().resolve().parent)))
            else:
                writer.write_line(named_line(line, names[i], repeat))
            if n % 4096 == 0:
                progress(n, total, "rows")
    for s in streams:
        s.close()
    progress(total, total, "rows")
    assert writer.output is not None
    report.outputs.append(writer.output)


def _items(a: np.ndarray, block: int = 1 << 16) -> Iterator[int]:
    """The items of `a` as Python ints, a block at a time (not one list of them all)."""
    for at in range(0, len(a), block):
        yield from a[at : at + block].tolist()


def _conversation(row: dict[str, Any], folder: str) -> Any:
    """A source's converted line as its conversation; `folder`: the mix's, whose images/ its image
    addresses are relative to."""
    _, convs = parse(row, ParseContext(base_dir=folder))
    return convs[0]


def _account(src: _Source) -> None:
    """The mix's own counts in a source's report: duplicates, rows not drawn and repeats (upsampling,
    counted as extra output rows, like a tree's extra leaves); checks that they balance."""
    rep, name = src.report, src.spec.name
    rep.rejected["duplicate_removed"] = sum(src.against.values())  # the examples counted some already
    rep.rejected["not_sampled"] += src.available - src.sampled
    repeats = src.take - src.sampled
    rep.rows_expanded += repeats
    if repeats:
        why = (f"source {name!r} ({src.spec.amount}) gives {src.take:,} rows from {src.available:,}:"
               f" {repeats:,} are repeats")  # fmt: skip
        rep.warn("upsampled", name, None, why, n=repeats)
    rep.rejected = +rep.rejected  # no zero counts
    rep.rows_out = src.take
    try:
        rep.check_accounting()
    except AccountingError as exc:
        raise AccountingError(f"source {name!r}: {exc}") from None


def _composition(recipe: Recipe, sources: list[_Source]) -> dict[str, Any]:
    """The composition table, as counts (shares and means are computed where they are shown)."""
    rows = []
    for s in sources:
        rep = s.report
        rejected = {k: v for k, v in sorted(rep.rejected.items())
                    if k not in ("duplicate_removed", "not_sampled")}  # fmt: skip
        rows.append({
            "name": s.spec.name,
            "amount": s.spec.amount,
            "inputs": list(s.spec.inputs),
            "from": s.spec.from_format,
            "filters": s.spec.filters,
            "rows_in": rep.rows_in + rep.rows_expanded - (s.take - s.sampled),
            "rejected": rejected,
            "duplicates": sum(s.against.values()),
            "duplicates_against": dict(sorted(s.against.items())),
            "not_sampled": s.available - s.sampled,
            "taken": s.sampled,
            "repeated": s.take - s.sampled,
            "rows_out": s.take,
            "turns": s.turns,
            "chars": s.chars,
            "answer_chars": s.answer_chars,
            "formats": dict(sorted(rep.formats.items())),
        })  # fmt: skip
    return {
        "seed": recipe.seed,
        "total": recipe.total,
        "to": recipe.to,
        "dedup": DEDUP,
        "near_duplicates": "not checked (exact duplicates only)",
        "balance": "rows_in = taken + rejected + duplicates + not_sampled; rows_out = taken + repeated",
        "sources": rows,
    }


def check_recipe_out(recipe: Recipe, out: Path) -> None:
    """Refuse an output that would replace one of the recipe's inputs (before anything runs)."""
    check_out([Path(p) for s in recipe.sources for p in s.inputs], out)
