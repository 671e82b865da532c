"""The "served_params" family against fake servers: the engines' formulas on hand-computed
examples, the new SamplingParams fields, the exact law with history, the request bodies and
answers of each dialect, and every check of the family passing on the correct fake server
and failing on the broken one meant for it (tests/mutants/served_params.py)."""

from __future__ import annotations

import math

import pytest
import torch

from properties import engines, formulas, methods, oracle
from properties.adapters.served import make_impl
from properties.engines import llamacpp as llamacpp_engine
from properties.engines import transformers as transformers_engine
from properties.engines import vllm as vllm_engine
from properties.adapters.client import Request
from properties.adapters.dialects import OPENAI as OPENAI_DIALECT, openai_logprobs
from properties.cases import ServedCase
from properties.checks import served_params as checks
from properties.engines import llamacpp, transformers, vllm
from properties.harness import PropertyFailure
from reference.penalties import OPENAI
from reference.sampling import SamplingParams
from tests.fakes.engine import FAKE
from tests.fakes.server import FakeServer
from tests.mutants import served_params as mutants

LOGITS = torch.tensor([2.0, -1.0, 0.5, 0.0], dtype=torch.float64)
SHAPED = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                        logit_bias=((2, 1.0),))


VLLM_FORMULA = vllm_engine.FORMULA
LLAMACPP_FORMULA = llamacpp_engine.FORMULA
TRANSFORMERS_FORMULA = transformers_engine.FORMULA

# --------------------------------------------------------------------------- formulas

def test_vllm_formula_by_hand():
    # bias: [2, -1, 1.5, 0]; repetition over prompt {0} + output {1}: 2 / 2, -1 * 2;
    # frequency and presence over the output only: token 1 twice, -(0.25 * 2 + 0.5)
    got = VLLM_FORMULA.adjusted(LOGITS, (0,), (1, 1), SHAPED)
    assert torch.allclose(got, torch.tensor([1.0, -3.0, 1.5, 0.0], dtype=torch.float64))


def test_llamacpp_formula_counts_the_prompt_too():
    # as vLLM, and the prompt's token 0 counted once: 1.0 - (0.25 + 0.5)
    got = LLAMACPP_FORMULA.adjusted(LOGITS, (0,), (1, 1), SHAPED)
    assert torch.allclose(got, torch.tensor([0.25, -3.0, 1.5, 0.0], dtype=torch.float64))


def test_llamacpp_window_keeps_the_last_tokens():
    narrow = formulas.Formula("w", counts_see="prompt+output", window=2)
    got = narrow.adjusted(LOGITS, (0,), (1, 1), SamplingParams(repetition_penalty=2.0))
    assert torch.allclose(got, torch.tensor([2.0, -2.0, 0.5, 0.0], dtype=torch.float64))


def test_transformers_formula_has_no_presence_or_frequency():
    rep_bias = SamplingParams(repetition_penalty=2.0, logit_bias=((2, 1.0),))
    got = TRANSFORMERS_FORMULA.adjusted(LOGITS, (0,), (1, 1), rep_bias)
    assert torch.allclose(got, torch.tensor([1.0, -2.0, 1.5, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="no presence or frequency"):
        TRANSFORMERS_FORMULA.adjusted(LOGITS, (0,), (), SHAPED)
    assert "presence_penalty" in formulas.unsupported(transformers_engine.DIALECT, SHAPED)
    assert formulas.unsupported(vllm_engine.DIALECT, SHAPED) is None


def test_min_p_before_top_k_or_after_top_p_by_hand():
    # probabilities 8:4:2:1 / 15; min_p 0.2 drops the last (1/8 of the largest < 0.2)
    logits = torch.log(torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64))
    p = SamplingParams(temperature=1.0, min_p=0.2, top_p=0.85)
    # vLLM: min_p first -> 8:4:2 / 14; top-p 0.85: mass before token 2 is 12/14 >= 0.85
    assert torch.allclose(VLLM_FORMULA.probs(logits, (), (), p),
                          torch.tensor([2 / 3, 1 / 3, 0, 0], dtype=torch.float64))
    # transformers: top-p first on 8:4:2:1 / 15 keeps 3 (mass before token 2 is 0.8 < 0.85)
    assert torch.allclose(TRANSFORMERS_FORMULA.probs(logits, (), (), p),
                          torch.tensor([8 / 14, 4 / 14, 2 / 14, 0], dtype=torch.float64))


def test_each_engine_declares_its_formula_in_its_own_file():
    from properties import engines
    assert formulas.for_dialect(vllm_engine.DIALECT) is vllm_engine.FORMULA
    assert formulas.for_dialect(llamacpp_engine.DIALECT) is llamacpp_engine.FORMULA
    assert formulas.for_dialect(transformers_engine.DIALECT) is transformers_engine.FORMULA
    assert formulas.for_dialect(engines.get("sglang").dialect) is None   # judged by baseline
    assert set(vllm_engine.DIALECT.refused) == {"min_p", "logit_bias"}


# --------------------------------------------------------------------------- SamplingParams

def test_new_fields_default_off_and_compact_repr():
    assert repr(SamplingParams()) == "SamplingParams()"
    s = SamplingParams(logit_bias={3: 2}, stop_strings="ab")
    assert s.logit_bias == ((3, 2.0),) and s.stop_strings == ("ab",)
    assert repr(s) == "SamplingParams(logit_bias=((3, 2.0),), stop_strings=('ab',))"
    assert hash(s) == hash(SamplingParams(logit_bias=((3, 2.0),), stop_strings=("ab",)))
    assert not SamplingParams().shaped and SamplingParams(min_p=0.1).shaped


@pytest.mark.parametrize("bad, match", [
    ({"repetition_penalty": 0}, "repetition_penalty.*got 0"),
    ({"presence_penalty": math.inf}, "presence_penalty.*got inf"),
    ({"frequency_penalty": "1"}, "frequency_penalty.*got '1'"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\].*got 1.5"),
    ({"logit_bias": {1: math.nan}}, "logit_bias of token 1.*nan"),
    ({"logit_bias": ((1, 1.0), (1, 2.0))}, "names a token twice"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias token.*got -1"),
    ({"logprobs": -1}, "logprobs.*got -1"),
    ({"stop_strings": ("",)}, "stop_strings.*got"),
])
def test_bad_fields_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**bad)


def test_probs_refuses_shaped_params():
    with pytest.raises(ValueError, match="probs_after"):
        SamplingParams(temperature=1.0, min_p=0.1).probs(LOGITS)


# --------------------------------------------------------------------------- the exact law

PROMPT = (3, 9, 27, 3, 9, 27, 3, 9)


def test_law_without_shaping_is_unchanged():
    plain = oracle.served_law(PROMPT, 2, 1.0)
    assert oracle.served_law(PROMPT, 2, 1.0, params=SamplingParams(temperature=1.0)) == plain


def test_law_with_history_is_the_chain_rule():
    s = SamplingParams(temperature=1.0, repetition_penalty=1.6, frequency_penalty=0.5)
    law = oracle.served_law(PROMPT, 2, 1.0, params=s)
    assert abs(sum(law.values()) - 1) < 1e-12
    a, b = max(law, key=law.get)
    first = OPENAI.probs(oracle.served_next_logits([PROMPT])[0], PROMPT, (), s)[a]
    second = OPENAI.probs(oracle.served_next_logits([PROMPT + (a,)])[0], PROMPT, (a,), s)[b]
    assert math.isclose(law[(a, b)], float(first * second), rel_tol=1e-12)
    # the penalty sees the generated token: the law differs from the history-free one
    assert law != oracle.served_law(PROMPT, 2, 1.0)


def test_greedy_under_a_penalty_is_the_adjusted_argmax():
    s = SamplingParams(repetition_penalty=1.6, presence_penalty=0.5)
    tokens = oracle.served_greedy(PROMPT, 6, params=s)
    assert tokens != oracle.served_greedy(PROMPT, 6)
    assert checks.adjusted_divergence(ServedCase(PROMPT, 6, s), tokens, OPENAI, 0.0) is None


# --------------------------------------------------------------------------- bodies, answers

def test_openai_body_sends_only_what_is_on():
    plain = OPENAI_DIALECT.body(Request(PROMPT, 4), "m")
    assert not {"logit_bias", "stop", "logprobs", "min_p", "repetition_penalty"} & set(plain)
    body = OPENAI_DIALECT.body(Request(PROMPT, 4, SamplingParams(
        min_p=0.1, logit_bias=((3, 2.0),), stop_strings=("ab",), logprobs=2)), "m")
    assert body["logit_bias"] == {"3": 2.0} and body["stop"] == ["ab"]
    assert body["logprobs"] == 2 and body["min_p"] == 0.1


def test_vllm_request_values_override_the_neutral_ones():
    body = vllm.DIALECT.body(Request(PROMPT, 4, SamplingParams(
        repetition_penalty=1.5, presence_penalty=0.2, frequency_penalty=0.1, min_p=0.05)), "m")
    assert (body["repetition_penalty"], body["presence_penalty"], body["frequency_penalty"],
            body["min_p"]) == (1.5, 0.2, 0.1, 0.05)
    assert vllm.DIALECT.body(Request(PROMPT, 4), "m")["repetition_penalty"] == 1.0


def test_llamacpp_body_names_the_chain_and_the_window():
    s = SamplingParams(temperature=1.0, repetition_penalty=1.5, min_p=0.1,
                       logit_bias=((3, 2.0),), stop_strings=("ab",), logprobs=0, stop_ids=(4,))
    body = llamacpp.DIALECT.body(Request(PROMPT, 4, s), "m")
    assert body["samplers"] == ["penalties", "temperature", "min_p", "top_k", "top_p"]
    assert body["repeat_penalty"] == 1.5 and body["repeat_last_n"] == llamacpp_engine.PENALTY_WINDOW
    assert body["logit_bias"] == [[3, 2.0]] and body["stop"] == ["e", "ab"]
    assert body["n_probs"] == 1 and body["min_p"] == 0.1
    plain = llamacpp.DIALECT.body(Request(PROMPT, 4), "m")
    assert plain["samplers"] == ["temperature", "top_k", "top_p"] and plain["repeat_last_n"] == 0


def test_transformers_generation_config_carries_penalty_min_p_and_bias():
    import json
    s = SamplingParams(temperature=1.0, repetition_penalty=1.5, min_p=0.1,
                       logit_bias=((3, 2.0),), stop_strings=("ab",))
    body = transformers.DIALECT.body(Request(PROMPT, 4, s), "m")
    config = json.loads(body["generation_config"])
    assert config["repetition_penalty"] == 1.5 and config["min_p"] == 0.1
    assert config["sequence_bias"] == [[[3], 2.0]] and body["stop"] == ["ab"]


def test_logprobs_are_read_from_both_shapes():
    openai = openai_logprobs({"tokens": ["d", "e"], "token_logprobs": [-0.5, -1.0],
                              "top_logprobs": [{"d": -0.5, "a": -1.5}, {"token_id:4": -1.0}]},
                             "here")
    assert openai == ((-0.5, ((3, -0.5), (0, -1.5))), (-1.0, ((4, -1.0),)))
    llama = llamacpp.llamacpp_logprobs([{"id": 3, "token": "d", "logprob": -0.5, "bytes": [100],
                                         "top_logprobs": [{"id": 3, "logprob": -0.5}]}], "here")
    assert llama == ((-0.5, ((3, -0.5),)),)
    assert openai_logprobs(None, "here") is None


# --------------------------------------------------------------------------- the checks

GREEDY_REP = ServedCase(PROMPT, 8, SamplingParams(repetition_penalty=1.6, presence_penalty=0.5))
LAW_REP = ServedCase(PROMPT, 2, SamplingParams(temperature=1.0, repetition_penalty=1.6, seed=3))
LAW_MIN_P = ServedCase((30, 1, 17, 8, 12), 2, SamplingParams(temperature=1.5, min_p=0.1, seed=4))
LAW_BIAS = ServedCase((30, 1, 17, 8, 12), 2, SamplingParams(
    temperature=0.5, logit_bias=((31, 1.0), (0, 1.5)), seed=5))
# the bias moves the argmax at position 4 (token 20 for 31), a speculated position
GREEDY_BIAS = ServedCase((30, 1, 17, 8, 12), 8, SamplingParams(logit_bias=((20, 3.0),)))
# the bias moves the second token's law by TV 0.40 (computed from the target)
LAW_BIAS_LATER = ServedCase((1, 2), 2, SamplingParams(temperature=1.0, logit_bias=((12, 3.0),),
                                                      seed=8))
LOGPROBS = ServedCase(PROMPT, 8, SamplingParams(logprobs=3))
STOP = ServedCase((0, 1, 2, 0, 1, 2, 0, 1), 12, SamplingParams(stop_strings=("Fty",)))
N = ServedCase((1, 2), 2, SamplingParams(temperature=1.0, top_k=3, seed=6))

EVERY = [(checks.check_greedy, GREEDY_REP), (checks.check_greedy, GREEDY_BIAS),
         (checks.check_law, LAW_REP),
         (checks.check_law, LAW_MIN_P), (checks.check_law, LAW_BIAS),
         (checks.check_law, LAW_BIAS_LATER),
         (checks.check_logprobs, LOGPROBS), (checks.check_stop_strings, STOP),
         (checks.check_n, N)]


def _impl(server, base, dialect=FAKE):
    """The fake as the `fake` engine (its dialect: the OpenAI formula, its counters); it
    drafts with the target ("perfect"), so every request of 2 or more tokens was speculated."""
    return make_impl("openai:" + server.url, dialect=dialect or engines.unknown_dialect(),
                     baseline=base.url if base is not None else None,
                     method=methods.by_option("perfect"))


def test_correct_fake_passes_every_check():
    with FakeServer() as fake, FakeServer() as base:
        impl = _impl(fake, base)
        for check, case in EVERY:
            check(impl, case)


@pytest.mark.parametrize("mutant, check, case, match", [
    (mutants.RejectedDraftInHistory, checks.check_greedy, GREEDY_REP, "argmax of the target"),
    (mutants.RejectedDraftInHistory, checks.check_law, LAW_REP, "not distributed"),
    (mutants.IgnoresMinP, checks.check_law, LAW_MIN_P, "exact probability 0"),
    (mutants.BiasAfterTemperature, checks.check_law, LAW_BIAS, "not distributed"),
    (mutants.BiasFirstTokenOnly, checks.check_greedy, GREEDY_BIAS, "argmax of the target"),
    (mutants.BiasFirstTokenOnly, checks.check_law, LAW_BIAS_LATER, "not distributed"),
    (mutants.DraftLogprobs, checks.check_logprobs, LOGPROBS, "log-softmax"),
    (mutants.StopStringLate, checks.check_stop_strings, STOP,
     r"completes at token 5 \(starts at \d+\), but the output has \d+ tokens \(past its end\)"),
    (mutants.SharedStreamN, checks.check_n, N, "not independent"),
], ids=lambda v: getattr(v, "__name__", None) if isinstance(v, type) or callable(v) else None)
def test_broken_server_fails_the_check_meant_for_it(mutant, check, case, match):
    with mutant() as fake, FakeServer() as base:
        with pytest.raises(PropertyFailure, match=match):
            check(_impl(fake, base), case)


class RefusesMinP(FakeServer):
    """Answers min_p as vLLM does under speculation: a 400 naming it."""

    def complete(self, body):
        if body.get("min_p"):
            return 400, {"error": {"message": "The min_p and logit_bias sampling parameters "
                                              "are not yet supported with speculative decoding."}}
        return super().complete(body)


class Fails500OnBias(FakeServer):
    def complete(self, body):
        if body.get("logit_bias"):
            return 500, {"error": "internal error"}
        return super().complete(body)


def test_a_refused_parameter_is_a_skip_naming_it():
    with RefusesMinP() as fake, FakeServer() as base:
        with pytest.raises(pytest.skip.Exception, match="not supported: fake refuses "
                                                        "min_p=0.1.*not yet supported"):
            checks.check_law(_impl(fake, base), LAW_MIN_P)


def test_a_5xx_is_a_failure_not_a_skip():
    with Fails500OnBias() as fake, FakeServer() as base:
        with pytest.raises(PropertyFailure, match="HTTP 500"):
            checks.check_law(_impl(fake, base), LAW_BIAS)


# --------------------------------------------------------------------------- no formula

def test_without_a_formula_the_law_is_judged_against_the_baseline():
    """An unknown OpenAI server: no formula, so two samples (speculating vs baseline)."""
    with FakeServer() as fake, FakeServer() as base:
        result = checks.check_law(_impl(fake, base, dialect=None), LAW_BIAS)
        assert result.passed and result.detectable > checks.DELTA_SERVED
    with mutants.BiasAfterTemperature() as fake, FakeServer() as base:
        with pytest.raises(PropertyFailure, match="not distributed as the baseline's"):
            checks.check_law(_impl(fake, base, dialect=None), LAW_BIAS)


def test_without_a_formula_or_a_baseline_nothing_is_judged():
    with FakeServer() as fake:
        with pytest.raises(pytest.skip.Exception, match="cannot judge: the kit knows no "
                                                        "formula of openai"):
            checks.check_greedy(_impl(fake, None, dialect=None), GREEDY_REP)


def test_an_engine_without_the_parameter_is_skipped_before_sending():
    with FakeServer() as fake:
        impl = _impl(fake, None, dialect=transformers.DIALECT)
        with pytest.raises(pytest.skip.Exception, match="transformers takes no presence"):
            checks.check_greedy(impl, GREEDY_REP)
        with pytest.raises(pytest.skip.Exception, match="one completion per request"):
            checks.check_n(impl, N)


def test_logprobs_judged_as_vllm_returns_them():
    """vLLM lists the sampled token beside the top k when it is not among them: still right;
    a list that skips a more probable token is not the top k."""
    from properties.adapters.protocol import Completion
    case = ServedCase(PROMPT, 1, SamplingParams(temperature=1.0, logprobs=2))
    row = torch.log_softmax(oracle.served_logits(PROMPT, [0])[0], -1)
    order = row.argsort(descending=True).tolist()
    low = order[-1]
    top = tuple((t, float(row[t])) for t in order[:2])
    right = Completion((low,), "length", logprobs=((float(row[low]), top + ((low, float(row[low])),)),))
    assert checks.logprob_problem(case, right) is None
    skipping = Completion((low,), "length", logprobs=(
        (float(row[low]), ((order[0], float(row[order[0]])), (order[2], float(row[order[2]])))),))
    assert "not the top 2" in checks.logprob_problem(case, skipping)
    off = Completion((low,), "length", logprobs=((float(row[low]) + 0.01, top),))
    assert "log-softmax there is" in checks.logprob_problem(case, off)


def test_a_baseline_mismatch_says_at_which_positions():
    # the same first-token marginal (500/500) in both samples; the second token given the first
    # reversed in the speculating one: off "in the tokens after the first only"
    from collections import Counter
    from properties.checks.served import where_off_two_sample
    base = Counter({(1, 1): 400, (1, 2): 100, (2, 1): 100, (2, 2): 400})
    later = Counter({(1, 1): 100, (1, 2): 400, (2, 1): 400, (2, 2): 100})
    assert where_off_two_sample(later, base).startswith("in the tokens after the first only")
    first = Counter({(1, 1): 720, (1, 2): 180, (2, 1): 20, (2, 2): 80})
    assert where_off_two_sample(first, base).startswith("in the first token only")
    assert where_off_two_sample(Counter({(1,): 5}), Counter({(2,): 5})) == ""
