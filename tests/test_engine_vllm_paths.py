"""vLLM's speculative paths of issue 40, without a server: each method's --speculative-config
carries its options, and the scripted drafts (the custom_class proposer vLLM imports) propose
what the script says."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from properties import acceptance, oracle, scripted
from properties.engines import get
from properties.engines import vllm as engine
from properties.engines.vllm_scripted import CLASSES, Right, RightThenWrong, Wrong
from properties.methods import Method, Scripted

PROMPT = (3, 9, 27, 3, 9, 27)


def config_of(name: str) -> dict:
    method = get("vllm").method(name)
    argv = engine.command(None, "/export", method, 8000).argv
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_each_method_carries_its_options():
    assert config_of("draft-early-exit") == {"model": "/export/draft-early-exit",
                                             "num_speculative_tokens": 4}
    assert config_of("draft-early-exit-probabilistic") == {
        "model": "/export/draft-early-exit", "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic"}
    assert config_of("draft-early-exit-block") == {
        "model": "/export/draft-early-exit", "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic", "rejection_sample_method": "block"}
    assert config_of("draft-early-exit-synthetic") == {
        "model": "/export/draft-early-exit", "num_speculative_tokens": 4,
        "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.8, 0.7, 0.6]}
    for name, cls in (("scripted-right", "Right"), ("scripted-wrong", "Wrong"),
                      ("scripted-right-then-wrong", "RightThenWrong")):
        assert config_of(name) == {"method": "custom_class", "num_speculative_tokens": 4,
                                   "model": f"properties.engines.vllm_scripted.{cls}"}


def test_the_objects_declare_what_the_checks_ask():
    methods = get("vllm").methods
    assert methods["draft-early-exit-probabilistic"].proposals == "sampled"
    assert methods["draft-early-exit-block"].verification == "block"
    assert "synthetic" in methods["draft-early-exit-synthetic"].lossy
    assert methods["draft-early-exit"].lossy is None
    for name in ("scripted-right", "scripted-wrong", "scripted-right-then-wrong"):
        assert methods[name].drafter.replays and not methods[name].drafter.perfect


def test_scripted_methods_put_the_repository_on_pythonpath():
    command = engine.command(None, "/export", get("vllm").method("scripted-right"), 8000)
    assert command.env["PYTHONPATH"] == str(engine.ROOT)
    assert (engine.ROOT / "properties" / "engines" / "vllm_scripted.py").exists()
    baseline = engine.command(None, "/export", None, 8000)
    assert "PYTHONPATH" not in baseline.env


def test_scripted_drafter_is_checked():
    with pytest.raises(ValueError, match="choose from"):
        Scripted("sometimes")
    with pytest.raises(ValueError, match="choose from"):
        scripted.next_logits([PROMPT], "sometimes")
    assert Scripted("wrong").model is None     # no served model: the drafter replays itself
    Method("m", "scripted", Scripted("wrong"), 4, lossy=None)


def greedy_after(context, n):
    return oracle.served_greedy(context, n)


def test_right_is_the_targets_greedy_continuation():
    assert scripted.propose("right", PROMPT, 4) == greedy_after(PROMPT, 4)


def test_wrong_is_never_the_targets_argmax():
    seq = PROMPT
    for x in scripted.propose("wrong", PROMPT, 4):
        assert x != greedy_after(seq, 1)[0]
        seq += (x,)


@pytest.mark.parametrize("extra", range(6))
def test_right_then_wrong_is_right_for_exactly_j(extra):
    context = PROMPT + tuple(greedy_after(PROMPT, extra))
    truth = greedy_after(context, 4)
    # j: the right proposals before the first sequence the hash marks wrong
    j = next((i for i in range(4) if scripted.wrong_after(context + tuple(truth[:i]))), 4)
    proposals = scripted.propose("right-then-wrong", context, 4)
    assert proposals[:j] == truth[:j]
    if j < 4:
        assert proposals[j] != truth[j]
    assert scripted.accepted_by_greedy("right-then-wrong", context, 4) == j


@pytest.mark.extra   # minutes of CPU: make test-extra; cheaper tests of it stay
def test_every_j_happens_in_the_rounds_of_one_greedy_request():
    """The rounds vLLM makes for one greedy request of 120 tokens (after the prefill token, each
    round drafts 4 and commits its accepted tokens and one more) reach every j (over 120 tokens)."""
    truth = greedy_after(PROMPT, 128)
    seen, committed = [], 1
    while committed < 120:
        j = scripted.accepted_by_greedy("right-then-wrong", PROMPT + tuple(truth[:committed]), 4)
        seen.append(j)
        committed += j + 1
    assert set(seen) == {0, 1, 2, 3, 4}


def test_scripts_are_one_hot_next_logits_for_the_oracle():
    logits = scripted.next_logits([PROMPT], "wrong")
    assert torch.equal(Scripted("wrong").round_logits(PROMPT[:-1], PROMPT[-1:]), logits[0])
    assert logits.shape == (1, 32) and logits.dtype == torch.float64
    assert int(torch.argmax(logits[0])) == scripted.propose("wrong", PROMPT, 1)[0]
    assert torch.softmax(logits[0], -1).max() == 1.0


@pytest.mark.parametrize("script,accepted", [("right", 4), ("wrong", 0)])
def test_the_greedy_replay_predicts_every_branch(script, accepted):
    # schedule "full": after the prefill token, each round drafts k = 4
    e = acceptance.greedy(PROMPT, 11, Scripted(script), 4, "full")
    if accepted == 4:
        assert e.accepted == e.drafted and e.drafted > 0
    else:
        assert e.accepted == 0 and e.drafts == 10


def test_the_proposer_class_vllm_imports():
    """What vLLM's custom_class calls: propose(sampled_token_ids, num_tokens_no_spec,
    token_ids_cpu) -> per request its proposals, none for a request with nothing sampled."""
    rows = np.zeros((3, 64), dtype=np.int32)
    rows[0, :6] = PROMPT
    rows[2, :7] = PROMPT + (5,)
    lengths = np.array([6, 0, 7])

    class Config:   # a VllmConfig's speculative_config
        class speculative_config:
            num_speculative_tokens = 4

    for cls in (Right, Wrong, RightThenWrong):
        out = cls(Config).propose([[27], [], [5]], lengths, rows)
        assert out == [scripted.propose(cls.script, PROMPT, 4), [],
                       scripted.propose(cls.script, PROMPT + (5,), 4)]
    assert set(CLASSES) == set(scripted.SCRIPTS)
