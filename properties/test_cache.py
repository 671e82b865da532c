"""Family "cache": the engine keeps both caches holding exactly the committed sequence.

The properties and what they check: properties/checks/cache.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)
from properties import profiles
from properties.harness import temperatures
from properties.cases import EngineCase
from properties.models import (CacheViolation, DraftSpec, Qwen3Spec, TableSpec, Trace,
                               build_target)
from properties.strategies import greedy_cases, trained_cases
from properties.checks.cache import (KINDS, check_cache_invariant)
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("cache")


@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic()
@given(data=st.data())
def test_round_invariant(impl, kind, data):
    """Greedy and sampled runs, every draft kind, stop ids: the invariant at every round, no
    truncate that grows a cache, logits equal to a fresh prefill's."""
    case = data.draw(greedy_cases(kind, max_new=(1, 24)), label="case")
    temperature = data.draw(st.sampled_from(temperatures(impl, (0.0, 1.0, 0.7))), label="temperature")
    check_cache_invariant(impl, case.replace(temperature=temperature))


@pytest.mark.parametrize("kind", KINDS)
def test_full_blocks_and_rejections(impl, kind):
    """Fixed runs that exercise both rollbacks: whole blocks accepted (the draft must be fed
    its last proposal) and early rejections, over several rounds."""
    target = TableSpec(9, seed=21) if kind == "table" else Qwen3Spec(9, seed=21, layers=2)
    for variant in ("perfect", "noisy", "random", "negated"):
        for k in (1, 3):
            for temperature in temperatures(impl, (0.0, 1.0)):
                sampling = SamplingParams(temperature=temperature, seed=k)
                check_cache_invariant(impl, EngineCase(target, DraftSpec(variant, 3), (4, 1, 2),
                                                       12, k=k, sampling=sampling))


# --------------------------------------------------------------------------- the kit's caches

class CacheMachine(RuleBasedStateMachine):
    """Append token blocks, truncate, and compare with a fresh prefill at every step."""

    spec = None

    @initialize(capacity=st.integers(4, 24))
    def start(self, capacity):
        self.model = build_target(self.spec, Trace())
        self.cache = self.model.new_cache(1, capacity)
        self.capacity = capacity
        self.tokens: list[int] = []

    @precondition(lambda self: len(self.tokens) < self.capacity)
    @rule(data=st.data())
    def append(self, data):
        room = self.capacity - len(self.tokens)
        block = data.draw(st.lists(st.integers(0, self.spec.vocab - 1), min_size=1,
                                   max_size=min(room, 5)))
        logits = self.model(torch.tensor([block]), self.cache)
        self.tokens += block
        fresh = self.model.fresh_logits(self.tokens)[-len(block):]
        assert torch.allclose(logits[0].double(), fresh, atol=1e-9, rtol=0), \
            "cached logits differ from a fresh prefill"

    @rule(data=st.data())
    def truncate(self, data):
        n = data.draw(st.integers(0, len(self.tokens)))
        self.cache.truncate(n)
        self.tokens = self.tokens[:n]

    @rule(extra=st.integers(1, 3))
    def truncate_never_grows(self, extra):
        before = self.cache.length
        with pytest.raises((CacheViolation, ValueError)):
            self.cache.truncate(before + extra)
        assert self.cache.length == before

    @precondition(lambda self: len(self.tokens) > 0)
    @rule()
    def overflow_is_refused(self):
        room = self.capacity - len(self.tokens)
        before = self.cache.length
        with pytest.raises(ValueError):
            self.model(torch.zeros((1, room + 1), dtype=torch.long), self.cache)
        assert self.cache.length == before

    @invariant()
    def holds_what_was_written(self):
        if hasattr(self, "cache"):
            assert self.cache.length == len(self.tokens)
            assert self.cache.held() == self.tokens


@pytest.mark.parametrize("spec", [TableSpec(5, seed=1, sparsity=0.5), Qwen3Spec(6, seed=2, layers=2)],
                         ids=["table", "qwen3"])
@profiles.stateful(0.4)
def test_kit_cache_state_machine(impl, spec):
    """The kit's own caches (which the invariant checks rely on) behave like a KV cache."""
    machine = type(f"CacheMachine_{spec.kind}", (CacheMachine,), {"spec": spec})
    n = profiles.deterministic(0.4).max_examples
    run_state_machine_as_test(machine, settings=settings(max_examples=n, stateful_step_count=15,
                                                         deadline=None))


@pytest.mark.needs(kind="qwen3")
@profiles.deterministic(0.2)
@given(case=trained_cases(), data=st.data())
def test_round_invariant_trained(impl, case, data):
    """The trained pair: long accepted blocks, so truncates land deep inside the cache."""
    temperature = data.draw(st.sampled_from(temperatures(impl, (0.0, 1.0))), label="temperature")
    check_cache_invariant(impl, case.replace(temperature=temperature))
