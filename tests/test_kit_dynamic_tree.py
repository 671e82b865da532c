"""The kit against the dynamic-tree mutants of tests/mutants/tree.py, cheaply (not `extra`):
each mutant is rejected on one canonical case, and the correct base engine is not.

- MaskSeesSiblings (a node attends to its siblings): check_tree_greedy on the tree family's
  dynamic greedy example D_DYNAMIC rejects it; the whole family on every mutant, sampling
  included, is tests/test_kit_tree.py's (extra).
- ResidualFromParent (a rejection's residual subtracts the parent's q): the exact law of the
  token a node below the root commits, computed through the mutant's own hooks
  (next_residual, residual_q), is not p (total variation > 0.05), while the correct engine's
  is p to rounding: the sampling check's chi-square sees it when such a node is reached
  (S_DYNAMIC, S_LEVEL_Q in properties/test_tree.py; tests/test_kit_tree.py runs them).
"""

from __future__ import annotations

import pytest
import torch

from properties.harness import PropertyFailure
from properties.impl import load
from properties.checks.tree import check_tree_greedy
from properties.test_tree import D_DYNAMIC
from reference.dynamic_tree import DynamicTree
from reference.tree import Tree
from tests.mutants import tree as tree_mutants


def test_mask_seeing_siblings_is_rejected_on_the_dynamic_example():
    assert isinstance(D_DYNAMIC.tree, DynamicTree)
    check_tree_greedy(load("tests/mutants/tree.py:TreeSpeculator"), D_DYNAMIC)
    with pytest.raises(PropertyFailure, match="target's greedy continuation|the chain"):
        check_tree_greedy(load("tests/mutants/tree.py:MaskSeesSiblings"), D_DYNAMIC)


def node_law(engine, p, q_at, node, tree, b):
    """The exact law of the token committed at `node` with b children i.i.d. from q_at[node]
    under the engine's residual hooks: T(r, j) = min(q, r) + (1 - sum min(q, r)) T(r', j + 1),
    T(r, b) = r, with r' = next_residual(p, r, residual_q(...)) (it does not depend on which
    token was rejected). The recursive rule gives T(p, 0) = p (reference/tree.py's proof)."""
    q = q_at[node]
    r, law, reach = p, torch.zeros_like(p), 1.0
    for _ in range(b):
        take = torch.minimum(q, engine.tested_against(p, r))
        law += reach * take
        reach *= 1 - float(take.sum())
        r = engine.next_residual(p, r, engine.residual_q(q_at, node, tree, q))
    return law + reach * r


@pytest.mark.parametrize("seed", range(3))
def test_residual_from_the_parent_changes_the_law_below_the_root(seed):
    g = torch.Generator().manual_seed(seed)
    dist = lambda: torch.softmax(3 * torch.randn(5, generator=g, dtype=torch.float64), 0)
    p, tree = dist(), Tree.from_parents([-1, 0, 0, 1, 1])   # node 1 has two children
    q_at = {0: dist(), 1: dist()}
    correct = node_law(tree_mutants.TreeSpeculator(), p, q_at, 1, tree, 2)
    assert (correct - p).abs().max() < 1e-12
    wrong = node_law(tree_mutants.ResidualFromParent(), p, q_at, 1, tree, 2)
    assert 0.5 * (wrong - p).abs().sum() > 0.05
    # at the root (no parent) the mutant is right: only nodes below it show the bug
    assert (node_law(tree_mutants.ResidualFromParent(), p, q_at, 0, tree, 2) - p).abs().max() < 1e-12


def test_the_new_mutants_are_in_the_catalogue():
    names = {cls.__name__ for cls in tree_mutants.MUTANTS}
    assert {"MaskSeesSiblings", "ResidualFromParent"} <= names
