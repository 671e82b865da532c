"""Family "bounds": the output respects max_new_tokens and stop ids, and the stats add up.

The properties and what they check: properties/checks/bounds.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import oracle, profiles
from properties.harness import temperatures
from properties.cases import EngineCase
from properties.models import DraftSpec
from properties.strategies import (draft_specs, greedy_cases, prompts, seeds, target_specs,
                                   trained_cases)
from properties.checks.bounds import (KINDS, check_bounds)
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("bounds")


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic()
@given(data=st.data())
def test_length_stops_and_stats(impl, kind, data):
    """Greedy and sampled runs with random stop ids."""
    case = data.draw(greedy_cases(kind, max_new=(0, 20)), label="case")
    temperature = data.draw(st.sampled_from(temperatures(impl, (0.0, 0.0, 0.8, 1.5))), label="temperature")
    check_bounds(impl, case.replace(temperature=temperature))


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.4)
@given(data=st.data())
def test_stop_inside_accepted_block(impl, kind, data):
    """A draft whose blocks are accepted whole; each greedy token in turn is the stop id."""
    target = data.draw(target_specs(kind, vocab=(4, 24)), label="target")
    draft = data.draw(draft_specs(target, variants=("perfect", "noisy")), label="draft")
    case = EngineCase(target=target, draft=draft,
                      prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(4, 14), label="max_new_tokens"),
                      k=data.draw(st.integers(2, 5), label="k"),
                      sampling=SamplingParams(seed=data.draw(seeds(), label="seed"),
                                              temperature=temperatures(impl, (0.0,))[0]))
    greedy, _ = oracle.greedy(target, case.prompt, case.max_new_tokens)
    for token in greedy:
        check_bounds(impl, case.replace(stop_ids=(token,)))


def stop_sets(greedy: list[int], vocab: int) -> list[tuple]:
    """Sets of two or three stop ids for one greedy output, each set in every order.

    For every distinct token a of the output (its first occurrence is where the output must
    end), a partner b whose first occurrence comes later (so both may sit in one accepted
    block, b after a) and, where the vocabulary has one, a token c the output never holds.
    Every order of {a, b(, c)} is returned: a stop check that depends on the order of the ids
    (cutting at the first id of the list found in the block) fails for the orders listing b
    first."""
    first = {}
    for i, t in enumerate(greedy):
        first.setdefault(t, i)
    absent = [t for t in range(vocab) if t not in first]
    sets = []
    for a, i in first.items():
        later = [t for t, j in first.items() if j > i]
        members = [a] + later[:1] + absent[:1]
        if len(members) >= 2:
            sets.extend(itertools.permutations(members))
    return sets


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.2)
@given(data=st.data())
def test_several_stop_ids_every_order(impl, kind, data):
    """Two or three stop ids, listed in every order, the first of them to occur injected at
    every position of the output (drafts whose blocks are accepted whole, so the stops sit
    inside accepted blocks): the output ends where the first stop id occurs, whatever the
    order of stop_ids."""
    target = data.draw(target_specs(kind, vocab=(4, 12)), label="target")
    draft = data.draw(draft_specs(target, variants=("perfect", "noisy")), label="draft")
    case = EngineCase(target=target, draft=draft,
                      prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(4, 12), label="max_new_tokens"),
                      k=data.draw(st.integers(2, 5), label="k"),
                      sampling=SamplingParams(seed=data.draw(seeds(), label="seed"),
                                              temperature=temperatures(impl, (0.0,))[0]))
    greedy, _ = oracle.greedy(target, case.prompt, case.max_new_tokens)
    for stops in stop_sets(greedy, target.vocab):
        check_bounds(impl, case.replace(stop_ids=stops))


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.2)
@given(data=st.data())
def test_several_stop_ids_sampled(impl, kind, data):
    """Sampled runs (a perfect draft: blocks accepted whole) with two or three stop ids from a
    small vocabulary, in every order, each order over several seeds: no token may follow the
    first stop id to occur."""
    target = data.draw(target_specs(kind, vocab=(3, 6)), label="target")
    members = data.draw(st.lists(st.integers(0, target.vocab - 1), min_size=2, max_size=3,
                                 unique=True), label="stop ids")
    case = EngineCase(target=target, draft=DraftSpec("perfect"),
                      prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(6, 12), label="max_new_tokens"),
                      k=data.draw(st.integers(3, 5), label="k"),
                      sampling=SamplingParams(temperature=data.draw(
                          st.sampled_from(temperatures(impl, (1.0, 1.5))), label="temperature")))
    seed = data.draw(seeds(), label="seed")
    for order in itertools.permutations(members):
        for run in range(4):
            check_bounds(impl, case.replace(stop_ids=order, seed=(seed + run) % 2**32))


@pytest.mark.needs(kind="qwen3")
@profiles.deterministic(0.2)
@given(case=trained_cases(max_new=(0, 24), stops=True), data=st.data())
def test_bounds_trained(impl, case, data):
    """Long accepted blocks of the trained pair: a block that would cross max_new_tokens, and a
    stop id that is one of the target's own greedy tokens (inside an accepted block)."""
    temperature = data.draw(st.sampled_from(temperatures(impl, (0.0, 1.0))), label="temperature")
    greedy, _ = oracle.greedy(case.target, case.prompt, case.max_new_tokens)
    if greedy and data.draw(st.booleans(), label="own stop"):
        case = case.replace(stop_ids=(data.draw(st.sampled_from(greedy), label="stop"),))
    check_bounds(impl, case.replace(temperature=temperature))
