"""The feature-level heads under sampling: the committed tokens follow the target's law exactly,
and a head proposer fed the wrong position's hidden state is caught by its acceptance (while
its output stays exact).

Statistics (properties/statistics.py): every test is at the kit's level ALPHA = 2e-6 per check
(false alarms on a correct implementation), its sample size from a power calculation:
* the law of the first L = 3 tokens: Pearson chi-square after pooling (chi_square_gof), n from
  statistics.plan for power 0.99 against any deviation of total variation 0.15 (the kit's
  DELTA_SEQUENCE_QWEN3);
* the acceptance of a round's first proposal: the exact two-sided binomial test against the
  exact probability sum(min(p, q)) (reference/acceptance.py exact_acceptance), n the smallest
  multiple of 50 whose exact power (statistics.binomial_power) against the broken proposer's
  own exact probability is >= 0.99.
"""

import pytest
import torch

import reference.speculative as speculative
from properties import statistics
from properties.oracle import law_from
from reference.acceptance import exact_acceptance
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.speculative import greedy_generate, speculative_generate
from tests import heads_by_hand as by_hand
from tests.heads_by_hand import small_target

HEADS = {
    "eagle": dict(kind="eagle"),
    "eagle3-d2t": dict(kind="eagle3", draft_vocab=list(range(0, 64, 2)) + [1, 3, 5, 7]),
    "medusa": dict(kind="medusa", num_heads=2),
    "mtp": dict(kind="mtp"),
}
PROMPT = [1, 2, 3, 4, 5, 6]
L = 3


@pytest.fixture(scope="module")
def target():
    return small_target()


def make_head(target, name, seed=20):
    spec = HEADS[name]
    return spec["kind"], random_head(spec["kind"], target, seed=seed,
                                     **{k: v for k, v in spec.items() if k != "kind"})


def next_logits(target):
    def batched(seqs):
        ids = torch.tensor(seqs)
        return target(ids, target.new_cache(len(seqs), ids.shape[1]))[:, -1]
    return batched


# About 40 s each on 2 busy cores: make test runs the two whose q differs in kind (placed
# through a draft vocabulary; Medusa's, not chained); EAGLE and MTP share EAGLE-3's proposer,
# and their laws are checked by hand (test_reference_heads.py), so they run in make test-extra.
LAW_CASES = [pytest.param("eagle", marks=pytest.mark.extra), "eagle3-d2t", "medusa",
             pytest.param("mtp", marks=pytest.mark.extra)]


@pytest.mark.parametrize("name", LAW_CASES)
def test_sampled_output_follows_the_targets_law(target, name):
    """The first 3 tokens at temperature 1, k = 2 (so rounds chain the head on its own output,
    and a rejection hands the next round fresh verified features), against the exact law."""
    _, head = make_head(target, name)
    law = law_from(next_logits(target), PROMPT, L, 1.0)
    plan = statistics.plan(list(law.values()), statistics.DELTA_SEQUENCE_QWEN3)
    assert plan.power >= 0.99
    generator = torch.Generator().manual_seed(7)
    outcomes, accepting, rejecting = [], 0, 0
    for _ in range(plan.n):
        tokens, stats = speculative_generate(target, head, PROMPT, L, k=2, temperature=1.0,
                                             generator=generator)
        outcomes.append(tuple(tokens))
        accepting += stats["acceptance_rate"] > 0
        rejecting += stats["acceptance_rate"] < 1
    assert accepting > 0 and rejecting > 0    # both of the rule's branches were taken
    result = statistics.chi_square_gof(outcomes, law)
    assert result.passed, result.summary()


# --- a broken proposer: the hidden state of the wrong position -------------------------------

class OffByOne:
    """Pairs each token with the feature of the position before its own (position 0 keeps
    its own): the bug of a proposer that misaligns the target's hidden states by one."""

    def feature_rows(self, start, stop):
        return self.features[[max(j - 1, 0) for j in range(start, stop)]]


def off_by_one(head, capacity, sampler, device):
    proposer = head_proposer(head, capacity, sampler, device)
    proposer.__class__ = type("OffByOne" + type(proposer).__name__, (OffByOne, type(proposer)), {})
    return proposer


def first_acceptance(kind, head, target, prompt, shift):
    """The exact probability that the first proposal of the first round is accepted at
    temperature 1: sum(min(p, q)), q the head's law from the prompt's features (shifted by one
    position when `shift`), computed by hand."""
    features = by_hand.target_features(target, prompt[:-1], head.hidden)
    if shift:
        features = features[[max(j - 1, 0) for j in range(len(features))]]
    law = by_hand.laws(kind, head, target, features, prompt, [0])[0]
    q = by_hand.on_target_vocab(head, torch.softmax(law, -1))
    p_logits = next_logits(target)([prompt])[0]
    return float(exact_acceptance(p_logits[None], q.log()[None], 1.0)[0])


def accepted_first_proposals(target, head, prompt, n, seed):
    """n runs of one token with k = 1: (how many first proposals were accepted, the tokens)."""
    generator = torch.Generator().manual_seed(seed)
    count, tokens = 0, []
    for _ in range(n):
        out, stats = speculative_generate(target, head, prompt, 1, k=1, temperature=1.0,
                                          generator=generator)
        count += stats["acceptance_rate"] == 1.0
        tokens.append(out[0])
    return count, tokens


@pytest.mark.parametrize("name", HEADS)
def test_a_proposer_off_by_one_position_changes_acceptance_not_output(target, name,
                                                                      monkeypatch):
    """Of 16 seeded prompts, the one where the exact first-proposal acceptance of the correct
    head (alpha) and of the off-by-one proposer (alpha') differ most. n runs of each: the
    correct proposer's accepted count agrees with alpha and the broken one's with alpha' (the
    rule holds for any q), and the broken one's count is rejected against alpha, with power
    >= 0.99 from n. Its output is still the target's: its first tokens pass the chi-square
    test against p, and its greedy output is the target's greedy output."""
    kind, head = make_head(target, name)
    g = torch.Generator().manual_seed(11)
    candidates = [torch.randint(0, 64, (5,), generator=g).tolist() for _ in range(16)]
    exact = [(first_acceptance(kind, head, target, c, False),
              first_acceptance(kind, head, target, c, True), c) for c in candidates]
    alpha, broken_alpha, prompt = max(exact, key=lambda e: abs(e[0] - e[1]))
    delta = abs(alpha - broken_alpha)
    n = next(n for n in range(50, 5001, 50)
             if statistics.binomial_power(n, min(alpha, 1 - alpha), delta) >= 0.99)

    correct, _ = accepted_first_proposals(target, head, prompt, n, seed=1)
    assert statistics.binomial_p_value(correct, n, alpha) >= statistics.ALPHA
    monkeypatch.setattr(speculative, "head_proposer", off_by_one)
    broken, tokens = accepted_first_proposals(target, head, prompt, n, seed=2)
    assert statistics.binomial_p_value(broken, n, broken_alpha) >= statistics.ALPHA
    assert statistics.binomial_p_value(broken, n, alpha) < statistics.ALPHA, (broken, n, alpha)

    p = torch.softmax(next_logits(target)([prompt])[0], -1)
    result = statistics.chi_square_gof(tokens, {t: float(p[t]) for t in range(64)})
    assert result.passed, result.summary()
    for other in ([1, 2, 3, 4, 5, 6], [40, 40, 7, 40, 40]):
        assert speculative_generate(target, head, other, 16, k=3)[0] == \
            greedy_generate(target, other, 16)
