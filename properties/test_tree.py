"""Family "tree": tree verification (tree_generate), greedy and exact sampling.

* greedy: tree == chain == target greedy, for several tree shapes and drafts;
* sampling: at a temperature (and with top-k / top-p where tree_generate names them) the joint
  law of the first L tokens is the target's: one chi-square check per example at alpha = 2e-6,
  n from the power calculation so that total variation >= DELTA_TREE (0.05; 0.02 in thorough)
  is detected with power 0.99 (n is 5,700-6,500 runs for the 4-27 possible outputs of these
  examples, about 30-70 s each on the reference engine);
* cache: at every call the cache entries below the round are the committed sequence's, in
  place (keys and values equal to a fresh prefill: tokens, positions, the accepted path's);
* bounds: max_new_tokens, stop ids inside an accepted path, stats.

The canonical examples below run in every profile; each is chosen so that one kind of tree
sampling bug shows (tests/mutants/tree.py): a dynamic tree (S_DYNAMIC), a one-level tree of 3 children with a draft unlike
the target (every sibling tried, the residual carried twice, a repeated sibling token common;
chosen by the exact law of one node under each mutant's rule, tests/test_reference_tree.py), a
close draft whose paths reach a leaf often (the token after a leaf), and filters. In the
thorough profile generated examples add deeper trees (up to (2, 2)) and other temperatures,
drafts and prompts; the default profile runs the canonical examples only, each sized for TV
0.05, which buys more power per second than more examples at that size would.
"""

from __future__ import annotations

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from properties import oracle, profiles
from properties.cases import TreeCase
from properties.checks.tree import (check_tree_bounds, check_tree_cache, check_tree_greedy,
                                    check_tree_sampling, greedy_depths)
from properties.models import DraftSpec, Qwen3Spec
from properties.strategies import (deep_tree_cases, trained_tree_cases, tree_cases,
                                   tree_sampling_cases)
from reference.dynamic_tree import DynamicTree
from reference.sampling import SamplingParams

pytestmark = pytest.mark.family("tree")

# Sampling examples (L tokens over a vocabulary of 3-4: 4-27 possible outputs).
# Three siblings under the root, the first token only: every sibling bug of the catalogue moves
# 0.145-0.39 of total variation here (power > 0.9999 at the planned n, by the exact node law).
S_SIBLINGS = TreeCase(Qwen3Spec(4, seed=7), DraftSpec("random", 0), (2,), 1, tree=(3,),
                      sampling=SamplingParams(temperature=1.0, seed=11))
# A close draft: the first token is usually an accepted child, so the second is the token after
# a leaf, drawn from the target at that leaf (a bonus drawn one node too high moves TV 0.97).
S_PATHS = TreeCase(Qwen3Spec(3, seed=18), DraftSpec("noisy", 0), (1,), 2, tree=(2,),
                   sampling=SamplingParams(temperature=0.7, seed=12))
# One uniform reused for every sibling's accept test (OneUniformForSiblings): at this root the
# committed token's law moves by TV 0.054 (exact, by enumerating the children: the largest of
# 1,440 root nodes searched), caught with power 0.9999998 at the planned n = 5,742 (it was 0.04
# at the former sizing for TV 0.15). A draft close to the target, so that a first sibling is
# often rejected with u just above its ratio and the second tested with that same u.
S_SHARED_U = TreeCase(Qwen3Spec(4, seed=35), DraftSpec("noisy", 0), (2,), 1, tree=(2,),
                      sampling=SamplingParams(temperature=1.6, seed=15))
# Three siblings under the root, each with its own two children: the depth-1 nodes hold
# different tokens, so their draft distributions differ, and testing a node's children with
# the q of the first node of its level (QFromFirstNodeOfLevel) moves the law of the first two
# tokens by TV 0.235 (exact). Siblings whose residuals interact at both levels.
S_LEVEL_Q = TreeCase(Qwen3Spec(3, seed=72), DraftSpec("random", 2), (2,), 2, tree=(3, 2),
                     sampling=SamplingParams(temperature=1.0, seed=16))
# A dynamic tree (DynamicTree(2, 2, 4)): the root's two i.i.d. children, and children only under
# the more confident of them (the shape varies with the draws): the first token is a depth-1
# node or the root's residual draw, the second is decided at a node below the root whose
# children are tested with its own q (a residual that subtracts the parent's q instead,
# ResidualFromParent, moves the law there: total variation about 0.1 estimated from 400 runs of
# the mutant, against the 0.05 this check is sized for; its node law exactly:
# tests/test_kit_dynamic_tree.py).
S_DYNAMIC = TreeCase(Qwen3Spec(3, seed=72), DraftSpec("random", 2), (2,), 2,
                     tree=DynamicTree(2, 2, 4), sampling=SamplingParams(temperature=1.0, seed=17))
# top-k and top-p both cut the support (7 of 16 outputs possible).
S_FILTERS = TreeCase(Qwen3Spec(4, seed=4), DraftSpec("random", 3), (1,), 2, tree=(3,),
                     sampling=SamplingParams(temperature=1.3, seed=13, top_k=3, top_p=0.8))
# Cache examples: several rounds, rejections and full paths.
C_GREEDY = TreeCase(Qwen3Spec(16, seed=3, layers=2), DraftSpec("noisy", 1), (3, 1, 4), 14,
                    tree=(2, 2))
C_SAMPLED = TreeCase(Qwen3Spec(6, seed=4), DraftSpec("random", 2), (1, 2), 10, tree=(2, 2),
                     sampling=SamplingParams(temperature=1.0, seed=14))


# Dynamic trees (DynamicTree(depth, topk, budget), reference/dynamic_tree.py): a shape grown
# per round from the draft's confidence. tree_cases draws them beside the fixed shapes; these
# run in every profile. A close draft accepts deep paths through nodes with siblings, so a mask
# that lets a node see its siblings (MaskSeesSiblings) changes the greedy output here.
D_DYNAMIC = TreeCase(Qwen3Spec(8, seed=12), DraftSpec("noisy", 0), (1, 2), 12,
                     tree=DynamicTree(4, 2, 8))
C_DYNAMIC = TreeCase(Qwen3Spec(16, seed=3, layers=2), DraftSpec("noisy", 1), (3, 1, 4), 14,
                     tree=DynamicTree(5, 2, 7))


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.6)
@given(case=tree_cases(vocab=(4, 24)))
@example(case=D_DYNAMIC)
def test_tree_equals_chain_equals_greedy(impl, case):
    check_tree_greedy(impl, case)


# Deep paths where a mask that lets a node see its uncles (MaskSeesUncles) changes the greedy
# output; generated deep cases change it in only ~5% of cases (the kit's tiny models' argmax is
# robust to one extra attended key), so these run in every profile.
D_UNCLES = TreeCase(Qwen3Spec(12, seed=9), DraftSpec("perfect"), (1, 2), 16, tree=(2, 2, 1, 1))
D_UNCLES_NOISY = TreeCase(Qwen3Spec(12, seed=7), DraftSpec("noisy", 0), (1,), 24,
                          tree=(3, 2, 1, 1))


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(1.0)
@given(case=deep_tree_cases())
@example(case=D_UNCLES)
@example(case=D_UNCLES_NOISY)
def test_deep_trees_close_draft(impl, case):
    """Trees of depth >= 4 with branching, drafts close to the target: deep paths are accepted,
    so a node that sees more than its ancestors (siblings, uncles) changes the output."""
    event(f"deepest accepted level: {max(greedy_depths(case), default=0)}")
    check_tree_greedy(impl, case)


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.3)
@given(data=st.data())
def test_tree_stops_inside_a_path(impl, data):
    """The stop id is one of the target's own greedy tokens, so it lands inside an accepted
    path (perfect and noisy drafts accept whole paths)."""
    case = data.draw(tree_cases(vocab=(4, 24), max_new=(4, 16)), label="case")
    case = case.replace(draft=DraftSpec(data.draw(st.sampled_from(("perfect", "noisy")),
                                                  label="draft")))
    greedy, _ = oracle.greedy(case.target, case.prompt, case.max_new_tokens)
    case = case.replace(stop_ids=(greedy[len(greedy) // 2],))
    check_tree_greedy(impl, case)
    check_tree_bounds(impl, case)


@pytest.mark.needs(kind="qwen3", keywords=("temperature",))
@profiles.deterministic(0.2)
@given(case=tree_sampling_cases(stops=True, vocab=(3, 6)))
def test_tree_sampled_stops_and_budgets(impl, case):
    check_tree_bounds(impl, case.replace(max_new_tokens=case.max_new_tokens + 4), runs=8)


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.2)
@given(case=tree_cases(vocab=(4, 24), max_new=(6, 16)))
@example(case=C_GREEDY)
@example(case=C_DYNAMIC)
def test_tree_cache_in_place(impl, case):
    check_tree_cache(impl, case)


@pytest.mark.needs(kind="qwen3", keywords=("temperature",))
@profiles.deterministic(0.2)
@given(case=tree_sampling_cases(vocab=(4, 8)))
@example(case=C_SAMPLED)
def test_tree_sampled_cache_in_place(impl, case):
    check_tree_cache(impl, case.replace(max_new_tokens=case.max_new_tokens + 6))


@pytest.mark.needs(kind="qwen3", keywords=("temperature",))
@profiles.statistical(checks=1, scale=0.5, explicit_only_unless_thorough=True)
@given(case=tree_sampling_cases(length=(2, 2)))
@example(case=S_SIBLINGS)
@example(case=S_PATHS)
@example(case=S_SHARED_U)
@example(case=S_LEVEL_Q)
@example(case=S_DYNAMIC)
def test_tree_sampling_exact(impl, case):
    check_tree_sampling(impl, case)


@pytest.mark.needs(kind="qwen3", keywords=("temperature", "top_k", "top_p"))
@profiles.statistical(checks=1, scale=0.5, explicit_only_unless_thorough=True)
@given(case=tree_sampling_cases(vocab=(4, 4), shapes=((2,), (3,)), top_k=True, top_p=True))
@example(case=S_FILTERS)
def test_tree_filters_exact(impl, case):
    check_tree_sampling(impl, case)


@pytest.mark.needs(kind="qwen3", greedy=True)
@profiles.deterministic(0.2)
@given(case=trained_tree_cases())
def test_tree_greedy_trained(impl, case):
    """The trained target and drafts on held-out text: deep levels of branching trees accepted."""
    event(f"deepest accepted level: {max(greedy_depths(case), default=0)}")
    check_tree_greedy(impl, case)
