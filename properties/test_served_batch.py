"""Family "served_batch": a request answered inside a concurrent batch is answered as alone.

Each example is a batch of requests (a tuple of ServedCase) sent at once, all in flight
together (at most --served-concurrency, default 8), beside the same requests sent one at a time:

* greedy: batches of 4 to 8 requests, greedy and sampled rows mixed, prompts of different
  lengths, different max_tokens and stop ids; every greedy row equals its output alone (float64
  ties aside) and the target's greedy output. Requests per example: the batch plus one per
  greedy row, at most 8 + 7 = 15; 1 + 8 examples in the dev profile, so at most 135.
* seeds: the same, judging the seeded sampled rows: alone == inside the batch wherever the
  baseline server (--baseline, no speculation) keeps them. Requests per example: at most 15 on
  each server, one more on a failure; 1 + 5 examples in the dev profile, so at most 180.
* independence: pairs of unseeded sampled requests (two prompts, L <= 2, temperature near 1)
  sent concurrently; the joint law of the pair against the product of the exact laws,
  chi-square at ALPHA with power POWER at total variation DELTA_BATCH = 0.2 (n pairs from the
  plan: 300 to 460 on the kit's target, so 600 to 920 requests per example; at 10 to 50
  requests/s, 15 s to 1.5 min each). The explicit example and one drawn one (two drawn in the
  thorough profile): a small share of the run's alpha budget for the costliest test here.

With fewer than MIN_BATCH requests in flight at once (--served-concurrency) nothing here is a
batch, and the family is not applicable.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from properties import profiles
from properties import speculation
from properties.cases import ServedCase
from properties.checks import served_batch as checks
from properties.strategies import (
    SERVED_TEMPERATURES,
    served_greedy_cases,
    served_prompts,
    served_sampling_cases,
)
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_batch")

MAX_BATCH = 8   # the client's default concurrency: every row in flight together


@st.composite
def batches(draw, judged: str):
    """A ragged batch of 4 to 8 requests. Its first row is of the kind judged ("greedy", or
    "seeded": a seeded sampled request long enough that two seeds rarely agree), its second the
    other kind, the rest either; a batch cut to a smaller concurrency keeps both kinds."""
    def greedy():
        return draw(served_greedy_cases())

    def sampled(seeded: bool, min_len: int = 1):
        case = draw(served_sampling_cases(max_len=16, filters=False))
        if case.max_tokens < min_len:
            case = case.replace(max_tokens=min_len)
        return case if seeded else case.replace(seed=checks.UNSEEDED)

    rows = ([greedy(), sampled(draw(st.booleans()))] if judged == "greedy" else
            [sampled(True, 6), greedy()])
    for _ in range(draw(st.integers(checks.MIN_BATCH, MAX_BATCH)) - 2):
        rows.append(greedy() if draw(st.booleans()) else
                    sampled(judged == "seeded" or draw(st.booleans()),
                            6 if judged == "seeded" else 1))
    return tuple(rows)


@st.composite
def pairs(draw):
    """Two sampled requests (sent unseeded) on different prompts, L <= 2, one temperature near
    1."""
    a = draw(served_prompts())
    b = draw(served_prompts().filter(lambda p: p != a))
    L = draw(st.integers(1, 2))
    params = SamplingParams(temperature=draw(st.sampled_from([t for t in SERVED_TEMPERATURES
                                                              if t >= 0.8])))
    return ServedCase(a, L, params), ServedCase(b, L, params)


@pytest.fixture(scope="module")
def batching(served):
    engine = served.engine
    if engine is not None and engine.concurrency and engine.concurrency < checks.MIN_BATCH:
        pytest.skip(f"not supported: {engine.title} answers {engine.concurrency} request(s) at "
                    f"a time (batch size {engine.concurrency}): no batch forms")
    if served.client.concurrency < checks.MIN_BATCH:
        pytest.skip(f"not applicable: --served-concurrency={served.client.concurrency} keeps "
                    f"fewer than {checks.MIN_BATCH} requests in flight at once: no batch forms")
    return served


def fit(batch: tuple, impl) -> tuple:
    """The batch cut to what the client keeps in flight at once, each row as the server's
    drafter can speculate it (speculation.for_drafter: a lookup drafter's rows cover the
    vocabulary, so its proposals are made inside the batch too)."""
    return tuple(speculation.for_drafter(impl, case) for case in batch[: impl.client.concurrency])


def fit_pair(pair: tuple, impl) -> tuple:
    """A pair as the drafter can speculate it. The product law of two outputs grows as the
    vocabulary to the power of both lengths, so the lengths stay; an engine that drafts
    nothing when one token remains (capped) gets 3 tokens in the first row and 1 in the
    second instead of 2 and 2 (the same size of law, and the first row speculated)."""
    a, b = (speculation.for_drafter(impl, c, lengthen=False) for c in pair)
    if impl.schedule == "capped" and a.max_tokens == b.max_tokens == 2:
        a, b = a.replace(max_tokens=3), b.replace(max_tokens=1)
    return a, b


# Canonical examples. A repeated prompt (prompt lookup proposes whole blocks), a random one, a
# greedy row stopped early by a stop id inside its continuation, a one-token prompt, sampled
# rows seeded and unseeded: six prompt lengths, six max_tokens.
_REPEATED = (3, 9, 27, 3, 9, 27, 3, 9)
MIXED = (ServedCase(_REPEATED, 16),
         ServedCase((5,), 3, SamplingParams(temperature=1.0, seed=5)),
         ServedCase((30, 1, 17, 8, 12), 12),
         ServedCase((1, 2, 3, 1, 2, 3, 1, 2, 3, 4), 7,
                    SamplingParams(stop_ids=(checks.oracle.served_greedy(
                        (1, 2, 3, 1, 2, 3, 1, 2, 3, 4), 7)[3],))),
         ServedCase((11, 12), 9, SamplingParams(temperature=0.8, seed=checks.UNSEEDED)),
         ServedCase((7, 7, 7, 7), 2))
SEEDED = (ServedCase((1, 2, 3), 12, SamplingParams(temperature=1.0, seed=7)),
          ServedCase(_REPEATED, 8),
          ServedCase((30, 1, 17, 8, 12, 4, 4), 10, SamplingParams(temperature=0.8, seed=8)),
          ServedCase((5, 6), 5, SamplingParams(temperature=1.3, seed=checks.UNSEEDED)),
          ServedCase((0, 1, 2, 0, 1, 2, 0, 1), 16, SamplingParams(temperature=1.0, seed=9)))
# Two draws each, temperature 1: rows sharing their uniforms move the pair's law by TV ~0.49.
PAIR = (ServedCase((1, 2, 3), 2, SamplingParams(temperature=1.0)),
        ServedCase((7,), 2, SamplingParams(temperature=1.0)))


@given(batch=batches("greedy"))
@example(batch=MIXED)
@profiles.deterministic(scale=0.3)
def test_greedy_request_inside_a_batch_equals_it_alone(batching, batch):
    checks.check_batch_greedy(batching, fit(batch, batching))


@given(batch=batches("seeded"))
@example(batch=SEEDED)
@profiles.deterministic(scale=0.2)
def test_seed_is_kept_inside_a_batch(batching, batch):
    checks.check_batch_seed(batching, fit(batch, batching))


@given(pair=pairs())
@example(pair=PAIR)
@profiles.statistical(checks=1, scale=0.2)
def test_concurrent_sampled_requests_are_independent(batching, pair):
    checks.check_batch_independence(batching, fit_pair(pair, batching))
