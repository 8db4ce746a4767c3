"""Real speculative decoding: greedy output equals plain greedy output (every draft source, several
block sizes), an exact draft gives tau = B incl. bonus per full step, prompt lookup beats 1 on a
tiny target's repetitive text, the drafter's incremental context equals a full recompute, and
sampled mode's output distribution is the target's (chi-square on a tiny vocabulary)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from draftdeck.drafter.eval.baselines import PromptLookup
from draftdeck.drafter.eval.spec_decode import (
    DraftSource,
    ReferenceDrafts,
    Sampling,
    TargetRunner,
    generate_plain,
    generate_speculative,
    sampling_probs,
)
from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from tests.support.drafter import tiny_target
from tests.support.eval import TinyWorld, build_world, chi2_bound

torch.set_num_threads(1)
MAX_NEW = 40


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> TinyWorld:
    return build_world(tmp_path_factory.mktemp("tiny-world"))


@pytest.fixture(scope="module")
def runner(world: TinyWorld) -> TargetRunner:
    return TargetRunner(world.target, [world.eos_id])


@pytest.fixture(scope="module")
def plain(world: TinyWorld, runner: TargetRunner) -> list[list[int]]:
    return [generate_plain(runner, ids, MAX_NEW).output_ids for ids in world.prompt_ids]


def _drafter(world: TinyWorld, block_size: int) -> DFlashDrafter:
    torch.manual_seed(3)
    cfg = DrafterConfig.from_target(
        world.target.config, tokenizer=world.target.tokenizer, block_size=block_size
    )
    return DFlashDrafter(cfg).eval()


def _check_counts(gen, block_size: int) -> None:
    # the first token comes from the prefill; every verify step adds accepted + 1 (the bonus), but
    # the last step's bonus when the stop came first
    assert len(gen.output_ids) - 1 in (gen.accepted + gen.steps, gen.accepted + gen.steps - 1)
    assert sum(gen.step_taus) == gen.accepted + gen.steps
    assert all(1 <= t <= block_size for t in gen.step_taus)
    assert gen.accepted <= gen.proposed <= gen.steps * (block_size - 1)


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_greedy_speculative_equals_plain_greedy_for_every_source(
    world: TinyWorld, runner: TargetRunner, plain: list[list[int]], block_size: int
) -> None:
    sources: dict[str, DraftSource] = {
        "prompt_lookup": PromptLookup(),
        "dflash_random": DFlashSource(_drafter(world, block_size), world.target),
    }
    for name, source in sources.items():
        for ids, want in zip(world.prompt_ids, plain, strict=True):
            got = generate_speculative(runner, source, ids, MAX_NEW, block_size)
            assert got.output_ids == want, (name, block_size)
            _check_counts(got, block_size)


def test_exact_drafts_give_tau_b_per_full_step_and_shifted_drafts_give_one(
    world: TinyWorld, runner: TargetRunner, plain: list[list[int]]
) -> None:
    block = 4
    for ids, want in zip(world.prompt_ids, plain, strict=True):
        exact = generate_speculative(runner, ReferenceDrafts(want), ids, MAX_NEW, block)
        assert exact.output_ids == want
        assert exact.step_taus[:-1] == [block] * (len(exact.step_taus) - 1)
        assert exact.steps == -(-(len(want) - 1) // block)  # ceil: B tokens per step
        assert exact.proposed == exact.accepted  # every proposed token was accepted
        # the continuation one position late (a label shifted by one) is almost never accepted
        shifted = generate_speculative(runner, ReferenceDrafts([-1, *want]), ids, MAX_NEW, block)
        assert shifted.output_ids == want
        assert shifted.tau < exact.tau


def test_prompt_lookup_copies_repetitive_text(world: TinyWorld, runner: TargetRunner) -> None:
    gens = [generate_speculative(runner, PromptLookup(), ids, MAX_NEW, 8) for ids in world.prompt_ids]
    pooled = sum(g.accepted + g.steps for g in gens) / sum(g.steps for g in gens)
    assert pooled > 1.5, pooled


def test_untrained_drafter_tau_is_about_one(world: TinyWorld, runner: TargetRunner) -> None:
    fresh = get_kind("dflash").untrained(_drafter(world, 8), seed=11)
    gens = [
        generate_speculative(runner, DFlashSource(fresh, world.target), ids, MAX_NEW, 8)
        for ids in world.prompt_ids
    ]
    pooled = sum(g.accepted + g.steps for g in gens) / sum(g.steps for g in gens)
    assert 1.0 <= pooled < 1.3, pooled


class _Recomputing(DFlashSource):
    """Runs the drafter over the whole context every round, with no cache: the reference for the
    incremental context."""

    def __init__(self, drafter, target):
        super().__init__(drafter, target)
        self.seen: list[torch.Tensor] = []
        self.proposals: list[list[int]] = []

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self.seen = []

    def observe(self, features):
        self.seen.append(features)

    @torch.inference_mode()
    def propose(self, committed, k):
        ctx = torch.cat(self.seen)[None]
        n_mask = max(k, self.block_size - 1)  # a full block, as the drafter was trained
        block = torch.tensor([[committed[-1]] + [self.mask_token_id] * n_mask])
        positions = torch.arange(0, len(committed) + n_mask)[None]
        hidden = self.drafter(
            position_ids=positions, noise_embedding=self.target.embed(block), target_hidden=ctx
        )
        out = self.drafter.compute_logits(hidden[0, 1 : k + 1], self.target.lm_head).argmax(-1).tolist()
        self.proposals.append(out)
        return out


class _Recording(DFlashSource):
    def __init__(self, drafter, target):
        super().__init__(drafter, target)
        self.proposals: list[list[int]] = []

    def propose(self, committed, k):
        out = super().propose(committed, k)
        self.proposals.append(out)
        return out


def test_incremental_drafter_context_equals_full_recompute(world: TinyWorld, runner: TargetRunner) -> None:
    drafter = _drafter(world, 4)
    with torch.no_grad():  # large weights: proposals that change with every context position
        for p in drafter.parameters():
            if p.dim() == 2:
                p.mul_(25.0)
    for ids in world.prompt_ids[:3]:
        inc, full = _Recording(drafter, world.target), _Recomputing(drafter, world.target)
        a = generate_speculative(runner, inc, ids, MAX_NEW, 4)
        b = generate_speculative(runner, full, ids, MAX_NEW, 4)
        assert inc.proposals == full.proposals
        assert len({tuple(p) for p in inc.proposals}) > 2
        assert a.step_taus == b.step_taus


class _TableDrafts:
    """Deterministic drafts: the most likely token after each committed prefix, from a table."""

    layer_ids: list[int] | None = None

    def __init__(self, table: dict[tuple[int, ...], int], prompt: list[int]):
        self.table, self.n_prompt = table, len(prompt)

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        seq = tuple(committed[self.n_prompt :])
        out: list[int] = []
        for _ in range(k):
            token = self.table.get(seq)
            if token is None:
                break
            out.append(token)
            seq = (*seq, token)
        return out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_sampled_speculative_output_is_distributed_as_the_target(arch: str) -> None:
    """Also on a hybrid target (Qwen3.5), whose verify forward records its recurrent states: the draws
    follow the target's distribution there too. The state it commits is checked exactly in
    test_hybrid_verify.py: this small model's draws depend too little on it to notice a wrong one."""
    vocab, temperature, top_p = 6, 0.9, 0.95
    if arch == "qwen3":
        target = tiny_target(seed=5, vocab_size=vocab, layers=1, hidden=32)
    else:  # three Gated DeltaNet layers and a full-attention one
        target = Target(tiny_causal_lm(arch, vocab_size=vocab, hidden=32, layers=4, seed=5))
    with torch.no_grad():  # peaked, varied next-token distributions, so drafts are often accepted
        target.model.lm_head.weight.mul_(60.0)
    runner = TargetRunner(target, eos_ids=[])
    prompt = [1, 2, 3]

    @torch.no_grad()
    def probs(seq: list[int]) -> torch.Tensor:
        logits = target.model(input_ids=torch.tensor([prompt + seq])).logits[0, -1]
        return sampling_probs(logits, temperature, top_p)

    expected: defaultdict[tuple[int, int], float] = defaultdict(float)  # a probability per cell
    table: dict[tuple[int, ...], int] = {}
    p1 = probs([])
    table[()] = int(p1.argmax())
    for t1 in range(vocab):
        p2 = probs([t1])
        table[(t1,)] = int(p2.argmax())
        for t2 in range(vocab):
            p3 = probs([t1, t2])
            table[(t1, t2)] = int(p3.argmax())
            for t3 in range(vocab):
                expected[(t2, t3)] += float(p1[t1] * p2[t2] * p3[t3])

    n = 1500
    seen: Counter[tuple[int, int]] = Counter()
    accepted = 0
    for seed in range(n):
        gen = generate_speculative(
            runner, _TableDrafts(table, prompt), prompt, 4, 3, Sampling(temperature, top_p, seed=seed)
        )
        seen[(gen.output_ids[1], gen.output_ids[2])] += 1
        accepted += gen.accepted
    assert accepted > n // 2  # the drafts were really exercised
    stat, df, low = 0.0, -1, 0.0
    for cell, p in expected.items():
        if p * n < 5:  # pool the rare cells into one
            low += p
            continue
        stat += (seen[cell] - p * n) ** 2 / (p * n)
        df += 1
    rare = sum(c for cell, c in seen.items() if expected[cell] * n < 5)
    if low * n >= 5:
        stat += (rare - low * n) ** 2 / (low * n)
        df += 1
    assert df >= 3
    assert stat < chi2_bound(df), (stat, df)
