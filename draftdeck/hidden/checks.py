"""The checks a cached row passes, on build and on load: each failure a named issue code
(draftdeck.quality: hidden_*), counted in the job's report; the policy decides error or warning.

A layer that is all zero or one value over a row is what vLLM's hybrid models (Qwen3.5) wrote until
vLLM PR #46301: finite, the right shape, and useless to a drafter."""

from __future__ import annotations

import torch

# ||stored - live|| / ||live|| a row may show for each stored dtype: rounding to the dtype (bf16 keeps
# 8 bits of mantissa: 2^-8 relative per value), and another kernel's reduction order when the files
# come from another engine (vLLM)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 1.6e-2}


def row_issues(
    hidden: torch.Tensor, ids: torch.Tensor, want_ids: torch.Tensor, layers: int, hidden_size: int
) -> list[tuple[str, str]]:
    """(code, reason) for each thing wrong with one row's [tokens, layers, hidden] and stored ids."""
    if ids.shape != want_ids.shape or not torch.equal(ids.long(), want_ids.long()):
        first = _first_difference(ids, want_ids)
        return [("hidden_ids_mismatch", f"{len(ids)} stored ids vs the dataset's {len(want_ids)}; {first}")]
    if tuple(hidden.shape) != (len(want_ids), layers, hidden_size):
        want = (len(want_ids), layers, hidden_size)
        return [("hidden_shape_mismatch", f"shape {tuple(hidden.shape)}, want {want}")]
    issues: list[tuple[str, str]] = []
    h = hidden.float()
    if not torch.isfinite(h).all():
        bad = int((~torch.isfinite(h)).sum())
        issues.append(("hidden_nonfinite", f"{bad} NaN or inf values"))
        return issues
    per_layer = h.transpose(0, 1).reshape(layers, -1)
    lo, hi = per_layer.min(dim=1).values, per_layer.max(dim=1).values
    for k in range(layers):
        if lo[k] == 0 and hi[k] == 0:
            issues.append(("hidden_zero_layer", f"stored layer {k} is all zero"))
        elif lo[k] == hi[k] and hidden.numel() > layers:
            issues.append(("hidden_constant_layer", f"stored layer {k} is {float(lo[k])} everywhere"))
    return issues


def live_issue(stored: torch.Tensor, live: torch.Tensor, dtype: str) -> tuple[str, str] | None:
    """The stored row against a live forward of the target: within the dtype's tolerance, per layer."""
    s, w = stored.float(), live.float()
    for k in range(w.shape[1]):
        err = float((s[:, k] - w[:, k]).norm() / w[:, k].norm().clamp_min(1e-12))
        if err > TOLERANCE[dtype]:
            return (
                "hidden_live_mismatch",
                f"stored layer {k} differs by {err:.2e} (relative), over {dtype}'s {TOLERANCE[dtype]:g}",
            )
    return None


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    n = min(len(a), len(b))
    diff = (a[:n].long() != b[:n].long()).nonzero()
    if len(diff):
        i = int(diff[0])
        return f"first difference at token {i}: {int(a[i])} vs {int(b[i])}"
    return "one is a prefix of the other"
