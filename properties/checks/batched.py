"""Family "batched": the batched / graph-captured level (the fast engine's own API).

    batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                     stop_ids=(), generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None)

* greedy: every row of a ragged batch (different prompt lengths, different max_new_tokens,
  stop ids that land inside accepted blocks) equals the target's solo greedy continuation;
* sampling: each row is distributed exactly as the target's ancestral sampling (chi-square
  per prompt, DELTA_BATCHED), and the rows are independent: pairs of rows of one prompt, and
  of two prompts, against the product of the exact laws (DELTA_BATCHED_JOINT), so that rows
  reusing the same uniforms (right law per row, far too often equal) are caught;
* graphs: with CUDA graphs, replay == eager (needs a CUDA device; skipped on a CPU).

These run on qwen3 kit models only (the batched engine runs Qwen3-family weights).
"""

from __future__ import annotations

from collections import Counter

from properties import oracle
from properties.cases import BatchCase
from properties.guards import EngineFault
from properties.harness import (TOO_LONG, fail, first_difference, invoke, normalize_tokens,
                                seed_everything, too_long)
from properties.models import build_pair
from properties.statistics import DELTA_BATCHED, DELTA_BATCHED_JOINT, chi_square_gof, plan

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
    generator = seed_everything(case.sampling.seed)
    prompts = [list(p) for p in case.prompts]
    outs = _batched(impl, prop, CHECK_GREEDY, case, target, draft, prompts,
                    list(case.max_new_tokens) if isinstance(case.max_new_tokens, tuple)
                    else case.max_new_tokens,
                    k=case.k, temperature=0.0, stop_ids=tuple(case.sampling.stop_ids),
                    generator=generator)
    if len(outs) != len(case.prompts):
        fail(impl, prop, CHECK_GREEDY, case, f"{len(outs)} outputs for {len(case.prompts)} prompts")
    for row, (got, limit) in enumerate(zip(outs, row_limits)):
        if len(got) > limit:
            fail(impl, prop, CHECK_GREEDY, case, f"row {row}: {len(got)} tokens for "
                 f"max_new_tokens={limit}: {got}", cause=TOO_LONG)
    for row, (prompt, got, limit) in enumerate(zip(case.prompts, outs, row_limits)):
        _compare(impl, prop, CHECK_GREEDY, case, got, prompt, limit, case.sampling.stop_ids,
                 f"row {row}")


COPIES = 32   # rows per distinct prompt in every sampled batch: rows cost little in a batch


def _product(law_a, law_b) -> dict:
    """The law of a pair (a, b) of independent outputs: P(a) P(b)."""
    return {(a, b): pa * pb for a, pa in law_a.items() for b, pb in law_b.items()}


def check_batched_sampling(impl, case: BatchCase, delta: float = DELTA_BATCHED,
                           joint_delta: float = DELTA_BATCHED_JOINT):
    """case.prompts: the distinct prompts; each is repeated COPIES times in every batch.
    L = max_new_tokens. Five chi-square checks per example, each at ALPHA:

    * per prompt, its rows against the target's exact law (TV >= delta, power POWER);
    * per prompt, pairs of its rows (copies 2j and 2j + 1 of one call) against the product of
      the exact laws: rows of one prompt must be independent samples, not rows that reuse
      the same acceptance uniforms or draws (TV >= joint_delta in the law of the pair);
    * pairs (copy j of the first prompt, copy j of the second) against the product of their
      two laws: rows of different prompts must not share randomness either.
    """
    prop = "batched: sampled rows distributed as the target's sampling, and independent"
    L = case.max_new_tokens
    s = case.sampling
    kw = {}
    if s.top_k and impl.accepts("batched_generate", "top_k"):
        kw["top_k"] = s.top_k
    if s.top_p < 1 and impl.accepts("batched_generate", "top_p"):
        kw["top_p"] = s.top_p
    laws = [oracle.sequence_law(case.target, p, L, s.temperature, kw.get("top_k", 0),
                                kw.get("top_p", 1.0), s.stop_ids) for p in case.prompts]
    checks = [(f"rows for prompt {list(p)}", law, plan(list(law.values()), delta), COPIES)
              for p, law in zip(case.prompts, laws)]
    for p, law in zip(case.prompts, laws):
        pair = _product(law, law)
        checks.append((f"pairs of rows for prompt {list(p)} (two copies in one batch)", pair,
                       plan(list(pair.values()), joint_delta), COPIES // 2))
    if len(case.prompts) >= 2:
        cross = _product(laws[0], laws[1])
        checks.append((f"pairs (a row for prompt {list(case.prompts[0])}, a row for prompt "
                       f"{list(case.prompts[1])}) of one batch", cross,
                       plan(list(cross.values()), joint_delta), COPIES))
    batch = [list(p) for p in case.prompts for _ in range(COPIES)]
    calls = max(-(-the_plan.n // per_call) for _, _, the_plan, per_call in checks)
    generator = seed_everything(case.sampling.seed)
    observed = [Counter() for _ in checks]
    target, draft = build_pair(case.target, case.draft)
    m = len(case.prompts)
    for _ in range(calls):
        outs = _batched(impl, prop, CHECK_SAMPLED, case, target, draft, batch, L, k=case.k,
                        temperature=s.temperature, stop_ids=tuple(s.stop_ids),
                        generator=generator, **kw)
        if len(outs) != len(batch):
            fail(impl, prop, CHECK_SAMPLED, case, f"{len(outs)} outputs for {len(batch)} prompts")
        rows = [[tuple(outs[i * COPIES + c]) for c in range(COPIES)] for i in range(m)]
        for i in range(m):
            observed[i].update(rows[i])
            observed[m + i].update(zip(rows[i][0::2], rows[i][1::2]))
        if m >= 2:
            observed[2 * m].update(zip(rows[0], rows[1]))
    # Independence first: rows that share randomness also inflate the spread of the per-prompt
    # counts, and "not independent" is then the cause to report.
    order = list(range(m, len(checks))) + list(range(m))
    for (what, law, the_plan, _), counts in [(checks[i], observed[i]) for i in order]:
        result = chi_square_gof(counts, law)
        if not result.passed:
            long = too_long([o for pair in result.impossible for o in
                             (pair if pair and isinstance(pair[0], tuple) else (pair,))], L)
            fail(impl, prop, CHECK_SAMPLED, case,
                 f"{what} are not distributed as {_expected(what)} (temperature="
                 f"{case.sampling.temperature}, {kw or 'no top-k/top-p'}, L={L}):\n"
                 f"{_agreement(counts, law)}{result.summary()}\n(sample plan: "
                 f"{the_plan.describe()})", cause=TOO_LONG if long else None)


def _expected(what: str) -> str:
    return ("independent samples of the target's sampling (the product of the exact laws)"
            if what.startswith("pairs") else "the target's sampling")


def _agreement(counts, law) -> str:
    """For pairs: how often the two rows gave the same output, against independence."""
    first = next(iter(law), None)
    if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], tuple)):
        return ""
    n = sum(counts.values())
    same = sum(c for (a, b), c in counts.items() if a == b)
    exact = sum(p for (a, b), p in law.items() if a == b)
    return (f"the two rows of a pair gave the same output in {same} of {n} pairs "
            f"({same / n:.3f}); independent rows agree with probability {exact:.3f}\n")
