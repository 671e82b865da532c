"""The kit's statistics harness, checked empirically (fixed seeds, quick).

* false alarms: on exact samplers the rejection rate matches the test's level (measured at
  0.05 and 1e-3, where it is measurable), for distributions with tiny cells, pooled strata and
  zero-probability outcomes;
* power: on samplers perturbed by a known total variation delta, the worst-case way (the one
  that attains chi2 >= 4 delta^2), the checks the kit runs (their alpha, delta and pooled df)
  reject at least as often as the power calculation promises (0.99);
* the bound chi2(Q || P) >= 4 TV(Q, P)^2 that the power calculation rests on;
* the alpha budget: in every profile a full run makes at most MAX_CHECKS_PER_RUN checks, so a
  correct implementation fails a run with probability at most FAMILYWISE_ALPHA.

Counts are drawn in bulk with numpy's multinomial, and the Pearson statistics computed the way
chi_square_gof computes them (same pooling), which is checked against chi_square_gof itself.
"""

from __future__ import annotations

import math
from collections import Counter

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from properties import profiles, statistics
from properties.statistics import (ALPHA, POWER, chi_square_gof, chi_square_statistics,
                                   critical_value, detectable_tv, plan, pool_cells,
                                   power_lower_bound, sample_size)

# Binomial tests on measured rates are themselves at level 1e-4, so this file's own false
# alarm rate is negligible (and it is deterministic anyway: every seed is fixed).
META_ALPHA = 1e-4


def distributions():
    """Test laws, each with a set of cells of exactly half the mass (so the worst-case
    perturbation exists), including tiny cells that get pooled and several strata-free shapes."""
    rng = np.random.default_rng(20240601)
    return {
        "uniform-8": np.full(8, 1 / 8),
        "skewed-8": np.array([0.5, 0.2, 0.1, 0.08, 0.06, 0.04, 0.015, 0.005]),
        "halves-16": np.concatenate([rng.dirichlet(np.full(8, 2.0)),
                                     rng.dirichlet(np.full(8, 2.0))]) / 2,
        "tiny-tail-53": np.concatenate([[0.4, 0.3, 0.2], np.full(50, 0.1 / 50)]),  # tail pooled
        "halves-25": np.concatenate([rng.dirichlet(np.full(12, 4.0)), rng.dirichlet(np.full(13, 4.0))]) / 2,
    }


def worst_case_perturbation(p: np.ndarray, delta: float, n: int) -> np.ndarray:
    """q at total variation delta from p, *on the cells as the test pools them at n*, with
    chi2 = 4 delta^2 there (the least detectable deviation of that size): the pooled groups are
    split into two halves of equal mass, scaled by (1 + 2 delta) and (1 - 2 delta)."""
    groups = pool_cells(n * p)
    masses = [p[g].sum() for g in groups]
    for mask in range(1, 2 ** len(groups)):
        if abs(sum(m for i, m in enumerate(masses) if mask >> i & 1) - 0.5) < 1e-12:
            break
    else:
        raise AssertionError("no half-mass split of the pooled cells")
    q = p.copy()
    for i, g in enumerate(groups):
        q[g] *= (1 + 2 * delta) if mask >> i & 1 else (1 - 2 * delta)
    return q


def rejection_rate(p, q, n, alpha, reps, seed, strata=None):
    """Fraction of `reps` samples of size n from q that the pooled test against p rejects."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, q, size=reps)
    stat, df = chi_square_statistics(counts, p)
    return float((stat > stats.chi2.isf(alpha, df)).mean()), df


# --------------------------------------------------------------------------- power analysis

@pytest.mark.parametrize("df", [1, 3, 7, 15, 31, 63])
@pytest.mark.parametrize("delta", [0.03, 0.05, 0.12, 0.15])
def test_sample_size_is_the_smallest_reaching_the_power(df, delta):
    n = sample_size(df, delta)
    assert power_lower_bound(n, df, delta) >= POWER
    assert power_lower_bound(n - 1, df, delta) < POWER
    assert math.isclose(detectable_tv(n, df), delta, rel_tol=1e-3)


def test_chi_square_divergence_bounds_total_variation():
    """chi2(q || p) >= 4 TV(q, p)^2 on random pairs, with equality for the worst case."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        k = rng.integers(2, 30)
        p, q = rng.dirichlet(np.ones(k)), rng.dirichlet(np.full(k, rng.uniform(0.1, 5)))
        chi2 = ((q - p) ** 2 / p).sum()
        tv = 0.5 * np.abs(q - p).sum()
        assert chi2 >= 4 * tv * tv * (1 - 1e-12)
    for p in distributions().values():
        q = worst_case_perturbation(p, 0.1, 10**6)
        assert math.isclose(0.5 * np.abs(q - p).sum(), 0.1)
        assert math.isclose(((q - p) ** 2 / p).sum(), 4 * 0.1 ** 2)


# --------------------------------------------------------------------------- pooling

def test_pooling_keeps_strata_and_threshold():
    rng = np.random.default_rng(3)
    for _ in range(300):
        k = rng.integers(1, 60)
        expected = rng.exponential(rng.uniform(0.5, 20), size=k)
        strata = rng.integers(0, 3, size=k).tolist()
        groups = pool_cells(expected, strata)
        assert sorted(i for g in groups for i in g) == list(range(k))
        # two or more cells never make one group (df 0 would test nothing)
        assert len(groups) >= min(k, 2)
        sums = [expected[g].sum() for g in groups]
        if len(groups) > 2 or expected.sum() >= 2 * statistics.MIN_EXPECTED + expected.max():
            assert min(sums) >= statistics.MIN_EXPECTED, (expected, groups)
        elif k >= 2 and min(sums) < statistics.MIN_EXPECTED:
            # only left where no partition reaches the threshold twice: one cell carries
            # almost all the mass (it alone against the rest), or the total is too small
            assert len(groups) == 2, (expected, groups)
        # cells above the threshold stay alone unless the last pool needed them
        singles = [g for g in groups if len(g) == 1]
        assert len(singles) >= sum(e >= statistics.MIN_EXPECTED for e in expected) - len(groups[-1])
        # at most one pool mixes strata (the global leftover), or two where a single pool was
        # split in two
        assert sum(len({strata[i] for i in g}) > 1 for g in groups) <= (1 if len(groups) > 2 else 2)


def test_vectorized_statistics_match_chi_square_gof():
    p = distributions()["tiny-tail-53"]
    rng = np.random.default_rng(11)
    counts = rng.multinomial(400, p, size=20)
    stat, df = chi_square_statistics(counts, p)
    exact = dict(enumerate(p))
    for row, s in zip(counts, stat):
        res = chi_square_gof({i: int(c) for i, c in enumerate(row)}, exact)
        assert res.df == df
        assert math.isclose(res.statistic, s, rel_tol=1e-9)


# --------------------------------------------------------------------------- false alarms

@pytest.mark.parametrize("name", list(distributions()))
@pytest.mark.parametrize("alpha,reps", [(0.05, 4000), (1e-3, 100_000)])
def test_false_alarm_rate_on_exact_samplers(name, alpha, reps):
    p = distributions()[name]
    n = plan(p, 0.12).n
    rate, df = rejection_rate(p, p, n, alpha, reps, seed=sum(map(ord, name)))
    k = round(rate * reps)
    # not significantly above alpha, and not wildly below it (the test keeps its level)
    assert stats.binomtest(k, reps, alpha, alternative="greater").pvalue > META_ALPHA, (rate, df)
    assert rate > alpha / 3, (rate, df)


def test_zero_probability_outcomes_fail_without_alpha_cost():
    p = {0: 0.5, 1: 0.5, 2: 0.0}
    rng = np.random.default_rng(5)
    # a correct sampler never produces outcome 2: passes (p-value only from the chi-square)
    assert chi_square_gof(Counter(rng.choice(2, size=1000).tolist()), p).passed
    obs = Counter(rng.choice(2, size=1000).tolist())
    obs[2] += 1
    res = chi_square_gof(obs, p)
    assert not res.passed and res.impossible == {2: 1}
    # an outcome the exact law does not list at all is impossible too
    obs = Counter({0: 500, 1: 499, "elsewhere": 1})
    assert chi_square_gof(obs, p).impossible == {"elsewhere": 1}


def test_exact_sampler_passes_at_the_design_alpha():
    """End to end through chi_square_gof, at the kit's alpha, on many exact samples."""
    rng = np.random.default_rng(99)
    failures = 0
    for name, p in distributions().items():
        n = plan(p, statistics.DELTA_SEQUENCE).n
        for _ in range(40):
            counts = rng.multinomial(n, p)
            failures += not chi_square_gof({i: int(c) for i, c in enumerate(counts)},
                                           dict(enumerate(p))).passed
    assert failures == 0


# --------------------------------------------------------------------------- power

DESIGNS = [("rule", statistics.DELTA_RULE), ("rule-thorough", statistics.DELTA_RULE_THOROUGH),
           ("sequence", statistics.DELTA_SEQUENCE),
           ("sequence-qwen3", statistics.DELTA_SEQUENCE_QWEN3), ("batched", statistics.DELTA_BATCHED),
           ("batched-joint", statistics.DELTA_BATCHED_JOINT),
           ("tree", statistics.DELTA_TREE), ("tree-thorough", statistics.DELTA_TREE_THOROUGH)]


@pytest.mark.parametrize("design,delta", DESIGNS)
@pytest.mark.parametrize("name", list(distributions()))
def test_power_on_worst_case_perturbation(design, delta, name):
    """At the kit's alpha and the planned n, a sampler off by TV delta in the least detectable
    way is rejected with probability >= POWER (binomial slack for the finite replicate count)."""
    p = distributions()[name]
    the_plan = plan(p, delta)
    q = worst_case_perturbation(p, delta, the_plan.n)
    reps = 600
    rate, df = rejection_rate(p, q, the_plan.n, ALPHA, reps, seed=len(name) * 1000 + int(delta * 100))
    k = round(rate * reps)
    assert stats.binomtest(k, reps, POWER, alternative="less").pvalue > META_ALPHA, (
        f"{design} on {name}: rejection rate {rate} at n={the_plan.n}, df={df}, power promised "
        f"{the_plan.power:.4f}")


def test_power_against_mass_on_impossible_outcomes():
    """Mass eps on a zero-probability outcome is caught with probability 1 - (1 - eps)^n."""
    p = {0: 0.5, 1: 0.5, 2: 0.0}
    n = plan([0.5, 0.5], statistics.DELTA_RULE).n
    eps = 0.002
    rng = np.random.default_rng(8)
    caught = sum(not chi_square_gof(Counter(rng.choice(3, size=n, p=[0.5 - eps / 2, 0.5 - eps / 2,
                                                                        eps]).tolist()), p).passed
                 for _ in range(200))
    promised = 1 - (1 - eps) ** n
    assert promised > 0.99
    assert stats.binomtest(caught, 200, promised, alternative="less").pvalue > META_ALPHA


# --------------------------------------------------------------------------- alpha budget

def _statistical_tests():
    """Every statistical property of every kit module (all families, present and future)."""
    import importlib
    for path in sorted((Path(__file__).resolve().parents[1] / "properties").glob("test_*.py")):
        module = importlib.import_module(f"properties.{path.stem}")
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("test_") and hasattr(fn, "kit_checks_per_example"):
                explicit = len(getattr(fn.hypothesis.inner_test, "hypothesis_explicit_examples", ()))
                yield (name, fn.kit_checks_per_example, fn.kit_examples_scale, explicit,
                       fn.kit_explicit_only_unless_thorough)
            elif name.startswith("test_") and hasattr(fn, "kit_fixed_checks"):
                yield name, fn.kit_fixed_checks, 0.0, 1, False


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_alpha_budget_holds_in_every_profile(profile):
    total = 0
    for name, checks, scale, explicit, explicit_only in _statistical_tests():
        generated = profiles.generated_examples(scale, profile, explicit_only) if scale else 0
        # the example database may replay up to as many stored examples as a run generates
        total += checks * (explicit + 2 * generated)
    assert total <= statistics.MAX_CHECKS_PER_RUN, (profile, total)
    assert total * ALPHA <= statistics.FAMILYWISE_ALPHA
    assert list(_statistical_tests()), "no statistical property found"


def test_critical_values_are_those_of_the_stated_alpha():
    for df in (1, 5, 30):
        assert math.isclose(stats.chi2.sf(critical_value(df), df), ALPHA, rel_tol=1e-6)


# --------------------------------------------------------------------------- descriptions

def test_descriptions_run_the_checks_tests_without_counting_them():
    """gof_p_value and two_sample_p_value are chi_square_gof's and chi_square_two_sample's
    p-values (the same pooling, the same exact tests), and count no check."""
    p = distributions()["tiny-tail-53"]
    exact = dict(enumerate(p))
    rng = np.random.default_rng(39)
    for n in (40, 400):
        a = Counter(rng.choice(len(p), size=n, p=p).tolist())
        b = Counter(rng.choice(len(p), size=n, p=p).tolist())
        before = statistics.checks_run
        gof, two = statistics.gof_p_value(a, exact), statistics.two_sample_p_value(a, b)
        assert statistics.checks_run == before
        assert gof == chi_square_gof(a, exact).p_value
        assert two == statistics.chi_square_two_sample(a, b).p_value
        stat, df = statistics.two_sample_statistic(a, b)
        result = statistics.chi_square_two_sample(a, b)
        assert (df, stat) == (result.df, result.statistic)
    assert statistics.gof_p_value(Counter({0: 5, 99: 1}), exact) == 0.0   # impossible outcome
    assert statistics.gof_statistic(Counter({0: 5, 99: 1}), exact)[0] == math.inf


def test_two_sample_pooling_is_one_rule():
    """Two samples pool by combined count at 2 MIN_EXPECTED, and a pool still below it joins
    the smallest group (not a cell of its own, as the served checks' old helper kept it)."""
    a = Counter({"x": 300, "y": 200, "r1": 1, "r2": 2})
    b = Counter({"x": 290, "y": 210, "r3": 1})
    stat, df = statistics.two_sample_statistic(a, b)
    assert df == 1   # {x}, {y, r1, r2, r3}: the pool of 4 joins y
    table = [[300, 203], [290, 211]]
    assert math.isclose(stat, stats.chi2_contingency(table, correction=False)[0], rel_tol=1e-12)


def test_by_position_tells_the_first_token_from_the_later_ones():
    law = {(1, 1): 0.4, (1, 2): 0.1, (2, 1): 0.1, (2, 2): 0.4}
    base = Counter({(1, 1): 400, (1, 2): 100, (2, 1): 100, (2, 2): 400})
    later = Counter({(1, 1): 100, (1, 2): 400, (2, 1): 400, (2, 2): 100})
    first = Counter({(1, 1): 720, (1, 2): 180, (2, 1): 20, (2, 2): 80})
    for split in (statistics.by_position(later, law),
                  statistics.two_sample_by_position(later, base)):
        assert split[0] > ALPHA > split[1]
    for split in (statistics.by_position(first, law),
                  statistics.two_sample_by_position(first, base)):
        assert split[0] < ALPHA < split[1]
    assert statistics.by_position(base, law)[0] > ALPHA and statistics.by_position(base, law)[1] > ALPHA
    assert statistics.by_position(Counter({(1, 3): 1000}), law)[1] == 0.0   # impossible later
    assert statistics.by_position(Counter({(1,): 5}), {(1,): 1.0}) is None
    assert statistics.two_sample_by_position(Counter({(1,): 5}), Counter({(2,): 5})) is None
