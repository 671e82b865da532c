"""Reading a `Trace`: the rounds an engine ran and whether its models ever saw a wrong context.

The chapter's invariant is "at the top of every round both caches hold exactly the committed
sequence except its newest token". Engines schedule their calls differently (the first token
taken from the prefill; the prefill merged with the first verify; the draft caught up lazily),
so the kit states the invariant over what it can observe, and what makes speculation lossless:
**no model call ever computes with a context that is not the committed sequence**, except for
the proposals of the round in progress. With ``c = prompt + output``:

* every call finds its cache holding exactly ``c[:s]`` (s: the cache length it finds); an
  entry that differs is a rolled-back token still in the cache (or a stale one from a
  rejected block), reported with its position;
* the *frontier* ``F`` is how much of ``c`` the target has decided so far: ``F = len(prompt)``
  at the start, and a target call that feeds positions ``s .. s+T-1``, of which the first
  ``kept`` equal ``c``, decides every position up to ``s + kept`` (its logits there were
  computed from the committed context), so ``F = max(F, s + kept + 1)``;
* a token a call feeds at a position below F (a committed position) must be the committed
  token: feeding anything else there means the cache was short, or the wrong token is
  treated as committed;
* a token fed at or past F is a *proposal* of the round in progress. The target's call is the
  round's verify call; the draft's calls since the previous target call belong to the same
  round, and every proposal position the draft writes must hold the proposal the target then
  verified there;
* at the end, every output position must have been decided by some target call.

A target call that decides at least one new position is a round. A round's *proposals* are
the tokens it fed at or past the frontier it found, and those the output kept are *accepted*.
So a prefill that also yields the first output token is a round with no proposals, and a
prefill merged with the first verify is one round.
"""

from __future__ import annotations

from dataclasses import dataclass

from properties.harness import first_difference
from properties.models import Trace


@dataclass(frozen=True)
class Round:
    number: int
    start: int               # the target's cache length at the call (first position fed)
    fed: tuple               # tokens the target was fed
    frontier: int            # F before the call: positions < F were already decided
    proposals: int           # fed tokens at positions >= F
    accepted: int            # of those, kept by the committed sequence
    decided: int             # new output positions decided by this call (F after - F before)
    truncated_by_end: bool   # the output ended inside this round's block

    @property
    def base(self) -> int:
        """Position of the newest committed token when the round began (F - 1)."""
        return self.frontier - 1


@dataclass
class Analysis:
    rounds: list             # the target calls that decided new positions, in order
    problem: str | None
    chain: bool              # False when the engine used masks/positions (tree verification)
    target_calls: int = 0


def _committed(c, i) -> str:
    return str(c[i]) if i < len(c) else "(none: past the output)"


def analyse(trace: Trace, prompt, output) -> Analysis:
    c = [int(t) for t in prompt] + [int(t) for t in output]
    P = len(prompt)
    if any(e.masked for e in trace.calls()):
        return Analysis([], trace.violations[0] if trace.violations else None, chain=False)
    content: dict[int, list] = {}
    rounds: list[Round] = []
    problem = trace.violations[0] if trace.violations else None
    frontier = P
    target_calls = 0
    drafted: list = []   # (draft call, {position: token} past F) since the last target call

    def fail(text, event):
        return (f"{text}\n  the engine's calls up to that point (most recent last):\n"
                f"{trace.tail(event.index)}")

    for e in trace.events:
        if e.what == "new_cache":
            content[e.cache] = []
            continue
        held = content.setdefault(e.cache, [])
        if e.what == "truncate":
            content[e.cache] = held[: e.end]
            continue
        s, fed = e.start, list(e.tokens)
        round_no = len(rounds) + 1
        if problem is None:
            problem = _check_context(e, held, c, frontier, round_no, fail)
        if e.role == "target":
            target_calls += 1
            if problem is None:
                problem = _check_drafted(drafted, e, frontier, round_no, fail)
            kept = first_difference(fed, c[s:])
            after = min(max(frontier, s + kept + 1), len(c))
            proposals = max(0, s + len(fed) - frontier)
            accepted = max(0, min(s + kept, len(c)) - frontier) if proposals else 0
            if after > frontier:
                rounds.append(Round(round_no, s, tuple(fed), frontier, proposals, accepted,
                                    after - frontier, truncated_by_end=s + kept >= len(c)))
                frontier = after
            drafted = []
        else:
            # the context this draft call computes with, past the committed positions: the
            # proposals of the round in progress (checked at the round's verify call)
            context = held[:s] + fed
            drafted.append((e, {p: context[p] for p in range(frontier, len(context))}))
        content[e.cache] = held[:s] + fed
    if problem is None and frontier < len(c) and (rounds or trace.used_caches()):
        last = rounds[-1] if rounds else None
        where = (f" (the last round began at position {last.start} and decided up to position "
                 f"{last.frontier + last.decided - 1})" if last else "")
        problem = (f"the output has tokens at positions {frontier}..{len(c) - 1} that no target "
                   f"call computed from the committed context{where}")
    return Analysis(rounds, problem, chain=True, target_calls=target_calls)


def _check_context(e, held, c, frontier, round_no, fail) -> str | None:
    """The cache a call finds must hold c[:s]; tokens it feeds below the frontier must be the
    committed ones. (Draft calls may also hold proposals of the round in progress: those are
    checked against the target's verify call in `_check_drafted`.)"""
    s, fed, who = e.start, list(e.tokens), e.role
    limit = s if who == "target" else min(s, frontier)
    i = first_difference(held[:limit], c[:limit])
    if i < limit:
        if i >= len(c):
            return fail(f"round {round_no}: the {who} cache holds {s} entries, more than the "
                        f"{len(c)} tokens ever committed: rolled-back entries are still in it", e)
        return fail(
            f"round {round_no}: the {who} cache stopped holding the committed sequence at "
            f"position {i}: it holds token {held[i]} there, the committed token is {c[i]} "
            f"(a rolled-back proposal still in the cache, or a truncate to the wrong length); "
            f"from position {i} on it holds {held[i:i + 6]} where the committed sequence has "
            f"{c[i:i + 6]}", e)
    for j, token in enumerate(fed):
        p = s + j
        if p >= frontier:
            break
        if token != (c[p] if p < len(c) else None):
            short = (f"; the token fed is the committed token of position {p + 1}: the cache was "
                     f"one entry short" if p + 1 < len(c) and token == c[p + 1] else "")
            return fail(
                f"round {round_no}: the {who} was fed token {token} at position {p}, an already "
                f"committed position, but the committed token there is {_committed(c, p)}"
                f"{short}", e)
    return None


def _check_drafted(drafted, verify, frontier, round_no, fail) -> str | None:
    """Every proposal position the draft wrote this round holds the proposal the target then
    verified there (the draft proposed it)."""
    proposals = {verify.start + j: t for j, t in enumerate(verify.tokens)
                 if verify.start + j >= frontier}
    for e, context in drafted:
        for p, token in sorted(context.items()):
            want = proposals.get(p)
            if token != want:
                how = "was fed" if p >= e.start else "held"
                return fail(
                    f"round {round_no}: the draft {how} token {token} at position {p}, past the "
                    f"committed sequence, but the proposal the target verified there is "
                    f"{want if want is not None else '(none)'}"
                    + (" (a rolled-back proposal of an earlier round still in its cache)"
                       if how == "held" else ""), e)
    return None
