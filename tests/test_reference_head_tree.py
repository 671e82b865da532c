"""Dynamic trees drawn by a chained head (EAGLE-2's drafting; reference/heads/tree.py): greedy
output is the target's own for every chained head and convention, a tree of one child per level
proposes exactly the chain's proposals, a node's law is the head's at the pair (its parent's
output, its token), and heads without a law at a node are refused by name. The sampled law is
judged by the kit's tree family on the fast engine (--impl=fast-head, properties/test_tree.py)."""

import pytest
import torch

import reference.speculative as speculative
from reference.dynamic_tree import DynamicTree, sampler_children
from reference.heads.proposer import ChainHeadProposer
from reference.heads.random import random_head
from reference.heads.tree import TreeHeadProposer
from reference.hidden import forward_hidden
from reference.sampling import Sampler, SamplingParams
from reference.dynamic_tree import grow
from tests.heads_by_hand import random_heads, small_target
from tests.test_reference_heads import HEADS as ALL_HEADS

PROMPTS = [[1, 2, 3, 4, 5, 6], [9], [40, 40, 7, 40, 40], [63, 0, 31, 32, 8, 8, 8, 20, 11]]
# the chained heads' conventions of tests/test_reference_heads.py (Medusa has no law at a node)
HEADS = {name: spec for name, spec in ALL_HEADS.items()
         if name in ("eagle", "eagle3", "eagle3-d2t", "mtp", "mtp-llamacpp")}


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.fixture(scope="module")
def heads(target):
    return {name: head for name, (_, head) in random_heads(target, HEADS, first_seed=30).items()}


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("spec", [DynamicTree(4, 2, 8), DynamicTree(3, 3, 9)])
def test_greedy_is_the_targets_output(target, heads, name, spec):
    for prompt in PROMPTS:
        expected = speculative.greedy_generate(target, prompt, 16)
        out, stats = speculative.speculative_generate(target, heads[name], prompt, 16, tree=spec)
        assert out == expected, (name, prompt)
        assert stats["rounds"] <= 16


def _prefilled(target, head, context, proposer_class, **kwargs):
    """A proposer holding the target's verified features of context[:-1]."""
    sampler = Sampler(SamplingParams(0.0))
    proposer = proposer_class(head, 64, sampler, "cpu", **kwargs)
    cache = target.new_cache(1, 64)
    _, features = forward_hidden(target, torch.tensor([context[:-1]]), cache, head.hidden)
    proposer.saw(features[0])
    proposer.prefill(torch.tensor(context))
    return proposer, sampler


@pytest.mark.parametrize("name", HEADS)
def test_one_child_per_level_is_the_chain(target, heads, name):
    """DynamicTree(k, 1, k) feeds each node with its parent's output, as the chain feeds each
    proposal with the previous one's: the same k tokens, on every context."""
    head = heads[name]
    for context in PROMPTS[:1] + PROMPTS[2:]:
        chain, _ = _prefilled(target, head, context, ChainHeadProposer)
        proposals, _ = chain.propose(context, 4)
        tree, sampler = _prefilled(target, head, context, TreeHeadProposer)
        assert tree.start_round(context)
        shape, tokens, _ = grow(DynamicTree(4, 1, 4), context[-1], tree.node_logits,
                                sampler_children(sampler))
        assert shape.parent == [-1, 0, 1, 2, 3]
        assert tokens[1:] == proposals, (name, context)


def test_a_node_reads_its_parents_output(target, heads):
    """Each node's law is the head's at (its parent's output, its token), at position root +
    depth, seeing its ancestors only: recomputed here for every level-2 node of a top-2 tree
    by a plain causal chain through its parent alone."""
    head, context = heads["eagle3"], PROMPTS[3]
    tree, sampler = _prefilled(target, head, context, TreeHeadProposer)
    assert tree.start_round(context)
    seen = {}

    def node_logits(shape, tokens, nodes):
        out = tree.node_logits(shape, tokens, nodes)
        seen.update((node, out[j]) for j, node in enumerate(nodes))
        return out

    shape, tokens, _ = grow(DynamicTree(3, 2, 8), context[-1], node_logits,
                            sampler_children(sampler))
    assert len(shape.level(2)) == 4
    for node in shape.level(2):
        parent = shape.parent[node]
        alone, _ = _prefilled(target, head, context, TreeHeadProposer)
        assert alone.start_round(context)
        first, g = head(torch.tensor([[tokens[parent]]]), alone.g[0][None], alone.cache)
        second, _ = head(torch.tensor([[tokens[node]]]), g[:, -1:], alone.cache)
        assert torch.allclose(alone.placed(first[0])[0], seen[parent])
        assert torch.allclose(alone.placed(second[0])[0], seen[node])


@pytest.mark.parametrize("kind", ["medusa", "dflash"])
def test_heads_without_a_law_at_a_node_are_refused(target, kind):
    head = random_head(kind, target, seed=1)
    with pytest.raises(ValueError, match="chained head"):
        speculative.speculative_generate(target, head, PROMPTS[0], 4, tree=DynamicTree(3, 2, 5))


def test_a_fixed_shape_still_needs_a_model_draft(target, heads):
    with pytest.raises(ValueError, match="dynamic tree"):
        speculative.speculative_generate(target, heads["eagle3"], PROMPTS[0], 4, tree=(2, 2))
