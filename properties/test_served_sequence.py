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
from properties import methods, speculation
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.strategies import served_sampling_cases as sampling_cases
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_sequence")

# Canonical examples: a repeated prompt (prompt lookup proposes and is partly rejected) at a
# temperature below 1, and top-k with top-p below the support. For a lookup drafter every
# prompt is first prefixed so that each judged position after the first is speculated
# (speculation.for_drafter); a position never speculated is "not shown", never a pass.
REPEATED = ServedCase((0, 1, 2, 0, 1, 2, 0, 1), 2,
                      sampling=SamplingParams(temperature=0.8, seed=11))
FILTERED = ServedCase((5, 6, 5, 6, 5), 2,
                      sampling=SamplingParams(temperature=1.3, top_k=5, top_p=0.9, seed=12))
# Later positions, where multi-token acceptance matters: the law of tokens 1-3 after the
# prefill's token 0, with a nucleus that keeps the law small enough to sample (~1000 samples).
LATER = ServedCase(methods.COVER + (3, 10, 17), 4,
                   sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=13))


def judged(served, case):
    return speculation.for_drafter(served, case)


# top-k and top-p are apart from the temperature-only test below, and seeds from both: an
# engine that dies on a filter is still judged on its law (each test its own examples).
@given(case=sampling_cases(min_len=2, filters=True))
@example(case=FILTERED)
@profiles.statistical(checks=1)
def test_joint_law_of_first_tokens(served, case):
    checks.check_sequence(served, judged(served, case))


@given(case=sampling_cases(min_len=2, filters=False))
@example(case=REPEATED)
@profiles.statistical(checks=1)
def test_joint_law_unfiltered(served, case):
    checks.check_sequence(served, judged(served, case))


# The same law with no seed in the requests: independence is all a law needs, and an engine
# whose seeded path fails (or dies) under speculation is still judged on its law.
@given(case=sampling_cases(min_len=2, filters=False))
@example(case=REPEATED)
@profiles.statistical(checks=1, scale=0.5)
def test_joint_law_unseeded(served, case):
    checks.check_sequence_unseeded(served, judged(served, case))


@given(case=sampling_cases(min_len=3, max_len=4, top_ps=(0.9, 0.95)))
@example(case=LATER)
@profiles.statistical(checks=1, scale=0.5)
def test_joint_law_of_later_tokens(served, case):
    checks.check_sequence(served, judged(served, case.replace(
        temperature=max(case.sampling.temperature, 1.0))))


@given(case=sampling_cases(filters=False))
@example(case=ServedCase((1, 2, 3), 12, sampling=SamplingParams(temperature=1.0, seed=7)))
@profiles.deterministic(scale=0.2)
def test_seed_is_honoured(served, case):
    checks.check_seed(served, judged(served, case.replace(max_tokens=12, stop_ids=())))
