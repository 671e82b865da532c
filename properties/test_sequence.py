"""Family "sequence": sampled output is distributed exactly as the target's ancestral sampling.

The properties and what they check: properties/checks/sequence.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.cases import EngineCase
from properties.checks.sequence import check_sequence
from properties.models import DraftSpec, Qwen3Spec, TableSpec
from properties.strategies import sampling_cases, trained_top_k_cases
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("sequence")


# Canonical examples run in every profile: each kind of sampling bug the catalogue of realistic
# mistakes describes shows up in at least one of them (temperature != 1, k >= 2, whole blocks
# accepted often, a draft unlike the target, top-k below the vocabulary, a top-p nucleus
# smaller than the support).
T_CLOSE = EngineCase(TableSpec(4, seed=3, scale=2.0), DraftSpec("noisy", 1), (1, 2), 2, k=2,
                     sampling=SamplingParams(temperature=0.7, seed=5))
T_FAR = EngineCase(TableSpec(5, seed=4, scale=1.0), DraftSpec("random", 2), (0,), 2, k=1,
                   sampling=SamplingParams(temperature=1.6, seed=6))
T_TOP_K = EngineCase(TableSpec(5, seed=8, scale=1.0), DraftSpec("random", 3), (2,), 2, k=2,
                     sampling=SamplingParams(temperature=1.3, seed=7, top_k=2))
T_TOP_P = EngineCase(TableSpec(5, seed=9, scale=1.0), DraftSpec("noisy", 4), (3, 1), 2, k=2,
                     sampling=SamplingParams(temperature=0.8, seed=8, top_p=0.6))
Q_PLAIN = EngineCase(Qwen3Spec(4, seed=1, layers=1), DraftSpec("random", 1), (2,), 2, k=2,
                     sampling=SamplingParams(temperature=0.7, seed=9))
Q_FILTERS = EngineCase(Qwen3Spec(5, seed=2, layers=1), DraftSpec("noisy", 2), (1,), 2, k=2,
                       sampling=SamplingParams(temperature=1.3, seed=10, top_k=3, top_p=0.8))


@pytest.mark.needs(kind="table")
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", length=(2, 3)))
@example(case=T_CLOSE)
@example(case=T_FAR)
def test_sampling_table(impl, case):
    check_sequence(impl, case)


@pytest.mark.needs(kind="table", keywords=("top_k",))
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", top_k=True))
@example(case=T_TOP_K)
def test_top_k_table(impl, case):
    check_sequence(impl, case)


@pytest.mark.needs(kind="table", keywords=("top_p",))
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", top_p=True))
@example(case=T_TOP_P)
def test_top_p_table(impl, case):
    check_sequence(impl, case)


@pytest.mark.needs(kind="table")
@profiles.statistical(checks=1)
@given(case=sampling_cases("table", stops=True, length=(2, 3)))
def test_sampling_with_stop_table(impl, case):
    """A stop id ends some outputs early: the law of the (variable-length) outputs."""
    check_sequence(impl, case)


@pytest.mark.needs(kind="qwen3")
@profiles.statistical(checks=1)
@given(case=sampling_cases("qwen3", vocab=(3, 4), k=(1, 3)))
@example(case=Q_PLAIN)
def test_sampling_qwen3(impl, case):
    check_sequence(impl, case)


@pytest.mark.needs(kind="qwen3", keywords=("top_k", "top_p"))
@profiles.statistical(checks=1)
@given(case=sampling_cases("qwen3", vocab=(4, 5), top_k=True, top_p=True))
@example(case=Q_FILTERS)
def test_filters_qwen3(impl, case):
    check_sequence(impl, case)


@pytest.mark.needs(kind="qwen3", keywords=("top_k",))
@profiles.statistical(checks=1, scale=0.5)
@given(case=trained_top_k_cases())
def test_top_k_trained(impl, case):
    """The trained pair, whose drafts agree with the target, under top-k: the accepted draft
    token is the common case here, where on random models the residual draw is."""
    check_sequence(impl, case)
