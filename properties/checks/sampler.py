"""Family "sampler": the engine's own non-speculative sampler follows the convention.

An engine may expose ``target_generate(target, prompt_ids, max_new_tokens, temperature=0.0,
stop_ids=(), generator=None, *, top_k=0, top_p=1.0) -> tokens``: how it samples without
speculation. The sequence family then judges speculation against that sampler's law (exact
relative to the engine's own sampler). This family reports, under its own name, whether that
sampler's definition is the convention's: ``reference.sampling.probs_from_logits``, i.e.
logits / temperature, then top-k (ties with the k-th kept), then the top-p nucleus of the
tempered probabilities, renormalized. One chi-square check per example against the exact law
(properties.oracle.sequence_law) at ALPHA, n planned for TV >= DELTA_SEQUENCE (table) /
DELTA_SEQUENCE_QWEN3 (qwen3) with power POWER. A failure says which outcomes differ.
"""

from __future__ import annotations

import pytest

from properties import oracle
from properties.cases import EngineCase
from properties.checks.sequence import own_sampler_outputs
from properties.harness import engine_kwargs, fail, law_mismatch
from properties.statistics import DELTA_SEQUENCE, DELTA_SEQUENCE_QWEN3, chi_square_gof, plan

CHECK = "properties.checks.sampler:check_own_sampler"
CONVENTION = ("the convention (reference.sampling.probs_from_logits: logits / temperature, then "
              "top-k, then the top-p nucleus of the tempered probabilities)")
CAUSE = "the engine's own sampler (target_generate) differs from the convention"


def check_own_sampler(impl, case: EngineCase, delta: float | None = None):
    prop = "sampler: the engine's own sampler follows the convention"
    if not impl.has_function("target_generate"):
        pytest.skip(f"not applicable: --impl={impl.spec} has no target_generate (its own "
                    f"sampler); its speculation is judged against the convention's law directly")
    delta = delta or (DELTA_SEQUENCE_QWEN3 if case.target.kind == "qwen3" else DELTA_SEQUENCE)
    kw = engine_kwargs(impl, case)
    law = oracle.sequence_law(case.target, case.prompt, case.max_new_tokens,
                              case.sampling.temperature, kw.get("top_k", 0), kw.get("top_p", 1.0),
                              case.sampling.stop_ids)
    the_plan = plan(list(law.values()), delta)
    observed = own_sampler_outputs(impl, prop, CHECK, case, kw, the_plan.n, seed_offset=2)
    result = chi_square_gof(observed, law)
    if not result.passed:
        fail(impl, prop, CHECK, case,
             f"{CAUSE}: {CONVENTION}\n" + law_mismatch(
                 "the outputs of target_generate", result, the_plan, len(law),
                 temperature=case.sampling.temperature, top_k=kw.get("top_k", 0),
                 top_p=kw.get("top_p", 1.0), L=case.max_new_tokens)
             + "\n(the engine's speculation is judged against this sampler by the sequence "
               "family; a bug shared by both samplers shows here, as the difference it is)",
             cause=CAUSE)
