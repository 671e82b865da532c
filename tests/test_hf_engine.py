"""The transformers adapter itself: model conversion, round bookkeeping, replay."""

import math

import pytest
import torch

from reference.model import EarlyExit, preset, random_model
from reference.speculative import greedy_generate

pytest.importorskip("transformers", reason="the transformers adapter needs the optional 'hf' extra")
hf_engine = pytest.importorskip("properties.hf_engine")

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def target():
    return random_model(preset("tiny", num_hidden_layers=3), seed=4, dtype=torch.float64)


def test_an_early_exit_draft_becomes_a_standalone_model_with_the_same_logits(target):
    draft = EarlyExit(target, 2)
    standalone = hf_engine._qwen3(draft)
    ids = torch.tensor([PROMPT])
    torch.testing.assert_close(standalone(ids, standalone.new_cache(1, 5)), draft(ids, draft.new_cache(1, 5)),
                               rtol=0, atol=0)


def test_a_perfect_draft_reports_transformers_own_rounds(target):
    tokens, stats = hf_engine.speculative_generate(target, target, PROMPT, 13, k=3)
    assert len(tokens) == 13
    assert stats["rounds"] == math.ceil(13 / 4) and stats["acceptance_rate"] == 1.0


def test_greedy_matches_the_float64_reference_on_this_model(target):
    # The float32 transformers model and the float64 reference agree here because no step of
    # this continuation is a near-tie; the kit's greedy property handles the general case.
    expected = greedy_generate(target, PROMPT, 12)
    assert hf_engine.target_greedy_generate(target, PROMPT, 12) == expected
    assert hf_engine.speculative_generate(target, EarlyExit(target, 1), PROMPT, 12, k=2)[0] == expected


def test_sampling_replays_from_the_kit_generator(target):
    runs = [hf_engine.speculative_generate(target, EarlyExit(target, 1), PROMPT, 6, k=2,
                                           temperature=0.8, generator=torch.Generator().manual_seed(9))
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_rule_adapter_replays_and_accepts_with_probability_p_over_q():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    results = [hf_engine.accept_or_correct(p, q, 2, torch.Generator().manual_seed(s)) for s in range(50)]
    assert results == [hf_engine.accept_or_correct(p, q, 2, torch.Generator().manual_seed(s))
                       for s in range(50)]
    # Every rejection of token 2 lands on token 0, the residual's only mass.
    assert all(token == (2 if ok else 0) for token, ok in results)
