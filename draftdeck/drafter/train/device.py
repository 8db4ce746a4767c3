"""The training device: which one, how much memory it has, and the peak a run has used.

Peak memory is CUDA's max allocated on a GPU and the process's peak RSS on the CPU (VmHWM, reset
at the start of a run where Linux allows, so a worker process that ran other jobs before reports
this run's peak, not its lifetime's).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from pathlib import Path

import torch

from draftdeck.errors import UsageError


class DeviceError(UsageError):
    """The run asks for a device this machine does not have, or more of its memory than it has."""


def resolve_device(device: str, rank: int, world: int) -> torch.device:
    """The device of local rank `rank` of `world` ranks on this machine (a node)."""
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise DeviceError(
            "this run asks for a GPU (device 'cuda') but this machine has none (no CUDA device)"
        )
    if device == "cpu" or not has_cuda:
        return torch.device("cpu")
    if world > torch.cuda.device_count():
        raise DeviceError(f"this run asks for {world} GPUs; this machine has {torch.cuda.device_count()}")
    return torch.device("cuda", rank)


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak(device: torch.device) -> None:
    """Start counting the peak from now (best effort on the CPU: Linux's clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak is then the process's
        Path("/proc/self/clear_refs").write_text("5")


def peak_bytes(device: torch.device) -> int:
    """The peak since `reset_peak`: CUDA max allocated, or the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    hwm = _status_kb("VmHWM")
    if hwm is not None:
        return hwm * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def in_use_bytes(device: torch.device) -> int:
    """What the run holds now: CUDA allocated, or the process's RSS."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    rss = _status_kb("VmRSS")
    return rss * 1024 if rss is not None else peak_bytes(device)


def resident_weights_gap(device: torch.device, weights: int) -> int:
    """Bytes of `weights` not counted in `in_use_bytes` yet. On the CPU, safetensors weights are
    memory-mapped and count in RSS only once touched (the first forward): the gap is the weights
    beyond the process's file-backed resident pages (RssFile). On a GPU they are allocated: 0."""
    if device.type == "cuda":
        return 0
    rss_file = _status_kb("RssFile")
    return max(0, weights - rss_file * 1024) if rss_file is not None else 0


def capacity_bytes(device: torch.device, sharing: int = 1) -> int | None:
    """What one rank may use at most: the GPU's free memory plus what it holds, or on the CPU what
    the system has available (MemAvailable, and the cgroup's limit when lower) plus the process's
    RSS, split between the `sharing` ranks on this machine. None when unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free) + in_use_bytes(device)
    total = _machine_bytes(device)
    return None if total is None else total // max(1, sharing)


def _machine_bytes(device: torch.device) -> int | None:
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if avail is None:
        return None
    total = avail + in_use_bytes(device)
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def idle_cpu_cores() -> int:
    """The cores no other work is using now: the CPUs this process may run on less the one-minute
    load average, at least 1. Torch's default (every core) on a shared machine makes its threads
    spin against the other work: on 2 busy cores a tiny model trained 2.2x slower with 2 threads than
    with 1, at 3.3x the CPU time (issue 49)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        return cores
    return max(1, min(cores, round(cores - busy)))
