"""Greedy ties: a divergence to a token whose logit is within the tolerance of the target's
largest is reported, not failed; anything else fails. And an engine with its own greedy decoding is held to it."""

import textwrap
import warnings

import pytest

from properties import oracle
from properties.cases import EngineCase
from properties.harness import PropertyFailure
from properties.impl import load
from properties.models import DraftSpec, Qwen3Spec, build_target
from properties.checks.greedy import GreedyTie, check_equivalence

CASE = EngineCase(Qwen3Spec(7, seed=5, layers=2), DraftSpec("noisy", 1), (1, 2, 3), 6, k=2)


def engine_file(tmp_path, body, **attributes):
    lines = [f"{name} = {value!r}" for name, value in attributes.items()]
    path = tmp_path / "engine.py"
    path.write_text("\n".join(lines) + "\n" + textwrap.dedent(body))
    return load(str(path))


WRONG_FIRST_TOKEN = f"""
def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None):
    # the target's greedy output with its first token replaced
    expected = {oracle.greedy(CASE.target, CASE.prompt, CASE.max_new_tokens)[0]!r}
    return [(expected[0] + 1) % 7] + expected[1:], {{"rounds": 6, "acceptance_rate": 0.0,
                                                    "tokens_per_target_call": 1.0}}
"""


def wrong_tokens_gap():
    """How far below the target's largest logit the engine's wrong first token is."""
    logits = build_target(CASE.target, role="oracle").next_logits(list(CASE.prompt))
    expected = int(logits.argmax())
    return float(logits[expected] - logits[(expected + 1) % 7])


def test_a_divergence_beyond_the_tolerance_fails(tmp_path):
    impl = engine_file(tmp_path, WRONG_FIRST_TOKEN)
    with pytest.raises(PropertyFailure, match="first difference at output position 0"):
        check_equivalence(impl, CASE)


def test_a_tolerance_just_below_the_wrong_tokens_gap_still_fails(tmp_path):
    impl = engine_file(tmp_path, WRONG_FIRST_TOKEN, KIT_LOGIT_TOLERANCE=wrong_tokens_gap() * 0.99)
    with pytest.raises(PropertyFailure, match="first difference at output position 0"):
        check_equivalence(impl, CASE)


def test_a_divergence_within_the_tolerance_is_a_reported_tie(tmp_path):
    impl = engine_file(tmp_path, WRONG_FIRST_TOKEN, KIT_LOGIT_TOLERANCE=wrong_tokens_gap() * 1.01)
    with pytest.warns(GreedyTie, match="output position 0 .* a tie, not a failure"):
        check_equivalence(impl, CASE)


def test_the_engines_own_greedy_output_is_checked_too(tmp_path):
    correct = f"""
    def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                             stop_ids=(), generator=None):
        return {oracle.greedy(CASE.target, CASE.prompt, CASE.max_new_tokens)[0]!r}, {{
            "rounds": 6, "acceptance_rate": 0.0, "tokens_per_target_call": 1.0}}

    def target_greedy_generate(target, prompt_ids, max_new_tokens, stop_ids=()):
        return [0] * max_new_tokens   # an own greedy decoding that disagrees
    """
    impl = engine_file(tmp_path, correct)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GreedyTie)  # no tie may be claimed here
        with pytest.raises(PropertyFailure, match="the implementation's own greedy output"):
            check_equivalence(impl, CASE)
