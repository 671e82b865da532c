"""Family "batched": the batched / tree / graph-captured level (the fast engine's own API).

    batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                     stop_ids=(), generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None)
    tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  cuda_graphs=None)

* greedy: every row of a ragged batch (different prompt lengths, different max_new_tokens,
  stop ids that land inside accepted blocks) equals the target's solo greedy continuation;
* sampling: the rows of a batch are independent samples, each distributed exactly as the
  target's ancestral sampling (chi-square per prompt, DELTA_BATCHED, the same harness);
* tree: tree_generate == the chain (speculative_generate) == the target's greedy output, for
  several tree shapes;
* graphs: with CUDA graphs, replay == eager (needs a CUDA device; skipped on a CPU).

These run on qwen3 kit models only (the batched engine runs Qwen3-family weights).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from properties import oracle, profiles
from properties.cases import BatchCase, EngineCase, TreeCase
from properties.harness import (fail, first_difference, normalize_tokens, require, run_engine,
                                seed_everything)
from properties.models import (DraftSpec, Qwen3KitModel, Qwen3Spec, build_pair, qwen3_draft_module,
                               qwen3_module)
from properties.statistics import DELTA_BATCHED, chi_square_gof, plan
from properties.strategies import batch_cases, tree_cases

CHECK_GREEDY = "properties.test_batched:check_batched_greedy"
CHECK_SAMPLED = "properties.test_batched:check_batched_sampling"
CHECK_TREE = "properties.test_batched:check_tree"


def _limits(case) -> list[int]:
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


def check_batched_greedy(impl, case: BatchCase):
    prop = "batched: ragged greedy rows == solo greedy"
    target, draft = build_pair(case.target, case.draft)
    limits = _limits(case)
    generator = seed_everything(case.seed)
    try:
        outs, _ = impl.functions["batched_generate"](
            target, draft, [list(p) for p in case.prompts],
            list(case.max_new_tokens) if isinstance(case.max_new_tokens, tuple) else case.max_new_tokens,
            k=case.k, temperature=0.0, stop_ids=tuple(case.stop_ids), generator=generator)
        outs = [normalize_tokens(o) for o in outs]
    except Exception as exc:
        fail(impl, prop, CHECK_GREEDY, case, f"batched_generate raised {type(exc).__name__}: {exc}")
    if len(outs) != len(case.prompts):
        fail(impl, prop, CHECK_GREEDY, case, f"{len(outs)} outputs for {len(case.prompts)} prompts")
    for row, (prompt, got, limit) in enumerate(zip(case.prompts, outs, limits)):
        _compare(impl, prop, CHECK_GREEDY, case, got, prompt, limit, case.stop_ids, f"row {row}")


@pytest.mark.kit("batched", kind="qwen3")
@profiles.deterministic(0.6)
@given(case=batch_cases())
def test_ragged_greedy_rows(impl, case):
    require(impl, "batched", kind="qwen3")
    check_batched_greedy(impl, case)


@pytest.mark.kit("batched", kind="qwen3")
@profiles.deterministic(0.3)
@given(data=st.data())
def test_stop_inside_block_per_row(impl, data):
    """Each row's stop id is one of its own greedy tokens, so rows stop at different places,
    inside accepted blocks (noisy and perfect drafts)."""
    require(impl, "batched", kind="qwen3")
    case = data.draw(batch_cases(max_new=(4, 12)), label="case")
    case = BatchCase(case.target, DraftSpec(data.draw(st.sampled_from(("perfect", "noisy")),
                                                      label="draft")),
                     case.prompts, case.max_new_tokens, k=case.k, seed=case.seed)
    limits = _limits(case)
    greedy = [oracle.greedy(case.target, p, n)[0] for p, n in zip(case.prompts, limits)]
    stops = tuple(sorted({g[len(g) // 2] for g in greedy if g}))
    check_batched_greedy(impl, BatchCase(case.target, case.draft, case.prompts,
                                         case.max_new_tokens, k=case.k, stop_ids=stops,
                                         seed=case.seed))


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
        try:
            outs, _ = impl.functions["batched_generate"](
                target, draft, batch, L, k=case.k, temperature=case.temperature,
                stop_ids=tuple(case.stop_ids), generator=generator, **kw)
        except Exception as exc:
            fail(impl, prop, CHECK_SAMPLED, case, f"batched_generate raised {type(exc).__name__}: {exc}")
        for row, out in enumerate(outs):
            observed[row // copies][tuple(normalize_tokens(out))] += 1
    for prompt, law, counts, the_plan in zip(case.prompts, laws, observed, plans):
        result = chi_square_gof(counts, law)
        if not result.passed:
            fail(impl, prop, CHECK_SAMPLED, case,
                 f"rows for prompt {list(prompt)} are not distributed as the target's sampling "
                 f"(temperature={case.temperature}, {kw or 'no top-k/top-p'}, L={L}):\n"
                 f"{result.summary()}\n(sample plan: {the_plan.describe()})")


B_SAMPLED = BatchCase(Qwen3Spec(4, seed=3), DraftSpec("noisy", 1), ((1,), (2, 0, 3)), 2, k=2,
                      temperature=0.8, seed=17, top_k=3, top_p=0.9)


@pytest.mark.kit("batched", kind="qwen3")
@profiles.statistical(checks=2)
@given(case=st.builds(BatchCase, target=st.builds(Qwen3Spec, vocab=st.integers(3, 4),
                                                  seed=st.integers(0, 2**16)),
                      draft=st.builds(DraftSpec, variant=st.sampled_from(("random", "noisy", "negated")),
                                      seed=st.integers(0, 99)),
                      prompts=st.tuples(st.tuples(st.integers(0, 2)),
                                        st.tuples(st.integers(0, 2), st.integers(0, 2))),
                      max_new_tokens=st.just(2), k=st.integers(1, 3),
                      temperature=st.sampled_from((0.7, 1.4)), seed=st.integers(0, 2**32 - 1)))
@example(case=B_SAMPLED)
def test_sampled_rows_exact(impl, case):
    require(impl, "batched", kind="qwen3")
    check_batched_sampling(impl, case)


def check_tree(impl, case: TreeCase):
    prop = "batched: tree == chain == target greedy"
    target, draft = build_pair(case.target, case.draft)
    try:
        tokens, _ = impl.functions["tree_generate"](target, draft, list(case.prompt),
                                                    case.max_new_tokens, tree=tuple(case.tree),
                                                    stop_ids=tuple(case.stop_ids))
        tokens = normalize_tokens(tokens)
    except Exception as exc:
        fail(impl, prop, CHECK_TREE, case, f"tree_generate raised {type(exc).__name__}: {exc}")
    _compare(impl, prop, CHECK_TREE, case, tokens, case.prompt, case.max_new_tokens,
             case.stop_ids, f"tree_generate(tree={case.tree})")
    if impl.has("engine"):
        chain = EngineCase(case.target, case.draft, case.prompt, case.max_new_tokens, k=2,
                           stop_ids=case.stop_ids)
        run = run_engine(impl, chain)
        if run.error is None and run.tokens != tokens:
            fail(impl, prop, CHECK_TREE, case,
                 f"tree_generate gave {tokens}, the chain (speculative_generate, k=2) gave "
                 f"{run.tokens}")


@pytest.mark.kit("batched", kind="qwen3")
@profiles.deterministic(0.6)
@given(case=tree_cases(vocab=(4, 24)))
def test_tree_equals_chain_equals_greedy(impl, case):
    require(impl, "batched", kind="qwen3")
    check_tree(impl, case)


@pytest.mark.gpu
def test_graph_replay_equals_eager(impl):
    """With CUDA graphs the batched engine replays captured steps: same tokens as eager."""
    require(impl, "batched", kind="qwen3")
    if not impl.accepts("batched_generate", "cuda_graphs"):
        pytest.skip(f"not applicable: --impl={impl.spec}'s batched_generate has no cuda_graphs=")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: graph replay is only checked on a GPU")
    spec = Qwen3Spec(32, seed=4, layers=2)
    for variant in ("noisy", "random"):
        t_mod = copy.deepcopy(qwen3_module(spec)).to("cuda")
        d_mod = copy.deepcopy(qwen3_draft_module(spec, DraftSpec(variant, 2))).to("cuda")
        prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
        results = {}
        for graphs in (False, True):
            target = Qwen3KitModel(t_mod, "target")
            draft = Qwen3KitModel(d_mod, "draft")
            for repeat in range(2):  # the second call replays the captured graphs
                outs, _ = impl.functions["batched_generate"](target, draft, prompts, [12, 7, 10],
                                                             k=3, cuda_graphs=graphs)
                results[(graphs, repeat)] = [normalize_tokens(o) for o in outs]
        eager = results[(False, 0)]
        for key, outs in results.items():
            assert outs == eager, (f"draft {variant}: cuda_graphs={key[0]} call {key[1] + 1} gave "
                                   f"{outs}, eager gave {eager}")
        for prompt, out, n in zip(prompts, eager, [12, 7, 10]):
            expected, _ = oracle.greedy(spec, prompt, n)
            assert out == expected, f"eager row {prompt}: {out} != target greedy {expected}"
