"""The conformance kit as a pytest plugin: ``pytest properties/ --impl=NAME``.

Options:
    --impl=NAME              what is checked (see properties/impl.py); default: reference
    --xfails-file=PATH       the implementation's known failures: one test id per line
                             (a node id, optionally without its [parameters]), # comments;
                             listed tests run as xfail, ids matching no test are warned about
    --conformance-json=PATH  write the conformance summary as JSON: first at the start of the
                             run with verdict INCOMPLETE, then, when the run ends, the verdict
    --kit-timeout=SECONDS    time limit of each call into the implementation (0: none)
    --kit-families=A,B       run only these families (properties/families.py)
    --kit-trained=DIR        the trained models of the *_trained properties: a directory written
                             by make models (default: the committed reference/trained) or make
                             models-large (the weight-bound target)
    --kit-report=DIR         write DIR/index.html (the evidence behind the verdict, as pictures)
                             and DIR/report.json, the data it was drawn from (properties/report/)

The implementation is loaded and its signatures checked before collection: a bad --impl is one
usage error, not hundreds of failures. Each test module declares its family
(``pytestmark = pytest.mark.family(NAME)``); a test the implementation cannot run (its family's
level is missing, a model kind or keyword it lacks, KIT_NOT_APPLICABLE) is skipped as not
applicable before any example is drawn. The run ends with a conformance summary, family by
family, and one verdict: CONFORMANT, NOT CONFORMANT, or INCOMPLETE (interrupted, stopped
early, or a test that never reported).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import time
import warnings
from pathlib import Path

import pytest
import torch

from properties import families, guards, harness, profiles, progress, statistics
from properties.impl import LEVELS, ImplError, load
from properties import evidence
from properties.report import collect

# not_shown: a served test that passed where the engine drafted nothing (never a pass)
OUTCOMES = ("passed", "failed", "not_applicable", "not_shown", "xfailed", "xpassed")
_RANK = {"passed": 0, "not_applicable": 1, "not_shown": 2, "xfailed": 3, "xpassed": 4,
         "failed": 5}


class KitWarning(UserWarning):
    """Something about the kit's configuration deserves attention (e.g. a stale xfail id)."""


def pytest_addoption(parser):
    group = parser.getgroup("conformance kit")
    group.addoption("--impl", default="reference", metavar="NAME",
                    help="implementation under test: reference (default), fast, a module name, "
                         "a path to a .py file, optionally followed by :ATTR (a class or object "
                         "providing the functions)")
    group.addoption("--xfails-file", default=None, metavar="PATH",
                    help="known failures of the implementation: one test id per line, # comments")
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


def _read_xfails(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(f"--xfails-file={path}: no such file")
    ids = []
    for line in file.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            ids.append(text)
    return ids


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
        config._kit_impl = load(config.getoption("--impl"))
    except ImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        guards.set_timeout(config.getoption("--kit-timeout"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config._kit_families = _selected_families(config)
    trained = config.getoption("--kit-trained")
    if trained:
        from properties.models import use_trained_models
        try:
            use_trained_models(trained)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    path = config.getoption("--xfails-file")
    config._kit_xfails = _read_xfails(path) if path else []
    config._kit_outcomes = {}          # nodeid -> (family, outcome, reason)
    config._kit_planned = {}           # nodeid -> family, the kit tests selected to run
    config._kit_causes = {}            # nodeid -> the first line of its failure's cause
    config._kit_stat_checks = 0
    config._kit_calls = 0
    config._kit_started = time.monotonic()
    config._kit_started_wall = time.time()
    report_dir = config.getoption("--kit-report")
    # Workers record evidence too (it reaches the controller with each report); only the
    # controller writes the page, so only it checks the folder.
    evidence.enable(report_dir is not None)
    config._kit_report = (collect.prepare(report_dir) if report_dir is not None
                          and not hasattr(config, "workerinput") else None)
    config._kit_evidence = {}          # nodeid -> the records of its checks (with --kit-report)
    config._kit_shown = {}             # served nodeid -> [examples, examples shown speculating]
    config._kit_report_tests = {}      # nodeid -> its outcome, reason, message (with --kit-report)
    config.pluginmanager.register(_Recorder(config), "conformance-kit-recorder")
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
    return pytestconfig._kit_impl


def pytest_report_header(config):
    impl = getattr(config, "_kit_impl", None)
    if impl is None:
        return None
    chosen = config._kit_families
    return [f"conformance kit: {line}" for line in impl.header().splitlines()] + [
        f"conformance kit: hypothesis profile {profiles.current()}; each statistical check at "
        f"alpha={statistics.ALPHA:.0e}, power {statistics.POWER} at its stated deviation; "
        f"time limit {guards.TIMEOUT:g} s per call (--kit-timeout)"
        + (f"; families: {', '.join(chosen)} (--kit-families)" if chosen else "")
        + (f"; trained models {config.getoption('--kit-trained')} (--kit-trained)"
           if config.getoption("--kit-trained") else "")]


def pytest_runtest_setup(item):
    impl = getattr(item.config, "_kit_impl", None)
    family = item_family(item)
    if impl is None or family is None:
        return
    harness.begin_test(item.nodeid)
    level = families.get(family).level
    if family in impl.not_applicable:
        pytest.skip(f"not applicable: --impl={impl.spec}: {impl.not_applicable[family]} "
                    f"(KIT_NOT_APPLICABLE)")
    if not impl.has(level):
        names = ", ".join(impl.missing.get(level, [s.function for s in LEVELS.get(level, ())]))
        if level == "served":
            pytest.skip(f"not applicable: --impl={impl.spec} is not a served engine (the served "
                        f"families run with --impl=openai:URL)")
        pytest.skip(f"not applicable: --impl={impl.spec} has no {names or level} (level {level!r})")
    needs = item.get_closest_marker("needs")
    params = getattr(getattr(item, "callspec", None), "params", {})
    kind = needs.kwargs.get("kind") if needs else None
    kind = kind or params.get("kind")
    if kind is not None and kind not in impl.model_kinds:
        pytest.skip(f"not applicable: --impl={impl.spec} runs only {sorted(impl.model_kinds)} "
                    f"kit models (KIT_MODEL_KINDS), this property uses {kind!r} models")
    if needs and needs.kwargs.get("greedy") and "greedy" in impl.not_applicable:
        pytest.skip(f"not applicable: --impl={impl.spec} does not decode greedily "
                    f"({impl.not_applicable['greedy']}; KIT_NOT_APPLICABLE)")
    for keyword in (needs.kwargs.get("keywords", ()) if needs else ()):
        function = next((sig.function for sig in LEVELS.get(level, ())
                         if impl.accepts(sig.function, keyword)), None)
        if function is None:
            names = "/".join(sig.function for sig in LEVELS.get(level, ()))
            pytest.skip(f"not applicable: --impl={impl.spec}'s {names} does not take {keyword}=")


def _matches(test_id: str, nodeid: str) -> bool:
    return nodeid == test_id or nodeid.startswith(test_id + "[") or nodeid.startswith(test_id + "::")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not hasattr(config, "_kit_impl"):
        return
    chosen = config._kit_families
    if chosen is not None:
        keep = [i for i in items if item_family(i) is None or item_family(i) in chosen]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    for item in items:
        family = item_family(item)
        if family is not None:
            families.get(family)   # a module naming an unknown family is a kit bug: say so
            item.user_properties.append(("kit_family", family))
    _mark_xfails(config, items)


def pytest_collection_finish(session):
    config = session.config
    if hasattr(config, "_kit_impl"):
        config._kit_planned = {i.nodeid: item_family(i) for i in session.items
                               if item_family(i) is not None}
        config._kit_examples = {i.nodeid: progress.planned_examples(i) for i in session.items
                                if item_family(i) is not None}
        if not hasattr(config, "workerinput"):
            _write_json(config, None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller collects nothing itself: the kit tests it expects reports of
    are the ids the workers collected (their families arrive with the reports)."""
    config = node.config
    if hasattr(config, "_kit_impl") and not config._kit_planned:
        config._kit_planned = {i: _module_family(i) for i in ids
                               if i.startswith("properties/test_")}


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


def _mark_xfails(config, items):
    ids = getattr(config, "_kit_xfails", [])
    if not ids:
        return
    source = config.getoption("--xfails-file")
    used = set()
    for item in items:
        for test_id in ids:
            if _matches(test_id, item.nodeid):
                used.add(test_id)
                item.add_marker(pytest.mark.xfail(
                    reason=f"known failure of --impl={config._kit_impl.spec} listed in {source}",
                    strict=False))
    modules = {item.nodeid.split("::", 1)[0]: getattr(item, "module", None) for item in items}

    def is_stale(test_id):
        if test_id in used:
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

    stale = [t for t in ids if is_stale(t)]
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    if stale and worker == "gw0":  # under xdist, one worker speaks for all
        for test_id in stale:
            warnings.warn(KitWarning(f"{source}: {test_id!r} matches no test of the kit (stale "
                                     f"entry? ids look like properties/test_rule.py::test_name)"))
        config._kit_stale = stale


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before, calls = statistics.checks_run, harness.calls_made
    evidence.start_test()
    yield
    item.user_properties.append(("kit_statistical_checks", statistics.checks_run - before))
    item.user_properties.append(("kit_engine_calls", harness.calls_made - calls))
    if evidence.enabled:
        records = evidence.take()
        if records:
            item.user_properties.append(("kit_evidence", records))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and item_family(item) is not None:
        cause = _cause_of(call.excinfo.value)
        if cause:
            report.user_properties.append(("kit_cause", cause))


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

    def __init__(self, config):
        self.config = config
        self.family_started = {}     # family -> (start time, last progress line time)
        self.ticker = None           # progress.Ticker, started with the first test

    def pytest_runtest_logreport(self, report):
        config = self.config
        family = _report_family(report)
        if family is None:
            return
        for name, value in getattr(report, "user_properties", ()):
            if report.when != "call":
                continue
            if name == "kit_statistical_checks":
                config._kit_stat_checks += value
            elif name == "kit_engine_calls":
                config._kit_calls += value
            elif name == "kit_cause":
                config._kit_causes[report.nodeid] = value
            elif name == "kit_evidence":
                config._kit_evidence[report.nodeid] = value
            elif name == "kit_shown":
                config._kit_shown[report.nodeid] = value
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
        if outcome == "failed" and report.nodeid not in config._kit_causes:
            config._kit_causes[report.nodeid] = _first_cause_line(report)
        previous = config._kit_outcomes.get(report.nodeid)
        if previous is None or _RANK[outcome] >= _RANK[previous[1]]:
            config._kit_outcomes[report.nodeid] = (family, outcome, reason)
            if config._kit_report is not None:
                config._kit_report_tests[report.nodeid] = collect.outcome_entry(
                    report, family, outcome, reason)
        self._progress(family, report)

    def _progress(self, family, report):
        """A family's line when a test of it ends, at most every progress.EVERY seconds (and
        when the family is done, if it ran long): examples done of those planned where the
        items are known (without xdist), else tests."""
        config = self.config
        if progress.quiet(config):
            return
        tr = config.pluginmanager.get_plugin("terminalreporter")
        now = time.monotonic()
        started, last = self.family_started.setdefault(family, (now - report.duration, now))
        planned = [n for n, f in config._kit_planned.items()
                   if (f or config._kit_outcomes.get(n, (None,))[0]) == family]
        done = [n for n in planned if n in config._kit_outcomes]
        finished = len(done) == len(planned)
        if not planned or (now - last < progress.EVERY and not finished):
            return
        if now - started < progress.EVERY and now - last < progress.EVERY:
            return  # a quick family needs no progress line
        self.family_started[family] = (started, now)
        examples = getattr(config, "_kit_examples", {})
        total = sum(examples.get(n, 1) for n in planned)
        made = sum(examples.get(n, 1) for n in done)
        tr.write_line(progress.family_line(family, made, total, len(done), len(planned),
                                           now - started, config._kit_calls))

    def pytest_runtest_logstart(self, nodeid, location):
        """The live ticker, in a process that runs the tests itself (not an xdist controller,
        which sees calls only when a test ends, nor a worker, which must not print)."""
        config = self.config
        if nodeid not in config._kit_planned:
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
        self.ticker.begin(nodeid, config._kit_planned[nodeid] or "kit",
                          getattr(config, "_kit_examples", {}).get(nodeid, 1))

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.ticker is not None:
            self.ticker.end()

    def pytest_sessionfinish(self):
        if self.ticker is not None:
            self.ticker.stop()


def _first_cause_line(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", "") or ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 and "violated by" in lines[0] else (lines[0] if lines else "")


def summary(config, exitstatus=None) -> dict:
    """The conformance summary. exitstatus None: the run has not ended (INCOMPLETE)."""
    impl = config._kit_impl
    entries = {f: {o: 0 for o in OUTCOMES} | {"failures": [], "reasons": [], "causes": {},
                                             "planned": 0, "not_shown_tests": [],
                                             "examples_shown": [0, 0]}
               for f in families.FAMILIES}
    for nodeid, family in config._kit_planned.items():
        family = family or config._kit_outcomes.get(nodeid, (None,))[0]
        if family is not None:
            entries[family]["planned"] += 1
    for nodeid, (family, outcome, reason) in sorted(config._kit_outcomes.items()):
        entry = entries[family]
        entry[outcome] += 1
        entry.setdefault("tests", {})[nodeid] = [outcome, reason[:300]]
        if outcome == "failed":
            entry["failures"].append(nodeid)
            entry["causes"][nodeid] = config._kit_causes.get(nodeid, "")
        if outcome in ("not_applicable", "not_shown") and reason and reason not in entry["reasons"]:
            entry["reasons"].append(reason)
        if outcome == "not_shown":
            entry["not_shown_tests"].append(nodeid)
        shown = getattr(config, "_kit_shown", {}).get(nodeid)
        if shown:
            entry["examples_shown"] = [a + b for a, b in zip(entry["examples_shown"], shown)]
    unreported = sorted(n for n in config._kit_planned if n not in config._kit_outcomes)
    failed = any(e["failed"] for e in entries.values())
    interrupted = exitstatus is None or int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
    complete = not interrupted and not unreported
    not_shown = [n for e in entries.values() for n in e["not_shown_tests"]]
    if failed:
        verdict = "NOT CONFORMANT"
    elif not complete:
        verdict = "INCOMPLETE"
    elif not_shown:
        # no failure, but some judged positions were never speculated: nothing concluded there
        verdict = "NOT SHOWN"
    else:
        verdict = "CONFORMANT"
    checks = config._kit_stat_checks
    missing = {level: list(names) for level, names in impl.missing.items()}
    return {
        "impl": impl.spec,
        "description": impl.description,
        "levels": list(impl.levels),
        "levels_missing": missing,
        "name_hints": dict(impl.hints),
        "model_kinds": sorted(impl.model_kinds),
        "hypothesis_profile": profiles.current(),
        "kit_timeout_s": guards.TIMEOUT,
        "families_selected": list(config._kit_families or families.FAMILIES),
        "trained_models": str(_trained_dir()),
        "families": entries,
        "shared_causes": _shared_causes(entries),
        "headlines": _headlines(entries),
        "statistical_checks": checks,
        "engine_calls": config._kit_calls,
        "alpha_per_check": statistics.ALPHA,
        "familywise_false_alarm_bound": checks * statistics.ALPHA,
        "complete": complete,
        "unreported_tests": unreported[:20],
        "verdict": verdict,
        "verdict_text": _verdict_text(verdict, impl, complete, unreported, exitstatus),
        "conformant": verdict == "CONFORMANT",
    }


def _cause_key(cause: str) -> str:
    """What makes two causes one: their text with the numbers, token lists and parenthesized
    details left out (the same bug raises with other values in other examples)."""
    text = re.sub(r"\(.*?\)|\[.*?\]", "", cause)
    text = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return " ".join(text.split())


def _shared_causes(entries) -> list:
    """Failures in several families with one cause (the same first line of cause, numbers and
    details aside; checks name the causes they can single out alike, e.g. harness.TOO_LONG):
    one bug, one headline, not several. The headline shown is the first failure's cause."""
    by_cause: dict[str, tuple[str, set, int]] = {}
    for family, entry in entries.items():
        for cause in entry["causes"].values():
            if cause:
                shown, fams, count = by_cause.get(_cause_key(cause), (cause, set(), 0))
                by_cause[_cause_key(cause)] = (shown, fams | {family}, count + 1)
    return [{"cause": shown, "families": sorted(fams), "tests": count}
            for shown, fams, count in sorted(by_cause.values(), key=lambda v: (-len(v[1]), -v[2]))
            if len(fams) > 1]


def _headlines(entries) -> list[str]:
    """Findings that need a sentence of their own, beyond each family's line. An engine whose
    own sampler differs from the convention while its speculation is exact relative to that
    sampler is not a speculation failure: say which it is (never a plain verdict)."""
    sampler, sequence = entries.get("sampler", {}), entries.get("sequence", {})
    if sampler.get("failed"):
        if sequence.get("passed") and not sequence.get("failed"):
            return ["speculation exact relative to the engine's own sampler (target_generate); "
                    "sampler differs from the convention (family sampler says which outcomes)"]
        return ["the engine's own sampler differs from the convention, and its speculation "
                "fails too (see the sequence family)"]
    return []


def _verdict_text(verdict, impl, complete, unreported, exitstatus) -> str:
    if verdict == "INCOMPLETE":
        why = ("the run was interrupted" if exitstatus is not None
               and int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
               else "the run has not finished (or the process ended early)" if exitstatus is None
               else f"{len(unreported)} selected test(s) never reported (stopped early?)")
        return f"INCOMPLETE: {why}; nothing can be concluded"
    text = verdict
    if verdict == "NOT SHOWN":
        return ("NOT SHOWN: no failure, but nothing was drafted at the positions some tests "
                "judge, so they say nothing about speculation (see each family's 'not shown')")
    if verdict != "CONFORMANT":
        return text
    levels = [level for level in families.LEVEL_ORDER if impl.has(level)]
    absent = [name for level in ("rule", "engine") for name in impl.missing.get(level, ())]
    if absent:
        hints = "".join(f" (found {impl.hints[name]}: did you mean {name}?)"
                        for name in absent if name in impl.hints)
        text += (f" at the {' and '.join(levels)} level{'s' if len(levels) > 1 else ''} only; "
                 f"no {', '.join(absent)}{hints}")
    elif impl.missing:
        text += f" (levels not exposed, so not checked: {', '.join(sorted(impl.missing))})"
    return text


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not hasattr(config, "_kit_impl") or hasattr(config, "workerinput"):
        return
    if not config._kit_planned and not config._kit_outcomes:
        return
    data = summary(config, exitstatus)
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
        if not impl_has(config, level) and not entry["failed"] and not entry["passed"]:
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
        elif entry["xpassed"]:
            notes = f"{entry['xpassed']} listed as known failures now pass"
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
    tr.write_line(f"statistical checks: {data['statistical_checks']} at alpha "
                  f"{data['alpha_per_check']:.0e} each: a correct implementation fails this run "
                  f"with probability <= {data['familywise_false_alarm_bound']:.1e}; "
                  f"{data['engine_calls']:,} calls into the implementation")
    tr.write_line(verdict_line(config, data), green=data["conformant"],
                  red=not data["conformant"], bold=True)
    if getattr(config, "_kit_report_page", None) is not None:
        tr.write_line(f"kit report: {config._kit_report_page} (its data: "
                      f"{config._kit_report_page.with_name('report.json')})")


def verdict_line(config, data) -> str:
    """The run's last line: the verdict, the known failures it leaves aside, its scope (the
    report's header shows the same words)."""
    verdict = data["verdict_text"]
    known = sum(e["xfailed"] for e in data["families"].values())
    if data["conformant"] and known:
        verdict += f", apart from {known} known failure(s) listed in --xfails-file"
    chosen = config._kit_families
    scope = f"families {', '.join(chosen)}" if chosen else "the properties run"
    return f"verdict for --impl={data['impl']}: {verdict} (on {scope})"


def impl_has(config, level: str) -> bool:
    return config._kit_impl.has(level)


def _trained_dir():
    from properties.models import trained_dir
    return trained_dir()


def _write_json(config, exitstatus, data=None) -> None:
    path = config.getoption("--conformance-json", None)
    if path:
        data = summary(config, exitstatus) if data is None else data
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True))


def pytest_unconfigure(config):
    # the recorder is module state: a kit run inside another process's tests (the launcher's
    # pytest.main) must not leave it on for the tests that follow
    evidence.enable(False)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput") or not hasattr(config, "_kit_impl"):
        return
    data = summary(config, exitstatus)
    # the run's summary, for whoever ran pytest in this process (the launcher's plugin)
    config._kit_summary = copy.deepcopy(data)
    _write_json(config, exitstatus, data)
    if config._kit_report is not None:
        config._kit_report_page = collect.write(
            config._kit_report, collect.build(config, data, verdict_line(config, data)))
