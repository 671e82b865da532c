"""Family "bounds": the output respects max_new_tokens and stop ids, and the stats add up.

The properties and what they check: properties/checks/bounds.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import oracle, profiles
from properties.harness import temperatures
from properties.cases import EngineCase
from properties.strategies import draft_specs, greedy_cases, prompts, seeds, target_specs
from properties.checks.bounds import (KINDS, check_bounds)

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
                      k=data.draw(st.integers(2, 5), label="k"), seed=data.draw(seeds(), label="seed"),
                      temperature=temperatures(impl, (0.0,))[0])
    greedy, _ = oracle.greedy(target, case.prompt, case.max_new_tokens)
    for token in greedy:
        check_bounds(impl, case.replace(stop_ids=(token,)))
