"""The cause line the summary keys a failure by, also when Hypothesis wraps the failure."""

from __future__ import annotations

from hypothesis.errors import FlakyFailure

from properties.harness import PropertyFailure
from properties.plugin.kit import _cause_of


def _failure(cause: str) -> PropertyFailure:
    exc = PropertyFailure(f"the property: violated by --impl=x\n{cause}\nmore detail")
    exc.cause = cause
    return exc


def test_a_flaky_failure_keeps_the_cause_of_what_it_holds():
    # a failure that did not recur on Hypothesis's replay (a nondeterministic engine) arrives as
    # a FlakyFailure whose message is the repr of its contents: its cause line is the inner one
    inner = _failure("a seeded request's output depends on the batch it lands in: #0")
    wrapped = FlakyFailure("Hypothesis test_x(...) produces unreliable results", [inner])
    assert _cause_of(wrapped) == "a seeded request's output depends on the batch it lands in: #0"
    assert _cause_of(ExceptionGroup("two", [ValueError("x"), wrapped])) == inner.cause
    assert _cause_of(_failure("plain")) == "plain"
    assert _cause_of(ValueError("no cause")) is None
