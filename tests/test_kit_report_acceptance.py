"""Acceptance by draft position (properties.acceptance_by_position), on runs of the reference.

At temperature 0 a proposal is accepted exactly when the draft's argmax is the target's, so
for a correct engine the measured acceptance at every position equals the exact Σ min(p, q)
sum, and tokens per target call equals its exact expectation: any bookkeeping slip (a position
off by one, a cut round counted whole) shows as a difference. Under sampling the two agree in
expectation only, and a perfect draft gives α = 1 everywhere.
"""

from __future__ import annotations

import pytest

from properties import oracle
from properties.cases import EngineCase
from properties.harness import run_engine
from properties.impl import load
from properties.invariants import analyse
from properties.models import DraftSpec, TableSpec
from properties.acceptance_by_position import by_position
from reference.sampling import SamplingParams


def _record(case):
    run = run_engine(load("reference"), case)
    assert run.error is None, run.describe_error()
    analysis = analyse(run.trace, case.prompt, run.tokens)
    assert analysis.chain and analysis.problem is None
    return run, by_position(case, analysis, run.tokens)


def _stop_in_the_middle(target, prompt, n) -> tuple:
    """A stop id whose first occurrence in the greedy output is past its first third."""
    greedy, _ = oracle.greedy(target, prompt, n)
    first = {}
    for i, t in enumerate(greedy):
        first.setdefault(t, i)
    return tuple(t for t, i in first.items() if i >= n // 3)[:1]


@pytest.mark.parametrize("variant", ["random", "noisy", "lagged"])
@pytest.mark.parametrize("stop", [False, True])
def test_greedy_acceptance_equals_the_exact_sums(variant, stop):
    target, prompt = TableSpec(12, seed=4), (1, 2, 3)
    stop_ids = _stop_in_the_middle(target, prompt, 17) if stop else ()
    assert stop_ids or not stop
    case = EngineCase(target, DraftSpec(variant, seed=1), prompt=prompt, max_new_tokens=17, k=3,
                      sampling=SamplingParams(stop_ids=stop_ids, seed=5))
    run, record = _record(case)
    assert len(run.tokens) > 17 // 3
    assert record["tokens"] == len(run.tokens)
    for j, slot in enumerate(record["positions"]):
        assert slot["var"] == 0.0                 # greedy: each α is 0 or 1
        assert slot["accepted"] == slot["exact"], (j, slot)
    assert record["exact_tokens"] == record["tokens"]
    reached = [s["reached"] for s in record["positions"]]
    assert reached == sorted(reached, reverse=True)   # a round reaches j only through j - 1


def test_perfect_draft_is_accepted_everywhere_under_sampling():
    case = EngineCase(TableSpec(12, seed=4), DraftSpec("perfect"), prompt=(1, 2, 3),
                      max_new_tokens=17, k=4, sampling=SamplingParams(temperature=1.0, seed=5))
    _, record = _record(case)
    assert record["positions"][0]["reached"] > 0
    for slot in record["positions"]:
        assert slot["exact"] == pytest.approx(slot["reached"])
        assert slot["accepted"] == slot["reached"]


def test_sampled_acceptance_lies_between_zero_and_one():
    case = EngineCase(TableSpec(12, seed=4), DraftSpec("random", seed=2), prompt=(1, 2, 3),
                      max_new_tokens=24, k=4, sampling=SamplingParams(temperature=1.0, seed=6))
    _, record = _record(case)
    for slot in record["positions"]:
        assert 0 <= slot["exact"] <= slot["reached"]
        assert 0 < slot["var"] <= slot["reached"] / 4 or slot["reached"] == 0
