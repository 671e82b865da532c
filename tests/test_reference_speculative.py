"""The reference engine reproduces the target exactly; the chapter's formulas and example."""

import pytest
import torch
from scipy import stats

from reference.model import EarlyExit, random_model
from reference.speculative import (PromptLookup, accept_or_correct, expected_speedup,
                                   expected_tokens_per_round, greedy_generate,
                                   speculative_generate)

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def greedy_reference(target):
    return greedy_generate(target, PROMPT, 24)


@pytest.fixture(scope="module")
def drafts(target):
    return {"perfect": target, "early-exit": EarlyExit(target, 2),
            "random": random_model("tiny", seed=7, dtype=torch.float64)}


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("draft_name", ["perfect", "early-exit", "random"])
def test_speculative_greedy_is_target_greedy(target, drafts, greedy_reference, draft_name, k):
    tokens, stats_ = speculative_generate(target, drafts[draft_name], PROMPT, 24, k=k)
    assert tokens == greedy_reference
    assert stats_["tokens_per_target_call"] == len(tokens) / stats_["rounds"]


def test_perfect_draft_accepts_everything(target, drafts):
    tokens, s = speculative_generate(target, drafts["perfect"], PROMPT, 32, k=4)
    # The chapter's figures: 32 tokens at k + 1 = 5 per round take 7 rounds, 32 / 7 = 4.57.
    assert (s["rounds"], s["acceptance_rate"], round(s["tokens_per_target_call"], 2)) == (7, 1.0, 4.57)


@pytest.mark.parametrize("branching", [(2, 2, 2), (3, 2, 1), (1,), (4,), (2, 1, 1, 1)])
def test_tree_is_target_greedy(target, drafts, greedy_reference, branching):
    tokens, s = speculative_generate(target, drafts["early-exit"], PROMPT, 24, tree=branching)
    assert tokens == greedy_reference
    assert 0 <= s["acceptance_rate"] <= 1


def test_tree_with_a_perfect_draft_takes_the_full_depth_every_round(target, drafts):
    tokens, s = speculative_generate(target, drafts["perfect"], PROMPT, 24, tree=True)
    assert s["acceptance_rate"] == 1.0 and s["rounds"] == 6  # 4 tokens per round


@pytest.mark.parametrize("draft_name", ["early-exit", "random"])
def test_adaptive_k_is_target_greedy(target, drafts, greedy_reference, draft_name):
    assert speculative_generate(target, drafts[draft_name], PROMPT, 24, k=8, adaptive=True)[0] == greedy_reference


def test_prompt_lookup_is_target_greedy(target, greedy_reference):
    assert speculative_generate(target, PromptLookup(3), PROMPT, 24, k=4)[0] == greedy_reference


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    context = [7, 1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 1, 2, 3]
    assert PromptLookup(3).propose(context, 2) == [4, 5]
    assert PromptLookup(3).propose([1, 2, 3, 4], 2) == []


@pytest.mark.parametrize("prompt", [[5], [5, 6]])
def test_short_prompts_and_zero_tokens(target, drafts, prompt):
    assert speculative_generate(target, drafts["early-exit"], prompt, 0)[0] == []
    assert speculative_generate(target, drafts["early-exit"], prompt, 9, k=3)[0] == \
        greedy_generate(target, prompt, 9)


def test_stop_id_inside_an_accepted_block_ends_the_output(target, drafts, greedy_reference):
    stop = greedy_reference[6]
    first = greedy_reference.index(stop)
    tokens, _ = speculative_generate(target, drafts["perfect"], PROMPT, 24, k=4, stop_ids=(stop,))
    assert tokens == greedy_reference[: first + 1]


def test_sampling_with_a_perfect_draft_accepts_everything_and_replays_from_the_seed(target):
    """Not a distribution test (the kit does those): with q == p (same processing of the same
    logits) every proposal is accepted, and the same seed gives the same stream."""
    runs = [speculative_generate(target, target, PROMPT, 16, k=3, temperature=0.7,
                                 generator=torch.Generator().manual_seed(4), top_k=20, top_p=0.9)
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][1]["acceptance_rate"] == 1.0


def test_expected_tokens_per_round_by_hand():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens_per_round(0.0, 4) == 1
    assert expected_tokens_per_round(1.0, 4) == 5


def test_the_chapters_speedup_examples():
    # alpha 0.8, k 4, c 0.05: 3.3616 / 1.2 = 2.80; alpha 0.5: 1.9375 / 1.2 = 1.61.
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert round(expected_speedup(0.8, 4, 0.05), 1) == 2.8
    assert round(expected_speedup(0.5, 4, 0.05), 1) == 1.6


def test_acceptance_probability_of_the_chapters_example_is_exact():
    """p = [.6, .3, .1], q = [.2, .3, .5]: token 2 is accepted with probability .1/.5 = .2;
    drawing the uniform ourselves through a seeded generator makes this exact per seed."""
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    for seed in range(200):
        u = torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        token, accepted = accept_or_correct(p, q, 2, torch.Generator().manual_seed(seed))
        assert accepted == bool(u < 0.2)
        assert token == (2 if accepted else 0)  # the residual [.4, 0, 0] puts everything on 0


def test_the_chapters_rule_example_is_distributed_as_p():
    """20,000 draws, as in the chapter: token ~ q, then accept_or_correct; chi-square against p.

    alpha = 1e-4 (the false-alarm rate). Power: Pearson's statistic is noncentral chi-square
    with noncentrality n * chi2(P_true || p) >= n * 4 TV^2 (since 2 TV <= sqrt(chi2) by
    Cauchy-Schwarz), so a sampler at TV 0.03 from p is caught with the probability computed
    below, which the test also asserts is >= 0.99.
    """
    n, alpha, tv = 20_000, 1e-4, 0.03
    critical = stats.chi2.ppf(1 - alpha, df=2)
    assert stats.ncx2.sf(critical, df=2, nc=n * 4 * tv**2) >= 0.99
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    g = torch.Generator().manual_seed(2026)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    counts = torch.zeros(3)
    for x in drafts.tolist():
        counts[accept_or_correct(p, q, x, g)[0]] += 1
    assert stats.chisquare(counts.numpy(), (p * n).numpy()).pvalue > alpha


@pytest.mark.parametrize("draft_name, adaptive", [("perfect", False), ("early-exit", False),
                                                  ("random", True)])
def test_k_beyond_what_can_still_be_produced_is_capped(target, drafts, greedy_reference,
                                                       monkeypatch, draft_name, adaptive):
    # A round yields at most its proposals + 1 tokens, so proposals past the tokens still to
    # come are never drafted and the caches are sized for the capped k: k = 100000 costs nothing.
    capacities = []
    new_cache = type(target).new_cache

    def recording_new_cache(self, batch, capacity):
        capacities.append(capacity)
        return new_cache(self, batch, capacity)

    monkeypatch.setattr(type(target), "new_cache", recording_new_cache)
    tokens, s = speculative_generate(target, drafts[draft_name], PROMPT, 24, k=100_000,
                                     adaptive=adaptive)
    assert tokens == greedy_reference
    assert capacities and max(capacities) <= len(PROMPT) + 24 + 24
    if draft_name == "perfect":
        assert s == {"rounds": 1, "acceptance_rate": 1.0, "tokens_per_target_call": 24.0}


def test_prompt_lookup_with_a_huge_k(target, greedy_reference):
    tokens, _ = speculative_generate(target, PromptLookup(2), PROMPT, 24, k=100_000)
    assert tokens == greedy_reference
