"""Family "batched": the batched / graph-captured level (the fast engine's own API).

    batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                     stop_ids=(), generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None)

* greedy: every row of a ragged batch (different prompt lengths, different max_new_tokens,
  stop ids that land inside accepted blocks) equals the target's solo greedy continuation;
* sampling: the rows of a batch are independent samples, each distributed exactly as the
  target's ancestral sampling (chi-square per prompt, DELTA_BATCHED, the same harness);
* graphs: with CUDA graphs, replay == eager (needs a CUDA device; skipped on a CPU).

These run on qwen3 kit models only (the batched engine runs Qwen3-family weights).
"""

from __future__ import annotations

from collections import Counter

from properties import oracle
from properties.cases import BatchCase
from properties.guards import EngineFault
from properties.harness import (fail, first_difference, invoke, normalize_tokens,
                                seed_everything)
from properties.models import build_pair
from properties.statistics import DELTA_BATCHED, chi_square_gof, plan

CHECK_GREEDY = "properties.checks.batched:check_batched_greedy"
CHECK_SAMPLED = "properties.checks.batched:check_batched_sampling"


def limits(case) -> list[int]:
    m = case.max_new_tokens
    return list(m) if isinstance(m, (tuple, list)) else [m] * len(case.prompts)


def _compare(impl, prop, check, case, got, prompt, limit, stop_ids, what):
    expected, gaps = oracle.greedy(case.target, prompt, limit, stop_ids)
    if got == expected:
        return
    i = first_difference(got, expected)
    if i < len(got) and i < len(expected) and gaps[i] < oracle.TIE_TOLERANCE:
        return
    fail(impl, prop, check, case,
         f"{what} != the target's greedy continuation of {list(prompt)} (max_new_tokens={limit}, "
         f"stop_ids={list(stop_ids)})\n  got:      {got}\n  expected: {expected}\n"
         f"first difference at output position {i}")


def _batched(impl, prop, check, case, target, draft, prompts, max_new, **kwargs):
    """One batched_generate call under the kit's guards: the rows as lists of token ids."""
    try:
        value = invoke(impl, "batched_generate", target, draft, prompts, max_new,
                       models=(("target", target), ("draft", draft)),
                       inputs=(("prompts", prompts),), **kwargs)
    except EngineFault as exc:
        fail(impl, prop, check, case, exc.describe())
    try:
        outs, _ = value
        return [normalize_tokens(o) for o in outs]
    except (TypeError, ValueError) as exc:
        fail(impl, prop, check, case,
             f"batched_generate returned {type(value).__name__} {str(value)[:80]}; the API "
             f"expects (outputs, stats) with one list of token ids per prompt ({exc})")


def check_batched_greedy(impl, case: BatchCase):
    prop = "batched: ragged greedy rows == solo greedy"
    target, draft = build_pair(case.target, case.draft)
    row_limits = limits(case)
    generator = seed_everything(case.seed)
    prompts = [list(p) for p in case.prompts]
    outs = _batched(impl, prop, CHECK_GREEDY, case, target, draft, prompts,
                    list(case.max_new_tokens) if isinstance(case.max_new_tokens, tuple)
                    else case.max_new_tokens,
                    k=case.k, temperature=0.0, stop_ids=tuple(case.stop_ids), generator=generator)
    if len(outs) != len(case.prompts):
        fail(impl, prop, CHECK_GREEDY, case, f"{len(outs)} outputs for {len(case.prompts)} prompts")
    for row, (prompt, got, limit) in enumerate(zip(case.prompts, outs, row_limits)):
        _compare(impl, prop, CHECK_GREEDY, case, got, prompt, limit, case.stop_ids, f"row {row}")


def check_batched_sampling(impl, case: BatchCase, delta: float = DELTA_BATCHED):
    """case.prompts: the distinct prompts; each is repeated in every batch. L = max_new_tokens."""
    prop = "batched: sampled rows distributed as the target's sampling"
    L = case.max_new_tokens
    kw = {}
    if case.top_k and impl.accepts("batched_generate", "top_k"):
        kw["top_k"] = case.top_k
    if case.top_p < 1 and impl.accepts("batched_generate", "top_p"):
        kw["top_p"] = case.top_p
    laws = [oracle.sequence_law(case.target, p, L, case.temperature, kw.get("top_k", 0),
                                kw.get("top_p", 1.0), case.stop_ids) for p in case.prompts]
    plans = [plan(list(law.values()), delta) for law in laws]
    copies = 8
    batch = [list(p) for p in case.prompts for _ in range(copies)]
    calls = -(-max(pl.n for pl in plans) // copies)
    generator = seed_everything(case.seed)
    observed = [Counter() for _ in case.prompts]
    target, draft = build_pair(case.target, case.draft)
    for _ in range(calls):
        outs = _batched(impl, prop, CHECK_SAMPLED, case, target, draft, batch, L, k=case.k,
                        temperature=case.temperature, stop_ids=tuple(case.stop_ids),
                        generator=generator, **kw)
        if len(outs) != len(batch):
            fail(impl, prop, CHECK_SAMPLED, case, f"{len(outs)} outputs for {len(batch)} prompts")
        for row, out in enumerate(outs):
            observed[row // copies][tuple(out)] += 1
    for prompt, law, counts, the_plan in zip(case.prompts, laws, observed, plans):
        result = chi_square_gof(counts, law)
        if not result.passed:
            fail(impl, prop, CHECK_SAMPLED, case,
                 f"rows for prompt {list(prompt)} are not distributed as the target's sampling "
                 f"(temperature={case.temperature}, {kw or 'no top-k/top-p'}, L={L}):\n"
                 f"{result.summary()}\n(sample plan: {the_plan.describe()})")
