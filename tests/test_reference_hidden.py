"""The hidden-state convention (reference/hidden.py) and Qwen3.forward_hidden: the states a head
reads are the ones the convention names, and reading them changes nothing of the target's."""

import pytest
import torch

from reference.hidden import HiddenStates, forward_hidden, last_layer
from reference.model import EarlyExit
from tests.heads_by_hand import blocks_one_by_one, small_target, target_features

SEQ = [5, 17, 3, 3, 60, 1, 42, 9, 9]


@pytest.fixture(scope="module")
def target():
    return small_target()


def fresh_forward_hidden(target, seq, hidden):
    return target.forward_hidden(torch.tensor([seq]), target.new_cache(1, len(seq)), hidden)


@pytest.mark.parametrize("hidden", [
    HiddenStates((3,)), HiddenStates((3,), normed=True), HiddenStates((0,), "input"),
    HiddenStates((4,), "input"), HiddenStates((1, 2, 3), "input"),
    HiddenStates((2, 0), "output", normed=True)])
def test_features_are_the_named_states_computed_block_by_block(target, hidden):
    logits, features = fresh_forward_hidden(target, SEQ, hidden)
    assert features.shape == (1, len(SEQ), hidden.width(target.config.hidden_size))
    torch.testing.assert_close(features[0], target_features(target, SEQ, hidden), rtol=0,
                               atol=1e-12)


def test_forward_hidden_changes_nothing_of_forward(target):
    """The logits bit for bit, and the cache (keys, values, length) the same."""
    ids = torch.tensor([SEQ])
    c1, c2 = target.new_cache(1, 16), target.new_cache(1, 16)
    plain = target(ids, c1)
    logits, _ = target.forward_hidden(ids, c2, HiddenStates((1, 3), "input"))
    assert torch.equal(plain, logits)
    assert c1.length == c2.length == len(SEQ)
    assert all(torch.equal(a, b) for a, b in zip(c1.keys + c1.values, c2.keys + c2.values))


def test_the_conventions_name_the_same_tensors_where_they_should(target):
    """input of layer l + 1 == output of layer l; input of layer 0 == the embeddings; the
    output of the last layer, normed and read by the lm_head, gives the target's logits; the
    output of layer l read the same way gives the early exit after l + 1 layers."""
    def features(hidden):
        return fresh_forward_hidden(target, SEQ, hidden)[1][0]
    for l in range(3):
        assert torch.equal(features(HiddenStates((l + 1,), "input")),
                           features(HiddenStates((l,), "output")))
    assert torch.equal(features(HiddenStates((0,), "input")),
                       target.model.embed_tokens(torch.tensor(SEQ)))
    ids = torch.tensor([SEQ])
    full = target(ids, target.new_cache(1, 16))[0]
    torch.testing.assert_close(target.lm_head(features(last_layer(4, normed=True))), full,
                               rtol=0, atol=1e-12)
    for l in range(4):
        exit_logits = EarlyExit(target, l + 1)(ids, EarlyExit(target, l + 1).new_cache(1, 16))[0]
        read = target.lm_head(target.model.norm(features(HiddenStates((l,)))))
        torch.testing.assert_close(read, exit_logits, rtol=0, atol=1e-12)


def test_incremental_forwards_give_the_one_shot_features(target):
    """A prefill then verify blocks (as speculative_generate runs the target) give, row for
    row, the features of one forward over the whole sequence."""
    hidden = HiddenStates((0, 2, 3), "output", normed=True)
    whole = fresh_forward_hidden(target, SEQ, hidden)[1][0]
    cache = target.new_cache(1, 16)
    parts = [target.forward_hidden(torch.tensor([chunk]), cache, hidden)[1][0]
             for chunk in (SEQ[:4], SEQ[4:5], SEQ[5:])]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=1e-12)


def test_the_blocks_one_by_one_are_the_targets_forward(target):
    """The hand computation itself: its last state, normed and read, is forward's logits."""
    states = blocks_one_by_one(target, SEQ)
    assert len(states) == 5
    torch.testing.assert_close(target.lm_head(target.model.norm(states[-1])),
                               target(torch.tensor([SEQ]), target.new_cache(1, 16))[0],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=()), "non-empty tuple"), (dict(layers=(-1,)), "ints >= 0"),
    (dict(layers=(1.0,)), "ints >= 0"), (dict(layers=3), "non-empty tuple"),
    (dict(layers=(1,), where="middle"), "where must be one of"),
    (dict(layers=(1,), normed="yes"), "normed must be a bool")])
def test_bad_conventions_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HiddenStates(**kwargs)


@pytest.mark.parametrize("hidden, message", [
    (HiddenStates((4,)), r"layer 4 is past the target's 4 layers \(at most 3 with where='output'\)"),
    (HiddenStates((5,), "input"), r"layer 5 is past the target's 4 layers \(at most 4")])
def test_a_layer_the_target_lacks_is_refused(target, hidden, message):
    with pytest.raises(ValueError, match=message):
        fresh_forward_hidden(target, SEQ, hidden)


def test_a_target_without_forward_hidden_is_refused(target):
    with pytest.raises(ValueError, match="EarlyExit has no forward_hidden"):
        forward_hidden(EarlyExit(target, 2), torch.tensor([SEQ]), target.new_cache(1, 16),
                       HiddenStates((1,)))
