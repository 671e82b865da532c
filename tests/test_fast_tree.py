"""Greedy tree verification: tree == chain == target greedy, for several tree shapes."""

import pytest
import torch

import fast
from fast.engine import FastEngine
from fast.testing import target_greedy
from fast.tree import TreeShape, generate_tree
from reference.model import EarlyExit, random_model


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=41, dtype=torch.float64)


def test_chapter_tree_shape():
    shape = TreeShape((2, 2, 2), "cpu")
    assert shape.size == 15                      # root + 2 + 4 + 8 = the chapter's 14 nodes
    assert shape.levels == [(1, 3), (3, 7), (7, 15)]
    assert shape.parent[7:15].tolist() == [3, 3, 4, 4, 5, 5, 6, 6]
    assert shape.path[14].tolist() == [0, 2, 6, 14]
    assert shape.ancestors[14].nonzero()[:, 0].tolist() == [0, 2, 6, 14]


@pytest.mark.parametrize("tree", [(2, 2, 2), (3,), (1, 1, 1, 1), (4, 2), (2, 3, 1, 2)])
def test_tree_equals_chain_equals_target_greedy(target, tree):
    prompt = [11, 200, 5, 77, 3]
    expected = target_greedy(target, prompt, 30)
    draft = EarlyExit(target, 2)
    out_tree, stats = fast.tree_generate(target, draft, prompt, 30, tree=tree)
    out_chain, _ = fast.speculative_generate(target, draft, prompt, 30, k=len(tree))
    assert out_tree == out_chain == expected
    assert stats["rounds"] * (len(tree) + 1) >= 30 and stats["host_syncs"] == stats["rounds"]


def test_perfect_draft_takes_a_full_path_every_round(target):
    out, stats = fast.tree_generate(target, target, [1, 2, 3], 20, tree=(2, 2, 2))
    assert out == target_greedy(target, [1, 2, 3], 20)
    assert stats["rounds"] == 5 and stats["acceptance_rate"] == 1.0


def test_tree_stops_mid_path_and_respects_the_budget(target):
    prompt = [9, 8, 7]
    expected = target_greedy(target, prompt, 25)
    stop = expected[4]
    out, _ = fast.tree_generate(target, EarlyExit(target, 3), prompt, 25, stop_ids=[stop])
    assert out == expected[:expected.index(stop) + 1]
    out, _ = fast.tree_generate(target, EarlyExit(target, 3), prompt, 7)
    assert out == expected[:7]


def test_batched_tree_rows_equal_solo_greedy(target):
    prompts = [[4], [5, 6, 7, 8, 9, 10], [100, 3]]
    engine = FastEngine(target, EarlyExit(target, 2), max_batch=3, max_cache_len=64)
    outputs, _ = generate_tree(engine, prompts, [12, 20, 5], (2, 2))
    assert outputs == [target_greedy(target, p, n) for p, n in zip(prompts, [12, 20, 5])]
