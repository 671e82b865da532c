"""Bad input to the fast engine: a ValueError naming the argument and the value, before any
work is done."""

import re

import pytest
import torch

import fast
from fast.engine import FastEngine
from fast.oracle import OracleDrafter
from reference.model import EarlyExit, preset, random_model
from reference.sampling import SamplingParams


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=51)


@pytest.fixture(scope="module")
def draft(target):
    return EarlyExit(target, 2)


def raises(*words):
    """pytest.raises(ValueError) whose message holds every word (argument name and value)."""
    return pytest.raises(ValueError, match=".*".join(re.escape(w) for w in words))


def test_mismatched_batch_sizes(target, draft):
    with raises("max_new_tokens", "3 entries", "2 prompts"):
        fast.batched_generate(target, draft, [[1], [2]], [4, 4, 4])
    engine = FastEngine(target, draft, max_batch=2, max_cache_len=32)
    with raises("prompts", "3 rows", "max_batch=2"):
        engine.generate([[1], [2], [3]], 4)


def test_prompt_longer_than_the_cache(target, draft):
    engine = FastEngine(target, draft, max_batch=2, max_cache_len=16)
    with raises("prompts[1]", "20 tokens", "max_cache_len=16"):
        engine.generate([[1, 2], [3] * 20], 4)
    with raises("max_new_tokens=40", "prompts[0]", "max_cache_len=16"):
        engine.generate([[1, 2]], 40)
    with raises("prompts[0]", "5000 tokens", "max_position_embeddings=4096"):
        fast.batched_generate(target, draft, [[1] * 5000], 4)


def test_k_larger_than_the_engine_allows(target, draft):
    engine = FastEngine(target, draft, max_batch=1, max_cache_len=64, max_k=4)
    with raises("k=6", "max_k=4"):
        engine.generate([[1, 2]], 4, k=6)
    with raises("k=12", "max_cache_len=16"):
        FastEngine(target, draft, max_batch=1, max_cache_len=16, max_k=16).generate([[1] * 8], 1, k=12)
    for bad in (0, -1, 2.0, True):
        with raises("k", repr(bad)):
            fast.batched_generate(target, draft, [[1]], 4, k=bad)


def test_tree_shape(target, draft):
    with raises("tree=(8, 8, 8)", "does not fit", "max_cache_len=64"):
        generate = fast.tree.generate_tree
        generate(FastEngine(target, draft, max_batch=1, max_cache_len=64), [[1, 2]], 4, (8, 8, 8))
    for bad in ((), (2, 0), (2, "x"), 3, (2, 300)):
        with raises("tree", repr(bad) if not isinstance(bad, tuple) or not bad else ""):
            fast.tree_generate(target, draft, [1, 2], 4, tree=bad)
    with raises("draft", "OracleDrafter"):
        fast.tree_generate(target, OracleDrafter(torch.zeros(1, 8, dtype=torch.long), 0.5, 256),
                           [1], 4)


def test_prompts_and_tokens(target, draft):
    with raises("prompts", "[]"):
        fast.batched_generate(target, draft, [], 4)
    with raises("prompts[1]", "empty prompt"):
        fast.batched_generate(target, draft, [[1], []], 4)
    with raises("prompts[0]", "token id 256", "[0, 256)"):
        fast.batched_generate(target, draft, [[1, 256]], 4)
    with raises("prompt_ids", "-3"):
        fast.speculative_generate(target, draft, [-3], 4)
    with raises("stop_ids", "999"):
        fast.batched_generate(target, draft, [[1]], 4, stop_ids=[999])
    with raises("max_new_tokens", "-1"):
        fast.batched_generate(target, draft, [[1]], [-1])


def test_sampling_arguments(target, draft):
    with raises("temperature", "-1"):
        fast.batched_generate(target, draft, [[1]], 4, temperature=-1.0)
    with raises("top_k", "-2"):
        fast.batched_generate(target, draft, [[1]], 4, temperature=1.0, top_k=-2)
    with raises("top_p", "1.5"):
        fast.batched_generate(target, draft, [[1]], 4, temperature=1.0, top_p=1.5)
    with raises("generator", "42"):
        fast.batched_generate(target, draft, [[1]], 4, generator=42)
    with raises("cuda_graphs", "'yes'"):
        fast.batched_generate(target, draft, [[1]], 4, cuda_graphs="yes")


def test_sampling_params(target, draft):
    """sampling=SamplingParams(...) supplies temperature / top_k / top_p / stop_ids: the same
    output as the keywords; a keyword that disagrees with it is an error naming both."""
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, stop_ids=(7,))
    by_keywords, _ = fast.batched_generate(target, draft, [[1, 2], [3]], 6, temperature=0.8,
                                           top_k=5, top_p=0.9, stop_ids=(7,),
                                           generator=torch.Generator().manual_seed(3))
    by_params, _ = fast.batched_generate(target, draft, [[1, 2], [3]], 6, sampling=params,
                                         generator=torch.Generator().manual_seed(3))
    assert by_params == by_keywords
    greedy, _ = fast.tree_generate(target, draft, [1, 2], 6, tree=(2,), sampling=SamplingParams())
    assert greedy == fast.tree_generate(target, draft, [1, 2], 6, tree=(2,))[0]
    with raises("temperature=1.0", "sampling.temperature=0.8"):
        fast.batched_generate(target, draft, [[1]], 4, temperature=1.0, sampling=params)
    with raises("stop_ids=(3,)", "sampling.stop_ids=(7,)"):
        fast.tree_generate(target, draft, [1], 4, stop_ids=[3], sampling=params)
    with raises("sampling", "dict"):
        fast.batched_generate(target, draft, [[1]], 4, sampling={"temperature": 0.8})


def test_models(target):
    with raises("target", "Qwen3-family", "str"):
        fast.batched_generate("not a model", target, [[1]], 4)
    other = random_model(preset("tiny", vocab_size=300), seed=1)
    with raises("draft", "vocab_size=300", "vocab_size=256"):
        fast.batched_generate(target, other, [[1]], 4)


def test_rule_level(target):
    p = torch.tensor([0.5, 0.5, 0.0])
    with raises("token", "3"):
        fast.accept_or_correct(p, p, 3)
    with raises("token 2", "probability 0 under q"):
        fast.accept_or_correct(p, p, 2)
    with raises("p", "sum to 1"):
        fast.accept_or_correct(torch.tensor([0.5, 0.2, 0.0]), p, 0)
    with raises("p and q", "(3,)", "(2,)"):
        fast.accept_or_correct(p, torch.tensor([0.5, 0.5]), 0)
