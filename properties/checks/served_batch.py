"""Family "served_batch": a request answered inside a concurrent batch is answered as alone.

A serving engine runs the requests in flight together, as one batch: the rows of different
requests share forwards, kernels chosen by batch shape, a sampler and its random state. None
of that may change what a request gets back. Production engines break exactly there: seeded
sampled speculation that is not batch-invariant (vLLM PR #52522), forward passes over 1 and
over k + 1 tokens that are not bit-identical (vLLM RFC #54506), batches that mix greedy and
sampled rows. The kit's other served families send their requests one by one or as identical
copies; these checks compare a request answered alone with the same request answered inside
a ragged, mixed batch.

    check_batch_greedy        each greedy request of a batch: alone == inside the batch (float64
                              ties within impl.logit_tolerance aside), and both are the target's
                              greedy output (tie-aware)
    check_batch_independence  pairs of unseeded sampled requests in flight together: the joint law
                              of (output a, output b) is the product of their two exact laws
                              (chi-square at ALPHA; TV >= DELTA_BATCH detected with power POWER)
    check_batch_seed          a seeded sampled request gives the same output alone and inside a
                              batch, wherever the baseline server (no speculation) does so

A batch is a tuple of ServedCase, the requests in order. A ServedCase always carries a seed (0
when none is given), so a sampled row that is to go without one says seed=UNSEEDED (-1). A
batch goes to the server through one complete_many call: the client submits every request at
once (at most client.concurrency are in flight, so a batch is never larger than that), and an
engine batches what is in flight.
"Alone" is one request at a time with nothing else in flight. A check's requests go in groups,
one after the other (InGroups), through one speculation.send: one example, one record of what
the engine drafted for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from properties import oracle, speculation, statistics
from properties.adapters.protocol import Request, ServedError
from properties.cases import ServedCase
from properties.checks.served import bounds_violation, greedy_divergence
from properties.harness import fail, first_difference

# The design deviation of the independence check: total variation >= DELTA_BATCH in the joint
# law of a pair of concurrent outputs is detected with power POWER at level ALPHA. Rows that
# share their random state (the same uniforms for two requests) move the pair's law far more:
# on the kit's target at temperature 1 and L = 2, by TV 0.3 to 0.6 (a shared uniform per draw).
DELTA_BATCH = 0.2
# The seed of a batch row that is sent without a seed (the server draws its own randomness).
UNSEEDED = -1
# The smallest batch the kit calls concurrent: enough rows to mix greedy and sampled requests of
# different lengths in one batch.
MIN_BATCH = 4

_MODULE = "properties.checks.served_batch"
CHECK_GREEDY = f"{_MODULE}:check_batch_greedy"
CHECK_INDEPENDENCE = f"{_MODULE}:check_batch_independence"
CHECK_SEED = f"{_MODULE}:check_batch_seed"


# --------------------------------------------------------------------------- batches

def validate_batch(batch, client, what: str = "batch", smallest: int = MIN_BATCH) -> None:
    """ValueError, naming the argument, unless `batch` is a tuple of `smallest` or more
    ServedCases with n = 1 that `client` can have in flight all at once."""
    if not isinstance(batch, tuple) or not all(isinstance(c, ServedCase) for c in batch):
        raise ValueError(f"{what} must be a tuple of ServedCase (the requests of one batch), "
                         f"got {batch!r}")
    if len(batch) < smallest:
        raise ValueError(f"{what} has {len(batch)} requests; a concurrent batch needs at least "
                         f"{smallest}")
    if len(batch) > client.concurrency:
        raise ValueError(f"{what} has {len(batch)} requests, but the client keeps at most "
                         f"concurrency={client.concurrency} in flight (--served-concurrency): "
                         f"they would not all be in flight together")
    many = [i for i, c in enumerate(batch) if c.sampling.n != 1]
    if many:
        raise ValueError(f"{what}: request #{many[0]} asks for n={batch[many[0]].sampling.n} "
                         f"completions; each row of a batch is one completion (n=1)")


def _request(case: ServedCase, with_seed: bool = True) -> Request:
    """The row as a request: without a seed where it says UNSEEDED (or `with_seed` is False)."""
    s = case.sampling
    if s.seed == UNSEEDED or not with_seed:
        s = replace(s, seed=None)
    return Request(tuple(case.prompt), case.max_tokens, s)


def seeded(case: ServedCase) -> bool:
    """A sampled row sent with its seed."""
    return not case.sampling.greedy and case.sampling.seed not in (None, UNSEEDED)


def row(case: ServedCase, seed: bool = True) -> str:
    """One request of a batch, in words (`seed` False: it is sent unseeded, whatever it says)."""
    s = case.sampling
    if s.greedy:
        how = "greedy"
    else:
        how = f"sampled temperature={s.temperature:g}"
        how += f" top_k={s.top_k}" if s.top_k else ""
        how += f" top_p={s.top_p:g}" if s.top_p < 1 else ""
        how += f" seed={s.seed}" if seed and seeded(case) else " unseeded"
    stops = f", stop ids {list(s.stop_ids)}" if s.stop_ids else ""
    tokens = f"{len(case.prompt)} token{'s' if len(case.prompt) != 1 else ''}"
    return f"{how}, prompt {list(case.prompt)} ({tokens}), max_tokens={case.max_tokens}{stops}"


def describe(batch) -> str:
    """The batch's composition, one request a line."""
    return "\n".join(f"  #{i}: {row(c)}" for i, c in enumerate(batch))


class InGroups:
    """A view of a client that sends a list of requests in consecutive groups: every request of
    a group at once (in flight together, a group being no larger than the client's
    concurrency), and nothing of the next group before the group is answered. A group of one is
    a request answered alone. One view serves one check's requests, so what the engine drafted
    for them is read once (speculation.send) and the test counts one example."""

    def __init__(self, client, sizes):
        if any(size < 1 or size > client.concurrency for size in sizes):
            raise ValueError(f"sizes {list(sizes)}: each group must hold 1 to "
                             f"concurrency={client.concurrency} requests")
        self._client, self.sizes = client, list(sizes)

    def __getattr__(self, name):   # url, dialect, counters, traffic: the client's own
        return getattr(self._client, name)

    def complete_many(self, requests):
        if len(requests) != sum(self.sizes):
            raise ValueError(f"{len(requests)} requests for groups of {self.sizes}")
        answers, at = [], 0
        for size in self.sizes:
            answers += self._client.complete_many(requests[at:at + size])
            at += size
        return answers


def _speculating(impl, prop, check, case, groups):
    """`groups`: lists of requests, sent group after group (each all at once) to the
    speculating server through speculation.send (what it drafted is recorded for the test, one
    example); the completions, one per request, in order."""
    requests = [r for g in groups for r in g]
    try:
        answers, _ = speculation.send(impl, requests,
                                      client=InGroups(impl.client, [len(g) for g in groups]))
    except ServedError as exc:
        fail(impl, prop, check, case, f"the server failed a request: {exc}")
    return [a[0] for a in answers]


def _baseline(impl, prop, check, case, groups):
    requests = [r for g in groups for r in g]
    try:
        answers = InGroups(impl.baseline, [len(g) for g in groups]).complete_many(requests)
    except ServedError as exc:
        fail(impl, prop, check, case, f"the baseline server ({impl.baseline.url}) failed a "
                                      f"request: {exc}")
    return [a[0] for a in answers]


def _alone_then_batch(send, impl, prop, check, batch, judged, requests):
    """(alone, inside): the judged rows sent one at a time, then the whole batch at once."""
    outs = send(impl, prop, check, batch, [[requests[i]] for i in judged] + [requests])
    return outs[:len(judged)], outs[len(judged):]


# --------------------------------------------------------------------------- greedy

def _parting(prompt, a, b, at: int, tolerance: float) -> str | None:
    """None when the outputs a and b first differ at `at` on a float64 tie (their two tokens'
    logits within `tolerance`), else how they part, in words."""
    if at >= len(a) or at >= len(b):
        return (f"differs in length ({len(a)} tokens alone, {len(b)} inside the batch), one "
                f"output a prefix of the other")
    logits = oracle.served_logits(prompt, list(a[:at]) + [0])[-1]
    x, y = a[at], b[at]
    if not (0 <= x < logits.numel() and 0 <= y < logits.numel()):
        return f"differs at position {at}, with a token outside the vocabulary"
    gap = abs(float(logits[x] - logits[y]))
    if gap <= tolerance:
        return None
    return (f"differs at position {at}, which is no tie (float64 logit gap {gap:.4g} between "
            f"tokens {x} and {y} > {tolerance:g})")


def check_batch_greedy(impl, batch: tuple):
    """Every greedy request of `batch` (a tuple of ServedCase mixing greedy and sampled rows of
    different prompt lengths and max_tokens) is sent alone, one at a time; then the whole batch
    at once. Each greedy row's two outputs must be equal, unless they part on a float64 tie
    (then each continues as a greedy decoder may), and each must be the target's greedy output,
    tie-aware, within its max_tokens and stops. Requests: the batch plus one per greedy row."""
    prop = "served_batch: a greedy request answered inside a concurrent batch equals it alone"
    validate_batch(batch, impl.client)
    greedy = [i for i, c in enumerate(batch) if c.sampling.greedy]
    if not greedy:
        raise ValueError(f"batch has no greedy request (temperature 0) to judge: {batch!r}")
    tol = impl.logit_tolerance
    requests = [_request(c) for c in batch]
    solo, inside = _alone_then_batch(_speculating, impl, prop, CHECK_GREEDY, batch, greedy,
                                     requests)
    composition = (f"the batch ({len(batch)} requests sent at once, all in flight together):\n"
                   f"{describe(batch)}")
    # Batch invariance first: a row that moves with its batch is the finding, whatever else.
    for i, a in zip(greedy, solo):
        b, case = inside[i], batch[i]
        if a.tokens == b.tokens:
            continue
        how = _parting(case.prompt, a.tokens, b.tokens, first_difference(a.tokens, b.tokens), tol)
        if how is None:
            continue  # a rounding tie between the two runs: each is judged against the target below
        expected = oracle.served_greedy(case.prompt, case.max_tokens, case.sampling.stop_ids)
        fail(impl, prop, CHECK_GREEDY, batch,
             f"request #{i} ({row(case)}) answered alone and inside a concurrent batch {how}\n"
             f"alone:            {list(a.tokens)}\ninside the batch: {list(b.tokens)}\n"
             f"target's greedy:  {expected}\n{composition}")
    for i, a in zip(greedy, solo):
        case = batch[i]
        for where, c in (("alone", a), ("inside the batch", inside[i])):
            problem = bounds_violation(case, c)
            bad = None if problem else greedy_divergence(case.prompt, c.tokens, tol)
            if problem is None and bad is None:
                continue
            expected = oracle.served_greedy(case.prompt, case.max_tokens, case.sampling.stop_ids)
            what = problem or (f"position {bad[0]}: served token {bad[1]}, but the target's "
                               f"argmax there is {bad[2]}, {bad[3]:.4g} logits higher (ties are "
                               f"gaps <= {tol:g})")
            fail(impl, prop, CHECK_GREEDY, batch,
                 f"request #{i} ({row(case)}) answered {where}: {what}\nserved:          "
                 f"{list(c.tokens)}\ntarget's greedy: {expected}\n{composition}")


# --------------------------------------------------------------------------- independence

def _product(law_a: dict, law_b: dict) -> dict:
    """The law of a pair (a, b) of independent outputs: P(a) P(b)."""
    return {(x, y): p * q for x, p in law_a.items() for y, q in law_b.items()}


def _law(case: ServedCase) -> dict:
    s = case.sampling
    return oracle.served_law(case.prompt, case.max_tokens, s.temperature, s.top_k, s.top_p,
                             s.stop_ids)


def _together(counts: Counter, law_a: dict, law_b: dict) -> str:
    """How often both rows gave their most likely output, against independence; and each row's
    own frequency of it (a right marginal with a wrong pair law: the rows move together)."""
    mode_a, mode_b = max(law_a, key=law_a.get), max(law_b, key=law_b.get)
    n = sum(counts.values())
    both = sum(c for (x, y), c in counts.items() if x == mode_a and y == mode_b)
    fa = sum(c for (x, _), c in counts.items() if x == mode_a) / n
    fb = sum(c for (_, y), c in counts.items() if y == mode_b) / n
    pa, pb = law_a[mode_a], law_b[mode_b]
    return (f"both rows gave their most likely output ({list(mode_a)}, {list(mode_b)}) in {both} "
            f"of {n} pairs ({both / n:.3f}); independent rows do so with probability "
            f"{pa * pb:.3f}. Each row alone: {fa:.3f} (exact {pa:.3f}) and {fb:.3f} (exact "
            f"{pb:.3f})\n")


def _which(pairs: list, per_call: int, law_a: dict, law_b: dict) -> str:
    """The failure's pattern for its cause line: a pair's law is not the product of the exact
    laws because the requests of one call repeat each other (they share a generator: dependence
    among all of them), or because a row's own law is off (a law defect, which served_sequence
    judges alone), or because the rows move together although each is right (dependence). The
    repeats come first: rows that repeat each other also make their pooled marginal look off
    (a few draws counted several times), although each draw is right. Descriptions (chi-square
    and binomial p-values), no further check. `pairs`: (output a, output b) in the order sent,
    per_call pairs to a call."""
    from scipy.stats import binom
    dependent = ("pairs (request a, request b) answered concurrently are not distributed as two "
                 "independent samples")
    calls = [pairs[i:i + per_call] for i in range(0, len(pairs), per_call)]
    calls = [c for c in calls if len(c) == per_call]
    if per_call >= 2 and calls:
        same = sum(len({x for x, _ in c}) == 1 for c in calls)
        # chance from the a-rows' observed frequencies, not the exact law: a law defect that
        # concentrates the rows' outputs repeats them too, and is no dependence
        seen = Counter(x for x, _ in pairs)
        chance = sum((c / len(pairs)) ** per_call for c in seen.values())
        p = float(binom.sf(same - 1, len(calls), chance))
        if p < statistics.ALPHA:
            return (f"{dependent} (the requests of one call repeat each other: in {same} of "
                    f"{len(calls)} calls the {per_call} a-rows all gave one output, where rows "
                    f"drawn independently from their observed frequencies would in "
                    f"{chance * len(calls):.1f}, p = {p:.3g})")
    off = []
    for name, index, law in (("a", 0, law_a), ("b", 1, law_b)):
        # the test served_sequence runs on a row's law (0 where a row gave an impossible output)
        p = statistics.gof_p_value(Counter(pair[index] for pair in pairs), law)
        if p < statistics.ALPHA:
            off.append(f"{name} (p = {p:.3g})")
    if off:
        return (f"pairs answered concurrently are not distributed as the product of the two "
                f"exact laws because a row's own law is off: {', '.join(off)} (a law defect, "
                f"not shown to be dependence)")
    return f"{dependent} (each row's own law holds; the rows move together)"


def check_batch_independence(impl, pair: tuple, delta: float = DELTA_BATCH):
    """`pair`: two sampled requests (ServedCase), always sent without a seed (independence is a
    claim about the server's own randomness; the cases' seeds are not used). Pairs of them are
    sent concurrently, concurrency // 2 pairs per group (so every pair's two requests are in
    flight together, with other pairs beside them); the joint law of (output a,
    output b) is tested against the product of the two exact laws: chi-square at ALPHA, TV >=
    `delta` detected with power POWER, n pairs from statistics.plan. Requests: 2 n."""
    prop = "served_batch: concurrent sampled requests are independent samples"
    validate_batch(pair, impl.client, "pair", smallest=2)
    if len(pair) != 2:
        raise ValueError(f"pair must hold two requests, got {len(pair)}: {pair!r}")
    for name, c in zip("ab", pair):
        if c.sampling.greedy:
            raise ValueError(f"pair: request {name} must be sampled (temperature > 0), got "
                             f"{c.sampling!r}")
    a, b = pair
    law_a, law_b = _law(a), _law(b)
    joint = _product(law_a, law_b)
    the_plan = statistics.plan(list(joint.values()), delta)
    per_call = impl.client.concurrency // 2
    requests = [_request(a, with_seed=False), _request(b, with_seed=False)]
    groups = [requests * min(per_call, the_plan.n - done)
              for done in range(0, the_plan.n, per_call)]
    outs = _speculating(impl, prop, CHECK_INDEPENDENCE, pair, groups)
    pairs = list(zip((c.tokens for c in outs[0::2]), (c.tokens for c in outs[1::2])))
    observed = Counter(pairs)
    result = statistics.chi_square_gof(observed, joint)
    if not result.passed:
        known = all(x in law_a and y in law_b for x, y in observed)
        fail(impl, prop, CHECK_INDEPENDENCE, pair,
             f"{_which(pairs, per_call, law_a, law_b)}:\n  a: {row(a, False)}\n"
             f"  b: {row(b, False)}\n{_together(observed, law_a, law_b) if known else ''}"
             f"{result.summary()}\n(sample plan: {the_plan.describe()}; {len(joint)} possible "
             f"pairs; {per_call} pairs in flight per call)")
    return result


# --------------------------------------------------------------------------- seeds

def _moved(judged, solo, inside) -> list:
    """(request index, alone, inside) for each judged row whose two outputs differ."""
    return [(i, a, inside[i]) for i, a in zip(judged, solo) if a.tokens != inside[i].tokens]


def _shown(batch, moved) -> str:
    return "\n".join(f"request #{i} (seed {batch[i].sampling.seed}): alone {list(a.tokens)}, "
                     f"inside the batch {list(b.tokens)}" for i, a, b in moved)


# Times a moved row is asked alone again before its move is blamed on the batch.
ALONE_REPEATS = 4


def check_batch_seed(impl, batch: tuple):
    """Every seeded sampled request of `batch` is sent alone, one at a time, then the batch at
    once: each must give the same output both ways. The baseline server (the same model without
    speculation) is asked first, the same way: where it does not keep its seeds across a batch
    either, the example is not applicable (a seed's output is then the engine's sampler's, not
    speculation's). Without a baseline the speculating server is judged alone, and the message
    says so. Requests: (batch + seeded rows) on each server, up to ALONE_REPEATS more per moved
    row on a failure."""
    prop = "served_batch: a seeded request gives the same output inside a concurrent batch"
    validate_batch(batch, impl.client)
    judged = [i for i, c in enumerate(batch) if seeded(c)]
    if not judged:
        raise ValueError(f"batch has no seeded sampled request (temperature > 0, a seed >= 0) "
                         f"to judge: {batch!r}")
    requests = [_request(c) for c in batch]
    composition = (f"the batch ({len(batch)} requests sent at once, all in flight together):\n"
                   f"{describe(batch)}")
    if impl.baseline is not None:
        base_solo, base_inside = _alone_then_batch(_baseline, impl, prop, CHECK_SEED, batch,
                                                   judged, requests)
        moved = _moved(judged, base_solo, base_inside)
        if moved:
            pytest.skip(f"not applicable: the baseline server itself ({impl.baseline.url}, the "
                        f"same model without speculation) does not keep a seed across batching, "
                        f"so a seeded output inside a batch is not speculation's to keep:\n"
                        f"{_shown(batch, moved)}\n{composition}")
        basis = (f"the baseline server ({impl.baseline.url}, the same model without "
                 f"speculation) keeps every seed of this batch, alone and inside it")
    else:
        basis = ("no baseline server was given (--baseline=URL): the speculating server is "
                 "judged alone, so the engine's own sampler (not speculation) may be the cause")
    solo, inside = _alone_then_batch(_speculating, impl, prop, CHECK_SEED, batch, judged,
                                     requests)
    moved = _moved(judged, solo, inside)
    if not moved:
        return
    # Before blaming the batch, each moved row is asked alone again, several times: a server
    # that ignores a seed altogether can repeat a short, low-entropy output by chance once (two
    # tokens at a low temperature), and that is the seed check's defect, not batching's.
    for i, a, b in moved:
        for _ in range(ALONE_REPEATS):
            again, = _speculating(impl, prop, CHECK_SEED, batch, [[requests[i]]])
            if again.tokens != a.tokens:
                fail(impl, prop, CHECK_SEED, batch,
                     f"the server does not keep `seed` even for a request answered alone: "
                     f"request #{i} ({row(batch[i])}) gave {list(a.tokens)}, then "
                     f"{list(again.tokens)}, each alone (served_sequence's seed check reports "
                     f"this; it is not specific to batching)\ninside the batch: "
                     f"{list(b.tokens)}\n{composition}")
    i, a, b = moved[0]
    fail(impl, prop, CHECK_SEED, batch,
         f"a seeded request's output depends on the batch it lands in: request #{i} "
         f"({row(batch[i])}) gave {list(a.tokens)} alone ({ALONE_REPEATS + 1} times) and "
         f"{list(b.tokens)} inside the concurrent batch; {basis}\n{_shown(batch, moved)}\n"
         f"{composition}")
