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


def test_the_matrix_shows_the_path_speculation_shown_and_acceptance_against_exact(tmp_path):
    """Each row names the path judged (drafter, k, proposals, verification), in how many judged
    examples speculation was shown, and the engine's acceptance beside the exact replay: equal,
    or DIFFERS where the engine's counts are not the replay's."""
    path = {"drafter": "EAGLE-3 head head-eagle3", "k": 4, "proposals": "greedy",
            "verification": "token-wise"}
    fam = dict(_family(passed=2), examples_shown=[10, 7])
    runs = [dict(_run("vllm", "eagle3", {"served_greedy": fam}), path=path,
                 speculation={"drafted": 40, "accepted": 9,
                              "exact": {"drafted": 40, "accepted": 9, "schedule": "full"}}),
            dict(_run("vllm", "medusa", {"served_greedy": fam}), path=path,
                 speculation={"drafted": 40, "accepted": 9,
                              "exact": {"drafted": 40, "accepted": 8, "schedule": "full"}}),
            dict(_run("llamacpp", "ngram", {}), speculation={"drafted": 0, "accepted": 0})]
    assert grid.path(runs[0]) == "EAGLE-3 head head-eagle3; k 4; greedy; token-wise"
    assert grid.shown(runs[0]) == "7 of 10" and grid.shown(runs[2]) == "-"
    assert grid.acceptance(runs[0]) == "9 / 40 (0.225); exact 9 / 40 (equal)"
    assert grid.acceptance(runs[1]).endswith("exact 8 / 40 (DIFFERS)")
    assert grid.acceptance(runs[2]) == "nothing drafted"
    results = tmp_path / "engines.json"
    results.write_text(json.dumps(runs))
    text = grid.write(results).read_text()
    assert "9 / 40 (0.225); exact 9 / 40 (equal)" in text and "7 of 10" in text
