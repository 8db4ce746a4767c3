"""Tree verification: greedy tree decoding equals plain greedy decoding (a DFlash and an EAGLE-3
drafter, and a reference tree whose right path is never the first branch, on targets with full,
sliding-window and latent attention), its tau is at least the chain's on the same prompts, the target's
cache keeps exactly the accepted path, a hybrid target is refused by name, and sampled tree decoding
keeps the target's distribution (chi-square on a tiny vocabulary)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict
from typing import Any

import pytest
import torch

from draftdeck.drafter.eval.spec_decode import (
    ReferenceDrafts,
    Sampling,
    TargetRunner,
    generate_plain,
    generate_speculative,
    sampling_probs,
)
from draftdeck.drafter.eval.tree import DraftTree, TreeShape
from draftdeck.drafter.eval.tree_decode import TreeSource, generate_tree, keep_path, tree_refusal, verify_tree
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter
from draftdeck.drafter.kinds.eagle3.source import Eagle3Source
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from tests.support.drafter import tiny_drafter_config, tiny_target
from tests.support.eval import chi2_bound

torch.set_num_threads(1)
VOCAB, WINDOW, PROMPT, NEW = 300, 16, 24, 30  # the prompt is past the sliding window already


def _right_branch_second(want: list[int], at: int, depth: int) -> DraftTree:
    """A tree after the anchor want[at - 1] whose first branch is wrong at once and whose second holds
    want[at], want[at + 1], ... with a wrong sibling before each of its nodes: the accepted path never
    uses a node's first child."""
    right = want[at : at + depth]
    if not right:
        return DraftTree()
    tree = DraftTree([(right[0] + 1) % VOCAB, right[0]], [-1, -1], [1, 1])
    for d, token in enumerate(right[1:], 2):
        parent = len(tree) - 1
        tree.tokens += [(token + 1) % VOCAB, token]
        tree.parents += [parent, parent]
        tree.depths += [d, d]
    return tree


class ReferenceTree:
    """Proposes `_right_branch_second` trees of a known greedy continuation."""

    layer_ids: list[int] | None = None

    def __init__(self, want: list[int]):
        self.want, self.prompt_len = want, 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.prompt_len = len(prompt_ids)

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        raise AssertionError("a tree source asked for a chain")

    def propose_tree(self, committed: list[int], shape: TreeShape) -> DraftTree:
        return _right_branch_second(self.want, len(committed) - self.prompt_len, shape.depth)


ARCHS = ["qwen3", "mistral", "gemma3", "gpt_oss", "deepseek_v3"]  # full, sliding, mixed, sinks, latent


def _runner(arch: str) -> TargetRunner:
    return TargetRunner(Target(tiny_causal_lm(arch, vocab_size=VOCAB, layers=4, window=WINDOW)), eos_ids=[])


def _prompt(seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_cache_keeps_exactly_the_accepted_path(arch: str) -> None:
    """After one tree verify step the cache equals a prefill of prompt + anchor + the accepted nodes,
    and the tree's logits at those nodes are the plain forward's."""
    runner = _runner(arch)
    prompt = _prompt(1)
    want = generate_plain(runner, prompt, 6).output_ids
    tree = _right_branch_second(want, 1, 4)
    cache = runner.new_cache()
    runner.forward(prompt, 0, cache, None)
    cache.crop(0)
    logits, _ = verify_tree(runner, want[0], tree, len(prompt), cache, None)
    path = [1, 3, 5, 7]  # the second branch, then each node's second child
    assert [tree.tokens[i] for i in path] == want[1:5]
    kept = [0, *(i + 1 for i in path)]
    keep_path(cache, len(tree) + 1, kept)
    fresh = runner.new_cache()
    plain_logits, _ = runner.forward(prompt + want[:5], 0, fresh, None)
    fresh.crop(0)
    torch.testing.assert_close(logits[kept], plain_logits[len(prompt) :], atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == fresh.get_seq_length() == len(prompt) + 5
    mine: Any
    theirs: Any
    for mine, theirs in zip(cache.layers, fresh.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tree_decoding_on_later_branches_equals_plain_greedy(arch: str) -> None:
    runner = _runner(arch)
    prompt = _prompt(2)
    plain = generate_plain(runner, prompt, NEW).output_ids
    gen = generate_tree(runner, ReferenceTree(plain), prompt, NEW, TreeShape(budget=8, topk=2, depth=4))
    assert gen.output_ids == plain
    assert gen.accepted > gen.steps  # whole paths accepted, through second children only
    assert gen.verified == gen.steps + gen.proposed  # the anchor and every node, each step


def _small_target() -> Target:
    """A Qwen3 of 16 tokens, peaked: random drafters' top candidates often hold the target's choice."""
    target = tiny_target(seed=3, vocab_size=16, layers=2, hidden=32)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(8.0)
    return target


def _drafter_source(kind: str, target: Target) -> Any:
    torch.manual_seed(0)
    shape = tiny_drafter_config(target, block_size=5)
    if kind == "dflash":
        return DFlashSource(DFlashDrafter(shape), target)
    if kind == "dspark":  # its Markov head biases each draft by the one before: its own chain
        return DFlashSource(DSparkDrafter(DSparkConfig(**asdict(shape), markov_rank=8)), target)
    if kind == "dflash2":
        return DFlashSource(DFlash2Drafter(DFlash2Config(**asdict(shape), conv_group_size=8)), target)
    eagle = Eagle3Drafter(Eagle3Config.from_target(target.config, draft_vocab_size=16))
    eagle.set_vocab(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.bool))
    return Eagle3Source(eagle, target)


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2", "eagle3"])
def test_a_drafter_tree_is_lossless_and_accepts_at_least_its_chain(kind: str) -> None:
    target = _small_target()
    runner = TargetRunner(target, eos_ids=[])
    prompts = [
        torch.randint(0, 15, (6,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)
    ]
    chain_acc = tree_acc = chain_steps = tree_steps = 0
    for prompt in prompts:
        plain = generate_plain(runner, prompt, NEW).output_ids
        chain = generate_speculative(runner, _drafter_source(kind, target), prompt, NEW, 5)
        tree = generate_tree(runner, _drafter_source(kind, target), prompt, NEW, TreeShape(16, 4, 4))
        assert chain.output_ids == plain and tree.output_ids == plain
        chain_acc, chain_steps = chain_acc + chain.accepted, chain_steps + chain.steps
        tree_acc, tree_steps = tree_acc + tree.accepted, tree_steps + tree.steps
        assert tree.proposed > tree.steps * 4  # branches beyond a chain of 4 were verified
    assert (tree_acc + tree_steps) / tree_steps > (chain_acc + chain_steps) / chain_steps  # tau incl. bonus
    assert tree_steps < chain_steps


def test_only_sources_that_draft_trees_are_tree_sources() -> None:
    """What the eval's refusal of a chain-only drafter (MTP) for --tree-budget asks."""
    target = _small_target()
    assert isinstance(_drafter_source("dflash", target), TreeSource)
    assert isinstance(_drafter_source("eagle3", target), TreeSource)
    assert not isinstance(ReferenceDrafts([1, 2]), TreeSource)


def test_a_hybrid_target_is_refused_by_name() -> None:
    model = tiny_causal_lm("qwen3_5", vocab_size=VOCAB, layers=4)
    refused = tree_refusal(model.config)
    assert refused is not None and "qwen3_5" in refused and "linear_attention" in refused
    runner = TargetRunner(Target(model), eos_ids=[])
    with pytest.raises(ValueError, match="qwen3_5"):
        generate_tree(runner, ReferenceTree([1, 2, 3]), [1, 2, 3], 4, TreeShape(4, 2, 2))
    assert tree_refusal(tiny_causal_lm("gemma3", vocab_size=VOCAB).config) is None


class TableTree:
    """Each node's children: the target's two most probable next tokens after it (a table)."""

    layer_ids: list[int] | None = None

    def __init__(self, table: dict[tuple[int, ...], list[int]], prompt: list[int]):
        self.table, self.n_prompt = table, len(prompt)

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        raise AssertionError("a tree source asked for a chain")

    def propose_tree(self, committed: list[int], shape: TreeShape) -> DraftTree:
        seq, tree = tuple(committed[self.n_prompt :]), DraftTree()

        def add(token: int, parent: int, depth: int) -> int:
            tree.tokens.append(token)
            tree.parents.append(parent)
            tree.depths.append(depth)
            return len(tree) - 1

        for a in self.table.get(seq, []):
            parent = add(a, -1, 1)
            for b in self.table.get((*seq, a), []) if shape.depth > 1 else []:
                add(b, parent, 2)
        return tree


def test_sampled_tree_decoding_is_distributed_as_the_target() -> None:
    """The second and third tokens (the first verify step's) against the target's joint distribution;
    the rejected first child's token must be taken out of the residual before the second is tried."""
    vocab, temperature, top_p = 6, 0.9, 0.95
    target = tiny_target(seed=5, vocab_size=vocab, layers=1, hidden=32)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(20.0)
    runner = TargetRunner(target, eos_ids=[])
    prompt = [1, 2, 3]

    @torch.no_grad()
    def probs(seq: list[int]) -> torch.Tensor:
        logits = target.model(input_ids=torch.tensor([prompt + seq])).logits[0, -1]
        return sampling_probs(logits, temperature, top_p)

    expected: defaultdict[tuple[int, int], float] = defaultdict(float)
    table: dict[tuple[int, ...], list[int]] = {}
    p1 = probs([])
    for t1 in range(vocab):
        p2 = probs([t1])
        table[(t1,)] = p2.topk(2).indices.tolist()
        for t2 in range(vocab):
            p3 = probs([t1, t2])
            table[(t1, t2)] = p3.topk(2).indices.tolist()
            for t3 in range(vocab):
                expected[(t2, t3)] += float(p1[t1] * p2[t2] * p3[t3])
    n = 1500
    seen: Counter[tuple[int, int]] = Counter()
    second_child = 0
    for seed in range(n):
        gen = generate_tree(runner, TableTree(table, prompt), prompt, 4, TreeShape(6, 2, 2),
                            Sampling(temperature, top_p, seed=seed))  # fmt: skip
        out = gen.output_ids
        seen[(out[1], out[2])] += 1
        second_child += out[1] == table[(out[0],)][1]
    assert second_child > n // 10  # second children were really accepted
    stat, df, low = 0.0, -1, 0.0
    for cell, p in expected.items():
        if p * n < 5:
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
