"""Family "served_acceptance": under sampling, the engine's own accepted/drafted counts against
the exact expectation of its draft's acceptance, sum over the draft tree of prod min(p, q).

Each completion is one drafting round after its prefill token t0 (max_tokens 2 for an engine
that drafts k every round, 3 for one that caps drafts to the tokens still wanted); given t0 the
round's accepted count has an exact law from the kit's models, and the engine's total (and,
where it counts them, its accepted tokens by draft position) is tested exactly against the
law of the sum: level ALPHA, an acceptance rate per drafted token off by 0.05 detected with
power POWER (properties/checks/served_acceptance.py has the arithmetic). Drafted tokens must be
exactly the schedule's.

Applies when the server drafts with a model the kit has (--served-draft perfect,
draft-early-exit or draft-random) and reports speculation counters; otherwise not applicable,
with the reason.

Cost on a real engine (completions, from the plan's arithmetic; vLLM sends 16 per request):

    vLLM, k = 4 greedy proposals     early exit 1,299 + 1,172 = 2,471; random 200 + 200;
                                     perfect 1,422 + 1,375 = 2,797
    llama.cpp, 1 capped proposal     early exit 833 + 205 = 1,038; random 357 + 369;
    (either convention tried)        perfect 493 + 363 = 856

so about two minutes at 20 completions per second at most. Generated examples are added in the
thorough profile only (a prompt whose acceptance varies more can need 5,000 completions).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.checks import served_acceptance as checks
from properties.cases import ServedCase
from properties.strategies import served_sampling_cases as sampling_cases
from properties.test_served_perfect_draft import counters_missing
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_acceptance")

# A repeated prompt, unfiltered at temperature 1; and one at a higher temperature with top-k
# and top-p, so that the proposals' law is a filtered one (where q from raw logits differs).
UNFILTERED = ServedCase((3, 9, 27, 3, 9, 27), 2, sampling=SamplingParams(temperature=1.0,
                                                                         seed=21))
FILTERED = ServedCase((3, 9, 27, 3, 9, 27), 2, sampling=SamplingParams(temperature=1.3, top_k=5,
                                                                       top_p=0.9, seed=22))


@pytest.fixture(scope="module")
def counting(served):
    if not served.method.drafter.replays:
        pytest.skip(f"cannot judge: the kit computes the acceptance of draft models only (the "
                    f"server's method {served.method.name} drafts with "
                    f"{served.method.drafter.describe()}; pass --served-draft=NAME)")
    reason = counters_missing(served)
    if reason:
        pytest.skip(reason)
    return served


# Temperature alone, then with top-k / top-p, in tests of their own: an engine that dies on a
# filter is still judged on its acceptance.
@given(case=sampling_cases(filters=False))
@example(case=UNFILTERED)
@profiles.statistical(checks=1, explicit_only_unless_thorough=True)
def test_accepted_counts_match_the_exact_expectation(counting, case):
    checks.check_sampled_acceptance(counting, case)


@given(case=sampling_cases())
@example(case=FILTERED)
@profiles.statistical(checks=1, explicit_only_unless_thorough=True)
def test_accepted_counts_under_top_k_and_top_p(counting, case):
    checks.check_sampled_acceptance(counting, case)
