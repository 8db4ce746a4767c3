"""Building a hidden-state cache: the frozen target runs once over every row of the datasets (each row
alone, unpadded: what `CachedTarget` serves a micro-batch's row), its hidden states of the layers the
chosen drafter kinds read (the union) and its final hidden state stored (`store`), every row checked
(`checks`), the first rows read back and compared with a live forward, the disk it takes said before
it starts and refused when the out folder's disk cannot hold it (size.py).

The field's offline files, both ways: speculators' and vLLM's ``hidden_states/hs_<i>.safetensors`` (one
per sample: ``hidden_states`` [tokens, layers, hidden], the tapped layers in order then the last, and
``token_ids`` [tokens]; speculators/data_generation/offline.py checks them on load). `write_speculators`
writes a cache's rows so (row i of the datasets, in order, is ``hs_<i>``); `import_speculators` takes
such a folder in as a cache: the files' layers (`stored_layers`, HF ``hidden_states`` indices in file
order, as speculators' launch config names them) mapped to the cache's order, refused with the reason
when a chosen kind's layers or the final layer are not there, every row checked as a built one is and
the first rows compared with a live forward of the target. SpecForge's offline records
(rows_*/data_<i>.ckpt[.gz], draftdeck.hidden.specforge) are taken in the same way, with the same checks."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.cache.size import Projection, check_disk, sized, stored_layers
from draftdeck.errors import JobFailed, UsageError
from draftdeck.hidden import checks, specforge
from draftdeck.hidden.store import DTYPES, CacheError, CacheManifest, CacheWriter, HiddenCache, dataset_entry
from draftdeck.issue_codes import Action
from draftdeck.jobs.context import RunContext
from draftdeck.provenance import model_fingerprint
from draftdeck.quality import Output, Policy, Report
from draftdeck.shards.store import ShardDataset
from draftdeck.units import binary_size


def kind_layer_ids(params: CacheParams, config: object) -> list[int]:
    """The target layer ids (`Target`'s: hidden_states[i + 1]) the chosen kinds read with their default
    options for this target, and `layer_ids`: their union, sorted."""
    from draftdeck.drafter.kinds import get_kind
    from draftdeck.drafter.train.plan import Shape

    ids = set(params.layer_ids or [])
    for name in params.drafter:
        planned = get_kind(name).plan(Shape(drafter=name, layers=params.layers), config)
        ids.update(int(i) for i in planned.cfg.target_layer_ids)
    return sorted(ids)


def dataset_rows(
    paths: list[Path], seq_length: int | None, only: range | None = None
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(dataset index, row, ids as training reads them: cut at `seq_length`) of every row, or of the
    rows whose index over all datasets' rows is in `only` (a slice: a chunk task's, a rank's)."""
    index = 0
    for di, path in enumerate(paths):
        row = 0
        for batch in ShardDataset(path).iter_batches():
            if only is not None and not (index < only.stop and index + batch.num_rows > only.start):
                index, row = index + batch.num_rows, row + batch.num_rows  # no row of the slice
                continue
            for ids in batch.column("input_ids").to_numpy(zero_copy_only=False):
                if only is None or index in only:
                    yield di, row, np.asarray(ids[:seq_length] if seq_length else ids, dtype=np.int64)
                row += 1
                index += 1


def live_rows(target: Target, ids: np.ndarray, layers: list[int]) -> torch.Tensor:
    """One row's forward alone: [tokens, len(layers), hidden] of the HF hidden_states indices `layers`."""
    return _forward(target, torch.from_numpy(ids)[None], layers)[0]


def _forward(target: Target, ids: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """[rows, tokens, len(layers), hidden] of rows of one length, unpadded (no attention mask)."""
    with torch.no_grad():
        out = target.model(
            input_ids=ids.to(target.device), output_hidden_states=True, use_cache=False, logits_to_keep=1
        )
    return torch.stack([out.hidden_states[j] for j in layers], dim=2)


# rows read ahead of the one being stored, in tokens: this many forwards' worth, so that rows of one
# length among them share a forward; their states wait in memory until their turn
WINDOW_BATCHES = 4


class Batched:
    """`Produce` for a build: the target's forward of rows of one length at once. It reads the same rows
    as the build, in the same order, a window of `WINDOW_BATCHES` x `batch_tokens` tokens ahead; within a
    window, rows of one length run in batches of at most `batch_tokens` tokens, without padding: each
    row's states are its own forward's (bit-equal at fp32 on the CPU, tests/unit/hidden/test_build.py),
    as a micro-batch of rows of one length reads them online."""

    def __init__(self, target: Target, layers: list[int], rows: Iterator[tuple[int, int, np.ndarray]],
                 batch_tokens: int, start: int = 0):  # fmt: skip
        self.target, self.layers, self.batch_tokens = target, layers, batch_tokens
        self.rows = enumerate(rows, start)  # `start`: the first row's index (a slice's)
        self.done: dict[int, torch.Tensor] = {}
        self.forwards = 0

    def __call__(self, index: int, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if index not in self.done:
            self._window()
        return self.done.pop(index), torch.from_numpy(ids)

    def _window(self) -> None:
        by_length: dict[int, list[tuple[int, np.ndarray]]] = {}
        tokens = 0
        for index, (_, _, ids) in self.rows:
            by_length.setdefault(len(ids), []).append((index, ids))
            tokens += len(ids)
            if tokens >= WINDOW_BATCHES * self.batch_tokens:
                break
        for length, group in by_length.items():
            per = max(1, self.batch_tokens // max(length, 1))
            for k in range(0, len(group), per):
                chunk = group[k : k + per]
                x = torch.from_numpy(np.stack([ids for _, ids in chunk]))
                states = _forward(self.target, x, self.layers).cpu()
                self.forwards += 1
                for (index, _), row in zip(chunk, states, strict=True):
                    self.done[index] = row


def project(params: CacheParams) -> Projection:
    """The cache `params` would build: its rows, tokens, layers and bytes."""
    from draftdeck.causal_lm import causal_lm_config

    config = causal_lm_config(params.target)
    layers = stored_layers(kind_layer_ids(params, config), int(config.num_hidden_layers))
    copies = 2 if params.format == "speculators" else 1
    return sized(
        params.inputs,
        params.seq_length,
        layers,
        int(config.hidden_size),
        params.dtype,
        copies,
        params.compress,
    )


def manifest_for(params: CacheParams, num_layers: int, hidden: int, layers: list[int]) -> CacheManifest:
    """The manifest to fill, once the datasets are known to be tokenized with the target's tokenizer."""
    from draftdeck.drafter.train.data import TrainData

    paths, target = [Path(p) for p in params.inputs], Path(params.target)
    TrainData(paths, heldout_fraction=0.0).check_tokenizer(target)
    return CacheManifest(
        target=str(target.resolve()), target_fingerprint=model_fingerprint(target),
        datasets=[dataset_entry(p.resolve(), len(ShardDataset(p))) for p in paths],
        layers=layers, num_layers=num_layers, hidden_size=hidden, dtype=params.dtype,
        seq_length=params.seq_length, compression=params.compress,
    )  # fmt: skip


def announce(ctx: RunContext, out: Path, plan: Projection) -> None:
    """Say the disk the cache takes before it starts; refuse when the out folder's disk cannot hold it."""
    free = check_disk(out, plan.disk_bytes)
    ctx.event("info", f"{plan.said()}; {binary_size(free)} free")


def build_cache(
    params: CacheParams, ctx: RunContext, *, device: str = "auto", only: range | None = None
) -> Report:
    """`device`: auto (a GPU when there is one) or cpu (a CPU train run's own cache, at fp32). `only`:
    the rows of one slice (their indexes over all datasets' rows), built as a cache of their own into
    `params.out` (slices.py merges the slices; the disk was said for the whole cache)."""
    cuda = torch.cuda.is_available() and device != "cpu"
    plan = project(params)
    if only is None:
        announce(ctx, Path(params.out), plan)  # before the target is loaded
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", None)  # as the train run loads it
    target = Target.load(params.target, device=device, dtype=dtype)
    mf = manifest_for(params, target.num_layers, plan.hidden, plan.layers)
    if only is None:
        ctx.event(
            "info", f"stored layers (HF hidden_states indices): {plan.layers}, the last the final layer"
        )

    paths = [Path(p) for p in params.inputs]
    rows = dataset_rows(paths, params.seq_length, only)
    forward = Batched(target, plan.layers, rows, params.batch_tokens, only.start if only else 0)
    report = fill(params, ctx, plan, mf, target, forward, only=only)
    report.extra["forwards"] = forward.forwards
    return report


# a row's hidden states [tokens, layers, hidden] (the cache's layer order) and its ids, by its index
# over all datasets' rows and its ids as training reads them
Produce = Callable[[int, np.ndarray], tuple[torch.Tensor, torch.Tensor]]


def fill(
    params: CacheParams, ctx: RunContext, plan: Projection, mf: CacheManifest, target: Target | None,
    produce: Produce, *, only: range | None = None,
) -> Report:  # fmt: skip
    """Store every row `produce` gives, checked and counted; then read the cache back (`verify`), and
    write speculators' files when asked. `target`: for the live check of the first rows (None: none).
    `only`: the rows of one slice (build_cache's)."""
    out, paths = Path(params.out), [Path(p) for p in params.inputs]
    policy = Policy.build(None, params.strict)
    total = len(only) if only is not None else plan.rows
    report = Report(rows_in=total)
    writer = CacheWriter(out, mf, params.shard_mb << 20)
    t0, done_tokens, written = time.perf_counter(), 0, 0
    first = only.start if only is not None else 0
    try:
        for index, (di, row, ids) in enumerate(dataset_rows(paths, params.seq_length, only), first):
            hidden, got_ids = produce(index, ids)
            stored = hidden.to(DTYPES[params.dtype])
            issues = checks.row_issues(stored, got_ids, torch.from_numpy(ids), len(mf.layers), mf.hidden_size)
            if _count(report, policy, issues, paths[di], row):
                continue  # rejected by the policy: not stored
            writer.add(di, row, stored, ids)
            report.rows_out += 1
            done_tokens += len(ids)
            written += stored.numel() * stored.element_size()
            ctx.progress(report.rows_out + report.rows_rejected, total, "rows")
            if report.rows_out % 64 == 0 or report.rows_out == total:
                dt = time.perf_counter() - t0
                ctx.metrics(report.rows_out, _throughput(report.rows_out, done_tokens, written, dt))
        if report.rows_out and not policy.failures(report):
            mf = writer.close()
        else:
            writer.discard()
    except BaseException:
        writer.discard()
        raise
    seconds = time.perf_counter() - t0
    report.extra.update(
        _throughput(report.rows_out, done_tokens, written, seconds), seconds=round(seconds, 3)
    )
    failures = policy.failures(report)
    if failures:
        raise JobFailed("; ".join(f.reason for f in failures), report)
    verify(out, target, paths, params.check_rows, report, policy, only)
    if params.format == "speculators" and only is None:
        report.extra["speculators_files"] = write_speculators(out, paths)
    return finish(out, mf, report)


def _throughput(rows: int, tokens: int, written: int, seconds: float) -> dict[str, float]:
    s = max(seconds, 1e-9)
    return {
        "cache/rows_per_s": rows / s,
        "cache/tokens_per_s": tokens / s,
        "cache/mb_per_s": written / s / 1e6,
    }


def _count(report: Report, policy: Policy, issues: list[tuple[str, str]], path: Path, row: int) -> bool:
    """Count a row's issues in `report`; True when the policy rejects the row (it is left out)."""
    rejected = False
    for code, reason in issues:
        if policy.action(code) is Action.REJECT and not rejected:  # a row is rejected once
            report.reject(code, str(path), row, reason)
            rejected = True
        else:
            report.warn(code, str(path), row, reason)
    return rejected


def verify(
    folder: Path, target: Target | None, paths: list[Path], check_rows: int, report: Report, policy: Policy,
    only: range | None = None,
) -> None:  # fmt: skip
    """The written cache read back: checksums, every row's ids against the dataset's, and its first
    `check_rows` rows against a live forward of `target` (None: no live check). Raises JobFailed with
    the counts when the policy says so. `only`: a slice's rows (the first rows are the whole cache's:
    a slice checks those of them it holds)."""
    cache = HiddenCache(folder)
    mf = cache.mf
    damaged = cache.verify_checksums()
    if damaged:
        raise CacheError(f"{folder}: shards {damaged} do not have the sha256 the manifest names")
    seen = 0
    first = only.start if only is not None else 0
    for index, (di, row, ids) in enumerate(dataset_rows(paths, mf.seq_length, only), first):
        e = cache.by_row.get((di, row))
        if e is None:
            continue  # left out by the policy, counted then
        want = torch.from_numpy(ids)
        if index < check_rows and target is not None:
            stored = cache.hidden(e)
            issues = checks.row_issues(stored, cache.ids(e), want, len(mf.layers), mf.hidden_size)
            if not issues:
                live = checks.live_issue(stored, live_rows(target, ids, mf.layers), mf.dtype)
                issues = [live] if live else []
            _count(report, policy, issues, paths[di], row)
            seen += 1
        elif not torch.equal(cache.ids(e).long(), want):
            _count(
                report,
                policy,
                checks.row_issues(cache.hidden(e), cache.ids(e), want, len(mf.layers), mf.hidden_size),
                paths[di],
                row,
            )
    report.extra["live_checked_rows"] = seen
    failures = policy.failures(report)
    if failures:
        shutil.rmtree(folder, ignore_errors=True)  # not a cache a run may read
        raise JobFailed("; ".join(f.reason for f in failures), report)


def finish(out: Path, mf: CacheManifest, report: Report) -> Report:
    report.outputs = [Output(str(out / s.filename), s.rows, s.bytes, s.sha256) for s in mf.shards]
    report.extra.update(
        cache=str(out), layers=mf.layers, dtype=mf.dtype, tokens=mf.tokens, bytes=mf.bytes,
        bytes_per_token=round(mf.bytes / max(mf.tokens, 1), 1), compression=mf.compression,
    )  # fmt: skip
    report.check_accounting()
    return report


# The field's offline files, both ways (speculators' and vLLM's hidden_states/hs_<i>.safetensors).
FOLDER = "hidden_states"


def write_speculators(cache: Path, paths: list[Path]) -> int:
    """``<cache>/hidden_states/hs_<i>.safetensors`` for every cached row; the files written."""
    from safetensors.torch import save_file

    c = HiddenCache(cache)
    folder = cache / FOLDER
    folder.mkdir(exist_ok=True)
    n = 0
    for index, (di, row, _) in enumerate(dataset_rows(paths, c.mf.seq_length)):
        e = c.by_row.get((di, row))
        if e is None:
            continue  # left out by the policy: counted in the report
        tensors = {"hidden_states": c.hidden(e).contiguous(), "token_ids": c.ids(e).long().contiguous()}
        save_file(tensors, str(folder / f"hs_{index}.safetensors"))
        n += 1
    return n


def import_speculators(params: CacheParams, ctx: RunContext) -> Report:
    from draftdeck.causal_lm import causal_lm_config

    assert params.import_from is not None and params.stored_layers is not None  # the params' validator
    src = Path(params.import_from)
    folder = src / FOLDER if (src / FOLDER).is_dir() else src
    config = causal_lm_config(params.target)
    final, hidden = int(config.num_hidden_layers), int(config.hidden_size)
    file_layers = list(params.stored_layers)
    records = specforge.find_records(src)  # SpecForge's data_<i>.ckpt(.gz), when the folder holds them
    if records:
        specforge.check_first(records[min(records)], file_layers, final, hidden)
    if final not in file_layers:
        raise UsageError(
            f"stored_layers {file_layers}: the final layer (hidden_states[{final}]) is not among them; the"
            " losses read it (speculators stores it last)"
        )
    wanted = [i + 1 for i in kind_layer_ids(params, config)]
    missing = sorted(set(wanted) - set(file_layers))
    if missing:
        raise UsageError(
            f"{src}: drafter {' and '.join(params.drafter)} reads hidden_states {missing}, which the files do"
            f" not hold (they hold {file_layers}): import for the kinds they serve (--drafter), or regenerate"
        )
    layers = [*sorted(set(file_layers) - {final}), final]
    order = [file_layers.index(j) for j in layers]  # the files' slots, in the cache's order
    plan = sized(params.inputs, params.seq_length, layers, hidden, params.dtype, compression=params.compress)
    if records:
        absent = [i for i in range(plan.rows) if i not in records]
    else:
        absent = [i for i in range(plan.rows) if not (folder / f"hs_{i}.safetensors").is_file()]
    if absent:
        files = "SpecForge record (data_<i>.ckpt)" if records else "hs_<i>.safetensors"
        raise UsageError(f"{folder}: {len(absent)} of {plan.rows} rows have no {files} (first: {absent[:5]})")
    announce(ctx, Path(params.out), plan)
    target = Target.load(params.target) if params.check_rows else None  # the live check's forward
    mf = manifest_for(params, final, hidden, layers)
    mf.source = f"imported from {src} ({'SpecForge records, ' if records else ''}stored_layers {file_layers})"

    def read(index: int, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file

        if records:
            states, record_ids = specforge.read_row(records[index], hidden)
            return states[:, order], record_ids

        data = load_file(str(folder / f"hs_{index}.safetensors"))
        hs, got = data.get("hidden_states"), data.get("token_ids")
        if hs is None or got is None:
            raise UsageError(f"{folder}/hs_{index}.safetensors: no hidden_states or token_ids")
        if hs.dim() == 3 and hs.shape[1] == len(file_layers):
            hs = hs[:, order]
        return hs, got

    return fill(params, ctx, plan, mf, target, read)
