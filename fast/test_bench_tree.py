"""(e) Tree vs chain: tokens per target call with the chapter's early-exit draft.

The draft is the target's first 2 of 6 layers (`tiny`, float32). The tree is the chapter's
(2, 2, 2): the draft's top-2 at each of 3 depths, 14 nodes; the chain is k = 3, the same depth,
so both can commit at most 4 tokens per target call. Greedy, 8 prompts, 64 new tokens each;
both outputs are the target's greedy continuations (checked). Target: tree >= 1.2x chain.
"""

import pytest
import torch

import fast
from reference.model import EarlyExit, random_model

TREE, CHAIN_K, NEW_TOKENS, PROMPTS = (2, 2, 2), 3, 64, 8


@pytest.fixture(scope="module")
def setup():
    target = random_model("tiny", seed=0, dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in range(4, 4 + PROMPTS)]
    return target, EarlyExit(target, 2), prompts


def workload(benchmark, prompts):
    return (prompts[:1], 4) if benchmark.disabled else (prompts, NEW_TOKENS)


def per_call(results):
    tokens = sum(len(out) for out, _ in results)
    return tokens / sum(stats["rounds"] for _, stats in results)


def test_e_chain(benchmark, figures, setup):
    target, draft, prompts = setup
    rows, new = workload(benchmark, prompts)
    benchmark.group = "(e) tree vs chain, early-exit draft"
    results = benchmark.pedantic(
        lambda: [fast.speculative_generate(target, draft, p, new, k=CHAIN_K) for p in rows],
        rounds=1 if benchmark.disabled else 3)
    benchmark.extra_info["tokens_per_target_call"] = per_call(results)
    figures.put("e/chain", per_call(results))
    figures.put("e/outputs", [out for out, _ in results])


def test_e_tree(benchmark, figures, setup):
    target, draft, prompts = setup
    rows, new = workload(benchmark, prompts)
    benchmark.group = "(e) tree vs chain, early-exit draft"
    results = benchmark.pedantic(
        lambda: [fast.tree_generate(target, draft, p, new, tree=TREE) for p in rows],
        rounds=1 if benchmark.disabled else 3)
    tree = per_call(results)
    benchmark.extra_info["tokens_per_target_call"] = tree
    assert [out for out, _ in results] == figures.get("e/outputs")
    chain = figures.get("e/chain")
    if not benchmark.disabled and chain is not None:
        ratio = tree / chain
        figures.ratio(benchmark, f"(e) tree {TREE} / chain k={CHAIN_K}, tokens per target call",
                      ratio, ">= 1.2", ratio >= 1.2, f"tree {tree:.3f}, chain {chain:.3f}")
