"""Hypothesis profiles for the kit, and the per-test settings derived from the active one.

    dev       the default: 25 examples per deterministic property, shrinking on, the example
              database on (a failing example is replayed first on the next run)
    ci        Hypothesis's built-in ci profile (no deadline, no database, print_blob) plus
              derandomize=True: every CI run draws the same examples; the default when the
              environment variable CI is set
    thorough  300 examples per deterministic property, 10 per statistical one
    selftest  for running the kit on the mutant catalogue: 8 examples, no shrinking, no
              database, derandomized

Choose one with ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``.

Statistical properties draw far fewer examples than deterministic ones, because each example
is already thousands of samples and a statistical check; their counts are capped per profile in
``STATISTICAL_EXAMPLES`` so that a full run stays within the alpha budget of
``properties.statistics`` (at most MAX_CHECKS_PER_RUN checks).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("dev", "ci", "thorough", "selftest")
DETERMINISTIC_EXAMPLES = {"dev": 25, "ci": 25, "thorough": 300, "selftest": 8}
STATISTICAL_EXAMPLES = {"dev": 2, "ci": 2, "thorough": 10, "selftest": 1}
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """Register the kit's profiles (idempotent)."""
    if "selftest" in getattr(settings, "_profiles", {}):
        return
    common = dict(deadline=None, suppress_health_check=_SUPPRESS, print_blob=True)
    settings.register_profile("dev", max_examples=DETERMINISTIC_EXAMPLES["dev"], **common)
    settings.register_profile("ci", parent=settings.get_profile("ci"), derandomize=True,
                              max_examples=DETERMINISTIC_EXAMPLES["ci"], **common)
    settings.register_profile("thorough", max_examples=DETERMINISTIC_EXAMPLES["thorough"], **common)
    settings.register_profile("selftest", max_examples=DETERMINISTIC_EXAMPLES["selftest"],
                              derandomize=True, database=None,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate), **common)


def default_profile() -> str:
    """HYPOTHESIS_PROFILE if set, else ci when CI is set, else dev."""
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name:
        return name
    return "ci" if os.environ.get("CI") else "dev"


def current() -> str:
    """The kit profile in force (a verbosity suffix added by the pytest plugin is ignored)."""
    try:
        name = settings.get_current_profile_name()
    except (AttributeError, AssertionError):
        return "dev"
    base = name.split("-with-")[0]
    return base if base in PROFILES else "dev"


def deterministic(scale: float = 1.0) -> settings:
    """Settings for a deterministic property (scale: its share of the profile's examples)."""
    n = max(1, round(DETERMINISTIC_EXAMPLES[current()] * scale))
    return settings(max_examples=n)


def generated_examples(scale: float, profile: str, explicit_only_unless_thorough=False) -> int:
    """Generated examples of a statistical property in `profile`: its share (scale) of the
    profile's count, at least one; none outside `thorough` for a property whose explicit
    (canonical) examples are each sized for a small deviation and too costly to add to in a
    quick profile."""
    if explicit_only_unless_thorough and profile != "thorough":
        return 0
    return max(1, round(STATISTICAL_EXAMPLES[profile] * scale))


def statistical(checks: int, scale: float = 1.0, explicit_only_unless_thorough: bool = False):
    """Decorator for a statistical property that makes `checks` chi-square checks per example:
    few examples and no shrinking (each example is thousands of samples; a shrink step would
    cost as much as an example). The count is recorded on the test for the alpha budget
    (tests/test_statistics.py adds them up for every profile)."""
    n = generated_examples(scale, current(), explicit_only_unless_thorough)
    phases = (Phase.explicit, Phase.reuse, Phase.generate) if n else (Phase.explicit,)
    applied = settings(max_examples=max(1, n), phases=phases)

    def decorate(test):
        test = applied(test)
        test.kit_checks_per_example = checks
        test.kit_examples_scale = scale
        test.kit_explicit_only_unless_thorough = explicit_only_unless_thorough
        return test

    return decorate
