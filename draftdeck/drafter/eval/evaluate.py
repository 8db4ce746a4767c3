"""The `eval` job: real speculative decoding of a drafter checkpoint against its target on held-out
prompts, beside target-only decoding, the untrained drafter and prompt lookup, and the walked tau of
the same checkpoint on the target's own outputs for the same prompts.

Every tau here counts the bonus token ("incl. bonus", as vLLM): tau = (accepted + steps) / steps.
Counts go to `<out>/eval.json` and to metric points (`eval/...`, draftdeck.jobs.context); ratios are
computed only to be shown. When the prompts come from two or more sources (a mix's source names, else
the original files), the drafter's counts are also kept per source: eval.json's `by_source` and the
metrics `eval/source/<name>/accepted` and `eval/source/<name>/steps`, which the run page shows beside
the held-out tau of the same source.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from draftdeck.drafter.eval import suites
from draftdeck.drafter.eval.baselines import PromptLookup
from draftdeck.drafter.eval.drafters import check_pair, load_checkpoint, walked
from draftdeck.drafter.eval.images import ByModality, PromptImages, dataset_images
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import DecodeStats, DraftSource, Sampling, TargetRunner
from draftdeck.drafter.eval.suite_eval import SuiteTallies, Turn, decode_turns, read_suites
from draftdeck.drafter.eval.tally import Decoded, Tally, decode
from draftdeck.drafter.eval.tree import DEFAULT_TOPK, TreeShape, tree_words
from draftdeck.drafter.eval.tree_decode import TreeSource, tree_refusal
from draftdeck.drafter.eval.versus import Real, decoder_mismatch, run_figures, versus_training
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.data import TrainData
from draftdeck.errors import UsageError
from draftdeck.fileio import sha256_file
from draftdeck.formats.model import PROVENANCE_KEY, mix_source_of, origin_of
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Output, Report
from draftdeck.run_provenance import run_provenance

METRIC_EVERY = 10  # prompts between metric points


@dataclass
class Prompt:
    ids: list[int]
    file: str
    line: int | None
    source: str = ""  # what per-source figures group it by: its mix source's name, else its original file


def _prompt_messages(messages: Any) -> list[dict[str, Any]] | None:
    """The conversation up to and including its last user turn (None: no user turn)."""
    if not isinstance(messages, list):
        return None
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1
    )
    return messages[: last_user + 1] if last_user >= 0 else None


def read_prompts(
    inputs: Path,
    tokenizer: Any,
    limit: int,
    report: Report,
    heldout_fraction: float = 0.02,
    template_kwargs: dict[str, Any] | None = None,
) -> list[Prompt]:
    """Prompt token ids from a messages JSONL file or a dataset folder's held-out split; every row
    read is counted in `report` as evaluated or rejected with its reason."""
    if inputs.is_dir():
        return _dataset_prompts(inputs, limit, report, heldout_fraction)
    if not inputs.is_file():
        raise UsageError(f"{inputs}: no such prompt file or dataset folder")
    out: list[Prompt] = []
    with inputs.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if len(out) >= limit:
                break
            if not line.strip():
                continue
            report.rows_in += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                report.reject("json_error", str(inputs), line_no, str(e))
                continue
            if not isinstance(row, dict):
                report.reject("not_an_object", str(inputs), line_no, f"a {type(row).__name__}, not an object")
                continue
            if "messages" not in row:
                report.reject(
                    "unknown_format", str(inputs), line_no, f"no `messages` key (keys: {sorted(row)})"
                )
                continue
            messages = _prompt_messages(row["messages"])
            if messages is None:
                report.reject("no_user_turn", str(inputs), line_no, "no user message to answer")
                continue
            try:
                ids = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                    **(template_kwargs or {}),
                )  # fmt: skip
            except Exception as e:  # a template raising is a row problem, named, not a crash
                report.reject("template_error", str(inputs), line_no, f"{type(e).__name__}: {e}")
                continue
            kept = row.get(PROVENANCE_KEY)  # a converted row's origin: its mix source, else its file
            found = origin_of(kept, str(inputs), line_no)
            source = mix_source_of(kept) or (found[0] if found else str(inputs))
            out.append(Prompt([int(t) for t in ids], str(inputs), line_no, source))
    return out


def _dataset_prompts(folder: Path, limit: int, report: Report, heldout_fraction: float) -> list[Prompt]:
    """Prompts of a tokenized dataset's held-out split (the trainer's split by conversation): the
    tokens before each row's first trained token."""
    from draftdeck.drafter.train.data import is_heldout
    from draftdeck.shards.store import ShardDataset, row_source_name

    ds = ShardDataset(folder)
    out: list[Prompt] = []
    for n in range(len(ds)):
        if len(out) >= limit:
            break
        row = ds.row(n)
        if not is_heldout(str(row["source"]), int(row["source_row"]), heldout_fraction):
            continue
        report.rows_in += 1
        mask = list(row["loss_mask"])
        if 1 not in mask:
            report.reject("no_trained_tokens", str(folder), n, "the row has no trained token")
            continue
        first = mask.index(1)
        out.append(Prompt([int(t) for t in row["input_ids"][:first]], str(folder), n, row_source_name(row)))
    return out


def _finite(value: Any) -> Any:
    """JSON has no NaN: a ratio with no denominator is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


CONVENTIONS = (
    "Two counts of one decode. tau incl. bonus counts a bonus token on every verify step, as vLLM's"
    " spec-decode counters do (1 + accepted / drafts): compare it with vLLM's metrics. Tokens per"
    " verify step counts what each step added to the output, as z-lab's dflash benchmark does: a step"
    " ending at an accepted stop token or at max_new_tokens adds no bonus, so it is a little lower:"
    " compare it with z-lab's published acceptance lengths."
)


def _metric_delta(
    now: DecodeStats, before: dict[str, int], block: int, by_source: dict[str, DecodeStats] | None = None
) -> dict[str, float]:
    values = {"eval/accepted": now.accepted, "eval/steps": now.steps, "eval/proposed": now.proposed,
              "eval/produced": now.produced}  # fmt: skip
    values.update({f"eval/hist/{n}": now.hist[n] for n in range(1, block + 1)})
    values.update({f"eval/pos/{i}/accepted": now.per_pos[i] for i in range(block - 1)})
    for name, st in (by_source or {}).items():
        values.update({f"eval/source/{name}/accepted": st.accepted, f"eval/source/{name}/steps": st.steps})
    delta = {k: float(v - before.get(k, 0)) for k, v in values.items()}
    before.update(values)
    return delta


def _served(
    params: EvalParams,
    prompts: list[list[int]],
    real_tau: float,
    walked_tau: float,
    ctx: RunContext,
    groups: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The same prompts through the served drafter (draftdeck/serving/served_eval.py), beside the
    checkpoint's real and walked tau on them: the three numbers of one drafter on one prompt set. With
    `groups` (each prompt's suite and category), one window per category, in order, and the whole summed."""
    import os

    from draftdeck.serving.served_eval import ServedCounts, served_eval

    assert params.served_url is not None
    metrics = params.served_metrics_url or params.served_url.rstrip("/").removesuffix("/v1") + "/metrics"
    token = os.environ.get(params.served_token_env) if params.served_token_env else None
    where = f"{params.served_url} ({params.served_kind})"
    ctx.event("info", f"served eval: {len(prompts)} prompts to {where}")
    by_group: dict[tuple[str, str], list[list[int]]] = {}
    for key, ids in zip(groups or [("", "")] * len(prompts), prompts, strict=True):
        by_group.setdefault(key, []).append(ids)
    parts = {
        key: served_eval(
            ids,
            kind=params.served_kind,
            base_url=params.served_url,
            metrics_url=metrics if params.served_kind == "vllm" else None,
            model=params.served_model,
            max_new_tokens=params.max_new_tokens,
            token=token,
        )
        for key, ids in by_group.items()
    }
    counts = ServedCounts.merge(params.served_kind, list(parts.values()))
    if any(p.other_traffic for p in parts.values()):
        ctx.event(
            "warning",
            "served eval: the server verified more tokens than it returned to this eval: other requests "
            "were served meanwhile, so its counters are not these prompts' alone",
        )
    out = {**counts.to_json(), "url": params.served_url, "offline_real_tau_incl_bonus": real_tau,
           "walked_tau_incl_bonus": walked_tau}  # fmt: skip
    if groups:  # per suite and category: the server's tau on exactly the turns counted offline there
        out["by_category"] = {}
        for (suite, cat), part in parts.items():
            fig = {
                "prompts": part.prompts,
                "verify_steps": part.verify_steps,
                "tau_incl_bonus": part.tau_incl_bonus,
            }
            out["by_category"].setdefault(suite, {})[cat] = fig
    return out


def _fits(target: Target, max_new: int) -> Callable[[list[int]], str | None]:
    """Why a prompt of these ids cannot be decoded within the target's positions (None: it can)."""

    def fits(ids: list[int]) -> str | None:
        if len(ids) + max_new > target.max_positions > 0:
            most = target.max_positions
            return f"{len(ids):,} prompt tokens + {max_new} new exceed the target's {most:,} positions"
        return None

    return fits


def _dataset_turns(
    prompts: list[Prompt], decode_nth: Callable[[list[int], int], Decoded], report: Report
) -> Iterator[Turn]:
    """The dataset's (or a prompt file's) prompts decoded in order, each grouped by its source."""
    for n, p in enumerate(prompts):
        yield Turn("", p.source, p.ids, decode_nth(p.ids, n), p.file, p.line or 0, 1)
        report.rows_out += 1


def _suite_record(names: list[str]) -> dict[str, Any]:
    """Where each shipped suite evaluated comes from (a user's file: its path)."""
    shipped = suites.sources()
    return {n: ({k: shipped[n][k] for k in ("repo", "commit", "path", "licence", "sha256", "prompt")}
                if n in shipped else {"file": n}) for n in names}  # fmt: skip


def _target_config(folder: str) -> Any:
    """The target's HF config, or None where transformers cannot read it alone (the loader says why)."""
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None


def _refuse_tree(target: str, config: Any) -> None:
    refused = tree_refusal(config) if config is not None else None
    if refused is not None:
        raise UsageError(f"{target}: {refused}")


def _tree_shape(params: EvalParams, block: int) -> TreeShape | None:
    """The draft tree a verify step checks (None: a chain), its depth within the verify block's drafts."""
    if not params.tree_budget:
        return None
    if params.tree_depth is not None and params.tree_depth > block - 1:
        raise UsageError(f"tree_depth {params.tree_depth}: at most the verify block's {block - 1} drafts")
    return TreeShape(params.tree_budget, params.tree_topk or DEFAULT_TOPK, params.tree_depth or block - 1)


Loaded = dict[tuple[str, str, str, bool], tuple[Target, Any]]  # (target, checkpoint, device, images) -> both


def _load(params: EvalParams, loaded: Loaded | None) -> tuple[Target, Any, TrainData | None]:
    """The target and the drafter checkpoint, checked as a pair; kept in `loaded` (and taken from it)
    when the caller evaluates one pair several times (a sweep: each point would load them again)."""
    images = None if params.suites else dataset_images(params.inputs, params.target)
    key = (str(params.target), str(params.checkpoint), params.device, images is not None)
    if loaded is not None and key in loaded:
        target, ck = loaded[key]
        if images is not None and images.image_rows is not None:
            target.attach_images(images.image_rows)
        return target, ck, images
    target = Target.load(params.target, device=params.device, vision=images is not None)
    if images is not None and images.image_rows is not None:  # the whole VLM: its tower reads the pictures
        target.attach_images(images.image_rows)
    ck = load_checkpoint(Path(params.checkpoint), device=params.device)
    check_pair(target, ck, params.checkpoint, params.target)
    if loaded is not None:
        loaded[key] = target, ck
    return target, ck, images


def run_eval(params: EvalParams, ctx: RunContext, loaded: Loaded | None = None) -> Report:
    """Evaluate `params.checkpoint`; write `<out>/eval.json`; return the row report. `loaded`: the
    target and checkpoint a caller keeps across evals of the same pair (see `_load`)."""
    out_dir = Path(params.out) if params.out is not None else ctx.out_dir
    if params.tree_budget:  # a hybrid target's trees are refused before anything loads
        _refuse_tree(params.target, _target_config(params.target))
    out_dir.mkdir(parents=True, exist_ok=True)
    target, ck, data = _load(params, loaded)
    shown = PromptImages(target, data)  # a dataset with images: which pictures each prompt shows
    block = params.block_size or ck.block
    report = Report()
    runner = TargetRunner(target, target.eos_ids())
    sampling = (
        Sampling(params.temperature, params.top_p, params.seed)
        if params.mode == "sampled"
        else Sampling(seed=params.seed)
    )
    sources: dict[str, DraftSource] = {"drafter": ck.source(target, block)}
    if params.baselines:
        sources["untrained"] = ck.source(target, block, untrained_seed=params.seed)
        sources["prompt_lookup"] = PromptLookup()
    if params.tree_budget and not isinstance(sources["drafter"], TreeSource):
        raise UsageError(
            f"tree_budget: {params.checkpoint}, a {ck.kind.title} drafter, drafts chains only;"
            " use tree_budget 0"
        )
    if params.confidence_threshold is not None:
        if not ck.kind.confident(ck.drafter):
            raise UsageError(
                f"confidence_threshold: {params.checkpoint}, a {ck.kind.title} drafter,"
                " has no confidence head"
            )
        sources["drafter_scheduled"] = ck.kind.source(
            ck.drafter, target, block, threshold=params.confidence_threshold
        )

    if params.tree_budget:  # a config only the model loader could read: checked once loaded
        _refuse_tree(params.target, target.model.config)
    tree = _tree_shape(params, block)

    def decode_nth(ids: list[int], n: int) -> Decoded:
        s = Sampling(sampling.temperature, sampling.top_p, sampling.seed + n)
        row = prompts[n].line if shown.data is not None else None
        shown.bind(ids, row)
        decoded = decode(runner, sources, ids, params.max_new_tokens, block, s, tree)
        shown.bind(ids + decoded.plain.output_ids, row)  # what the walk runs
        return decoded

    fits = _fits(target, params.max_new_tokens)
    if params.suites:
        chosen = read_suites(params.suites, report, params.max_per_category)
        total = sum(len(p.turns) for p in chosen)
        what = f"{len(chosen)} prompts ({total} turns) of {', '.join(params.suites)}"
        turns = decode_turns(chosen, target.tokenizer, params.template_kwargs, fits, decode_nth, report)
    else:
        read = read_prompts(Path(params.inputs[0]), target.tokenizer, params.max_prompts, report,
                            params.heldout_fraction, params.template_kwargs)  # fmt: skip
        prompts = []
        for p in read:
            too_long = fits(p.ids)
            if too_long is not None:
                report.reject("too_long", p.file, p.line, too_long)
            else:
                prompts.append(p)
        total, what = len(prompts), f"{len(prompts)} prompts"
        turns = _dataset_turns(prompts, decode_nth, report)
    if not total:
        where = ", ".join(params.suites) if params.suites else params.inputs[0]
        raise UsageError(f"{where}: no prompt to evaluate ({report.rows_rejected} rejected)")
    ctx.event("info", f"target: {target.loaded}")
    kwargs = f", template {params.template_kwargs}" if params.template_kwargs else ""
    drafting = ck.kind.drafting(block) + (f", {tree_words(tree)}" if tree else "")
    ctx.event("info", f"evaluating {what}, {drafting}, mode {params.mode}{kwargs}")

    tally = Tally(block, sampling.greedy)
    drafted = tally.methods["drafter"]  # the drafter's counts, what the metric points carry
    # the run's figures are for the drafter's own block size, and its target answered some prompts
    run = run_figures(Path(params.checkpoint)) if block == ck.block and not params.suites else None
    same = DecodeStats(block)  # the drafter on those prompts
    by_suite = SuiteTallies(block, sampling.greedy) if params.suites else None
    # the drafter per source, when there are several to tell apart
    names = set() if params.suites else {p.source for p in prompts}
    by_source = {name: DecodeStats(block) for name in sorted(names)} if len(names) > 1 else {}
    # the drafter on prompts with images and on text alone, for a target reading images
    modality = ByModality(block, target.vision.image_token_id) if target.vision is not None else None
    walk_ids: list[list[int]] = []
    groups: list[tuple[str, str]] = []  # each turn's suite and category
    outputs: list[list[int]] = []
    sent: dict[str, int] = {}
    n = 0
    for n, t in enumerate(turns, 1):
        ctx.check_cancelled()
        tally.add(t.decoded, {"prompt": n - 1, "file": t.file, "line": t.line, "turn": t.turn})
        walk_ids.append(t.ids)
        groups.append((t.suite, t.category))
        outputs.append(t.decoded.plain.output_ids)
        gen = t.decoded.methods["drafter"]
        if modality is not None:
            modality.add(t.ids, gen)
        if by_suite is not None:
            by_suite.add(t)
        elif by_source:
            by_source[t.category].add(gen)
        if run is not None and (str(Path(t.file).resolve()), t.line) in run.answered:
            same.add(gen)
        ctx.progress(n, total, "turns" if params.suites else "prompts")
        if n % METRIC_EVERY == 0:
            ctx.metrics(n, _metric_delta(drafted, sent, block, by_source), tokens=drafted.tokens)
    if not n:
        raise UsageError(f"no prompt could be evaluated ({report.rows_rejected} rejected)")
    if n % METRIC_EVERY:  # the last points since the last full stride
        ctx.metrics(n, _metric_delta(drafted, sent, block, by_source), tokens=drafted.tokens)

    w_acc, w_steps, w_hist = walked(ck, target, walk_ids, outputs, block)
    # the walk covers each output after its first token (the prefill's): the tokens its steps produce
    w_produced = sum(len(o) - 1 for o in outputs if len(o) > 1)
    walked_tau = 1 + w_acc / w_steps if w_steps else float("nan")
    real_tau = drafted.tau_pooled
    gap, message = decoder_mismatch(real_tau, walked_tau, params.tau_tolerance)
    if sampling.greedy and message is not None and tree is None:  # the walk is a chain's
        ctx.alert("decoder_mismatch", message)
    training = None
    if not params.suites:
        real = Real(real_tau, n, same.tau_pooled, same.responses)
        training, alarm = versus_training(real, run, params.tau_tolerance, params.off_target_tolerance)
        if sampling.greedy and alarm is not None and tree is None:
            ctx.alert(*alarm)
    methods = tally.method_entries()
    result: dict[str, Any] = {
        "tau_label": "tau incl. bonus = (accepted draft tokens + verify steps) / verify steps",
        "tokens_per_step_label": "tokens per verify step = tokens the verify steps produced / verify steps",
        "conventions": CONVENTIONS,
        "mode": params.mode,
        "block_size": block,
        "prompts": n,
        "max_new_tokens": params.max_new_tokens,
        "checkpoint": str(params.checkpoint),
        "drafter": ck.kind.name,
        "confidence_threshold": params.confidence_threshold,  # drafter_scheduled's cut, when asked
        # the draft tree each verify step checked (drafter and untrained; prompt lookup stays a chain)
        "tree": tree.to_dict() if tree else None,
        "tree_label": tree_words(tree) if tree else "chain: one block or chain of drafts per verify step",
        "target": str(params.target),
        # the chat template's settings the prompts were rendered with (thinking on or off): a dimension
        "template_kwargs": dict(params.template_kwargs),
        "target_only": tally.target_only(),
        "methods": methods,
        "walked": {
            "accepted": w_acc,
            "steps": w_steps,
            "hist_tau_incl_bonus": {str(k): w_hist[k] for k in range(1, block + 1)},
            "tau_incl_bonus": walked_tau,
            "convention": "tau incl. bonus (vLLM's counters); tokens_per_step is z-lab's",
            "produced": w_produced,
            "tokens_per_step": w_produced / w_steps if w_steps else float("nan"),
            "over": "greedy target outputs"
            if sampling.greedy
            else "sampled target outputs (not comparable to sampled acceptance)",
            "relative_gap_to_real": gap,
            "checks": "the decoder: real decoding and this walk over its own outputs agree exactly",
        },
        # the run's held-out taus for this checkpoint against real decoding (versus_training)
        "training": training if sampling.greedy else None,
    }
    result["lossless"] = methods["drafter"]["lossless"]
    # the versions and the device that decided these figures, and how the eval was started
    result["provenance"] = run_provenance(params.model_dump(mode="json"), target.device, 1)
    if by_suite is not None:  # per suite and category; each turn of a multi-turn prompt counted
        result["suites"] = by_suite.to_json()
        result["suite_sources"] = _suite_record(params.suites)
    if by_source:  # the drafter's counts per source; tau incl. bonus = 1 + accepted / steps
        result["by_source"] = {
            name: {"prompts": st.responses, "accepted": st.accepted, "steps": st.steps,
                   "produced": st.produced, "tau_incl_bonus": st.tau_pooled,
                   "tokens_per_step": st.tokens_per_step}
            for name, st in by_source.items()
        }  # fmt: skip
    if modality is not None:  # the drafter's counts on prompts with images and on text alone
        result["by_modality"] = modality.to_json()
    if params.served_url:
        result["served"] = _served(
            params, walk_ids, real_tau, walked_tau, ctx, groups if params.suites else None
        )
    report.extra["eval"] = _finite(result)
    report.check_accounting()
    path = out_dir / "eval.json"
    report.write_json(path)
    # The job's output: the file holding every figure, one row per prompt evaluated.
    report.outputs.append(Output(str(path), report.rows_out, path.stat().st_size, sha256_file(path)))
    report.check_accounting()
    return report
