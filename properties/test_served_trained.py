"""Family "served_trained": a production engine on a trained pair (``--engine=NAME
--method=NAME --models trained`` or ``trained-large``), where speculation pays. The pair's
2,048-token laws are not enumerated, so the family judges what still has an exact answer, over
greedy requests on held-out prompts (properties/serve/trained.py): the output is the float64
target's greedy output (ties within the served tolerance aside) and the baseline's, and the
engine's drafted and accepted counts equal the exact replay of each request's rounds.

Applies only where the kit started the engine on a trained pair; the kit's own models are
judged by the other served families.
"""

from __future__ import annotations

import pytest

from properties import session as sessions
from properties import speculation
from properties.serve import trained

pytestmark = pytest.mark.family("served_trained")


def test_greedy_and_counters_on_the_trained_pair(served, pytestconfig):
    launch = sessions.of(pytestconfig).launch
    if launch is None or not launch.trained:
        pytest.skip("not applicable: a trained pair is judged where the kit starts the engine "
                    "on it (--engine=NAME --method=NAME --models trained)")
    result = trained.check(served.engine, served.method, served.client.url,
                           served.baseline.url if served.baseline else None, models=launch.models)
    launch.trained_result = result
    requests = len(result["requests"])
    speculation.record(speculation.Seen(requests, result.get("engine_drafted"),
                                        result.get("engine_accepted"),
                                        how="the engine's counters over the trained requests"))
    if result["failures"]:
        raise AssertionError(f"{result['failures'][0]}\n" + "\n".join(
            [f"{len(result['failures'])} failure(s) of the trained check on the "
             f"{launch.models} pair:"] + result["failures"]))
