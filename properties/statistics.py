"""The kit's statistics: chi-square goodness of fit against exact probabilities, with a power
calculation that says how many samples a check needs.

The design, in numbers (CONFORMANCE.md derives them):

* Every statistical check in a run is a Pearson chi-square test at level ``ALPHA``. A full run
  of the kit performs at most ``MAX_CHECKS_PER_RUN`` of them (the conformance summary prints the
  actual count), so by the union bound a correct implementation fails a whole run with
  probability at most ``MAX_CHECKS_PER_RUN * ALPHA = FAMILYWISE_ALPHA`` (one run in 1,000).
* Outcomes whose exact probability is 0 are not part of the chi-square test: observing any of
  them fails the check outright. A correct implementation never produces one, so this costs no
  false alarms.
* Cells with an exact expectation below ``MIN_EXPECTED`` are pooled (within their stratum first,
  see ``pool_cells``).
* Power: an implementation whose outcome distribution Q is at total-variation distance delta
  from the exact P gives the Pearson statistic (asymptotically) a noncentral chi-square law with
  noncentrality n * chi2(Q || P), and chi2(Q || P) >= 4 delta^2 (Cauchy-Schwarz:
  (sum |q - p|)^2 <= sum (q - p)^2 / p * sum p). ``sample_size`` picks the smallest n with
  P(ncx2(df, 4 n delta^2) > critical value) >= ``POWER``; the bound is attained by the
  perturbation q = p (1 +- 2 delta) on two halves of equal mass, so it is the worst case.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from properties import progress
from properties import evidence   # the report's recorder: one flag test when it is off

FAMILYWISE_ALPHA = 1e-3
MAX_CHECKS_PER_RUN = 500
ALPHA = FAMILYWISE_ALPHA / MAX_CHECKS_PER_RUN  # 2e-6 per check
POWER = 0.99
MIN_EXPECTED = 5.0

# Design deviations (total variation) each statistical family is sized to detect with POWER.
DELTA_RULE = 0.05        # committed token ~ p, per (p, q) example
DELTA_RULE_THOROUGH = 0.01  # the same in the thorough profile (25x the samples: the rule is cheap)
DELTA_SEQUENCE = 0.12    # joint law of the first L tokens, per engine example (table models)
DELTA_SEQUENCE_QWEN3 = 0.15  # the same on qwen3 models, whose forwards cost more
DELTA_BATCHED = 0.1      # law of the first L tokens of each batched prompt's rows
DELTA_BATCHED_JOINT = 0.1  # law of a pair of rows (of one prompt, or of two) vs the product
DELTA_TREE = 0.05        # joint law of the first L tokens of sampled tree_generate (qwen3)
DELTA_TREE_THOROUGH = 0.02  # the same in the thorough profile (6.25x the samples)

# Checks performed in this process (the conformance summary adds them up across workers).
checks_run = 0

# The calibration run's recorder (properties/calibration): None in a kit run, so each check pays
# one test of it; a list there, and every check appends (kind, p-value, passed, df, n) to it.
recorder: list | None = None


def _record(kind: str, result) -> None:
    recorder.append({"kind": kind, "p": result.p_value, "passed": result.passed,
                     "impossible": bool(result.impossible), "df": result.df, "n": result.n})


# --------------------------------------------------------------------------- power analysis

@lru_cache(maxsize=None)
def critical_value(df: int, alpha: float = ALPHA) -> float:
    """The chi-square statistic above which a df-degree test at level alpha rejects."""
    _check_df(df)
    return float(stats.chi2.isf(alpha, df))


@lru_cache(maxsize=None)
def required_noncentrality(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The noncentrality lambda at which a level-alpha test with df degrees rejects with
    probability `power` (noncentral chi-square approximation)."""
    _check_df(df)
    if not 0 < alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    crit = critical_value(df, alpha)
    hi = 1.0
    while stats.ncx2.sf(crit, df, hi) < power:
        hi *= 2
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 0.0, hi,
                                 xtol=1e-10, rtol=1e-12))


def sample_size(df: int, delta: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Smallest n whose lower-bound noncentrality 4 n delta^2 reaches the required lambda."""
    if not 0 < delta <= 1:
        raise ValueError(f"delta (a total-variation distance) must be in (0, 1], got {delta}")
    return math.ceil(required_noncentrality(df, alpha, power) / (4 * delta * delta))


def detectable_tv(n: int, df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest total-variation deviation detected with probability >= power by n samples."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return min(1.0, math.sqrt(required_noncentrality(df, alpha, power) / (4 * n)))


def power_lower_bound(n: int, df: int, delta: float, alpha: float = ALPHA) -> float:
    """Approximate power against every alternative at total variation >= delta."""
    return float(stats.ncx2.sf(critical_value(df, alpha), df, 4 * n * delta * delta))


def _check_df(df):
    if not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"degrees of freedom must be an int >= 1, got {df!r}")


# --------------------------------------------------------------------------- pooling

def pool_cells(expected: np.ndarray, strata: Sequence[Hashable] | None = None,
               min_expected: float = MIN_EXPECTED) -> list[list[int]]:
    """Group cells (indices into `expected`, all with expectation > 0) so that every group's
    expectation is >= min_expected where possible.

    Cells at or above the threshold stay alone. Small cells are pooled with the other small
    cells of their stratum (a stratum is a label the caller gives cells that play the same role,
    e.g. "tokens where p > q"), so that a deviation that moves mass between strata stays visible
    even when every single cell is small. A stratum's pool still below the threshold joins one
    global pool; if that pool is still too small, the smallest remaining groups are merged into
    it until it is large enough or it is the only group.
    """
    expected = np.asarray(expected, dtype=np.float64)
    if strata is None:
        strata = [0] * len(expected)
    if len(strata) != len(expected):
        raise ValueError(f"strata has {len(strata)} labels for {len(expected)} cells")
    groups: list[list[int]] = []
    small_by_stratum: dict[Hashable, list[int]] = {}
    for i, e in enumerate(expected):
        if e >= min_expected:
            groups.append([i])
        else:
            small_by_stratum.setdefault(strata[i], []).append(i)
    leftover: list[int] = []
    for members in small_by_stratum.values():
        if expected[members].sum() >= min_expected:
            groups.append(members)
        else:
            leftover.extend(members)
    if leftover:
        groups.sort(key=lambda g: expected[g].sum())
        while expected[leftover].sum() < min_expected and groups:
            leftover.extend(groups.pop(0))
        groups.append(leftover)
    return [sorted(g) for g in groups]


def pooled_df(probs: np.ndarray, n: int, strata=None, min_expected: float = MIN_EXPECTED) -> int:
    positive = np.flatnonzero(np.asarray(probs) > 0)
    sub = None if strata is None else [strata[i] for i in positive]
    return max(1, len(pool_cells(n * np.asarray(probs)[positive], sub, min_expected)) - 1)


# --------------------------------------------------------------------------- planning

@dataclass(frozen=True)
class Plan:
    """How many samples a check draws, and what that buys."""

    n: int
    df: int              # degrees of freedom after pooling at this n
    delta: float         # the design deviation: TV >= delta is detected with >= power
    power: float         # approximate power at delta (>= POWER by construction)
    alpha: float

    def describe(self) -> str:
        return (f"n={self.n} samples, df={self.df}, alpha={self.alpha:.0e}: detects total "
                f"variation >= {self.delta:.3f} with power {self.power:.4f}")


def plan(probs, delta: float, strata=None, alpha: float = ALPHA, power: float = POWER,
         min_expected: float = MIN_EXPECTED, max_n: int | None = None) -> Plan:
    """The smallest n at which the pooled test reaches `power` against TV `delta`.

    df depends on n through pooling (more samples, fewer pooled cells, more df), so iterate
    upwards from the one-degree requirement: n <- sample_size(df(n)) until it is a fixpoint.
    The guarantee is for the pooled partition: with a large vocabulary most cells are pooled
    (per stratum), and a deviation confined within one pooled cell is not seen.
    """
    p = np.asarray(probs, dtype=np.float64)
    if not (p > 0).any():
        raise ValueError("probs has no positive entry")
    n = sample_size(1, delta, alpha, power)
    for _ in range(100):
        need = sample_size(pooled_df(p, n, strata, min_expected), delta, alpha, power)
        if need <= n:
            break
        n = need
    if max_n is not None and n > max_n:
        raise ValueError(f"the check needs {n} samples for delta={delta}, more than max_n={max_n}")
    df = pooled_df(p, n, strata, min_expected)
    the_plan = Plan(n=n, df=df, delta=delta, power=power_lower_bound(n, df, delta, alpha),
                    alpha=alpha)
    evidence.planned(the_plan)
    progress.planned(the_plan.n)
    return the_plan


# --------------------------------------------------------------------------- the test

@dataclass
class GofResult:
    passed: bool
    n: int
    statistic: float
    df: int
    p_value: float
    alpha: float
    impossible: dict = field(default_factory=dict)   # outcome -> count, exact probability 0
    worst: list = field(default_factory=list)         # (outcome(s), observed, expected)
    detectable: float = 1.0                          # TV detected with POWER at this n, df

    def summary(self) -> str:
        lines = []
        if self.impossible:
            shown = ", ".join(f"{o!r} x{c}" for o, c in list(self.impossible.items())[:8])
            lines.append(f"outcomes with exact probability 0 were observed: {shown}")
        lines.append(f"chi-square = {self.statistic:.2f} on {self.df} df, p = {self.p_value:.3g} "
                     f"(alpha = {self.alpha:.0e}), n = {self.n}; this check detects total "
                     f"variation >= {self.detectable:.3f} with power {POWER}")
        if self.worst:
            lines.append("largest deviations (outcomes: observed vs expected count):")
            for outcomes, obs, exp in self.worst:
                lines.append(f"  {outcomes}: {obs} vs {exp:.1f}")
        return "\n".join(lines)


def chi_square_gof(observed: Mapping[Hashable, int] | Iterable[Hashable],
                   exact: Mapping[Hashable, float], strata: Mapping[Hashable, Hashable] | None = None,
                   alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> GofResult:
    """Test observed outcomes against the exact distribution `exact` (outcome -> probability).

    `observed` is a mapping outcome -> count or an iterable of outcomes. Outcomes missing from
    `exact`, or with probability 0, are impossible: any occurrence fails the test. The rest are
    pooled (see pool_cells) and tested with scipy.stats.chisquare at level alpha.
    """
    global checks_run
    checks_run += 1
    counts = Counter(observed) if not isinstance(observed, Mapping) else Counter(dict(observed))
    n = sum(counts.values())
    outcomes = [o for o, pr in exact.items() if pr > 0]
    probs = np.array([exact[o] for o in outcomes], dtype=np.float64)
    if n == 0:
        raise ValueError("no observations to test")
    if not np.all(np.isfinite(probs)) or abs(probs.sum() - 1) > 1e-6:
        raise ValueError(f"exact probabilities must be finite and sum to 1, sum to {probs.sum()}")
    probs = probs / probs.sum()
    known = set(outcomes)
    impossible = {o: c for o, c in counts.items() if o not in known and c > 0}
    obs = np.array([counts.get(o, 0) for o in outcomes], dtype=np.float64)
    expected = n * probs
    labels = None if strata is None else [strata.get(o, None) for o in outcomes]
    groups = pool_cells(expected, labels, min_expected)
    f_obs = np.array([obs[g].sum() for g in groups])
    f_exp = np.array([expected[g].sum() for g in groups])
    df = len(groups) - 1
    if df >= 1 and f_obs.sum() > 0:
        f_exp = f_exp * (f_obs.sum() / f_exp.sum())  # exact sums (impossible outcomes removed)
        statistic, p_value = stats.chisquare(f_obs, f_exp)
        statistic, p_value = float(statistic), float(p_value)
    else:
        statistic, p_value = 0.0, 1.0
    contributions = (f_obs - f_exp) ** 2 / np.where(f_exp > 0, f_exp, 1)
    worst = []
    for gi in np.argsort(-contributions)[:4]:
        names = [outcomes[i] for i in groups[gi]]
        label = names[0] if len(names) == 1 else f"{len(names)} pooled outcomes incl. {names[0]!r}"
        worst.append((label, int(f_obs[gi]), float(f_exp[gi])))
    result = GofResult(passed=not impossible and p_value >= alpha, n=n, statistic=statistic,
                       df=max(df, 0), p_value=p_value, alpha=alpha, impossible=impossible,
                       worst=worst, detectable=detectable_tv(n, max(df, 1), alpha))
    if evidence.enabled:
        evidence.gof(result, outcomes, groups, f_obs, f_exp, contributions)
    if recorder is not None:
        _record("gof", result)
    return result


def chi_square_statistics(count_matrix: np.ndarray, probs: np.ndarray,
                          min_expected: float = MIN_EXPECTED) -> tuple[np.ndarray, int]:
    """Vectorized Pearson statistics for many replicate count vectors (rows) against probs
    (all > 0), pooled exactly as chi_square_gof pools them. Returns (statistics, df). For the
    harness's own tests, which need thousands of replicates."""
    counts = np.asarray(count_matrix, dtype=np.float64)
    n = counts[0].sum()
    groups = pool_cells(n * np.asarray(probs), None, min_expected)
    obs = np.stack([counts[:, g].sum(1) for g in groups], axis=1)
    exp = np.array([n * np.asarray(probs)[g].sum() for g in groups])
    return ((obs - exp) ** 2 / exp).sum(1), len(groups) - 1


# --------------------------------------------------------------------------- two samples

def two_sample_plan(probs, delta: float, alpha: float = ALPHA, power: float = POWER,
                    min_expected: float = MIN_EXPECTED) -> Plan:
    """n per sample for the chi-square test of homogeneity of two samples of n each (the
    engine's speculative outputs against its own sampler's), detecting TV >= delta between
    their laws with `power`.

    With laws P, Q and m = (P + Q) / 2, the statistic's noncentrality is
    lambda = n sum (p - q)^2 / (p + q), and Cauchy-Schwarz gives
    (sum |p - q|)^2 <= sum (p - q)^2 / (p + q) * sum (p + q) = 2 sum (p - q)^2 / (p + q),
    so lambda >= 2 n delta^2: half the one-sample bound, twice the samples per side. `probs`
    (the convention's law, the best guess of both laws before sampling) sets the pooling and
    so df; the test pools by the observed combined counts.
    """
    p = np.asarray(probs, dtype=np.float64)
    n = math.ceil(required_noncentrality(1, alpha, power) / (2 * delta * delta))
    for _ in range(100):
        df = pooled_df(p, 2 * n, None, 2 * min_expected)
        need = math.ceil(required_noncentrality(df, alpha, power) / (2 * delta * delta))
        if need <= n:
            break
        n = need
    df = pooled_df(p, 2 * n, None, 2 * min_expected)
    the_plan = Plan(n=n, df=df, delta=delta, alpha=alpha, power=float(
        stats.ncx2.sf(critical_value(df, alpha), df, 2 * n * delta * delta)))
    evidence.planned(the_plan)
    progress.planned(the_plan.n)
    return the_plan


def chi_square_two_sample(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                          alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> GofResult:
    """Pearson's test of homogeneity: are the counts `a` and `b` (outcome -> count) draws from
    one law? Outcomes whose combined count is below 2 * min_expected (an expectation below
    min_expected per sample, for equal sizes) are pooled, smallest first; the combined counts
    are the null's sufficient statistic, so pooling by them keeps the test's level."""
    global checks_run
    checks_run += 1
    outcomes = sorted(set(a) | set(b), key=lambda o: -(a.get(o, 0) + b.get(o, 0)))
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        raise ValueError(f"both samples need observations, got {na} and {nb}")
    combined = np.array([a.get(o, 0) + b.get(o, 0) for o in outcomes], dtype=np.float64)
    groups = pool_cells(combined, None, 2 * min_expected)
    table = np.array([[sum(a.get(outcomes[i], 0) for i in g) for g in groups],
                      [sum(b.get(outcomes[i], 0) for i in g) for g in groups]], dtype=np.float64)
    df = len(groups) - 1
    if df >= 1:
        statistic, p_value, _, expected = stats.chi2_contingency(table, correction=False)
        statistic, p_value = float(statistic), float(p_value)
    else:
        statistic, p_value, expected = 0.0, 1.0, table
    worst = []
    for gi in np.argsort(-np.abs(table[0] - expected[0]))[:4]:
        names = [outcomes[i] for i in groups[gi]]
        label = names[0] if len(names) == 1 else f"{len(names)} pooled outcomes incl. {names[0]!r}"
        worst.append((label, int(table[0, gi]), float(expected[0, gi])))
    n = min(na, nb)
    result = GofResult(passed=p_value >= alpha, n=n, statistic=statistic, df=max(df, 0),
                       p_value=p_value, alpha=alpha, worst=worst,
                       detectable=min(1.0, math.sqrt(required_noncentrality(max(df, 1), alpha)
                                                     / (2 * n))))
    if evidence.enabled:
        evidence.two_sample(result, outcomes, groups, table, expected)
    if recorder is not None:
        _record("two_sample", result)
    return result
