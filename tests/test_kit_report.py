"""The kit's report (--kit-report=DIR) as a person sees it.

* the page of a run on a broken engine opens in headless Chromium with every image decoded
  and the verdict on screen (the page's own self-check, read from the DOM), and its screenshot
  is kept under runs/kit-report-screenshots/; skipped, with the reason, where no browser is;
* the counts a picture draws are the counts the check used: a check is run with a spy on
  its chi-square call, and the page's tables and the bars' heights in its SVG are compared
  with what the spy saw;
* the broken engine's page shows the failing check's observed-vs-exact picture, with the
  outcomes that contribute most in red, and the failure's replay line;
* a report folder that cannot be written is a usage error before the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from properties import evidence
from properties.report import figures, page
from tests import report_pages

ROOT = Path(__file__).resolve().parents[1]
MUTANT = "tests/mutants/catalogue.py:InvertedRatio"
SHOTS = ROOT / "runs" / "kit-report-screenshots"


def _kit(args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-q", "--no-header"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def broken_report(tmp_path_factory):
    """The kit's rule family on a mutant whose acceptance ratio is upside down, with a report."""
    folder = tmp_path_factory.mktemp("report") / "broken"
    done = _kit(["properties/test_rule.py", f"--impl={MUTANT}", "--hypothesis-profile=selftest",
                 "-x", f"--kit-report={folder}"])
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"kit report: {folder / 'index.html'}" in done.stdout
    return folder


def test_broken_engine_page_shows_the_failing_check(broken_report):
    data = json.loads((broken_report / "report.json").read_text())
    text = (broken_report / "index.html").read_text()
    parsed = report_pages.Page(text)
    assert "NOT CONFORMANT" in parsed.verdict
    assert parsed.verdict.strip() == data["header"]["verdict_line"]
    failing = [f for f in parsed.figures if "failed" in f["attrs"].get("class", "").split()]
    assert failing, "no failing check's picture on the page"
    first = failing[0]
    svg = report_pages.svg_of(first["images"][0])
    colours = report_pages.bar_colours(svg)
    top = {int(r["data-cell"]) for r in first["rows"] if r.get("class") == "top"}
    assert top and all(colours[i] == figures.WORST for i in top), (top, colours)
    assert all(colours[i] != figures.WORST for i in colours if i not in top)
    # the first failing picture is the example the message reports (its n is stated there)
    entry = data["tests"]["properties/test_rule.py::test_committed_token_is_distributed_as_p"]
    assert f"n = {first['attrs']['data-n']}" in entry["message"]
    assert any(line.startswith("python -m properties.replay") for line in entry["replay"])
    assert "python -m properties.replay --impl=" in text


def test_page_opens_in_headless_chromium(broken_report):
    exe = report_pages.browser()
    if exe is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome or "
                    "$KIT_CHROMIUM): .ci/run installs Debian's chromium where it can")
    index = broken_report / "index.html"
    start = time.monotonic()
    dom = report_pages.chromium(exe, index, "--window-size=1280,1000",
                                "--virtual-time-budget=15000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    shown = report_pages.Page(dom.stdout)
    check = shown.self_check
    assert check is not None and "data-images" in check, (
        f"the page's self-check did not run in the browser: {dom.stdout[-1500:]}")
    assert int(check["data-images"]) == len(report_pages.Page(index.read_text()).images) > 0
    assert check["data-broken"] == "0", check
    assert check["data-verdict-visible"] == "yes", check
    assert "NOT CONFORMANT" in shown.verdict
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "broken-engine.png"
    done = report_pages.chromium(exe, index, "--window-size=1280,2400", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", done.stderr[-2000:]
    print(f"screenshot of the report page: {shot} (browser {time.monotonic() - start:.1f} s)")


def test_the_self_check_sees_a_broken_image(broken_report, tmp_path):
    """The page's self-check is what the browser test trusts: an image that cannot be decoded
    must be counted as broken (else the test above could not fail)."""
    exe = report_pages.browser()
    if exe is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome or $KIT_CHROMIUM)")
    text = (broken_report / "index.html").read_text()
    spoiled = tmp_path / "index.html"
    spoiled.write_text(text.replace("<nav>", '<img alt="broken" src="data:image/png;base64,AAAA">'
                                             "<nav>", 1))
    dom = report_pages.chromium(exe, spoiled, "--window-size=1280,1000",
                                "--virtual-time-budget=15000", "--dump-dom")
    check = report_pages.Page(dom.stdout).self_check
    assert check is not None and check.get("data-broken") == "1", check


def _summary(records_by_test: dict) -> dict:
    entry = {o: 0 for o in ("passed", "failed", "not_applicable", "xfailed", "xpassed")}
    entry.update(passed=len(records_by_test), planned=len(records_by_test), failures=[],
                 reasons=[], causes={})
    return {"impl": "reference", "description": "module reference.speculative",
            "families": {"rule": entry}, "statistical_checks": 3, "alpha_per_check": 2e-6,
            "familywise_false_alarm_bound": 6e-6, "engine_calls": 1, "headlines": [],
            "shared_causes": [], "verdict": "CONFORMANT"}


def test_plotted_counts_are_the_counts_the_check_used(monkeypatch):
    """Run the chapter's worked example through the rule check with a spy on chi_square_gof,
    then read the rendered page: each table row's observed count is the spy's count of that
    outcome, and each bar's drawn height is that count over n, on one scale per picture."""
    from properties.cases import PairSpec, RuleCase
    from properties.checks import rule
    from properties.impl import load

    seen = []
    real = rule.chi_square_gof

    def spy(observed, exact, *args, **kwargs):
        seen.append(Counter(observed))
        return real(observed, exact, *args, **kwargs)

    monkeypatch.setattr(rule, "chi_square_gof", spy)
    monkeypatch.setattr(evidence, "enabled", True)
    evidence.start_test()
    rule.check_rule(load("reference"), RuleCase(PairSpec(3, seed=0, relation="chapter"),
                                                seed=2023))
    records = evidence.take()
    assert len(records) == len(seen) == 3
    nodeid = "properties/test_rule.py::test_chapter_worked_example"
    data = {"header": {"impl": "reference", "description": "module reference.speculative",
                       "versions": {}, "profile": "dev", "seed": "-", "date": "-", "seconds": 1.0,
                       "verdict": "CONFORMANT", "verdict_line": "verdict: CONFORMANT",
                       "command": "-"},
            "summary": _summary({nodeid: records}),
            "tests": {nodeid: {"family": "rule", "outcome": "passed", "reason": "",
                               "seconds": 1.0, "evidence": records}}}
    parsed = report_pages.Page(page.render(data))
    figures_ = [f for f in parsed.figures if "gof" in f["attrs"].get("class", "").split()]
    assert len(figures_) == 3
    for figure in figures_:
        counts = seen[int(figure["attrs"]["data-check"]) - 1]
        n = sum(counts.values())
        assert int(figure["attrs"]["data-n"]) == n
        rows = figure["rows"]
        assert sum(int(r["data-observed"]) for r in rows) == n
        # the chapter's example pools nothing: each row is one outcome, named by its repr
        by_label = {repr(o): c for o, c in counts.items()}
        labels = [r.get("data-members") for r in rows]
        assert all(m == "1" for m in labels), labels
        heights = report_pages.bar_heights(report_pages.svg_of(figure["images"][0]))
        assert sorted(heights) == list(range(len(rows)))
        scale = None
        for row in rows:
            i, observed = int(row["data-cell"]), int(row["data-observed"])
            cell = records[int(figure["attrs"]["data-check"]) - 1]["cells"][i]
            assert observed == by_label[cell["label"]] == cell["observed"]
            if observed:
                ratio = heights[i] / (observed / n)
                scale = scale or ratio
                assert abs(ratio - scale) <= 1e-3 * scale, (i, ratio, scale)


def test_unwritable_report_folder_is_a_usage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _kit(["properties/test_rule.py", "--collect-only", f"--kit-report={blocker / 'x'}"],
                timeout=300)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"--kit-report={blocker / 'x'}: cannot write the report there" in done.stderr
