"""The verdict of a run, decided in one place for every way the kit is run.

`summary(session, exitstatus)` is the run's conformance summary (family by family) with its
verdict, which `decide` computes:

    NOT CONFORMANT  a test failed (exit 1); or every failure is a known one (the
                    --known-failures file's entries matched test id and cause): still NOT
                    CONFORMANT, "all failures known", exit 0 (known failures never make a run
                    CONFORMANT)
    INCOMPLETE      interrupted, stopped early, or a test never reported (exit 2)
    NOT SHOWN       no failure, but nothing was drafted at the positions some served tests
                    judge, or a started engine's counters show no drafted token (exit 1)
    CONFORMANT      none of these (exit 0), saying which levels that covers

A run stopped by --time-limit says how far it got and never exits 0. exitstatus None: the run
has not ended (INCOMPLETE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import pytest

from properties import families, guards, profiles, statistics

# not_shown: a served test that passed where the engine drafted nothing (never a pass)
OUTCOMES = ("passed", "failed", "not_applicable", "not_shown", "xfailed", "xpassed")
RANK = {"passed": 0, "not_applicable": 1, "not_shown": 2, "xfailed": 3, "xpassed": 4,
        "failed": 5}


@dataclass
class Outcome:
    verdict: str
    text: str
    exit: int
    known: dict = field(default_factory=dict)   # failing test id -> its entry's reproduction
    new: list = field(default_factory=list)     # (test id, cause) of failures no entry matches
    summary: dict = field(default_factory=dict)  # a launched run's record (result.json)


def _entries(session) -> dict:
    entries = {f: {o: 0 for o in OUTCOMES} | {"failures": [], "reasons": [], "causes": {},
                                             "planned": 0, "not_shown_tests": [],
                                             "known_failures": {}, "examples_shown": [0, 0]}
               for f in families.FAMILIES}
    for nodeid, family in session.planned.items():
        family = family or session.outcomes.get(nodeid, (None,))[0]
        if family is not None:
            entries[family]["planned"] += 1
    for nodeid, (family, outcome, reason) in sorted(session.outcomes.items()):
        entry = entries[family]
        entry[outcome] += 1
        entry.setdefault("tests", {})[nodeid] = [outcome, reason[:300]]
        if outcome == "failed":
            entry["failures"].append(nodeid)
            entry["causes"][nodeid] = session.causes.get(nodeid, "")
        if outcome == "xfailed" and nodeid in session.known_matched:
            entry["known_failures"][nodeid] = session.causes.get(nodeid, "")
        if outcome in ("not_applicable", "not_shown") and reason and reason not in entry["reasons"]:
            entry["reasons"].append(reason)
        if outcome == "not_shown":
            entry["not_shown_tests"].append(nodeid)
        shown = session.shown.get(nodeid)
        if shown:
            entry["examples_shown"] = [a + b for a, b in zip(entry["examples_shown"], shown)]
    return entries


def decide(session, entries: dict, exitstatus) -> Outcome:
    """The one verdict rule (the module's docstring)."""
    failures = [(n, e["causes"].get(n, "")) for e in entries.values() for n in e["failures"]]
    known = {n: session.known_matched[n] for e in entries.values()
             for n in e["known_failures"]}
    unreported = [n for n in session.planned if n not in session.outcomes]
    interrupted = exitstatus is None or int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
    complete = not interrupted and not unreported and session.stopped_by_limit is None
    not_shown = [n for e in entries.values() for n in e["not_shown_tests"]]
    # a mode the engine itself names lossy: its failures are the checks' own, and the verdict
    # says the engine named it so (the negative control worked); never a verdict of its own
    lossy = declared_lossy(session)
    named = f"; the engine names this mode lossy: {lossy}" if lossy else ""
    # failures decide the verdict, but tests that saw nothing drafted judged nothing: said
    unjudged = (f"; {len(not_shown)} test(s) not shown (nothing drafted where they judge)"
                if not_shown else "")
    if failures:
        text = f"NOT CONFORMANT: {len(failures)} failure(s)"
        if session.known_source:
            text += " not known" + (f", {len(known)} known" if known else "")
        outcome = Outcome("NOT CONFORMANT", text + unjudged + named, 1, known=known,
                          new=failures)
    elif known:
        outcome = Outcome("NOT CONFORMANT", f"NOT CONFORMANT (all failures known: {len(known)}, "
                                            f"listed in {session.known_source}){unjudged}{named}",
                          0, known=known)
    elif not complete:
        why = ("the run was interrupted" if exitstatus is not None and interrupted
               else "the run has not finished (or the process ended early)" if exitstatus is None
               else "no test started after the run's time limit" if session.stopped_by_limit
               else f"{len(unreported)} selected test(s) never reported (stopped early?)")
        outcome = Outcome("INCOMPLETE", f"INCOMPLETE: {why}; nothing can be concluded", 2)
    elif not_shown:
        outcome = Outcome("NOT SHOWN", "NOT SHOWN: no failure, but nothing was drafted at the "
                                       "positions some tests judge, so they say nothing about "
                                       "speculation (see each family's 'not shown')", 1)
    elif session.launch is not None and not _speculation_ran(session, entries):
        outcome = Outcome("NOT SHOWN", "NOT SHOWN: no failure, but speculation was not shown to "
                                       "have run (the engine's counters show no drafted token)",
                          1)
    else:
        text = _conformant_text(session.impl)
        if lossy:   # a blind spot of the kit's, or of the mode's description: said, not hidden
            text += (f" (yet the engine names this mode lossy: {lossy}; no check caught it)")
        outcome = Outcome("CONFORMANT", text, 0)
    if session.stopped_by_limit is not None:
        reached = len(session.outcomes)
        outcome = replace(outcome, text=f"{outcome.text} (stopped by its time limit of "
                                        f"{session.time_limit:g} s: {reached} of "
                                        f"{len(session.planned)} tests reached)",
                          exit=1 if outcome.exit == 1 else 2)
    return outcome


def declared_lossy(session) -> str | None:
    """The engine's own words naming the run's method lossy (Method.lossy), or None."""
    method = getattr(session.launch, "method", None) or getattr(session.impl, "method", None)
    return getattr(method, "lossy", None)


def _speculation_ran(session, entries) -> bool:
    """The engine's counters over greedy requests, or the kit's own evidence per check (an
    engine without counters: the replay of its lookup drafter, properties/speculation.py)."""
    drafted = (session.launch.speculation or {}).get("drafted", 0)
    return drafted > 0 or any(e["examples_shown"][1] > 0 for e in entries.values())


def _conformant_text(impl) -> str:
    text = "CONFORMANT"
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


def summary(session, exitstatus=None) -> dict:
    """The conformance summary, with the verdict. exitstatus None: the run has not ended."""
    impl = session.impl
    entries = _entries(session)
    outcome = decide(session, entries, exitstatus)
    checks = session.stat_checks
    unreported = sorted(n for n in session.planned if n not in session.outcomes)
    return {
        "impl": impl.spec,
        "description": impl.description,
        "levels": list(impl.levels),
        "levels_missing": {level: list(names) for level, names in impl.missing.items()},
        "name_hints": dict(impl.hints),
        "model_kinds": sorted(impl.model_kinds),
        "hypothesis_profile": profiles.current(),
        "kit_timeout_s": guards.TIMEOUT,
        "families_selected": list(session.families or families.FAMILIES),
        "trained_models": str(_trained_dir()),
        "families": entries,
        "shared_causes": _shared_causes(entries),
        "headlines": _headlines(entries),
        "statistical_checks": checks,
        "deterministic_detection": profiles.DETECTION,
        "deterministic_checks": _deterministic(session),
        "engine_calls": session.calls,
        "alpha_per_check": statistics.ALPHA,
        "familywise_false_alarm_bound": checks * statistics.ALPHA,
        "complete": outcome.verdict != "INCOMPLETE" and not unreported,
        "unreported_tests": unreported[:20],
        "known_failures_file": session.known_source,
        "verdict": outcome.verdict,
        "verdict_text": outcome.text,
        "exit": outcome.exit,
        "conformant": outcome.verdict == "CONFORMANT",
    }


def _deterministic(session) -> dict:
    """family -> {test id -> its examples n, explicit examples, f = profiles.hit_rate(n), the
    rate it asked for}: the deterministic checks that ran (passed or failed)."""
    out: dict = {}
    for nodeid, stated in sorted(session.deterministic.items()):
        family, outcome, _ = session.outcomes.get(nodeid, (None, None, None))
        if family is not None and outcome in ("passed", "failed", "xfailed", "xpassed"):
            out.setdefault(family, {})[nodeid] = dict(stated)
    return {f: out[f] for f in families.FAMILIES if f in out}


def verdict_line(session, data) -> str:
    """The run's last line: the verdict and its scope (the report's header shows the same)."""
    chosen = session.families
    scope = f"families {', '.join(chosen)}" if chosen else "the properties run"
    who = session.launch.who() if session.launch is not None else f"--impl={data['impl']}"
    return f"verdict for {who}: {data['verdict_text']} (on {scope})"


def cause_key(cause: str) -> str:
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
                shown, fams, count = by_cause.get(cause_key(cause), (cause, set(), 0))
                by_cause[cause_key(cause)] = (shown, fams | {family}, count + 1)
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


def _trained_dir():
    from properties.models import trained_dir
    return trained_dir()
