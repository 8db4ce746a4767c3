"""Real speculative decoding, one prompt at a time: a draft source proposes up to B-1 tokens, one
target forward verifies the block, and the leading run the target agrees with is kept, plus the
target's own next token (the bonus). tau per verify step counts that bonus ("incl. bonus", as vLLM).

Greedy mode is exact: the output equals plain greedy decoding token for token. Sampled mode is
exact in distribution: the target samples (temperature, top-p) and a deterministic draft token x is
accepted with probability p(x); on rejection the token is drawn from p with x removed and
renormalised, so every emitted token is distributed as p.

The target keeps one HF cache per prompt, cut back to the committed tokens after a rejection. A
full-attention layer is simply cropped; a sliding-window layer past its window, and the convolution
state of a linear-attention layer (Gated DeltaNet in Qwen3.5/3.6 and Qwen3-Next), keep what the block
added until the cut (transformers' past recording). A recurrent state cannot be cut: during the verify
forward each Gated DeltaNet layer keeps its state after every position of the block, and the one at
the accepted length is committed (`hybrid_verify.py`, as serving engines do), so nothing runs twice.
Only a recurrent layer of another kind (a Mamba-2 hybrid such as Bamba or Falcon-H1: none of
DraftDeck's architectures) still has its state saved before the step, restored after a rejection and
the accepted tokens run again (`Generation.replayed` counts them).

A draft source sees the target's context features of newly committed positions only (`observe`), so a
drafter keeps its own context incremental.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from draftdeck.drafter.eval.hybrid_verify import BlockStates
from draftdeck.drafter.model.target import Target, context_from_hidden_states
from draftdeck.drafter.model.vision import cached_forward_inputs


class DraftSource(Protocol):
    """What proposes draft tokens. `layer_ids`: the target layers whose outputs it needs as context
    features (None: it needs none)."""

    layer_ids: list[int] | None

    def begin(self, prompt_ids: list[int]) -> None:
        """Forget the previous prompt."""

    def observe(self, features: torch.Tensor | None) -> None:
        """Context features (n, F) of the n positions just committed, in order (None without layer_ids)."""

    def propose(self, committed: list[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `committed` (prompt + generated so far)."""


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of `cache` (transformers 5 crops by a negative count)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities (.., V) after temperature and nucleus (top-p) filtering, renormalised."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep a token while the mass strictly before it is below top_p (the top token always stays)
        keep = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    # the seeded generator lives on the CPU, so draws are the same on every device
    return int(torch.multinomial(probs.detach().cpu(), 1, generator=gen).item())


def accept_sampled(drafts: list[int], probs: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """Speculative sampling for deterministic drafts. `probs` (len(drafts) + 1, V): the target's
    distribution at each block position. Returns (accepted drafts, the next token)."""
    for i, x in enumerate(drafts):
        px = float(probs[i, x])
        if float(torch.rand((), generator=gen)) < px:
            continue
        residual = probs[i].clone()
        residual[x] = 0.0
        mass = float(residual.sum())
        return i, draw(residual / mass if mass > 0 else probs[i], gen)
    return len(drafts), draw(probs[len(drafts)], gen)


@dataclass(frozen=True)
class Sampling:
    """greedy when temperature == 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Generation:
    """One response and its counts. `step_taus`: tau incl. bonus of each verify step (1..B).

    Tokens out = 1 (from the prefill) + accepted + steps, less a last bonus token dropped by the
    stop (eos among the accepted drafts, or max_new_tokens)."""

    output_ids: list[int]
    seconds: float
    cpu_seconds: float = 0.0  # this process's CPU time: the robust speed figure on a shared machine
    steps: int = 0
    accepted: int = 0
    proposed: int = 0
    step_taus: list[int] = field(default_factory=list)
    # tokens the target ran twice to roll a recurrent state back to the accepted prefix: 0 on Gated
    # DeltaNet hybrids (their states per position are recorded), > 0 only on Mamba-style ones
    replayed: int = 0
    step_contexts: list[int] = field(default_factory=list)  # each verify step's context length (tokens)
    # inputs the verify forwards ran (anchor + drafts, or anchor + tree nodes): the target's work
    verified: int = 0

    @property
    def tau(self) -> float:
        """tau incl. bonus of this response: (accepted + steps) / steps."""
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")


SavedState = list[dict[int, torch.Tensor]]  # per recurrent layer, its states by index


class TargetRunner:
    """The frozen target run block by block over its own KV cache."""

    def __init__(self, target: Target, eos_ids: list[int]):
        self.target = target
        self.model = target.model
        self.eos_ids = set(eos_ids)
        self.device = target.device
        # transformers 5.24 renamed `past_key_values` to `cache` (the old name warns until 5.40)
        params = inspect.signature(self.model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.block_states = BlockStates(self.model)  # no layers for a target without Gated DeltaNet

    def new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window and linear-attention layers then keep what a block added until `keep` cuts it;
        # full-attention layers have nothing to record.
        cache.activate_past_recording()
        return cache

    def _recurrent(self, cache: DynamicCache) -> list[tuple[int, Any]]:
        return [
            (i, layer) for i, layer in enumerate(cache.layers) if getattr(layer, "recurrent_states", None)
        ]

    def save_state(self, cache: DynamicCache) -> SavedState:
        """The recurrent states to restore after a rejection, copied before a verify step: none where
        every recurrent layer is a Gated DeltaNet layer (its states per position are recorded, see
        `verify`) or there is none. A recurrent layer of another kind (Mamba-2 hybrids) cannot be
        recorded, so then all are saved and `keep` replays the accepted tokens."""
        layers = self._recurrent(cache)
        if all(i in self.block_states.layer_ids for i, _ in layers):
            return []
        return [
            {i: s.clone() for i, s in layer.recurrent_states.items() if s is not None} for _, layer in layers
        ]

    def verify(
        self, block: list[int], start: int, cache: DynamicCache, layer_ids: list[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` of a verify block, with each Gated DeltaNet layer's state after every position kept
        for `keep`."""
        with self.block_states.recording():
            return self.forward(block, start, cache, layer_ids)

    def keep(self, cache: DynamicCache, block: list[int], start: int, kept: int, saved: SavedState) -> int:
        """Cut `cache` back to the first `kept` tokens of `block`, verified at positions `start`..;
        returns the tokens run again to get there. A Gated DeltaNet layer takes its recorded state
        after position kept - 1; only with `saved` states (Mamba-style layers) are the states restored
        and the kept tokens run again."""
        replayed = 0
        if kept < len(block) and saved:
            for (_, layer), states in zip(self._recurrent(cache), saved, strict=True):
                for i, state in states.items():
                    layer.recurrent_states[i].copy_(state)
            cache.crop(-len(block))
            self.forward(block[:kept], start, cache, None)
            replayed = kept
        else:
            if self.block_states.layers:
                self.block_states.commit(cache, kept)
            if kept < len(block):
                cache.crop(-(len(block) - kept))
        cache.crop(0)  # what past recording kept beyond a window or a convolution's reach goes
        return replayed

    def forward(
        self, ids: list[int], start: int, cache: DynamicCache, layer_ids: list[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (len(ids), V) for `ids` at positions start.., and context features (len, F) if asked."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        # the index, or for a VLM target the model's M-RoPE positions (and a prompt's pixels at start 0)
        inputs = cached_forward_inputs(self.model, self.target.vision, input_ids, start, cache)
        out = self.model(
            input_ids=input_ids,
            **inputs,
            use_cache=True,
            output_hidden_states=layer_ids is not None,
            **{self.cache_kwarg: cache},
        )
        feats = context_from_hidden_states(out.hidden_states, layer_ids)[0] if layer_ids is not None else None
        return out.logits[0].float(), feats


def choose_token(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    if sampling.greedy:
        return int(logits.argmax())
    return draw(sampling_probs(logits, sampling.temperature, sampling.top_p), gen)


def seeded_generator(sampling: Sampling) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(sampling.seed)
    return gen


@torch.inference_mode()
def generate_plain(
    target: TargetRunner, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling = Sampling()
) -> Generation:
    """Target-only decoding, one token per forward, over the same KV cache: the speed baseline and the
    reference for losslessness."""
    gen = seeded_generator(sampling)
    begin, cpu = time.perf_counter(), time.process_time()
    cache = target.new_cache()
    logits, _ = target.forward(prompt_ids, 0, cache, None)
    out: list[int] = []
    while True:
        token = choose_token(logits[-1], sampling, gen)
        out.append(token)
        if token in target.eos_ids or len(out) >= max_new_tokens:
            break
        logits, _ = target.forward([token], len(prompt_ids) + len(out) - 1, cache, None)
    return Generation(out, time.perf_counter() - begin, time.process_time() - cpu)


def prefill(
    target: TargetRunner, source: DraftSource, prompt_ids: list[int], sampling: Sampling, gen: torch.Generator
) -> tuple[DynamicCache, list[int]]:
    """The prompt through the target (its features to the source) and the first token chosen: the cache
    and the committed ids (the prompt and that token) a speculative decoder, chain or tree, starts from."""
    cache = target.new_cache()
    source.begin(prompt_ids)
    logits, feats = target.forward(prompt_ids, 0, cache, source.layer_ids)
    cache.crop(0)
    source.observe(feats)
    return cache, [*prompt_ids, choose_token(logits[-1], sampling, gen)]


@torch.inference_mode()
def generate_speculative(
    target: TargetRunner,
    source: DraftSource,
    prompt_ids: list[int],
    max_new_tokens: int,
    block_size: int,
    sampling: Sampling = Sampling(),
) -> Generation:
    """Speculative decoding of one prompt with blocks of `block_size` (anchor + up to B-1 drafts)."""
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2 (an anchor and one draft), got {block_size}")
    gen = seeded_generator(sampling)
    begin, cpu = time.perf_counter(), time.process_time()
    layer_ids = source.layer_ids
    cache, committed = prefill(target, source, prompt_ids, sampling, gen)
    result = Generation(output_ids=[], seconds=0.0)
    n_out = 1
    stopped = committed[-1] in target.eos_ids
    while not stopped and n_out < max_new_tokens:
        anchor_pos = len(committed) - 1
        # drafts may run up to the last token allowed; a bonus past it is dropped
        k = min(block_size - 1, max_new_tokens - n_out)
        drafts = source.propose(committed, k)[:k]
        block = [committed[-1], *drafts]
        saved = target.save_state(cache)
        logits, feats = target.verify(block, anchor_pos, cache, layer_ids)
        if sampling.greedy:
            posterior = logits.argmax(dim=-1).tolist()
            acc = 0
            while acc < len(drafts) and drafts[acc] == posterior[acc]:
                acc += 1
            new = [*drafts[:acc], posterior[acc]]
        else:
            probs = sampling_probs(logits, sampling.temperature, sampling.top_p)
            acc, nxt = accept_sampled(drafts, probs, gen)
            new = [*drafts[:acc], nxt]
        # a stop (eos, max_new_tokens) cuts the new tokens; the drafts accepted before the cut count
        # as accepted, as vLLM counts them (and as the walked estimate, capped at the span end, does)
        cut = max_new_tokens - n_out
        for j, token in enumerate(new):
            if token in target.eos_ids:
                cut = min(cut, j + 1)
                stopped = True
                break
        new = new[:cut]
        accepted = min(acc, len(new))
        produced = len(new)
        committed.extend(new)
        n_out += produced
        result.steps += 1
        result.accepted += accepted
        result.proposed += len(drafts)
        result.verified += len(block)
        result.step_taus.append(accepted + 1)
        result.step_contexts.append(anchor_pos + 1)
        # keep the cache (and features) of the anchor and the accepted drafts: the last new token is the
        # next anchor, not yet seen by the target
        result.replayed += target.keep(cache, block, anchor_pos, produced, saved)
        source.observe(feats[:produced] if feats is not None else None)
    result.output_ids = committed[len(prompt_ids) :]
    result.seconds = time.perf_counter() - begin
    result.cpu_seconds = time.process_time() - cpu
    return result


class ReferenceDrafts:
    """Proposes the tokens of a known continuation of the prompt (for tests and benchmarks: an exact
    drafter when the continuation is the target's own greedy output). With `wrong_every` n, the token
    at every n-th position of the continuation is proposed as another one: a drafter that is rejected
    there, at a known rate."""

    layer_ids: list[int] | None = None

    def __init__(self, continuation: list[int], wrong_every: int | None = None):
        self.continuation = continuation
        self.wrong_every = wrong_every
        self.prompt_len = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.prompt_len = len(prompt_ids)

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        at = len(committed) - self.prompt_len
        drafts = self.continuation[at : at + k]
        if self.wrong_every:
            n = self.wrong_every
            # another id inside the vocabulary: the one below (above for id 0)
            drafts = [(t - 1 if t else 1) if (at + i) % n == n - 1 else t for i, t in enumerate(drafts)]
        return drafts


@dataclass
class DecodeStats:
    """Counts over many responses of one draft source, as vLLM counts them: verify steps (drafts),
    proposed and accepted draft tokens, `hist[n]` = steps whose tau incl. bonus was n (1..B; index 0
    unused), `per_pos[i]` = steps that accepted more than i draft tokens (i = 0..B-2)."""

    block_size: int
    responses: int = 0
    steps: int = 0
    accepted: int = 0
    proposed: int = 0
    tokens: int = 0
    produced: int = 0  # tokens the verify steps added (no bonus past a stop or max_new_tokens)
    verified: int = 0  # inputs the verify forwards ran: the anchor and each draft or tree node
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    response_tau_sum: float = 0.0  # sum over responses with a verify step of their own tau
    responses_with_steps: int = 0
    hist: list[int] = field(default_factory=list)
    per_pos: list[int] = field(default_factory=list)
    # by context length: the power of two at or below the step's context -> [verify steps, accepted]
    by_context: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hist = self.hist or [0] * (self.block_size + 1)
        self.per_pos = self.per_pos or [0] * (self.block_size - 1)

    def add(self, gen: Generation) -> None:
        self.responses += 1
        self.tokens += len(gen.output_ids)
        # the tokens the verify steps produced: all but the prefill's first (z-lab's per-step count)
        self.produced += max(len(gen.output_ids) - 1, 0)
        self.seconds += gen.seconds
        self.cpu_seconds += gen.cpu_seconds
        self.steps += gen.steps
        self.accepted += gen.accepted
        self.proposed += gen.proposed
        self.verified += gen.verified
        if gen.steps:
            self.response_tau_sum += gen.tau
            self.responses_with_steps += 1
        for tau, context in zip(gen.step_taus, gen.step_contexts or [0] * len(gen.step_taus), strict=True):
            self.hist[tau] += 1
            for i in range(tau - 1):
                self.per_pos[i] += 1
            counts = self.by_context.setdefault(1 << max(context.bit_length() - 1, 0), [0, 0])
            counts[0] += 1
            counts[1] += tau - 1

    # Ratios, only to be shown.
    @property
    def tau_pooled(self) -> float:
        """tau incl. bonus, pooled: sum(accepted + steps) / sum(steps)."""
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")

    @property
    def tokens_per_step(self) -> float:
        """Tokens produced per verify step, pooled: z-lab's benchmark's acceptance length. Below
        tau_pooled by the bonus tokens a stop dropped (a step ending at an accepted stop token, or at
        max_new_tokens, adds no bonus)."""
        return self.produced / self.steps if self.steps else float("nan")

    @property
    def verified_per_step(self) -> float:
        """Inputs each verify forward ran, pooled: the target's work per step (a chain's block size; a
        tree's nodes + 1). It carries over to a GPU, where tokens per second does not."""
        return self.verified / self.steps if self.steps else float("nan")

    @property
    def tau_per_response(self) -> float:
        """tau incl. bonus of each response, then averaged over responses."""
        return (
            self.response_tau_sum / self.responses_with_steps if self.responses_with_steps else float("nan")
        )

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": {
                "responses": self.responses,
                "verify_steps": self.steps,
                "proposed": self.proposed,
                "accepted": self.accepted,
                "tokens": self.tokens,
                "produced_by_steps": self.produced,
                "verified": self.verified,
                "seconds": round(self.seconds, 4),
                "cpu_seconds": round(self.cpu_seconds, 4),
                "hist_tau_incl_bonus": {str(n): self.hist[n] for n in range(1, self.block_size + 1)},
                "per_pos_accepted_more_than": {str(i): self.per_pos[i] for i in range(self.block_size - 1)},
                # verify steps by the context they ran at (from this power of two to the next)
                "by_context_length": {
                    str(k): {"verify_steps": v[0], "accepted": v[1]}
                    for k, v in sorted(self.by_context.items())
                },
            },
            "tau_incl_bonus_pooled": self.tau_pooled,
            "tokens_per_step": self.tokens_per_step,
            "verified_per_step": self.verified_per_step,
            "tau_incl_bonus_per_response_mean": self.tau_per_response,
            "acceptance_rate": self.acceptance_rate,
            "per_pos_acceptance": [p / self.steps if self.steps else float("nan") for p in self.per_pos],
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_cpu_s": self.tokens_per_cpu_s,
        }
