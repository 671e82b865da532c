"""The kit's instruments: its models, its oracle, and what its cache analysis reports."""

from __future__ import annotations

import pytest
import torch

from properties import oracle
from properties.cases import EngineCase, PairSpec
from properties.harness import PropertyFailure, run_engine
from properties.impl import load
from properties.invariants import analyse
from properties.models import (CacheViolation, DraftSpec, Qwen3Spec, TableSpec, Trace, build_pair,
                               build_target)
from properties.checks.cache import check_cache_invariant

SPECS = [TableSpec(6, seed=1), TableSpec(6, seed=2, sparsity=0.5), Qwen3Spec(6, seed=3, layers=2)]


@pytest.mark.parametrize("spec", SPECS, ids=["table", "sparse-table", "qwen3"])
def test_greedy_oracle_matches_plain_greedy_decoding(spec):
    from reference.speculative import greedy_generate
    prompt = [1, 2, 3]
    expected, _ = oracle.greedy(spec, prompt, 12)
    assert greedy_generate(build_target(spec), prompt, 12) == expected


@pytest.mark.parametrize("spec", SPECS, ids=["table", "sparse-table", "qwen3"])
def test_sequence_law_is_a_distribution_consistent_with_the_model(spec):
    law = oracle.sequence_law(spec, (0, 1), 2, 0.7, top_k=3, top_p=0.9, stop_ids=(2,))
    assert abs(sum(law.values()) - 1) < 1e-12
    assert all(len(o) == 2 or o[-1] == 2 for o in law)
    model = build_target(spec)
    from reference.sampling import probs_from_logits
    first = probs_from_logits(model.next_logits([0, 1]), 0.7, 3, 0.9)
    for token in range(spec.vocab):
        mass = sum(pr for o, pr in law.items() if o[0] == token)
        assert abs(mass - float(first[token])) < 1e-12


@pytest.mark.parametrize("spec", SPECS, ids=["table", "sparse-table", "qwen3"])
def test_cached_calls_equal_fresh_prefill(spec):
    trace = Trace(check_logits=True)
    model = build_target(spec, trace)
    cache = model.new_cache(1, 12)
    model(torch.tensor([[1, 2, 3]]), cache)
    model(torch.tensor([[4, 0]]), cache)
    cache.truncate(2)
    model(torch.tensor([[5]]), cache)
    assert cache.held() == [1, 2, 5]
    assert not trace.violations
    with pytest.raises(CacheViolation):
        cache.truncate(4)
    with pytest.raises(CacheViolation):
        model(torch.tensor([[1]]), build_target(spec, Trace()).new_cache(1, 4))


def test_a_heads_forward_is_traced_and_checked_as_any_call():
    """Qwen3KitModel.forward_hidden (what a feature-level head's engine asks of the target):
    the module's logits and features, recorded as a call, its cache checked against a fresh
    prefill, and a stale cache refused as in a plain call."""
    from reference.hidden import HiddenStates
    spec, hidden = Qwen3Spec(6, seed=3, layers=2), HiddenStates((0, 2), "input")
    trace = Trace(check_logits=True)
    model = build_target(spec, trace)
    cache = model.new_cache(1, 12)
    logits, features = model.forward_hidden(torch.tensor([[1, 2, 3]]), cache, hidden)
    plain = model.module.new_cache(1, 12)
    expected, expected_features = model.module.forward_hidden(torch.tensor([[1, 2, 3]]), plain,
                                                              hidden)
    assert torch.equal(logits, expected) and torch.equal(features, expected_features)
    model.forward_hidden(torch.tensor([[4]]), cache, hidden)
    assert cache.held() == [1, 2, 3, 4] and not trace.violations
    assert [e.tokens for e in trace.events if e.what == "call"] == [(1, 2, 3), (4,)]
    with pytest.raises(CacheViolation):
        model.forward_hidden(torch.tensor([[1]]), build_target(spec, Trace()).new_cache(1, 4),
                             hidden)


def test_table_drafts_relate_to_their_target_as_documented():
    spec = TableSpec(9, seed=4)
    target, _ = build_pair(spec, DraftSpec("perfect"))
    prefix = [3, 1, 4, 1, 5]
    t = target.next_logits(prefix)
    for variant, relation in [("perfect", lambda d: torch.equal(d, t)),
                              ("negated", lambda d: torch.equal(d, -t)),
                              ("lagged", lambda d: torch.equal(d, target.next_logits(prefix[:-1])))]:
        _, draft = build_pair(spec, DraftSpec(variant))
        assert relation(draft.next_logits(prefix)), variant


def test_qwen3_drafts_are_reference_modules():
    from reference.model import EarlyExit, Qwen3
    spec = Qwen3Spec(8, seed=5, layers=2)
    for variant in ("random", "early_exit", "perfect", "negated", "rolled", "noisy"):
        target, draft = build_pair(spec, DraftSpec(variant))
        assert isinstance(draft.module, (Qwen3, EarlyExit)) and isinstance(target.module, Qwen3)
    _, rolled = build_pair(spec, DraftSpec("rolled"))
    target, negated = build_pair(spec, DraftSpec("negated"))
    t = target.next_logits([1, 2])
    assert int(rolled.next_logits([1, 2]).argmax()) == (int(t.argmax()) + 1) % 8
    assert int(negated.next_logits([1, 2]).argmax()) != int(t.argmax())


def test_pair_specs_build_valid_distributions():
    from properties.cases import P_KINDS, RELATIONS
    for relation in RELATIONS:
        for kind in P_KINDS:
            p, q = PairSpec(7, seed=1, p_kind=kind, q_kind=kind, relation=relation).build()
            for d in (p, q):
                assert d.dtype == torch.float64 and (d >= 0).all() and abs(float(d.sum()) - 1) < 1e-12
            if relation == "disjoint":
                assert float((p * q).sum()) == 0
            if relation == "equal":
                assert torch.equal(p, q)


# --------------------------------------------------------------------------- the analysis

CASE = EngineCase(TableSpec(9, seed=21), DraftSpec("noisy", 3), (4, 1, 2), 12, k=3)


def test_analysis_of_a_correct_run_matches_its_stats():
    run = run_engine(load("properties/examples/chapter_engine.py"), CASE)
    analysis = analyse(run.trace, CASE.prompt, run.tokens)
    assert analysis.problem is None and analysis.chain
    assert len(analysis.rounds) == run.stats["rounds"]
    assert analysis.rounds[0].start == len(CASE.prompt) - 1
    assert sum(r.accepted + 1 for r in analysis.rounds) >= len(run.tokens)


@pytest.mark.parametrize("mutant,expected", [
    ("TargetCacheOneShort", ["round 2", "target", "one entry short"]),
    ("TargetCacheOneLong", ["target cache", "rolled-back proposal still in the cache"]),
    ("DraftCacheOneShort", ["round 2", "draft"]),
    ("DraftNotFedLastProposal", ["draft", "position"]),
    ("DraftCacheNotRolledBack", ["draft", "position"]),
])
def test_cache_failures_name_round_cache_and_position(mutant, expected):
    impl = load(f"tests/mutants/catalogue.py:{mutant}")
    for variant in ("noisy", "perfect", "random"):
        try:
            check_cache_invariant(impl, CASE.replace(draft=DraftSpec(variant, 3)))
        except PropertyFailure as failure:
            text = str(failure)
            assert all(word in text for word in expected), text
            assert "python -m properties.replay" in text
            return
    pytest.fail(f"{mutant} was not caught")
