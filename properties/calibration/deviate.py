"""Implementations that deviate from the exact law by exactly a chosen total variation, for
measuring power (the self-test's mutants, tests/mutants/, break an engine in a realistic way;
these break it by a stated amount).

The deviation is the one the power calculation is worst against (properties/statistics.py): the
exact law P of what a check observes is split into two parts S+ and S- of masses A and B, as
near equal as the outcomes allow, and reweighted:

    Q(o) = P(o) (1 + delta / A) on S+,   Q(o) = P(o) (1 - delta / B) on S-

Q sums to 1, and TV(P, Q) = (delta + delta) / 2 = delta exactly. chi2(Q || P) = delta^2 (1/A +
1/B) >= 4 delta^2, with equality at A = B = 1/2: the power calculation's bound.

An engine samples Q by rejection from its own correct outputs: run the correct engine, keep its
output o with probability w(o) / max w (w = Q / P), else run it again. Every output it returns
is a genuine output of the correct engine (caches, stats and stops stay consistent), and the
law of the returned output is exactly Q. The rule (accept_or_correct) draws its committed token
from Q directly, as the rule's p is its input.

Where the check observes the rule's tokens in bins (large vocabularies, properties/checks/rule.py),
w is constant on each bin, so the law of the bins moves by delta too.
"""

from __future__ import annotations

import copy
import inspect
from functools import lru_cache

import numpy as np
import torch

from properties import oracle, statistics
from properties.calibration import engines
from properties.checks.served import DELTA_SERVED
from properties.engines.fake_server import FakeServer

# family -> the correct implementation whose deviating copy is measured, and its design TV
POWER_IMPL = {"rule": "reference", "sequence": "reference", "tree": "reference",
              "sampler": engines.OWN_SAMPLER, "batched": "fast", "served_sequence": "served"}
DESIGN = {"rule": statistics.DELTA_RULE, "sequence": statistics.DELTA_SEQUENCE,
          "tree": statistics.DELTA_TREE, "sampler": statistics.DELTA_SEQUENCE,
          "batched": statistics.DELTA_BATCHED, "served_sequence": DELTA_SERVED}
# family -> the tests whose checks are sized for DESIGN[family] (None: all of the family's):
# the sequence and sampler tests on qwen3 models are sized for DELTA_SEQUENCE_QWEN3 instead
POWER_TESTS = {"sequence": ("test_sampling_table", "test_top_k_table", "test_top_p_table",
                            "test_sampling_with_stop_table"),
               "sampler": ("test_own_sampler_table",)}
FRACTIONS = (0.5, 0.75, 1.0)   # deviations measured, as fractions of the design TV
MAX_LAW_LENGTH = 6   # longer outputs (the determinism probe's 24 tokens) pass unchanged


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
def _weights_for(key, law_items: tuple, delta: float) -> dict:
    outcomes = [o for o, _ in law_items]
    w = weights([pr for _, pr in law_items], delta)
    return dict(zip(outcomes, w))


def _keep_probability(w: dict, tokens) -> float:
    """Rejection sampling's acceptance for an output: w(o) / max w (an outcome outside the
    enumerated law, e.g. one the correct engine should never give, is kept at once)."""
    top = max(w.values())
    return w.get(tuple(int(t) for t in tokens), top) / top


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
        w = _weights_for(key, law, delta)
        while True:
            out = base(*args, **kwargs)
            keep = _keep_probability(w, out[0] if isinstance(out, tuple) else out)
            if float(torch.rand(1, generator=a.get("generator"), dtype=torch.float64)) < keep:
                return out

    return generate


def deviating_batched(base, delta: float):
    """A batched_generate whose every row's law is the correct `base`'s reweighted as above,
    rows still independent: each row is kept with probability w(row) / max w, and the rows not
    kept are generated again together in a further call (fresh randomness from the same
    generator) until every row is kept. The returned stats are the first call's."""
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
        weights_of = {}      # (prompt, limit) -> w: rows of one prompt share one law
        for prompt, limit in {(tuple(p), n) for p, n in zip(prompts, limits)}:
            key, law = _law(target, prompt, limit, temperature, *filters)
            weights_of[prompt, limit] = _weights_for(key, law, delta)
        rows, first_stats, pending = [None] * len(prompts), None, list(range(len(prompts)))
        while pending:
            call = dict(a, prompts=[prompts[i] for i in pending],
                        max_new_tokens=[limits[i] for i in pending])
            outs, stats = base(**call)
            first_stats = stats if first_stats is None else first_stats
            still = []
            for i, out in zip(pending, outs):
                keep = _keep_probability(weights_of[tuple(prompts[i]), limits[i]], out)
                if float(torch.rand(1, generator=generator, dtype=torch.float64)) < keep:
                    rows[i] = out
                else:
                    still.append(i)
            pending = still
        return rows, first_stats

    return batched_generate


class DeviatingServer(FakeServer):
    """The project's fake server (exact sampling from the float64 served target) with each
    sampled completion's law reweighted as above: a completion is kept with probability
    w / max w, drawn from the request's own generator (so a seed still fixes the answer),
    else sampled again. Completions longer than MAX_LAW_LENGTH pass unchanged."""

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
        w = _weights_for(key, tuple(law.items()), self.delta)
        while True:
            out = once()
            if rng.random() < _keep_probability(w, out):
                return out


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
