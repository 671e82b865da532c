"""Family "served_sequence": a served engine samples exactly as the target.

For one example (prompt, L, temperature, top-k, top-p, stop ids) the kit enumerates the exact
law of the first L tokens from the float64 target (properties.oracle, served_law), requests n
completions with distinct seeds (the API's `n` where the server honours it, concurrent single
requests otherwise), and tests them with a chi-square check: level ALPHA, total variation
DELTA_SERVED = 0.15 detected with power POWER (n from the power calculation). The server's own
float32 arithmetic moves the law by far less than that (CONFORMANCE.md, served engines).

`seed` is checked on its own: ignoring it is reported as such, never as a distribution failure.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.strategies import served_sampling_cases as sampling_cases
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_sequence")

# Canonical examples: a repeated prompt (prompt lookup proposes and is partly rejected) at a
# temperature below 1, and top-k with top-p below the support.
REPEATED = ServedCase((0, 1, 2, 0, 1, 2, 0, 1), 2,
                      sampling=SamplingParams(temperature=0.8, seed=11))
FILTERED = ServedCase((5, 6, 5, 6, 5), 2,
                      sampling=SamplingParams(temperature=1.3, top_k=5, top_p=0.9, seed=12))


@given(case=sampling_cases())
@example(case=REPEATED)
@example(case=FILTERED)
@profiles.statistical(checks=1)
def test_joint_law_of_first_tokens(served, case):
    checks.check_sequence(served, case)


# The temperature alone, no top-k or top-p: the law of speculation is still judged when an
# engine fails (or dies) on a filter, which the test above then reports.
@given(case=sampling_cases(filters=False))
@example(case=REPEATED)
@profiles.statistical(checks=1)
def test_joint_law_unfiltered(served, case):
    checks.check_sequence(served, case)


@given(case=sampling_cases())
@example(case=ServedCase((1, 2, 3), 12, sampling=SamplingParams(temperature=1.0, seed=7)))
@profiles.deterministic(scale=0.2)
def test_seed_is_honoured(served, case):
    checks.check_seed(served, case.replace(max_tokens=12, stop_ids=()))
