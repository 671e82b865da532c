"""Family "sequence": sampled output is distributed exactly as the target's ancestral sampling.

For one example (target, draft, prompt, k, temperature, top-k / top-p, L) the kit enumerates
the exact probability of every possible output of L tokens from the target alone
(properties.oracle.sequence_law, float64 forwards), runs ``speculative_generate(...,
max_new_tokens=L)`` n times with one generator seeded from the example, and tests the observed
outputs with a chi-square check. n comes from the power calculation for the example's outcome
space: total variation DELTA_SEQUENCE (table models) or DELTA_SEQUENCE_QWEN3 (qwen3 models) is
detected with power 0.99. An output the target gives probability 0 fails at once.

Temperatures other than 1 come first; top-k / top-p are exercised when the implementation's
speculative_generate names them, and not applicable otherwise.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given

from properties import oracle, profiles
from properties.cases import EngineCase
from properties.harness import (engine_kwargs, fail, normalize_tokens, require, seed_everything)
from properties.models import DraftSpec, Qwen3Spec, TableSpec, build_pair
from properties.statistics import DELTA_SEQUENCE, DELTA_SEQUENCE_QWEN3, chi_square_gof, plan
from properties.strategies import sampling_cases

CHECK = "properties.test_sequence:check_sequence"
MAX_OUTCOMES = 64


def check_sequence(impl, case: EngineCase, delta: float | None = None):
    prop = "sequence: joint law of the first L tokens"
    delta = delta or (DELTA_SEQUENCE_QWEN3 if case.target.kind == "qwen3" else DELTA_SEQUENCE)
    kw = engine_kwargs(impl, case)
    law = oracle.sequence_law(case.target, case.prompt, case.max_new_tokens, case.temperature,
                              kw.get("top_k", 0), kw.get("top_p", 1.0), case.stop_ids)
    outcomes = list(law)
    the_plan = plan([law[o] for o in outcomes], delta)
    fn = impl.functions["speculative_generate"]
    generator = seed_everything(case.seed)
    observed = Counter()
    for i in range(the_plan.n):
        target, draft = build_pair(case.target, case.draft)
        try:
            tokens, _ = fn(target, draft, list(case.prompt), case.max_new_tokens,
                           generator=generator, **kw)
            tokens = tuple(normalize_tokens(tokens))
        except Exception as exc:
            fail(impl, prop, CHECK, case, f"run {i + 1} of {the_plan.n} raised "
                                          f"{type(exc).__name__}: {exc}")
        observed[tokens] += 1
    result = chi_square_gof(observed, law)
    if not result.passed:
        fail(impl, prop, CHECK, case,
             f"the outputs are not distributed as the target's sampling (temperature="
             f"{case.temperature}, top_k={kw.get('top_k', 0)}, top_p={kw.get('top_p', 1.0)}, "
             f"L={case.max_new_tokens}):\n{result.summary()}\n(sample plan: {the_plan.describe()}; "
             f"{len(outcomes)} possible outputs)")


# Canonical examples run in every profile: each kind of sampling bug the catalogue of realistic
# mistakes describes shows up in at least one of them (temperature != 1, k >= 2, whole blocks
# accepted often, a draft unlike the target, top-k below the vocabulary, a top-p nucleus
# smaller than the support).
T_CLOSE = EngineCase(TableSpec(4, seed=3, scale=2.0), DraftSpec("noisy", 1), (1, 2), 2, k=2,
                     temperature=0.7, seed=5)
T_FAR = EngineCase(TableSpec(5, seed=4, scale=1.0), DraftSpec("random", 2), (0,), 2, k=1,
                   temperature=1.6, seed=6)
T_TOP_K = EngineCase(TableSpec(5, seed=8, scale=1.0), DraftSpec("random", 3), (2,), 2, k=2,
                     temperature=1.3, seed=7, top_k=2)
T_TOP_P = EngineCase(TableSpec(5, seed=9, scale=1.0), DraftSpec("noisy", 4), (3, 1), 2, k=2,
                     temperature=0.8, seed=8, top_p=0.6)
Q_PLAIN = EngineCase(Qwen3Spec(4, seed=1, layers=1), DraftSpec("random", 1), (2,), 2, k=2,
                     temperature=0.7, seed=9)
Q_FILTERS = EngineCase(Qwen3Spec(5, seed=2, layers=1), DraftSpec("noisy", 2), (1,), 2, k=2,
                       temperature=1.3, seed=10, top_k=3, top_p=0.8)


@pytest.mark.kit("engine", kind="table")
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", length=(2, 3)))
@example(case=T_CLOSE)
@example(case=T_FAR)
def test_sampling_table(impl, case):
    require(impl, "engine", kind="table")
    check_sequence(impl, case)


@pytest.mark.kit("engine", kind="table", keywords=("top_k",))
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", top_k=True))
@example(case=T_TOP_K)
def test_top_k_table(impl, case):
    require(impl, "engine", kind="table", keyword="top_k")
    check_sequence(impl, case)


@pytest.mark.kit("engine", kind="table", keywords=("top_p",))
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", top_p=True))
@example(case=T_TOP_P)
def test_top_p_table(impl, case):
    require(impl, "engine", kind="table", keyword="top_p")
    check_sequence(impl, case)


@pytest.mark.kit("engine", kind="table")
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", stops=True, length=(2, 3)))
def test_sampling_with_stop_table(impl, case):
    """A stop id ends some outputs early: the law of the (variable-length) outputs."""
    require(impl, "engine", kind="table")
    check_sequence(impl, case)


@pytest.mark.kit("engine", kind="qwen3")
@profiles.statistical(checks=1)
@given(case=sampling_cases("qwen3", vocab=(3, 4), k=(1, 3)))
@example(case=Q_PLAIN)
def test_sampling_qwen3(impl, case):
    require(impl, "engine", kind="qwen3")
    check_sequence(impl, case)


@pytest.mark.kit("engine", kind="qwen3", keywords=("top_k", "top_p"))
@profiles.statistical(checks=1)
@given(case=sampling_cases("qwen3", vocab=(4, 5), top_k=True, top_p=True))
@example(case=Q_FILTERS)
def test_filters_qwen3(impl, case):
    require(impl, "engine", kind="qwen3", keyword="top_k")
    require(impl, "engine", kind="qwen3", keyword="top_p")
    check_sequence(impl, case)
