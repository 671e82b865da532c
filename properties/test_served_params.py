"""Family "served_params": penalties, min_p, logit_bias, stop strings, n and logprobs under
speculation, judged against the float64 target processed by the engine's own formula
(properties/formulas.py; the checks and the engine x parameter table: checks/served_params.py).

Greedy (penalties and a logit bias move the argmax): the output is the exact argmax of the
adjusted logits, and the baseline's. Sampled: chi-square against the exact law of the first L
tokens under the formula (ALPHA per check, power POWER at TV 0.15), or two samples against the
baseline where the kit knows no formula. Logprobs: the raw target's log-softmax within 1e-3.
Stop strings: text of 2-3 consecutive greedy tokens of a repeated prompt, so that they land
inside blocks a speculator proposes and the server accepts. n = 2: each completion exact and
the pair within a request distributed as the product law (TV 0.2 with power POWER).
Sampled examples ask for two tokens at least: the first comes from the prefill, unspeculated.

Over several rounds (issue 42): state that carries from one round to the next (the penalty
history, the seeded generator) shows only after a rejection and a later round, so the
penalties and a bias with a penalty are judged again over outputs of several rounds: greedy
outputs of 16-24 tokens, and laws of 4-6 tokens (checks.check_law_rounds, under a top-k of
2-3: at most 81 outputs), whose failure names the first position where the law breaks.

The greedy checks are single deterministic requests, cheap on every engine: each draws at
least profiles.examples_for(SERVED_HIT_RATE) = 44 examples, so that a defect showing in one
example of ten is seen with probability 0.99 (f <= 0.1; the run's summary states f per check).

An engine that refuses a parameter (HTTP 4xx) skips its test as "not supported".

Each parameter has its own tests, so that an engine refusing one (vLLM: min_p and logit_bias
under speculation) or lacking it (transformers serve: presence and frequency) has every other
one judged. The statistical tests draw a tenth of a profile's examples (scale 0.1): with the
explicit ones, 26 chi-square checks in the thorough profile (the three laws over several rounds
bring its whole run to MAX_CHECKS_PER_RUN, the kit's budget: 500 of 500).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from properties import profiles, speculation
from properties.cases import ServedCase
from properties.checks import served_params as checks
from properties.strategies import served_prompts
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("served_params")

REPEATED = (3, 9, 27, 3, 9, 27, 3, 9)
# prompt lookup proposes from the repeated prompt; its greedy output is "hdFtykykyk...", whose
# stop string "Fty" first completes at token 5, inside the first round's block
LOOKUP = (0, 1, 2, 0, 1, 2, 0, 1)
BIASED = (30, 1, 17, 8, 12)   # min_p at temperature 1.5 removes part of a wide first law
# a bias of 3 on token 20 moves the greedy output at position 4; on token 12 after (1, 2) it
# moves the second token's law by TV 0.40: both where speculation verifies

# One parameter per test: an engine that refuses one (a 4xx skips the test) or lacks it in its
# API still has every other judged. Each draws the parameter's own values.
PARAMETERS = {
    "repetition_penalty": st.fixed_dictionaries(
        {"repetition_penalty": st.sampled_from([0.8, 1.3, 1.6, 2.0])}),
    "presence_frequency": st.fixed_dictionaries(
        {"presence_penalty": st.sampled_from([-0.5, 0.0, 0.4, 0.8]),
         "frequency_penalty": st.sampled_from([0.0, 0.3, 0.6])}).filter(
        lambda d: d["presence_penalty"] or d["frequency_penalty"]),
    "min_p": st.fixed_dictionaries({"min_p": st.sampled_from([0.05, 0.1, 0.2])}),
    "logit_bias": st.fixed_dictionaries({"logit_bias": st.lists(
        st.tuples(st.integers(0, 31), st.sampled_from([-2.0, 1.0, 1.5, 3.0])), min_size=1,
        max_size=3, unique_by=lambda pair: pair[0]).map(tuple)}),
}
# a logit bias with a repetition penalty (the penalty's history carries across rounds, the bias
# moves which tokens it holds); the repetition penalty, which every engine the kit knows takes
# with a bias, so that one engine lacking presence and frequency still has this test judged
PARAMETERS["bias_with_penalties"] = st.fixed_dictionaries({
    "logit_bias": PARAMETERS["logit_bias"].map(lambda d: d["logit_bias"]),
    "repetition_penalty": st.sampled_from([1.3, 1.6, 2.0])})


def judged(served, case, cover: bool = True):
    """The case as the server's drafter speculates it (speculation.for_drafter: a lookup
    drafter gets a prompt that holds every token, a capped engine 3 tokens for 2). Penalties
    keep their own prompt (cover=False): a prompt holding every token would put every token in
    the repetition history, and a spurious token added to it would change nothing; their
    examples' repeated prompts give a lookup matches of their own. A lookup drafter gets the
    covering prompt all the same: a sampled first token the prompt lacks leaves it nothing to
    propose (seen: llama.cpp's ngram-simple on these prompts was never shown), and a penalty
    judged where nothing was drafted says nothing about speculation; a frequency penalty still
    counts a spurious token twice."""
    moved = speculation.for_drafter(served, case)
    return moved if cover or served.method.drafter.lookup else case.replace(
        max_tokens=moved.max_tokens)


@st.composite
def shaped_cases(draw, parameter: str, greedy: bool):
    temperature = 0.0 if greedy else draw(st.sampled_from([0.5, 1.0]))
    # two tokens at least: the first comes from the prefill, the second can be speculated
    length = draw(st.integers(4, 12)) if greedy else 2
    return ServedCase(draw(served_prompts()), length,
                      SamplingParams(temperature=temperature, seed=draw(st.integers(0, 2**20)),
                                     **draw(PARAMETERS[parameter])))


@st.composite
def rounds_cases(draw, parameter: str, greedy: bool):
    """Outputs long enough for several rounds: greedy 16-24 tokens; sampled L = 4-6 under a
    top-k of 2 (L = 4 under 3) at a temperature of 0.5-1, so that the law of L tokens keeps a
    small support (at most 81 outputs) through the engine's own filters. Every sampled request
    carries a seed (checks.served.sampling_requests)."""
    prompt = draw(served_prompts())
    params = draw(PARAMETERS[parameter])
    if greedy:
        return ServedCase(prompt, draw(st.integers(16, 24)), SamplingParams(**params))
    top_k = draw(st.sampled_from([2, 3]))
    length = draw(st.integers(4, 6)) if top_k == 2 else 4
    return ServedCase(prompt, length, SamplingParams(
        temperature=draw(st.sampled_from([0.5, 0.7, 1.0])), top_k=top_k,
        seed=draw(st.integers(0, 2**20)), **params))


def _penalized(case) -> bool:
    return case.sampling.penalized


# --------------------------------------------------------------------------- greedy

@given(case=shaped_cases("repetition_penalty", greedy=True))
@example(case=ServedCase(REPEATED, 8, SamplingParams(repetition_penalty=1.6)))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_repetition_penalty(served, case):
    checks.check_greedy(served, judged(served, case, cover=False))


@given(case=shaped_cases("presence_frequency", greedy=True))
@example(case=ServedCase(REPEATED, 8, SamplingParams(presence_penalty=0.8,
                                                     frequency_penalty=0.4)))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_presence_and_frequency_penalties(served, case):
    checks.check_greedy(served, judged(served, case, cover=False))


@given(case=shaped_cases("logit_bias", greedy=True))
@example(case=ServedCase(BIASED, 8, SamplingParams(logit_bias=((20, 3.0),))))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_logit_bias(served, case):
    checks.check_greedy(served, judged(served, case))


# --------------------------------------------------------------------------- the law

@given(case=shaped_cases("repetition_penalty", greedy=False))
@example(case=ServedCase(REPEATED, 2, SamplingParams(temperature=1.0, repetition_penalty=1.6,
                                                     seed=3)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_repetition_penalty(served, case):
    checks.check_law(served, judged(served, case, cover=False))


@given(case=shaped_cases("presence_frequency", greedy=False))
@example(case=ServedCase(REPEATED, 2, SamplingParams(temperature=1.0, presence_penalty=0.8,
                                                     frequency_penalty=0.4, seed=7)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_presence_and_frequency_penalties(served, case):
    checks.check_law(served, judged(served, case, cover=False))


@given(case=shaped_cases("min_p", greedy=False))
@example(case=ServedCase(BIASED, 2, SamplingParams(temperature=1.5, min_p=0.1, seed=4)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_min_p(served, case):
    checks.check_law(served, judged(served, case))


@given(case=shaped_cases("logit_bias", greedy=False))
@example(case=ServedCase((1, 2), 2, SamplingParams(temperature=1.0, logit_bias=((12, 3.0),),
                                                   seed=5)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_logit_bias(served, case):
    checks.check_law(served, judged(served, case))


# --------------------------------------------------------------------------- several rounds
# State that carries from one round to the next (the penalty history, the sampler's generator,
# a rejected draft kept somewhere) shows only after a rejection and a later round: at the second
# token a leaked rejected token cannot show, since the residual excludes it anyway. Greedy
# outputs of 16-24 tokens, and laws of 4-6 tokens (at least ROUNDS_MIN_LENGTH) sized by
# statistics.plan at DELTA_SERVED; a failure names the first position where the law breaks.
# Every sampled request carries its own seed, so each law also judges the seeded generator's
# state across rounds. The explicit examples are where the kit's round mutants
# (tests/mutants/served_params.py: RejectedKeptInHistory, GeneratorRolledBack) move the law
# most (tests/test_served_rounds.py computes it exactly). Three laws (repetition; presence and
# frequency; a bias with a repetition penalty): 8 checks in the thorough profile, which fills
# its budget of MAX_CHECKS_PER_RUN (500 of 500).

@given(case=rounds_cases("repetition_penalty", greedy=True))
@example(case=ServedCase(LOOKUP, 20, SamplingParams(repetition_penalty=1.6)))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_rounds_repetition_penalty(served, case):
    checks.check_greedy(served, judged(served, case, cover=False))


@given(case=rounds_cases("presence_frequency", greedy=True))
@example(case=ServedCase(LOOKUP, 20, SamplingParams(presence_penalty=0.8, frequency_penalty=0.4)))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_rounds_presence_and_frequency_penalties(served, case):
    checks.check_greedy(served, judged(served, case, cover=False))


@given(case=rounds_cases("bias_with_penalties", greedy=True))
@example(case=ServedCase(LOOKUP, 20, SamplingParams(logit_bias=((1, 1.0),), repetition_penalty=1.3)))
@profiles.deterministic(scale=0.2, hit_rate=profiles.SERVED_HIT_RATE)
def test_greedy_rounds_logit_bias_with_penalties(served, case):
    checks.check_greedy(served, judged(served, case, cover=False))


@given(case=rounds_cases("repetition_penalty", greedy=False))
@example(case=ServedCase(LOOKUP, 5, SamplingParams(temperature=0.7, top_k=2,
                                                   repetition_penalty=1.6, seed=11)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_rounds_repetition_penalty(served, case):
    checks.check_law_rounds(served, judged(served, case, cover=False))


@given(case=rounds_cases("presence_frequency", greedy=False))
@example(case=ServedCase(LOOKUP, 5, SamplingParams(temperature=0.7, top_k=2, presence_penalty=0.8,
                                                   frequency_penalty=0.4, seed=12)))
@profiles.statistical(checks=1, scale=0.1)
def test_law_rounds_presence_and_frequency_penalties(served, case):
    checks.check_law_rounds(served, judged(served, case, cover=False))


# generated examples only: the thorough profile's budget of MAX_CHECKS_PER_RUN has no room for
# a canonical example (tests/test_served_rounds.py's BIAS_ROUNDS is the one it would be)
@given(case=rounds_cases("bias_with_penalties", greedy=False))
@profiles.statistical(checks=1, scale=0.1)
def test_law_rounds_logit_bias_with_penalties(served, case):
    checks.check_law_rounds(served, judged(served, case, cover=False))



# --------------------------------------------------------------------------- the rest

@given(case=st.builds(lambda p, n, k, t: ServedCase(p, n, SamplingParams(temperature=t,
                                                                         logprobs=k, seed=n)),
                      served_prompts(), st.integers(2, 10), st.integers(0, 5),
                      st.sampled_from([0.0, 1.0])))
@example(case=ServedCase(REPEATED, 8, SamplingParams(logprobs=3)))
@example(case=ServedCase(REPEATED, 6, SamplingParams(temperature=1.0, logprobs=2, seed=9)))
@profiles.deterministic(scale=0.3)
def test_logprobs_are_the_targets(served, case):
    checks.check_logprobs(served, judged(served, case))


@st.composite
def stop_string_cases(draw):
    prompt = draw(st.sampled_from([REPEATED, LOOKUP, (4, 4, 4, 4), (10, 20, 10, 20, 10, 20)]))
    start, length = draw(st.integers(1, 6)), draw(st.integers(2, 3))
    stop = checks.stop_string_at(prompt, 12, start, length)
    return ServedCase(prompt, 12, SamplingParams(stop_strings=(stop,)))


@given(case=stop_string_cases())
@example(case=ServedCase(LOOKUP, 12, SamplingParams(stop_strings=("Fty",))))
@example(case=ServedCase((4, 4, 4, 4), 12, SamplingParams(stop_strings=("FtcC", "dFt"))))
@profiles.deterministic(scale=0.3, hit_rate=profiles.SERVED_HIT_RATE)
def test_stop_strings_inside_accepted_blocks(served, case):
    checks.check_stop_strings(served, case)


# two tokens (the second speculated) under a top-k of 2-4: the pair law stays small
@given(case=st.builds(lambda p, t, k, s: ServedCase(p, 2, SamplingParams(temperature=t, top_k=k,
                                                                         seed=s)),
                      served_prompts(), st.sampled_from([0.8, 1.0, 1.5]), st.integers(2, 4),
                      st.integers(0, 2**20)))
@example(case=ServedCase((1, 2), 2, SamplingParams(temperature=1.0, top_k=3, seed=6)))
@profiles.statistical(checks=2, scale=0.1)
def test_n_completions_independent_and_exact(served, case):
    checks.check_n(served, judged(served, case))
