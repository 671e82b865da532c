"""The deterministic checks' stated power (issue 42): each deterministic property states the
smallest per-example hit rate f its n generated examples detect with probability >= 0.99,
(1 - f)^n <= 0.01; the served checks that are single deterministic requests get the examples
for f <= 0.1 in every profile; CONFORMANCE.md's table of f is the code's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from properties import profiles

ROOT = Path(__file__).resolve().parents[1]

# the served checks that are single deterministic requests (cheap on every engine): f <= 0.1
SERVED_SINGLE_REQUESTS = {
    "test_served_greedy": ("test_greedy_equals_target_and_baseline",),
    "test_served_bounds": ("test_greedy_stops_and_length", "test_counters_equal_exact_acceptance"),
    "test_served_perfect_draft": ("test_perfect_draft_accepted_at_rate_one",),
    "test_served_params": ("test_greedy_repetition_penalty",
                           "test_greedy_presence_and_frequency_penalties",
                           "test_greedy_logit_bias", "test_stop_strings_inside_accepted_blocks",
                           "test_greedy_rounds_repetition_penalty",
                           "test_greedy_rounds_presence_and_frequency_penalties",
                           "test_greedy_rounds_logit_bias_with_penalties"),
}


def deterministic_tests():
    """(module stem, name, scale, asked rate) of every deterministic property of the kit."""
    for path in sorted((ROOT / "properties").glob("test_*.py")):
        module = importlib.import_module(f"properties.{path.stem}")
        for name, fn in vars(module).items():
            if name.startswith("test_") and hasattr(fn, "kit_deterministic_scale"):
                yield path.stem, name, fn.kit_deterministic_scale, fn.kit_hit_rate


def test_hit_rate_is_the_smallest_detected_with_the_stated_probability():
    for n in (1, 2, 5, 8, 25, 44, 300):
        f = profiles.hit_rate(n)
        assert (1 - f) ** n == pytest.approx(0.01, rel=1e-9)
        # a smaller rate is missed more often than 1 in 100
        assert (1 - 0.999 * f) ** n > 0.01
    assert profiles.hit_rate(25) == pytest.approx(0.1682, abs=1e-4)
    assert profiles.examples_for(0.1) == 44 and 0.9 ** 44 <= 0.01 < 0.9 ** 43
    assert profiles.examples_for(profiles.hit_rate(25)) == 25
    with pytest.raises(ValueError, match="n must be >= 1"):
        profiles.hit_rate(0)
    with pytest.raises(ValueError, match="hit rate must be in"):
        profiles.examples_for(0.0)


def test_hit_rate_by_simulation():
    """A defect that shows on a share f = hit_rate(n) of examples, drawn independently, is
    missed by n examples in about 1 % of 20,000 simulated runs."""
    rng = np.random.default_rng(42)
    for n in (5, 44):
        f = profiles.hit_rate(n)
        missed = (rng.random((20_000, n)) >= f).all(axis=1).mean()
        assert 0.007 < missed < 0.013, (n, missed)


def test_served_single_request_checks_state_f_at_most_a_tenth_in_every_profile():
    found = {}
    for stem, name, scale, rate in deterministic_tests():
        found.setdefault(stem, {})[name] = (scale, rate)
    for stem, names in SERVED_SINGLE_REQUESTS.items():
        for name in names:
            scale, rate = found[stem][name]
            assert rate == profiles.SERVED_HIT_RATE, (stem, name)
            for profile in profiles.PROFILES:
                n = profiles.deterministic_examples(scale, profile, rate)
                assert profiles.hit_rate(n) <= 0.1, (stem, name, profile, n)


def test_stated_reads_the_count_in_force():
    from properties import test_served_params as module
    stated = profiles.stated(module.test_greedy_repetition_penalty)
    assert stated["examples"] == profiles.deterministic_examples(0.2, profiles.current(), 0.1)
    assert stated["explicit"] == 1 and stated["asked"] == 0.1
    assert profiles.stated(module.test_law_repetition_penalty) is None     # statistical
    from properties import test_rule
    assert profiles.stated(test_rule.test_chapter_worked_example) is None   # fixed cases


def table() -> list[str]:
    """CONFORMANCE.md's table rows: each deterministic check's generated examples n and its f
    in the dev (and ci) profile and in the thorough one."""
    rows = []
    for stem, name, scale, rate in deterministic_tests():
        n, m = (profiles.deterministic_examples(scale, p, rate) for p in ("dev", "thorough"))
        rows.append(f"| `{stem}.py::{name}` | {n} | {profiles.hit_rate(n):.3f} | {m} | "
                    f"{profiles.hit_rate(m):.3f} |")
    return rows


def test_conformance_md_states_the_codes_f():
    text = (ROOT / "CONFORMANCE.md").read_text()
    block = text.split("<!-- deterministic power: begin -->", 1)[1].split(
        "<!-- deterministic power: end -->", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    expected = table()
    assert rows == expected, "\n".join(r for r in expected if r not in rows)
    assert re.search(r"f = 1 - 0\.01\^\(1/n\)", text)


if __name__ == "__main__":   # print the table (python -m tests.test_deterministic_power)
    print("\n".join(table()))
