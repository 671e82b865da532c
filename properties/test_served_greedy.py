"""Family "served_greedy": a served engine's greedy output is the float64 target's greedy
output (ties within the stated logit tolerance aside) and equals the output of the same model
served without speculation (--baseline=URL).

``pytest properties/ --impl=openai:http://HOST:PORT/v1 --baseline=http://HOST:PORT2/v1``; the
served model must be the kit's exported target (python -m properties.serve export DIR).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties import speculation
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.strategies import served_greedy_cases as greedy_cases

pytestmark = pytest.mark.family("served_greedy")

# A repeated pattern: prompt lookup finds matches and proposes whole blocks.
REPEATED = ServedCase((3, 9, 27, 3, 9, 27, 3, 9), 16)
RANDOM = ServedCase((30, 1, 17, 8, 12), 12)


@given(case=greedy_cases())
@example(case=REPEATED)
@example(case=RANDOM)
@profiles.deterministic(hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_equals_target_and_baseline(served, case):
    checks.check_greedy(served, speculation.for_drafter(served, case))
