"""`draftdeck train` as a launcher starts it: N `torchrun --nnodes N` processes (one rank each) against
one c10d rendezvous on localhost, as N nodes of a cluster would."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.browser.harness import free_port
from tests.conftest import REPO_ROOT


def torchrun_nodes(train_args: list[str], nodes: int = 2) -> list[subprocess.Popen[str]]:
    """Start `draftdeck train TRAIN_ARGS` on `nodes` nodes of one rank each; output piped, text."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        "1",
    ]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    return [
        subprocess.Popen(
            [*torchrun, "--node-rank", str(node), *rendezvous, "-m", "draftdeck.cli", "train", *train_args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]
