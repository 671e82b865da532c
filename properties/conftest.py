"""The conformance kit as a pytest plugin: ``pytest properties/ --impl=NAME``.

Options:
    --impl=NAME              what is checked (see properties/impl.py); default: reference
    --xfails-file=PATH       the implementation's known failures: one test id per line
                             (a node id, optionally without its [parameters]), # comments;
                             listed tests run as xfail, ids matching no test are warned about
    --conformance-json=PATH  write the conformance summary (per family: passed, failed, not
                             applicable, known failures) as JSON

The implementation is loaded and its signatures checked before collection: a bad --impl is one
usage error, not hundreds of failures. The header names it and its levels; the run ends with a
conformance summary, property family by family.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from properties import profiles, statistics
from properties.harness import require
from properties.impl import ImplError, load

FAMILIES = ("rule", "greedy", "sequence", "cache", "perfect_draft", "bounds", "batched")
OUTCOMES = ("passed", "failed", "not_applicable", "xfailed", "xpassed")
_RANK = {"passed": 0, "not_applicable": 1, "xfailed": 2, "xpassed": 3, "failed": 4}


STATED_POWER = {
    "rule": f"TV >= {statistics.DELTA_RULE} in the committed token's law",
    "sequence": f"TV >= {statistics.DELTA_SEQUENCE} (table models) / "
                f"{statistics.DELTA_SEQUENCE_QWEN3} (qwen3) in the joint law of the outputs",
    "batched": f"TV >= {statistics.DELTA_BATCHED} in each prompt's sampled rows",
}


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
                    help="write the per-family conformance summary as JSON to PATH")


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


def pytest_configure(config):
    profiles.register_profiles()
    try:
        config._kit_impl = load(config.getoption("--impl"))
    except ImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    path = config.getoption("--xfails-file")
    config._kit_xfails = _read_xfails(path) if path else []
    config._kit_outcomes = {}          # nodeid -> (family, outcome, reason)
    config._kit_stat_checks = 0
    config.pluginmanager.register(_Recorder(config), "conformance-kit-recorder")
    config.addinivalue_line(
        "markers", "kit(level, kind=None, keywords=()): what a kit property needs from the "
        "implementation (kind='param' reads the test's `kind` parameter); checked before the "
        "test runs, so a property that does not apply is skipped without drawing examples")
    config.addinivalue_line(
        "markers", "family(name): the kit family of a test module (properties/families.py), "
        "declared once as the module's pytestmark")
    config.addinivalue_line(
        "markers", "needs(kind=None, keywords=()): what a kit test needs beyond its family's "
        "level: a kit model kind and keywords of the level's function")


def _family(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0].replace("\\", "/")
    name = path.rsplit("/", 1)[-1]
    if "properties/" not in "/" + path and not path.startswith("properties"):
        return None
    if name.startswith("test_") and name.endswith(".py"):
        family = name[5:-3]
        return family if family in FAMILIES else None
    return None


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
    return [f"conformance kit: {line}" for line in impl.header().splitlines()] + [
        f"conformance kit: hypothesis profile {profiles.current()}; each statistical check at "
        f"alpha={statistics.ALPHA:.0e}, power {statistics.POWER} at its stated deviation"]


def pytest_runtest_setup(item):
    impl = getattr(item.config, "_kit_impl", None)
    if impl is None:
        return
    for mark in item.iter_markers("kit"):
        kind = mark.kwargs.get("kind")
        if kind == "param":
            kind = item.callspec.params["kind"]
        require(impl, mark.args[0], kind=kind)
        for keyword in mark.kwargs.get("keywords", ()):
            require(impl, mark.args[0], keyword=keyword)


def _matches(test_id: str, nodeid: str) -> bool:
    return nodeid == test_id or nodeid.startswith(test_id + "[") or nodeid.startswith(test_id + "::")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
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
    before = statistics.checks_run
    yield
    item.user_properties.append(("kit_statistical_checks", statistics.checks_run - before))


class _Recorder:
    """Collects each kit test's outcome (on the xdist controller too: reports arrive there)."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        config = self.config
        family = _family(report.nodeid)
        if family is None:
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == "kit_statistical_checks" and report.when == "call":
                config._kit_stat_checks += value
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
        previous = config._kit_outcomes.get(report.nodeid)
        if previous is None or _RANK[outcome] >= _RANK[previous[1]]:
            config._kit_outcomes[report.nodeid] = (family, outcome, reason)


def summary(config) -> dict:
    impl = config._kit_impl
    families = {f: {o: 0 for o in OUTCOMES} | {"failures": [], "reasons": []} for f in FAMILIES}
    for nodeid, (family, outcome, reason) in sorted(config._kit_outcomes.items()):
        entry = families[family]
        entry[outcome] += 1
        if outcome == "failed":
            entry["failures"].append(nodeid)
        if outcome == "not_applicable" and reason and reason not in entry["reasons"]:
            entry["reasons"].append(reason)
    checks = config._kit_stat_checks
    return {
        "impl": impl.spec,
        "description": impl.description,
        "levels": list(impl.levels),
        "model_kinds": sorted(impl.model_kinds),
        "hypothesis_profile": profiles.current(),
        "families": families,
        "statistical_checks": checks,
        "alpha_per_check": statistics.ALPHA,
        "familywise_false_alarm_bound": checks * statistics.ALPHA,
        "conformant": all(f["failed"] == 0 for f in families.values()),
    }


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not getattr(config, "_kit_outcomes", None) or hasattr(config, "workerinput"):
        return
    data = summary(config)
    tr = terminalreporter
    tr.section(f"conformance summary: --impl={data['impl']}")
    tr.write_line(f"{'family':<14}{'passed':>8}{'failed':>8}{'n/a':>6}{'known':>7}   notes")
    for family, entry in data["families"].items():
        total = sum(entry[o] for o in OUTCOMES)
        if total == 0:
            continue
        notes = ""
        if entry["failed"]:
            notes = "FAILS: " + ", ".join(n.split("::", 1)[-1] for n in entry["failures"][:3])
        elif entry["not_applicable"] and not entry["passed"]:
            notes = entry["reasons"][0] if entry["reasons"] else "not applicable"
        elif entry["xpassed"]:
            notes = f"{entry['xpassed']} listed as known failures now pass"
        known = entry["xfailed"] + entry["xpassed"]
        tr.write_line(f"{family:<14}{entry['passed']:>8}{entry['failed']:>8}"
                      f"{entry['not_applicable']:>6}{known:>7}   {notes}", red=bool(entry["failed"]))
    ran = {f for f, e in data["families"].items() if e["passed"] or e["failed"]}
    guarantees = [(f, text) for f, text in STATED_POWER.items() if f in ran]
    if guarantees:
        tr.write_line("each statistical check detects, with power >= "
                      f"{statistics.POWER}: " + "; ".join(f"{f}: {t}" for f, t in guarantees))
    tr.write_line(f"statistical checks: {data['statistical_checks']} at alpha "
                  f"{data['alpha_per_check']:.0e} each: a correct implementation fails this run "
                  f"with probability <= {data['familywise_false_alarm_bound']:.1e}")
    verdict = "CONFORMANT" if data["conformant"] else "NOT CONFORMANT"
    known = sum(e["xfailed"] for e in data["families"].values())
    if data["conformant"] and known:
        verdict += f" apart from {known} known failure(s) listed in --xfails-file"
    tr.write_line(f"verdict for --impl={data['impl']}: {verdict} (on the properties run)",
                  green=data["conformant"], red=not data["conformant"], bold=True)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    path = config.getoption("--conformance-json", None)
    if not path or hasattr(config, "workerinput") or not hasattr(config, "_kit_outcomes"):
        return
    Path(path).write_text(json.dumps(summary(config), indent=2, sort_keys=True))
