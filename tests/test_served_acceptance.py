"""The family "served_acceptance" against speculating fake servers (tests/mutants/
served_acceptance.py): correct ones pass under either proposal convention and schedule, each
acceptance bug is rejected, and the exact round laws agree with a direct enumeration."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from properties import acceptance_sampled as exact
from properties import methods, oracle
from properties.adapters.served import make_impl
from properties.cases import ServedCase
from properties.checks import served_acceptance as checks
from properties.engines import vllm
from properties.harness import PropertyFailure
from reference.sampling import SamplingParams, probs_from_logits
from tests.fakes.engine import FAKE
from tests.fakes.server import FakeServer
from tests.mutants import served_acceptance as mutants

PROMPT = (3, 9, 27, 3, 9, 27)
UNFILTERED = ServedCase(PROMPT, 2, SamplingParams(temperature=1.0, seed=5))


def speculating(fake, draft="draft-early-exit", proposals=None, schedule="full", dialect=None):
    """The served Impl of a fake server as a run with --served-engine gets it."""
    return make_impl("openai:" + fake.url, dialect=dialect or mutants.counting(proposals),
                     method=methods.by_option(draft, getattr(fake, "k", 4)), schedule=schedule)


# ----------------------------------------------------------------------- correct servers pass

def test_correct_sampled_drafts_pass_with_the_convention_declared():
    with mutants.SpeculatingServer("draft-early-exit", k=2) as fake:
        verdict = checks.check_sampled_acceptance(speculating(fake, proposals="sampled"),
                                                  UNFILTERED)
    assert verdict.fitted == ("sampled",) and verdict.samples >= checks.MIN_SAMPLES
    assert verdict.power >= 0.99 and verdict.drafted == 2 * verdict.samples


def test_correct_greedy_drafts_pass_and_the_fitting_convention_is_told():
    """No convention declared: both are tried, and the greedy one is the one that fits (the
    sampled one is far off for k = 4 greedy proposals)."""
    with mutants.GreedyDrafts("draft-early-exit", k=4) as fake:
        verdict = checks.check_sampled_acceptance(speculating(fake), UNFILTERED)
    assert verdict.fitted == ("greedy",), verdict


def test_capped_schedule_is_learned_and_judged_at_max_tokens_3():
    """An undeclared schedule: a probe at max_tokens 2 drafts nothing, so the capped design
    (max_tokens 3, one proposal per completion) is used."""
    with mutants.GreedyDrafts("draft-random", k=4, schedule="capped") as fake:
        verdict = checks.check_sampled_acceptance(
            speculating(fake, draft="draft-random", schedule=None), UNFILTERED)
    assert verdict.schedule == "capped" and verdict.drafted == verdict.samples
    assert "greedy" in verdict.fitted


def test_the_project_fake_server_passes_when_declared_perfect():
    """FakeServer counts every proposal accepted (k = 4 per round): a perfect draft proposing
    from the target's own processed law."""
    with FakeServer() as fake:
        impl = speculating(fake, draft="perfect", dialect=FAKE)
        verdict = checks.check_sampled_acceptance(impl, UNFILTERED)
    assert "sampled" in verdict.fitted and verdict.accepted == verdict.drafted


# ----------------------------------------------------------------------- broken servers fail

# Each bug at an example where it moves the acceptance rate by more than the design deviation
# (tests/mutants/served_acceptance.py names the bugs): q from raw logits matters where the
# processed law differs (low temperature, a nucleus), a squared ratio where p < q often.
BROKEN = [
    (mutants.InvertedRatio, UNFILTERED, "accepts (more|fewer|other) drafted tokens than the exact"),
    (mutants.SquaredRatio, ServedCase((5, 6, 5, 6, 5), 2, SamplingParams(
        temperature=1.3, top_p=0.7, seed=6)), "accepts (more|fewer|other) drafted tokens than the exact"),
    (mutants.CountsUnverified, UNFILTERED, "drafted tokens, more than the schedule.s; the full schedule proposes exactly"),
    (mutants.RawLogitsRatio, ServedCase((30, 1, 17, 8, 12), 2, SamplingParams(
        temperature=0.3, top_p=0.7, seed=7)), "accepts (more|fewer|other) drafted tokens than the exact"),
]


@pytest.mark.parametrize("server, case, message", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_server_is_rejected(server, case, message):
    with server("draft-early-exit", k=2) as fake:
        with pytest.raises(PropertyFailure, match=message):
            checks.check_sampled_acceptance(speculating(fake, proposals="sampled"), case)


def test_wrong_ratio_is_rejected_under_either_convention_too():
    with mutants.InvertedRatio("draft-early-exit", k=2) as fake:
        with pytest.raises(PropertyFailure, match="(?s)sampled proposals.*greedy proposals"):
            checks.check_sampled_acceptance(speculating(fake), UNFILTERED)


# ----------------------------------------------------------------------- the exact laws

def _direct(context, n, draft, sampling):
    """P(A >= i) by brute force over every proposal sequence (sampled proposals)."""
    memo = {}

    def law(name, seq):
        if (name, tuple(seq)) not in memo:
            memo[name, tuple(seq)] = probs_from_logits(
                oracle.served_next_logits([seq], name)[0], sampling.temperature, sampling.top_k,
                sampling.top_p)
        return memo[name, tuple(seq)]

    reach = []
    for i in range(1, n + 1):
        total = 0.0
        for xs in itertools.product(range(32), repeat=i):
            w = 1.0
            for j in range(i):
                seq = list(context) + list(xs[:j])
                w *= float(torch.minimum(law("target", seq), law(draft, seq))[xs[j]])
                if w == 0:
                    break
            total += w
        reach.append(total)
    return reach


def test_round_law_equals_brute_force_enumeration():
    sampling = SamplingParams(temperature=1.3, top_k=3)
    context = PROMPT + (4,)
    law, = exact.round_laws([context], 2, "draft-random", sampling, "sampled")
    assert np.allclose(law.reach, _direct(context, 2, "draft-random", sampling), atol=1e-12)
    greedy, = exact.round_laws([context], 3, "draft-early-exit", sampling, "greedy")
    seq, product = list(context), 1.0
    for i in range(3):
        x = int(torch.argmax(oracle.served_next_logits([seq], "draft-early-exit")[0]))
        product *= float(sampling.probs(oracle.served_next_logits([seq])[0])[x])
        assert greedy.reach[i] == pytest.approx(product, abs=1e-12)
        seq.append(x)


def test_perfect_sampled_draft_accepts_everything_and_laws_are_consistent():
    law, = exact.round_laws([PROMPT], 4, "target", SamplingParams(temperature=0.8), "sampled")
    assert law.reach == (1.0,) * 4 and law.var == 0 and law.mean == 4
    other = exact.RoundLaw((0.7, 0.4, 0.1))
    a = np.arange(4)
    assert other.law().sum() == pytest.approx(1)
    assert other.mean == pytest.approx((a * other.law()).sum())
    assert other.var == pytest.approx((a * a * other.law()).sum() - other.mean ** 2)


def test_sum_law_and_two_sided_p_match_the_binomial():
    law = exact.sum_law([np.array([0.7, 0.3])] * 200)
    assert np.allclose(law, stats.binom.pmf(np.arange(201), 200, 0.3), atol=1e-12)
    assert exact.two_sided_p(law, 60) == 1.0
    assert exact.two_sided_p(law, 95) == pytest.approx(2 * stats.binom.sf(94, 200, 0.3))
    with pytest.raises(ValueError, match="observed=.*whole number"):
        exact.two_sided_p(law, 60.5)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="proposals='argmax'"):
        exact.round_laws([PROMPT], 2, "draft-random", SamplingParams(temperature=1.0), "argmax")
    with pytest.raises(ValueError, match="temperature > 0"):
        checks.design(UNFILTERED.replace(temperature=0.0), "full", 4, ("greedy",))
    with pytest.raises(ValueError, match="schedule='eager'"):
        checks.drafts_per_round("eager", 4, 2)


def test_design_narrows_top_k_only_for_a_large_sampled_tree():
    assert checks.design(UNFILTERED, "full", 4, ("greedy",)).sampling.top_k == 0
    narrowed = checks.design(UNFILTERED, "full", 4, ("sampled", "greedy")).sampling.top_k
    assert exact.tree_nodes(4, narrowed) <= checks.MAX_TREE < exact.tree_nodes(4, narrowed + 1)
    assert checks.design(UNFILTERED, "full", 4, exact.PROPOSALS, perfect=True).sampling.top_k == 0
    assert checks.design(UNFILTERED, "capped", 4, exact.PROPOSALS).max_tokens == 3


def test_vllm_accepted_by_position_is_read_from_its_metrics_page():
    record = json.loads((Path(__file__).parent / "recorded" / "vllm.json").read_text())
    before, after = record["metrics_before_after_greedy"]
    assert vllm.accepted_per_position(before) == (8.0, 5.0, 5.0, 5.0)
    assert vllm.accepted_per_position(after) == (11.0, 8.0, 8.0, 8.0)
    assert vllm.accepted_per_position("# nothing\n") is None
    assert vllm.DIALECT.draft_proposals == "greedy"


@pytest.mark.parametrize("proposals", ["sampled", "greedy"])
def test_prompt_schedule_is_judged_at_max_tokens_1(proposals):
    """The first round drafts from the prompt (onnxruntime-genai): one proposal at max_tokens 1,
    judged against the prompt's own round law; a wrong ratio under it is still rejected."""
    server = mutants.SpeculatingServer if proposals == "sampled" else mutants.GreedyDrafts
    with server("draft-early-exit", k=4, schedule="prompt") as fake:
        verdict = checks.check_sampled_acceptance(
            speculating(fake, proposals=proposals, schedule="prompt"), UNFILTERED)
    assert verdict.schedule == "prompt" and verdict.drafted == verdict.samples
    assert verdict.fitted == (proposals,) and verdict.power >= 0.99
    with mutants.InvertedRatio("draft-early-exit", k=4, schedule="prompt") as fake:
        with pytest.raises(PropertyFailure, match="accepts (fewer|more) drafted tokens"):
            checks.check_sampled_acceptance(
                speculating(fake, proposals="sampled", schedule="prompt"), UNFILTERED)
