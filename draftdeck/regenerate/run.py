"""`run_regenerate`: read conversations, have the target answer them, check, journal, write in order.

Accounting: ``read_conversations`` counts rows_in, rows_expanded and the input-level rejections;
every conversation it yields becomes one output row or one rejection under a regeneration code (in
the journal), so ``rows_in + rows_expanded == rows_out + rejected`` holds for a resumed job too.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from draftdeck.convert import ConvertOptions, read_conversations
from draftdeck.errors import Cancelled, JobFailed, UsageError
from draftdeck.formats.images import IMAGES_DIR, ImageLimits
from draftdeck.formats.model import Conversation, SourceRef
from draftdeck.formats.writers import Writer, encode_line, to_openai
from draftdeck.jobs.context import RunContext, file_roots
from draftdeck.quality import Action, Policy, Report, Rule
from draftdeck.regenerate.answer import RowRejected
from draftdeck.regenerate.images import reads_images
from draftdeck.regenerate.journal import Journal, journal_path
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.walk import walk

METRICS_EVERY_ROWS = 32


def _policy(params: RegenerateParams, policy: Policy | None) -> Policy:
    pol = policy or params.policy()
    if params.keep_cut_off and "answer_cut_off" not in pol.rules:
        pol.rules["answer_cut_off"] = Rule(Action.WARN)
    # the source's answers are replaced: an empty one is a slot to fill, not a row to drop
    pol.rules.setdefault("empty_assistant_turn", Rule(Action.WARN))
    return pol


def _source(src: SourceRef | None) -> dict[str, Any]:
    if src is None:
        return {}
    d = {"file": src.file, "line": src.line, "index": src.index, "id": src.id, "path": src.path}
    return {k: v for k, v in d.items() if v is not None}


def _fingerprint(paths: list[Path]) -> list[list[Any]]:
    out = []
    for p in paths:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _backend(params: RegenerateParams) -> Any:
    if params.local:
        from draftdeck.regenerate.local import LocalBackend

        return LocalBackend(params)
    from draftdeck.regenerate.client import OpenAIBackend

    return OpenAIBackend(params)


class _Job:
    def __init__(self, params: RegenerateParams, ctx: RunContext, report: Report, policy: Policy):
        self.params, self.ctx, self.report, self.policy = params, ctx, report, policy
        self.sampling = params.sampling()
        self.done = 0
        self.tokens = 0
        self.prompt_tokens = 0
        self.since_metrics = [0, 0]
        self.fatal: BaseException | None = None
        self.identity: dict[str, Any] = {}  # the answering model (draftdeck.provenance), per row
        self.vocab: str | None = None  # the vocabulary of the answers' token ids (None: not known)
        self.answers = self.answers_with_ids = 0
        # a turn's images are read again to be sent inline: from the data roots only, as the reader did
        self.image_limits = ImageLimits(roots=file_roots(ctx))

    def _counted(self, backend: Any) -> Any:
        """`backend.chat`, counting the tokens of every answer (rejected ones cost server time too)."""

        async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            answer = await backend.chat(messages, tools)
            self.tokens += answer.completion_tokens
            self.prompt_tokens += answer.prompt_tokens
            self.since_metrics[1] += answer.completion_tokens
            return answer

        return chat

    async def one(self, journal: Journal, key: int, conv: Conversation, backend: Any) -> None:
        src = conv.source
        try:
            got = await walk(
                conv, self._counted(backend), self.policy, self.params.reasoning, self.image_limits
            )
        except RowRejected as exc:
            where = src.where if src else "?"
            journal.append(
                {
                    "k": key,
                    "code": exc.code,
                    "reason": f"{where}: {exc.reason}",
                    "file": src.file if src else "?",
                    "line": src.line if src else None,
                }
            )
        else:
            out = got.conversation
            out.meta["source_ref"] = _source(src)
            out.meta["generation"] = {
                **self.sampling,
                "endpoints": sorted(got.endpoints),
                "turns": got.turns,
                "answered_by": self.identity,
            }
            with_ids = sum(1 for m in out.messages if m.token_ids)
            if with_ids:  # the vocabulary the answers' ids belong to (draftdeck.tokenize.target_ids)
                out.meta["generation"]["token_ids"] = {"vocab": self.vocab}
            self.answers += len(got.turns)
            self.answers_with_ids += with_ids
            record: dict[str, Any] = {"k": key, "row": to_openai(out)}
            if got.warnings:
                record["warn"] = got.warnings
                record["file"], record["line"] = (src.file, src.line) if src else ("?", None)
            journal.append(record)
        self.done += 1
        self.since_metrics[0] += 1

    async def run(
        self, journal: Journal, inputs: list[Path], options: ConvertOptions
    ) -> list[dict[str, Any]]:
        backend = _backend(self.params)
        self.identity = backend.identity.to_dict()
        self.vocab = backend.vocab
        sem = asyncio.Semaphore(self.params.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        def finished(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            sem.release()
            if not t.cancelled() and t.exception() is not None and self.fatal is None:
                self.fatal = t.exception()

        try:
            await backend.preflight()
            for key, conv in enumerate(read_conversations(inputs, self.report, options)):
                if journal.done(key):
                    continue
                await sem.acquire()
                if self.fatal is not None:
                    break
                self._tick()
                task = asyncio.create_task(self.one(journal, key, conv, backend))
                tasks.add(task)
                task.add_done_callback(finished)
            while tasks and self.fatal is None:
                await asyncio.wait(set(tasks), timeout=0.2)
                self._tick()
        finally:
            for t in list(tasks):
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await backend.aclose()
        if self.fatal is not None:
            raise self.fatal
        self._tick(force=True)
        return backend.health()

    def _tick(self, force: bool = False) -> None:
        """Progress (which may raise Cancelled) and count metrics since the previous point."""
        rows, toks = self.since_metrics
        if force or rows >= METRICS_EVERY_ROWS:
            if rows:
                self.ctx.metrics(self.done, {"regen/rows": rows, "regen/completion_tokens": toks})
            self.since_metrics = [0, 0]
        self.ctx.progress(self.done, None, "rows")


def run_regenerate(params: RegenerateParams, ctx: RunContext, policy: Policy | None = None) -> Report:
    """Regenerate `params.inputs` into `params.out`; resumes from ``OUT.journal`` when present.

    Raises UsageError (bad parameters, a refused key, an unknown model), JobFailed (the policy fails,
    every endpoint is down; the journal keeps what was done) or Cancelled.
    """
    inputs = [Path(p) for p in params.inputs]
    for p in inputs:
        if not p.exists():
            raise UsageError(f"input {p} does not exist")
    out = Path(params.out)
    pol = _policy(params, policy)
    report = Report()
    started = time.monotonic()
    # What decides a row's outcome: a resume with other values would mix two jobs in one output.
    header = {
        "inputs": _fingerprint(inputs),
        "sampling": params.sampling(),
        "keep_cut_off": params.keep_cut_off,
        # only when set: a journal written before the option existed still resumes
        **({"from_format": params.from_format} if params.from_format else {}),
        **({"columns": params.columns, "tags": params.tags} if params.columns else {}),
    }
    journal = Journal(journal_path(out), header)
    job = _Job(params, ctx, report, pol)
    # Prompt-only rows are what regeneration is for; the source's answers are dropped, so a dummy
    # answer on every row (placeholder_response) is no reason to reject a prompt here. Rows with images
    # keep them (stored once in images/ beside the output, which the written rows point at), unless
    # the local target reads no images: then each is multimodal_content, as tokenize rejects them. A
    # server is sent them; one that refuses a request with images rejects that row the same way.
    text_only = params.local is not None and not reads_images(params.local)
    options = ConvertOptions(
        policy=pol, allow_prompt_only=True, placeholder_max_chars=-1, from_format=params.from_format,
        columns=params.columns, tags=params.tags, image_roots=file_roots(ctx),
        images="reject" if text_only else "keep",
        images_dir=str(out.expanduser().resolve().parent / IMAGES_DIR),
    )  # fmt: skip
    if journal.resumed:
        ctx.event("info", f"resuming: {journal.resumed} rows already done in {journal.path}")
    health: list[dict[str, Any]] = []
    try:
        health = asyncio.run(job.run(journal, inputs, options))
    except (Cancelled, UsageError, JobFailed):
        if journal.offsets:
            journal.close()  # kept: a rerun resumes from it
        else:
            journal.remove()  # nothing done (a refused key, say): leave nothing behind
        raise
    records = journal.records()
    journal.close()
    report.extra["regenerate"] = {
        **params.sampling(),
        "endpoints": health,
        "api_key_used": params.api_key() is not None,
        "resumed_rows": journal.resumed,
        "completion_tokens": job.tokens,
        # answers of this run (a resumed job's earlier ones are not counted) that came with token ids
        "answers": job.answers,
        "answers_with_token_ids": job.answers_with_ids,
        "prompt_tokens": job.prompt_tokens,
        "journal": str(journal.path),
    }
    writer = Writer(out, "openai", report)
    with writer:
        for rec in records:
            for code, reason in rec.get("warn", ()):
                report.warn(code, rec["file"], rec["line"], reason)
            if "row" in rec:
                writer.write_line(encode_line(rec["row"]))
                report.rows_out += 1
            else:
                report.reject(rec["code"], rec["file"], rec["line"], rec["reason"])
        report.check_accounting()
        elapsed = time.monotonic() - started
        report.extra["elapsed_s"] = round(elapsed, 3)
        report.extra["losses"] = pol.losses(report)
        failures = pol.failures(report)
        if failures:
            reasons = "; ".join(f.reason for f in failures[:5])
            raise JobFailed(f"regenerate failed: {reasons} (the journal {journal.path} is kept)", report)
    assert writer.output is not None
    report.outputs.append(writer.output)
    report.check_accounting()
    journal.remove()
    return report
