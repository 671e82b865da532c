"""The kit's blind spots, round 3 (issue 15): each class of miss or false alarm shown by an
engine of that class the kit now rejects, and a correct one it still passes.

The subprocess runs use tests/test_kit_selftest.py's run_kit (the selftest profile, one family).
"""

from __future__ import annotations

import warnings

import pytest

from properties.harness import STATS_RTOL, StatsRounding, stat_in_range
from tests.test_kit_selftest import run_kit


# ----------------------------------------------------------------- class 5: float32 statistics

def test_float32_rounding_is_admitted_and_said():
    """4/6 in float32 is 0.6666666865: outside the exact value by 3e-8 relative, which an
    absolute 1e-9 rejected; within STATS_RTOL it passes, with a warning that says so."""
    f32 = 0.6666666865348816
    assert abs(f32 - 4 / 6) > 1e-9
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert stat_in_range("acceptance_rate", f32, 4 / 6, 4 / 6) is None
    assert len(caught) == 1 and issubclass(caught[0].category, StatsRounding)
    assert "float32 rounding only" in str(caught[0].message)


def test_more_than_rounding_is_a_failure_that_says_so():
    problem = stat_in_range("acceptance_rate", 4 / 6 + 1e-5, 4 / 6, 4 / 6)
    assert problem and "more than float32 rounding" in problem and "acceptance_rate" in problem
    assert stat_in_range("acceptance_rate", 1 + 4 * STATS_RTOL, 0.0, 1.0)
    assert stat_in_range("acceptance_rate", -1e-5, 0.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert stat_in_range("acceptance_rate", 1 + STATS_RTOL / 2, 0.0, 1.0) is None


BOUNDS = ["properties/test_bounds.py", "properties/test_perfect_draft.py"]


@pytest.mark.slow
def test_float32_stats_engine_is_conformant(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:Float32Stats", BOUNDS, tmp_path)
    assert data["verdict"] == "CONFORMANT", proc.stdout[-3000:]
    assert data["families"]["bounds"]["passed"] > 0
    assert "StatsRounding" in proc.stdout or "float32 rounding only" in proc.stdout


@pytest.mark.slow
def test_stats_off_by_more_than_rounding_are_rejected(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:AcceptanceOffByRounding",
                         ["properties/test_bounds.py"], tmp_path, "-x")
    assert data["families"]["bounds"]["failed"] > 0, proc.stdout[-3000:]
    assert "more than float32 rounding" in proc.stdout


# ----------------------------------------------------------------- class 1: rows that share randomness

@pytest.mark.slow
@pytest.mark.parametrize("name", ["SharedAcceptanceUniforms", "SharedDraws"])
def test_rows_sharing_randomness_are_rejected(name, tmp_path):
    """Each row's own law is exact; the pairs of rows are not independent."""
    proc, data = run_kit(f"tests/mutants/batched.py:{name}", ["properties/test_batched.py"],
                         tmp_path, "-x", "-k", "sampled")
    assert data["families"]["batched"]["failed"] > 0, proc.stdout[-3000:]
    assert "not distributed as independent samples" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_independent_rows_pass(tmp_path):
    proc, data = run_kit("fast", ["properties/test_batched.py"], tmp_path)
    assert data["families"]["batched"]["failed"] == 0, proc.stdout[-3000:]
    assert data["families"]["batched"]["passed"] > 0
