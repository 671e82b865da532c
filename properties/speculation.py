"""Was anything speculated where a served check judges? A pass that saw no speculation is no
evidence about speculation, so every served check sends the requests it judges through
`send`, which also learns how much the engine drafted for them:

* per-response draft statistics, where the engine's answers carry them (llama.cpp);
* else the difference of the engine's server-wide counters around the requests (vLLM's
  /metrics; nothing else reaches the speculating server while a check runs);
* else, for a drafter that only looks up the context (n-gram, prompt lookup), the kit's replay
  of whether a lookup matches at each judged position (`lookup_proposes`).

Every drafted token of a request of max_tokens L lies at positions 1 .. L - 1 or beyond them
(position 0 comes from the prefill), and an engine drafts past L only in a round that starts
inside it, so a request with a draft is one whose judged positions were speculated.

`record` keeps, per test, how many of its examples were shown; the kit's plugin turns a test
whose examples were never shown into "not shown: nothing was drafted at the judged positions",
which is never a pass.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

# A check is shown when at least this share of its requests were speculated (where the engine
# tells per request or per round) or, from token totals alone, when it drafted at least this
# many tokens per request on average.
SHOWN_SHARE = 0.5


@dataclass(frozen=True)
class Seen:
    """What the engine drafted for one check's requests."""

    requests: int
    drafted: float | None           # tokens drafted (None: the engine does not say)
    accepted: float | None
    speculated: int | None = None   # requests (or rounds) with a draft, where known
    how: str = ""                   # in words: where the figures come from

    @property
    def known(self) -> bool:
        return self.drafted is not None or self.speculated is not None

    @property
    def shown(self) -> bool:
        if self.speculated is not None:
            return self.speculated >= SHOWN_SHARE * self.requests and self.speculated > 0
        return self.drafted is not None and self.drafted >= SHOWN_SHARE * self.requests > 0

    def describe(self) -> str:
        if not self.known:
            return "speculation not observable (the engine reports no draft statistics)"
        parts = []
        if self.speculated is not None:
            parts.append(f"{self.speculated} of {self.requests} requests speculated")
        if self.drafted is not None:
            parts.append(f"{self.drafted:g} drafted, {self.accepted or 0:g} accepted")
        return "; ".join(parts) + (f" ({self.how})" if self.how else "")


# ----------------------------------------------------------------------- per test

_lock = threading.Lock()
_tests: dict = {}        # test id -> [examples, shown examples, unobservable examples]
_current = threading.local()


def begin(test_id: str | None) -> None:
    """The plugin names the test that runs now (examples are attributed to it)."""
    _current.test = test_id


def record(seen: Seen) -> None:
    test = getattr(_current, "test", None)
    if test is None:
        return
    with _lock:
        tally = _tests.setdefault(test, [0, 0, 0])
        tally[0] += 1
        tally[1] += seen.shown
        tally[2] += not seen.known


def tally(test_id: str) -> tuple[int, int, int] | None:
    """(examples, shown, unobservable) of a test, or None when it sent nothing judged."""
    with _lock:
        t = _tests.get(test_id)
    return None if t is None else tuple(t)


def send(impl, requests, client=None):
    """(answers, Seen): the requests' completions from the speculating server and what it
    drafted for them. `client` defaults to impl.client."""
    client = client or impl.client
    dialect = client.dialect
    counted = None
    if dialect.per_response or dialect.counters_missing(client) is None:
        counted = dialect.count(client, requests)
    if counted is not None:
        answers = counted.answers
        done = [c for a in answers for c in a]
        speculated = (sum(1 for c in done if (c.drafted or 0) > 0)
                      if dialect.per_response else counted.rounds)
        seen = Seen(len(done), counted.drafted, counted.accepted, speculated, counted.source)
    else:
        answers = client.complete_many(requests)
        seen = replayed(impl, requests, answers)
    record(seen)
    return answers, seen


def replayed(impl, requests, answers) -> Seen:
    """What the kit knows, without the engine's word, of what its drafter proposed at the judged
    positions (the method's drafter says: a draft model proposes in every round, a lookup where
    its context repeats); otherwise nothing is observable."""
    drafter = impl.method.drafter
    done = [(r, c) for r, a in zip(requests, answers) for c in a]
    hits = [drafter.proposes(r.prompt, c.tokens) for r, c in done]
    if any(h is None for h in hits):
        return Seen(len(done), None, None, None, "")
    how = ("a draft model proposes in every round" if drafter.replays
           else f"the kit's replay of its drafter ({drafter.describe()})")
    return Seen(len(done), None, None, sum(hits), how)


def for_drafter(impl, case, lengthen: bool = True):
    """The case as the server's drafter can speculate it (the drafter's `cover`: a lookup sees
    a prompt where every token repeats; draft models propose anyway). (An engine whose drafts
    are capped to the tokens still wanted gets 3 tokens for 2.)"""
    if lengthen and impl.schedule == "capped" and case.max_tokens == 2:
        # an engine that caps its drafts to the tokens still wanted drafts nothing after the
        # prefill's token when one token remains: judge three, so that the second is drafted
        case = case.replace(max_tokens=3)
    return impl.method.drafter.cover(case)


__all__ = ["Seen", "begin", "for_drafter", "record", "send", "tally"]
