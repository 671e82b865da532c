"""Batched greedy speculation: every row equals its solo target greedy run."""

import types

import pytest
import torch

import fast
from fast.testing import target_greedy
from reference.model import EarlyExit, random_model


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=21, dtype=torch.float64)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 2, 7, 13, 4, 9, 3, 21)]


@pytest.fixture(scope="module")
def truth(target, prompts):
    """Solo greedy continuation of each prompt, long enough for every test here."""
    return [target_greedy(target, p, 24) for p in prompts]


@pytest.mark.parametrize("k", range(1, 9))
def test_ragged_rows_equal_solo_greedy(target, prompts, truth, k):
    budgets = [24, 5, 17, 0, 11, 24, 1, 8]
    outputs, stats = fast.batched_generate(target, EarlyExit(target, 2), prompts, budgets, k=k)
    for out, expected, n in zip(outputs, truth, budgets):
        assert out == expected[:n]
    assert stats["host_syncs"] == stats["rounds"]
    assert stats["rounds"] >= max(-(-n // (k + 1)) for n in budgets)
    # rows accepted different numbers of tokens: a row's rounds depend on its own acceptance
    assert len({row["rounds"] for row in stats["per_row"]}) > 2


def test_stop_ids_mid_block_end_each_row_at_its_first_stop(target, prompts, truth):
    # Stop ids that occur inside the continuations at different depths.
    stops = {truth[0][6], truth[2][3], truth[5][10]}

    def cut(tokens):
        for i, t in enumerate(tokens):
            if t in stops:
                return tokens[:i + 1]
        return tokens

    outputs, _ = fast.batched_generate(target, target, prompts, 24, k=5, stop_ids=sorted(stops))
    for out, expected in zip(outputs, truth):
        assert out == cut(expected)


def test_perfect_draft_accepts_everything(target, prompts):
    out, stats = fast.speculative_generate(target, target, prompts[3], 23, k=4)
    assert stats["acceptance_rate"] == 1.0
    assert stats["rounds"] == 5 and len(out) == 23   # 5 + 5 + 5 + 5 + 3


def test_single_row_api_and_wrapped_models(target, prompts, truth):
    wrapped = types.SimpleNamespace(module=types.SimpleNamespace(module=target))
    draft = types.SimpleNamespace(module=EarlyExit(target, 3))
    out, stats = fast.speculative_generate(wrapped, draft, prompts[2], 20, k=3)
    assert out == truth[2][:20]
    assert stats["tokens_per_target_call"] == pytest.approx(20 / stats["rounds"])
    assert 0 <= stats["acceptance_rate"] <= 1


def test_one_host_sync_per_round(target, prompts, monkeypatch):
    """Count every way the round loop could read a device value on the host."""
    calls = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    outputs, stats = fast.batched_generate(target, EarlyExit(target, 2), prompts[:5], 16, k=4,
                                           temperature=0.8, top_k=20,
                                           generator=torch.Generator().manual_seed(0))
    monkeypatch.undo()
    # One read per round; after the loop four more (outputs, lengths, two per-row counters).
    assert stats["host_syncs"] == stats["rounds"] > 1
    assert calls == ["tolist"] * (stats["rounds"] + 4)


def test_max_new_tokens_zero_everywhere(target, prompts):
    outputs, stats = fast.batched_generate(target, target, prompts[:3], 0)
    assert outputs == [[], [], []] and stats["rounds"] == 0
