"""The recurrent state of a Gated DeltaNet layer (Qwen3.5/3.6, Qwen3-Next) after every position of a
verify block, so that rejected drafts are undone by choosing a state rather than by running the accepted
tokens again.

A linear-attention layer folds each token into one recurrent state; unlike a KV cache it cannot be cut
back to a prefix. Serving engines (vLLM, SGLang) therefore keep the state after each position of the
verify forward and commit the one at the accepted length. transformers' layers return only the state
after the last position, and pick their kernel by name from their modeling module's globals
(`torch_chunk_gated_delta_rule` for several tokens, `torch_recurrent_gated_delta_rule` for one). While
`BlockStates.recording()` is active those two names point at `_step_rule`: the rule of transformers'
`torch_recurrent_gated_delta_rule`, op for op (the form plain decoding runs, one token at a time), over
each position in turn, keeping every state. `commit` then writes the state at the accepted length into
the cache. The layer's convolution state needs nothing here: transformers' past recording keeps the
block's inputs until `crop` cuts them (see TargetRunner.new_cache).

The names are swapped only while a recording runs and put back after (counted, so that two models
of one module recording at once restore once); the replacement records only in the context that
started the recording (a ContextVar) and elsewhere calls the original, so another thread's forward
of the same model class is unchanged. The library's files are never edited.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


@dataclass
class _Recording:
    layer: int | None = None  # the Gated DeltaNet layer running now (set by a forward pre-hook)
    states: dict[int, list[torch.Tensor]] = field(default_factory=dict)


_active: ContextVar[_Recording | None] = ContextVar("draftdeck_gated_delta_recording", default=None)
_lock = threading.Lock()
_users: dict[str, int] = {}  # modeling module name -> recordings in progress that swapped its rules


def _step_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    **_: Any,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The gated delta rule position by position, as transformers' torch_recurrent_gated_delta_rule
    computes it (so a verified position gets what plain decoding of that token would). Inputs
    (batch, T, heads, dim), `g` and `beta` (batch, T, heads). Returns the output (batch, T, v heads, v
    dim) in the input's dtype and the state (batch, v heads, k dim, v dim) after each of the T positions."""
    dtype = query.dtype
    batch, length, k_heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    if k_heads != v_heads:  # each query/key head serves v_heads // k_heads consecutive value heads
        query = query.repeat_interleave(v_heads // k_heads, dim=2)
        key = key.repeat_interleave(v_heads // k_heads, dim=2)
    query, key, value, beta, g = (
        x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        for x in (query, key, value, beta, g)
    )
    if use_qk_l2norm_in_kernel:  # transformers' l2norm, eps 1e-6
        query = query * torch.rsqrt((query * query).sum(dim=-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(dim=-1, keepdim=True) + 1e-6)
    query = query / (query.shape[-1] ** 0.5)
    if initial_state is None:
        state = torch.zeros((batch, v_heads, k_dim, v_dim), dtype=value.dtype, device=value.device)
    else:
        state = initial_state.to(value)
    out = torch.zeros_like(value)
    states = []
    for i in range(length):
        state = state * g[:, :, i].exp()[..., None, None]
        k_t = key[:, :, i].unsqueeze(-1)
        kv_mem = (state * k_t).sum(dim=-2)
        delta = (value[:, :, i] - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t * delta.unsqueeze(-2)
        out[:, :, i] = (state * query[:, :, i].unsqueeze(-1)).sum(dim=-2)
        states.append(state)
    return out.transpose(1, 2).contiguous().to(dtype), states


def _recording_rule(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` where no recording runs in this context; `_step_rule`, its states kept, where one does."""

    @functools.wraps(original)
    def rule(*args: Any, **kwargs: Any) -> Any:
        recording = _active.get()
        if recording is None or recording.layer is None:
            return original(*args, **kwargs)
        out, states = _step_rule(*args, **kwargs)
        recording.states[recording.layer] = states
        recording.layer = None  # one call per layer and forward: a second one would have no owner
        return out, (states[-1] if kwargs.get("output_final_state") else None)

    rule.draftdeck_original = original  # type: ignore[attr-defined]
    return rule


def _swap_in(module_name: str) -> None:
    with _lock:
        if _users.get(module_name, 0) == 0:
            module = sys.modules[module_name]
            for name in RULES:
                setattr(module, name, _recording_rule(getattr(module, name)))
        _users[module_name] = _users.get(module_name, 0) + 1


def _swap_out(module_name: str) -> None:
    with _lock:
        _users[module_name] -= 1
        if _users[module_name] == 0:
            module = sys.modules[module_name]
            for name in RULES:
                setattr(module, name, getattr(module, name).draftdeck_original)


def _is_gated_delta_net(module: torch.nn.Module) -> bool:
    """A transformers Gated DeltaNet layer whose modeling module picks the rule by the names we swap."""
    modeling = sys.modules.get(type(module).__module__)
    return (
        type(module).__name__.endswith("GatedDeltaNet")
        and hasattr(module, "layer_idx")
        and all(callable(getattr(modeling, name, None)) for name in RULES)
    )


def _layer_idx(module: torch.nn.Module) -> int:
    """The decoder layer a Gated DeltaNet module belongs to: its index in the cache."""
    idx: Any = module.layer_idx  # a plain int attribute, which nn.Module's typing cannot see
    return int(idx)


class BlockStates:
    """The Gated DeltaNet layers of one model, and the states they passed through in the last
    recorded forward. A model without such layers has none, and recording it changes nothing."""

    def __init__(self, model: torch.nn.Module):
        self.layers = [m for m in model.modules() if _is_gated_delta_net(m)]
        self.layer_ids = frozenset(_layer_idx(m) for m in self.layers)
        self._modules = sorted({type(m).__module__ for m in self.layers})
        self._states: dict[int, list[torch.Tensor]] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Run a forward inside: each Gated DeltaNet layer keeps its state after every position."""
        self._states = {}
        if not self.layers:
            yield
            return
        recording = _Recording()

        def enter_layer(module: torch.nn.Module, _args: Any) -> None:
            recording.layer = _layer_idx(module)

        hooks = [m.register_forward_pre_hook(enter_layer) for m in self.layers]
        for name in self._modules:
            _swap_in(name)
        token = _active.set(recording)
        try:
            yield
        finally:
            _active.reset(token)
            for name in self._modules:
                _swap_out(name)
            for hook in hooks:
                hook.remove()
        self._states = recording.states

    def commit(self, cache: Any, kept: int) -> None:
        """Set each Gated DeltaNet layer's recurrent state in `cache` to the one after the first `kept`
        positions of the recorded block (the forward left the one after all of them)."""
        if set(self._states) != self.layer_ids:
            raise RuntimeError(
                f"the verify forward recorded the states of layers {sorted(self._states)}, expected "
                f"{sorted(self.layer_ids)}: was it run inside BlockStates.recording()?"
            )
        for idx, states in self._states.items():
            if not 1 <= kept <= len(states):
                raise ValueError(f"kept {kept} of a block of {len(states)} positions")
            if kept < len(states):
                cache.layers[idx].recurrent_states[0].copy_(states[kept - 1])
        self._states = {}
