"""The report's records and pictures on the shapes the checks produce: many small outcomes
(pooled, and more cells than a picture shows), outcomes of exact probability 0, two samples."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from properties import statistics
from properties import evidence
from properties.report import page
from tests import report_pages


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.setattr(evidence, "enabled", True)
    evidence.start_test()
    yield
    evidence.take()


def _figure(record):
    html = page._distribution(record, 1)
    parsed = report_pages.Page(html)
    (figure,) = parsed.figures
    return figure, report_pages.svg_of(figure["images"][0])


def test_a_large_outcome_space_is_capped_and_pooled_cells_are_labelled(recording):
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(400, 0.3))
    exact = {i: float(p) for i, p in enumerate(probs / probs.sum())}
    observed = Counter(rng.choice(400, size=3000, p=list(exact.values())).tolist())
    observed[999] += 2                                       # impossible under `exact`
    result = statistics.chi_square_gof(observed, exact)
    (record,) = evidence.take()
    assert not result.passed and record["impossible_total"] == 1
    cells = record["cells"]
    assert len(cells) <= evidence.MAX_CELLS and cells[-1].get("rest")
    assert sum(c["observed"] for c in cells) == record["n"] - 2   # all but the impossible
    assert any(c["label"].startswith("pooled: ") for c in cells)
    figure, svg = _figure(record)
    assert len(report_pages.bar_heights(svg)) == len(cells)
    assert report_pages.bar_heights(svg, "imp-") and "data-impossible" in str(figure["rows"])


def test_two_samples_draw_both(recording):
    a = Counter({(1,): 400, (2,): 300, (3,): 300})
    b = Counter({(1,): 320, (2,): 380, (3,): 300})
    result = statistics.chi_square_two_sample(a, b)
    (record,) = evidence.take()
    assert record["kind"] == "two_sample" and record["passed"] == result.passed
    figure, svg = _figure(record)
    rows = {r["data-cell"]: r for r in figure["rows"]}
    assert sorted(int(r["data-observed"]) for r in rows.values()) == sorted(a.values())
    assert sorted(int(r["data-observed-b"]) for r in rows.values()) == sorted(b.values())
    assert len(report_pages.bar_heights(svg, "obsb-")) == 3


def test_nothing_is_recorded_without_a_report():
    assert not evidence.enabled
    statistics.chi_square_gof({0: 5, 1: 5}, {0: 0.5, 1: 0.5})
    assert evidence.take() == []


def test_an_exact_two_group_check_is_named_and_its_power_is_the_plans(recording):
    # a law whose rest expects < 5 at n: the check is the exact binomial test, not chi-square
    law = {(0,): 1 - 1e-4, (1,): 5e-5, (2,): 3e-5, (3,): 2e-5}
    the_plan = statistics.plan(list(law.values()), 0.12)
    evidence.planned(the_plan)
    assert the_plan.test == "binomial"
    observed = Counter({(0,): the_plan.n})
    statistics.chi_square_gof(observed, law)
    (record,) = evidence.take()
    assert record["test"] == "binomial"
    assert page.power(record) == pytest.approx(the_plan.power)
    html = page._distribution(record, 1)
    assert "exact binomial test" in html and "χ² goodness of fit" not in html
