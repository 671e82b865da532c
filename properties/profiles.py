"""Hypothesis profiles for the kit, and the per-test settings derived from the active one.

    dev       the default: 25 examples per deterministic property, shrinking on, the example
              database on (a failing example is replayed first on the next run)
    ci        Hypothesis's built-in ci profile (no deadline, no database, print_blob) plus
              derandomize=True: every CI run draws the same examples; the default when the
              environment variable CI is set
    thorough  300 examples per deterministic property, 10 per statistical one
    selftest  for running the kit on the mutant catalogue: 8 examples, no shrinking, no
              database, derandomized
    calibration  dev's example counts with no database and never derandomized: one run of the
              calibration (tests/calibration) is a kit run under it, its generated examples
              chosen by ``--hypothesis-seed`` and its samples by ``--kit-reseed``

Choose one with ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``.

Statistical properties draw far fewer examples than deterministic ones, because each example
is already thousands of samples and a statistical check; their counts are capped per profile in
``STATISTICAL_EXAMPLES`` so that a full run stays within the alpha budget of
``properties.statistics`` (at most MAX_CHECKS_PER_RUN checks).

A deterministic property states its power too: the smallest per-example hit rate f (the share
of the strategy's examples on which a defect shows) that its n generated examples detect with
probability >= DETECTION, (1 - f)^n <= 1 - DETECTION, so f = 1 - (1 - DETECTION)^(1/n)
(`hit_rate`; 0.17 at the default 25 examples, 0.10 at 44). A property that asks for a hit rate
(``deterministic(scale, hit_rate=0.1)``: the served checks that are single deterministic
requests, cheap on every engine) gets at least `examples_for(hit_rate)` examples in every
profile. Explicit examples come on top and are not counted: they are fixed, not drawn.
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("dev", "ci", "thorough", "selftest", "calibration")
DETERMINISTIC_EXAMPLES = {"dev": 25, "ci": 25, "thorough": 300, "selftest": 8, "calibration": 25}
STATISTICAL_EXAMPLES = {"dev": 2, "ci": 2, "thorough": 10, "selftest": 1, "calibration": 2}
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """Register the kit's profiles (idempotent)."""
    if "calibration" in getattr(settings, "_profiles", {}):
        return
    common = dict(deadline=None, suppress_health_check=_SUPPRESS, print_blob=True)
    settings.register_profile("dev", max_examples=DETERMINISTIC_EXAMPLES["dev"], **common)
    settings.register_profile("ci", parent=settings.get_profile("ci"), derandomize=True,
                              max_examples=DETERMINISTIC_EXAMPLES["ci"], **common)
    settings.register_profile("thorough", max_examples=DETERMINISTIC_EXAMPLES["thorough"], **common)
    settings.register_profile("selftest", max_examples=DETERMINISTIC_EXAMPLES["selftest"],
                              derandomize=True, database=None,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate), **common)
    # a failing example is not stored: a later run would replay it first, and its runs would
    # no longer be independent draws
    settings.register_profile("calibration", max_examples=DETERMINISTIC_EXAMPLES["calibration"],
                              database=None, derandomize=False, **common)


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


# a deterministic property's stated detection probability (its f: hit_rate)
DETECTION = 0.99
# the hit rate the served checks that are single deterministic requests are sized for
SERVED_HIT_RATE = 0.1


def hit_rate(n: int, detection: float = DETECTION) -> float:
    """The smallest per-example hit rate f that n independent examples detect with probability
    >= detection: (1 - f)^n <= 1 - detection, f = 1 - (1 - detection)^(1/n)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1.0 - (1.0 - detection) ** (1.0 / n)


def examples_for(rate: float, detection: float = DETECTION) -> int:
    """The fewest examples that detect a defect of per-example hit rate `rate` with probability
    >= detection (44 at 0.1)."""
    if not 0 < rate <= 1:
        raise ValueError(f"a hit rate must be in (0, 1], got {rate}")
    if rate == 1:
        return 1
    return math.ceil(math.log1p(-detection) / math.log1p(-rate) - 1e-12)


def deterministic_examples(scale: float, profile: str, rate: float | None = None) -> int:
    """Generated examples of a deterministic property in `profile`: its share (scale) of the
    profile's count, at least one, and at least examples_for(rate) where it asks for a rate."""
    n = max(1, round(DETERMINISTIC_EXAMPLES[profile] * scale))
    return n if rate is None else max(n, examples_for(rate))


class deterministic:
    """Decorator for a deterministic property: its share (scale) of the profile's examples, at
    least examples_for(hit_rate) where a hit rate is asked for. Records both on the test (the
    stated f of any profile follows: `stated`); `.max_examples` is the count in force."""

    def __init__(self, scale: float = 1.0, hit_rate: float | None = None):
        self.scale, self.rate = scale, hit_rate
        self.max_examples = deterministic_examples(scale, current(), hit_rate)

    def __call__(self, test):
        test = settings(max_examples=self.max_examples)(test)
        test.kit_deterministic_scale = self.scale
        test.kit_hit_rate = self.rate
        return test


def stated(test) -> dict | None:
    """What a kit test states about its power, from the function pytest collected: a
    deterministic property (a Hypothesis test that makes no statistical check) its generated
    examples n and f = hit_rate(n); None for a statistical property (its plan states its power)
    and for a test of fixed cases (nothing is drawn)."""
    if test is None or hasattr(test, "kit_checks_per_example"):
        return None
    explicit = len(getattr(getattr(getattr(test, "hypothesis", None), "inner_test", test),
                           "hypothesis_explicit_examples", ()))
    chosen = getattr(test, "_hypothesis_internal_use_settings", None)
    if chosen is None or not hasattr(test, "hypothesis"):
        n = getattr(test, "kit_stateful_examples", None)
        if n is None:
            return None
        n = n()
    else:
        n = int(chosen.max_examples)
    return {"examples": n, "explicit": explicit, "hit_rate": hit_rate(n),
            "asked": getattr(test, "kit_hit_rate", None)}


def stateful(scale: float):
    """Decorator for a test that runs a Hypothesis state machine with
    ``deterministic(scale).max_examples`` examples: records that count for `stated`."""
    def decorate(test):
        test.kit_stateful_examples = lambda: deterministic(scale).max_examples
        test.kit_deterministic_scale, test.kit_hit_rate = scale, None
        return test
    return decorate


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
