"""N training ranks under torch.distributed (gloo on CPU, nccl on GPU), relayed to one `ctx`.

Two ways in. Launched by a tool (`torchrun`, on one node or across nodes, or SLURM's `srun`): the
process is one rank already (`Launched.from_env`), joins the others (`run_launched`) and rank 0
reports to `ctx`. Launched by DraftDeck (`launch`, a train job's `--devices N` on one machine): the
process that holds `ctx` spawns the ranks and relays what rank 0 sends through a queue
(metric points, progress, events, alerts, the final record or the error); cancellation reaches
every rank through a shared flag, which the ranks reduce each step so that they all stop at the
same step. Counts are reduced across ranks inside the trainer (all_reduce SUM), so what arrives
here is already the whole run's.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as tmp

from draftdeck.drafter.train.device import resolve_device
from draftdeck.drafter.train.launched import Launched, leave_process_group
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run_record import RunRecord
from draftdeck.drafter.train.trainer import Trainer
from draftdeck.errors import Cancelled, DraftDeckError
from draftdeck.jobs.context import RunContext


class RankFailed(DraftDeckError):
    """A rank process died without saying why (killed, out of host memory, a crash in C code)."""


@dataclass
class RankContext:
    """The `RunContext` a rank sees: rank 0 forwards everything to the parent; cancellation is
    the shared flag (the trainer reduces it across ranks, so `progress` never raises here)."""

    out_dir: Path
    rank: int
    queue: Any
    cancel: Any

    def _send(self, *msg: Any) -> None:
        if self.rank == 0:
            self.queue.put(msg)

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self._send("progress", done, total, unit)

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("cancelled")

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self._send("event", level, message, code, count)

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        self._send("metrics", step, {k: float(v) for k, v in values.items()}, tokens)

    def alert(self, kind: str, message: str) -> None:
        self._send("alert", kind, message)


# What gloo and NCCL say when another rank's process or node went away mid-collective
PEER_LOST = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
)  # fmt: skip


def peer_lost(exc: BaseException) -> RankFailed | None:
    """`exc` in words when it means another rank died (its process killed, its node gone), else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not any(p in text for p in PEER_LOST):
        return None
    return RankFailed(
        "another rank of this run stopped (its process or its node went away) in the middle of a step:"
        " relaunch with the same --out to resume from the last checkpoint"
        f" ({text.splitlines()[0][:200]})"
    )


def run_launched(params: TrainParams, ctx: RunContext, where: Launched) -> RunRecord:
    """Train as one rank of a run a launcher started; rank 0 reports to `ctx`, writes checkpoints
    and run.json (in `out`, on storage every node sees)."""

    if params.devices not in (1, where.world):
        raise DraftDeckError(
            f"devices {params.devices}, but the launcher started {where.world} ranks: leave devices out"
            " (the launcher sets the world)"
        )
    os.environ.setdefault("RANK", str(where.rank))
    os.environ.setdefault("WORLD_SIZE", str(where.world))
    device = resolve_device(params.device, where.local_rank, where.local_world)
    _join(device, where.rank, where.world, where.local_world)
    try:
        local = (where.local_rank, where.local_world)
        return Trainer(params, ctx, where.rank, where.world, local).run()
    except RuntimeError as exc:
        raise (peer_lost(exc) or exc) from exc
    finally:
        leave_process_group()


def _join(device: torch.device, rank: int, world: int, sharing: int) -> None:
    """Join the run's process group: nccl on GPUs, gloo on CPUs (`sharing` ranks share this CPU)."""
    import torch.distributed as dist

    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // sharing))
    else:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, world: int, params: dict[str, Any], port: int, q: Any, cancel: Any, out_dir: str
) -> None:

    p = TrainParams(**params)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    _join(resolve_device(p.device, rank, world), rank, world, world)
    try:
        record = Trainer(p, RankContext(Path(out_dir), rank, q, cancel), rank, world).run()
        if rank == 0:
            q.put(("done", record.to_dict()))
    except BaseException as e:  # reported to the parent, which raises it
        e = peer_lost(e) or e
        try:
            q.put(("error", rank, e))
        except Exception:  # an exception that does not pickle: send its text
            q.put(("error", rank, DraftDeckError(f"{type(e).__name__}: {e}")))
        raise SystemExit(1) from None
    finally:
        leave_process_group()


def launch(params: TrainParams, ctx: RunContext) -> RunRecord:
    """Run `params.devices` ranks and relay them to `ctx`; returns rank 0's record, or raises the
    first rank's error (Cancelled, TrainingDiverged, a UsageError...)."""
    world = params.devices
    resolve_device(params.device, 0, world)  # no GPU when one is asked for: fail before spawning
    mp = tmp.get_context("spawn")
    q, cancel = mp.Queue(), mp.Event()
    port = _free_port()
    procs = [
        mp.Process(
            target=_rank_main,
            args=(r, world, params.model_dump(), port, q, cancel, str(ctx.out_dir)),
            daemon=False,
        )
        for r in range(world)
    ]
    for pr in procs:
        pr.start()
    record: dict[str, Any] | None = None
    error: BaseException | None = None
    try:
        while record is None and error is None:
            try:
                ctx.check_cancelled()
            except Cancelled:
                cancel.set()
            try:
                msg = q.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [pr for pr in procs if pr.exitcode not in (None, 0)]
                if dead and q.empty():
                    error = RankFailed(
                        f"rank {procs.index(dead[0])} exited with code {dead[0].exitcode} without a message"
                    )
                continue
            kind = msg[0]
            if kind == "progress":
                try:
                    ctx.progress(msg[1], msg[2], msg[3])
                except Cancelled:
                    cancel.set()
            elif kind == "metrics":
                ctx.metrics(msg[1], msg[2], tokens=msg[3])
            elif kind == "event":
                ctx.event(msg[1], msg[2], code=msg[3], count=msg[4])
            elif kind == "alert":
                ctx.alert(msg[1], msg[2])
            elif kind == "done":
                record = msg[1]
            elif kind == "error":
                error = msg[2]
    finally:
        for pr in procs:
            pr.join(timeout=30 if error is None else 5)
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
                pr.join()
    if error is not None:
        raise error
    assert record is not None
    return RunRecord(**record)
