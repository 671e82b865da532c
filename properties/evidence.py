"""A small recorder of the evidence behind each check, for the kit's report.

The statistics functions and a few checks call in here with what they already computed (the
counts per outcome, the exact expectations, the pooled cells); nothing is recomputed and no
engine is called again. Recording is off unless ``--kit-report`` is given: then each call is one
test of a module flag, so a run without a report pays nothing measurable.

Records are plain JSON values (they travel from pytest-xdist workers to the controller inside
``report.user_properties``), and small: a distribution keeps at most MAX_CELLS cells, the rest
pooled into one, and a test keeps at most MAX_RECORDS records.
"""

from __future__ import annotations

import json
import math

enabled = False
MAX_CELLS = 60          # cells drawn per distribution check; the rest are shown as one
MAX_RECORDS = 40        # records kept per test (a statistical test has a few examples)
MAX_ACCEPTANCE = 60     # runs per test whose acceptance by position is recorded
HIGHLIGHT = 3           # a failing check's cells contributing most to its statistic

_records: list = []
_plans: list = []       # the sample plans made in this test: (n, df, delta, power, alpha)
_acceptance_runs = 0
dropped = 0


def enable(on: bool = True) -> None:
    global enabled
    enabled = bool(on)


def start_test() -> None:
    """Forget what an earlier test recorded (called before each test)."""
    global _acceptance_runs, dropped
    _records.clear()
    _plans.clear()
    _acceptance_runs = 0
    dropped = 0


def take() -> list:
    """The records of the test that just ran, each once. Hypothesis replays the failing
    example it reports at the end, which records its checks a second time: the last copy is
    kept, so the reported example is the last one ("example" counts the plans made before a
    record: the records of one example share it)."""
    latest = {}
    for record in _records:
        latest[json.dumps({k: v for k, v in record.items() if k != "example"},
                          sort_keys=True)] = record
    out = sorted(latest.values(), key=lambda r: _records.index(r))
    _records.clear()
    _plans.clear()
    return out


def _add(record: dict) -> None:
    global dropped
    if len(_records) >= MAX_RECORDS:
        dropped += 1
        if record.get("passed", True):
            return
        # a failing check is what the report is for: it replaces the oldest passing one
        passing = next((r for r in _records if r.get("passed", True)), None)
        if passing is None:
            return
        _records.remove(passing)
    record["example"] = len(_plans)
    _records.append(record)


def _label(outcome) -> str:
    text = repr(outcome)
    return text if len(text) <= 48 else text[:45] + "..."


def planned(the_plan) -> None:
    """A sample plan was made (statistics.plan / two_sample_plan): the design deviation it is
    sized for is what the report states the power against."""
    if enabled:
        _plans.append({"n": int(the_plan.n), "df": int(the_plan.df),
                       "delta": float(the_plan.delta), "power": float(the_plan.power)})


def _plan_for(n: int) -> dict | None:
    """The plan of this test that drew these n samples: the one with this n, else the largest
    plan not above n (a batched check draws whole calls, so a little more than planned)."""
    exact = [p for p in _plans if p["n"] == n]
    if exact:
        return exact[-1]
    below = [p for p in _plans if p["n"] <= n]
    return max(below, key=lambda p: p["n"]) if below else None


def _cells(labels, members, observed, expected, contribution, observed_b=None) -> tuple:
    """At most MAX_CELLS cells: those contributing most to the statistic, then the largest
    expectations; the rest pooled into one cell shown as such."""
    order = sorted(range(len(labels)), key=lambda i: -contribution[i])
    keep = set(order[:HIGHLIGHT])
    for i in sorted(range(len(labels)), key=lambda i: -expected[i]):
        if len(keep) >= MAX_CELLS - 1:
            break
        keep.add(i)
    if len(labels) <= MAX_CELLS:
        keep = set(range(len(labels)))
    top = set(order[:HIGHLIGHT])
    cells, rest = [], []
    for i in sorted(keep, key=lambda i: -expected[i]):
        cell = {"label": labels[i], "members": int(members[i]), "observed": int(observed[i]),
                "expected": float(expected[i]), "contribution": float(contribution[i]),
                "top": i in top}
        if observed_b is not None:
            cell["observed_b"] = int(observed_b[i])
        cells.append(cell)
    rest = [i for i in range(len(labels)) if i not in keep]
    if rest:
        cell = {"label": f"the other {len(rest)} cells, shown as one",
                "members": int(sum(members[i] for i in rest)),
                "observed": int(sum(observed[i] for i in rest)),
                "expected": float(sum(expected[i] for i in rest)),
                "contribution": float(sum(contribution[i] for i in rest)), "top": False,
                "rest": True}
        if observed_b is not None:
            cell["observed_b"] = int(sum(observed_b[i] for i in rest))
        cells.append(cell)
    return cells, len(labels)


def gof(result, outcomes, groups, f_obs, f_exp, contributions) -> None:
    """A chi-square goodness-of-fit check (statistics.chi_square_gof): per pooled cell, the
    observed count, the exact expected count, its share of the statistic."""
    labels = [_label(outcomes[g[0]]) if len(g) == 1 else
              f"pooled: {len(g)} outcomes incl. {_label(outcomes[g[0]])}" for g in groups]
    cells, total = _cells(labels, [len(g) for g in groups], [int(v) for v in f_obs],
                          [float(v) for v in f_exp], [float(v) for v in contributions])
    impossible = [{"label": _label(o), "observed": int(c)}
                  for o, c in list(result.impossible.items())[:12]]
    _add({"kind": "gof", **_common(result), "cells": cells, "cells_total": total,
          "impossible": impossible, "impossible_total": len(result.impossible),
          "plan": _plan_for(result.n)})


def two_sample(result, outcomes, groups, table, expected) -> None:
    """A chi-square test of homogeneity (statistics.chi_square_two_sample): per pooled cell, the
    two samples' counts (the speculative outputs, the engine's own sampler's)."""
    labels = [_label(outcomes[g[0]]) if len(g) == 1 else
              f"pooled: {len(g)} outcomes incl. {_label(outcomes[g[0]])}" for g in groups]
    contribution = [float(((table[:, j] - expected[:, j]) ** 2 / expected[:, j]).sum())
                    if expected[:, j].all() else 0.0 for j in range(len(groups))]
    cells, total = _cells(labels, [len(g) for g in groups], [int(v) for v in table[0]],
                          [float(v) for v in expected[0]], contribution,
                          observed_b=[int(v) for v in table[1]])
    _add({"kind": "two_sample", **_common(result), "cells": cells, "cells_total": total,
          "n_a": int(table[0].sum()), "n_b": int(table[1].sum()), "impossible": [],
          "impossible_total": 0, "plan": _plan_for(result.n)})


def _common(result) -> dict:
    finite = (lambda v: float(v) if math.isfinite(v) else None)
    return {"n": int(result.n), "statistic": finite(result.statistic), "df": int(result.df),
            "p_value": finite(result.p_value), "alpha": float(result.alpha),
            "passed": bool(result.passed), "detectable": float(result.detectable),
            "test": getattr(result, "test", "chi-square")}


def acceptance(case, analysis, tokens) -> None:
    """The rounds a chain engine ran on the kit's models (properties.invariants.analyse): the
    exact acceptance probability Σ min(p, q) of each draft position it reached, beside what it
    accepted (properties.acceptance_by_position)."""
    global _acceptance_runs
    if not enabled or _acceptance_runs >= MAX_ACCEPTANCE:
        return
    _acceptance_runs += 1
    from properties import acceptance_by_position as exact   # imports the kit's models: only here
    record = exact.by_position(case, analysis, tokens)
    if record is not None:
        _add(record)


def served_acceptance(expected, drafted: int, accepted: int, k: int) -> None:
    """A served engine's speculation counters for one request beside the exact replay of the
    same request (greedy: a position is accepted exactly when the draft's argmax is the
    target's)."""
    if enabled:
        _add({"kind": "served_acceptance", "k": int(k), "drafts": int(expected.drafts),
              "drafted_exact": int(expected.drafted), "accepted_exact": int(expected.accepted),
              "drafted": int(drafted), "accepted": int(accepted)})
