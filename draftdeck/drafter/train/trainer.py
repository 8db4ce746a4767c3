"""The drafter trainer: the `Trainer` that `train/run.py` (`run_train`, `train`) drives, one process or
one rank of N.

Each optimizer step takes the next `batch_size * grad_accum * world` rows of the epoch's seeded
permutation; rank r trains its contiguous share in `grad_accum` micro-batches. The loss's
denominator (sum of slot weights) is summed over micro-batches and ranks BEFORE the forward, so the
gradient is exactly that of the whole global batch whatever the world size. Counts are reduced as
counts (all_reduce SUM) every step; rank 0 reports them, writes checkpoints and run.json.

Failures: NaN/inf loss stops before the optimizer step with an alert naming the step (the last
checkpoint is untouched); CUDA out of memory names the settings to lower; a failed checkpoint
write leaves the previous checkpoint intact and stops the run.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.model.attention import resolve_backend
from draftdeck.drafter.model.cached_target import NO_TRUTH_FROM_CACHE, check_cache, load_target
from draftdeck.drafter.train import sharding
from draftdeck.drafter.train.cache.fill import first_epoch_fill
from draftdeck.drafter.train.checkpoint import (
    CheckpointStore,
    bytes_writer,
    load_training_state,
    rng_state,
    set_rng_state,
    torch_writer,
)
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import DataPosition, TrainData, anchor_generator, collate
from draftdeck.drafter.train.device import DeviceError, peak_bytes, reset_peak, resolve_device
from draftdeck.drafter.train.drafters import MicroBatch, drafter_kind
from draftdeck.drafter.train.images import image_token_id, with_vision
from draftdeck.drafter.train.memory import check_memory, params_bytes
from draftdeck.drafter.train.optimizers import Schedules, build, lr_factor
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.plan import ddp_fits, fsdp_refused
from draftdeck.drafter.train.preflight import OnRank, compare, run_preflight
from draftdeck.drafter.train.ranks import Ranks
from draftdeck.drafter.train.run_record import RunRecord
from draftdeck.drafter.train.sharding import choose_sharding
from draftdeck.drafter.train.truth import OFF_TARGET, TruthUnavailable
from draftdeck.errors import Cancelled, DraftDeckError, UsageError
from draftdeck.fileio import atomic_output
from draftdeck.jobs.context import RunContext
from draftdeck.run_provenance import run_provenance


class TrainingDiverged(DraftDeckError):
    """The loss became NaN or inf."""


class Trainer:
    def __init__(
        self, params: TrainParams, ctx: RunContext, rank: int = 0, world: int = 1,
        local: tuple[int, int] | None = None,
    ):  # fmt: skip
        """Rank `rank` of `world`; `local`: (its rank, the ranks) on this node, when the run spans nodes."""
        self.p, self.ctx, self.rank, self.world = params, ctx, rank, world
        self.out = Path(str(params.out))  # run_train fills a missing `out` with the job folder
        self.device = resolve_device(params.device, *(local or (rank, world)))
        self.local_world = (local or (rank, world))[1]  # the ranks that share this machine
        cuda = self.device.type == "cuda"
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
        self.target = load_target(  # whole, or without its decoder layers from a hidden-state cache
            params.target, params.hidden_states, device=self.device, dtype=torch.bfloat16 if cuda else None
        )
        self.data = TrainData(
            params.inputs, heldout_fraction=params.heldout_fraction, seq_length=params.seq_length,
            image_token_id=image_token_id(self.target.folder),
        )  # fmt: skip
        self.data.check_tokenizer(self.target.folder)
        if self.data.image_rows is not None:  # the whole VLM: its vision tower reads the rows' images
            self.target = with_vision(
                params, self.data.image_rows, self.device, torch.bfloat16 if cuda else None
            )
        torch.manual_seed(params.seed)
        self.kind = drafter_kind(params, self.target, self.data)
        check_cache(self.target, self.data, self.kind.layer_ids)  # refused before any step
        # hidden_states_cache with no cache yet: the first epoch fills it (cache/fill.py)
        self.filling, self.target = first_epoch_fill(params, self.target, self.device)
        self.data.check(self.target.max_positions or 10**9, self.kind.slots)
        self.global_batch = params.batch_size * params.grad_accum * world
        self.steps_per_epoch = len(self.data.train) // self.global_batch
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"the global batch ({self.global_batch} rows = batch_size x grad_accum x devices) is larger "
                f"than the training split ({len(self.data.train)} rows)"
            )
        self.total_steps = params.max_steps or max(1, math.ceil(params.epochs * self.steps_per_epoch))
        self.warmup = int(params.warmup_ratio * self.total_steps)
        self.drafter = self.kind.model.to(self.device)
        try:
            self.attention = resolve_backend(params.attention, self.device)
        except ValueError as e:
            raise DeviceError(str(e)) from e
        if world > 1:  # the same start on every rank (the seed makes it so; this makes sure)
            import torch.distributed as dist

            for p in self.drafter.parameters():
                dist.broadcast(p.data, src=0)
        refused = fsdp_refused(params.drafter, params.hidden_states is not None)
        self.strategy, why = choose_sharding(params.sharding, world, self._ddp_fits(), refused)
        why = self.kind.shard(self.strategy, why, self.device, world)
        held = "whole on every rank"
        if self.strategy == "fsdp":
            held = sharding.shard_target(self.target, self.device, rank, world)
        self.eval_drafter = self.drafter
        self.opt = build(self.drafter, params.optimizer, params.lr, params.weight_decay)
        self.sched = Schedules(
            self.opt, lambda s: lr_factor(s, self.total_steps, self.warmup, params.min_lr_ratio)
        )
        self.store = CheckpointStore(self.out, keep=params.keep_checkpoints)
        self.step, self.pos, self.tokens = 0, DataPosition(), 0
        pad = getattr(self.target.tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        # the truth checks (draftdeck.drafter.train.preflight): set by the pre-flight
        self.judge = True  # measure target agreement (False: the target's view cannot be computed)
        self.answered_refs: list[Any] = []  # held-out rows whose prompts the target answered ...
        self.answered: list[Any] = []  # ... and its answers, the rows of the target-judged walk
        self.truth_alerted = False
        self.ranks = Ranks(rank, world, self.device, self.kind.slots)
        # the pre-flight and held-out rows: split across ranks and counts summed; with a sharded
        # target (its forwards are collectives) every rank runs every row, as one rank would
        self.eval_ranks = Ranks(0, 1, self.device, self.kind.slots) if self.target.sharded else self.ranks
        self.record = self._record()
        self.record.sharding = {
            "strategy": self.strategy,
            "why": why,
            "target": held,
        }

    def _state_shards(self) -> int:
        """Ranks the drafter's gradients and AdamW state are split over."""
        return self.world if self.strategy == "fsdp" and self.kind.shards_state else 1

    def _ddp_fits(self) -> bool | None:
        """For `--sharding auto` on N ranks: whether the planner fits a replicated drafter on this
        device (draftdeck.drafter.train.plan); None when not asked or the device's size is unknown."""
        if self.p.sharding != "auto" or self.world == 1:
            return None
        heldout = min(len(self.data.heldout), self.p.heldout_max_rows)
        return ddp_fits(
            self.target.model.config,
            self.p,
            self.data.longest_used,
            self.device,
            self.world,
            heldout,
            sharing=self.local_world,
        )

    # --- bookkeeping ------------------------------------------------------------------------
    def _record(self) -> RunRecord:
        p = self.p
        return RunRecord(
            inputs=list(p.inputs),
            manifest_sha256=self.data.manifest_sha256(),
            target=str(p.target),
            drafter=self.kind.describe(),
            loss=self.kind.loss_formula(),
            gamma=p.gamma,
            anchors_per_seq=p.anchors_per_seq,
            seq_length=p.seq_length,
            lr_schedule={
                "optimizer": p.optimizer,
                "lr": p.lr,
                "warmup_steps": self.warmup,
                "schedule": "linear warmup + cosine",
                "min_lr_ratio": p.min_lr_ratio,
                "weight_decay": p.weight_decay,
                "clip": p.clip,
                "grad_accum": p.grad_accum,
                "batch_size": p.batch_size,
            },
            seed=p.seed,
            world_size=self.world,
            global_batch=self.global_batch,
            data=self.data.describe(),
            total_steps=self.total_steps,
            provenance=run_provenance(p.model_dump(mode="json"), self.device, self.world),
        )

    def _write_record(self) -> None:
        """Bring the record up to date (every rank returns it) and write run.json (rank 0)."""
        self.record.steps_done = self.step
        if self.rank != 0:
            return
        idx = self.store.index()
        self.record.best_step = idx.best
        self.record.checkpoints = [str(self.store.dir / c["path"]) for c in idx.checkpoints]
        with atomic_output(self.out / "run.json", "w") as f:
            json.dump(self.record.to_dict(), f, indent=2)

    def _cancelled(self) -> bool:
        try:
            self.ctx.check_cancelled()
            return self.ranks.any(False)
        except Cancelled:
            return self.ranks.any(True)

    # --- checkpoints ------------------------------------------------------------------------
    def resume(self) -> bool:
        latest = self.store.latest()
        if latest is None:
            return False
        from safetensors.torch import load_file

        self._check_same_objective()
        training = load_training_state(latest / "training.pt")
        model = load_file(str(latest / "model.safetensors"), device="cpu")
        self.kind.check_resume(model)
        sharding.load_state(self.drafter, self.opt.parts, model, training["optimizer"])
        self.sched.load_state_dict(training["scheduler"])
        set_rng_state(training["rng"])
        state = json.loads((latest / "state.json").read_text(encoding="utf-8"))
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.pos = DataPosition.from_dict(state["position"])
        return True

    def _check_same_objective(self) -> None:
        """A run resumes with the optimizer it started with (the other's state cannot be loaded) and the
        loss and position weights (run.json names one objective: a silent switch halfway would make it
        name the wrong one for half the steps)."""
        path = self.out / "run.json"
        if not path.is_file():
            return
        before = json.loads(path.read_text(encoding="utf-8"))
        optimizer = (before.get("lr_schedule") or {}).get("optimizer", "adamw")
        if optimizer != self.p.optimizer:
            raise UsageError(
                f"{self.out} holds a run trained with optimizer {optimizer}, now {self.p.optimizer}:"
                f" resume with optimizer {optimizer} or use a new out folder"
            )
        loss, now = before.get("loss"), self.kind.loss_formula()
        if loss is not None and loss != now:
            raise UsageError(
                f"{self.out} holds a run trained with loss {loss!r}, now {now!r}: resume with the same"
                " --loss, its weights and --position-weights, or use a new out folder"
            )

    def save(self, heldout: dict[str, float] | None) -> None:
        """Write a checkpoint; `heldout`: its held-out figures (`Counts.index_figures`) or None.
        Every rank calls it (a sharded drafter is gathered); rank 0 writes."""
        state, optimizer = sharding.full_state(self.drafter, self.opt.parts, self.strategy)
        if self.rank != 0:
            return
        from safetensors.torch import save

        training = {
            "optimizer": optimizer,
            "scheduler": self.sched.state_dict(),
            "rng": rng_state(),
        }
        meta = {
            "step": self.step,
            "tokens": self.tokens,
            "position": self.pos.to_dict(),
            "heldout": heldout,
        }
        files = {
            "model.safetensors": bytes_writer(save(state, metadata={"format": "pt"})),
            **{name: bytes_writer(body) for name, body in self.kind.config_files().items()},
            "training.pt": torch_writer(training),
            "state.json": bytes_writer(json.dumps(meta, indent=2).encode()),
        }
        self.store.save(self.step, files, heldout)
        self._write_record()

    # --- the loop ---------------------------------------------------------------------------
    def _next_rows(self) -> list[tuple[int, int]]:
        """(epoch, index) of this step's global batch; an epoch's tail shorter than a batch is skipped."""
        if self.pos.index + self.global_batch > len(self.data.train):
            self.pos = DataPosition(self.pos.epoch + 1, 0)
        if self.filling is not None and self.pos.epoch > 0:  # the first epoch is over: read its cache
            self._filled()
        rows = [(self.pos.epoch, self.pos.index + i) for i in range(self.global_batch)]
        self.pos = DataPosition(self.pos.epoch, self.pos.index + self.global_batch)
        return rows

    def _filled(self) -> None:
        assert self.filling is not None
        self.target = self.filling.finish(self.ctx, self.device, self.data, self.kind.layer_ids)
        self.filling = None

    def _micro_batches(self, rows: list[tuple[int, int]]) -> list[MicroBatch]:
        share = len(rows) // self.world
        mine = rows[self.rank * share : (self.rank + 1) * share]
        orders: dict[int, Any] = {}
        out = []
        for i in range(0, len(mine), self.p.batch_size):
            chunk = mine[i : i + self.p.batch_size]
            examples, gens = [], []
            for epoch, index in chunk:
                order = orders.setdefault(epoch, self.data.epoch_order(self.p.seed, epoch))
                examples.append(self.data.example(self.data.train[int(order[index])]))
                gens.append(anchor_generator(self.p.seed, epoch, index))
            out.append(self.kind.micro_batch(examples, gens, self.pad_id, self.device))
        return out

    def train_step(self) -> tuple[Counts, float]:
        kind = self.kind
        micro = kind.align(self._micro_batches(self._next_rows()), self.ranks)
        wsum = sum(kind.weight_sum(m) for m in micro)
        total_w = float(self.ranks.sum(torch.tensor([wsum], dtype=torch.float64, device=self.device)).item())
        counts = Counts(kind.slots)
        self.drafter.train()
        for m in micro:
            with self.amp:
                counts = counts + kind.backward(
                    self.drafter, self.target, m, max(total_w, 1e-12), self.attention
                )
            counts.tokens += int(m.att.sum())
        kind.reduce_gradients(self.ranks)
        grad_norm = sharding.as_float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.p.clip))
        return self.ranks.counts(counts), grad_norm

    def _pass(
        self, examples: list[Any], sources: list[str], judge: bool, sample: bool = True
    ) -> tuple[Counts, dict[str, Counts]]:
        """A held-out pass over `examples`; `sample`: with the loss and per-slot counts at a seeded
        sample of `heldout_anchors` anchors per row (the walk alone otherwise)."""
        bs = self.p.eval_batch_size
        batches = [
            collate(examples[i : i + bs], self.pad_id, self.device) for i in range(0, len(examples), bs)
        ]
        groups = [sources[i : i + bs] for i in range(0, len(sources), bs)]
        with self.amp, self.target.same_rows():  # every rank or one: `eval_ranks`
            return self.kind.heldout(
                self.eval_drafter, self.target, batches, groups, judge, sample, self.attention
            )

    def evaluate(self, step: int) -> tuple[Counts, dict[str, Counts], Counts]:
        """The held-out pass: every count of the split judged by the data (with target agreement), the
        target-judged walk over the target's own answers, both per source; and, once a run, the truth
        alert when the first is above the second on the same prompts (draftdeck.drafter.train.preflight).
        The third: the data-judged counts of just those rows."""
        share = self.eval_ranks
        rows = self.data.heldout[: self.p.heldout_max_rows][share.rank :: share.world]
        k = len(self.answered_refs)  # this rank's rows whose prompts the target answered: a prefix of rows
        srcs = [self.data.source(r) for r in rows]
        wrapped = self.strategy if self.kind.shards_state else "none"  # a replicated drafter: itself
        self.eval_drafter = sharding.eval_copy(self.drafter, wrapped, self.device, self.kind.fresh)
        try:
            first, by_first = self._pass([self.data.example(r) for r in rows[:k]], srcs[:k], self.judge)
            rest, by_rest = self._pass([self.data.example(r) for r in rows[k:]], srcs[k:], self.judge)
        except TruthUnavailable as exc:  # a resumed run did not check the head before step 1
            self.judge = False
            if self.rank == 0:
                self.ctx.event(
                    "warning", f"target agreement is not measured: {exc}", code="truth_unavailable"
                )
            return self.evaluate(step)
        own, by_own = self._pass(self.answered, srcs[:k], judge=False, sample=False)
        total = first + rest
        total.add_target_walk(own)
        by: dict[str, Counts] = {}
        for name in {*by_first, *by_rest}:
            parts = [c for c in (by_first.get(name), by_rest.get(name)) if c is not None]
            by[name] = parts[0] + parts[1] if len(parts) == 2 else parts[0]
            if name in by_own:
                by[name].add_target_walk(by_own[name])
        first, own = share.counts(first), share.counts(own)
        message = None if self.truth_alerted else compare(first, own, self.p, step)
        if message is not None:
            self.truth_alerted = True
            if self.rank == 0:
                self.ctx.alert(OFF_TARGET, message)
        return share.counts(total), share.by_source(by), first

    def preflight(self, fresh: bool) -> None:
        """Before step 1: provenance, target agreement and the target's own answers to held-out
        prompts (draftdeck.drafter.train.preflight); a resumed run makes only the answers again."""
        with self.amp, self.target.same_rows():  # every rank or one: `eval_ranks`
            share = self.eval_ranks
            on = OnRank(self.target, self.data, self.kind.layer_ids, self.pad_id,
                        share.rank, share.world, share.counts, self.kind.slots)  # fmt: skip
            verdict = run_preflight(self.p, self.ctx, on, fresh=fresh)
        self.judge = verdict.judge
        self.answered_refs, self.answered = verdict.answered_refs, verdict.answered
        if fresh:
            self.record.truth = verdict.to_dict()
        elif (self.out / "run.json").is_file():  # what the first start found stands
            self.record.truth = (
                json.loads((self.out / "run.json").read_text(encoding="utf-8")).get("truth") or {}
            )
        self.truth_alerted = verdict.alert is not None  # the pre-flight said it already

    def run(self) -> RunRecord:
        self.record.check_same_run(self.out / "run.json")
        resumed = self.resume()
        if self.rank == 0:
            self.ctx.event("info", f"target: {self.target.loaded}, {self.target.num_layers} layers")
            self.ctx.event("info", self.kind.summary())
            if self.p.hidden_states is not None:  # truth_rows 0 when not given (TrainParams)
                self.ctx.event("info", NO_TRUTH_FROM_CACHE)
        if self.data.truncated_rows and self.rank == 0:
            self.ctx.event(
                "warning",
                f"{self.data.truncated_rows} rows are longer than seq_length {self.p.seq_length}: "
                f"{self.data.truncated_tokens} tokens past it are not trained",
                code="truncated",
                count=self.data.truncated_rows,
            )
        if resumed and self.rank == 0:
            self.ctx.event(
                "info", f"resumed from step {self.step} (epoch {self.pos.epoch}, row {self.pos.index})"
            )
        self.record.memory = check_memory(  # before step 1: refuses what cannot fit
            self.kind, self.target.config, self.p, self.data.longest_used, self.device,
            self.attention, heldout_rows=min(len(self.data.heldout), self.p.heldout_max_rows),
            weights=params_bytes(self.target.model),
            sharing=self.local_world, state_shards=self._state_shards(),
            ctx=self.ctx if self.rank == 0 else None,
            enforce=self.p.memory_check,
        )  # fmt: skip
        self.preflight(fresh=not resumed)
        self._write_record()
        reset_peak(self.device)
        window, busy, window_steps = Counts(self.kind.slots), 0.0, 0
        while self.step < self.total_steps:
            if self._cancelled():
                self._write_record()
                raise Cancelled(f"cancelled at step {self.step}; the last checkpoint is kept")
            t_step = time.perf_counter()
            try:
                counts, grad_norm = self.train_step()
            except torch.cuda.OutOfMemoryError as e:
                raise DeviceError(
                    f"out of GPU memory at step {self.step + 1} (batch_size {self.p.batch_size}, "
                    f"anchors_per_seq {self.p.anchors_per_seq}, seq_length {self.p.seq_length}): lower "
                    "batch_size (raise grad_accum to keep the global batch), anchors_per_seq or seq_length"
                ) from e
            step = self.step + 1
            if not math.isfinite(counts.loss) or not math.isfinite(grad_norm):
                msg = (
                    f"loss is {counts.loss} (grad norm {grad_norm}) at step {step}: the run stopped; "
                    "the last checkpoint is kept"
                )
                if self.rank == 0:
                    self.ctx.alert("training_diverged", msg)
                self._write_record()
                raise TrainingDiverged(msg)
            lr = self.opt.param_groups[0]["lr"]
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step = step
            self.tokens += counts.tokens
            window = window + counts
            busy += time.perf_counter() - t_step  # tokens/s over training steps, not evals or saves
            window_steps += 1
            if self.rank == 0:
                self.ctx.progress(step, self.total_steps, "steps")
            if step % self.p.log_every == 0 or step == self.total_steps:
                dt = max(busy, 1e-9)
                values = {
                    "train/loss": window.loss,
                    "train/lr": lr,
                    "train/grad_norm": grad_norm,
                    "train/tokens_per_s": window.tokens / dt,
                    "train/step_seconds": dt / max(window_steps, 1),
                    "train/peak_memory_mib": peak_bytes(self.device) / 2**20,
                    **window.position_metrics("train"),
                }
                if self.rank == 0:
                    self.ctx.metrics(step, values, tokens=self.tokens)
                window, busy, window_steps = Counts(self.kind.slots), 0.0, 0
            at_ckpt = step % self.p.checkpoint_every == 0 or step == self.total_steps
            heldout = matched = None
            if self.data.heldout and (at_ckpt or step % self.p.eval_every == 0):
                t_pass = time.perf_counter()
                heldout, by_source, matched = self.evaluate(step)
                if self.rank == 0:
                    values = {
                        **heldout.heldout_metrics(),
                        "heldout/peak_memory_mib": peak_bytes(self.device) / 2**20,
                        "heldout/seconds": time.perf_counter() - t_pass,
                    }
                    if len(by_source) > 1:  # one source: its figures are the split's
                        for name, c in by_source.items():
                            values.update(c.source_metrics(name))
                    self.ctx.metrics(step, values, tokens=self.tokens)
            if at_ckpt:
                self.save(None if heldout is None else heldout.index_figures(matched))
        if self.filling is not None:  # the run ended within its first epoch: its cache, for later runs
            self._filled()
        self._write_record()
        return self.record
