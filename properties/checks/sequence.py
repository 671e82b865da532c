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

An engine that exposes its own non-speculative sampler, ``target_generate(target, prompt_ids,
max_new_tokens, temperature=0.0, stop_ids=(), generator=None, *, top_k=0, top_p=1.0)``, has its
speculation judged against that sampler's law instead: a two-sample chi-square test at ALPHA,
n per sample from statistics.two_sample_plan (TV >= delta, power POWER). Whether its sampler
follows the convention is reported apart, by family "sampler". Without the hook, a mismatch
says that it may be either.
"""

from __future__ import annotations

from collections import Counter

from properties import oracle
from properties.cases import EngineCase
from properties.harness import (TOO_LONG, engine_kwargs, fail, law_mismatch, run_engine,
                                seed_everything, too_long)
from properties.guards import EngineFault
from properties.harness import invoke, normalize_tokens
from properties.models import build_target
from properties.statistics import (DELTA_SEQUENCE, DELTA_SEQUENCE_QWEN3, chi_square_gof,
                                   chi_square_two_sample, plan, two_sample_plan)

CHECK = "properties.checks.sequence:check_sequence"


def check_sequence(impl, case: EngineCase, delta: float | None = None):
    prop = "sequence: joint law of the first L tokens"
    delta = delta or (DELTA_SEQUENCE_QWEN3 if case.target.kind == "qwen3" else DELTA_SEQUENCE)
    kw = engine_kwargs(impl, case)
    L = case.max_new_tokens
    law = oracle.sequence_law(case.target, case.prompt, L, case.sampling.temperature,
                              kw.get("top_k", 0), kw.get("top_p", 1.0), case.sampling.stop_ids)
    outcomes = list(law)
    own = impl.has_function("target_generate")
    the_plan = (two_sample_plan if own else plan)([law[o] for o in outcomes], delta)
    probe = run_engine(impl, case)   # the first run of a test is also checked for determinism
    crash, runs = None, case
    if probe.error is not None:
        # A crash at this length (an edge case: max_new_tokens 1 or 2) must not hide the law:
        # the first L tokens of longer outputs have the same exact law, so check those, and
        # report the crash with what the law check found.
        crash = probe.describe_error()
        runs = case.replace(max_new_tokens=L + case.k + 1)
        again = run_engine(impl, runs)
        if again.error is not None:
            fail(impl, prop, CHECK, case, crash)
    generator = seed_everything(case.sampling.seed)
    observed = Counter()
    for i in range(the_plan.n):
        run = run_engine(impl, runs, generator=generator)
        if run.error is not None:
            fail(impl, prop, CHECK, case, f"run {i + 1} of {the_plan.n}: {run.describe_error()}")
        stops = case.sampling.stop_ids
        observed[first_tokens(run.tokens, L, stops) if crash else tuple(run.tokens)] += 1
    if own:
        return _against_own_sampler(impl, prop, case, kw, observed, the_plan, crash)
    result = chi_square_gof(observed, law)
    where = (f"\n(max_new_tokens={L} crashed, so these are the first {L} tokens of outputs "
             f"with max_new_tokens={runs.max_new_tokens})" if crash else "")
    if not result.passed:
        long = too_long(result.impossible, L)
        fail(impl, prop, CHECK, case, law_mismatch(
            "the outputs", result, the_plan, len(outcomes), temperature=case.sampling.temperature,
            top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0), L=L) + where
            + (f"\nand at max_new_tokens={L} itself: {crash}" if crash else "")
            + _sampler_hint(impl, long),
            cause=TOO_LONG if long else None)
    if crash:
        fail(impl, prop, CHECK, case,
             f"{crash}\n(the law of the first {L} tokens, checked on outputs with "
             f"max_new_tokens={runs.max_new_tokens} instead, is exact: {result.summary()})")


def first_tokens(tokens, L: int, stop_ids) -> tuple:
    """The output max_new_tokens=L would have given: the first L tokens, cut after a stop id."""
    out = []
    for t in tokens[:L]:
        out.append(t)
        if t in stop_ids:
            break
    return tuple(out)


def _sampler_hint(impl, long) -> str:
    """Without the engine's own sampler the kit cannot tell a speculation bug from a sampler
    whose definition differs from the convention: say so (not when the outputs are too long,
    which is neither)."""
    if long or impl.has_function("target_generate"):
        return ""
    return ("\n(this can be the speculation or the engine's own sampler: one that defines "
            "temperature / top-k / top-p differently from the convention, e.g. top-p before the "
            "temperature, samples another law with or without speculation. Expose "
            "target_generate(target, prompt_ids, max_new_tokens, temperature=0.0, stop_ids=(), "
            "generator=None, *, top_k=0, top_p=1.0) and the kit tells the two apart)")


def own_sampler_outputs(impl, prop, check, case, kw, n: int, seed_offset: int = 1) -> Counter:
    """n outputs of the engine's own non-speculative sampler (target_generate), under the
    kit's guards, from one generator seeded from the case (offset: not the speculative runs'
    stream)."""
    generator = seed_everything((case.sampling.seed + seed_offset) % 2**32)
    observed = Counter()
    extra = {name: kw[name] for name in ("top_k", "top_p") if name in kw
             and impl.accepts("target_generate", name)}
    for i in range(n):
        target = build_target(case.target, role="target")
        prompt = list(case.prompt)
        try:
            tokens = normalize_tokens(invoke(
                impl, "target_generate", target, prompt, case.max_new_tokens,
                temperature=case.sampling.temperature,
                stop_ids=tuple(case.sampling.stop_ids),
                generator=generator, models=(("target", target),),
                inputs=(("prompt_ids", prompt),), **extra))
        except (EngineFault, TypeError, ValueError) as exc:
            fail(impl, prop, check, case, f"its own sampler (target_generate), run {i + 1} of "
                                          f"{n}: {exc}")
        observed[tuple(tokens)] += 1
    return observed


def _against_own_sampler(impl, prop, case, kw, observed, the_plan, crash):
    """Speculation judged against the engine's own sampler: a two-sample test. Whether that
    sampler follows the convention is family "sampler"'s business (properties/test_sampler.py)."""
    L = case.max_new_tokens
    long = too_long(observed, L)
    if long:
        fail(impl, prop, CHECK, case, long, cause=TOO_LONG)
    theirs = own_sampler_outputs(impl, prop, CHECK, case, kw, the_plan.n)
    result = chi_square_two_sample(observed, theirs)
    if not result.passed:
        fail(impl, prop, CHECK, case,
             f"the speculative outputs are not distributed as the engine's own sampler's "
             f"(target_generate, the same temperature={case.sampling.temperature}, top_k="
             f"{kw.get('top_k', 0)}, top_p={kw.get('top_p', 1.0)}, L={L}): a speculation bug, "
             f"whatever the sampler's definition\n{result.summary()}\n(two-sample plan: "
             f"{the_plan.describe()} per sample)"
             + (f"\nand at max_new_tokens={L} itself: {crash}" if crash else ""))
    if crash:
        fail(impl, prop, CHECK, case, crash)
