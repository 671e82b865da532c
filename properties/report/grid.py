"""The matrix of ``make engines`` as a page: a row per engine and method, a coloured cell per
served family, each row linking to that run's own report.

Built from the results file the runs append to (runs/engines.json, properties.serve.run), so
it shows what those runs found, nothing more; a run without a report page (an older run, or one
that could not start) has its row without a link.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from properties.families import FAMILIES as _ALL
from properties.report.page import esc

FAMILIES = tuple(name for name, f in _ALL.items() if f.level == "served")
COLOURS = {"passed": "#cdeccf", "failed": "#f6c3bf", "known": "#fde2b3", "n/a": "#e6e6e6",
           "none": "#ffffff"}
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 16px 24px; color: #1d1d1d; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 6px 10px; }
th { background: #f3f3f3; } td.cell { text-align: center; min-width: 120px; }
.legend span { display: inline-block; padding: 2px 10px; margin-right: 8px; border: 1px solid #ccc; }
"""


def cell(run: dict, family: str) -> tuple[str, str]:
    """(state, text) of one family in one run: passed, failed, known (every failure listed in
    the engine's known-failures file), n/a, or none (not run)."""
    entry = run.get("summary", {}).get(family)
    if not entry:
        return "none", "-"
    # "known" exactly when the run's verdict counted every failure of the family as known
    # (test id and cause matched an entry for this version and method)
    matched = run.get("known_matched", {})
    if entry["failed"] and all(n in matched for n in entry["failures"]):
        return "known", f"known ({entry['failed']})"
    if entry["failed"]:
        return "failed", f"FAILED ({entry['failed']})"
    if entry.get("not_shown"):
        return "n/a", f"NOT SHOWN ({entry['not_shown']})"
    if entry["passed"]:
        return "passed", f"passed ({entry['passed']})"
    reason = entry["reasons"][0] if entry.get("reasons") else "not applicable"
    return "n/a", reason[:60]


def path(run: dict) -> str:
    """The speculative path a run judged: what drafts, k, how proposals are drawn and
    verified (a run recorded before 2026-12-07 has only its method's description)."""
    p = run.get("path")
    if not p:
        return run.get("method_description", "")
    proposals = p.get("proposals") or "proposals as the engine draws them"
    return f"{p['drafter']}; k {p['k']}; {proposals}; {p['verification']}"


def shown(run: dict) -> str:
    """In how many of the judged examples speculation was shown (the engine drafted there)."""
    pairs = [e.get("examples_shown", [0, 0]) for e in (run.get("summary") or {}).values()]
    examples, speculated = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return f"{speculated} of {examples}" if examples else "-"


def acceptance(run: dict) -> str:
    """The engine's accepted / drafted over the launcher's greedy requests, with the kit's
    exact replay of the same requests where it replays the drafter."""
    s = run.get("speculation") or {}
    if not s.get("drafted"):
        return "nothing drafted" if s else "-"
    text = f"{s['accepted']:g} / {s['drafted']:g} ({s['accepted'] / s['drafted']:.3f})"
    exact = s.get("exact")
    if exact:
        text += (f"; exact {exact['accepted']:g} / {exact['drafted']:g}"
                 + (" (equal)" if (exact["accepted"], exact["drafted"]) ==
                    (s["accepted"], s["drafted"]) else " (DIFFERS)"))
    return text


def parameter_cell(run: dict, nodeid: str) -> tuple[str, str]:
    """(state, text) of one served_params test in one run: the engine x method x parameter
    matrix (a refused parameter is "not supported" with the engine's message)."""
    entry = (run.get("summary", {}).get("served_params") or {})
    outcome, reason = (entry.get("tests") or {}).get(nodeid, (None, ""))
    if outcome is None:
        return "none", "-"
    if outcome == "failed":
        known = nodeid in run.get("known_matched", {})
        return ("known", "known") if known else ("failed", "FAILED")
    if outcome == "passed":
        return "passed", "passed"
    if outcome == "not_shown":
        return "n/a", "NOT SHOWN"
    return "n/a", reason[:60] or "not applicable"


def _parameters(runs: list) -> str:
    tests = sorted({n for r in runs for n in ((r.get("summary", {}).get("served_params") or {})
                                              .get("tests") or {})})
    if not tests:
        return ""
    rows = []
    for run in runs:
        name = f"{esc(run['engine'])} {esc(run.get('version', ''))} / {esc(run['method'])}"
        cells = "".join(f'<td class="cell" data-state="{state}" style="background:'
                        f'{COLOURS[state]}">{esc(text)}</td>'
                        for state, text in (parameter_cell(run, t) for t in tests))
        rows.append(f"<tr><td>{name}</td>{cells}</tr>")
    head = "".join(f"<th>{esc(t.split('::', 1)[-1].removeprefix('test_'))}</th>" for t in tests)
    return ("<h2>Sampling parameters under speculation (served_params)</h2>"
            f"<table><tr><th>engine / method</th>{head}</tr>{''.join(rows)}</table>")


# the --models choices that run the trained check instead of the served families (the pairs of
# properties/export/trained.py PAIRS, named here so that the page needs no torch)
TRAINED_MODELS = ("trained", "trained-large")


def on_trained_pair(run: dict) -> bool:
    """The run was on a trained pair (the committed one or the weight-bound one)."""
    return run.get("models") in TRAINED_MODELS


def _trained(runs: list, base: Path) -> str:
    """The runs on the trained pairs (--models trained, trained-large): acceptance by the
    engine's counters beside the exact replay, tokens per target call, speed-up, verdict; each
    row names its pair."""
    trained = [r for r in runs if on_trained_pair(r)]
    if not trained:
        return ""
    rows = []
    for run in trained:
        t, speed = run.get("trained") or {}, (run.get("speed") or {}).get("speedup")
        name = (f"{esc(run['engine'])} {esc(run.get('version', ''))} / {esc(run['method'])} "
                f"({esc(run['models'])})")
        figures = []
        for who in ("engine", "exact"):
            d, a = t.get(f"{who}_drafted"), t.get(f"{who}_accepted")
            figures.append("-" if d is None or a is None else
                           f"{a:g} / {d:g}" + (f" ({a / d:.3f})" if d else ""))
        calls = t.get("tokens_per_target_call")
        state = {"CONFORMANT": "passed", "SETUP": "none"}.get(run.get("verdict"), "failed")
        rows.append(f"<tr><td>{name}</td><td>{esc(figures[0])}</td><td>{esc(figures[1])}</td>"
                    f"<td>{'-' if calls is None else f'{calls:.2f}'}</td>"
                    f"<td>{'' if speed is None else f'{speed:.2f}x'}</td>"
                    f'<td data-state="{state}" style="background:{COLOURS[state]}">'
                    f"{esc(run.get('verdict_text', ''))}</td></tr>")
    return ("<h2>The trained pairs (--models trained, trained-large: greedy requests on held-out "
            "prompts)</h2>"
            "<table><tr><th>engine / method</th><th>accepted / drafted: engine</th>"
            "<th>accepted / drafted: exact replay</th><th>tokens per target call</th>"
            "<th>speed-up</th><th>verdict</th></tr>" + "".join(rows) + "</table>")


def render(runs: list, base: Path) -> str:
    rows = []
    for run in runs:
        if on_trained_pair(run):
            continue
        report = run.get("report")
        link = os.path.relpath(report, base) if report and Path(report).exists() else None
        name = f"{esc(run['engine'])} {esc(run.get('version', ''))} / {esc(run['method'])}"
        head = f'<a href="{esc(link)}">{name}</a>' if link else name
        cells = []
        for family in FAMILIES:
            state, text = cell(run, family)
            cells.append(f'<td class="cell" data-state="{state}" style="background:'
                         f'{COLOURS[state]}">{esc(text)}</td>')
        speed = (run.get("speed") or {}).get("speedup")
        rows.append(f"<tr><td>{head}</td><td>{esc(path(run))}</td>{''.join(cells)}"
                    f"<td>{esc(shown(run))}</td><td>{esc(acceptance(run))}</td>"
                    f"<td>{esc(run.get('verdict_text', ''))}"
                    f"</td><td>{'' if speed is None else f'{speed:.2f}x'}</td></tr>")
    legend = "".join(f'<span style="background:{c}">{esc(s)}</span>' for s, c in COLOURS.items()
                     if s != "none")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>kit: engines</title><style>{STYLE}</style></head><body>"
            "<h1>The kit on the production engines</h1>"
            f'<p class="legend">{legend}</p><table><tr><th>engine / method</th>'
            + "<th>path: drafter, k, proposals, verification</th>"
            + "".join(f"<th>{f}</th>" for f in FAMILIES)
            + "<th>speculation shown (judged examples)</th>"
            + "<th>accepted / drafted: engine (exact replay), greedy</th>"
            + "<th>verdict</th><th>speed-up</th></tr>" + "".join(rows) + "</table>"
            + _parameters([r for r in runs if not on_trained_pair(r)])
            + _trained(runs, base) + "</body></html>")


def write(results: str | Path, out: str | Path | None = None) -> Path:
    results = Path(results)
    if not results.is_file():
        raise FileNotFoundError(f"results={results}: no such file (written by python -m "
                                f"properties.serve run ... --results {results})")
    out = Path(out) if out else results.with_suffix(".html")
    out.write_text(render(json.loads(results.read_text()), out.parent))
    return out
