"""Heads saved, loaded and trained (reference/heads/checkpoint.py, reference/train_heads.py), and
the committed EAGLE-3 head of the trained target (reference/trained/eagle3, make models-heads)."""

import json
from dataclasses import replace

import pytest
import torch

from fast.testing import one_thread
from reference.heads.checkpoint import load_head, save_head
from reference.heads.random import random_head
from reference.heads.replay import round_logits
from reference.model import random_model
from reference.pretrained import TRAINED_DIR
from reference.speculative import greedy_generate, speculative_generate
from reference.train_heads import HeadRecipe, pass_logits, pass_mask, train_head
from tests.heads_by_hand import SMALL, committed_entry, small_target

KINDS = [("eagle", {}), ("eagle3", {}), ("eagle3", {"draft_vocab": [5, 3, 1, 60]}),
         ("medusa", {"num_heads": 3}), ("mtp", {"order": "hidden-first", "recycle": "normed"})]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.mark.parametrize("kind, options", KINDS)
def test_a_saved_head_loads_as_it_was(target, kind, options, tmp_path):
    head = random_head(kind, target, seed=1, **options)
    save_head(head, tmp_path)
    loaded = load_head(tmp_path, target)
    assert loaded.hidden == head.hidden and type(loaded) is type(head)
    saved, back = head.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys()
    assert all(torch.equal(saved[name], back[name]) for name in saved)
    prompt = [4, 8, 15, 16, 23, 42]
    assert speculative_generate(target, loaded, prompt, 12, k=3) == \
        speculative_generate(target, head, prompt, 12, k=3)


def test_loading_refuses_another_target_and_another_kind(target, tmp_path):
    save_head(random_head("eagle3", target), tmp_path)
    with pytest.raises(ValueError, match="was made for a target of config"):
        load_head(tmp_path, random_model(replace(SMALL, num_hidden_layers=5)))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"kind": "hydra"}))
    with pytest.raises(ValueError, match="kind='hydra', expected one of"):
        load_head(tmp_path, target)
    with pytest.raises(TypeError, match="save_head needs a reference head"):
        save_head(target, tmp_path)


def test_the_training_passes_attend_as_a_rounds_steps_do():
    """pass_mask by hand: pass t's query at i sees the verified pairs j <= i - t + 1 and its
    own pairs of passes 2 .. t at i - t + 2 .. i."""
    assert pass_mask(3, 1).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert pass_mask(3, 2).int().tolist() == [[0, 0, 0, 1, 0, 0],
                                              [1, 0, 0, 0, 1, 0],
                                              [1, 1, 0, 0, 0, 1]]
    assert pass_mask(4, 3)[3].int().tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]


def test_each_training_pass_is_the_heads_step_in_a_round(target):
    """Training-time test: pass t at position i computes exactly the law the proposer's
    step t gives in the round whose newest token is at n = i - t + 2 (its earlier proposals
    being the text's tokens), replayed through the head's own forward and cache."""
    head = random_head("eagle3", target, seed=4)
    seq = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32]
    ids = torch.tensor([seq])
    _, features = target.forward_hidden(ids, target.new_cache(1, len(seq)), head.hidden)
    passes = pass_logits(head, features, ids, 3)
    for t, logits in enumerate(passes, start=1):
        for i in range(t - 1, len(seq) - 1):
            replayed = round_logits(head, features[0], seq, i - t + 2, t)[t - 1]
            torch.testing.assert_close(logits[0, i], replayed, rtol=0, atol=1e-10)


def test_a_short_training_run_lowers_the_kl():
    recipe = HeadRecipe(steps=40, batch=4, seq_len=24, warmup=5, lr=1e-2)
    ids = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(0))
    head, history = train_head(small_target(seed=5).float(), ids, recipe, log=None)
    first, last = history[0], [sum(h[t] for h in history[-5:]) / 5 for t in range(3)]
    assert all(l < 0.8 * f for f, l in zip(first, last)), (first, last)
    assert not head.embed_tokens.weight.requires_grad


# --- the committed head ----------------------------------------------------------------------

HEAD_DIR = TRAINED_DIR / "eagle3"
needs_head = pytest.mark.skipif(not (HEAD_DIR / "model.safetensors").is_file(),
                                reason="no trained EAGLE-3 head (make models-heads)")


@pytest.fixture(scope="module")
def trained():
    from reference.pretrained import load
    pair = load()
    return pair, pair.head("eagle3")


@needs_head
def test_the_committed_head_is_in_the_manifest():
    committed_entry("eagle3")


@needs_head
def test_the_committed_head_drafts_the_targets_greedy_output(trained):
    pair, head = trained
    for prompt in pair.prompts()[:2]:
        tokens, stats = speculative_generate(pair.target, head, prompt, 24, k=4)
        assert tokens == greedy_generate(pair.target, prompt, 24)
        assert stats["acceptance_rate"] > 0.3   # a trained head, not a random one (~0)
