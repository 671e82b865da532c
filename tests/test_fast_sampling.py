"""The vectorized sampler is exact: filtered distributions equal the reference's, draws and
rejection sampling follow their laws, and batched sampled rows follow the target's law.

Vectorization makes exactness cheap to test: one call on N identical rows is N independent
trials. Each chi-square test uses a fixed seed and a p-value threshold of 1e-6.
"""

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import fast
from fast.sampling import draw, filtered_probs
from fast.verify import rejection_sample
from reference.model import EarlyExit, random_model
from reference.sampling import probs_from_logits


def chi_square_p(counts, expected_probs, n):
    """p-value of counts against expected probabilities, pooling bins expected below 5."""
    counts = np.asarray(counts, dtype=float)
    expected = np.asarray(expected_probs, dtype=float) * n
    order = np.argsort(expected)
    small = order[np.cumsum(expected[order]) < 5]
    keep = np.setdiff1d(np.arange(len(expected)), small)
    obs = np.append(counts[keep], counts[small].sum()) if len(small) else counts[keep]
    exp = np.append(expected[keep], expected[small].sum()) if len(small) else expected[keep]
    if exp[-1] == 0:
        assert obs[-1] == 0
        obs, exp = obs[:-1], exp[:-1]
    return scipy_stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.5, 3, 0.9), (2.0, 1, 1.0), (1.0, 0, 0.01)])
def test_filtered_probs_equal_the_references(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 40, generator=g, dtype=torch.float64).round(decimals=1)  # many ties
    expected = probs_from_logits(logits, temperature, top_k, top_p)
    assert torch.allclose(filtered_probs(logits, temperature, top_k, top_p), expected, atol=1e-15)


def test_draw_follows_the_weights():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 6.0, 0.0], dtype=torch.float64)
    n = 60000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    picks = draw(weights.expand(n, -1), u)
    counts = torch.bincount(picks, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert chi_square_p(counts, weights / weights.sum(), n) > 1e-6
    # the extremes of u land on the first and last tokens with weight, never on a zero
    extremes = torch.tensor([0.0, 1 - 2 ** -53], dtype=torch.float64)
    assert draw(weights.expand(2, -1), extremes).tolist() == [4, 1]


def random_dist(g, vocab, sparsity=0.0):
    x = torch.rand(vocab, generator=g, dtype=torch.float64) ** 3
    x[torch.rand(vocab, generator=g) < sparsity] = 0
    x[0] += 1e-3
    return x / x.sum()


@pytest.mark.parametrize("case", ["random", "sparse", "equal", "disjoint"])
def test_rejection_sampling_commits_the_targets_law_at_every_position(case):
    g = torch.Generator().manual_seed(["random", "sparse", "equal", "disjoint"].index(case))
    vocab, k, n = 12, 2, 40000
    p = torch.stack([random_dist(g, vocab, 0.5 if case == "sparse" else 0) for _ in range(k + 1)])
    q = torch.stack([random_dist(g, vocab, 0.5 if case == "sparse" else 0) for _ in range(k)])
    if case == "equal":
        q = p[:k].clone()
    if case == "disjoint":
        p[:, :6], q[:, 6:] = 0, 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    proposals = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g)
                             for i in range(k)], 1)                        # [n, k], x_i ~ q_i
    u = torch.rand(n, k + 1, generator=g, dtype=torch.float64)
    accepted, block = rejection_sample(p.expand(n, -1, -1), q.expand(n, -1, -1), proposals,
                                       u[:, :k], u[:, k])
    # acceptance of the first proposal has probability sum(min(p0, q0))
    rate = (accepted >= 1).double().mean().item()
    expected_rate = torch.minimum(p[0], q[0]).sum().item()
    assert abs(rate - expected_rate) < 5 * (expected_rate * (1 - expected_rate) / n) ** 0.5 + 1e-12
    # position i's committed token, among rows that reached it, is distributed as p_i
    for i in range(k + 1):
        reached = accepted >= i
        tokens = block[reached, i]
        if tokens.numel() < 200:
            continue
        counts = torch.bincount(tokens, minlength=vocab)
        assert counts[p[i] == 0].sum() == 0
        assert chi_square_p(counts, p[i], tokens.numel()) > 1e-6


def test_rule_level_api_on_the_chapters_example():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    n = 3000
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    results = [fast.accept_or_correct(p, q, x, g) for x in drafts]
    counts = np.bincount([token for token, _ in results], minlength=3)
    assert chi_square_p(counts, p, n) > 1e-6
    assert all(ok == (token == x) for (token, ok), x in zip(results, drafts) if ok)
    assert all(token == 0 for token, ok in results if not ok)   # the residual is [0.4, 0, 0]


@pytest.mark.parametrize("top_k,top_p,k", [(3, 1.0, 2), (0, 0.5, 3)])
def test_batched_sampled_rows_follow_the_targets_law(top_k, top_p, k):
    """Joint law of the first two tokens of N identical rows == the target's ancestral law."""
    target = random_model("tiny", seed=31, dtype=torch.float64)
    draft = EarlyExit(target, 1)
    prompt, temperature, n = [7, 60, 3], 1.2, 3000
    outputs, _ = fast.batched_generate(target, draft, [prompt] * n, 2, k=k,
                                       temperature=temperature, top_k=top_k, top_p=top_p,
                                       generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = target.new_cache(1, 8)
        first = probs_from_logits(target(torch.tensor([prompt]), cache)[0, -1], temperature, top_k, top_p)
        law = {}
        for a in first.nonzero()[:, 0].tolist():
            branch = target.new_cache(1, 8)
            logits = target(torch.tensor([prompt + [a]]), branch)[0, -1]
            second = probs_from_logits(logits, temperature, top_k, top_p)
            for b in second.nonzero()[:, 0].tolist():
                law[(a, b)] = (first[a] * second[b]).item()
    observed = {}
    for out in outputs:
        assert tuple(out) in law
        observed[tuple(out)] = observed.get(tuple(out), 0) + 1
    keys = list(law)
    assert chi_square_p([observed.get(key, 0) for key in keys], [law[key] for key in keys], n) > 1e-6
