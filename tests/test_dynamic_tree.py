"""Dynamic trees (issue 41, part 2): the shape rule, greedy == the target's greedy output in the
reference and the fast engine (rows of different shapes in one batch), bad input. The sampled
law is the kit's tree family's (properties/test_tree.py, dynamic examples)."""

import pytest
import torch

import fast
import reference.speculative as ref
from fast.dynamic import Layout, rows_window_mask
from fast.engine import FastEngine
from fast.forward import window_mask
from fast.testing import target_greedy
from reference.dynamic_tree import DynamicTree, grow
from reference.model import EarlyExit, random_model
from reference.tree import Tree


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=41, dtype=torch.float64)


def test_a_fixed_shape_is_one_parents_array():
    fixed = Tree((2, 3))
    general = Tree.from_parents(fixed.parent)
    assert general.depth == fixed.depth and general.children == fixed.children
    assert torch.equal(general.ancestors, fixed.ancestors) and general.depth_max == 2


@pytest.mark.parametrize("spec, sizes", [((5, 2, 12), [2, 4, 4, 2]), ((3, 4, 24), [4, 16, 4]),
                                         ((4, 1, 9), [1, 1, 1, 1]), ((2, 3, 2), [2])])
def test_level_sizes_follow_the_spec_alone(spec, sizes):
    tree = DynamicTree(*spec)
    assert tree.level_sizes() == sizes
    layout = Layout(tree, "cpu")
    assert [b - a for a, b in layout.levels] == sizes and layout.size == 1 + sum(sizes)


def test_the_most_confident_node_is_expanded_whatever_its_index():
    """Level 2 holds 0.5 x 1/4 (under node 1) and 0.3 x 0.9 (under node 2): with one node left
    in the budget, node 5 (confidence 0.27) gets it, not node 3 (0.125)."""
    flat = torch.log(torch.full((4,), 0.25, dtype=torch.float64))
    peaked = torch.log(torch.tensor([0.9, 0.05, 0.03, 0.02], dtype=torch.float64))
    at = {0: torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)),
          1: flat, 2: peaked}

    def node_logits(tree, tokens, nodes):
        return torch.stack([at.get(n, flat) for n in nodes])

    def children_of(logits, m):
        q = torch.softmax(logits, -1)
        return torch.sort(logits, descending=True, stable=True).indices[:m].tolist(), q

    tree, tokens, _ = grow(DynamicTree(3, 2, 7), 9, node_logits, children_of)
    assert tree.parent == [-1, 0, 0, 1, 1, 2, 2, 5]
    assert tokens == [9, 0, 1, 0, 1, 0, 1, 0]


@pytest.mark.parametrize("spec", [DynamicTree(4, 2, 8), DynamicTree(3, 3, 12),
                                  DynamicTree(6, 1, 6), "dynamic"])
def test_greedy_equals_target_greedy_in_both_engines(target, spec):
    prompt = [11, 200, 5, 77, 3]
    expected = target_greedy(target, prompt, 30)
    draft = EarlyExit(target, 2)
    out_ref, stats_ref = ref.tree_generate(target, draft, prompt, 30, tree=spec)
    out_fast, stats_fast = fast.tree_generate(target, draft, prompt, 30, tree=spec)
    assert out_ref == out_fast == expected
    # the same rounds: both grew the same shapes (accepted depths agree round by round)
    assert stats_ref["rounds"] == stats_fast["rounds"]


def test_batched_rows_grow_their_own_trees(target):
    """Ragged prompts in one batch: each row's output and rounds equal the reference's solo run
    (rows accept different depths, so their trees differ round by round)."""
    prompts, limits = [[4], [5, 6, 7, 8, 9, 10], [100, 3], [7, 7, 7, 7]], [12, 20, 5, 16]
    spec = DynamicTree(4, 2, 9)
    draft = EarlyExit(target, 2)
    engine = FastEngine(target, draft, max_batch=4, max_cache_len=64, max_k=spec.budget)
    outputs, stats = engine.generate_tree(prompts, limits, spec)
    for prompt, limit, out, row in zip(prompts, limits, outputs, stats["per_row"]):
        solo, solo_stats = ref.tree_generate(target, draft, prompt, limit, tree=spec)
        assert out == solo == target_greedy(target, prompt, limit)
        assert row["rounds"] == solo_stats["rounds"]


def test_rows_window_mask_is_the_shared_mask_per_row():
    visibility = torch.rand(3, 3) > 0.5                                  # [T, W]
    start = torch.tensor([2, 5])
    rows = rows_window_mask(start, visibility[None].expand(2, 3, 3), 10)
    assert torch.equal(rows, window_mask(start, visibility, 10))


def test_sampled_rows_keep_their_budgets_and_stops(target):
    spec = DynamicTree(3, 2, 6)
    g = torch.Generator().manual_seed(3)
    out, stats = fast.tree_generate(target, EarlyExit(target, 2), [1, 2, 3], 17, tree=spec,
                                    temperature=0.8, generator=g)
    assert len(out) == 17 and 17 / 4 <= stats["rounds"] <= 17
    g = torch.Generator().manual_seed(3)
    again, _ = fast.tree_generate(target, EarlyExit(target, 2), [1, 2, 3], 17, tree=spec,
                                  temperature=0.8, generator=g)
    assert again == out
    stop = out[5]
    g = torch.Generator().manual_seed(3)
    cut, _ = fast.tree_generate(target, EarlyExit(target, 2), [1, 2, 3], 17, tree=spec,
                                temperature=0.8, generator=g, stop_ids=[stop])
    assert cut == out[:out.index(stop) + 1]


@pytest.mark.parametrize("args, match", [((0, 2, 4), "depth must be an int >= 1, got 0"),
                                         ((2, True, 4), "topk must be an int >= 1, got True"),
                                         ((2, 2, 0), "budget must be an int >= 1, got 0"),
                                         ((2, 2, 5000), "budget must be <= 4096, got 5000")])
def test_dynamic_tree_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        DynamicTree(*args)


def test_topk_beyond_the_vocabulary_is_refused(target):
    vocab = target.config.vocab_size
    with pytest.raises(ValueError, match=f"topk must be <= the vocabulary \\({vocab}\\)"):
        fast.tree_generate(target, EarlyExit(target, 2), [1, 2], 4,
                           tree=DynamicTree(2, vocab + 1, 4))
    with pytest.raises(ValueError, match="topk must be <= the vocabulary"):
        ref.tree_generate(target, EarlyExit(target, 2), [1, 2], 4,
                          tree=DynamicTree(2, vocab + 1, vocab + 1))
    with pytest.raises(ValueError, match="tree branching must be"):
        ref.tree_generate(target, EarlyExit(target, 2), [1, 2], 4, tree="dynamo")
