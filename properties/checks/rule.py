"""Family "rule": accept_or_correct commits a token distributed exactly as p.

For a pair (p, q) the kit draws proposals x ~ q itself, calls
``accept_or_correct(p, q, x, generator=g)`` n times and tests, each with a chi-square check at
the kit's per-check alpha:

1. the committed token y is distributed as p (no token outside p's support, ever);
2. the acceptance probability is sum(min(p, q));
3. the joint law of (x, accepted, y): accepted with probability min(p(x), q(x)) / q(x), and a
   rejection draws from the normalized residual max(p - q, 0), whatever x was.

n comes from the power calculation for check 1 (total variation DELTA_RULE, or
DELTA_RULE_THOROUGH in the thorough profile); the other two report the deviation they can
detect at that n.
"""

from __future__ import annotations

import numpy as np
import torch

from properties import profiles, statistics
from properties.cases import RuleCase
from properties.guards import EngineFault
from properties.harness import fail, invoke, seed_everything
from properties.statistics import chi_square_gof, plan

CHECK = "properties.checks.rule:check_rule"
SUPPORT = "properties.checks.rule:check_support"
LARGE_VOCAB = 32      # above this, tokens are grouped into bins before testing
BINS_PER_STRATUM = 12


def token_bins(p: np.ndarray, q: np.ndarray) -> list:
    """A label per token. Small vocabularies: the token itself. Large ones: (stratum, bin),
    where the strata are {p > q} (where the residual lives) and {0 < p <= q}, and each stratum's
    tokens, sorted by p, are cut into BINS_PER_STRATUM bins of about equal p-mass. Tokens with
    p = 0 keep their own label, which the exact law gives probability 0."""
    V = len(p)
    if V <= LARGE_VOCAB:
        return list(range(V))
    labels: list = [("p=0", y) for y in range(V)]
    for name, members in (("p>q", np.flatnonzero(p > q)), ("p<=q", np.flatnonzero((p > 0) & (p <= q)))):
        if len(members) == 0:
            continue
        order = members[np.argsort(p[members], kind="stable")]
        cum = np.cumsum(p[order]) / p[order].sum()
        idx = np.minimum((cum * BINS_PER_STRATUM - 1e-12).astype(int), BINS_PER_STRATUM - 1)
        for y, b in zip(order.tolist(), idx.tolist()):
            labels[y] = (name, int(b))
    return labels


def rule_law(p: np.ndarray, q: np.ndarray):
    """Exact laws of the committed token's label, of acceptance, and of (proposal label,
    accepted, committed label); with the strata used for pooling."""
    V = len(p)
    label = token_bins(p, q)
    # proposals with p = 0 share one label (they are all rejected the same way)
    xlabel = [("p=0",) if V > LARGE_VOCAB and p[x] == 0 else label[x] for x in range(V)]
    overlap = np.minimum(p, q)
    accept = float(overlap.sum())
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    r = residual / total if total > 0 else np.zeros(V)
    reject = 1.0 - accept if total > 0 else 0.0
    side = {y: ("p>q" if p[y] > q[y] else "p<=q") for y in range(V)}
    marginal, marginal_strata, joint, strata = {}, {}, {}, {}

    def add(law, key, value):
        law[key] = law.get(key, 0.0) + float(value)

    for y in np.flatnonzero(p > 0).tolist():
        add(marginal, label[y], p[y])
        marginal_strata[label[y]] = side[y]
    for x in np.flatnonzero(overlap > 0).tolist():
        o = (label[x], True, label[x])
        add(joint, o, overlap[x])
        strata[o] = ("accepted", side[x])
    if reject > 0:
        # given a rejection, y ~ r whatever x was: the law factorizes over (x, y)
        reject_x = {}
        for x in np.flatnonzero(q > p).tolist():
            add(reject_x, xlabel[x], q[x] - overlap[x])
        for y in np.flatnonzero(r > 0).tolist():
            for lx, mass in reject_x.items():
                o = (lx, False, label[y])
                add(joint, o, mass * r[y])
                strata[o] = ("rejected", side[y])
    s = sum(joint.values())
    joint = {o: v / s for o, v in joint.items()}
    acceptance = {True: accept, False: 1.0 - accept}
    return label, xlabel, marginal, marginal_strata, acceptance, joint, strata


def rule_delta() -> float:
    """The deviation the rule family is sized for: the thorough profile affords 25x the
    samples (the rule is one cheap call per sample) and detects TV 0.01."""
    if profiles.current() == "thorough":
        return statistics.DELTA_RULE_THOROUGH
    return statistics.DELTA_RULE


def commit(impl, prop, check, case, p, q, x, generator, where: str):
    """One accept_or_correct call under the kit's guards: (token, accepted) as (int, bool)."""
    try:
        out = invoke(impl, "accept_or_correct", p, q, x, generator=generator)
    except EngineFault as exc:
        fail(impl, prop, check, case, f"{where}, accept_or_correct(p, q, token={x}): "
                                      f"{exc.describe()}")
    try:
        y, accepted = out
        if isinstance(y, bool) or float(y) != int(y):
            raise ValueError(f"token {y!r} is not a token id")
        return int(y), bool(accepted)
    except (TypeError, ValueError) as exc:
        fail(impl, prop, check, case,
             f"{where}, accept_or_correct(p, q, token={x}) returned {out!r}; the API expects "
             f"a pair (token, accepted): the committed token id and whether the proposal was "
             f"accepted ({exc})")


def _inputs_intact(impl, prop, check, case, p, q, p_in, q_in):
    """p and q are compared with copies once per check (a copy per call would cost more than
    the call itself)."""
    for name, before, after in (("p", p, p_in), ("q", q, q_in)):
        if not torch.equal(before, after):
            fail(impl, prop, check, case, f"accept_or_correct mutated {name} in place: it was "
                                          f"{before.tolist()[:8]}, it is now {after.tolist()[:8]}")


def check_rule(impl, case: RuleCase, delta: float | None = None):
    prop = "rule: accept_or_correct"
    p, q = case.pair.build()
    pn, qn = p.numpy(), q.numpy()
    label, xlabel, marginal, marginal_strata, acceptance, joint, strata = rule_law(pn, qn)
    keys = list(marginal)
    the_plan = plan([marginal[k] for k in keys], delta or rule_delta(),
                    strata=[marginal_strata[k] for k in keys])
    n = the_plan.n
    xs = np.random.default_rng([case.seed, 1]).choice(len(qn), size=n, p=qn)
    generator = seed_everything(case.seed)
    p_in, q_in = p.clone(), q.clone()
    ys, accs, outcomes = [], [], []
    for i, x in enumerate(xs.tolist()):
        y, accepted = commit(impl, prop, CHECK, case, p_in, q_in, x, generator,
                             f"call {i + 1} of {n}")
        if accepted and y != x:
            fail(impl, "rule: accept_or_correct", CHECK, case,
                 f"call {i + 1}: accept_or_correct(p, q, token={x}) returned ({y}, True): an "
                 f"accepted proposal must be committed as itself")
        if not 0 <= y < len(pn):
            fail(impl, "rule: accept_or_correct", CHECK, case,
                 f"call {i + 1}: accept_or_correct(p, q, token={x}) returned token {y}, outside "
                 f"the vocabulary [0, {len(pn)})")
        ys.append(label[y])
        accs.append(accepted)
        outcomes.append((xlabel[x], accepted, label[y]))
    _inputs_intact(impl, prop, CHECK, case, p, q, p_in, q_in)
    binned = " (tokens grouped into bins of equal p-mass)" if len(pn) > LARGE_VOCAB else ""
    checks = [
        ("the committed token is distributed as p" + binned,
         chi_square_gof(ys, marginal, strata=marginal_strata)),
        ("the acceptance probability is sum(min(p, q)) = "
         f"{acceptance[True]:.6g}", chi_square_gof(accs, acceptance)),
        ("the joint law of (proposal, accepted, committed): accept with min(1, p/q), "
         "reject to the normalized residual max(p - q, 0)" + binned,
         chi_square_gof(outcomes, joint, strata)),
    ]
    broken = [(name, res) for name, res in checks if not res.passed]
    if broken:
        text = "\n\n".join(f"NOT {name}:\n{res.summary()}" for name, res in broken)
        fail(impl, "rule: accept_or_correct", CHECK, case,
             f"{text}\n\n(sample plan: {the_plan.describe()}; p = "
             f"{np.array2string(pn[:12], precision=4)}{' ...' if len(pn) > 12 else ''}, q = "
             f"{np.array2string(qn[:12], precision=4)}{' ...' if len(qn) > 12 else ''})")


def check_support(impl, case: RuleCase, calls: int = 50):
    """Deterministic: a token with p = 0 is never committed, an accepted proposal is committed as
    itself, and the inputs are not modified (`calls` calls with proposals drawn from q)."""
    p, q = case.pair.build()
    generator = seed_everything(case.seed)
    xs = np.random.default_rng([case.seed, 2]).choice(len(q), size=calls, p=q.numpy())
    p_in, q_in = p.clone(), q.clone()
    for i, x in enumerate(xs.tolist()):
        y, accepted = commit(impl, "rule: support", SUPPORT, case, p_in, q_in, x, generator,
                             f"call {i + 1} of {calls}")
        if not 0 <= y < len(p) or p[y] == 0:
            fail(impl, "rule: support", SUPPORT, case,
                 f"accept_or_correct(p, q, token={x}) committed token {y}, which has probability "
                 f"{float(p[y]) if 0 <= y < len(p) else 'undefined'} under p")
        if accepted and y != x:
            fail(impl, "rule: support", SUPPORT, case,
                 f"accept_or_correct(p, q, token={x}) returned ({y}, True)")
    _inputs_intact(impl, "rule: support", SUPPORT, case, p, q, p_in, q_in)
