"""One calibration run: a family's statistical tests, run by the kit itself (``pytest.main`` on
the family's module, the kit's plugin deciding what applies and how many examples each test
draws), with the p-value of every check recorded.

A *run* of family F on an implementation is what ``pytest properties/test_F.py`` does for F's
statistical tests in the ``dev`` profile: each test's explicit (canonical) examples and its
``dev`` count of generated examples (the ``calibration`` profile: dev's counts, no example
database), each example one call of the test's body (the same check, the same sample plan, the
same n). The implementation is handed to the kit through its ``pytest_kit_impl`` hook
(properties/plugin/hooks.py): the reference, a correct engine, the fake server, or a copy
deviating by a stated total variation (deviate.py). Two things differ from a plain kit run,
both in the seeds:

* the generated examples are drawn with the run's seed (``--hypothesis-seed``; a kit run takes
  Hypothesis's own);
* each example's own seed is mixed with the run's seed (``--kit-reseed``, properties/reseed.py),
  so that the explicit examples and Hypothesis's first generated one (its simplest, the same in
  every run) draw fresh samples in every run.

And one thing differs in what is done with a failure: the kit's own run stops a test at its
first failing example; here a failing example is recorded and the test goes on to its next, so
that every example's checks are counted (a deviating engine's per-check power is measured on
all of them). The run is NOT CONFORMANT exactly when some example failed, as the kit's run
would be. Every check's p-value reaches the collector through ``properties.statistics.recorder``
(None in a kit run).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import time
from pathlib import Path

import pytest
from hypothesis import settings

from properties import harness, profiles, statistics

ROOT = Path(__file__).resolve().parents[2]

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
# the profile a run is made under: dev's example counts, no database, never derandomized
PROFILE = "calibration"


def statistical_tests(family: str) -> list:
    """(name, test) for each statistical test of the family's module (profiles.statistical
    marks them), in the module's order."""
    _under_a_kit_profile()
    module = importlib.import_module(MODULES[family])
    return [(name, fn) for name, fn in vars(module).items()
            if name.startswith("test_") and hasattr(fn, "kit_checks_per_example")]


def _under_a_kit_profile() -> None:
    """Load the calibration profile where no kit profile is (a worker process): a kit test
    module's settings are fixed when it is imported (a decorator's settings take the profile in
    force then), and under Hypothesis's default profile they would keep its 200 ms deadline."""
    profiles.register_profiles()
    if settings.get_current_profile_name() not in profiles.PROFILES:
        settings.load_profile(PROFILE)


def run_once(family: str, impl, run_seed: int, tests=None) -> dict:
    """One run of the family on impl (tests: only these test names; None: every statistical
    test of the family). Returns {family, impl, seed, seconds, failed, failures, skipped,
    records}: a record per check (kit_test: the kit's test, example: "explicit i" or
    "generated j", check: its index in the example; from the check: kind, p, passed, df, n, and
    test: the statistical test it ran, which tells a support-only check from a p-value)."""
    start = time.monotonic()
    before = settings.get_current_profile_name()
    names = [name for name, _ in statistical_tests(family)] if tests is None else list(tests)
    collector = _Collector(impl)
    path = MODULES[family].replace(".", "/") + ".py"
    args = [f"{path}::{name}" for name in names] + [
        f"--rootdir={ROOT}", "-c", str(ROOT / "pyproject.toml"), "-q", "-p", "no:cacheprovider",
        "-p", "no:faulthandler", f"--hypothesis-profile={PROFILE}",
        f"--hypothesis-seed={run_seed}", f"--kit-reseed={run_seed}"]
    output = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(output), \
            contextlib.redirect_stderr(output):
        code = pytest.main(args, plugins=[collector])
    # pytest.main loaded the calibration profile for the whole process: a run inside another
    # pytest session (tests/test_calibration.py) leaves that session's profile as it was
    settings.load_profile(before if before in profiles.PROFILES else PROFILE)
    harness.begin_test("calibration")
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or collector.errors:
        # the kit could not run the family (a usage error, a test erroring outside its body)
        raise RuntimeError(f"the kit's run of {family} on {impl.spec} ended {code!r}: "
                           f"{'; '.join(collector.errors)[:2000]} {output.getvalue()[-2000:]}")
    return {"family": family, "impl": impl.spec, "seed": run_seed,
            "seconds": round(time.monotonic() - start, 3), "failed": bool(collector.failures),
            "failures": collector.failures, "skipped": collector.skipped,
            "records": collector.records}


class _Collector:
    """The calibration's plugin in the kit's run: hands the kit its implementation, and records
    every example's checks and failure (the example's body is wrapped through Hypothesis's hook
    for plugins, ``test.hypothesis.inner_test``, inside the kit's own --kit-reseed wrapper)."""

    def __init__(self, impl):
        self.impl = impl
        self.records, self.failures, self.skipped, self.errors = [], [], {}, []

    def pytest_kit_impl(self, config):
        return self.impl

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        handle = getattr(item.obj, "hypothesis", None)
        if handle is None:       # not a statistical test: nothing of it is recorded
            yield
            return
        body = handle.inner_test
        explicit = len(getattr(getattr(body, "kit_unsalted", body), "hypothesis_explicit_examples",
                               ()))
        calls = []

        def example(*args, **kwargs):
            i = len(calls)
            label = f"explicit {i}" if i < explicit else f"generated {i - explicit}"
            calls.append(label)
            statistics.recorder = found = []
            try:
                body(*args, **kwargs)
            except Exception as exc:   # noqa: BLE001 - any exception fails a kit run too
                self.failures.append({"test": item.name, "example": label,
                                      "case": repr(kwargs.get("case")),
                                      "error": f"{type(exc).__name__}: {str(exc)[:2000]}"})
            finally:
                statistics.recorder = None
            self.records.extend(dict(r, kit_test=item.name, example=label, check=i)
                                for i, r in enumerate(found))

        handle.inner_test = example
        try:
            yield
        finally:
            handle.inner_test = body

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
                report.longrepr)
            self.skipped[report.nodeid.rpartition("::")[2]] = reason
        elif report.failed:
            self.errors.append(f"{report.nodeid} ({report.when}): "
                               f"{str(report.longrepr).splitlines()[-1:] }")
