"""Every bad input gets a clear error naming the argument and the value: nothing is clamped."""

import pytest
import torch

from reference.cache import KVCache
from reference.model import EarlyExit, preset, random_model
from reference.sampling import probs_from_logits
from reference.speculative import (accept_or_correct, expected_speedup,
                                   expected_tokens_per_round, greedy_generate,
                                   speculative_generate)

NAN = float("nan")


@pytest.fixture(scope="module")
def target():
    return random_model(preset("tiny", num_hidden_layers=2), seed=0, dtype=torch.float64)


def dist(*values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("p, q, token, match", [
    (dist(0.5, NAN, 0.5), dist(0.2, 0.3, 0.5), 0, r"p has a non-finite entry nan at index \[1\]"),
    (dist(0.6, 0.3, 0.1), dist(0.7, -0.2, 0.5), 0, r"q has a negative entry -0.2 at index \[1\]"),
    (dist(0.6, 0.3, 0.3), dist(0.2, 0.3, 0.5), 0, r"p must sum to 1 .* sums to \[1.2"),
    (dist(0.6, 0.3, 0.1), dist(0.2, 0.3, 0.5), 3, r"token 3 is outside the vocabulary \[0, 3\)"),
    (dist(0.6, 0.3, 0.1), dist(0.5, 0.5, 0.0), 2, r"token 2 has probability 0 under q"),
    (dist(0.6, 0.4), dist(0.2, 0.3, 0.5), 0, r"same vocabulary, got \(2,\) and \(3,\)"),
])
def test_accept_or_correct_rejects_non_distributions(p, q, token, match):
    with pytest.raises(ValueError, match=match):
        accept_or_correct(p, q, token)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.5}, r"temperature must be >= 0 .* got -0.5"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\] .* got 0.0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\] .* got 1.5"),
    ({"top_k": -1}, r"top_k must be an int >= 0 .* got -1"),
])
def test_sampling_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        probs_from_logits(torch.zeros(4), **({"temperature": 1.0} | kwargs))


def test_logits_with_nan():
    with pytest.raises(ValueError, match=r"logits contains NaN at index \[2\]"):
        probs_from_logits(torch.tensor([0.0, 1.0, NAN]))


@pytest.mark.parametrize("kwargs, match", [
    ({"k": 0}, r"k must be an int >= 1, got 0"),
    ({"max_new_tokens": -1}, r"max_new_tokens must be an int >= 0, got -1"),
    ({"prompt_ids": []}, r"prompt_ids is empty"),
    ({"prompt_ids": [1, 256]}, r"token id 256, outside the vocabulary \[0, 256\)"),
    ({"prompt_ids": [-3]}, r"token id -3, outside the vocabulary"),
    ({"temperature": -1.0}, r"temperature must be >= 0 .* got -1.0"),
    ({"top_p": 2.0}, r"top_p must be in \(0, 1\] .* got 2.0"),
    ({"top_k": -2}, r"top_k must be an int >= 0 .* got -2"),
    ({"tree": True, "adaptive": True}, r"tree=True is tree verification .* adaptive=True"),
    ({"tree": (2, 0)}, r"tree branching must be a non-empty sequence of ints >= 1, got \(2, 0\)"),
])
def test_speculative_generate_arguments(target, kwargs, match):
    args = {"prompt_ids": [1, 2, 3], "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, target, **args)


def test_draft_and_target_with_different_vocabularies(target):
    draft = random_model(preset("tiny", num_hidden_layers=1, vocab_size=300), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"draft vocab_size=300, target vocab_size=256"):
        speculative_generate(target, draft, [1, 2], 4)


def test_model_rejects_token_ids_outside_the_vocabulary(target):
    with pytest.raises(ValueError, match=r"token id 999 in ids is outside the vocabulary \[0, 256\)"):
        target(torch.tensor([[1, 999]]), target.new_cache(1, 4))


def test_cache_truncate_beyond_length():
    cache = KVCache(1, 1, 1, 2, capacity=8)
    cache.advance(3)
    with pytest.raises(ValueError, match=r"truncate cache to n=5: it holds length=3"):
        cache.truncate(5)
    with pytest.raises(ValueError, match=r"n=-1"):
        cache.truncate(-1)


def test_cache_capacity_exceeded(target):
    cache = target.new_cache(1, 4)
    target(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match=r"writing 2 tokens at length 3 needs 5 > capacity 4"):
        target(torch.tensor([[4, 5]]), cache)
    assert cache.length == 3  # the failed write changed nothing


@pytest.mark.parametrize("call, match", [
    (lambda: expected_tokens_per_round(1.5, 4), r"alpha must be in \[0, 1\], got 1.5"),
    (lambda: expected_tokens_per_round(NAN, 4), r"alpha must be in \[0, 1\], got nan"),
    (lambda: expected_speedup(0.5, -1, 0.1), r"k must be an int >= 0, got -1"),
    (lambda: expected_speedup(0.5, 4, -0.1), r"c .* must be >= 0, got -0.1"),
    (lambda: EarlyExit(random_model(preset("tiny", num_hidden_layers=2)), 3),
     r"num_layers must be in \[1, 2\], got 3"),
    (lambda: preset("qwen3-9b"), r"unknown preset 'qwen3-9b'"),
])
def test_other_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- edges of the engine's API: values that cannot mean what they say ----------------------

@pytest.mark.parametrize("temperature, match", [
    (1e-320, r"temperature=1e-320 underflows: .* use temperature=0 for greedy"),
    (float("inf"), r"temperature must be finite, got inf"),
    (True, r"temperature must be >= 0 .* got True"),
])
def test_temperature_that_logits_cannot_be_divided_by(target, temperature, match):
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, target, [1, 2, 3], 4, temperature=temperature)
    with pytest.raises(ValueError, match=match):
        probs_from_logits(torch.zeros(4, dtype=torch.float64), temperature)


def test_temperature_too_small_for_float32_logits():
    # 1e-40 is a fine float64 but 1 / 1e-40 overflows float32: said, not turned into NaN.
    with pytest.raises(ValueError, match=r"temperature=1e-40 is too small for these "
                                         r"torch.float32 logits: .* overflows at index \[1\]"):
        probs_from_logits(torch.tensor([0.0, 1.0]), 1e-40)
    # a tiny temperature that does not overflow is just a very sharp softmax
    probs = probs_from_logits(torch.tensor([0.0, 1.0], dtype=torch.float64), 1e-300)
    assert probs.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"prompt_ids": [[1, 2], [3, 4]]}, ValueError,
     r"prompt_ids must be one sequence of token ids \(\[T\] or \[1, T\]\), got shape \(2, 2\)"),
    ({"prompt_ids": torch.tensor([[1, 2], [3, 4]])}, ValueError, r"got shape \(2, 2\)"),
    ({"prompt_ids": [[1, 2], [3]]}, ValueError, r"prompt_ids must be a sequence of token ids"),
    ({"prompt_ids": 5}, ValueError, r"prompt_ids must be one sequence .* got shape \(\): 5"),
    ({"stop_ids": 5}, TypeError,
     r"stop_ids must be a collection of token ids, got 5 \(int\); write \(5,\)"),
    ({"stop_ids": "5"}, TypeError, r"stop_ids must be a collection of token ids, got '5' \(str\)"),
    ({"stop_ids": None}, TypeError, r"stop_ids must be a collection of token ids, got None"),
    ({"stop_ids": [2.7]}, TypeError, r"stop_ids must hold int token ids, got 2.7 \(float\)"),
])
def test_prompt_and_stop_ids_are_not_reshaped_or_cast(target, kwargs, error, match):
    args = {"prompt_ids": [1, 2, 3], "max_new_tokens": 4} | kwargs
    with pytest.raises(error, match=match):
        speculative_generate(target, target, **args)
    with pytest.raises(error, match=match):
        greedy_generate(target, args["prompt_ids"], 4, stop_ids=args.get("stop_ids", ()))


def test_a_batch_of_one_prompt_and_tensor_stop_ids_are_accepted(target):
    expected = speculative_generate(target, target, [1, 2, 3], 6, stop_ids=(7,))
    assert speculative_generate(target, target, [[1, 2, 3]], 6, stop_ids=(7,)) == expected
    assert speculative_generate(target, target, torch.tensor([[1, 2, 3]]), 6,
                                stop_ids=torch.tensor([7])) == expected
