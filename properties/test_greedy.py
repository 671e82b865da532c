"""Family "greedy": at temperature 0 the output is exactly the target's greedy output.

The properties and what they check: properties/checks/greedy.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties import profiles
from properties.cases import EngineCase
from properties.checks.greedy import (KINDS, NEAR_TIE_GAPS, check_equivalence, check_near_ties,
                                      check_stop_offsets)
from properties.models import DraftSpec, Qwen3Spec, TableSpec
from properties.strategies import (draft_specs, greedy_cases, prompts, seeds, target_specs,
                                   trained_cases)
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("greedy")


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic()
@given(data=st.data())
def test_greedy_equivalence(impl, kind, data):
    """Any draft, prompt, k, max_new_tokens and stop ids: output == target greedy."""
    check_equivalence(impl, data.draw(greedy_cases(kind), label="case"))


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.4)
@given(data=st.data())
def test_stop_injected_at_every_offset(impl, kind, data):
    """With drafts that get whole blocks accepted, relabel the target's greedy token at each
    offset as the stop id: the output must end exactly at its first occurrence."""
    target = data.draw(target_specs(kind, vocab=(4, 24)), label="target")
    draft = data.draw(draft_specs(target, variants=("perfect", "noisy", "early_exit")), label="draft")
    case = EngineCase(target=target, draft=draft,
                      prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(4, 14), label="max_new_tokens"),
                      k=data.draw(st.integers(1, 5), label="k"),
                      sampling=SamplingParams(seed=data.draw(seeds(), label="seed")))
    check_stop_offsets(impl, case)


@pytest.mark.parametrize("kind", KINDS)
def test_edge_cases(impl, kind):
    """One-token prompt, max_new_tokens 0 and 1, k = 1 and k larger than the output."""
    target = TableSpec(7, seed=5) if kind == "table" else Qwen3Spec(7, seed=5, layers=2)
    draft = DraftSpec("noisy", 1)
    for prompt in ((3,), (1, 2, 3, 4, 5)):
        for max_new, k in ((0, 4), (1, 1), (1, 8), (2, 8), (9, 1), (9, 8)):
            check_equivalence(impl, EngineCase(target, draft, prompt, max_new, k=k))


@pytest.mark.needs(kind="table")
@profiles.deterministic(0.4)
@given(data=st.data())
def test_argmax_at_near_ties(impl, data):
    """Targets whose top-two logits differ by 1e-5 .. 1e-3 at every step (not ties: far above
    float32 rounding): temperature 0 must still commit the exact argmax."""
    gap = data.draw(st.sampled_from(NEAR_TIE_GAPS), label="gap")
    target = TableSpec(data.draw(st.integers(3, 24), label="vocab"),
                       seed=data.draw(st.integers(0, 2**16), label="target seed"), tie_gap=gap)
    case = EngineCase(target, data.draw(draft_specs(target), label="draft"),
                      data.draw(prompts(target.vocab), label="prompt"),
                      data.draw(st.integers(8, 20), label="max_new_tokens"),
                      k=data.draw(st.integers(1, 6), label="k"),
                      sampling=SamplingParams(seed=data.draw(seeds(), label="seed")))
    check_near_ties(impl, case)


# The trained target and its trained drafts on held-out text: whole blocks of up to 8 proposals
# are accepted, so a bug that only shows at late draft positions (an off-by-one in a long
# accepted block, a bonus token after a full block) is exercised (tests/test_trained.py says how
# often each draft position is reached).
@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.3)
@given(case=trained_cases())
def test_greedy_trained(impl, case):
    check_equivalence(impl, case)


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.15)
@given(case=trained_cases(max_new=(4, 14), k=(2, 6)))
def test_stop_at_every_offset_trained(impl, case):
    check_stop_offsets(impl, case)
