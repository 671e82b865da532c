"""python -m reference speculate prints the chapter's JSON lines."""

import json
import subprocess
import sys


def run(*args, timeout=300):
    done = subprocess.run([sys.executable, "-m", "reference", "speculate", *args],
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_the_chapters_two_lines():
    code, lines, _ = run("--k", "4")
    assert code == 0
    perfect, early = lines
    # Perfect draft: 32 tokens, k + 1 = 5 per round, so 7 rounds and 32 / 7 tokens per call.
    assert perfect == {"draft": "target itself (perfect draft)", "rounds": 7,
                       "acceptance_rate": 1.0, "tokens_per_target_call": 4.57}
    assert early["draft"] == "first 2 of 6 layers" and early["identical_to_target_greedy"] is True
    assert early["tokens_per_target_call"] == round(32 / early["rounds"], 2)


def test_tree_lookup_and_adaptive_stay_identical():
    for extra in (["--tree"], ["--draft", "prompt-lookup"], ["--adaptive", "--k", "6"]):
        code, lines, _ = run(*extra)
        assert code == 0 and all(line.get("identical_to_target_greedy", True) for line in lines)


def test_bad_argument_is_a_clear_error():
    code, _, err = run("--top-p", "1.5")
    assert code == 2 and "top_p must be in (0, 1]" in err


def test_a_huge_k_is_capped_by_what_can_still_be_produced():
    # k = 100000 used to draft 100000 tokens per round (and size caches for them): a hang.
    code, lines, _ = run("--k", "100000", timeout=120)
    assert code == 0
    perfect, early = lines
    assert perfect == {"draft": "target itself (perfect draft)", "rounds": 1,
                       "acceptance_rate": 1.0, "tokens_per_target_call": 32.0}
    assert early["identical_to_target_greedy"] is True
    code, lines, _ = run("--k", "100000", "--adaptive", "--draft", "early-exit", timeout=120)
    assert code == 0 and lines[0]["identical_to_target_greedy"] is True
