"""The kit's front door: --impl resolution, signature checks, one clear error for a bad
implementation, the header, the conformance summary (also under xdist), --known-failures, and
failure messages that reproduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

from properties.impl import ImplError, load

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "properties/examples/chapter_engine.py"


def kit(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--hypothesis-profile=selftest", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# --------------------------------------------------------------------------- resolution

def test_every_form_of_impl_resolves():
    ref = load("reference")
    assert ref.levels[:2] == ("rule", "engine") and ref.accepts("speculative_generate", "top_k")
    chapter = load(CHAPTER)
    assert chapter.levels == ("rule", "engine")
    assert not chapter.accepts("speculative_generate", "top_k")
    assert set(chapter.missing) == {"batched", "tree"}
    dotted = load("properties.examples.chapter_engine")
    assert dotted.functions["accept_or_correct"] is chapter.functions["accept_or_correct"]
    mutant = load("tests/mutants/catalogue.py:InvertedRatio")
    assert type(mutant.functions["accept_or_correct"].__self__).__name__ == "InvertedRatio"
    obj = load("tests.mutants.engine:_default")
    assert obj.levels == ("rule", "engine")


def test_fast_declares_its_model_kinds():
    fast = load("fast")
    assert fast.has("batched") and fast.model_kinds == {"qwen3"}


@pytest.mark.parametrize("source,expected", [
    ("def accept_or_correct(p, q):\n    pass\n", "takes 2 positional parameters"),
    ("def accept_or_correct(p, q, x, generator=None):\n    pass\n", "named 'x'"),
    ("def accept_or_correct(p, q, token):\n    pass\n", "does not accept the keyword 'generator'"),
    ("def accept_or_correct(p, q, token, rng, generator=None):\n    pass\n", "requires 'rng'"),
    ("def speculative_generate(target, draft, prompt, max_new_tokens, k=4, temperature=0.0,"
     " stop_ids=(), generator=None):\n    pass\n", "named 'prompt'"),
    ("def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4):\n    pass\n",
     "does not accept the keyword 'temperature'"),
    ("def helper():\n    pass\n", "exposes none of the kit's functions"),
    ("KIT_MODEL_KINDS = {'gpt2'}\ndef accept_or_correct(p, q, token, generator=None):\n    pass\n",
     "KIT_MODEL_KINDS"),
    ("raise RuntimeError('broken at import')\n", "cannot import"),
])
def test_bad_implementations_get_one_clear_error(tmp_path, source, expected):
    path = write(tmp_path, "engine_under_test.py", source)
    with pytest.raises(ImplError) as info:
        load(path)
    assert expected in str(info.value)
    assert path in str(info.value)


@pytest.mark.parametrize("spec,expected", [
    ("no_such_module_anywhere", "cannot import"),
    ("no/such/file.py", "no such file"),
    ("tests/mutants/catalogue.py:NoSuchMutant", "no attribute 'NoSuchMutant'"),
])
def test_unresolvable_impl(spec, expected):
    with pytest.raises(ImplError, match=expected):
        load(spec)


def test_wildcard_signatures_are_accepted(tmp_path):
    path = write(tmp_path, "loose.py", """
        def accept_or_correct(p, q, token, **options):
            return token, True
        def speculative_generate(target, draft, prompt_ids, max_new_tokens, **options):
            return [], {}
    """)
    impl = load(path)
    assert impl.levels == ("rule", "engine")
    assert not impl.accepts("speculative_generate", "top_k")  # exercised only when named


def test_bad_impl_stops_pytest_before_any_test(tmp_path):
    path = write(tmp_path, "wrong.py", "def speculative_generate(target, draft, prompt):\n    pass\n")
    proc = kit("properties/", f"--impl={path}")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "speculative_generate" in proc.stderr and "named 'prompt'" in proc.stderr
    assert "passed" not in proc.stdout and "failed" not in proc.stdout
    assert proc.stderr.count("ERROR") == 1


# --------------------------------------------------------------------------- reporting

def test_header_summary_and_json(tmp_path):
    out = tmp_path / "summary.json"
    proc = kit("properties/test_rule.py::test_chapter_worked_example", "properties/test_batched.py",
               "properties/test_perfect_draft.py", f"--impl={CHAPTER}",
               f"--conformance-json={out}", "-rs")
    assert proc.returncode == 0, proc.stdout
    assert f"implementation under test: --impl={CHAPTER}" in proc.stdout
    assert "levels: rule (accept_or_correct), engine (speculative_generate)" in proc.stdout
    assert "conformance summary" in proc.stdout and "CONFORMANT" in proc.stdout
    assert "has no batched_generate" in proc.stdout
    data = json.loads(out.read_text())
    assert data["impl"] == CHAPTER and data["conformant"]
    assert data["families"]["rule"]["passed"] == 1
    # the two kinds of test_perfect_draft, and the trained pair's test_perfect_draft_trained
    assert data["families"]["perfect_draft"]["passed"] == 3
    assert data["families"]["batched"]["passed"] == 0
    assert data["families"]["batched"]["not_applicable"] >= 4
    assert any("batched_generate" in r for r in data["families"]["batched"]["reasons"])
    assert data["statistical_checks"] == 3
    # each deterministic check that ran states f, (1 - f)^n = 0.01 at its n generated examples;
    # a test of fixed cases (the worked example) states none
    entry = data["deterministic_checks"]["perfect_draft"][
        "properties/test_perfect_draft.py::test_perfect_draft[table]"]
    assert entry["examples"] == 5 and abs((1 - entry["hit_rate"]) ** 5 - 0.01) < 1e-12
    assert "rule" not in data["deterministic_checks"]
    assert "each deterministic check detects, with probability >= 0.99" in proc.stdout
    assert "perfect_draft: f 0.60 (n 5): test_perfect_draft[" in proc.stdout


def test_summary_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    out = tmp_path / "summary.json"
    proc = kit("properties/test_rule.py::test_chapter_worked_example", "properties/test_bounds.py",
               "--impl=tests/mutants/catalogue.py:PrefillCountedAsRound", "-n", "2",
               f"--conformance-json={out}")
    data = json.loads(out.read_text())
    assert proc.returncode == 1
    assert data["families"]["bounds"]["failed"] >= 1 and data["families"]["rule"]["passed"] == 1
    assert data["statistical_checks"] == 3
    # the workers' deterministic checks state their f on the controller too
    stated = data["deterministic_checks"]["bounds"]
    assert stated and all(0 < e["hit_rate"] < 1 and e["examples"] >= 1 for e in stated.values())
    assert not data["conformant"]


def test_known_failures_match_test_and_cause_and_warn_on_stale_ids(tmp_path):
    known = tmp_path / "known.txt"
    known.write_text("# InvertedRatio's known failure\n"
                     "* | * | properties/test_rule.py::test_chapter_worked_example | committed "
                     "token is distributed as p | tests/mutants/catalogue.py | a run of it\n\n"
                     "* | * | properties/test_rule.py::test_that_does_not_exist | x+y | x.py | run\n")
    out = tmp_path / "summary.json"
    proc = kit("properties/test_rule.py::test_chapter_worked_example",
               "--impl=tests/mutants/catalogue.py:InvertedRatio", f"--known-failures={known}",
               f"--conformance-json={out}", "-W", "default")
    assert proc.returncode == 0, proc.stdout
    data = json.loads(out.read_text())
    assert data["families"]["rule"]["xfailed"] == 1 and data["families"]["rule"]["failed"] == 0
    # known failures never make a run conformant
    assert data["verdict"] == "NOT CONFORMANT" and "all failures known: 1" in data["verdict_text"]
    assert "test_that_does_not_exist" in proc.stdout and "matches no test" in proc.stdout
    # the same test failing with another cause is a new failure
    known.write_text("* | * | properties/test_rule.py::test_chapter_worked_example | another "
                     "defect's signature | x.py | run\n")
    proc = kit("properties/test_rule.py::test_chapter_worked_example",
               "--impl=tests/mutants/catalogue.py:InvertedRatio", f"--known-failures={known}",
               f"--conformance-json={out}")
    data = json.loads(out.read_text())
    assert proc.returncode == 1 and data["families"]["rule"]["failed"] == 1
    assert "1 failure(s) not known" in data["verdict_text"]


def test_missing_known_failures_file_is_a_usage_error(tmp_path):
    proc = kit("properties/test_rule.py", f"--known-failures={tmp_path / 'nope.txt'}")
    assert proc.returncode == 4 and "no such file" in proc.stderr


def test_failure_prints_a_reproduction_that_replays(tmp_path):
    spec = "tests/mutants/catalogue.py:VerifyOffByOne"
    proc = kit("properties/test_greedy.py::test_edge_cases", f"--impl={spec}", "-x")
    assert proc.returncode == 1
    lines = [line.lstrip("E").strip() for line in proc.stdout.splitlines()]
    replay = next(line for line in lines if line.startswith("python -m properties.replay"))
    assert f"--impl={spec}" in replay and "EngineCase(" in replay and "seed=" in replay
    assert any(line.startswith("python -m pytest 'properties/test_greedy.py::test_edge_cases[")
               for line in lines)
    again = subprocess.run(sys.executable + replay.removeprefix("python"), shell=True, cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert again.returncode == 1 and "greedy: equivalence: violated" in again.stdout
    assert "first difference at output position" in again.stdout


# --------------------------------------------------------------------------- profiles

def test_profiles():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.deadline is None and ci.database is None
    selftest = settings.get_profile("selftest")
    assert selftest.derandomize and selftest.database is None
    assert "shrink" not in {p.name for p in selftest.phases}
    assert settings.get_profile("thorough").max_examples > settings.get_profile("dev").max_examples


def test_profile_from_environment(tmp_path):
    # collected only: the profile is chosen and announced when the session starts (running the
    # test under 'thorough' as well took 21 s and showed nothing more)
    env = {**os.environ, "HYPOTHESIS_PROFILE": "thorough"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co",
                           "properties/test_rule.py::test_chapter_worked_example",
                           f"--impl={CHAPTER}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert "hypothesis profile 'thorough'" in proc.stdout or "profile thorough" in proc.stdout


def test_a_directory_is_not_an_implementation(tmp_path):
    with pytest.raises(ImplError, match="is a directory"):
        load(str(tmp_path))
    with pytest.raises(ImplError, match="is a directory"):
        load("tests/mutants")


def test_misnamed_engine_gets_a_hint(tmp_path):
    path = write(tmp_path, "misnamed.py", """
        def accept_or_correct(p, q, token, generator=None):
            return token, True

        def speculative_decode(target, draft, prompt_ids, max_new_tokens, k=4):
            return [], {}
    """)
    impl = load(path)
    assert impl.levels == ("rule",)
    assert impl.hints["speculative_generate"] == "speculative_decode"
    assert "did you mean speculative_generate?" in impl.header()


@pytest.mark.parametrize("declared,message", [
    ({"greedy": "no argmax", "graedy": "typo"}, "unknown family 'graedy'"),
    (["greedy"], "must be a dict"),
])
def test_kit_not_applicable_is_validated(tmp_path, declared, message):
    path = write(tmp_path, "declares.py", f"""
        KIT_NOT_APPLICABLE = {declared!r}

        def accept_or_correct(p, q, token, generator=None):
            return token, True
    """)
    with pytest.raises(ImplError, match=message):
        load(path)


def test_kit_trained_names_a_directory_that_is_not_one(tmp_path):
    """--kit-trained points the trained properties at other models: a path without trained
    models is one usage error naming the option and the path, before anything is collected."""
    missing = tmp_path / "nowhere"
    proc = kit("properties/test_greedy.py", f"--kit-trained={missing}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert f"--kit-trained={missing}" in proc.stderr and "manifest.json missing" in proc.stderr


def test_kit_trained_runs_the_trained_properties_on_the_large_pair(tmp_path):
    """The weight-bound pair (make models-large) through the trained greedy property, in two
    xdist workers as `make conformance-large` runs it: every call the engine gets is on the
    large target (each worker applies the option before it collects), the run says which models
    it used, and the verdict on the reference behind the chapter's API is CONFORMANT."""
    from reference.pretrained import LARGE_DIR
    if not (LARGE_DIR / "manifest.json").is_file():
        pytest.skip(f"no weight-bound pair at {LARGE_DIR}: run `make models-large`")
    seen = tmp_path / "hidden_sizes.txt"
    engine = write(tmp_path, "noting_engine.py", f"""
        from reference import speculative
        from reference.speculative import accept_or_correct

        def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4,
                                 temperature=0.0, stop_ids=(), generator=None):
            with open({str(seen)!r}, "a") as notes:
                notes.write(f"{{target.config.hidden_size}}\\n")
            return speculative.speculative_generate(target, draft, prompt_ids, max_new_tokens,
                                                    k=k, temperature=temperature,
                                                    stop_ids=stop_ids, generator=generator)
        """)
    out = tmp_path / "kit.json"
    proc = kit("properties/test_greedy.py", "-k", "test_greedy_trained", f"--impl={engine}",
               f"--kit-trained={LARGE_DIR}", f"--conformance-json={out}", "-n", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["trained_models"] == str(LARGE_DIR)
    assert summary["families"]["greedy"]["passed"] == 1 and summary["verdict"] == "CONFORMANT"
    assert f"trained models {LARGE_DIR} (--kit-trained)" in proc.stdout
    sizes = seen.read_text().split()
    assert sizes and set(sizes) == {"384"}, sizes     # the committed target's is 128
