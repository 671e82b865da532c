"""Family "sequence": sampled output is distributed exactly as the target's ancestral sampling.

For one example (target, draft, prompt, k, temperature, top-k / top-p, L) the kit enumerates
the exact probability of every possible output of L tokens from the target alone
(properties.oracle.sequence_law, float64 forwards), runs ``speculative_generate(...,
max_new_tokens=L)`` n times with one generator seeded from the example, and tests the observed
outputs with a chi-square check. n comes from the power calculation for the example's outcome
space: total variation DELTA_SEQUENCE (table models) or DELTA_SEQUENCE_QWEN3 (qwen3 models) is
detected with power 0.99. An output the target gives probability 0 fails at once.

Temperatures other than 1 come first; top-k / top-p are exercised when the implementation's
speculative_generate names them, and not applicable otherwise.
"""

from __future__ import annotations

from collections import Counter

from properties import oracle
from properties.cases import EngineCase
from properties.harness import engine_kwargs, fail, law_mismatch, run_engine, seed_everything
from properties.statistics import DELTA_SEQUENCE, DELTA_SEQUENCE_QWEN3, chi_square_gof, plan

CHECK = "properties.checks.sequence:check_sequence"


def check_sequence(impl, case: EngineCase, delta: float | None = None):
    prop = "sequence: joint law of the first L tokens"
    delta = delta or (DELTA_SEQUENCE_QWEN3 if case.target.kind == "qwen3" else DELTA_SEQUENCE)
    kw = engine_kwargs(impl, case)
    law = oracle.sequence_law(case.target, case.prompt, case.max_new_tokens, case.temperature,
                              kw.get("top_k", 0), kw.get("top_p", 1.0), case.stop_ids)
    outcomes = list(law)
    the_plan = plan([law[o] for o in outcomes], delta)
    probe = run_engine(impl, case)   # the first run of a test is also checked for determinism
    if probe.error is not None:
        fail(impl, prop, CHECK, case, probe.describe_error())
    generator = seed_everything(case.seed)
    observed = Counter()
    for i in range(the_plan.n):
        run = run_engine(impl, case, generator=generator)
        if run.error is not None:
            fail(impl, prop, CHECK, case, f"run {i + 1} of {the_plan.n}: {run.describe_error()}")
        observed[tuple(run.tokens)] += 1
    result = chi_square_gof(observed, law)
    if not result.passed:
        fail(impl, prop, CHECK, case, law_mismatch(
            "the outputs", result, the_plan, len(outcomes), temperature=case.temperature,
            top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0), L=case.max_new_tokens))
