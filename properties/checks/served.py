"""The served-engine properties: each check sends requests, compares with the float64 truth,
and raises the kit's PropertyFailure (properties.harness.fail) with a replayable case.

    check_identity       before anything else: the server holds the kit's target (probe prompts)
    check_greedy         temperature 0: each token is the float64 argmax (ties within the stated
                         tolerance aside), the length and stops are right, and the output equals
                         the baseline server's (the same model without speculation)
    check_sequence       sampling: the joint law of the first L tokens, chi-square against the
                         exact law, alpha and power as everywhere in the kit
    check_seed           the same seed twice gives the same output; different seeds do not
    check_bounds         max_tokens and stop ids, greedy and sampled (stops inside accepted blocks)
    check_perfect_draft  with the target as its own draft, the server's acceptance counters
                         show every proposal accepted
"""

from __future__ import annotations

import math
from collections import Counter

from dataclasses import replace

from properties import statistics
from properties.harness import fail, law_mismatch
from properties import evidence
from properties import acceptance
from properties import methods
from properties import oracle
from properties import speculation
from properties.cases import ServedCase
from properties.adapters.client import BadResponse, Completion, Request, ServedError

# The design deviation of the served sampling check: total variation >= DELTA_SERVED in the
# joint law of the first L tokens is detected with power POWER at level ALPHA.
DELTA_SERVED = 0.15
# Completions per request where the server honours `n` (fewer requests, same samples).
N_PER_REQUEST = 16
# Probe prompts of the identity check (before any property runs).
PROBES = ((0, 1, 2, 3), (31, 7, 7, 19, 4), (5,))
PROBE_TOKENS = 8

_MODULE = "properties.checks.served"


class Refusal(Exception):
    """The kit refuses to check this server: the message says why and what to do."""


def _seed(case_seed: int, i: int) -> int:
    return (case_seed * 1_000_003 + i * 7919 + 1) % 2**31


def _request(case: ServedCase, **changes) -> Request:
    """The case's request; `changes`: to its sampling (seed, n)."""
    return Request(tuple(case.prompt), case.max_tokens, replace(case.sampling, **changes))


def _send(impl, prop, check, case, client, requests):
    """The answers; requests to the speculating server are judged ones, so what it drafted
    for them is recorded (properties.speculation: a test never shown speculating is no pass)."""
    try:
        if client is impl.client:
            return speculation.send(impl, requests)[0]
        return client.complete_many(requests)
    except ServedError as exc:
        fail(impl, prop, check, case, f"the server failed a request: {exc}")


# --------------------------------------------------------------------------- helpers

def greedy_divergence(prompt, tokens, tolerance: float, logits=None):
    """None if every token is a float64 argmax within `tolerance` of the largest logit, else
    (position, served token, argmax token, gap between them). `logits(prompt, tokens)`: the
    float64 target's rows (default the kit's served target; the trained pair's elsewhere)."""
    rows = (logits or oracle.served_logits)(prompt, tokens)
    for i, token in enumerate(tokens):
        if not 0 <= token < rows.shape[1]:
            return i, token, int(rows[i].argmax()), math.inf
        best = int(rows[i].argmax())
        gap = float(rows[i, best] - rows[i, token])
        if gap > tolerance:
            return i, token, best, gap
    return None


def ties(prompt, tokens) -> list[int]:
    """Positions where the served token is not the exact float64 argmax (within tolerance)."""
    rows = oracle.served_logits(prompt, tokens)
    return [i for i, t in enumerate(tokens) if int(rows[i].argmax()) != t]


def bounds_violation(case: ServedCase, completion: Completion) -> str | None:
    """What is wrong with the output's length or stops, if anything."""
    tokens = list(completion.tokens)
    stops = set(case.sampling.stop_ids)
    if len(tokens) > case.max_tokens:
        return f"{len(tokens)} tokens returned for max_tokens={case.max_tokens}"
    for i, t in enumerate(tokens):
        if t in stops and i != len(tokens) - 1:
            return (f"the output goes on after stop id {t} at position {i}: "
                    f"{tokens[i + 1:][:8]} follow it")
    ended_by_stop = bool(tokens) and tokens[-1] in stops
    if not ended_by_stop and len(tokens) < case.max_tokens:
        return (f"only {len(tokens)} of max_tokens={case.max_tokens} tokens and no stop id at "
                f"the end (finish_reason={completion.finish_reason!r})")
    reason = completion.finish_reason
    if reason is not None and ended_by_stop and len(tokens) < case.max_tokens and reason != "stop":
        return f"ended by stop id {tokens[-1]} but finish_reason={reason!r} (expected 'stop')"
    if reason is not None and not ended_by_stop and reason != "length":
        return f"ran to max_tokens={case.max_tokens} but finish_reason={reason!r} (expected 'length')"
    return None


# --------------------------------------------------------------------------- identity

def check_identity(client, tolerance: float, role: str = "--impl") -> None:
    """Raise Refusal unless the server's greedy output on the probe prompts is the kit
    target's (tie-aware). Runs before any property, so a wrong model is one clear message."""
    try:
        client.resolve()
        # one at a time: a server that is wrong only inside a batch is served_batch's finding,
        # not a wrong model
        answers = [client.complete(Request(p, PROBE_TOKENS)) for p in PROBES]
    except ServedError as exc:
        raise Refusal(f"{role} server {client.url}: {exc}") from None
    for prompt, (completion,) in zip(PROBES, answers):
        expected = oracle.served_greedy(prompt, PROBE_TOKENS)
        got = list(completion.tokens)
        bad = greedy_divergence(prompt, got, tolerance) if len(got) == PROBE_TOKENS else (
            len(got), None, None, None)
        if bad is not None:
            raise Refusal(
                f"{role} server {client.url} (model {client.model!r}) does not serve the kit's "
                f"target: greedy on the probe prompt {list(prompt)} gave {got}, the target's "
                f"float64 greedy is {expected} (first wrong token at position {bad[0]}). Serve "
                f"the exported target: python -m properties.serve export DIR, then serve DIR/target "
                f"(python -m properties.serve recipes DIR prints the commands).")


# --------------------------------------------------------------------------- greedy

CHECK_GREEDY = f"{_MODULE}:check_greedy"


def check_greedy(impl, case: ServedCase):
    prop = "served_greedy: output equals the float64 target's greedy output and the baseline's"
    case = case.replace(temperature=0.0, top_k=0, top_p=1.0)
    tol = impl.logit_tolerance
    (served,), = _send(impl, prop, CHECK_GREEDY, case, impl.client, [_request(case)])
    problem = bounds_violation(case, served)
    if problem:
        fail(impl, prop, CHECK_GREEDY, case, f"{problem}\nserved: {list(served.tokens)}")
    bad = greedy_divergence(case.prompt, served.tokens, tol)
    if bad is not None:
        i, token, best, gap = bad
        expected = oracle.served_greedy(case.prompt, case.max_tokens, case.sampling.stop_ids)
        fail(impl, prop, CHECK_GREEDY, case,
             f"position {i}: served token {token}, but the target's argmax there is {best}, "
             f"{gap:.4g} logits higher (ties are gaps <= {tol:g})\nserved:          "
             f"{list(served.tokens)}\ntarget's greedy: {expected}")
    if impl.baseline is None:
        return
    (base,), = _send(impl, prop, CHECK_GREEDY, case, impl.baseline, [_request(case)])
    if base.tokens == served.tokens:
        return
    i = next((j for j, (a, b) in enumerate(zip(served.tokens, base.tokens)) if a != b),
             min(len(served.tokens), len(base.tokens)))
    prefix = list(served.tokens[:i])
    row = oracle.served_logits(case.prompt, prefix + [0])[-1]
    a = served.tokens[i] if i < len(served.tokens) else None
    b = base.tokens[i] if i < len(base.tokens) else None
    if a is not None and b is not None and abs(float(row[a] - row[b])) <= tol:
        return  # a rounding tie between the two servers, both within the tolerance
    fail(impl, prop, CHECK_GREEDY, case,
         f"the output differs from the baseline server's ({impl.baseline.url}, the same model "
         f"without speculation) at position {i}, which is no tie\nserved:   "
         f"{list(served.tokens)}\nbaseline: {list(base.tokens)}")


# --------------------------------------------------------------------------- sampling

CHECK_SEQUENCE = f"{_MODULE}:check_sequence"


def sampling_requests(client, case: ServedCase, n: int, seeded: bool = True) -> list[Request]:
    per = (N_PER_REQUEST if client.dialect.honours_n is not False and client.supports_n is not False
           else 1)
    out, i = [], 0
    while i < n:
        take = min(per, n - i)
        # unseeded: the requests carry no seed (a law judged without the engine's seeding path)
        seed = _seed(case.sampling.seed, i) if seeded else None
        out.append(_request(case, seed=seed, n=take))
        i += take
    return out


def check_sequence_unseeded(impl, case: ServedCase):
    """check_sequence with requests that carry no seed: independent samples are all a law
    needs, so an engine whose seeded path fails under speculation is still judged on its law
    (each request's seed otherwise derives from the case's, for replay)."""
    return check_sequence(impl, case, seeded=False)


def check_sequence(impl, case: ServedCase, delta: float = DELTA_SERVED, seeded: bool = True):
    prop = "served_sequence: joint law of the first L tokens"
    s = case.sampling
    law = oracle.served_law(case.prompt, case.max_tokens, s.temperature, s.top_k, s.top_p,
                            s.stop_ids)
    the_plan = statistics.plan(list(law.values()), delta)
    answers = _send(impl, prop, CHECK_SEQUENCE, case, impl.client,
                    sampling_requests(impl.client, case, the_plan.n, seeded))
    outputs = [c for answer in answers for c in answer][: the_plan.n]
    for c in outputs:
        problem = bounds_violation(case, c)
        if problem:
            fail(impl, prop, CHECK_SEQUENCE, case, f"a sampled output breaks the bounds: {problem}"
                                                   f"\nserved: {list(c.tokens)}")
    observed = Counter(c.tokens for c in outputs)
    # Distinct seeds must give independent answers. Every request answered identically, at an
    # exact chance below 1e-9, is a seed the server ignores (or overrides with a fixed one):
    # reported as that, not as a law that differs.
    first = [c.tokens for c in answers[0]]
    if len(answers) > 1 and all([c.tokens for c in a] == first for a in answers):
        chance = math.prod(law.get(t, 0.0) for t in first) ** (len(answers) - 1)
        if chance < 1e-9:
            fail(impl, prop, CHECK_SEQUENCE, case,
                 f"the server ignores `seed` or the sampling settings: {len(answers)} requests "
                 f"with distinct seeds all returned {[list(t) for t in first][:4]}"
                 f"{' ...' if len(first) > 4 else ''} (exact chance of this: {chance:.2g}). This "
                 f"is no statement about the law of speculative sampling; fix the seeding first.")
    result = statistics.chi_square_gof(observed, law)
    if not result.passed:
        mismatch = law_mismatch("the outputs", result, the_plan, len(law),
                                temperature=case.sampling.temperature, top_k=case.sampling.top_k,
                                top_p=case.sampling.top_p, L=case.max_tokens)
        where = where_off(observed, law)
        if where:
            mismatch = f"{mismatch}\noff {where}"
        if impl.baseline is not None:
            fail(impl, prop, CHECK_SEQUENCE, case,
                 _against_baseline(impl, case, law, observed, the_plan.n, mismatch, seeded))
        fail(impl, prop, CHECK_SEQUENCE, case, mismatch)
    return result


def _where_words(p_first: float, p_later: float) -> str:
    """The positions a law failure lies at, in the words known-failure entries match."""
    first_ok, later_ok = p_first >= statistics.ALPHA, p_later >= statistics.ALPHA
    return {(True, False): "in the tokens after the first only",
            (False, True): "in the first token only",
            (False, False): "in the first token and in the tokens after it",
            (True, True): "in the joint law only"}[first_ok, later_ok]


def where_off(observed: Counter, law: dict) -> str:
    """The failure's pattern by position, in words fit for a cause line ("" for one token);
    the numbers are statistics.by_position's (a description: no alpha is spent)."""
    split = statistics.by_position(observed, law)
    if not split:
        return ""
    p_first, p_later = split
    return (f"{_where_words(p_first, p_later)} (the first token, sampled by the prefill, against its exact marginal: "
            f"p = {p_first:.3g}; the tokens after it, verified under speculation, against their "
            f"exact laws given the first: p = {p_later:.3g})")


def where_off_two_sample(observed: Counter, base: Counter) -> str:
    """where_off without an exact law: the speculating server's samples against the baseline's,
    the first tokens' marginals and the later tokens given the first
    (statistics.two_sample_by_position). A description for the cause line, no alpha spent."""
    split = statistics.two_sample_by_position(observed, base)
    if not split:
        return ""
    p_first, p_later = split
    return (f"{_where_words(p_first, p_later)} (speculating vs baseline samples: the first tokens, p = {p_first:.3g}; the "
            f"tokens after them given the first, p = {p_later:.3g})")


def _against_baseline(impl, case, law, observed, n, mismatch, seeded=True) -> str:
    """The law failed: do the baseline server's samples (same engine, no speculation) fail it
    too? Then the engine's sampler differs from the convention, and speculation is judged
    against the engine's own sampler: statistics.two_sample_p_value, the test of
    chi_square_two_sample (two samples of n each: by lambda >= 2 n delta^2 it has the
    one-sample test's power at a deviation sqrt(2) times larger, TV ~ 0.21 at n = 557)."""
    try:
        answers = impl.baseline.complete_many(sampling_requests(impl.baseline, case, n,
                                                                seeded))
    except ServedError as exc:
        return f"{mismatch}\n(the baseline server could not be asked for comparison: {exc})"
    base = Counter(c.tokens for a in answers for c in a[:n])
    base_result = statistics.chi_square_gof(base, law)
    p_two = statistics.two_sample_p_value(observed, base)
    same = p_two >= statistics.ALPHA
    if base_result.passed:
        where = where_off(observed, law)
        return (f"speculation changes the law{' ' + where if where else ''}: the baseline "
                f"server ({impl.baseline.url}, the "
                f"same engine without speculation) samples the exact law (p = "
                f"{base_result.p_value:.3g}), the speculating server does not; speculating vs "
                f"baseline samples, two-sample chi-square: p = {p_two:.3g}\n{mismatch}")
    verdict = ("speculation exact relative to the engine's own sampler (two-sample chi-square "
               f"of speculating vs baseline samples: p = {p_two:.3g})" if same else
               f"speculation also changes the engine's own law (two-sample p = {p_two:.3g})")
    return (f"the engine's sampler differs from the convention (temperature, then top-k, then "
            f"top-p, as in reference.sampling): its baseline without speculation fails the same "
            f"exact-law check (p = {base_result.p_value:.3g}); {verdict}\n{mismatch}")


CHECK_SEED = f"{_MODULE}:check_seed"


def _probability(prompt, tokens, case: ServedCase) -> float:
    probs = case.sampling.probs(oracle.served_logits(prompt, tokens))
    return float(math.prod(float(probs[i, t]) for i, t in enumerate(tokens)))


def check_seed(impl, case: ServedCase):
    """Sequentially (a server may seed one global generator per request): seed s twice, then
    seed s + 1. Same seed, different outputs: `seed` is ignored (a failure would not replay).
    Different seeds, the same improbable output: the seed (or a fixed one) overrides sampling."""
    prop = "served_sequence: seed is honoured"
    first, = _complete(impl, prop, case, _request(case))
    again, = _complete(impl, prop, case, _request(case))
    seed = case.sampling.seed
    other, = _complete(impl, prop, case, _request(case, seed=seed + 1))
    if first.tokens != again.tokens:
        fail(impl, prop, CHECK_SEED, case,
             f"the server ignores `seed`{_baseline_seed(impl, case)}: two requests with "
             f"seed={seed}, one after the other, returned {list(first.tokens)} and "
             f"{list(again.tokens)}. Sampling checks stay valid (they need independent samples "
             f"only), but a failing example will not replay exactly.")
    chance = _probability(case.prompt, list(first.tokens), case)
    if other.tokens == first.tokens and chance < 1e-6:
        fail(impl, prop, CHECK_SEED, case,
             f"the server ignores `seed`: seeds {seed} and {seed + 1} both returned "
             f"{list(first.tokens)}, an output of exact probability {chance:.3g}")


def _baseline_seed(impl, case) -> str:
    """Whether the baseline server (no speculation) replays the same seed: the failure's
    pattern, in words for its cause line (a seed lost only under speculation is a defect of
    speculation; one the engine loses anyway is not)."""
    if impl.baseline is None:
        return " (no baseline server to compare with)"
    try:
        a, b = (impl.baseline.complete(_request(case))[0] for _ in range(2))
    except ServedError as exc:
        return f" (the baseline server could not be asked: {exc})"
    if a.tokens == b.tokens:
        return (" under speculation only (the baseline server, the same engine without "
                f"speculation, replays it: {list(a.tokens)} twice)")
    return (" with and without speculation (the baseline server does not replay it either: "
            f"{list(a.tokens)}, then {list(b.tokens)})")


def _complete(impl, prop, case, request):
    try:
        return speculation.send(impl, [request])[0][0]
    except ServedError as exc:
        fail(impl, prop, CHECK_SEED, case, f"the server failed a request: {exc}")


# --------------------------------------------------------------------------- bounds

CHECK_BOUNDS = f"{_MODULE}:check_bounds"
SAMPLED_BOUNDS_REQUESTS = 24


def check_bounds(impl, case: ServedCase):
    """Greedy: the output is the target's greedy output cut after its first stop id (which the
    strategy places inside the continuation, so inside blocks a speculator accepts). Sampled
    (temperature > 0): every output obeys max_tokens and the stops, and every token lies in the
    sampler's support (top-k / top-p included)."""
    prop = "served_bounds: max_tokens and stop ids"
    s = case.sampling
    if s.greedy:
        (served,), = _send(impl, prop, CHECK_BOUNDS, case, impl.client, [_request(case)])
        outputs = [served]
    else:
        answers = _send(impl, prop, CHECK_BOUNDS, case, impl.client,
                        sampling_requests(impl.client, case, SAMPLED_BOUNDS_REQUESTS))
        outputs = [c for a in answers for c in a]
    for c in outputs:
        problem = bounds_violation(case, c)
        if problem:
            expected = oracle.served_greedy(case.prompt, case.max_tokens, s.stop_ids)
            fail(impl, prop, CHECK_BOUNDS, case,
                 f"{problem}\nserved: {list(c.tokens)}\n" +
                 (f"target's greedy (cut at the first stop): {expected}" if s.greedy else ""))
        if s.greedy:
            bad = greedy_divergence(case.prompt, c.tokens, impl.logit_tolerance)
            if bad is not None:
                fail(impl, prop, CHECK_BOUNDS, case,
                     f"position {bad[0]}: served token {bad[1]}, the target's argmax is {bad[2]}"
                     f"\nserved: {list(c.tokens)}")
        else:
            rows = s.probs(oracle.served_logits(case.prompt, c.tokens))
            for i, t in enumerate(c.tokens):
                if rows[i, t] == 0:
                    fail(impl, prop, CHECK_BOUNDS, case,
                         f"position {i}: token {t} has probability 0 under the sampler "
                         f"(top_k={s.top_k}, top_p={s.top_p})\nserved: {list(c.tokens)}")


# --------------------------------------------------------------------------- counters

CHECK_COUNTERS = f"{_MODULE}:check_counters"


def engine_counts(impl, request: Request):
    """(drafted, accepted, completion) the engine reports for one request sent alone, read by
    its dialect (the difference of its server-wide counters around it, or its response's
    draft statistics)."""
    client = impl.client
    counted = client.dialect.count(client, [request])
    if counted is None:
        raise BadResponse(f"{client.url}: the engine reports no speculation counters")
    (completion,), = counted.answers
    return counted.drafted, counted.accepted, completion


def _replay(case, completion, impl, schedule, draft=None):
    """The exact counters of the request, summed over its pieces when the client assembled the
    completion from several requests (each piece a request of its own from the prefix); `draft`:
    the served model that drafts (default: the method's drafter's)."""
    pieces = completion.pieces or (case.max_tokens,)
    drafts = drafted = accepted = 0
    done = 0
    for length in pieces:
        e = acceptance.greedy(tuple(case.prompt) + tuple(completion.tokens[:done]),
                              case.max_tokens - done,
                              draft or methods.exact_draft(impl.method.drafter), impl.k,
                              schedule,
                              produced=length,
                              eos_stops_acceptance=impl.client.dialect.eos_stops_acceptance)
        drafts, drafted, accepted = drafts + e.drafts, drafted + e.drafted, accepted + e.accepted
        done += length
    return acceptance.Expected(drafts, drafted, accepted)


def _expected_counts(case, completion, impl, draft=None) -> dict:
    """schedule -> the exact replay, for the engine's declared schedule (both when unknown)."""
    schedules = (impl.schedule,) if impl.schedule else acceptance.SCHEDULES
    return {s: _replay(case, completion, impl, s, draft) for s in schedules}


def check_counters(impl, case: ServedCase):
    """Greedy requests one at a time: the engine's own counters (drafted, accepted) equal the
    acceptance the kit replays exactly from its models for the same request."""
    prop = "served_counters: the engine's speculation counters equal the exact acceptance"
    case = case.replace(temperature=0.0, top_k=0, top_p=1.0, stop_ids=())
    try:
        drafted, accepted, completion = engine_counts(impl, _request(case))
    except ServedError as exc:
        fail(impl, prop, CHECK_COUNTERS, case, f"cannot read the engine's counters: {exc}")
    expected = _expected_counts(case, completion, impl)
    evidence.served_acceptance(next(iter(expected.values())), drafted, accepted, impl.k)
    if accepted > drafted:
        fail(impl, prop, CHECK_COUNTERS, case,
             f"{accepted:g} tokens accepted of {drafted:g} drafted: more than were proposed")
    if any((drafted, accepted) == (e.drafted, e.accepted) for e in expected.values()):
        return
    shown = "; ".join(f"{s} schedule: {e.drafted} drafted, {e.accepted} accepted in {e.drafts} "
                      f"rounds" for s, e in expected.items())
    fail(impl, prop, CHECK_COUNTERS, case,
         f"the engine reports {drafted:g} drafted and {accepted:g} accepted tokens for this "
         f"request, {counts_pattern(drafted, accepted, expected.values())}; the exact replay of "
         f"its draft ({impl.method.drafter.describe()}, k={impl.k}) gives {shown}\n"
         f"served: {list(completion.tokens)}")


def counts_pattern(drafted, accepted, expected) -> str:
    """The counter failure's pattern for its cause line, e.g. "fewer drafted and fewer accepted
    than the exact replay": the direction of each count against the declared schedule's replay
    (undeclared: the replays nearest the counts; "other" where two of them disagree), so that a
    known-failures entry can name a defect's signature (a round left out of the counts) without
    matching any other counter defect."""
    def way(seen, wanted):
        signs = {(seen > w) - (seen < w) for w in wanted}
        return {-1: "fewer", 0: "as many", 1: "more"}[signs.pop()] if len(signs) == 1 else "other"
    # an engine whose schedule is not declared is compared with the replay nearest its counts
    expected = list(expected)
    gap = lambda e: (abs(drafted - e.drafted), abs(accepted - e.accepted))
    expected = [e for e in expected if gap(e) == min(map(gap, expected))]
    return (f"{way(drafted, [e.drafted for e in expected])} drafted and "
            f"{way(accepted, [e.accepted for e in expected])} accepted than the exact replay")


# --------------------------------------------------------------------------- perfect draft

CHECK_PERFECT_DRAFT = f"{_MODULE}:check_perfect_draft"


def count_direction(count, expected) -> str:
    """How a reported count misses every expected one: the direction is part of a defect's
    signature (a count that leaves rounds out is fewer; one that counts a round twice, or one
    never verified, is more), so a known-failures entry can name it."""
    return ("fewer than" if count < min(expected) else
            "more than" if count > max(expected) else "not")


def check_perfect_draft(impl, case: ServedCase):
    """With the target drafting for itself, the engine's own counters must show every drafted
    token accepted, request by request, and as many drafted as the exact replay proposes."""
    prop = "served_perfect_draft: every proposal of a perfect draft is accepted"
    case = case.replace(temperature=0.0, top_k=0, top_p=1.0, stop_ids=())
    try:
        drafted, accepted, completion = engine_counts(impl, _request(case))
    except ServedError as exc:
        fail(impl, prop, CHECK_PERFECT_DRAFT, case, f"cannot read the acceptance counters: {exc}")
    expected = _expected_counts(case, completion, impl, methods.PERFECT.model)
    # a short request may leave no room to draft (the "capped" schedule at max_tokens 2)
    if drafted <= 0 and all(e.drafted > 0 for e in expected.values()):
        fail(impl, prop, CHECK_PERFECT_DRAFT, case,
             f"the server drafted no token for a request of {case.max_tokens} tokens: is "
             f"speculation on?")
    # every proposal accepted, but where the exact replay itself leaves some (an engine that
    # accepts none after an end of sequence inside a round: acceptance.replay)
    if accepted != drafted and not any((e.drafted, e.accepted) == (drafted, accepted)
                                       for e in expected.values()):
        fail(impl, prop, CHECK_PERFECT_DRAFT, case,
             f"{accepted:g} of {drafted:g} drafted tokens accepted (rate "
             f"{accepted / max(drafted, 1):.4f}); a draft identical to the target must be "
             f"accepted at rate 1")
    if not any(drafted == e.drafted for e in expected.values()):
        shown = "; ".join(f"{s} schedule: {e.drafted} in {e.drafts} rounds"
                          for s, e in expected.items())
        direction = count_direction(drafted, [e.drafted for e in expected.values()])
        fail(impl, prop, CHECK_PERFECT_DRAFT, case,
             f"{drafted:g} tokens drafted for this request, {direction} what a perfect draft "
             f"proposing k={impl.k} per round drafts ({shown})")
