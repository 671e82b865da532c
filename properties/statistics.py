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
  see ``pool_cells``), never into a single group when two or more outcomes are possible (one
  group is df 0: p = 1 whatever the implementation does). Where one outcome carries almost all
  the mass, the partition is that outcome against the rest, whose expectation may stay below
  ``MIN_EXPECTED``; that two-group case is judged by the exact binomial test (Fisher's exact
  test for two samples) instead of the chi-square approximation, and ``plan`` computes its
  power exactly. A law with one possible outcome is judged by its support alone.
* One pooling rule, everywhere: ``pool_cells`` of the expected counts at ``MIN_EXPECTED`` (one
  sample against an exact law), of the combined counts at ``2 * MIN_EXPECTED`` (two samples of
  equal size: ``MIN_EXPECTED`` expected per sample). The checks' tests (``chi_square_gof``,
  ``chi_square_two_sample``) and what a failure's message says about where a law is off
  (``gof_p_value``, ``two_sample_p_value``, their statistics, and ``by_position`` /
  ``two_sample_by_position``: the first element of a sequence against the elements after it)
  pool alike; the descriptions count no check and spend no alpha.
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
# scipy (0.9 s to import, 2026-12-07) is imported by the functions that use it: a kit run whose
# families make no statistical check (greedy, cache, bounds) never pays for it

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

# The calibration run's recorder (tests/calibration): None in a kit run, so each check pays
# one test of it; a list there, and every check appends (kind, p-value, passed, df, n) to it.
recorder: list | None = None


def _record(kind: str, result) -> None:
    recorder.append({"kind": kind, "p": result.p_value, "passed": result.passed,
                     "impossible": bool(result.impossible), "df": result.df, "n": result.n,
                     "test": result.test})


# --------------------------------------------------------------------------- power analysis

@lru_cache(maxsize=None)
def critical_value(df: int, alpha: float = ALPHA) -> float:
    """The chi-square statistic above which a df-degree test at level alpha rejects."""
    from scipy import stats
    _check_df(df)
    return float(stats.chi2.isf(alpha, df))


@lru_cache(maxsize=None)
def required_noncentrality(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The noncentrality lambda at which a level-alpha test with df degrees rejects with
    probability `power` (noncentral chi-square approximation)."""
    from scipy import optimize, stats
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
    from scipy import stats
    return float(stats.ncx2.sf(critical_value(df, alpha), df, 4 * n * delta * delta))


def _check_df(df):
    if not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"degrees of freedom must be an int >= 1, got {df!r}")


# --------------------------------------------------------------------------- pooling

def pool_cells(expected: np.ndarray, strata: Sequence[Hashable] | None = None,
               min_expected: float = MIN_EXPECTED) -> list[list[int]]:
    """Group cells (indices into `expected`, all with expectation > 0) so that every group's
    expectation is >= min_expected where possible, and so that two or more cells always make
    two or more groups (one group is a test of nothing: df 0, p = 1 whatever was observed).

    Cells at or above the threshold stay alone. Small cells are pooled with the other small
    cells of their stratum (a stratum is a label the caller gives cells that play the same role,
    e.g. "tokens where p > q"), so that a deviation that moves mass between strata stays visible
    even when every single cell is small. A stratum's pool still below the threshold joins one
    global pool; if that pool is still too small, the smallest remaining groups are merged into
    it until it is large enough or it is the only group. A single group of several cells is
    then split in two (``_split``): the largest cells against the rest, as near equal in
    expectation as a greedy split makes them. Only then can a group stay below the threshold,
    in a partition of exactly two groups (one outcome carries almost all the mass: it against
    all others), which ``exact_test_needed`` tells the tests to judge exactly.
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
    if len(groups) == 1 and len(groups[0]) > 1:
        groups = _split(groups[0], expected)
    return [sorted(g) for g in groups]


def _split(cells: list[int], expected: np.ndarray) -> list[list[int]]:
    """Two groups of `cells`: largest expectation first, each cell to the lighter side. A cell
    carrying more than half the mass ends up alone against all the others; otherwise the two
    sides differ by at most the largest cell (so both reach min_expected once the total is
    2 min_expected plus that cell, and the chi-square approximation holds on them)."""
    sides: tuple[list[int], list[int]] = ([], [])
    mass = [0.0, 0.0]
    for i in sorted(cells, key=lambda i: (-expected[i], i)):
        lighter = 0 if mass[0] <= mass[1] else 1
        sides[lighter].append(i)
        mass[lighter] += expected[i]
    return [sides[0], sides[1]]


def exact_test_needed(group_expected, min_expected: float = MIN_EXPECTED) -> bool:
    """Whether a pooled partition is judged by an exact test rather than the chi-square
    approximation: two groups, one of them below min_expected (see pool_cells)."""
    group_expected = np.asarray(group_expected, dtype=np.float64)
    return len(group_expected) == 2 and bool(group_expected.min() < min_expected)


def pooled_df(probs: np.ndarray, n: int, strata=None, min_expected: float = MIN_EXPECTED) -> int:
    positive = np.flatnonzero(np.asarray(probs) > 0)
    sub = None if strata is None else [strata[i] for i in positive]
    return max(1, len(pool_cells(n * np.asarray(probs)[positive], sub, min_expected)) - 1)


def _pooled(probs: np.ndarray, n: int, strata, min_expected: float) -> tuple[str, int, float]:
    """The test a check of n samples against `probs` runs, its df, and (for the exact test) the
    probability of its smaller group: ("support", 0, 0) for one positive outcome,
    ("binomial", 1, r) for two groups one of which is small, ("chi-square", df, 0) otherwise."""
    positive = np.flatnonzero(probs > 0)
    if len(positive) == 1:
        return "support", 0, 0.0
    sub = None if strata is None else [strata[i] for i in positive]
    groups = pool_cells(n * probs[positive], sub, min_expected)
    masses = np.array([probs[positive][g].sum() for g in groups])
    if exact_test_needed(n * masses, min_expected):
        return "binomial", 1, float(masses.min() / masses.sum())
    return "chi-square", len(groups) - 1, 0.0


# --------------------------------------------------------------------------- exact tests

def two_sided_p_values(pmf: np.ndarray) -> np.ndarray:
    """For a discrete null law given by its pmf over its support, the two-sided p-value of each
    point: the null probability of every point no more probable than it (the rule of the exact
    binomial and Fisher tests, with a relative tolerance of 1e-7 for ties in floating point).
    Summed smallest first, so the small p-values that decide at ALPHA keep their precision."""
    pmf = np.asarray(pmf, dtype=np.float64)
    ordered = np.sort(pmf)
    cumulative = np.cumsum(ordered)
    idx = np.searchsorted(ordered, pmf * (1 + 1e-7), side="right")
    return np.minimum(1.0, cumulative[idx - 1])


def _rejected_tails(pmf: np.ndarray, alpha: float) -> tuple[int, int]:
    """The rejection region {x : p(x) < alpha} of a unimodal null pmf over 0..len - 1 as its
    two tails: (a, b) with x <= a or x >= b rejected (a = -1, b = len when a tail is empty).
    The p-value falls monotonically away from the mode, so the region is the two tails."""
    rejected = two_sided_p_values(pmf) < alpha
    mode = int(np.argmax(pmf))
    low = np.flatnonzero(~rejected[:mode + 1])
    high = np.flatnonzero(~rejected[mode:])
    a, b = int(low[0]) - 1, mode + int(high[-1]) + 1
    if rejected[a + 1:b].any() or not rejected[:a + 1].all() or not rejected[b:].all():
        raise AssertionError("the exact test's rejection region is not two tails")
    return a, b


def binomial_p_value(k: int, n: int, prob: float) -> float:
    """The exact two-sided binomial test of k successes in n trials against probability
    `prob`: the Binomial(n, prob) probability of every count no more probable than k."""
    from scipy import stats
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0 < prob < 1:
        raise ValueError(f"prob must be in (0, 1), got {prob}")
    return float(two_sided_p_values(stats.binom.pmf(np.arange(n + 1), n, prob))[k])


@lru_cache(maxsize=4096)
def _binomial_region(n: int, prob: float, alpha: float) -> tuple[int, int]:
    from scipy import stats
    return _rejected_tails(stats.binom.pmf(np.arange(n + 1), n, prob), alpha)


def binomial_power(n: int, prob: float, delta: float, alpha: float = ALPHA) -> float:
    """The exact power of the two-sided binomial test at level alpha (n trials, null
    probability `prob` of the smaller group) against the group's probability moved by delta,
    the total variation of a deviation on the two groups: the smaller of the two directions
    that exist (prob + delta <= 1, prob - delta >= 0). With the rejection tails (a, b),
    power(q) = P(Bin(n, q) <= a) + P(Bin(n, q) >= b)."""
    from scipy import stats
    a, b = _binomial_region(n, prob, alpha)
    powers = [float(stats.binom.cdf(a, n, q) + stats.binom.sf(b - 1, n, q))
              for q in (prob + delta, prob - delta) if 0 <= q <= 1]
    return min(powers) if powers else 1.0


def fisher_p_value(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    """Fisher's exact test of the 2 x 2 table [[x_a, n_a - x_a], [x_b, n_b - x_b]] (two-sided):
    given the margins, x_a is hypergeometric (population n_a + n_b, x_a + x_b marked, n_a
    drawn), and the p-value is its probability of every value no more probable than x_a."""
    from scipy import stats
    t = x_a + x_b
    lo, hi = max(0, t - n_b), min(t, n_a)
    pmf = stats.hypergeom.pmf(np.arange(lo, hi + 1), n_a + n_b, t, n_a)
    return float(two_sided_p_values(pmf)[x_a - lo])


@lru_cache(maxsize=65536)
def _fisher_region(n: int, t: int, alpha: float) -> tuple[int, int]:
    """Fisher's rejection tails for two samples of n with t in the small group together: x_a
    (the first sample's count) <= a or >= b is rejected. The hypergeometric pmf through log
    binomial coefficients (scipy.special.gammaln), all values at once."""
    lo, hi = max(0, t - n), min(t, n)
    x = np.arange(lo, hi + 1, dtype=np.float64)
    log_pmf = (_log_choose(t, x) + _log_choose(2 * n - t, n - x) - _log_choose(2 * n, n))
    a, b = _rejected_tails(np.exp(log_pmf), alpha)
    return lo + a, lo + b


def _log_choose(m, k):
    from scipy import special
    return special.gammaln(m + 1) - special.gammaln(k + 1) - special.gammaln(m - k + 1)


@lru_cache(maxsize=1024)
def fisher_power(n: int, r_a: float, r_b: float, alpha: float = ALPHA) -> float:
    """The exact power of Fisher's test at level alpha, two samples of n, when the smaller
    group has probability r_a in one and r_b in the other: the sum over the two counts
    (x_a ~ Bin(n, r_a), x_b ~ Bin(n, r_b), independent) of their probability where the test
    rejects, the conditional rejection tails taken per total t = x_a + x_b. Counts whose
    binomial probability is below 1e-15 are left out, which can only lower the value."""
    from scipy import stats
    x = np.arange(n + 1)
    pa, pb = stats.binom.pmf(x, n, r_a), stats.binom.pmf(x, n, r_b)
    keep_a, keep_b = np.flatnonzero(pa > 1e-15), np.flatnonzero(pb > 1e-15)
    total = 0.0
    for t in range(keep_a[0] + keep_b[0], keep_a[-1] + keep_b[-1] + 1):
        lo, hi = max(0, t - n), min(t, n)
        a, b = _fisher_region(n, t, alpha)
        xs = np.r_[lo:a + 1, b:hi + 1]
        total += float((pa[xs] * pb[t - xs]).sum())
    return min(total, 1.0)


def fisher_min_power(n: int, prob: float, delta: float, alpha: float = ALPHA) -> float:
    """Fisher's power against two laws whose smaller group differs by delta (the total
    variation on two groups), one at the planned `prob`: the smaller of the directions that
    exist."""
    powers = [fisher_power(n, prob, q, alpha) for q in (prob + delta, prob - delta) if 0 <= q <= 1]
    return min(powers) if powers else 1.0


def support_sample_size(delta: float, power: float = POWER) -> int:
    """A law with one positive outcome is judged by its support alone: any other outcome fails,
    and no correct implementation ever produces one (no false alarm). An implementation that
    puts mass delta elsewhere is caught with probability 1 - (1 - delta)^n, so the smallest n
    with (1 - delta)^n <= 1 - power."""
    if not 0 < delta <= 1:
        raise ValueError(f"delta (a total-variation distance) must be in (0, 1], got {delta}")
    if delta == 1:
        return 1
    return math.ceil(math.log1p(-power) / math.log1p(-delta) - 1e-12)


def support_power(n: int, delta: float) -> float:
    return 1.0 - (1.0 - delta) ** n


def _detectable_by(power_at, power: float = POWER) -> float:
    """The smallest TV in (0, 1] at which power_at(delta) >= power, by bisection (1.0 when
    even TV 1 is not detected so)."""
    if power_at(1.0) < power:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(16):   # to 1.5e-5: a description, not a decision
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power_at(mid) >= power else (mid, hi)
    return hi


# --------------------------------------------------------------------------- planning

@dataclass(frozen=True)
class Plan:
    """How many samples a check draws, and what that buys."""

    n: int
    df: int              # degrees of freedom after pooling at this n (0: the support test)
    delta: float         # the design deviation: TV >= delta is detected with >= power
    power: float         # power at delta of the test run (>= POWER by construction)
    alpha: float
    test: str = "chi-square"   # "chi-square", "binomial" / "fisher" (exact, two groups), "support"

    def describe(self) -> str:
        if self.test == "support":
            return (f"n={self.n} samples, one possible outcome, judged by support alone (any "
                    f"other outcome fails, no false alarm): detects total variation >= "
                    f"{self.delta:.3f} with power {self.power:.4f}")
        what = {"chi-square": f"df={self.df}",
                "binomial": "two groups, exact binomial test",
                "fisher": "two groups, Fisher's exact test"}[self.test]
        return (f"n={self.n} samples, {what}, alpha={self.alpha:.0e}: detects total "
                f"variation >= {self.delta:.3f} with power {self.power:.4f}")


def plan(probs, delta: float, strata=None, alpha: float = ALPHA, power: float = POWER,
         min_expected: float = MIN_EXPECTED, max_n: int | None = None) -> Plan:
    """The n at which the test chi_square_gof runs on this law reaches `power` against TV
    `delta`, and that test's df and power.

    * One positive outcome: the support test (any other outcome fails; alpha 0), whose power
      against TV delta is 1 - (1 - delta)^n (support_power). n stays the one-degree chi-square
      n, far above the support test's own need (support_sample_size: 37 at delta 0.12), because
      callers reuse plan.n for companion tests the plan does not size: the rule's acceptance
      and joint checks, a served check's two-sample comparison with its baseline.
    * Otherwise df depends on n through pooling (more samples, fewer pooled cells, more df), so
      iterate upwards from the one-degree requirement: n <- sample_size(df(n)) until it is a
      fixpoint. Where the partition at n is two groups one of which is below min_expected
      (one outcome carries almost all the mass), the check runs the exact binomial test, and
      n is kept only if that test's exact power (binomial_power) reaches `power`, raised by
      10% steps until it does.

    Why the one-degree n is enough for the binomial test (and is computed, not assumed): the
    small group has probability r with n r < min_expected = 5, and
    n >= sample_size(1, delta) = lambda_1 / (4 delta^2), lambda_1 = 50.1 at alpha 2e-6 and
    power 0.99, so r < 4 * 5 delta^2 / 50.1 < delta / 2: a deviation of TV delta on the two
    groups can only raise r to r + delta (r - delta < 0). Under the null the small group's
    count X has mean n r < 5 and the test rejects from X >= 19 (at n r = 5: P(X >= 19) =
    1.3e-6 <= alpha, whatever n); under the deviation X has mean n (r + delta) >=
    lambda_1 / (4 delta) >= 12.5 / delta, e.g. delta = 0.12: n = 871, mean >= 104, and
    P(X <= 18) = 1.3e-29, so the power is 1 to double precision (binomial_power; the same at
    delta = 0.15, 0.05, 0.01).

    The guarantee is for the pooled partition: with a large vocabulary most cells are pooled
    (per stratum), and a deviation confined within one pooled cell is not seen.
    """
    p = np.asarray(probs, dtype=np.float64)
    if not (p > 0).any():
        raise ValueError("probs has no positive entry")
    if (p > 0).sum() == 1:
        n = max(sample_size(1, delta, alpha, power), support_sample_size(delta, power))
        test, df, r = "support", 0, 0.0
    else:
        n = sample_size(1, delta, alpha, power)
        for _ in range(200):
            test, df, r = _pooled(p, n, strata, min_expected)
            if test == "chi-square":
                need = sample_size(df, delta, alpha, power)
            else:
                need = n if binomial_power(n, r, delta, alpha) >= power else math.ceil(n * 1.1)
            if need <= n:
                break
            n = need
        else:
            raise RuntimeError(f"no sample plan converged for delta={delta} (last n={n})")
    if max_n is not None and n > max_n:
        raise ValueError(f"the check needs {n} samples for delta={delta}, more than max_n={max_n}")
    achieved = {"support": lambda: support_power(n, delta),
                "binomial": lambda: binomial_power(n, r, delta, alpha),
                "chi-square": lambda: power_lower_bound(n, df, delta, alpha)}[test]()
    the_plan = Plan(n=n, df=df, delta=delta, power=achieved, alpha=alpha, test=test)
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
    # or "binomial", "fisher" (two groups, one small), "support" (one possible outcome),
    # "one-outcome" (two samples both on one outcome)
    test: str = "chi-square"

    def summary(self) -> str:
        lines = []
        if self.impossible:
            shown = ", ".join(f"{o!r} x{c}" for o, c in list(self.impossible.items())[:8])
            lines.append(f"outcomes with exact probability 0 were observed: {shown}")
        detects = (f"n = {self.n}; this check detects total variation >= "
                   f"{self.detectable:.3f} with power {POWER}")
        if self.test == "support":
            lines.append(f"one outcome possible: judged by support alone (any other outcome "
                         f"fails), {detects}")
        elif self.test == "one-outcome":
            lines.append(f"both samples on one outcome alone: nothing differs (p = 1), "
                         f"{detects}")
        elif self.test in ("binomial", "fisher"):
            name = "exact binomial test" if self.test == "binomial" else "Fisher's exact test"
            lines.append(f"{name} of the two pooled groups (one below {MIN_EXPECTED:g} expected;"
                         f" chi-square = {self.statistic:.2f} on 1 df, shown only): p = "
                         f"{self.p_value:.3g} (alpha = {self.alpha:.0e}), {detects}")
        else:
            lines.append(f"chi-square = {self.statistic:.2f} on {self.df} df, p = "
                         f"{self.p_value:.3g} (alpha = {self.alpha:.0e}), {detects}")
        if self.worst:
            lines.append("largest deviations (outcomes: observed vs expected count):")
            for outcomes, obs, exp in self.worst:
                lines.append(f"  {outcomes}: {obs} vs {exp:.1f}")
        return "\n".join(lines)


def _counts(observed) -> Counter:
    return Counter(observed) if not isinstance(observed, Mapping) else Counter(dict(observed))


def _gof_table(counts: Counter, exact: Mapping[Hashable, float], strata, min_expected: float):
    """The pooled table a test of `counts` against `exact` judges: the outcomes of positive
    probability, their groups (pool_cells of the expectations n p), each group's observed and
    expected count (at n, every observation), and the observed outcomes of probability 0 (or
    missing from `exact`) with their counts."""
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
    return outcomes, groups, f_obs, f_exp, impossible


def _gof_p(f_obs: np.ndarray, f_exp: np.ndarray, min_expected: float):
    """The test chi_square_gof runs on a pooled table, its statistic and p-value (impossible
    outcomes aside), and the expected counts rescaled to the observations it judges."""
    from scipy import stats
    df = len(f_obs) - 1
    test = ("support" if df < 1 else
            "binomial" if exact_test_needed(f_exp, min_expected) else "chi-square")
    if df >= 1 and f_obs.sum() > 0:
        f_exp = f_exp * (f_obs.sum() / f_exp.sum())  # exact sums (impossible outcomes removed)
        statistic, p_value = stats.chisquare(f_obs, f_exp)
        statistic, p_value = float(statistic), float(p_value)
        if test == "binomial":
            small = int(np.argmin(f_exp))
            p_value = binomial_p_value(int(f_obs[small]), int(f_obs.sum()),
                                       float(f_exp[small] / f_exp.sum()))
    else:
        statistic, p_value = 0.0, 1.0
    return test, statistic, p_value, f_exp


def chi_square_gof(observed: Mapping[Hashable, int] | Iterable[Hashable],
                   exact: Mapping[Hashable, float], strata: Mapping[Hashable, Hashable] | None = None,
                   alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> GofResult:
    """Test observed outcomes against the exact distribution `exact` (outcome -> probability).

    `observed` is a mapping outcome -> count or an iterable of outcomes. Outcomes missing from
    `exact`, or with probability 0, are impossible: any occurrence fails the test. The rest are
    pooled (see pool_cells) and tested at level alpha: with scipy.stats.chisquare, or, where
    the partition is two groups one of which is below min_expected, with the exact binomial
    test of the small group's count against its probability (two-sided; the same p-value as
    the large group's count against its own). A law with one positive outcome is judged by its
    support alone (test "support", df 0, p = 1: only an impossible outcome fails it).
    """
    global checks_run
    checks_run += 1
    counts = _counts(observed)
    n = sum(counts.values())
    outcomes, groups, f_obs, f_exp, impossible = _gof_table(counts, exact, strata, min_expected)
    df = len(groups) - 1
    test, statistic, p_value, f_exp = _gof_p(f_obs, f_exp, min_expected)
    contributions = (f_obs - f_exp) ** 2 / np.where(f_exp > 0, f_exp, 1)
    worst = []
    for gi in np.argsort(-contributions)[:4]:
        names = [outcomes[i] for i in groups[gi]]
        label = names[0] if len(names) == 1 else f"{len(names)} pooled outcomes incl. {names[0]!r}"
        worst.append((label, int(f_obs[gi]), float(f_exp[gi])))
    m = int(f_obs.sum())   # the observations on possible outcomes: what the test judges
    if test == "support":
        detectable = _detectable_by(lambda d: support_power(n, d))
    elif test == "binomial" and m > 0:
        r = float(f_exp.min() / f_exp.sum())
        detectable = _detectable_by(lambda d: binomial_power(m, r, d, alpha))
    else:
        detectable = detectable_tv(n, max(df, 1), alpha)
    result = GofResult(passed=not impossible and p_value >= alpha, n=n, statistic=statistic,
                       df=max(df, 0), p_value=p_value, alpha=alpha, impossible=impossible,
                       worst=worst, detectable=detectable, test=test)
    if evidence.enabled:
        evidence.gof(result, outcomes, groups, f_obs, f_exp, contributions)
    if recorder is not None:
        _record("gof", result)
    return result


def gof_p_value(observed: Mapping[Hashable, int] | Iterable[Hashable],
                exact: Mapping[Hashable, float], strata: Mapping[Hashable, Hashable] | None = None,
                min_expected: float = MIN_EXPECTED) -> float:
    """The p-value of the test chi_square_gof runs on `observed` against `exact` (the same
    pooling, the same chi-square or exact binomial test), 0 where an outcome of probability 0
    was observed. No check is counted and nothing is recorded: for what a failure's message
    says about a check that has already been decided (which row of a pair is off)."""
    counts = _counts(observed)
    _, _, f_obs, f_exp, impossible = _gof_table(counts, exact, strata, min_expected)
    return 0.0 if impossible else _gof_p(f_obs, f_exp, min_expected)[2]


def gof_statistic(observed: Mapping[Hashable, int] | Iterable[Hashable],
                  exact: Mapping[Hashable, float], strata: Mapping[Hashable, Hashable] | None = None,
                  min_expected: float = MIN_EXPECTED) -> tuple[float, int]:
    """Pearson's statistic of `observed` against `exact`, pooled as chi_square_gof pools them,
    and its degrees of freedom (0: the pooling left one group, a statistic of nothing); inf
    where an outcome of probability 0 was observed. Statistics of independent strata add up,
    with their df, to one chi-square statistic (by_position). No check is counted."""
    counts = _counts(observed)
    _, groups, f_obs, f_exp, impossible = _gof_table(counts, exact, strata, min_expected)
    if impossible:
        return math.inf, len(groups) - 1
    return float(((f_obs - f_exp) ** 2 / f_exp).sum()), len(groups) - 1


def chi_square_statistics(count_matrix: np.ndarray, probs: np.ndarray,
                          min_expected: float = MIN_EXPECTED) -> tuple[np.ndarray, int]:
    """Vectorized Pearson statistics for many replicate count vectors (rows) against probs
    (all > 0), pooled exactly as chi_square_gof pools them. Returns (statistics, df). For the
    harness's own tests, which need thousands of replicates; only where chi_square_gof runs the
    chi-square test (a partition it judges exactly is refused)."""
    counts = np.asarray(count_matrix, dtype=np.float64)
    n = counts[0].sum()
    groups = pool_cells(n * np.asarray(probs), None, min_expected)
    obs = np.stack([counts[:, g].sum(1) for g in groups], axis=1)
    exp = np.array([n * np.asarray(probs)[g].sum() for g in groups])
    if len(groups) < 2 or exact_test_needed(exp, min_expected):
        raise ValueError(f"at n={n:g} this law is not judged by the chi-square test "
                         f"({len(groups)} groups, expectations {exp.round(3).tolist()[:4]})")
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

    Where that partition is two groups one of which is below 2 min_expected combined (one
    outcome carries almost all the mass), or the law has one positive outcome (the other
    group's probability is 0, and a deviating sample is what puts counts there), the test run
    is Fisher's exact test, and n is kept only if its exact power (fisher_min_power: one
    sample at the small group's planned probability r, the other at r + delta) reaches
    `power`, raised by 10% steps until it does. As in `plan`, n r < min_expected makes
    r < delta / 2, and the deviating sample's mean count n (r + delta) is in the dozens where
    the null's combined count is below 10, so the one-degree n is normally enough.
    """
    from scipy import stats
    p = np.asarray(probs, dtype=np.float64)
    if not (p > 0).any():
        raise ValueError("probs has no positive entry")
    n = math.ceil(required_noncentrality(1, alpha, power) / (2 * delta * delta))
    for _ in range(200):
        test, df, r = _pooled(p, 2 * n, None, 2 * min_expected)
        if test == "chi-square":
            need = math.ceil(required_noncentrality(df, alpha, power) / (2 * delta * delta))
        else:
            need = n if fisher_min_power(n, r, delta, alpha) >= power else math.ceil(n * 1.1)
        if need <= n:
            break
        n = need
    else:
        raise RuntimeError(f"no two-sample plan converged for delta={delta} (last n={n})")
    if test == "chi-square":
        achieved = float(stats.ncx2.sf(critical_value(df, alpha), df, 2 * n * delta * delta))
    else:
        test, df, achieved = "fisher", 1, fisher_min_power(n, r, delta, alpha)
    the_plan = Plan(n=n, df=df, delta=delta, alpha=alpha, power=achieved, test=test)
    evidence.planned(the_plan)
    progress.planned(the_plan.n)
    return the_plan


def _two_sample_table(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                      min_expected: float):
    """The pooled 2 x groups table a two-sample test of `a` against `b` judges: the outcomes
    observed (most observed first), their groups (pool_cells of the combined counts at
    2 min_expected: an expectation of min_expected per sample, for equal sizes), and the
    table's two rows, each sample's count in each group."""
    outcomes = sorted((o for o in set(a) | set(b) if a.get(o, 0) + b.get(o, 0) > 0),
                      key=lambda o: -(a.get(o, 0) + b.get(o, 0)))
    combined = np.array([a.get(o, 0) + b.get(o, 0) for o in outcomes], dtype=np.float64)
    groups = pool_cells(combined, None, 2 * min_expected)
    table = np.array([[sum(a.get(outcomes[i], 0) for i in g) for g in groups],
                      [sum(b.get(outcomes[i], 0) for i in g) for g in groups]], dtype=np.float64)
    return outcomes, groups, table


def _two_sample_p(table: np.ndarray, min_expected: float):
    """The test chi_square_two_sample runs on a pooled table, its statistic, p-value and the
    table's expected counts under homogeneity."""
    from scipy import stats
    df = table.shape[1] - 1
    test = ("one-outcome" if df < 1 else
            "fisher" if exact_test_needed(table.sum(0), 2 * min_expected) else "chi-square")
    if df < 1:
        return test, 0.0, 1.0, table
    statistic, p_value, _, expected = stats.chi2_contingency(table, correction=False)
    statistic, p_value = float(statistic), float(p_value)
    if test == "fisher":
        small = int(np.argmin(table.sum(0)))
        na, nb = table.sum(1)
        p_value = fisher_p_value(int(table[0, small]), int(na), int(table[1, small]), int(nb))
    return test, statistic, p_value, expected


def _two_sizes(a: Mapping[Hashable, int], b: Mapping[Hashable, int]) -> tuple[int, int]:
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        raise ValueError(f"both samples need observations, got {na} and {nb}")
    return na, nb


def chi_square_two_sample(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                          alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> GofResult:
    """Pearson's test of homogeneity: are the counts `a` and `b` (outcome -> count) draws from
    one law? Outcomes whose combined count is below 2 * min_expected (an expectation below
    min_expected per sample, for equal sizes) are pooled, smallest first; the combined counts
    are the null's sufficient statistic, so pooling by them keeps the test's level. Where the
    pooling leaves two groups one of which is below 2 * min_expected combined, the test is
    Fisher's exact test of that 2 x 2 table (exact given the combined counts, so its level is
    at most alpha). Both samples on one outcome alone: nothing differs (test "one-outcome",
    p = 1; a deviating sample would have put counts elsewhere, which Fisher's test judges).
    """
    global checks_run
    checks_run += 1
    na, nb = _two_sizes(a, b)
    outcomes, groups, table = _two_sample_table(a, b, min_expected)
    df = len(groups) - 1
    test, statistic, p_value, expected = _two_sample_p(table, min_expected)
    worst = []
    for gi in np.argsort(-np.abs(table[0] - expected[0]))[:4]:
        names = [outcomes[i] for i in groups[gi]]
        label = names[0] if len(names) == 1 else f"{len(names)} pooled outcomes incl. {names[0]!r}"
        worst.append((label, int(table[0, gi]), float(expected[0, gi])))
    n = min(na, nb)
    if test == "fisher":
        r = float(table.sum(0).min() / (na + nb))
        detectable = _detectable_by(lambda d: fisher_min_power(n, r, d, alpha))
    elif test == "one-outcome":
        detectable = _detectable_by(lambda d: fisher_min_power(n, 0.0, d, alpha))
    else:
        detectable = min(1.0, math.sqrt(required_noncentrality(df, alpha) / (2 * n)))
    result = GofResult(passed=p_value >= alpha, n=n, statistic=statistic, df=max(df, 0),
                       p_value=p_value, alpha=alpha, worst=worst, detectable=detectable,
                       test=test)
    if evidence.enabled:
        evidence.two_sample(result, outcomes, groups, table, expected)
    if recorder is not None:
        _record("two_sample", result)
    return result


def two_sample_p_value(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                       min_expected: float = MIN_EXPECTED) -> float:
    """The p-value of the test chi_square_two_sample runs on `a` against `b` (the same pooling,
    the same chi-square or Fisher test). No check is counted and nothing is recorded: for what
    a failure's message says once its check is decided (is the engine's own law the one its
    speculation samples?)."""
    _two_sizes(a, b)
    return _two_sample_p(_two_sample_table(a, b, min_expected)[2], min_expected)[2]


def two_sample_statistic(a: Mapping[Hashable, int], b: Mapping[Hashable, int],
                         min_expected: float = MIN_EXPECTED) -> tuple[float, int]:
    """Pearson's statistic of homogeneity of `a` and `b`, pooled as chi_square_two_sample pools
    them, and its degrees of freedom (0: one group). Statistics of independent strata add up,
    with their df, to one chi-square statistic (two_sample_by_position). No check is counted."""
    _two_sizes(a, b)
    table = _two_sample_table(a, b, min_expected)[2]
    return _two_sample_p(table, min_expected)[1], table.shape[1] - 1


# --------------------------------------------------------------------------- by position

def _heads(counts: Mapping[tuple, int]) -> Counter:
    """The counts of the outcomes' first elements (outcomes are sequences)."""
    heads = Counter()
    for o, c in counts.items():
        heads[o[:1]] += c
    return heads


def _p_sum(total: float, dof: int) -> float:
    """The chi-square p-value of statistics added up over strata (inf: an impossible outcome)."""
    from scipy import stats
    if math.isinf(total):
        return 0.0
    return 1.0 if dof < 1 else float(stats.chi2.sf(total, dof))


def by_position(observed: Mapping[tuple, int], law: Mapping[tuple, float],
                min_expected: float = MIN_EXPECTED) -> tuple[float, float] | None:
    """Where a failed law lies, for outcomes that are sequences (tokens): (p_first, p_later).
    p_first: the first elements against their exact marginal (gof_p_value: the test
    chi_square_gof runs). p_later: the rest of each outcome against its exact law given the
    first element, one gof_statistic per first element, added up with their df (given the
    first elements' counts the strata are independent samples, so the sum is one chi-square
    statistic). None where no outcome of `law` has two elements. A description of a check that
    has failed (its words are the caller's), not a further check: no alpha is spent, nothing
    is counted."""
    if not law or max(len(o) for o in law) < 2:
        return None
    marginal: dict = {}
    for o, pr in law.items():
        marginal[o[:1]] = marginal.get(o[:1], 0.0) + pr
    p_first = gof_p_value(_heads(observed), marginal, min_expected=min_expected)
    total, dof = 0.0, 0
    for head in marginal:
        rest = {o: pr for o, pr in law.items() if o[:1] == head and len(o) > 1 and pr > 0}
        seen = {o: c for o, c in observed.items() if o[:1] == head and len(o) > 1 and c > 0}
        if not rest or not seen:
            continue
        mass = sum(rest.values())
        rest = {o: pr / mass for o, pr in rest.items()}
        stat, df = gof_statistic(seen, rest, min_expected=min_expected)
        total, dof = total + stat, dof + df
    return p_first, _p_sum(total, dof)


def two_sample_by_position(a: Mapping[tuple, int], b: Mapping[tuple, int],
                           min_expected: float = MIN_EXPECTED) -> tuple[float, float] | None:
    """by_position without an exact law: the sample `a` against the sample `b`. p_first: the
    first elements' counts, two_sample_p_value (the test chi_square_two_sample runs). p_later:
    the rest of each outcome given its first element, one two_sample_statistic per first
    element both samples have, added up with their df. None where no outcome of `a` has two
    elements. A description, not a check: no alpha is spent, nothing is counted."""
    if not a or max(len(o) for o in a) < 2:
        return None
    heads_a, heads_b = _heads(a), _heads(b)
    p_first = two_sample_p_value(heads_a, heads_b, min_expected)
    total, dof = 0.0, 0
    for head in set(heads_a) | set(heads_b):
        rest = [Counter({o[1:]: c for o, c in s.items() if o[:1] == head}) for s in (a, b)]
        if not all(sum(r.values()) for r in rest):
            continue
        stat, df = two_sample_statistic(rest[0], rest[1], min_expected)
        total, dof = total + stat, dof + df
    return p_first, _p_sum(total, dof)


def _next_counts(counts: Mapping[tuple, int], i: int) -> dict:
    """prefix of length i -> Counter of the element at position i, over outcomes longer than i."""
    out: dict = {}
    for o, c in counts.items():
        if len(o) > i and c > 0:
            out.setdefault(tuple(o[:i]), Counter())[o[i]] += c
    return out


def positions(observed: Mapping[tuple, int], law: Mapping[tuple, float],
              min_expected: float = MIN_EXPECTED) -> list[tuple[int, float, int]]:
    """Where a failed law of sequences breaks, position by position: (i, p, df) for each
    position i, the i-th elements of the observed outcomes given the elements before them
    against the exact law given those (one gof_statistic per observed prefix, added up with
    their df: given the prefixes' counts the strata are independent samples, so the sum is one
    chi-square statistic per position; position 0 is the first elements' marginal). p 0 where
    an element impossible after its prefix was observed, 1 where nothing can vary. by_position
    generalized to every position; a description of a check that has failed, not a further
    check: no alpha is spent, nothing is counted."""
    length = max((len(o) for o in law), default=0)
    rows = []
    for i in range(length):
        exact: dict = {}
        for o, pr in law.items():
            if len(o) > i and pr > 0:
                after = exact.setdefault(tuple(o[:i]), {})
                after[o[i]] = after.get(o[i], 0.0) + pr
        total, dof = 0.0, 0
        for prefix, seen in _next_counts(observed, i).items():
            after = exact.get(prefix)
            if not after:
                continue          # the prefix itself is impossible: an earlier position says so
            mass = sum(after.values())
            stat, df = gof_statistic(seen, {t: pr / mass for t, pr in after.items()},
                                     min_expected=min_expected)
            total, dof = total + stat, dof + df
        rows.append((i, _p_sum(total, dof), dof))
    return rows


def two_sample_positions(a: Mapping[tuple, int], b: Mapping[tuple, int],
                         min_expected: float = MIN_EXPECTED) -> list[tuple[int, float, int]]:
    """positions without an exact law: the sample `a` against the sample `b`, position by
    position (one two_sample_statistic per prefix both samples have). A description, no alpha
    spent, nothing counted."""
    length = max((len(o) for o in list(a) + list(b)), default=0)
    rows = []
    for i in range(length):
        after_a, after_b = _next_counts(a, i), _next_counts(b, i)
        total, dof = 0.0, 0
        for prefix in set(after_a) & set(after_b):
            stat, df = two_sample_statistic(after_a[prefix], after_b[prefix], min_expected)
            total, dof = total + stat, dof + df
        rows.append((i, _p_sum(total, dof), dof))
    return rows
