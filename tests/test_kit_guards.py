"""The guards around every call into an implementation (properties/guards.py, harness.invoke),
in process: what each one catches, and what it must let through."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from properties import guards
from properties.cases import EngineCase
from properties.guards import EngineFault
from properties.harness import invoke, run_engine, tokens_and_stats
from properties.impl import Impl
from properties.models import DraftSpec, Qwen3Spec, build_pair, qwen3_module


def impl_of(**functions) -> Impl:
    impl = Impl("test", "functions defined in the test")
    impl.functions.update(functions)
    return impl


def test_a_seed_inside_fork_rng_is_not_a_reseed():
    def contained(generator=None):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            return torch.rand(1).item()

    torch.manual_seed(7)
    invoke(impl_of(f=contained), "f")
    assert torch.initial_seed() == 7


@pytest.mark.parametrize("reseed", [lambda: torch.manual_seed(0), lambda: random.seed(0),
                                    lambda: np.random.seed(0)])
def test_a_global_reseed_is_reported(reseed):
    with pytest.raises(EngineFault, match="reseeded the global RNG"):
        invoke(impl_of(f=reseed), "f")


def test_drawing_from_the_global_rng_without_reseeding_is_allowed():
    invoke(impl_of(f=lambda: torch.rand(3)), "f")


def test_weight_edits_are_reported_by_name_and_the_models_rebuilt():
    spec = Qwen3Spec(6, seed=31, layers=1)
    target, draft = build_pair(spec, DraftSpec("random", 1))
    pristine = qwen3_module(spec).lm_head.weight.clone()

    def clamps(target):
        with torch.no_grad():
            target.module.lm_head.weight.clamp_(-0.01, 0.01)

    with pytest.raises(EngineFault, match="modified the weights.*target: lm_head.weight"):
        invoke(impl_of(f=clamps), "f", target, models=(("target", target), ("draft", draft)))
    assert torch.equal(qwen3_module(spec).lm_head.weight, pristine), "the kit kept edited weights"


def test_mutated_inputs_are_reported():
    prompt = [1, 2, 3]
    with pytest.raises(EngineFault, match=r"mutated prompt_ids in place: it was \[1, 2, 3\]"):
        invoke(impl_of(f=lambda p: p.append(9)), "f", prompt, inputs=(("prompt_ids", prompt),))


def test_a_hang_is_stopped_by_the_time_limit():
    before = guards.TIMEOUT
    guards.set_timeout(0.2)
    try:
        started = time.monotonic()
        with pytest.raises(EngineFault, match="time limit of 0.2 s"):
            invoke(impl_of(f=lambda: time.sleep(30)), "f")
        assert time.monotonic() - started < 10
    finally:
        guards.set_timeout(before)


def test_sys_exit_inside_the_engine_is_a_failure_not_the_end():
    def leaves():
        raise SystemExit(3)

    with pytest.raises(EngineFault, match=r"called sys.exit\(3\)"):
        invoke(impl_of(f=leaves), "f")


def test_an_engine_exception_shows_the_engines_own_frames():
    def engine_step():
        return [][1]

    with pytest.raises(EngineFault) as info:
        invoke(impl_of(f=lambda: engine_step()), "f")
    text = info.value.describe()
    assert "the engine raised IndexError" in text and "test_kit_guards.py" in text
    assert "in engine_step" in text and "harness.py" not in text


@pytest.mark.parametrize("value,said", [
    ([1, 2, 3], "tokens only"),
    (torch.tensor([1, 2]), "tokens only"),
    (([1], {}, 3), "3-tuple"),
    ((["a"], {}), "not token ids"),
])
def test_a_wrong_return_is_described(value, said):
    with pytest.raises(EngineFault, match=said) as info:
        tokens_and_stats(impl_of(), "speculative_generate", value)
    assert "(tokens, stats)" in info.value.describe()


def test_a_cache_kept_from_an_earlier_call_is_reported():
    kept = {}

    def engine(target, draft, prompt_ids, max_new_tokens, **kwargs):
        if "cache" in kept:
            kept["cache"].truncate(0)
        kept["cache"] = target.new_cache(1, 8)
        return [], {"rounds": 0, "acceptance_rate": 0.0, "tokens_per_target_call": 0.0}

    impl = impl_of(speculative_generate=engine)
    case = EngineCase(Qwen3Spec(5, seed=2), DraftSpec("random", 1), (1, 2), 0)
    first = run_engine(impl, case)
    assert first.error is None
    second = run_engine(impl, case)
    assert second.error is not None and "a cache from an earlier call" in second.describe_error()


def test_a_replaced_parameter_is_reported_and_the_models_rebuilt():
    """Not an in-place edit: the engine swaps a parameter of the kit's model for a new tensor
    (which comparing the remembered tensors with their copies would not see)."""
    spec = Qwen3Spec(5, seed=41)
    target, draft = build_pair(spec, DraftSpec("random", 1))
    pristine = qwen3_module(spec).lm_head.weight.clone()

    def swaps(target):
        target.module.lm_head.weight = torch.nn.Parameter(torch.zeros_like(pristine))

    with pytest.raises(EngineFault, match=r"modified the weights.*target: lm_head.weight \(replaced\)"):
        invoke(impl_of(f=swaps), "f", target, models=(("target", target), ("draft", draft)))
    assert torch.equal(qwen3_module(spec).lm_head.weight, pristine), "the kit kept the swapped weight"
