"""fast.PromptLookup: the fast engine's drafter without a model. Its proposals are the
reference lookup's (filled to k with the newest token), round after round as the engine commits;
greedy output is the target's; sampled output follows the target's law exactly."""

import random
from types import SimpleNamespace

import pytest
import torch

import fast
from fast import native
from fast.testing import target_greedy
from properties import statistics
from reference.model import random_model
from reference.proposers import PromptLookup as ReferenceLookup
from reference.sampling import probs_from_logits


def expected_proposals(context, k, ngram):
    """The reference lookup's proposals, filled to k with the context's newest token."""
    found = ReferenceLookup(ngram).propose(context, k)
    return found + [context[-1]] * (k - len(found))


# the search in fast/lookup.cpp (on a CPU with the kernels) and as tensor operations
SEARCHES = [True, False] if native.unsupported() is None else [False]


@pytest.mark.parametrize("use_kernel", SEARCHES, ids=lambda on: "kernel" if on else "tensor-ops")
@pytest.mark.parametrize("ngram,k", [(3, 4), (2, 3), (1, 5)])
def test_proposals_are_the_reference_lookups_round_after_round(ngram, k, use_kernel):
    """Ragged rows over a small alphabet (many matches, of every n-gram size, and none), each
    round committing a random number of the proposals and a correction, as the engine does."""
    rng = random.Random(ngram * 10 + k)
    contexts = [[rng.randrange(4) for _ in range(n)] for n in (1, 2, 5, 9, 14)]
    B = len(contexts)
    drafter = fast.PromptLookup(ngram)
    drafter.use_kernel = use_kernel
    if use_kernel:
        assert native.kernel() is not None, native.failure()
    drafter.bind(8, "cpu")
    width = max(map(len, contexts)) - 1
    ids = torch.zeros(B, width, dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, :len(c) - 1] = torch.tensor(c[:-1])
    drafter.prefill(ids, torch.tensor([len(c) - 1 for c in contexts]))
    greedy = SimpleNamespace(greedy=True)
    for _ in range(12):
        lengths = torch.tensor([len(c) - 1 for c in contexts])
        rows = SimpleNamespace(last=torch.tensor([c[-1] for c in contexts]))
        proposals, q = drafter.propose(rows, lengths, k, greedy, max(map(len, contexts)) + k + 1)
        assert q is None
        for c, got in zip(contexts, proposals.tolist()):
            assert got == expected_proposals(c, k, ngram), c
        for c, got in zip(contexts, proposals.tolist()):
            accepted = rng.randrange(k + 1)
            c.extend(got[:accepted] + [rng.randrange(4)])
    # sampled: q is one-hot on each proposal, in float64 over the target's vocabulary
    proposals, q = drafter.propose(rows, lengths, k, SimpleNamespace(greedy=False), 64)
    assert q.shape == (B, k, 8) and q.dtype == torch.float64
    assert torch.equal(q.argmax(-1), proposals) and torch.equal(q.sum(-1), torch.ones(B, k))


def test_greedy_output_is_the_targets_and_lookup_is_accepted():
    """Ragged prompts, some repetitive (the lookup finds its continuation), some not."""
    target = random_model("tiny", seed=5)
    g = torch.Generator().manual_seed(0)
    phrase = torch.randint(0, 256, (6,), generator=g).tolist()
    prompts = [phrase * 3 + [1, 2], phrase + [7], [3, 4, 5, 3, 4], [9], phrase * 2]
    outputs, stats = fast.batched_generate(target, fast.PromptLookup(3), prompts, 24, k=4)
    assert outputs == [target_greedy(target, p, 24) for p in prompts]
    assert stats["accepted"] > 0
    # greedy decoding of this model repeats itself, so lookup pays: more than one token a call
    assert stats["tokens_per_row_round"] > 1.2


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.2, 0, 0.8)])
def test_sampled_output_follows_the_targets_law(temperature, top_k, top_p):
    """The joint law of the first two tokens of n identical rows (n independent trials in one
    call) against the target's exact law, in float64: chi-square after pooling
    (properties.statistics.chi_square_gof), false-alarm rate 2e-6 per check (the kit's alpha),
    n planned by statistics.plan for power 0.99 at total variation 0.1. The prompt is a phrase,
    the target's greedy continuation of it, and the phrase again, so the lookup proposes that
    continuation (the target's likeliest tokens) and both of the rule's paths, acceptance and
    correction, are taken many times (checked)."""
    target = random_model("tiny", seed=31, dtype=torch.float64)
    phrase = [7, 60, 3]
    prompt = phrase + target_greedy(target, phrase, 4) + phrase
    with torch.no_grad():
        first = probs_from_logits(target(torch.tensor([prompt]), target.new_cache(1, 16))[0, -1],
                                  temperature, top_k, top_p)
        law = {}
        for a in first.nonzero()[:, 0].tolist():
            logits = target(torch.tensor([prompt + [a]]), target.new_cache(1, 16))[0, -1]
            second = probs_from_logits(logits, temperature, top_k, top_p)
            for b in second.nonzero()[:, 0].tolist():
                law[(a, b)] = (first[a] * second[b]).item()
    plan = statistics.plan(list(law.values()), 0.1)
    assert plan.power >= 0.99
    outputs, stats = fast.batched_generate(target, fast.PromptLookup(3), [prompt] * plan.n, 2,
                                           k=3, temperature=temperature, top_k=top_k,
                                           top_p=top_p, generator=torch.Generator().manual_seed(3))
    assert 0 < stats["accepted"] < stats["proposed"]          # both paths of the rule were taken
    result = statistics.chi_square_gof([tuple(o) for o in outputs], law)
    assert result.passed, (result.p_value, result.impossible, result.worst)


@pytest.mark.skipif(native.unsupported() is not None, reason=f"no CPU kernels: {native.unsupported()}")
def test_kernel_search_equals_the_tensor_search():
    """On random histories over 3 symbols (every n-gram size matching somewhere, or nowhere),
    every length up to the bound, k and ngram: the same proposals, and None off the contract."""
    module = native.kernel()
    assert module is not None, native.failure()
    g = torch.Generator().manual_seed(4)
    drafter = fast.PromptLookup(3)
    for ngram in (1, 2, 3, 5):
        drafter.ngram = ngram
        for trial in range(40):
            B, width = 6, 40
            history = torch.randint(0, 3, (B, width), generator=g)
            bound = int(torch.randint(2, width + 1, (1,), generator=g))
            lengths = torch.randint(0, bound, (B,), generator=g)
            last = torch.randint(0, 3, (B,), generator=g)
            k = int(torch.randint(1, 6, (1,), generator=g))
            got = module.lookup(history, lengths, last, k, ngram, bound)
            assert torch.equal(got, drafter._search(history, lengths, last, k, bound)), (ngram, trial)
    history, lengths, last = torch.zeros(2, 8, dtype=torch.long), torch.tensor([1, 7]), torch.tensor([0, 0])
    assert module.lookup(history, lengths, last, 2, 3, 7) is None        # a length past the bound
    assert module.lookup(history.int(), lengths, last, 2, 3, 8) is None  # int32
    assert module.lookup(history, lengths, last, 0, 3, 8) is None        # k = 0


def test_bad_ngram_is_refused_naming_it():
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match=f"ngram must be an int >= 1, got {bad!r}"):
            fast.PromptLookup(bad)
