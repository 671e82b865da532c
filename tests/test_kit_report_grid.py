"""The engines' matrix page (properties.report.grid) from a results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from properties.report import grid

ROOT = Path(__file__).resolve().parents[1]


def _run(engine, method, summary, report=None, known=()):
    # known: the failing test ids the run's verdict counted as known
    return {"engine": engine, "version": "1", "method": method, "summary": summary,
            "known_matched": {t: "script.py" for t in known}, "verdict_text": "v",
            "report": report, "speed": {"speedup": 0.5}}


def _family(passed=0, failed=(), reasons=()):
    return {"passed": passed, "failed": len(failed), "not_applicable": 0, "xfailed": 0,
            "failures": {n: "cause" for n in failed}, "reasons": list(reasons)}


def test_cells_are_coloured_by_state_and_rows_link_their_reports(tmp_path):
    page = tmp_path / "a" / "report" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html></html>")
    failing = "properties/test_served_sequence.py::test_x"
    runs = [_run("vllm", "ngram", {"served_greedy": _family(passed=3),
                                   "served_sequence": _family(failed=[failing + "[1]"])},
                 report=str(page), known=[failing + "[1]"]),
            # the same test listed as known for another run does not make this one known
            _run("llamacpp", "ngram", {"served_bounds": _family(failed=["t::u"]),
                                       "served_perfect_draft": _family(reasons=["n/a: x"]),
                                       "served_sequence": _family(failed=[failing + "[1]"])})]
    results = tmp_path / "engines.json"
    results.write_text(json.dumps(runs))
    text = grid.write(results).read_text()
    assert 'href="a/report/index.html"' in text            # relative to the matrix page
    states = [grid.cell(r, f)[0] for r in runs for f in grid.FAMILIES]
    n = len(grid.FAMILIES)
    assert states[:2] == ["passed", "known"] and set(states[2:n]) == {"none"}
    assert states[n:n + 4] == ["none", "failed", "failed", "n/a"]
    for state in ("passed", "known", "failed", "n/a"):
        assert f'data-state="{state}" style="background:{grid.COLOURS[state]}"' in text


def test_a_missing_results_file_is_named(tmp_path):
    done = subprocess.run([sys.executable, "-m", "properties.report", "grid",
                           str(tmp_path / "none.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and f"results={tmp_path / 'none.json'}: no such file" in done.stderr


def test_the_parameter_matrix_shows_each_sampling_parameter_per_run(tmp_path):
    params = "properties/test_served_params.py::test_law_min_p"
    bias = "properties/test_served_params.py::test_law_logit_bias"
    entry = _family(passed=1, failed=[bias])
    entry["tests"] = {params: ["not_applicable", "not supported: vllm refuses min_p=0.1"],
                      bias: ["failed", ""]}
    runs = [_run("vllm", "ngram", {"served_params": entry}, known=[bias]),
            _run("llamacpp", "ngram", {"served_params": _family(passed=2) | {"tests": {
                params: ["passed", ""], bias: ["not_shown", "not shown: ..."]}}})]
    assert [grid.parameter_cell(runs[0], t) for t in (params, bias)] == [
        ("n/a", "not supported: vllm refuses min_p=0.1"), ("known", "known")]
    assert [grid.parameter_cell(runs[1], t)[1] for t in (params, bias)] == ["passed", "NOT SHOWN"]
    results = tmp_path / "engines.json"
    results.write_text(json.dumps(runs))
    text = grid.write(results).read_text()
    assert "Sampling parameters under speculation" in text and "<th>law_min_p</th>" in text
