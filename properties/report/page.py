"""index.html from the report's JSON: one self-contained page, no network.

The pictures are SVG embedded as data URIs (one file to attach to a CI run, nothing fetched).
Each distribution picture has its table beside it, with the counts in data attributes: the
numbers the picture was drawn from, readable by a person and by tests/test_kit_report.py. A
small inline script checks, once the page has loaded, that every image decoded and that the
verdict is on screen, and writes the result into the page (#kit-self-check), which is how a
headless browser's DOM dump tells a test that the page renders.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from properties import families as kit_families
from properties import statistics
from properties.report import figures

OUTCOME_WORDS = {"passed": "passed", "failed": "FAILED", "not_applicable": "not applicable",
                 "not_shown": "NOT SHOWN (nothing drafted where it judged)",
                 "xfailed": "known failure", "xpassed": "known failure, now passes"}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1180px; padding: 16px 24px;
       color: #1d1d1d; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 28px 0 6px; }
h3 { font-size: 14px; margin: 14px 0 4px; font-family: ui-monospace, monospace; }
.verdict { font-size: 18px; font-weight: 700; padding: 10px 14px; border-radius: 6px; }
.verdict.ok { background: #e3f4e5; color: #145c22; } .verdict.bad { background: #fbe4e2; color: #8c1d14; }
.verdict.incomplete { background: #fdf1d8; color: #6b4b00; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; text-align: left; vertical-align: top; }
table.meta td:first-child { color: #555; } table.counts td, table.counts th { text-align: right; }
table.cells { font-size: 12px; margin-top: 4px; } table.cells td { font-family: ui-monospace, monospace; }
table.cells tr.top td { color: #b3241b; font-weight: 600; }
.outcome-failed { color: #b3241b; font-weight: 700; } .outcome-passed { color: #1c6b2c; }
.outcome-not_applicable { color: #666; } .outcome-not_shown { color: #8a5a00; font-weight: 700; }
.outcome-xfailed, .outcome-xpassed { color: #8a5a00; }
pre { background: #f5f5f5; padding: 8px; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
pre.replay { background: #eef3fb; }
figure { margin: 10px 0 18px; } figure img { max-width: 100%; height: auto; }
figcaption { font-size: 12px; color: #444; }
nav a { margin-right: 12px; } .muted { color: #666; } details > summary { cursor: pointer; }
#kit-self-check { font-size: 12px; color: #666; margin-top: 30px; }
"""

SELF_CHECK = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  var failed = document.querySelectorAll("[data-figure-error]").length;
  var v = document.getElementById("verdict"), r = v.getBoundingClientRect(), s = getComputedStyle(v);
  var visible = r.width > 0 && r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight &&
      s.visibility !== "hidden" && s.display !== "none" && parseFloat(s.opacity) > 0;
  var out = document.getElementById("kit-self-check");
  out.setAttribute("data-images", images.length);
  out.setAttribute("data-broken", broken.length + failed);
  out.setAttribute("data-verdict-visible", visible ? "yes" : "no");
  out.textContent = "page self-check: " + images.length + " images, " + broken.length +
      " not loaded, " + failed + " not drawn; verdict " + (visible ? "on screen" : "NOT on screen");
});
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _img(draw, record, alt: str, cls: str = "") -> str:
    """One picture as a data URI. A picture that cannot be drawn says so in its place (the
    page and its JSON are still written, and the page's self-check counts it)."""
    try:
        svg = draw(record)
    except Exception as exc:   # noqa: BLE001 - any drawing error, shown where the picture was
        return (f'<p class="figure-error" data-figure-error="1">this picture could not be '
                f'drawn: {esc(type(exc).__name__)}: {esc(exc)}</p>')
    data = base64.b64encode(svg).decode("ascii")
    return f'<img class="{cls}" alt="{esc(alt)}" src="data:image/svg+xml;base64,{data}">'


def power(record: dict) -> float | None:
    """The power the check had at its sample size against the deviation its plan was sized
    for (one-sample: noncentrality >= 4 n delta^2; two samples: 2 n delta^2)."""
    plan = record.get("plan")
    if not plan or record["df"] < 1:
        return None
    if record.get("test", "chi-square") != "chi-square":
        # an exact test on two groups (binomial / Fisher): its plan computed the exact power
        return float(plan["power"]) if plan["n"] == record["n"] else None
    from scipy import stats
    factor = 2 if record["kind"] == "two_sample" else 4
    crit = statistics.critical_value(record["df"], record["alpha"])
    return float(stats.ncx2.sf(crit, record["df"], factor * record["n"] * plan["delta"] ** 2))


def _cells_table(record: dict) -> str:
    two = record["kind"] == "two_sample"
    head = ("<tr><th>#</th><th>outcome(s)</th><th>outcomes</th><th>observed</th>"
            + ("<th>own sampler</th><th>expected (one law)</th>" if two else
               "<th>expected (exact)</th>") + "<th>share of χ²</th></tr>")
    rows = []
    for i, c in enumerate(record["cells"]):
        attrs = (f'data-cell="{i}" data-observed="{c["observed"]}" data-expected='
                 f'"{c["expected"]:.6g}" data-members="{c["members"]}"'
                 + (f' data-observed-b="{c["observed_b"]}"' if two else ""))
        rows.append(f'<tr class="{"top" if c["top"] and not record["passed"] else ""}" {attrs}>'
                    f'<td>{i}</td><td>{esc(c["label"])}</td><td>{c["members"]}</td>'
                    f'<td>{c["observed"]}</td>'
                    + (f'<td>{c["observed_b"]}</td>' if two else "")
                    + f'<td>{c["expected"]:.1f}</td><td>{c["contribution"]:.2f}</td></tr>')
    for j, c in enumerate(record.get("impossible", [])):
        rows.append(f'<tr class="top" data-impossible="{j}" data-observed="{c["observed"]}">'
                    f'<td>p=0</td><td>{esc(c["label"])}</td><td>1</td><td>{c["observed"]}</td>'
                    + ("<td></td>" if two else "") + "<td>0 (impossible)</td><td></td></tr>")
    more = record["cells_total"] - sum(1 for c in record["cells"] if not c.get("rest"))
    note = (f'<p class="muted">{record["cells_total"]} cells in the test; the table and the '
            f'picture show the largest and the most deviating, the other {more} as one.</p>'
            if more > 0 and any(c.get("rest") for c in record["cells"]) else "")
    return f'<table class="cells">{head}{"".join(rows)}</table>{note}'


def reported_example(gofs: list, message: str = ""):
    """The example a failing test's message reports. Its checks' summaries state their n
    ("n = 5742"), which singles it out; else the last example with a failing check
    (Hypothesis replays the example it reports last, and the recorder keeps that copy)."""
    failing = [r for r in gofs if not r["passed"]]
    stated = {int(m) for m in re.findall(r"\bn ?= ?([0-9]+)\b", message or "")}
    named = [r for r in failing if r["n"] in stated]
    chosen = named or failing
    return chosen[-1].get("example") if chosen else None


def _distribution(record: dict, number: int, reported: bool = False) -> str:
    record = dict(record, power=power(record))
    two = record["kind"] == "two_sample"
    exact_test = {"binomial": "exact binomial test (two groups, the small one expecting < 5)",
                  "fisher": "Fisher's exact test (two groups, the small one expecting < 5)"}
    what = (exact_test[record["test"]] + (": speculative outputs vs the engine's own sampler"
                                          if two else " against the exact law")
            if record.get("test") in exact_test else
            "two-sample χ² test of homogeneity: speculative outputs vs the engine's own sampler"
            if two else "χ² goodness of fit against the exact law")
    plan = record.get("plan")
    facts = [f"statistic {record['statistic']:.3f}" if record["statistic"] is not None else "",
             f"df {record['df']}",
             f"p-value {record['p_value']:.4g}" if record["p_value"] is not None else "",
             f"alpha {record['alpha']:.0e}", f"n {record['n']:,}" + (" per sample" if two else ""),
             f"detects TV ≥ {record['detectable']:.3f} with power {statistics.POWER} at this n"]
    if record["power"] is not None:
        facts.append(f"power {record['power']:.4f} against TV {plan['delta']:g} (its design "
                     f"deviation)")
    if record.get("impossible_total"):
        facts.append(f"{record['impossible_total']} outcome(s) of exact probability 0 observed")
    verdict = "passed" if record["passed"] else "FAILED"
    return (f'<figure class="evidence {record["kind"]} {verdict.lower()}" data-check="{number}" '
            f'data-n="{record["n"]}" data-passed="{str(record["passed"]).lower()}">'
            + _img(figures.distribution, record, f"check {number}: observed vs exact")
            + f'<figcaption>check {number}: {what}: <b>{verdict}</b>'
            + (" (in the failing example the message above reports)" if reported else "")
            + "; "
            + "; ".join(f for f in facts if f) + "</figcaption>"
            + _cells_table(record) + "</figure>")


def merge_acceptance(records: list) -> dict | None:
    runs = [r for r in records if r["kind"] == "acceptance"]
    if not runs:
        return None
    k = max(r["k"] for r in runs)
    merged = {"positions": [{"reached": 0, "accepted": 0, "exact": 0.0, "var": 0.0}
                            for _ in range(k)],
              "rounds": 0, "tokens": 0, "exact_tokens": 0.0, "var_tokens": 0.0, "runs": len(runs)}
    for r in runs:
        for slot, p in zip(merged["positions"], r["positions"]):
            for key in slot:
                slot[key] += p[key]
        for key in ("rounds", "tokens", "exact_tokens", "var_tokens"):
            merged[key] += r[key]
    return merged


def _acceptance(records: list) -> str:
    merged = merge_acceptance(records)
    if merged is None or not any(p["reached"] for p in merged["positions"]):
        return ""
    return ('<figure class="evidence acceptance">'
            + _img(figures.acceptance, merged, "acceptance by draft position")
            + "<figcaption>acceptance by draft position over this test's runs: measured "
              "(accepted / rounds that reached the position) against the exact expectation, "
              "the mean of Σ min(p, q) at the contexts those rounds reached, with a 99% "
              "interval; and tokens per target call against its exact expectation from the same "
              "Σ min(p, q) (not from the measured acceptance)</figcaption></figure>")


def _served_acceptance(records: list) -> str:
    rows = [r for r in records if r["kind"] == "served_acceptance"]
    if not rows:
        return ""
    return ('<figure class="evidence served-acceptance">'
            + _img(figures.served_acceptance, rows, "served acceptance per request")
            + "<figcaption>the engine's own counters per greedy request beside the exact replay "
              "of the same request</figcaption></figure>")


def _test(nodeid: str, entry: dict) -> str:
    outcome = entry["outcome"]
    parts = [f'<h3>{esc(nodeid.split("::", 1)[-1])} — <span class="outcome-{outcome}">'
             f'{OUTCOME_WORDS[outcome]}</span> <span class="muted">({entry["seconds"]:.1f} s)'
             f'</span></h3>']
    if entry.get("reason"):
        parts.append(f'<p class="muted">{esc(entry["reason"])}</p>')
    if entry.get("message"):
        parts.append(f'<pre class="message">{esc(entry["message"])}</pre>')
    if entry.get("replay"):
        parts.append('<p>replay:</p><pre class="replay">' + "\n".join(
            esc(line) for line in entry["replay"]) + "</pre>")
    records = entry.get("evidence", [])
    gofs = [r for r in records if r["kind"] in ("gof", "two_sample")]
    reported = reported_example(gofs, entry.get("message", ""))
    # a failing test shows the example its message reports first, its failing checks first
    order = sorted(range(len(gofs)), key=lambda i: (gofs[i].get("example") != reported,
                                                    gofs[i]["passed"], i))
    pictures = [_acceptance(records), _served_acceptance(records)]
    pictures += [_distribution(gofs[i], i + 1, gofs[i].get("example") == reported)
                 for i in order]
    pictures = [p for p in pictures if p]
    if pictures:
        # a failing test shows all its pictures; a passing one its first (the most telling:
        # failing checks and the acceptance come first), the rest one click away
        shown = len(pictures) if outcome in ("failed", "xfailed", "xpassed") else 1
        parts.append("".join(pictures[:shown]))
        if len(pictures) > shown:
            parts.append(f"<details><summary>{len(pictures) - shown} more picture(s) of this "
                         f"test's evidence</summary>" + "".join(pictures[shown:]) + "</details>")
    return (f'<article class="test {outcome}" id="{esc(nodeid)}" data-outcome="{outcome}">'
            + "".join(parts) + "</article>")


def _family(name: str, entry: dict, tests: dict) -> str:
    family = kit_families.get(name)
    counts = "".join(f"<td>{entry.get(o, 0)}</td>" for o in ("passed", "failed", "not_applicable",
                                                            "not_shown"))
    known = entry["xfailed"] + entry["xpassed"]
    head = (f'<section class="family" id="family-{name}"><h2>{esc(name)}</h2>'
            f'<p class="muted">{esc(family.checks)}'
            + (f"; each statistical check detects {esc(family.power)} with power "
               f"{statistics.POWER}" if family.power else "") + "</p>"
            f'<table class="counts"><tr><th>passed</th><th>failed</th><th>not applicable</th>'
            f'<th>not shown</th><th>known</th><th>planned</th></tr><tr>{counts}<td>{known}</td>'
            f'<td>{entry["planned"]}</td></tr></table>')
    reasons = "".join(f"<li>{esc(r)}</li>" for r in entry["reasons"])
    if reasons:
        head += f'<p>not applicable, because:</p><ul class="reasons">{reasons}</ul>'
    ordered = sorted(tests.items(), key=lambda t: ({"failed": 0, "xfailed": 1, "xpassed": 1,
                                                    "passed": 2}.get(t[1]["outcome"], 3), t[0]))
    body = "".join(_test(nodeid, e) for nodeid, e in ordered if e["outcome"] != "not_applicable")
    return head + body + "</section>"


def _served(served: dict) -> str:
    parts = ['<section class="family" id="served-run"><h2>the served run</h2>',
             f'<p>{esc(served.get("title", served.get("engine", "")))} '
             f'{esc(served.get("version", ""))}, method {esc(served.get("method", ""))}: '
             f'<b>{esc(served.get("verdict_text", ""))}</b></p>']
    spec = served.get("speculation") or {}
    if spec:
        parts.append(f'<p>speculation ran: {spec.get("drafted", 0):g} tokens drafted, '
                     f'{spec.get("accepted", 0):g} accepted ({esc(spec.get("source", ""))})</p>')
    measured = served.get("speed") or {}
    if measured.get("spec_seconds"):
        parts.append('<figure class="evidence speed">' + _img(figures.speed, measured, "speed")
                     + "<figcaption>speculating vs baseline throughput, measured in the same run "
                       "(the same greedy requests, in alternating turns, the other server paused)"
                       "</figcaption></figure>")
    return "".join(parts) + "</section>"


# The stated alpha and power, measured over many runs (tests/calibration, issue 25).
CALIBRATION = Path(__file__).resolve().parents[2] / "CONFORMANCE.md"
CALIBRATION_ANCHOR = "calibration-the-stated-error-rates-measured"


def _calibration_link() -> str:
    return (f'<p class="muted" id="calibration">The alpha and power stated here, measured over '
            f'many runs of the kit on correct and deliberately deviating engines: '
            f'<a href="{esc(CALIBRATION.as_uri())}#{CALIBRATION_ANCHOR}">CONFORMANCE.md, '
            f'"Calibration: the stated error rates, measured"</a>.</p>')


def render(data: dict) -> str:
    h, summary = data["header"], data["summary"]
    verdict = h["verdict"]
    css = "ok" if verdict == "CONFORMANT" else "incomplete" if verdict in ("INCOMPLETE", "NOT SHOWN") else "bad"
    meta = [("implementation", f'--impl={h["impl"]} ({h["description"]})'),
            ("versions", ", ".join(f"{k} {v}" for k, v in h["versions"].items())),
            ("hypothesis profile", h["profile"]), ("examples", h["seed"]),
            ("date", h["date"]), ("run time", f'{h["seconds"]:.1f} s'),
            ("statistical checks", f'{summary["statistical_checks"]} at alpha '
                                   f'{summary["alpha_per_check"]:.0e} each (a correct '
                                   f'implementation fails this run with probability <= '
                                   f'{summary["familywise_false_alarm_bound"]:.1e})'),
            ("engine calls", f'{summary["engine_calls"]:,}'), ("command", h["command"])]
    by_family: dict = {}
    for nodeid, entry in data["tests"].items():
        by_family.setdefault(entry["family"], {})[nodeid] = entry
    shown = [f for f, e in summary["families"].items()
             if e["planned"] or any(e.get(o) for o in ("passed", "failed", "not_applicable",
                                                       "not_shown", "xfailed", "xpassed"))]
    nav = "".join(f'<a href="#family-{f}">{f}{" ✗" if summary["families"][f]["failed"] else ""}'
                  f"</a>" for f in shown)
    lines = [f"<li>{esc(line)}</li>" for line in summary.get("headlines", [])]
    lines += [f"<li>one cause, {s['tests']} failing tests in {', '.join(s['families'])}: "
              f"{esc(s['cause'])}</li>" for s in summary.get("shared_causes", [])]
    sections = "".join(_family(f, summary["families"][f], by_family.get(f, {})) for f in shown)
    if data.get("served"):
        sections = _served(data["served"]) + sections
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>kit report: --impl={esc(h['impl'])}: {esc(verdict)}</title>"
            f"<style>{STYLE}</style></head><body data-verdict=\"{esc(verdict)}\">"
            f"<h1>Conformance report: --impl={esc(h['impl'])}</h1>"
            f'<p id="verdict" class="verdict {css}">{esc(h["verdict_line"])}</p>'
            + (f'<ul class="headlines">{"".join(lines)}</ul>' if lines else "")
            + '<table class="meta">' + "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>"
                                               for k, v in meta) + "</table>"
            + _calibration_link()
            + f"<nav>families: {nav}</nav>{sections}"
            '<p id="kit-self-check">page self-check: not run (no script)</p>'
            f"<script>{SELF_CHECK}</script></body></html>")
