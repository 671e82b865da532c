"""Family "greedy": at temperature 0 the output is exactly the target's greedy output.

Drafts: random, noisy (mostly right), perfect (the target itself), early-exit (qwen3),
negated (always wrong), rolled / lagged (shifted by one token / one position). Prompts from one
token, k from 1 to 8, max_new_tokens from 0, stop ids, including a stop token injected at every
offset of the output, so that it falls inside accepted blocks (one of the target's own greedy
tokens is relabelled as the stop id).

A divergence to a token whose float64 logit is within TIE_TOLERANCE of the target's largest (or
the implementation's KIT_LOGIT_TOLERANCE, for engines computing their own logits in lower
precision) is a tie, not a failure, and is reported as a GreedyTie warning, which pytest counts in its
warnings summary. An implementation with its own non-speculative greedy decoding
(`target_greedy_generate`) is also held to it, with the same tie rule.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties import oracle, profiles
from properties.cases import EngineCase
from properties.harness import (build_pair, fail, first_difference, normalize_tokens, require,
                                run_engine)
from properties.invariants import analyse
from properties.models import Trace, build_target
from properties.strategies import draft_specs, greedy_cases, prompts, seeds, target_specs

KINDS = ("table", "qwen3")
CHECK = "properties.test_greedy:check_equivalence"


def _where(run, position: int) -> str:
    """Which round committed output position `position` (when the trace tells)."""
    analysis = analyse(run.trace, run.case.prompt, run.tokens or [])
    P = len(run.case.prompt)
    for r in analysis.rounds:
        first, last = r.base + 1 - P, r.base + 1 + r.accepted - P
        if first <= position <= last:
            return (f" (round {r.number}: the target verified {list(r.fed)} from position "
                    f"{r.base}; {r.accepted} proposals kept)")
    return ""


class GreedyTie(UserWarning):
    """A greedy divergence at a tie in the target's logits: reported and counted, not failed."""


def _tie(impl, case, output: list[int], i: int, other: int, against: str) -> bool:
    """Whether output[i] and `other` (where they diverge) are tied: both float64 logits within
    the tolerance of the target's largest. If so, say so in a warning (pytest counts them in
    its warnings summary), so that no tie passes silently."""
    tolerance = max(oracle.TIE_TOLERANCE, impl.logit_tolerance or 0.0)
    logits = build_target(case.target, role="oracle").next_logits(list(case.prompt) + output[:i])
    gap = float(logits.max() - min(logits[output[i]], logits[other]))
    if gap >= tolerance:
        return False
    warnings.warn(GreedyTie(
        f"--impl={impl.spec}: output position {i} has token {output[i]}, {against} has {other}; "
        f"both float64 logits are within {gap:.3g} of the target's largest, below {tolerance:g}: "
        f"a tie, not a failure. inputs: {case!r}"), stacklevel=2)
    return True


def check_equivalence(impl, case: EngineCase):
    run = run_engine(impl, case)
    if run.error is not None:
        fail(impl, "greedy: equivalence", CHECK, case, run.describe_error())
    expected, gaps = oracle.greedy(case.target, case.prompt, case.max_new_tokens, case.stop_ids)
    got = run.tokens
    if got != expected:
        i = first_difference(got, expected)
        both = i < len(got) and i < len(expected)
        if not (both and _tie(impl, case, got, i, expected[i], "the float64 target's greedy output")):
            _fail_against_target(impl, case, run, got, expected, gaps, i)
    if impl.own_greedy is not None:
        # An engine with its own logits (transformers, in float32) is also held to its own
        # non-speculative greedy decoding: exactly equal, but for ties.
        target, _ = build_pair(case.target, case.draft, Trace())
        own = normalize_tokens(impl.own_greedy(target, list(case.prompt), case.max_new_tokens,
                                               tuple(case.stop_ids)))
        if got != own:
            j = first_difference(got, own)
            both = j < len(got) and j < len(own)
            if not (both and _tie(impl, case, got, j, own[j], "its own non-speculative greedy output")):
                fail(impl, "greedy: equivalence", CHECK, case,
                     f"speculative output != the implementation's own greedy output\n  got: "
                     f"{got}\n  own: {own}\nfirst difference at output position {j}")


def _fail_against_target(impl, case, run, got, expected, gaps, i):
    if i >= len(expected):
        detail = (f"the output goes on after the target's greedy output ends at {len(expected)} "
                  f"tokens (max_new_tokens={case.max_new_tokens}, stop_ids={list(case.stop_ids)})")
    elif i >= len(got):
        detail = f"the output stops after {len(got)} tokens; the target's greedy output has {len(expected)}"
    else:
        detail = (f"first difference at output position {i}: got token {got[i]}, the target's "
                  f"argmax is {expected[i]} (top-two logit gap {gaps[i]:.3g}){_where(run, i)}")
    fail(impl, "greedy: equivalence", CHECK, case,
         f"speculative output != the target's greedy output\n  got:      {got}\n  expected: "
         f"{expected}\n{detail}")


@pytest.mark.kit("engine", kind="param")
@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic()
@given(data=st.data())
def test_greedy_equivalence(impl, kind, data):
    """Any draft, prompt, k, max_new_tokens and stop ids: output == target greedy."""
    require(impl, "engine", kind=kind)
    check_equivalence(impl, data.draw(greedy_cases(kind), label="case"))


def check_stop_offsets(impl, case: EngineCase):
    """case.stop_ids is ignored: each of the target's greedy tokens becomes the stop id in turn."""
    greedy, _ = oracle.greedy(case.target, case.prompt, case.max_new_tokens)
    for j, token in enumerate(greedy):
        check_equivalence(impl, case.replace(stop_ids=(token,)))


@pytest.mark.kit("engine", kind="param")
@pytest.mark.parametrize("kind", KINDS)
@profiles.deterministic(0.4)
@given(data=st.data())
def test_stop_injected_at_every_offset(impl, kind, data):
    """With drafts that get whole blocks accepted, relabel the target's greedy token at each
    offset as the stop id: the output must end exactly at its first occurrence."""
    require(impl, "engine", kind=kind)
    target = data.draw(target_specs(kind, vocab=(4, 24)), label="target")
    draft = data.draw(draft_specs(target, variants=("perfect", "noisy", "early_exit")), label="draft")
    case = EngineCase(target=target, draft=draft, prompt=data.draw(prompts(target.vocab), label="prompt"),
                      max_new_tokens=data.draw(st.integers(4, 14), label="max_new_tokens"),
                      k=data.draw(st.integers(1, 5), label="k"), seed=data.draw(seeds(), label="seed"))
    check_stop_offsets(impl, case)


@pytest.mark.parametrize("kind", KINDS)
def test_edge_cases(impl, kind):
    """One-token prompt, max_new_tokens 0 and 1, k = 1 and k larger than the output."""
    require(impl, "engine", kind=kind)
    from properties.models import DraftSpec, Qwen3Spec, TableSpec
    target = TableSpec(7, seed=5) if kind == "table" else Qwen3Spec(7, seed=5, layers=2)
    draft = DraftSpec("noisy", 1)
    for prompt in ((3,), (1, 2, 3, 4, 5)):
        for max_new, k in ((0, 4), (1, 1), (1, 8), (2, 8), (9, 1), (9, 8)):
            check_equivalence(impl, EngineCase(target, draft, prompt, max_new, k=k))
