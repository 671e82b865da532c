"""The family "served_acceptance" judges an engine against the verification rule its method
declares (properties/checks/served_acceptance.py, Method.verification): fake servers verifying
by blocks (tests/mutants/served_block.py) or token by token, each declared one way or the
other.

The case: BLOCK_CASE, sampled proposals of the early-exit draft (temperature 3, top-k 3),
k = 4, where block verification accepts 0.121 tokens more per round than token-wise in
expectation (exact, over the prefill token's law). The check's plan sizes N so that this shift
is detected with power 0.99 at its level ALPHA / 2 = 1e-6 (two-sided, exact law of the total:
false-alarm rate <= 2e-6 with the by-position tests): N = 52.1 v / 0.121^2 = 4123 completions
(v = 1.155, the block law's variance per round), where the design deviation alone (0.05 per
drafted token) needs 1505. The power reached is asserted from the Verdict (rule_power), so a
test that rejects does so with power >= 0.99 by calculation.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from properties import methods
from properties.adapters.served import make_impl
from properties.cases import ServedCase
from properties.checks import served_acceptance as checks
from properties.harness import PropertyFailure
from reference.sampling import SamplingParams
from tests.mutants import served_acceptance as mutants
from tests.mutants.served_block import BlockServer, GreedyBlockServer

BLOCK_CASE = ServedCase((27, 3, 7, 14), 2, SamplingParams(temperature=3.0, top_k=3, seed=9))


def declared(fake, verification, proposals="sampled"):
    """The served Impl of a fake server whose method declares `verification`."""
    method = replace(methods.by_option("draft-early-exit", fake.k), verification=verification,
                     proposals=proposals)
    return make_impl("openai:" + fake.url, dialect=mutants.counting(proposals), method=method,
                     schedule="full")


def test_block_server_declared_block_passes_with_the_rule_shown():
    with BlockServer("draft-early-exit", k=4) as fake:
        verdict = checks.check_sampled_acceptance(declared(fake, "block"), BLOCK_CASE)
    assert verdict.fitted == ("sampled",) and verdict.verification == "block"
    assert verdict.rule_power["sampled"] >= 0.99 and verdict.power >= 0.99
    assert verdict.samples <= checks.MAX_RULE_SAMPLES


def test_token_wise_verification_claimed_as_block_is_rejected():
    """vllm-ascend #7807's defect: "block" configured, the token-wise rule run. Lossless (the
    sampled law would pass), but its accepted total fits token-wise's exact law and not
    block's, and the failure says so."""
    with mutants.SpeculatingServer("draft-early-exit", k=4) as fake:
        with pytest.raises(PropertyFailure, match="as token-wise verification of sampled "
                                                  "proposals does, not as the block "
                                                  "verification its method declares"):
            checks.check_sampled_acceptance(declared(fake, "block"), BLOCK_CASE)


def test_block_and_probabilistic_drafting_both_dropped_are_rejected():
    """vLLM 0.32's CPU build (V1 model runner): with rejection_sample_method "block" its
    proposer drafts argmax tokens (draft probabilities only under "standard") and its rejection
    sampler has no block rule, so "block" + "probabilistic" runs argmax proposals verified
    token-wise. A server doing exactly that, declared block of sampled proposals, is rejected
    and the failure names what its counts fit. Power: the greedy law's expected total is
    computed from the exact laws and the z-test's power against it asserted (>= 0.99)."""
    from properties import acceptance_sampled as exact
    from properties import statistics

    with mutants.GreedyDrafts("draft-early-exit", k=4) as fake:
        impl = declared(fake, "block")
        case = checks.design(BLOCK_CASE, "full", 4, ("sampled",))
        N, v, n = checks.plan(impl, case, "full", ("sampled",))
        t0 = checks.t0_law(case)
        contexts = [tuple(case.prompt) + (t,) for t in t0]
        means = {(c, r): sum(p * law.mean for p, law in zip(t0.values(), exact.cached_round_laws(
                     contexts, n, "draft-early-exit", case.sampling, c, r)))
                 for c, r in (("sampled", "block"), ("greedy", "token-wise"))}
        shift = means["greedy", "token-wise"] - means["sampled", "block"]
        assert exact.z_power(N * shift, (N * v) ** 0.5, statistics.ALPHA / 2) >= 0.99
        with pytest.raises(PropertyFailure, match="as token-wise verification of greedy "
                                                  "proposals does, not as the block "
                                                  "verification its method declares"):
            checks.check_sampled_acceptance(impl, BLOCK_CASE)


def test_greedy_proposals_cannot_show_the_rule():
    """Argmax proposals make q one-hot, where block and token-wise verification have one law:
    the block server passes, and the Verdict says the rule was not shown (power 0)."""
    with GreedyBlockServer("draft-early-exit", k=4) as fake:
        verdict = checks.check_sampled_acceptance(declared(fake, "block", "greedy"),
                                                  BLOCK_CASE)
    assert verdict.fitted == ("greedy",) and verdict.rule_power["greedy"] < 1e-3


def test_a_rule_the_exact_law_does_not_know_is_named():
    class Odd:
        method = replace(methods.by_option("draft-early-exit", 4), name="odd")

    object.__setattr__(Odd.method, "verification", "tree")
    with pytest.raises(ValueError, match="method 'odd': verification='tree', choose from"):
        checks.verification(Odd())
