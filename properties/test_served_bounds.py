"""Family "served_bounds": max_tokens and stop ids, greedy and sampled; and the engine's own
speculation counters, request by request, against the acceptance the kit replays exactly.

Greedy: the output is the target's greedy output cut after its first stop id; the stop ids are
taken from that continuation, so they fall inside blocks a speculator proposes and the server
accepts. Sampled: every output obeys max_tokens and the stops, and no token outside the
sampler's support (top-k, top-p) ever appears.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties import oracle
from properties import speculation
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.strategies import served_greedy_cases as greedy_cases
from properties.strategies import served_sampling_cases as sampling_cases
from properties.test_served_perfect_draft import counters_missing
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_bounds")

_PROMPT = (3, 9, 27, 3, 9, 27, 3, 9)
# a stop id at the 6th greedy token of a repeated prompt: inside an accepted lookup block
STOP_INSIDE = ServedCase(_PROMPT, 16,
                         sampling=SamplingParams(stop_ids=(oracle.served_greedy(_PROMPT, 16)[5],)))


@given(case=greedy_cases(with_stops=True))
@example(case=STOP_INSIDE)
@example(case=ServedCase((4, 4, 4, 4), 1))
@profiles.deterministic(hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_stops_and_length(served, case):
    checks.check_bounds(served, speculation.for_drafter(served, case))


# temperature alone, then with top-k / top-p: an engine that dies on a filter is still judged
# on its stops and lengths
@given(case=sampling_cases(max_len=8, with_stops=True, filters=False))
@profiles.deterministic(scale=0.2)
def test_sampled_stops_and_length(served, case):
    checks.check_bounds(served, speculation.for_drafter(served, case))


@given(case=sampling_cases(max_len=8, with_stops=True))
@profiles.deterministic(scale=0.2)
def test_sampled_stops_length_and_support(served, case):
    checks.check_bounds(served, speculation.for_drafter(served, case))


@pytest.fixture(scope="module")
def counting(served):
    if not served.method.drafter.replays:
        pytest.skip(f"cannot judge: the kit replays the acceptance of draft models only (the "
                    f"server's method {served.method.name} drafts with "
                    f"{served.method.drafter.describe()}; pass --served-draft=NAME)")
    reason = counters_missing(served)
    if reason:
        pytest.skip(reason)
    return served


@given(case=greedy_cases())
@example(case=ServedCase(_PROMPT, 16))
@example(case=ServedCase((30, 1, 17, 8, 12), 12))
@profiles.deterministic(scale=0.3, hit_rate=profiles.SERVED_HIT_RATE)
def test_counters_equal_exact_acceptance(counting, case):
    checks.check_counters(counting, case)
