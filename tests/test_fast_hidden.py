"""The target's residual states returned beside the logits by the fast forward (fast/forward.py
`states`), fused and eager: the reference's forward_hidden features, and the logits unchanged."""

import pytest
import torch

from fast import fused
from fast.runner import ModelRunner, padded_prompts
from fast.graphs import StepRunner
from fast.weights import model_weights
from reference.hidden import HiddenStates, forward_hidden
from reference.model import random_model

# states[i]: the stream after i of the 6 layers; 0 (embeddings), N (the final norm's input),
# repeats and any order
STATES = [(1, 3, 5), (0, 6), (6, 2, 2)]


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=5, dtype=torch.float64)


def runner(target, batch=2, capacity=32):
    return ModelRunner(model_weights(target), batch, capacity, StepRunner(False, "cpu"))


def reference_features(target, ids, states):
    hidden = HiddenStates(states, "input")
    logits, features = forward_hidden(target, torch.tensor([ids]),
                                      target.new_cache(1, len(ids)), hidden)
    return logits[0], features[0]


@pytest.mark.parametrize("fused_step", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("states", STATES)
def test_prefill_and_chain_return_the_references_states(target, states, fused_step):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]]
    block = torch.tensor([[8, 2, 8], [1, 8, 2]])
    with fused.enabled(fused_step):
        model = runner(target)
        padded, lengths = padded_prompts(prompts, "cpu")
        prefilled = model.prefill(padded, lengths, states)
        logits, chained = model.chain(block, lengths, 16, states=states)
        plain = runner(target)
        plain.prefill(padded, lengths)
        plain_logits = plain.chain(block, lengths, 16)
    assert torch.equal(logits, plain_logits)        # the states cost the logits nothing
    for b, prompt in enumerate(prompts):
        n = len(prompt) - 1
        seq = prompt[:n] + block[b].tolist()
        expected_logits, expected = reference_features(target, seq, states)
        torch.testing.assert_close(prefilled[b, :n], expected[:n], rtol=0, atol=1e-12)
        torch.testing.assert_close(chained[b], expected[n:], rtol=0, atol=1e-12)
        torch.testing.assert_close(logits[b], expected_logits[n:], rtol=0, atol=1e-12)


def test_a_prefill_of_one_token_prompts_has_no_states(target):
    model = runner(target)
    padded, lengths = padded_prompts([[4], [5]], "cpu")
    assert model.prefill(padded, lengths, (1, 2)).shape == (2, 0, 2 * 64)


@pytest.mark.parametrize("states", [(), (7,), (-1,), (1.0,), (True,)])
def test_bad_states_are_refused_by_name(target, states):
    model = runner(target)
    with pytest.raises(ValueError, match=r"states must be a non-empty sequence of residual-state "
                                         r"indices in \[0, 6\]"):
        model.chain(torch.tensor([[1], [2]]), torch.tensor([0, 0]), 4, states=states)
