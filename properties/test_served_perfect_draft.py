"""Family "served_perfect_draft": a server drafting with the target itself accepts every
proposal, as its own counters report (vLLM's /metrics spec-decode counters, llama.cpp's
per-response draft statistics), request by request.

Applies when the server was started with the target as its draft (say so with
--served-draft=perfect) and exports the counters; otherwise not applicable, with the reason.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.strategies import served_greedy_cases as greedy_cases

pytestmark = pytest.mark.family("served_perfect_draft")


@pytest.fixture(scope="module")
def perfect(served):
    if not served.method.drafter.perfect:
        pytest.skip("not applicable: the server's draft is not declared to be the target "
                    "(start it with the target as its draft and pass --served-draft=perfect)")
    reason = counters_missing(served)
    if reason:
        pytest.skip(reason)
    return served


def counters_missing(served) -> str | None:
    """Why the engine's own speculation counters cannot be read, or None."""
    return served.client.dialect.counters_missing(served.client)


@given(case=greedy_cases())
@example(case=ServedCase((3, 9, 27, 3, 9, 27), 16))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_perfect_draft_accepted_at_rate_one(perfect, case):
    checks.check_perfect_draft(perfect, case.replace(stop_ids=()))
