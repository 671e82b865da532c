"""The sampling parameters people send, under speculation (family "served_params").

Each parameter has broken under speculation somewhere: a repetition penalty whose history took
in rejected drafts, a draft sampled from processed logits but verified against raw ones, a
verifier that took the argmax whatever the temperature. So each is judged as the served
families judge temperature, top-k and top-p, against the float64 target processed by the
*engine's formula* (each engine file's FORMULA, read through properties/formulas.py: the order of operations and which history each
penalty sees, read from the engine's source):

    check_greedy        temperature 0 with penalties or a logit bias: each token is the exact
                        argmax of the adjusted logits (ties within the tolerance aside), and
                        the output equals the baseline's (the same engine without speculation)
    check_law           sampled: chi-square against the exact law of the first L tokens under
                        the formula (alpha ALPHA, power POWER at TV DELTA_SERVED); where the kit
                        knows no formula, a two-sample test against the baseline's samples
    check_law_rounds    check_law over outputs of L >= ROUNDS_MIN_LENGTH tokens, long enough to
                        hold a round, a rejection in it and the round after it: state that
                        carries from one round to the next (the penalty history, the sampler's
                        generator) shows only there; a failure names the first position where
                        the law breaks (statistics.positions)
    check_logprobs      each returned logprob of a generated token (and of each alternative) is
                        the float64 target's log-softmax there (raw logits, as the engines
                        document) within LOGPROB_TOLERANCE, and equals the baseline's
    check_stop_strings  a multi-token stop string inside an accepted block ends the output
                        exactly where it completes (its tokens kept, or cut, as the engine
                        documents), the text cut as documented
    check_n             the n completions of one request: each exactly distributed, and pairs
                        within a request distributed as the product law (independent)

A parameter the engine refuses (HTTP 4xx) or that its API cannot carry is skipped as "not
supported: ..."; a 5xx or a server death is a failure.

What the kit knows, per engine and parameter (F: exact formula from the engine's source,
R: refused under speculation (a skip), U: not in the engine's API (the kit sends nothing, a
skip), 2: two-sample against the baseline; any engine not named (SGLang, an unknown OpenAI
server): 2, its stop strings and logprobs judged as the OpenAI API defines them):

    parameter            vLLM 0.32   llama.cpp   transformers serve   fake (OpenAI formula)
    repetition_penalty   F           F           F                    F
    presence_penalty     F           F           U                    F
    frequency_penalty    F           F           U                    F
    min_p                R           F           F                    F
    logit_bias           R           F           F (sequence_bias)    F
    stop strings         F           F           F                    F
    n > 1                F           U (n = 1)   U (n = 1)            F
    logprobs (raw)       F           F (*)       U                    F

(*) read from completion_probabilities by LlamaCpp.read_choice; LlamaCpp.complete assembles
the final Completion and must carry `logprobs` (and `text`) through, else the test is skipped
as "returns no logprobs".
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch

from properties import formulas, oracle, speculation, statistics
from properties.adapters.protocol import HttpError, Request, ServedError
from properties.cases import ServedCase
from properties.checks.served import (DELTA_SERVED, bounds_violation, sampling_requests,
                                      where_off, where_off_two_sample)
from properties.harness import fail, law_mismatch
from properties.models import tokenizer

_MODULE = "properties.checks.served_params"
# Logprobs from a float32 server against the float64 log-softmax: float32 forwards of the kit's
# target agree with float64 to ~1e-5 in the logits; 1e-3 absolute leaves room for any
# float32 log-softmax while a draft's logprobs or processed ones miss by far more.
LOGPROB_TOLERANCE = 1e-3
# The design deviation of a pair of completions of one request against the product law.
DELTA_PAIR = 0.2
# The shortest output check_law_rounds judges: the prefill's token, a round whose first
# proposal may be rejected (position 1), and the round after it (position 2). An engine's round
# of k proposals reaches the next round within the output after any rejection at positions
# 1 .. L - 2.
ROUNDS_MIN_LENGTH = 3
# A position is named as where the law breaks when its tokens, given those before them, are off
# at p below this (a description of a failed check: on a correct engine each position crosses it
# with probability 1e-3; the check itself is decided at ALPHA).
BREAK_P = 1e-3


# --------------------------------------------------------------------------- helpers

def dialect(impl):
    impl.client.resolve()
    return impl.client.dialect


def engine(impl) -> str:
    return dialect(impl).name


def asked(params) -> str:
    """The non-default parameters of a request besides temperature, top-k, top-p and seed."""
    names = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p",
             "logit_bias", "stop_strings", "logprobs", "n")
    shown = [f"{name}={getattr(params, name)!r}" for name in names
             if getattr(params, name) != type(params).__dataclass_fields__[name].default]
    return ", ".join(shown) or "no parameter"


def _skip_unsupported(impl, params) -> None:
    reason = formulas.unsupported(dialect(impl), params)
    if reason:
        pytest.skip(f"not supported: {reason}")


def _refused(impl, exc: HttpError, params, role="") -> None:
    pytest.skip(f"not supported: {engine(impl)}{role} refuses {asked(params)}: {exc}")


def send(impl, prop, check, case, requests):
    """The judged requests, through speculation.send (what the engine drafted is recorded);
    a 4xx is the engine refusing the parameter (a skip), anything else a failure."""
    try:
        answers, _ = speculation.send(impl, requests)
        return answers
    except HttpError as exc:
        if 400 <= exc.status < 500:
            _refused(impl, exc, requests[0].sampling)
        fail(impl, prop, check, case, f"the server failed a request: {exc}")
    except ServedError as exc:
        fail(impl, prop, check, case, f"the server failed a request: {exc}")


def send_baseline(impl, prop, check, case, requests):
    try:
        return impl.baseline.complete_many(requests)
    except HttpError as exc:
        if 400 <= exc.status < 500:
            _refused(impl, exc, requests[0].sampling, " (its baseline, without speculation)")
        fail(impl, prop, check, case, f"the baseline server failed a request: {exc}")
    except ServedError as exc:
        fail(impl, prop, check, case, f"the baseline server failed a request: {exc}")


def _request(case: ServedCase, **changes) -> Request:
    return Request(tuple(case.prompt), case.max_tokens, replace(case.sampling, **changes))


def adjusted_divergence(case: ServedCase, tokens, formula, tolerance: float):
    """None if every token is the argmax of the adjusted logits (after the bias and the
    penalties, with its own history) within `tolerance`, else (position, token, argmax, gap)."""
    rows = oracle.served_logits(case.prompt, tokens)
    for i, token in enumerate(tokens):
        row = formula.adjusted(rows[i], tuple(case.prompt), tuple(tokens[:i]), case.sampling)
        if not 0 <= token < row.numel():
            return i, token, int(row.argmax()), math.inf
        best = int(row.argmax())
        gap = float(row[best] - row[token])
        if gap > tolerance:
            return i, token, best, gap
    return None


def _law(case: ServedCase, formula):
    s = case.sampling
    return oracle.served_law(case.prompt, case.max_tokens, s.temperature, s.top_k, s.top_p,
                             s.stop_ids, params=s, formula=formula)


# --------------------------------------------------------------------------- greedy

CHECK_GREEDY = f"{_MODULE}:check_greedy"


def check_greedy(impl, case: ServedCase):
    """Temperature 0 with penalties or a logit bias (they move the argmax)."""
    prop = "served_params: greedy output under penalties or a logit bias"
    case = case.replace(temperature=0.0, top_k=0, top_p=1.0)
    _skip_unsupported(impl, case.sampling)
    formula = formulas.for_dialect(dialect(impl))
    tol = impl.logit_tolerance
    (served,), = send(impl, prop, CHECK_GREEDY, case, [_request(case)])
    problem = bounds_violation(case, served)
    if problem:
        fail(impl, prop, CHECK_GREEDY, case, f"{problem}\nserved: {list(served.tokens)}")
    if formula is None and impl.baseline is None:
        pytest.skip(f"cannot judge: the kit knows no formula of {engine(impl)} for "
                    f"{asked(case.sampling)} and there is no baseline server to compare with")
    if formula is not None:
        bad = adjusted_divergence(case, served.tokens, formula, tol)
        if bad is not None:
            i, token, best, gap = bad
            expected = oracle.served_greedy(case.prompt, case.max_tokens, case.sampling.stop_ids,
                                            case.sampling, formula)
            fail(impl, prop, CHECK_GREEDY, case,
                 f"position {i}: served token {token}, but the argmax of the target's logits "
                 f"after {asked(case.sampling)} ({formula.name} formula, the history so far) "
                 f"is {best}, {gap:.4g} higher (ties are gaps <= {tol:g})\nserved:   "
                 f"{list(served.tokens)}\nexpected: {expected}")
    if impl.baseline is None:
        return
    (base,), = send_baseline(impl, prop, CHECK_GREEDY, case, [_request(case)])
    if base.tokens == served.tokens:
        return
    i = next((j for j, (a, b) in enumerate(zip(served.tokens, base.tokens)) if a != b),
             min(len(served.tokens), len(base.tokens)))
    if formula is not None and i < min(len(served.tokens), len(base.tokens)):
        prefix = tuple(served.tokens[:i])
        row = oracle.served_logits(case.prompt, list(prefix) + [0])[-1]
        row = formula.adjusted(row, tuple(case.prompt), prefix, case.sampling)
        if abs(float(row[served.tokens[i]] - row[base.tokens[i]])) <= tol:
            return  # a rounding tie between the two servers
    fail(impl, prop, CHECK_GREEDY, case,
         f"with {asked(case.sampling)} the output differs from the baseline server's "
         f"({impl.baseline.url}, the same engine without speculation) at position {i}\n"
         f"served:   {list(served.tokens)}\nbaseline: {list(base.tokens)}")


# --------------------------------------------------------------------------- the law

CHECK_LAW = f"{_MODULE}:check_law"


def first_break(observed: Counter, law: dict | None = None, base: Counter | None = None) -> str:
    """Where a failed law of outputs breaks, in words: the first position whose tokens, given
    those before them, are off at p < BREAK_P (statistics.positions against the exact law, or
    two_sample_positions against the baseline's samples), with every position's p-value."""
    rows = (statistics.positions(observed, law) if law is not None
            else statistics.two_sample_positions(observed, base))
    if not rows:
        return ""
    shown = ", ".join(f"{i}: p = {p:.3g}" for i, p, _ in rows)
    against = "their exact law" if law is not None else "the baseline's"
    off = [i for i, p, _ in rows if p < BREAK_P]
    if off:
        return (f"the law first breaks at position {off[0]} (each position's tokens given those "
                f"before them, against {against}: {shown})")
    worst = min(rows, key=lambda r: r[1])[0]
    return (f"no single position is off at p < {BREAK_P:g}, the most at position {worst} (each "
            f"position's tokens given those before them, against {against}: {shown})")


def check_law_rounds(impl, case: ServedCase, delta: float = DELTA_SERVED):
    """check_law over outputs long enough for several rounds (L >= ROUNDS_MIN_LENGTH), for the
    parameters whose state carries from one round to the next; a failure names the first
    position where the law breaks. Sized by statistics.plan at `delta` like check_law; its
    cases keep the law's support small through the engine's own filters (top-k, a low
    temperature)."""
    if case.max_tokens < ROUNDS_MIN_LENGTH:
        raise ValueError(f"check_law_rounds judges outputs of {ROUNDS_MIN_LENGTH} tokens or more "
                         f"(two rounds with a rejection between them), got max_tokens="
                         f"{case.max_tokens}")
    return check_law(impl, case, delta, rounds=True)


def check_law(impl, case: ServedCase, delta: float = DELTA_SERVED, rounds: bool = False):
    """Sampled: the joint law of the first L tokens under the engine's formula. The plan:
    statistics.plan at `delta`, ALPHA, POWER over the exact law. Without a formula: the same
    number of samples from the baseline, chi-square of homogeneity (two samples of n each: the
    one-sample power at a deviation about sqrt(2) larger, TV ~ 0.21 at delta 0.15). `rounds`:
    check_law_rounds's (its name in the replay line, the first position where the law breaks
    in the cause)."""
    prop = ("served_params: the law of the first L tokens over several rounds under the "
            "engine's formula" if rounds else
            "served_params: the law of the first L tokens under the engine's formula")
    check = CHECK_LAW_ROUNDS if rounds else CHECK_LAW
    s = case.sampling
    _skip_unsupported(impl, s)
    formula = formulas.for_dialect(dialect(impl))
    if formula is None and impl.baseline is None:
        pytest.skip(f"cannot judge: the kit knows no formula of {engine(impl)} for {asked(s)} "
                    f"and there is no baseline server to compare with")
    law = _law(case, formula or formulas.OPENAI)
    the_plan = statistics.plan(list(law.values()), delta)
    requests = sampling_requests(impl.client, case, the_plan.n)
    answers = send(impl, prop, check, case, requests)
    outputs = [c for a in answers for c in a][: the_plan.n]
    for c in outputs:
        problem = bounds_violation(case, c)
        if problem:
            fail(impl, prop, check, case, f"a sampled output breaks the bounds: {problem}"
                                              f"\nserved: {list(c.tokens)}")
    observed = Counter(c.tokens for c in outputs)
    if formula is None:
        base = send_baseline(impl, prop, check, case,
                             sampling_requests(impl.baseline, case, the_plan.n))
        base_counts = Counter(c.tokens for a in base for c in a[: the_plan.n])
        result = statistics.chi_square_two_sample(observed, base_counts)
        if not result.passed:
            where = (first_break(observed, base=base_counts) if rounds
                     else where_off_two_sample(observed, base_counts))
            fail(impl, prop, check, case,
                 f"with {asked(s)} the speculating server's outputs are not distributed as the "
                 f"baseline's{' ' + where if where else ''} (same engine, no speculation; the kit "
                 f"knows no formula of {engine(impl)})\n{result.summary()}")
        return result
    result = statistics.chi_square_gof(observed, law)
    if not result.passed:
        mismatch = law_mismatch("the outputs", result, the_plan, len(law),
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                L=case.max_tokens)
        # the cause line carries the failure's pattern: whether the baseline keeps the law (then
        # speculation changes it) and at which positions the outputs are off
        where = first_break(observed, law) if rounds else where_off(observed, law)
        pattern = (where if rounds else f"the law is off {where}") if where else "the law is off"
        if impl.baseline is not None:
            base = send_baseline(impl, prop, check, case,
                                 sampling_requests(impl.baseline, case, the_plan.n))
            base_counts = Counter(c.tokens for a in base for c in a[: the_plan.n])
            base_result = statistics.chi_square_gof(base_counts, law)
            kept = f"the baseline server, no speculation, samples it: p = {base_result.p_value:.3g}"
            pattern = ((f"speculation changes the law ({kept}): {where}" if rounds else
                        f"speculation changes the law {where or ''} ({kept})")
                       if base_result.passed else
                       f"the baseline server fails it too (p = {base_result.p_value:.3g}): the "
                       f"engine's formula differs from the kit's {formula.name} formula")
        fail(impl, prop, check, case,
             f"with {asked(s)} under the {formula.name} formula, {pattern}:\n{mismatch}")
    return result


CHECK_LAW_ROUNDS = f"{_MODULE}:check_law_rounds"


# --------------------------------------------------------------------------- logprobs

CHECK_LOGPROBS = f"{_MODULE}:check_logprobs"


def logprob_problem(case: ServedCase, completion, tolerance: float = LOGPROB_TOLERANCE):
    """What is wrong with a completion's logprobs against the float64 target's raw
    log-softmax, or None."""
    tokens = list(completion.tokens)
    got = completion.logprobs
    if len(got) != len(tokens):
        return f"{len(got)} logprob entries for {len(tokens)} generated tokens"
    rows = torch.log_softmax(oracle.served_logits(case.prompt, tokens), -1)
    want = case.sampling.logprobs
    for i, (token, (value, alternatives)) in enumerate(zip(tokens, got)):
        if value is None or abs(value - float(rows[i, token])) > tolerance:
            return (f"position {i}: token {token} returned with logprob {value}, the target's "
                    f"log-softmax there is {float(rows[i, token]):.6f} (tolerance {tolerance:g})")
        for alt, lp in alternatives:
            if not 0 <= alt < rows.shape[1] or abs(lp - float(rows[i, alt])) > tolerance:
                exact = float(rows[i, alt]) if 0 <= alt < rows.shape[1] else None
                return (f"position {i}: alternative {alt} returned with logprob {lp}, the "
                        f"target's log-softmax is {exact} (tolerance {tolerance:g})")
        if want:
            listed = {alt for alt, _ in alternatives}
            if len(listed) < min(want, rows.shape[1]):
                return f"position {i}: {len(listed)} alternatives for logprobs={want}"
            # vLLM adds the sampled token to the top `want` when it is not among them: the
            # `want`-th largest listed value is the top-k boundary either way
            floor = sorted((lp for _, lp in alternatives), reverse=True)[min(want, rows.shape[1]) - 1]
            missing = [j for j in range(rows.shape[1]) if j not in listed
                       and float(rows[i, j]) > floor + tolerance]
            if missing:
                return (f"position {i}: the alternatives {sorted(listed)} are not the top "
                        f"{want}: token {missing[0]} is more probable than one of them")
    return None


def check_logprobs(impl, case: ServedCase):
    """Each returned logprob is the raw target's (vLLM: raw_logprobs; llama.cpp: n_probs before
    the chain), also where speculation verified the token; greedy: equal to the baseline's."""
    prop = "served_params: logprobs are the target's"
    s = case.sampling
    if s.logprobs is None:
        case = case.replace(logprobs=2)
        s = case.sampling
    _skip_unsupported(impl, s)
    n = 1 if s.greedy else 4
    requests = [_request(case, seed=(s.seed * 7919 + i) % 2**31, n=1) for i in range(n)]
    answers = send(impl, prop, CHECK_LOGPROBS, case, requests)
    done = [c for a in answers for c in a]
    if any(c.logprobs is None for c in done):
        pytest.skip(f"not supported: {engine(impl)} returns no logprobs (asked logprobs="
                    f"{s.logprobs})")
    for c in done:
        problem = logprob_problem(case, c)
        if problem:
            fail(impl, prop, CHECK_LOGPROBS, case,
                 f"{problem}\nserved: {list(c.tokens)}\nreturned logprobs: "
                 f"{[round(v, 6) if v is not None else v for v, _ in c.logprobs]}")
    if impl.baseline is None or not s.greedy:
        return
    (base,), = send_baseline(impl, prop, CHECK_LOGPROBS, case, [requests[0]])
    served = done[0]
    if base.tokens != served.tokens or base.logprobs is None:
        return  # the greedy check judges a differing output
    for i, ((a, _), (b, _)) in enumerate(zip(served.logprobs, base.logprobs)):
        if abs(a - b) > LOGPROB_TOLERANCE:
            fail(impl, prop, CHECK_LOGPROBS, case,
                 f"position {i}: logprob {a} with speculation, {b} from the baseline server "
                 f"(tolerance {LOGPROB_TOLERANCE:g})\nserved: {list(served.tokens)}")


# --------------------------------------------------------------------------- stop strings

CHECK_STOP_STRINGS = f"{_MODULE}:check_stop_strings"


def stop_string_at(prompt, max_tokens: int, start: int, length: int, params=None) -> str:
    """The text of `length` consecutive tokens of the target's greedy output from `start`:
    a stop string the output meets inside a block a speculator proposes."""
    greedy = oracle.served_greedy(prompt, max_tokens, (), params)
    return tokenizer.decode(greedy[start:start + length])


def stop_end(tokens, strings) -> int | None:
    """The token position where the first stop string completes in the tokens' text."""
    text = tokenizer.decode(tokens)
    ends = [text.find(x) + len(x) for x in strings if x in text]
    return min(ends) if ends else None


def expected_stop(case: ServedCase, formula):
    """(greedy output, start, end): where the first stop string occurs in the output's text
    (one character per token, so offsets are token positions); None when none occurs."""
    s = case.sampling
    greedy = oracle.served_greedy(case.prompt, case.max_tokens, s.stop_ids, s, formula)
    text = tokenizer.decode(greedy)
    hits = [(text.find(x) + len(x), text.find(x)) for x in s.stop_strings if x in text]
    if not hits:
        return greedy, None, None
    end, start = min(hits)
    return greedy, start, end


def check_stop_strings(impl, case: ServedCase):
    """Greedy with multi-token stop strings: the output ends where the first stop string
    completes (its tokens kept in token_ids, or cut, as the dialect declares), finish_reason
    "stop", the text cut before it or through it."""
    prop = "served_params: a stop string ends the output where it completes"
    case = case.replace(temperature=0.0, top_k=0, top_p=1.0)
    s = case.sampling
    _skip_unsupported(impl, s)
    formula = formulas.for_dialect(dialect(impl)) or formulas.OPENAI
    (served,), = send(impl, prop, CHECK_STOP_STRINGS, case, [_request(case)])
    greedy, start, end = expected_stop(case, formula)
    tokens = list(served.tokens)
    if start is None:
        expected = [greedy]
    else:
        keeps = impl.client.dialect.stop_string_in_ids
        expected = ([greedy[:end]] if keeps else [greedy[:start]] if keeps is False
                    else [greedy[:end], greedy[:start]])
    if tokens not in expected:
        bad = adjusted_divergence(case, tokens, formula, impl.logit_tolerance)
        if bad is not None:
            fail(impl, prop, CHECK_STOP_STRINGS, case,
                 f"position {bad[0]}: served token {bad[1]}, the target's argmax is {bad[2]}"
                 f"\nserved:          {tokens}\ntarget's greedy: {greedy}")
        if tokens != greedy[:len(tokens)] and stop_end(tokens, s.stop_strings) == len(tokens):
            return  # the server took a tie (within the tolerance): it stopped where it should
        where = ("no stop string occurs in the greedy output" if start is None else
                 f"the stop string {tokenizer.decode(greedy[start:end])!r} completes at token "
                 f"{end} (starts at {start})")
        # the pattern for the cause line: an output that runs on past the stop string (a
        # stop missed) or ends before it (a stop seen too early)
        how = ("" if start is None else " (past its end)" if len(tokens) > end else
               " (before its end)" if len(tokens) < start else "")
        fail(impl, prop, CHECK_STOP_STRINGS, case,
             f"{where}, but the output has {len(tokens)} tokens{how}\nserved:   {tokens} "
             f"({tokenizer.decode(tokens)!r})\nexpected: {' or '.join(map(str, expected))}")
    if start is not None and served.finish_reason not in (None, "stop"):
        fail(impl, prop, CHECK_STOP_STRINGS, case,
             f"ended by a stop string but finish_reason={served.finish_reason!r}")
    if start is not None and served.text is not None:
        texts = {tokenizer.decode(greedy[:start]), tokenizer.decode(greedy[:end])}
        if served.text not in texts:
            fail(impl, prop, CHECK_STOP_STRINGS, case,
                 f"the text {served.text!r} is neither cut before the stop string nor through "
                 f"it ({sorted(texts)})")


# --------------------------------------------------------------------------- n > 1

CHECK_N = f"{_MODULE}:check_n"


def check_n(impl, case: ServedCase, delta: float = DELTA_PAIR):
    """Requests with n = 2: the pairs (first, second completion) against the product of the
    exact law with itself (plan at `delta`, ALPHA, POWER over the pair law), and every
    completion against the exact law (its power at DELTA_SERVED is at least the one-sample
    plan's, it has more samples)."""
    prop = "served_params: the n completions of a request are independent and exact"
    s = case.sampling
    name = engine(impl)    # resolves the dialect first: whether it honours n is the resolved one's
    if impl.client.dialect.honours_n is False or impl.client.supports_n is False:
        pytest.skip(f"not supported: {name} answers one completion per request (n)")
    _skip_unsupported(impl, s)
    formula = formulas.for_dialect(dialect(impl)) or formulas.OPENAI
    law = _law(case, formula)
    pairs_law = {(a, b): pa * pb for a, pa in law.items() for b, pb in law.items()}
    the_plan = statistics.plan(list(pairs_law.values()), delta)
    requests = [_request(case, seed=(s.seed * 1_000_003 + i * 7919 + 1) % 2**31, n=2)
                for i in range(the_plan.n)]
    answers = send(impl, prop, CHECK_N, case, requests)
    if any(len(a) != 2 for a in answers):
        if impl.client.supports_n is False:
            pytest.skip(f"not supported: {engine(impl)} answers one completion per request (n)")
        fail(impl, prop, CHECK_N, case,
             f"asked for n=2, got {sorted({len(a) for a in answers})} completions")
    pairs = Counter((a[0].tokens, a[1].tokens) for a in answers)
    result = statistics.chi_square_gof(pairs, pairs_law)
    if not result.passed:
        same = sum(c for (a, b), c in pairs.items() if a == b)
        chance = sum(p * p for p in law.values())
        fail(impl, prop, CHECK_N, case,
             f"the two completions of one request are not independent draws of the exact law: "
             f"{same} of {the_plan.n} requests returned two equal completions (exact chance "
             f"{chance:.3g} each)\n" + law_mismatch("the pairs", result, the_plan,
                                                     len(pairs_law), temperature=s.temperature,
                                                     top_k=s.top_k, top_p=s.top_p,
                                                     L=case.max_tokens))
    single = statistics.chi_square_gof(Counter(c.tokens for a in answers for c in a), law)
    if not single.passed:
        fail(impl, prop, CHECK_N, case,
             f"the completions of requests with n=2 are not distributed as the exact law\n"
             f"{single.summary()}")
    return result
