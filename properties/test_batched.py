"""Family "batched": the batched / graph-captured level (the fast engine's own API).

The properties and what they check: properties/checks/batched.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from properties import oracle, profiles
from properties.cases import BatchCase
from properties.checks.batched import check_batched_greedy, check_batched_sampling, limits
from properties.harness import normalize_tokens
from properties.models import (DraftSpec, Qwen3KitModel, Qwen3Spec, qwen3_draft_module,
                               qwen3_module)
from properties.strategies import batch_cases
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("batched")


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.6)
@given(case=batch_cases())
def test_ragged_greedy_rows(impl, case):
    check_batched_greedy(impl, case)


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.3)
@given(data=st.data())
def test_stop_inside_block_per_row(impl, data):
    """Each row's stop id is one of its own greedy tokens, so rows stop at different places,
    inside accepted blocks (noisy and perfect drafts)."""
    case = data.draw(batch_cases(max_new=(4, 12)), label="case")
    case = BatchCase(case.target, DraftSpec(data.draw(st.sampled_from(("perfect", "noisy")),
                                                      label="draft")),
                     case.prompts, case.max_new_tokens, k=case.k,
                     sampling=SamplingParams(seed=case.sampling.seed))
    row_limits = limits(case)
    greedy = [oracle.greedy(case.target, p, n)[0] for p, n in zip(case.prompts, row_limits)]
    stops = tuple(sorted({g[len(g) // 2] for g in greedy if g}))
    check_batched_greedy(impl, case.replace(stop_ids=stops))


B_SAMPLED = BatchCase(Qwen3Spec(4, seed=3), DraftSpec("noisy", 1), ((1,), (2, 0, 3)), 2, k=2,
                      sampling=SamplingParams(temperature=0.8, seed=17, top_k=3, top_p=0.9))


@pytest.mark.needs(kind="qwen3")
@profiles.statistical(checks=5)
@given(case=st.builds(BatchCase, target=st.builds(Qwen3Spec, vocab=st.integers(3, 4),
                                                  seed=st.integers(0, 2**16)),
                      draft=st.builds(DraftSpec, variant=st.sampled_from(("random", "noisy", "negated")),
                                      seed=st.integers(0, 99)),
                      prompts=st.tuples(st.tuples(st.integers(0, 2)),
                                        st.tuples(st.integers(0, 2), st.integers(0, 2))),
                      max_new_tokens=st.just(2), k=st.integers(1, 3),
                      sampling=st.builds(SamplingParams, temperature=st.sampled_from((0.7, 1.4)),
                                         seed=st.integers(0, 2**32 - 1))))
@example(case=B_SAMPLED)
def test_sampled_rows_exact(impl, case):
    check_batched_sampling(impl, case)


@pytest.mark.gpu
@pytest.mark.needs(kind="qwen3", greedy=True, keywords=("cuda_graphs",))
def test_graph_replay_equals_eager(impl):
    """With CUDA graphs the batched engine replays captured steps: same tokens as eager."""
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
