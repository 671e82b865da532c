"""Implementations that deviate from the exact law by exactly a chosen total variation, for
measuring power (the self-test's mutants, tests/mutants/, break an engine in a realistic way;
these break it by a stated amount).

The deviation is the one the power calculation is worst against (properties/statistics.py): the
exact law P of what a check observes is split into two parts S+ and S- of masses A and B, as
near equal as the outcomes allow, and reweighted:

    Q(o) = P(o) (1 + delta / A) on S+,   Q(o) = P(o) (1 - delta / B) on S-

Q sums to 1, and TV(P, Q) = (delta + delta) / 2 = delta exactly. chi2(Q || P) = delta^2 (1/A +
1/B) >= 4 delta^2, with equality at A = B = 1/2: the power calculation's bound.

An engine samples Q from its own correct outputs by the speculative rule itself, with the correct
engine as the draft (law P) and Q as the target: w = Q / P is constant on S+ (1 + delta / A) and
below 1 on S-, so an output o is kept with probability min(1, w(o)) (always on S+), and a
rejected one is replaced by a draw from the residual (Q - P)+, which is P conditioned on S+.
That draw is the correct engine run again until its output lands in S+ (at most RESIDUAL_TRIES
runs), else an outcome drawn from the enumerated law P restricted to S+ (its tokens, with the
last run's other fields). Either way the law of the returned output is exactly Q, and the
expected number of engine runs is at most 1 + delta / P(S+): about 1.2 in the balanced split,
and bounded by RESIDUAL_TRIES where one outcome dominates (P(S+) tiny). Plain rejection
(keep with w / max w) needed max w = 1 + delta / P(S+) runs per output there: thousands for a
near-deterministic law, which stalled the calibration's power runs.
The rule (accept_or_correct) draws its committed token from Q directly, as the rule's p is its
input.

Where the check observes the rule's tokens in bins (large vocabularies, properties/checks/rule.py),
w is constant on each bin, so the law of the bins moves by delta too.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch

from properties import oracle, statistics
from properties.checks.served import DELTA_SERVED
from reference.penalties import OPENAI
from tests.fakes.server import FakeServer

# family -> its design TV (the correct implementation whose deviating copy is measured:
# engines.POWER_IMPL)
DESIGN = {"rule": statistics.DELTA_RULE, "sequence": statistics.DELTA_SEQUENCE,
          "tree": statistics.DELTA_TREE, "sampler": statistics.DELTA_SEQUENCE,
          "batched": statistics.DELTA_BATCHED, "served_sequence": DELTA_SERVED,
          "served_params": DELTA_SERVED}
# family -> the tests whose checks are sized for DESIGN[family] (None: all of the family's):
# the sequence and sampler tests on qwen3 models are sized for DELTA_SEQUENCE_QWEN3 instead
POWER_TESTS = {"sequence": ("test_sampling_table", "test_top_k_table", "test_top_p_table",
                            "test_sampling_with_stop_table"),
               "sampler": ("test_own_sampler_table",),
               # the tree's statistical tests only: a residual draw taken from the enumerated law
               # carries another run's stats, which the stops-and-stats tests would reject for
               # that reason, not for the deviation
               "tree": ("test_tree_sampling_exact", "test_tree_filters_exact"),
               # its laws sized for DELTA_SERVED (n > 1 is sized for its pairs, DELTA_PAIR)
               "served_params": ("test_law_repetition_penalty",
                                 "test_law_presence_and_frequency_penalties", "test_law_min_p",
                                 "test_law_logit_bias", "test_law_rounds_repetition_penalty",
                                 "test_law_rounds_presence_and_frequency_penalties",
                                 "test_law_rounds_logit_bias_with_penalties")}
FRACTIONS = (0.5, 0.75, 1.0)   # deviations measured, as fractions of the design TV
MAX_LAW_LENGTH = 6   # longer outputs (the determinism probe's 24 tokens) pass unchanged
RESIDUAL_TRIES = 20  # engine runs that look for an outcome of S+ before one is drawn from P


# the batched family's checks see a row's deviation in the pairs of rows too, and sample more
# rows per prompt than their plan needs (calls of COPIES rows): half its design TV is detected
# at once, so its half-power point is looked for lower down
FAMILY_FRACTIONS = {"batched": (0.1, 0.25, 1.0)}


def deltas(family: str, fractions=None) -> tuple:
    fractions = fractions or FAMILY_FRACTIONS.get(family, FRACTIONS)
    return tuple(round(f * DESIGN[family], 6) for f in fractions)


def split(probs) -> np.ndarray:
    """A sign per outcome (+1: S+, -1: S-), masses as near equal as a greedy split gets: the
    outcomes, largest first, each joins the lighter side."""
    probs = np.asarray(probs, dtype=np.float64)
    sign = np.zeros(len(probs))
    mass = {1: 0.0, -1: 0.0}
    for i in np.argsort(-probs, kind="stable"):
        side = 1 if mass[1] <= mass[-1] else -1
        sign[i] = side
        mass[side] += probs[i]
    return sign


def weights(probs, delta: float) -> np.ndarray:
    """w = Q / P for the split above; TV(P, P w) = delta exactly."""
    probs = np.asarray(probs, dtype=np.float64)
    if not 0 < delta <= 1:
        raise ValueError(f"delta (a total variation) must be in (0, 1], got {delta}")
    sign = split(probs)
    plus, minus = probs[sign > 0].sum(), probs[sign < 0].sum()
    if delta > minus:
        # one outcome holds more than 1 - delta: take mass delta from it alone, spread over the
        # rest in proportion (still TV delta exactly; chi2 above 4 delta^2, easier to detect)
        sign = np.where(np.arange(len(probs)) == np.argmax(probs), -1.0, 1.0)
        plus, minus = probs[sign > 0].sum(), probs[sign < 0].sum()
    if delta > minus or plus <= 0:
        raise ValueError(f"delta={delta}: no deviation of this law by that total variation "
                         f"(its largest outcome has mass {probs.max():.4g})")
    return np.where(sign > 0, 1 + delta / plus, 1 - delta / minus)


def total_variation(p, q) -> float:
    return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q)).sum())


# --------------------------------------------------------------------------- the rule

def deviated_p(p, q, delta: float) -> torch.Tensor:
    """p reweighted by delta over the labels the rule check observes (token_bins)."""
    from properties.checks.rule import token_bins
    pn, qn = p.double().numpy(), q.double().numpy()
    labels = token_bins(pn, qn)
    names = sorted({labels[y] for y in np.flatnonzero(pn > 0)}, key=repr)
    index = {name: i for i, name in enumerate(names)}
    of = np.array([index.get(labels[y], -1) for y in range(len(pn))])
    mass = np.bincount(of[pn > 0], weights=pn[pn > 0], minlength=len(names))
    w = weights(mass, delta)
    return torch.from_numpy(np.where(pn > 0, pn * w[np.maximum(of, 0)], 0.0))


def deviating_rule(delta: float):
    """accept_or_correct committing y ~ deviated_p (accepted when y is the proposal). The law
    is computed once per (p, q): a check makes thousands of calls with the same pair."""
    laws: dict = {}

    def accept_or_correct(p, q, token, generator=None):
        key = (p.double().numpy().tobytes(), q.double().numpy().tobytes())
        if key not in laws:
            laws.clear()
            laws[key] = deviated_p(p, q, delta)
        y = int(torch.multinomial(laws[key], 1, generator=generator))
        return y, y == int(token)

    return accept_or_correct


# --------------------------------------------------------------------------- whole outputs

@lru_cache(maxsize=256)
def _deviation(key, law_items: tuple, delta: float) -> tuple:
    """(w as a dict outcome -> w, the outcomes of S+, their probabilities under P normalized):
    what _deviated needs for one law (key identifies it; law_items is its (outcome, P) pairs)."""
    outcomes = [o for o, _ in law_items]
    probs = np.array([pr for _, pr in law_items], dtype=np.float64)
    w = weights(probs, delta)
    plus = np.flatnonzero(w > 1)
    return dict(zip(outcomes, w)), [outcomes[i] for i in plus], probs[plus] / probs[plus].sum()


def _tokens(out) -> tuple:
    return tuple(int(t) for t in (out[0] if isinstance(out, tuple) else out))


def _with_tokens(out, tokens):
    return (list(tokens), *out[1:]) if isinstance(out, tuple) else list(tokens)


def _deviated(out, again, deviation, uniform):
    """An output of law Q from `out`, one of the correct engine (law P): the speculative rule
    with P as the draft and Q as the target (module docstring). again() runs the engine once
    more; uniform() is a Uniform[0, 1) draw from the caller's own generator. An outcome outside
    the enumerated law (one the correct engine should never give) is returned as it is, for the
    checks to see."""
    w, plus, plus_probs = deviation
    if uniform() < w.get(_tokens(out), 1.0):     # w >= 1 on S+: always kept
        return out
    for _ in range(RESIDUAL_TRIES):
        out = again()
        if w.get(_tokens(out), 2.0) > 1:
            return out
    return _with_tokens(out, _draw_plus(deviation, uniform))


def _draw_plus(deviation, uniform) -> tuple:
    """An outcome of P conditioned on S+, drawn from the enumerated law by inversion."""
    _, plus, plus_probs = deviation
    i = int(np.searchsorted(np.cumsum(plus_probs), uniform(), side="right"))
    return plus[min(i, len(plus) - 1)]


def _law(target, prompt, L, temperature, top_k, top_p, stop_ids) -> tuple:
    fingerprint = target.next_logits(list(prompt)).numpy().tobytes()
    return _cached_law(fingerprint, target, tuple(prompt), L, temperature, top_k, top_p,
                       tuple(stop_ids))


_laws: dict = {}


def _cached_law(fingerprint, target, prompt, L, temperature, top_k, top_p, stop_ids) -> tuple:
    key = (fingerprint, prompt, L, temperature, top_k, top_p, stop_ids)
    if key not in _laws:
        law = oracle.law_from(lambda seqs: torch.stack([target.next_logits(list(s)) for s in seqs]),
                              prompt, L, temperature, top_k, top_p, stop_ids)
        _laws[key] = tuple(law.items())
    return key, _laws[key]


def deviating_generate(base, delta: float):
    """A generate function (speculative_generate, tree_generate, target_generate) whose output
    law is the correct `base`'s reweighted as above (exact law from the target model it is
    given, through properties.oracle.law_from)."""
    signature = inspect.signature(base)

    def generate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        L, temperature = int(a["max_new_tokens"]), float(a.get("temperature") or 0.0)
        if temperature <= 0 or L > MAX_LAW_LENGTH:
            return base(*args, **kwargs)
        key, law = _law(a["target"], a["prompt_ids"], L, temperature, int(a.get("top_k") or 0),
                        float(a.get("top_p", 1.0)), tuple(a.get("stop_ids") or ()))
        generator = a.get("generator")
        return _deviated(base(*args, **kwargs), lambda: base(*args, **kwargs),
                         _deviation(key, law, delta),
                         lambda: float(torch.rand(1, generator=generator, dtype=torch.float64)))

    return generate


def deviating_batched(base, delta: float):
    """A batched_generate whose every row's law is the correct `base`'s reweighted as above,
    rows still independent: _deviated for each row, the rows rejected generated again together
    in further calls (fresh randomness from the same generator) until each lands in S+ or runs
    out of tries. The returned stats are the first call's."""
    signature = inspect.signature(base)

    def batched_generate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        prompts, max_new = [list(p) for p in a["prompts"]], a["max_new_tokens"]
        limits = list(max_new) if isinstance(max_new, (list, tuple)) else [max_new] * len(prompts)
        temperature = float(a.get("temperature") or 0.0)
        if temperature <= 0 or max(limits, default=0) > MAX_LAW_LENGTH:
            return base(*args, **kwargs)
        target, generator = a["target"], a.get("generator")
        filters = (int(a.get("top_k") or 0), float(a.get("top_p", 1.0)),
                   tuple(a.get("stop_ids") or ()))
        deviation_of = {}    # (prompt, limit) -> its _deviation: rows of one prompt share one law
        for prompt, limit in {(tuple(p), n) for p, n in zip(prompts, limits)}:
            key, law = _law(target, prompt, limit, temperature, *filters)
            deviation_of[prompt, limit] = _deviation(key, law, delta)
        of = [deviation_of[tuple(p), n] for p, n in zip(prompts, limits)]

        def uniform():
            return float(torch.rand(1, generator=generator, dtype=torch.float64))

        # _deviated row by row, the residual's engine runs made for all rejected rows at once
        rows, stats = base(*args, **kwargs)
        rows = list(rows)
        pending = [i for i, out in enumerate(rows) if not uniform() < of[i][0].get(_tokens(out), 1.0)]
        for _ in range(RESIDUAL_TRIES):
            if not pending:
                break
            again, _ = base(**dict(a, prompts=[prompts[i] for i in pending],
                                   max_new_tokens=[limits[i] for i in pending]))
            landed = {i for i, out in zip(pending, again) if of[i][0].get(_tokens(out), 2.0) > 1}
            for i, out in zip(pending, again):
                if i in landed:
                    rows[i] = out
            pending = [i for i in pending if i not in landed]
        for i in pending:
            rows[i] = list(_draw_plus(of[i], uniform))
        return rows, stats

    return batched_generate


class DeviatingServer(FakeServer):
    """The project's fake server (exact sampling from the float64 served target) with each
    sampled completion's law reweighted as above (_deviated, its uniforms drawn from the
    request's own generator, so a seed still fixes the answer), also under penalties, min_p
    and a logit bias (the law under the fake's OpenAI formula; stop strings aside).
    Completions longer than MAX_LAW_LENGTH pass unchanged."""

    def __init__(self, delta: float):
        super().__init__()
        weights([0.5, 0.5], delta)           # the argument's check, before any request
        self.delta = delta

    def _generate(self, ids, max_tokens, temperature, top_k, top_p, stops, rng):
        def once():
            return super(DeviatingServer, self)._generate(ids, max_tokens, temperature, top_k,
                                                          top_p, stops, rng)
        if temperature <= 0 or max_tokens > MAX_LAW_LENGTH:
            return once()
        stop_ids = tuple(sorted(stops))
        law = oracle.served_law(tuple(ids), max_tokens, temperature, top_k, top_p, stop_ids)
        key = ("served", tuple(ids), max_tokens, temperature, top_k, top_p, stop_ids)
        return _deviated(once(), once, _deviation(key, tuple(law.items()), self.delta),
                         rng.random)

    def _generate_shaped(self, ids, max_tokens, params, stops, rng):
        def once():
            return super(DeviatingServer, self)._generate_shaped(ids, max_tokens, params, stops,
                                                                 rng)
        if params.greedy or params.stop_strings or max_tokens > MAX_LAW_LENGTH:
            return once()
        stop_ids = tuple(sorted(stops))
        law = oracle.served_law(tuple(ids), max_tokens, params.temperature, params.top_k,
                                params.top_p, stop_ids, params=params, formula=OPENAI)
        key = ("served-shaped", tuple(ids), max_tokens, replace(params, seed=None), stop_ids)
        tokens = _deviated(once()[0], lambda: once()[0],
                           _deviation(key, tuple(law.items()), self.delta), rng.random)
        return tokens, None


def deviating(impl, family: str, delta: float):
    """A copy of impl whose function judged by `family` deviates by delta (served_sequence:
    engines.get("served", delta), a deviating server)."""
    out = copy.copy(impl)
    out.functions = dict(impl.functions)
    name = {"rule": "accept_or_correct", "sequence": "speculative_generate",
            "tree": "tree_generate", "sampler": "target_generate",
            "batched": "batched_generate"}[family]
    if name not in out.functions:
        raise ValueError(f"{impl.spec} has no {name} to deviate")
    if family == "rule":
        out.functions[name] = deviating_rule(delta)
    elif family == "batched":
        out.functions[name] = deviating_batched(impl.functions[name], delta)
    else:
        out.functions[name] = deviating_generate(impl.functions[name], delta)
    out.spec = f"{impl.spec} deviating by TV {delta}"
    return out
