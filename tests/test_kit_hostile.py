"""Never a false CONFORMANT: the kit's verdict on hostile engines (tests/mutants/hostile.py and
the small modules beside it), and the messages it gives them.

Each test runs the kit as a user would, in a subprocess, on one family file (stopping at the
first failure where a failure is the point) and reads the JSON summary and the terminal text.
Every test asserts a verdict other than CONFORMANT, or a usage error, where the engine is
broken: a kit that let the engine through fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "tests/mutants/hostile.py"
GREEDY = "properties/test_greedy.py"

pytestmark = pytest.mark.slow


@dataclass
class KitRun:
    spec: str
    returncode: int
    out: str            # stdout and stderr together
    data: dict | None   # the --conformance-json summary, None when none was written

    def show(self) -> str:
        return f"exit status {self.returncode}, JSON {self.data and self.data.get('verdict')}\n" \
               f"{self.out[-5000:]}"


def kit_command(spec: str, paths: list[str], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *paths, f"--impl={spec}", "-p", "no:cacheprovider",
            "--hypothesis-profile=selftest", f"--conformance-json={out}", "-q", "--tb=short",
            "-rN", "--no-header", *extra]


def kit_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS")}
    return env | extra


def read_summary(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def run_kit(spec: str, paths: list[str], tmp_path: Path, *extra: str, timeout: int = 180) -> KitRun:
    out = tmp_path / "conformance.json"
    try:
        proc = subprocess.run(kit_command(spec, paths, out, *extra), cwd=ROOT, env=kit_env(),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the kit did not finish within {timeout} s on --impl={spec}: "
                    f"{(exc.stdout or b'')[-3000:]!r}")
    return KitRun(spec, proc.returncode, proc.stdout + proc.stderr, read_summary(out))


def assert_not_conformant(run: KitRun, *phrases: str) -> None:
    """The run failed the engine, in the JSON, the verdict line and the exit status, and the
    failure text holds every phrase."""
    assert run.data is not None, f"no JSON summary\n{run.show()}"
    assert run.data["verdict"] == "NOT CONFORMANT", run.show()
    assert run.data["conformant"] is False, run.show()
    assert f"verdict for --impl={run.spec}: NOT CONFORMANT" in run.out, run.show()
    assert run.returncode == 1, run.show()
    assert f"violated by --impl={run.spec}" in run.out, run.show()
    for phrase in phrases:
        assert phrase in run.out, f"{phrase!r} is not in the failure\n{run.show()}"


def hostile(name: str) -> str:
    return f"{HOSTILE}:{name}"


# ------------------------------------------------------------------ the models and the caller

def test_modified_weights_are_named(tmp_path):
    run = run_kit(hostile("ClampsWeights"), [GREEDY], tmp_path, "-x")
    assert_not_conformant(run, "modified the weights")
    # The parameter is named as the model names it (e.g. model.embed_tokens.weight).
    assert re.search(r"(embed_tokens|layers\.\d+|norm|lm_head)[\w.]*weight", run.out), run.show()


def test_mutated_prompt_ids(tmp_path):
    assert_not_conformant(run_kit(hostile("MutatesPrompt"), [GREEDY], tmp_path, "-x"),
                          "mutated prompt_ids")


@pytest.mark.parametrize("name", ["ReseedsTorch", "ReseedsPython", "ReseedsNumpy"])
def test_reseeded_global_rng(name, tmp_path):
    assert_not_conformant(run_kit(hostile(name), [GREEDY], tmp_path, "-x"),
                          "reseeded the global RNG")


def test_cache_from_an_earlier_call(tmp_path):
    run = run_kit(hostile("KeepsCacheAcrossCalls"), [GREEDY], tmp_path, "-x")
    assert_not_conformant(run)
    assert "a cache it did not create" in run.out or "a cache from an earlier call" in run.out, \
        run.show()


# ------------------------------------------------------------------ randomness and time

@pytest.mark.parametrize("name", ["UrandomSampling", "ClockSeededSampling"])
def test_nondeterministic_given_the_same_generator(name, tmp_path):
    # Its samples have the right law, so only a determinism check on a sampled call can see it:
    # the sequence family's plain sampling property (its first call already samples).
    run = run_kit(hostile(name), ["properties/test_sequence.py"], tmp_path, "-x",
                  "-k", "test_sampling_table")
    assert_not_conformant(run, "nondeterministic")


@pytest.mark.parametrize("name", ["SpinsWhenKAtLeast2", "SleepsWhenKAtLeast2"])
def test_hang_hits_the_time_limit(name, tmp_path):
    run = run_kit(hostile(name), [GREEDY], tmp_path, "-x", "--kit-timeout=2", timeout=120)
    assert_not_conformant(run, "time limit", "--kit-timeout")
    # The case is named, and it is one the engine hangs on (k >= 2).
    ks = [int(k) for k in re.findall(r"EngineCase\(.*?\bk=(\d+)", run.out)]
    assert ks and all(k >= 2 for k in ks), run.show()


def _interruptible():
    """Ctrl-C at its default in the kit's process, as a terminal starts it. An ignored SIGINT
    is inherited across exec, and Python then never turns it into KeyboardInterrupt: inside the
    whole suite, something run earlier in the same xdist worker leaves SIGINT ignored (the run
    hung here until killed; a parent that ignores SIGINT reproduces the hang), which says
    nothing about the kit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_gives_incomplete(tmp_path):
    spec = hostile("SleepsWhenKAtLeast2")
    out, mark = tmp_path / "conformance.json", tmp_path / "engine-is-hanging"
    proc = subprocess.Popen(kit_command(spec, [GREEDY], out), cwd=ROOT,
                            env=kit_env(KIT_HOSTILE_MARK=str(mark)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_interruptible)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), f"the engine never started hanging (exit {proc.poll()})"
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run = KitRun(spec, proc.returncode, text, read_summary(out))
    assert run.data is not None, run.show()
    assert run.data["verdict"] == "INCOMPLETE", run.show()
    assert run.data["conformant"] is False and run.data["complete"] is False, run.show()
    assert f"verdict for --impl={spec}: INCOMPLETE" in run.out, run.show()
    assert run.returncode == 2, run.show()


# ------------------------------------------------------------------ leaving the call the wrong way

def test_sys_exit_inside_the_engine_is_a_failure(tmp_path):
    assert_not_conformant(run_kit(hostile("ExitsWithSysExit"), [GREEDY], tmp_path, "-x"),
                          "sys.exit")


def test_os_exit_leaves_the_summary_incomplete(tmp_path):
    run = run_kit(hostile("ExitsWithOsExit"), [GREEDY], tmp_path)
    # The process vanished mid-run (with status 0): only the summary written at the start of
    # the session is left, and it must not claim a pass.
    assert run.data is not None, f"no JSON summary was written at the session's start\n{run.show()}"
    assert run.data["verdict"] == "INCOMPLETE", run.show()
    assert run.data["conformant"] is False and run.data["complete"] is False, run.show()
    assert ": CONFORMANT" not in run.out, run.show()


def engine_line(marker: str) -> int:
    lines = (ROOT / HOSTILE).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def replay_command(out: str) -> list[str]:
    line = next(l for l in out.splitlines() if "python -m properties.replay" in l)
    args = shlex.split(line[line.index("python -m properties.replay"):])
    return [sys.executable, *args[1:]]


def test_engine_exception_shows_the_engines_traceback(tmp_path):
    run = run_kit(hostile("BonusIndexError"), [GREEDY], tmp_path, "-x")
    assert_not_conformant(run, "the engine raised", "IndexError")
    where = rf"hostile\.py[\"']?(, line |:){engine_line('BONUS-INDEX-ERROR')}\b"
    assert re.search(where, run.out), f"no traceback line {where}\n{run.show()}"
    replay = subprocess.run(replay_command(run.out), cwd=ROOT, env=kit_env(),
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert re.search(where, replay.stdout + replay.stderr), replay.stdout + replay.stderr


@pytest.mark.parametrize("name, returned", [("ReturnsTokensOnly", "list"),
                                            ("ReturnsThreeTuple", "tuple")])
def test_wrong_return_shape_is_described(name, returned, tmp_path):
    run = run_kit(hostile(name), [GREEDY], tmp_path, "-x")
    assert_not_conformant(run, "returned", "(tokens, stats)", returned)
    assert "the engine raised TypeError" not in run.out, run.show()


# ------------------------------------------------------------------ what was checked

def test_misnamed_engine_function_is_rule_level_only(tmp_path):
    spec = "tests/mutants/misnamed.py"
    run = run_kit(spec, ["properties/test_rule.py", GREEDY], tmp_path,
                  "-k", "never_commits_outside_support or greedy_equivalence")
    assert run.data is not None, run.show()
    assert run.data["levels"] == ["rule"], run.show()
    assert "speculative_generate" in run.data["levels_missing"].get("engine", []), run.show()
    assert "did you mean speculative_generate?" in run.out, run.show()
    verdict = next((l for l in run.out.splitlines() if l.startswith(f"verdict for --impl={spec}:")),
                   "")
    assert "CONFORMANT at the rule level only; no speculative_generate" in verdict, run.show()


def test_unknown_family_in_kit_not_applicable_is_a_usage_error(tmp_path):
    run = run_kit("tests/mutants/not_applicable_typo.py", [GREEDY], tmp_path)
    assert run.returncode == 4, run.show()
    assert "greedyy" in run.out and "KIT_NOT_APPLICABLE" in run.out, run.show()


def test_sampling_only_engine_passes_without_greedy(tmp_path):
    families = ["cache", "perfect_draft", "bounds"]
    run = run_kit("tests/mutants/sampling_only.py",
                  [GREEDY, *(f"properties/test_{f}.py" for f in families)], tmp_path)
    assert run.data is not None, run.show()
    assert run.returncode == 0 and run.data["verdict"] == "CONFORMANT", run.show()
    greedy = run.data["families"]["greedy"]
    assert greedy["passed"] == greedy["failed"] == 0 and greedy["not_applicable"] > 0, greedy
    assert any("sampling-only" in reason for reason in greedy["reasons"]), greedy
    for family in families:
        entry = run.data["families"][family]
        assert entry["passed"] > 0 and entry["failed"] == 0, (family, entry)


def test_impl_directory_is_a_usage_error(tmp_path):
    run = run_kit("tests/mutants", [GREEDY], tmp_path)
    assert run.returncode == 4, run.show()
    assert "tests/mutants" in run.out and "directory" in run.out, run.show()
