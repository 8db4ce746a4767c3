"""Where this process stands in a run a launcher (torchrun, srun) started, read from its environment:
torch-free and importing nothing of the trainer, so every job that splits its work by ranks (training,
the hidden-state cache's build) can ask without importing the other."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from draftdeck.errors import DraftDeckError


@dataclass(frozen=True)
class Launched:
    """This process's place in a run a launcher started: global rank and world, and its local rank
    and the ranks on its node (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; SLURM's
    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE)."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launched | None:
        """The launcher's ranks, or None when this process was started alone (or as a world of 1)."""
        env = os.environ if env is None else env
        if "RANK" in env and "WORLD_SIZE" in env:  # torchrun (torch.distributed.run)
            keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:  # srun, one task per device
            keys = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
        else:
            return None
        try:
            rank, world = int(env[keys[0]]), int(env[keys[1]])
            local = int(env.get(keys[2], rank))
            # SLURM writes tasks per node as "4" or "4(x2)"
            local_world = int(env.get(keys[3], str(world)).split("(")[0])
        except ValueError as e:
            raise DraftDeckError(f"the launcher's environment is not numbers ({', '.join(keys)}): {e}") from e
        if world <= 1:
            return None
        if keys[0] == "SLURM_PROCID" and not env.get("MASTER_ADDR"):
            raise DraftDeckError(
                "under srun set MASTER_ADDR (the first node's host name) and MASTER_PORT in the batch"
                " script: the ranks meet there (docs/train.md has a batch script)"
            )
        return cls(rank, world, local, local_world)


def leave_process_group() -> None:
    """Leave the run's process groups (joined with torch.distributed) once this rank's work is done.

    What a rank built (the trainer's FSDP2 modules, their device mesh) can hold a process group in
    reference cycles; left to the interpreter's exit, the group's C++ threads were torn down out of
    order and the finished rank aborted ("terminate called without an active exception", about one
    2-rank CPU run in four). Collecting those cycles first frees the group while the process is whole."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()
