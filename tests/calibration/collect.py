"""One calibration run: a family's statistical tests, executed by the kit's own test bodies, with
the p-value of every check they make recorded.

A *run* of family F on an implementation is what ``pytest properties/test_F.py`` does for F's
statistical tests in the ``dev`` profile: each test's explicit (canonical) examples and its
``dev`` count of generated examples, each example one call of the test's body (the same check,
the same sample plan, the same n). Two things differ, and only in the seeds:

* the generated examples are drawn from the test's own strategy with the run's seed (a kit run
  takes Hypothesis's seed; here each run takes a distinct one, never derandomized);
* each example's own seed (``case.seed``, ``case.sampling.seed``) is mixed with the run's
  seed. In a kit run a canonical example always draws the same samples, so its p-value is one
  number; its false-alarm rate is a statement over those seeds, which is what a run of many
  seeds measures. The same holds for the first generated example: Hypothesis tries its
  simplest example first, whatever its seed, so a test's first generated case (its seed
  included) is the same in every run. The models (their specs' seeds) are left alone: the case
  is the kit's.

Every check's p-value reaches the collector through ``properties.statistics.recorder`` (None in
a kit run); a check that raises (a PropertyFailure, or anything else) ends the run NOT
CONFORMANT, as it would end the kit's run.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import time

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from properties import harness, profiles, statistics

# the statistical families and the kit module holding each one's tests
MODULES = {
    "rule": "properties.test_rule",
    "sequence": "properties.test_sequence",
    "sampler": "properties.test_sampler",
    "batched": "properties.test_batched",
    "tree": "properties.test_tree",
    "served_sequence": "properties.test_served_sequence",
    # its laws under penalties, min_p and a bias (two tokens and several rounds) and n > 1
    "served_params": "properties.test_served_params",
}
PROFILE = "dev"   # the profile whose example counts a run reproduces


def statistical_tests(family: str) -> list:
    """(name, test) for each statistical test of the family's module (profiles.statistical
    marks them), in the module's order."""
    module = importlib.import_module(MODULES[family])
    return [(name, fn) for name, fn in vars(module).items()
            if name.startswith("test_") and hasattr(fn, "kit_checks_per_example")]


def not_applicable(impl, family: str, fn) -> str | None:
    """Why the kit would skip this test on impl (its plugin's own rule), or None."""
    from properties.plugin.kit import not_applicable as kit_rule
    needs = next((m for m in getattr(fn, "pytestmark", []) if m.name == "needs"), None)
    reason = kit_rule(impl, family, needs)
    if reason is None and family == "sampler" and not impl.has_function("target_generate"):
        return "no target_generate"       # test_sampler's own fixture skips it so
    return reason


def mix(seed: int, salt: int) -> int:
    """A seed derived from a case's seed and the run's, distinct for distinct runs."""
    return int(np.random.SeedSequence([seed, salt, 25]).generate_state(1, np.uint32)[0])


def reseed(case, salt: int):
    """The case with its own sampling randomness drawn afresh (its models untouched)."""
    if hasattr(case, "pair"):                               # RuleCase
        return dataclasses.replace(case, seed=mix(case.seed, salt))
    seed = case.sampling.seed or 0
    return case.replace(seed=mix(seed, salt))


def generated_cases(fn, count: int, run_seed: int) -> list:
    """`count` examples drawn by Hypothesis from the test's own strategy, seeded by run_seed."""
    (name, strategy), = fn.hypothesis._given_kwargs.items()
    drawn = []

    @hypothesis_seed(run_seed)
    @settings(max_examples=count, phases=(Phase.generate,), database=None, derandomize=False,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(case):
        drawn.append(case)

    draw()
    return drawn[:count]


def examples(fn, run_seed: int) -> list:
    """(label, case) of one run of the test: explicit examples reseeded, then generated ones."""
    out = [(f"explicit {i}", reseed(e.kwargs["case"], run_seed))
           for i, e in enumerate(getattr(fn, "hypothesis_explicit_examples", ()))]
    count = profiles.generated_examples(fn.kit_examples_scale, PROFILE,
                                        fn.kit_explicit_only_unless_thorough)
    out += [(f"generated {i}", reseed(case, run_seed)) for i, case in enumerate(
        generated_cases(fn, count, run_seed) if count else [])]
    return out


def run_once(family: str, impl, run_seed: int, tests: list | None = None) -> dict:
    """One run of the family on impl. Returns {family, impl, seed, seconds, failed, failures,
    records}: a record per check (kit_test: the kit's test, example, check: its index in the
    example; from the check: kind, p, passed, df, n, and test: the statistical test it ran, which
    tells a support-only check from a p-value)."""
    start = time.monotonic()
    records, failures, skipped = [], [], {}
    for name, fn in (tests if tests is not None else statistical_tests(family)):
        reason = not_applicable(impl, family, fn)
        if reason:
            skipped[name] = reason
            continue
        body = fn.hypothesis.inner_test
        argument = next(iter(inspect.signature(body).parameters))   # impl, or served
        for label, case in examples(fn, run_seed):
            os.environ["PYTEST_CURRENT_TEST"] = f"{MODULES[family]}::{name} (call)"
            statistics.recorder = found = []
            try:
                body(**{argument: impl, "case": case})
            except Exception as exc:     # noqa: BLE001 - any exception ends a kit run too
                failures.append({"test": name, "example": label, "case": repr(case),
                                 "error": f"{type(exc).__name__}: {str(exc)[:2000]}"})
            finally:
                statistics.recorder = None
            records += [dict(r, kit_test=name, example=label, check=i) for i, r in enumerate(found)]
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    harness.begin_test("calibration")
    return {"family": family, "impl": impl.spec, "seed": run_seed,
            "seconds": round(time.monotonic() - start, 3), "failed": bool(failures),
            "failures": failures, "skipped": skipped, "records": records}
