"""The summary's mathematics: exact binomial intervals, the p-values' test against Uniform(0, 1),
the tail extrapolation and the half-power interpolation. No engine, no I/O."""

from __future__ import annotations

import numpy as np
from scipy import stats

LEVEL = 0.95        # the intervals stated (two-sided)
KS_ALPHA = 1e-3     # the level of the p-values' Kolmogorov-Smirnov test against Uniform(0, 1)
THRESHOLDS = (0.05, 1e-3)
TAIL = 0.01         # the extrapolation to ALPHA uses the rate below this threshold


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval for a binomial proportion, k of n:
    the Beta quantiles (Clopper and Pearson 1934, Biometrika 26(4): 404-413)."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1 - level) / 2
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def uniformity(p_values) -> dict:
    """Kolmogorov-Smirnov test of the p-values against Uniform(0, 1), at KS_ALPHA. A correct
    check at a continuous statistic gives uniform p-values; a conservative one piles them up
    near 1, a liberal one near 0. (A discrete statistic makes them slightly conservative: the
    test is two-sided, so that shows too.)"""
    p = np.asarray(p_values, dtype=np.float64)
    if len(p) == 0:
        raise ValueError("no p-values")
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got min {p.min()}, max {p.max()}")
    result = stats.kstest(p, "uniform")
    return {"n": len(p), "ks": float(result.statistic), "p": float(result.pvalue),
            "alpha": KS_ALPHA, "consistent": bool(result.pvalue >= KS_ALPHA)}


def rate(p_values, threshold: float) -> dict:
    """The observed rate of p < threshold, with its exact interval; `ratio`: rate / threshold
    (1 for a calibrated check)."""
    p = np.asarray(p_values, dtype=np.float64)
    k, n = int((p < threshold).sum()), len(p)
    low, high = clopper_pearson(k, n)
    return {"threshold": threshold, "k": k, "n": n, "rate": k / n, "low": low, "high": high,
            "ratio": k / n / threshold}


def extrapolated(p_values, alpha: float, tail: float = TAIL) -> dict:
    """The false-alarm rate at `alpha`, far below what the runs can observe, extrapolated from
    the tail: if P(p < t) / t is constant for t <= tail (it is 1 for every t when the p-values
    are uniform), the rate at alpha is alpha * P(p < tail) / tail; the interval scales the exact
    interval of the count below `tail` the same way. An assumption, stated as one: the chi-square
    approximation's accuracy at 2e-6 itself is not observable in hundreds of runs."""
    r = rate(p_values, tail)
    return {"alpha": alpha, "from": tail, "estimate": alpha * r["ratio"],
            "low": alpha * r["low"] / tail, "high": alpha * r["high"] / tail}


def qq_envelope(n: int, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For n uniform p-values sorted ascending: the expected i-th value i / (n + 1) and the
    pointwise interval of the i-th order statistic, Beta(i, n - i + 1)."""
    i = np.arange(1, n + 1)
    tail = (1 - level) / 2
    return (i / (n + 1), stats.beta.ppf(tail, i, n - i + 1),
            stats.beta.ppf(1 - tail, i, n - i + 1))


def half_power(deltas, rejected) -> float | None:
    """The deviation detected half the time, by linear interpolation between the measured
    (delta, rejection rate) points (sorted by delta); None when no two points bracket 0.5."""
    points = sorted(zip(deltas, rejected))
    for (d0, r0), (d1, r1) in zip(points, points[1:]):
        if r0 <= 0.5 <= r1 and r1 > r0:
            return d0 + (0.5 - r0) * (d1 - d0) / (r1 - r0)
    return None


def expected_run_bound(checks_per_run: float, alpha: float) -> float:
    """The verdict line's bound on a run's false alarm: by the union bound, checks x alpha."""
    return min(1.0, checks_per_run * alpha)


def binomial_consistent(k: int, n: int, bound: float) -> bool:
    """Whether k false-alarming runs of n are consistent with a rate <= bound: the exact
    one-sided test at 1 - LEVEL (P(X >= k) under Binomial(n, bound))."""
    return k == 0 or float(stats.binom.sf(k - 1, n, bound)) >= (1 - LEVEL) / 2

