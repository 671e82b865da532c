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

from properties import oracle
from properties.cases import EngineCase
from properties.guards import EngineFault
from properties.harness import (TOO_LONG, build_pair, fail, first_difference, invoke,
                                normalize_tokens, run_engine)
from properties.invariants import analyse
from properties.models import Trace, build_target

KINDS = ("table", "qwen3")
CHECK = "properties.checks.greedy:check_equivalence"
NEAR_TIE = "properties.checks.greedy:check_near_ties"
# Near ties: the target's top-two float64 logits differ by this much at every step. Far above
# float32 rounding of logits of this size (~5e-7), so never a tie under the kit's tie rule, yet
# small enough that "greedy" implemented as sampling at a tiny temperature (1e-5) picks the
# second token with probability 1 / (1 + e^(gap / T)): 0.27 at gap 1e-5.
NEAR_TIE_GAPS = (1e-5, 3e-5, 1e-4, 1e-3)


def _where(run, position: int) -> str:
    """Which round committed output position `position` (when the trace tells)."""
    analysis = analyse(run.trace, run.case.prompt, run.tokens or [])
    P = len(run.case.prompt)
    for r in analysis.rounds:
        first, last = r.frontier - P, r.frontier + r.decided - 1 - P
        if first <= position <= last:
            return (f" (round {r.number}: the target was fed {list(r.fed)} from position "
                    f"{r.start}; {r.accepted} of {r.proposals} proposals kept)")
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
    expected, gaps = oracle.greedy(case.target, case.prompt, case.max_new_tokens,
                                   case.sampling.stop_ids)
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
        try:
            own = normalize_tokens(invoke(impl, "target_greedy_generate", target,
                                          list(case.prompt), case.max_new_tokens,
                                          tuple(case.sampling.stop_ids),
                                          models=(("target", target),)))
        except (EngineFault, ValueError, TypeError) as exc:
            fail(impl, "greedy: equivalence", CHECK, case,
                 f"its own greedy decoding (target_greedy_generate) failed: {exc}")
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
                  f"tokens (max_new_tokens={case.max_new_tokens}, "
                  f"stop_ids={list(case.sampling.stop_ids)})")
    elif i >= len(got):
        detail = f"the output stops after {len(got)} tokens; the target's greedy output has {len(expected)}"
    else:
        detail = (f"first difference at output position {i}: got token {got[i]}, the target's "
                  f"argmax is {expected[i]} (top-two logit gap {gaps[i]:.3g}){_where(run, i)}")
    fail(impl, "greedy: equivalence", CHECK, case,
         f"speculative output != the target's greedy output\n  got:      {got}\n  expected: "
         f"{expected}\n{detail}",
         cause=TOO_LONG if len(got) > case.max_new_tokens else None)


def check_stop_offsets(impl, case: EngineCase):
    """The case's stop ids are ignored: each of the target's greedy tokens becomes the stop id
    in turn."""
    greedy, _ = oracle.greedy(case.target, case.prompt, case.max_new_tokens)
    for j, token in enumerate(greedy):
        check_equivalence(impl, case.replace(stop_ids=(token,)))


def check_near_ties(impl, case: EngineCase):
    """Greedy on a target whose top-two logits differ by only case.target.tie_gap at every
    step: the output must still be the exact argmax (see NEAR_TIE_GAPS)."""
    tolerance = max(oracle.TIE_TOLERANCE, impl.logit_tolerance or 0.0)
    if case.target.tie_gap <= tolerance:
        return  # a gap the implementation declared within its logits' rounding: a tie
    run = run_engine(impl, case)
    if run.error is not None:
        fail(impl, "greedy: argmax at near ties", NEAR_TIE, case, run.describe_error())
    expected, gaps = oracle.greedy(case.target, case.prompt, case.max_new_tokens,
                                   case.sampling.stop_ids)
    if run.tokens != expected:
        i = first_difference(run.tokens, expected)
        # The tiny-temperature guess only when the evidence singles it out: the same length,
        # and the first difference is the runner-up token, the one such sampling would pick.
        runner_up = (len(run.tokens) == len(expected) and i < len(expected)
                     and run.tokens[i] == _runner_up(case, run.tokens[:i]))
        fail(impl, "greedy: argmax at near ties", NEAR_TIE, case,
             f"temperature 0 must mean the argmax, however small the margin: at every step the "
             f"target's top-two float64 logits differ by {case.target.tie_gap:g} (well above "
             f"the logits' float32 rounding, so not a tie)\n  got:      {run.tokens}\n  "
             f"expected: {expected}\nfirst difference at output position {i}"
             + (f" (gap {gaps[i]:.3g})" if i < len(gaps) else "")
             + ("\n(it took the runner-up there: an engine that samples at a tiny temperature "
                "instead of taking the argmax picks the runner-up with probability "
                "1 / (1 + exp(gap / T)))" if runner_up else ""),
             cause=TOO_LONG if len(run.tokens) > case.max_new_tokens else None)


def _runner_up(case, prefix) -> int:
    logits = build_target(case.target, role="oracle").next_logits(list(case.prompt) + prefix)
    return int(logits.argsort(descending=True, stable=True)[1])
