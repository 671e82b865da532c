"""The conformance kit as a pytest plugin: ``pytest properties/ --impl=NAME``.

Options:
    --impl=NAME              what is checked (see properties/impl.py); default: reference
    --known-failures=PATH    the implementation's known failures (properties/known.py: test id,
                             the defect's cause signature, reproduction, confirming run); a
                             failure matching an entry is reported as known (xfailed), entries
                             matching no test are warned about
    --time-limit=SECONDS     start no test after SECONDS: the run ends INCOMPLETE (or NOT
                             CONFORMANT on what was reached), saying how far it got
    --conformance-json=PATH  write the conformance summary as JSON: first at the start of the
                             run with verdict INCOMPLETE, then, when the run ends, the verdict
    --kit-timeout=SECONDS    time limit of each call into the implementation (0: none)
    --kit-families=A,B       run only these families (properties/families.py)
    --kit-trained=DIR        the trained models of the *_trained properties: a directory written
                             by make models (default: the committed reference/trained) or make
                             models-large (the weight-bound target)
    --kit-report=DIR         write DIR/index.html (the evidence behind the verdict, as pictures)
                             and DIR/report.json, the data it was drawn from (properties/report/)
    --kit-reseed=SALT        every case's own samples drawn afresh with SALT (properties/reseed.py:
                             what the calibration's runs take, one salt each)

A program running the kit with ``pytest.main(args, plugins=[obj])`` may hand it the
implementation itself (the hook ``pytest_kit_impl``, properties/plugin/hooks.py).

The implementation is loaded and its signatures checked before collection: a bad --impl is one
usage error, not hundreds of failures. Each test module declares its family
(``pytestmark = pytest.mark.family(NAME)``); a test the implementation cannot run (its family's
level is missing, a model kind or keyword it lacks, KIT_NOT_APPLICABLE) is skipped as not
applicable before any example is drawn. The run ends with a conformance summary, family by
family, and one verdict (properties/verdict.py decides it from the run's Session,
properties/session.py). A production engine the kit starts (--engine, --method) is part of the
same run: properties/plugin/served.py starts its servers when the session is made.
"""

from __future__ import annotations

import importlib
import json
import time
import warnings
from pathlib import Path

import pytest
import torch

from properties import (evidence, families, guards, harness, known, profiles, progress, reseed,
                        statistics)
from properties import session as sessions
from properties.impl import LEVELS, ImplError, load
from properties.report import collect
from properties.session import Session
from properties.plugin.say import say
from properties.verdict import OUTCOMES, RANK, summary, verdict_line


class KitWarning(UserWarning):
    """Something about the kit's configuration deserves attention (e.g. a stale xfail id)."""


def pytest_addoption(parser):
    group = parser.getgroup("conformance kit")
    group.addoption("--impl", default="reference", metavar="NAME",
                    help="implementation under test: reference (default), fast, a module name, "
                         "a path to a .py file, optionally followed by :ATTR (a class or object "
                         "providing the functions)")
    group.addoption("--known-failures", default=None, metavar="PATH",
                    help="known failures of the implementation (properties/known.py): "
                         "VERSION | METHOD | TEST ID | CAUSE REGEX | REPRODUCTION | CONFIRMED")
    group.addoption("--time-limit", default=None, type=float, metavar="SECONDS",
                    help="start no test after SECONDS: the run ends with the tests reached, "
                         "INCOMPLETE (or NOT CONFORMANT on what was reached)")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write the conformance summary as JSON to PATH (verdict INCOMPLETE "
                         "until the run ends)")
    group.addoption("--kit-report", default=None, metavar="DIR",
                    help="write a report to DIR: index.html (self-contained, the evidence "
                         "behind each verdict as pictures) and report.json, its data")
    group.addoption("--kit-timeout", default=guards.TIMEOUT, type=float, metavar="SECONDS",
                    help=f"time limit of each call into the implementation, in seconds "
                         f"(default {guards.TIMEOUT:g}; 0: no limit)")
    group.addoption("--kit-families", default=None, metavar="A,B",
                    help=f"run only these property families: {', '.join(families.FAMILIES)}")
    group.addoption("--kit-trained", default=None, metavar="DIR",
                    help="trained models for the *_trained properties: a directory written by "
                         "make models (default: reference/trained) or make models-large")
    group.addoption("--kit-reseed", default=None, type=int, metavar="SALT",
                    help="mix SALT into every case's own sampling seed, so that runs with "
                         "distinct salts draw distinct samples for every example, the explicit "
                         "ones included (the calibration's runs; properties/reseed.py)")


def _selected_families(config) -> tuple[str, ...] | None:
    text = config.getoption("--kit-families")
    if not text:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in families.FAMILIES]
    if unknown or not names:
        raise pytest.UsageError(f"--kit-families={text}: unknown family {', '.join(unknown)}; "
                                f"the families are {', '.join(families.FAMILIES)}")
    return names


def item_family(item) -> str | None:
    mark = item.get_closest_marker("family")
    return mark.args[0] if mark is not None else None


def _report_family(report) -> str | None:
    for name, value in getattr(report, "user_properties", ()):
        if name == "kit_family":
            return value
    return None


def pytest_configure(config):
    profiles.register_profiles()
    try:
        guards.set_timeout(config.getoption("--kit-timeout"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    limit = config.getoption("--time-limit")
    if limit is not None and not limit > 0:
        raise pytest.UsageError(f"--time-limit={limit:g}: give a number of seconds > 0")
    chosen = _selected_families(config)
    trained = config.getoption("--kit-trained")
    if trained:
        from properties.models import use_trained_models
        try:
            use_trained_models(trained)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    from properties.plugin import served
    try:
        # a served engine (--impl=openai:URL, or --engine: the kit starts it) is built by the
        # served plugin, configured from its options; anything else is found by impl.load
        impl, launch = config.hook.pytest_kit_impl(config=config), None
        if impl is None:
            impl, launch = served.implementation(config)
        if impl is None:
            impl = load(config.getoption("--impl"))
    except ImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = Session(impl, families=chosen if launch is None else launch.families(chosen),
                      time_limit=limit, launch=launch)
    config.stash[sessions.KEY] = session
    path = config.getoption("--known-failures")
    if path:
        try:
            session.known = known.read(path, session.version, session.method)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        session.known_source = str(path)
    report_dir = config.getoption("--kit-report")
    if report_dir is None and launch is not None:
        report_dir = str(launch.run_dir / "report")
    # Workers record evidence too (it reaches the controller with each report); only the
    # controller writes the page, so only it checks the folder.
    evidence.enable(report_dir is not None)
    session.report = (collect.prepare(report_dir) if report_dir is not None
                      and not hasattr(config, "workerinput") else None)
    config.pluginmanager.register(_Recorder(config, session), "conformance-kit-recorder")
    if not hasattr(config, "workerinput"):
        _write_json(config, None)   # a run that dies before the end leaves INCOMPLETE behind


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The kit's models are tiny: one intra-op thread is fastest, and on a shared machine
    several threads per tiny op cost far more in synchronization than they save. Per module,
    so that tests outside the kit run in the same session keep their thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def impl(pytestconfig):
    """The implementation under test (properties.impl.Impl)."""
    return sessions.of(pytestconfig).impl


def pytest_report_header(config):
    session = sessions.of(config)
    if session is None:
        return None
    impl, chosen = session.impl, session.families
    return [f"conformance kit: {line}" for line in impl.header().splitlines()] + [
        f"conformance kit: hypothesis profile {profiles.current()}; each statistical check at "
        f"alpha={statistics.ALPHA:.0e}, power {statistics.POWER} at its stated deviation; "
        f"time limit {guards.TIMEOUT:g} s per call (--kit-timeout)"
        + (f"; families: {', '.join(chosen)} (--kit-families)" if chosen else "")
        + (f"; trained models {config.getoption('--kit-trained')} (--kit-trained)"
           if config.getoption("--kit-trained") else "")]


def pytest_runtest_setup(item):
    session = sessions.of(item.config)
    family = item_family(item)
    if session is None or family is None:
        return
    harness.begin_test(item.nodeid)
    reason = not_applicable(session.impl, family, item.get_closest_marker("needs"),
                            getattr(getattr(item, "callspec", None), "params", {}))
    if reason:
        pytest.skip(f"not applicable: {reason}")


def not_applicable(impl, family: str, needs=None, params=None) -> str | None:
    """Why a test of `family` does not apply to `impl` (its level is missing, a model kind or
    keyword it lacks, KIT_NOT_APPLICABLE), or None: the kit's one applicability rule (the
    calibration runs ask it too). `needs`: the test's needs marker; `params`: its parameters."""
    level = families.get(family).level
    if family in impl.not_applicable:
        return f"--impl={impl.spec}: {impl.not_applicable[family]} (KIT_NOT_APPLICABLE)"
    if not impl.has(level):
        names = ", ".join(impl.missing.get(level, [s.function for s in LEVELS.get(level, ())]))
        if level == "served":
            return (f"--impl={impl.spec} is not a served engine (the served families run with "
                    f"--impl=openai:URL or --engine=NAME)")
        return f"--impl={impl.spec} has no {names or level} (level {level!r})"
    kind = (needs.kwargs.get("kind") if needs else None) or (params or {}).get("kind")
    if kind is not None and kind not in impl.model_kinds:
        return (f"--impl={impl.spec} runs only {sorted(impl.model_kinds)} kit models "
                f"(KIT_MODEL_KINDS), this property uses {kind!r} models")
    if needs and needs.kwargs.get("greedy") and "greedy" in impl.not_applicable:
        return (f"--impl={impl.spec} does not decode greedily "
                f"({impl.not_applicable['greedy']}; KIT_NOT_APPLICABLE)")
    for keyword in (needs.kwargs.get("keywords", ()) if needs else ()):
        if not any(impl.accepts(sig.function, keyword) for sig in LEVELS.get(level, ())):
            names = "/".join(sig.function for sig in LEVELS.get(level, ()))
            return f"--impl={impl.spec}'s {names} does not take {keyword}="
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    run = sessions.of(config)
    if run is None:
        return
    chosen = run.families
    if chosen is not None:
        keep = [i for i in items if item_family(i) is None or item_family(i) in chosen]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    salt = config.getoption("--kit-reseed")
    for item in items:
        family = item_family(item)
        if family is not None:
            families.get(family)   # a module naming an unknown family is a kit bug: say so
            item.user_properties.append(("kit_family", family))
            if salt is not None:
                reseed.apply(getattr(item, "obj", None), salt)
                run.salted.append(getattr(item, "obj", None))
    _warn_stale_known(config, run, items)


def pytest_collection_finish(session):
    config = session.config
    run = sessions.of(config)
    if run is not None:
        run.planned = {i.nodeid: item_family(i) for i in session.items
                       if item_family(i) is not None}
        run.examples = {i.nodeid: progress.planned_examples(i) for i in session.items
                        if item_family(i) is not None}
        if not hasattr(config, "workerinput"):
            _write_json(config, None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller collects nothing itself: the kit tests it expects reports of
    are the ids the workers collected (their families arrive with the reports)."""
    run = sessions.of(node.config)
    if run is not None and not run.planned:
        run.planned = {i: _module_family(i) for i in ids if i.startswith("properties/test_")}


def _module_family(nodeid: str) -> str | None:
    """The family a kit test module declares (its pytestmark), read on the xdist controller."""
    path = nodeid.split("::", 1)[0]
    try:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    except ImportError:
        return None
    marks = getattr(module, "pytestmark", [])
    for mark in marks if isinstance(marks, list) else [marks]:
        if getattr(mark, "name", None) == "family":
            return mark.args[0]
    return None


def _warn_stale_known(config, run, items):
    """Known-failure entries whose test id matches no test of the kit (a renamed test leaves a
    stale entry behind); an id whose module is not collected in this run cannot be told."""
    if not run.known:
        return
    modules = {item.nodeid.split("::", 1)[0]: getattr(item, "module", None) for item in items}

    def is_stale(test_id):
        if any(i.nodeid == test_id or i.nodeid.split("[", 1)[0] == test_id for i in items):
            return False
        file, _, rest = test_id.partition("::")
        if not (config.rootpath / file).exists():
            return True
        module = modules.get(file)
        if module is None or not rest:
            return False  # not collected in this run: cannot tell, so do not cry wolf
        target = module
        for part in rest.split("[", 1)[0].split("::"):
            target = getattr(target, part, None)
            if target is None:
                return True
        return False

    stale = sorted({k.test for k in run.known if is_stale(k.test)})
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    if stale and worker == "gw0":  # under xdist, one worker speaks for all
        for test_id in stale:
            warnings.warn(KitWarning(f"{run.known_source}: {test_id!r} matches no test of the "
                                     f"kit (stale entry? ids look like "
                                     f"properties/test_rule.py::test_name)"))
        run.stale_known = stale


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before, calls = statistics.checks_run, harness.calls_made
    evidence.start_test()
    yield
    item.user_properties.append(("kit_statistical_checks", statistics.checks_run - before))
    stated = profiles.stated(getattr(item, "obj", None))
    if stated is not None:
        item.user_properties.append(("kit_stated", stated))
    item.user_properties.append(("kit_engine_calls", harness.calls_made - calls))
    if evidence.enabled:
        records = evidence.take()
        if records:
            item.user_properties.append(("kit_evidence", records))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or item_family(item) is None:
        return
    cause = _cause_of(call.excinfo.value)
    if cause:
        report.user_properties.append(("kit_cause", cause))
    run = sessions.of(item.config)
    entry = known.match(run.known, item.nodeid, cause or _first_cause_line(report)) if (
        run is not None and report.failed and call.when == "call") else None
    if entry is not None:
        # a known defect, matched by test id and cause: reported as pytest's xfail, so the
        # run's exit status is 0 when every failure is known (the verdict still says NOT
        # CONFORMANT); a new cause in the same test stays a failure
        report.outcome = "skipped"
        report.wasxfail = f"known failure ({run.known_source}): reproduced by {entry.script}"
        report.user_properties.append(("kit_known", entry.script))


def _cause_of(exc: BaseException) -> str | None:
    """The kit's cause line of a failure, also inside an exception group: Hypothesis wraps a
    failure that did not recur when replayed (a nondeterministic engine) in a FlakyFailure,
    whose own message is only the repr of what it holds."""
    cause = getattr(exc, "cause", None)
    if cause:
        return cause
    for inner in getattr(exc, "exceptions", ()) or ():
        cause = _cause_of(inner)
        if cause:
            return cause
    return None


class _Recorder:
    """Collects each kit test's outcome (on the xdist controller too: reports arrive there),
    and prints a progress line per family for slow implementations."""

    def __init__(self, config, session: Session):
        self.config, self.session = config, session
        self.family_started = {}     # family -> (start time, last progress line time)
        self.ticker = None           # progress.Ticker, started with the first test

    def pytest_runtest_logreport(self, report):
        run = self.session
        family = _report_family(report)
        if family is None:
            return
        for name, value in getattr(report, "user_properties", ()):
            if report.when != "call":
                continue
            if name == "kit_statistical_checks":
                run.stat_checks += value
            elif name == "kit_engine_calls":
                run.calls += value
            elif name == "kit_stated":
                run.deterministic[report.nodeid] = value
            elif name == "kit_cause":
                run.causes[report.nodeid] = value
            elif name == "kit_evidence":
                run.evidence[report.nodeid] = value
            elif name == "kit_shown":
                run.shown[report.nodeid] = value
            elif name == "kit_known":
                run.known_matched[report.nodeid] = value
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed" if report.passed else "failed"
        elif report.failed:
            outcome = "failed"
        elif report.skipped:
            outcome = "not_applicable"
        elif report.when == "call":
            outcome = "passed"
        else:
            return
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            # a skip raised at an explicit example carries Hypothesis's note of that example
            reason = reason.split("\nFailing explicit example", 1)[0].rstrip()
            if outcome == "not_applicable" and reason.startswith("not shown:"):
                outcome = "not_shown"
        if outcome in ("failed", "xfailed") and report.nodeid not in run.causes:
            run.causes[report.nodeid] = _first_cause_line(report)
        previous = run.outcomes.get(report.nodeid)
        if previous is None or RANK[outcome] >= RANK[previous[1]]:
            run.outcomes[report.nodeid] = (family, outcome, reason)
            if run.report is not None:
                run.report_tests[report.nodeid] = collect.outcome_entry(
                    report, family, outcome, reason)
        self._progress(family, report)

    def _progress(self, family, report):
        """A family's line when a test of it ends, at most every progress.EVERY seconds (and
        when the family is done, if it ran long): examples done of those planned where the
        items are known (without xdist), else tests."""
        config, run = self.config, self.session
        if progress.quiet(config):
            return
        tr = config.pluginmanager.get_plugin("terminalreporter")
        now = time.monotonic()
        started, last = self.family_started.setdefault(family, (now - report.duration, now))
        planned = [n for n, f in run.planned.items()
                   if (f or run.outcomes.get(n, (None,))[0]) == family]
        done = [n for n in planned if n in run.outcomes]
        finished = len(done) == len(planned)
        if not planned or (now - last < progress.EVERY and not finished):
            return
        if now - started < progress.EVERY and now - last < progress.EVERY:
            return  # a quick family needs no progress line
        self.family_started[family] = (started, now)
        examples = run.examples
        total = sum(examples.get(n, 1) for n in planned)
        made = sum(examples.get(n, 1) for n in done)
        tr.write_line(progress.family_line(family, made, total, len(done), len(planned),
                                           now - started, run.calls))

    def pytest_runtest_logstart(self, nodeid, location):
        """The live ticker, in a process that runs the tests itself (not an xdist controller,
        which sees calls only when a test ends, nor a worker, which must not print)."""
        config, run = self.config, self.session
        if nodeid not in run.planned:
            return
        if self.ticker is None:
            if (progress.quiet(config) or config.pluginmanager.get_plugin("dsession")
                    is not None):
                return
            tr = config.pluginmanager.get_plugin("terminalreporter")
            capture = config.pluginmanager.get_plugin("capturemanager")

            def write(text):
                # the test's output is being captured: the line goes past it, to the terminal
                if capture is None:
                    tr.write_line(text)
                    return
                with capture.global_and_fixture_disabled():
                    tr.write_line(text)

            self.ticker = progress.Ticker(write, lambda: harness.calls_made)
        self.ticker.begin(nodeid, run.planned[nodeid] or "kit", run.examples.get(nodeid, 1))

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.ticker is not None:
            self.ticker.end()
        run = self.session
        if (run.deadline is not None and time.monotonic() > run.deadline
                and run.stopped_by_limit is None and hasattr(self, "pytest_session")):
            run.stopped_by_limit = (f"the run's time limit ({run.time_limit:g} s) was reached "
                                    f"after {nodeid}")
            self.pytest_session.shouldstop = run.stopped_by_limit
            say(self.config, f"[kit] time limit of {run.time_limit:g} s reached after {nodeid}: "
                             f"no further test starts; the tests not reached leave the run "
                             f"incomplete")

    def pytest_sessionstart(self, session):
        self.pytest_session = session

    def pytest_sessionfinish(self):
        if self.ticker is not None:
            self.ticker.stop()


def _first_cause_line(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", "") or ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 and "violated by" in lines[0] else (lines[0] if lines else "")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    run = sessions.of(config)
    if run is None or hasattr(config, "workerinput"):
        return
    if not run.planned and not run.outcomes:
        return
    data = run.outcome or summary(run, exitstatus)
    tr = terminalreporter
    tr.section(f"conformance summary: --impl={data['impl']}")
    width = max(len(f) for f in data["families"]) + 2
    tr.write_line(f"{'family':<{width}}{'passed':>8}{'failed':>8}{'n/a':>6}{'known':>7}   notes")
    unexposed = []
    for family, entry in data["families"].items():
        total = sum(entry[o] for o in OUTCOMES)
        if total == 0 and not entry["planned"]:
            continue
        level = families.get(family).level
        if not run.impl.has(level) and not entry["failed"] and not entry["passed"]:
            unexposed.append(family)
            continue
        notes = ""
        if entry["failed"]:
            notes = "FAILS: " + ", ".join(n.split("::", 1)[-1] for n in entry["failures"][:3])
        elif total < entry["planned"]:
            notes = f"INCOMPLETE: {entry['planned'] - total} of {entry['planned']} tests did not run"
        elif entry["not_applicable"] and not entry["passed"]:
            notes = entry["reasons"][0] if entry["reasons"] else "not applicable"
        elif entry["not_shown"]:
            notes = (f"NOT SHOWN: {entry['not_shown']} test(s) saw nothing drafted at the "
                     f"positions they judge: "
                     + ", ".join(n.split("::", 1)[-1] for n in entry["not_shown_tests"][:3]))
        elif entry["xfailed"]:
            notes = (f"{entry['xfailed']} known failure(s): "
                     + ", ".join(n.split("::", 1)[-1]
                                 for n in list(entry["known_failures"])[:3]))
        if entry["examples_shown"][0] and not entry["failed"]:
            examples, shown = entry["examples_shown"]
            notes += (("; " if notes else "") +
                      f"speculation shown in {shown} of {examples} judged examples")
        known = entry["xfailed"] + entry["xpassed"]
        tr.write_line(f"{family:<{width}}{entry['passed']:>8}{entry['failed']:>8}"
                      f"{entry['not_applicable']:>6}{known:>7}   {notes}", red=bool(entry["failed"]))
    if unexposed:
        tr.write_line(f"not applicable (their level is not exposed): {', '.join(unexposed)}")
    for shared in data["shared_causes"]:
        tr.write_line(f"one cause, {shared.get('tests', 0)} failing tests in "
                      f"{len(shared['families'])} families ({', '.join(shared['families'])}): "
                      f"{shared['cause']}", red=True)
    for line in data["headlines"]:
        tr.write_line(line, red=True, bold=True)
    ran = {f for f, e in data["families"].items() if e["passed"] or e["failed"]}
    guarantees = [(f, families.get(f).power) for f in families.FAMILIES
                  if f in ran and families.get(f).power]
    if guarantees:
        tr.write_line("each statistical check detects, with power >= "
                      f"{statistics.POWER}: " + "; ".join(f"{f}: {t}" for f, t in guarantees))
    for line in deterministic_lines(data):
        tr.write_line(line)
    tr.write_line(f"statistical checks: {data['statistical_checks']} at alpha "
                  f"{data['alpha_per_check']:.0e} each: a correct implementation fails this run "
                  f"with probability <= {data['familywise_false_alarm_bound']:.1e}; "
                  f"{data['engine_calls']:,} calls into the implementation")
    if run.launch is not None:
        # a started engine's lines reach a front end that shows the run's lines itself
        for line in run.launch.outcome_lines(data) + [verdict_line(run, data)]:
            say(config, line)
    else:
        tr.write_line(verdict_line(run, data), green=data["conformant"],
                      red=not data["conformant"], bold=True)
    if run.report_page is not None:
        tr.write_line(f"kit report: {run.report_page} (its data: "
                      f"{run.report_page.with_name('report.json')})")


def deterministic_lines(data) -> list[str]:
    """The deterministic checks' stated power, family by family: the tests that ran grouped by
    their generated examples n, each group's f = 1 - (1 - DETECTION)^(1/n)."""
    by_family = data.get("deterministic_checks", {})
    if not by_family:
        return []
    lines = [f"each deterministic check detects, with probability >= "
             f"{data['deterministic_detection']}, a defect that shows in a share f of its "
             f"generated examples ((1 - f)^n <= {1 - data['deterministic_detection']:.2g}, n "
             f"its generated examples; explicit ones on top):"]
    for family, tests in by_family.items():
        groups: dict = {}
        for nodeid, entry in tests.items():
            # a parametrized test once, its parameters together: test[a, b]
            name, _, param = nodeid.split("::", 1)[-1].partition("[")
            params = groups.setdefault(entry["examples"], {}).setdefault(name, [])
            if param:
                params.append(param.rstrip("]"))
        parts = [f"f {profiles.hit_rate(n):.2f} (n {n}): "
                 + ", ".join(f"{name}[{', '.join(ps)}]" if ps else name
                             for name, ps in names.items())
                 for n, names in sorted(groups.items(), reverse=True)]
        lines.append(f"  {family}: " + "; ".join(parts))
    return lines


def _write_json(config, exitstatus, data=None) -> None:
    run = sessions.of(config)
    path = config.getoption("--conformance-json", None)
    if path is None and run.launch is not None:
        path = run.launch.run_dir / "conformance.json"
    if path:
        data = summary(run, exitstatus) if data is None else data
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True))


def pytest_unconfigure(config):
    # the recorder is module state: a kit run inside another process's tests (pytest.main)
    # must not leave it on for the tests that follow
    evidence.enable(False)
    run = sessions.of(config)
    for test in run.salted if run is not None else ():
        reseed.apply(test, None)      # the test functions outlive the run (pytest.main)
    if run is not None and run.launch is not None:
        run.launch.stop()     # also after a usage error or an interrupted run


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    run = sessions.of(config)
    if hasattr(config, "workerinput") or run is None:
        return
    if run.launch is not None:
        # measured on the servers after the tests, before the verdict that asks for it
        run.launch.finish(run, say=lambda text: say(config, text))
    data = summary(run, exitstatus)
    run.outcome = data
    _write_json(config, exitstatus, data)
    if run.report is not None:
        run.report_page = collect.write(
            run.report, collect.build(config, run, data, verdict_line(run, data)))
    if run.launch is not None:
        run.launch.record_outcome(run, data)
        # the launcher's exit status is the verdict's (0 also when every failure is known)
        session.exitstatus = data["exit"]
