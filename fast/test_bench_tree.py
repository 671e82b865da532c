"""(e) Tree vs chain: tokens per target call with the chapter's early-exit draft, greedy;
(g) the same under exact sampling at temperatures 0.7 and 1.0.

The draft is the target's first 2 of 6 layers (`tiny`, float32). The tree is the chapter's
(2, 2, 2): the draft's top-2 at each of 3 depths, 14 nodes; the chain is k = 3, the same depth,
so both can commit at most 4 tokens per target call. Greedy, 8 prompts, 64 new tokens each;
both outputs are the target's greedy continuations (checked). Target: tree >= 1.2x chain.
"""

import pytest
import torch

import fast
from fast.testing import target_greedy
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
    assert [out for out, _ in results] == [target_greedy(target, p, new) for p in rows]


def test_e_tree(benchmark, figures, setup):
    target, draft, prompts = setup
    rows, new = workload(benchmark, prompts)
    benchmark.group = "(e) tree vs chain, early-exit draft"
    results = benchmark.pedantic(
        lambda: [fast.tree_generate(target, draft, p, new, tree=TREE) for p in rows],
        rounds=1 if benchmark.disabled else 3)
    tree = per_call(results)
    benchmark.extra_info["tokens_per_target_call"] = tree
    # against the target's own greedy loop, not the chain test's outputs: under pytest-xdist the
    # two tests may run in different workers
    assert [out for out, _ in results] == [target_greedy(target, p, new) for p in rows]
    chain = figures.get("e/chain")
    if not benchmark.disabled and chain is not None:
        ratio = tree / chain
        figures.ratio(benchmark, f"(e) tree {TREE} / chain k={CHAIN_K}, tokens per target call",
                      ratio, ">= 1.2", ratio >= 1.2, f"tree {tree:.3f}, chain {chain:.3f}")


# (g) The sampled tree vs the sampled chain of the same depth, at two temperatures. Sampled
# outputs are draws, not one fixed sequence, so the two sides are compared by tokens per target
# call over the same prompts and budget (each side with its own seeded generator); both are
# exact (the kit's tree and sequence families hold them to the target's law).
TEMPERATURES = (0.7, 1.0)


def sampled_runs(generate, rows, new, temperature, **kw):
    g = torch.Generator().manual_seed(11)
    return [generate(p, new, temperature=temperature, generator=g, **kw) for p in rows]


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_g_sampled_chain(benchmark, figures, setup, temperature):
    target, draft, prompts = setup
    rows, new = workload(benchmark, prompts)
    benchmark.group = f"(g) sampled tree vs chain, T = {temperature}, early-exit draft"
    results = benchmark.pedantic(
        lambda: sampled_runs(lambda p, n, **kw: fast.speculative_generate(
            target, draft, p, n, k=CHAIN_K, **kw), rows, new, temperature),
        rounds=1 if benchmark.disabled else 3)
    benchmark.extra_info["tokens_per_target_call"] = per_call(results)
    figures.put(f"g/chain/{temperature}", per_call(results))
    assert all(len(out) == new for out, _ in results)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_g_sampled_tree(benchmark, figures, setup, temperature):
    target, draft, prompts = setup
    rows, new = workload(benchmark, prompts)
    benchmark.group = f"(g) sampled tree vs chain, T = {temperature}, early-exit draft"
    results = benchmark.pedantic(
        lambda: sampled_runs(lambda p, n, **kw: fast.tree_generate(
            target, draft, p, n, tree=TREE, **kw), rows, new, temperature),
        rounds=1 if benchmark.disabled else 3)
    tree = per_call(results)
    benchmark.extra_info["tokens_per_target_call"] = tree
    assert all(len(out) == new for out, _ in results)
    chain = figures.get(f"g/chain/{temperature}")
    if not benchmark.disabled and chain is not None:
        figures.ratio(benchmark, f"(g) sampled tree {TREE} / chain k={CHAIN_K}, T={temperature}",
                      tree / chain, None, None, f"tree {tree:.3f}, chain {chain:.3f} tokens per call")
