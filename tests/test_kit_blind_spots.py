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
@pytest.mark.extra
def test_float32_stats_engine_is_conformant(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:Float32Stats", BOUNDS, tmp_path)
    assert data["verdict"] == "CONFORMANT", proc.stdout[-3000:]
    assert data["families"]["bounds"]["passed"] > 0
    assert "StatsRounding" in proc.stdout or "float32 rounding only" in proc.stdout


@pytest.mark.slow
@pytest.mark.extra
def test_stats_off_by_more_than_rounding_are_rejected(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:AcceptanceOffByRounding",
                         ["properties/test_bounds.py"], tmp_path, "-x")
    assert data["families"]["bounds"]["failed"] > 0, proc.stdout[-3000:]
    assert "more than float32 rounding" in proc.stdout


# ----------------------------------------------------------------- class 1: rows that share randomness

@pytest.mark.slow
@pytest.mark.extra
@pytest.mark.parametrize("name", ["SharedAcceptanceUniforms", "SharedDraws"])
def test_rows_sharing_randomness_are_rejected(name, tmp_path):
    """Each row's own law is exact; the pairs of rows are not independent."""
    proc, data = run_kit(f"tests/mutants/batched.py:{name}", ["properties/test_batched.py"],
                         tmp_path, "-x", "-k", "sampled")
    assert data["families"]["batched"]["failed"] > 0, proc.stdout[-3000:]
    assert "not distributed as independent samples" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.extra
def test_independent_rows_pass(tmp_path):
    proc, data = run_kit("fast", ["properties/test_batched.py"], tmp_path)
    assert data["families"]["batched"]["failed"] == 0, proc.stdout[-3000:]
    assert data["families"]["batched"]["passed"] > 0


# ----------------------------------------------------------------- class 6: the engine's own sampler

SEQ = ["properties/test_sequence.py", "properties/test_sampler.py"]


@pytest.mark.slow
@pytest.mark.extra
def test_own_sampler_differing_from_the_convention_is_named_as_such(tmp_path):
    """Top-p before temperature, with target_generate: speculation exact relative to it (the
    sequence family passes), the sampler's difference reported by family sampler, and the
    headline says which is which; never a plain CONFORMANT."""
    proc, data = run_kit("tests/mutants/conventions.py:TopPFirstWithHook", SEQ, tmp_path)
    assert data["families"]["sequence"]["failed"] == 0, proc.stdout[-3000:]
    assert data["families"]["sequence"]["passed"] > 0
    assert data["families"]["sampler"]["failed"] > 0, proc.stdout[-3000:]
    assert data["verdict"] != "CONFORMANT"
    assert any("speculation exact relative to the engine's own sampler" in h
               for h in data["headlines"]), data["headlines"]
    assert "differs from the convention" in proc.stdout


@pytest.mark.slow
@pytest.mark.extra
def test_without_the_hook_the_mismatch_may_be_either(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:TopPFirstNoHook", SEQ, tmp_path, "-x")
    assert data["families"]["sequence"]["failed"] > 0
    assert "this can be the speculation or the engine's own sampler" in proc.stdout


@pytest.mark.slow
@pytest.mark.extra
def test_speculation_bug_is_caught_against_the_own_sampler(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:BrokenSpeculationWithHook",
                         ["properties/test_sequence.py"], tmp_path, "-x")
    assert data["families"]["sequence"]["failed"] > 0, proc.stdout[-3000:]
    assert "not distributed as the engine's own sampler's" in proc.stdout


@pytest.mark.slow
@pytest.mark.extra
def test_conventional_own_sampler_is_conformant(tmp_path):
    proc, data = run_kit("tests/mutants/conventions.py:ConventionalWithHook", SEQ, tmp_path)
    assert data["verdict"] == "CONFORMANT", proc.stdout[-3000:]
    assert data["families"]["sampler"]["passed"] > 0 and not data["headlines"]


# ----------------------------------------------------------------- class 7: one cause, one headline

def test_causes_with_other_numbers_are_one_cause():
    from properties.verdict import _shared_causes
    entries = {"greedy": {"causes": {"a": "the engine raised IndexError: index 3 is out of range"}},
               "bounds": {"causes": {"b": "the engine raised IndexError: index 12 is out of range"}},
               "cache": {"causes": {"c": "something else"}}}
    shared = _shared_causes(entries)
    assert len(shared) == 1 and shared[0]["families"] == ["bounds", "greedy"]


@pytest.mark.slow
@pytest.mark.extra
def test_too_many_tokens_is_one_headline_across_families(tmp_path):
    """WholeBlockOvershoot returns more than max_new_tokens: every family that sees it names that
    one cause, grouped once; no family guesses another cause (a tiny temperature, say)."""
    paths = [f"properties/test_{f}.py" for f in ("greedy", "bounds", "perfect_draft", "sequence")]
    proc, data = run_kit("tests/mutants/catalogue.py:WholeBlockOvershoot", paths, tmp_path)
    failing = {f for f, e in data["families"].items() if e["failed"]}
    assert len(failing) >= 3, failing
    shared = data["shared_causes"]
    assert shared and shared[0]["cause"].startswith("the engine returns more tokens than "
                                                    "max_new_tokens"), shared
    assert set(shared[0]["families"]) == failing, (shared, failing)
    assert "tiny temperature" not in proc.stdout


@pytest.mark.slow
@pytest.mark.extra
def test_a_crash_on_an_edge_case_does_not_hide_a_sampling_bug(tmp_path):
    proc, data = run_kit("tests/mutants/two_bugs.py:CrashesOnShortOutputs",
                         ["properties/test_sequence.py"], tmp_path, "-x")
    assert data["families"]["sequence"]["failed"] > 0
    assert "not distributed as the target's sampling" in proc.stdout, proc.stdout[-3000:]
    assert "IndexError" in proc.stdout
