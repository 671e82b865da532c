"""``--kit-reseed=SALT``: every case's own samples drawn afresh, for measuring the kit's error rates.

A statistical check's stated false-alarm rate is a statement over the seeds its samples are
drawn with. In a kit run those seeds are the case's own (``case.seed`` of a RuleCase,
``case.sampling.seed`` of the others), so a canonical (explicit) example draws the same samples
in every run, and so does Hypothesis's first generated example (its simplest case, the same in
every run, seed included): one run says nothing about their rate. With a salt, each case's seed
is mixed with it before the test body runs, and runs with distinct salts draw distinct samples
for every example; the models (their specs' seeds) are left alone, so the case is the kit's.
The calibration (``python -m tests.calibration``) runs the kit so, one salt per run, with
``--hypothesis-seed`` choosing the generated examples.

The salt reaches the body through Hypothesis's documented hook for wrapping a test's inner
function (``test.hypothesis.inner_test``, meant for plugins); a test that is not a Hypothesis
test or takes no ``case`` is left as it is.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


def mix(seed: int, salt: int) -> int:
    """A seed derived from a case's seed and the salt, distinct for distinct salts."""
    return int(np.random.SeedSequence([seed, salt, 25]).generate_state(1, np.uint32)[0])


def reseed(case, salt: int):
    """The case with its own sampling randomness drawn afresh (its models untouched)."""
    if hasattr(case, "pair"):                               # RuleCase
        return dataclasses.replace(case, seed=mix(case.seed, salt))
    seed = case.sampling.seed or 0
    return case.replace(seed=mix(seed, salt))


def apply(test, salt: int | None) -> None:
    """Make the Hypothesis test `test` reseed its `case` with `salt` (None: as written). Safe to
    call again in the same process (a second pytest.main): the original body is kept aside."""
    hypothesis = getattr(test, "hypothesis", None)
    if hypothesis is None:
        return
    body = getattr(hypothesis.inner_test, "kit_unsalted", hypothesis.inner_test)
    if salt is None:
        hypothesis.inner_test = body
        return

    @functools.wraps(body)
    def salted(*args, **kwargs):
        if "case" in kwargs:
            kwargs["case"] = reseed(kwargs["case"], salt)
        return body(*args, **kwargs)

    salted.kit_unsalted = body
    hypothesis.inner_test = salted
