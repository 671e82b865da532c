"""Family "perfect_draft": with draft = target every proposal is accepted.

The properties and what they check: properties/checks/perfect_draft.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import profiles
from properties.harness import temperatures
from properties.cases import EngineCase
from properties.models import DraftSpec
from properties.strategies import prompts, seeds, target_specs, trained_cases
from reference.sampling import SamplingParams
from properties.checks.perfect_draft import (KINDS, check_perfect_draft)

pytestmark = pytest.mark.family("perfect_draft")


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.6)
@given(data=st.data())
def test_perfect_draft(impl, kind, data):
    target = data.draw(target_specs(kind), label="target")
    case = EngineCase(target=target, draft=DraftSpec("perfect"),
                      prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(1, 30), label="max_new_tokens"),
                      k=data.draw(st.integers(1, 8), label="k"),
                      sampling=SamplingParams(
                          temperature=data.draw(st.sampled_from(temperatures(impl, (0.0, 0.9, 1.5))),
                                                label="temperature"),
                          seed=data.draw(seeds(), label="seed")))
    check_perfect_draft(impl, case)


@pytest.mark.needs(kind="qwen3")
@profiles.deterministic(0.2)
@given(case=trained_cases(drafts=("perfect",)), data=st.data())
def test_perfect_draft_trained(impl, case, data):
    temperature = data.draw(st.sampled_from(temperatures(impl, (0.0, 1.0))), label="temperature")
    check_perfect_draft(impl, case.replace(temperature=temperature))
