"""Dynamic trees (EAGLE-2 style): each round's tree is grown where the draft is confident.

DynamicTree(depth, topk, budget). Node 0 is `last` with confidence 1; a node's confidence is
its parent's times the draft's probability of the node's token at the parent (the product of
the draft's probabilities along the path). The tree grows level by level:

    level 1: the root gets min(topk, budget) children;
    level d + 1: the topk nodes of level d with the highest confidence (ties: the lower index)
             are expanded, in that rank order, each with min(topk, nodes left in the budget)
             children, until the budget (nodes besides the root) is spent or depth is reached.

Children are numbered level by level and, within a level, by the rank of their parent, so the
round's tree is a parents array (reference.tree.Tree.from_parents). How many nodes each level
holds follows from (depth, topk, budget) alone, the same in every round and every row; only
WHICH nodes are expanded changes (fast/dynamic.py pads nothing but the parents for that).

Which tokens the children hold:
- greedy (temperature 0): the draft's top-m tokens at the node (distinct, ties by lower index);
  the confidence uses the draft's softmax at temperature 1. Exact trivially: a child is accepted
  when it equals the target's argmax at its parent (reference.tree.greedy_path), so the output
  is the target's greedy continuation for any shape.
- sampling: m i.i.d. draws WITH replacement from q, the draft's filtered distribution at the
  node (rule (a) of issue 41), verified by the recursive rejection of reference.tree
  (sampled_path); the confidence uses the same q.

Proof obligation (sampling). reference/tree.py's proof shows: at a node with m children, if,
given everything the walk has seen so far, the children are m i.i.d. draws from q at the node
and each accept test has its own fresh uniform, the committed token at the node is distributed
as p there, FOR EVERY m. So the shape may depend on anything that is fixed before the node's
children are drawn and is independent of them: here m is decided from the confidences of the
node's own level (draft quantities only, never the target's), before any child of that level
is drawn. What would break it: choosing which drawn children to keep by their own values (e.g.
EAGLE-2's final re-ranking of all nodes by confidence, which keeps a likely draw and drops an
unlikely one, so the kept children are no longer draws from q). That is why the budget is
spent level by level, never by pruning drawn nodes; a child's own value only decides whether
ITS children are drawn (its subtree's shape), which is fixed before they are drawn. The target
never influences the shape.

The drafter is anything that gives next-token logits for a level of nodes, given the tree so
far (node_logits below): a draft model with the tree mask (ModelTree), or a chained head (EAGLE,
EAGLE-3, MTP; HeadTree, reference/heads/tree.py) reading the head's own output at the node's
parent, as EAGLE-2 drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.committed import Committed
from reference.heads import is_head
from reference.hidden import forward_hidden
from reference.sampling import Sampler, SamplingParams
from reference.tree import Tree, greedy_path, keep_path, sampled_path, top_tokens


@dataclass(frozen=True)
class DynamicTree:
    """depth: most levels below the root; topk: nodes expanded per level and children per
    expanded node; budget: most nodes besides the root."""

    depth: int = 5
    topk: int = 2
    budget: int = 12

    def __post_init__(self):
        for name, low in (("depth", 1), ("topk", 1), ("budget", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DynamicTree {name} must be an int >= {low}, got {value!r}")
        if self.budget > 4096:
            raise ValueError(f"DynamicTree budget must be <= 4096, got {self.budget!r}")

    def level_sizes(self) -> list[int]:
        """Nodes per level (level 1 first): fixed by (depth, topk, budget), never by the draft."""
        sizes, left, frontier = [], self.budget, 1
        while len(sizes) < self.depth and left > 0:
            expanded = min(self.topk, frontier)
            n = min(expanded * self.topk, left)
            sizes.append(n)
            left -= n
            frontier = n
        return sizes

    def children_counts(self, frontier: int, left: int) -> list[int]:
        """Children per expanded node, in rank order, for a level of `frontier` nodes with
        `left` nodes of the budget left (the last expanded node may get fewer)."""
        counts = []
        for _ in range(min(self.topk, frontier)):
            m = min(self.topk, left)
            if m == 0:
                break
            counts.append(m)
            left -= m
        return counts


def as_dynamic_tree(tree) -> DynamicTree:
    """tree="dynamic" -> DynamicTree(); a DynamicTree as it is."""
    if isinstance(tree, DynamicTree):
        return tree
    if tree == "dynamic":
        return DynamicTree()
    if hasattr(tree, "budget") and hasattr(tree, "topk") and hasattr(tree, "depth"):
        return DynamicTree(tree.depth, tree.topk, tree.budget)
    raise ValueError(f"tree must be 'dynamic' or a DynamicTree(depth, topk, budget), got {tree!r}")


def ranked(nodes, confidence, topk):
    """The topk of `nodes` by confidence, highest first, ties by the lower index."""
    return sorted(nodes, key=lambda i: (-confidence[i], i))[:topk]


def grow(spec: DynamicTree, last: int, node_logits, children_of):
    """Grow one round's tree.

    node_logits(tree, tokens, nodes) -> logits [len(nodes), V]: the drafter's next-token logits
      at each of `nodes` (one whole level, contiguous), given the tree so far (a Tree with
      those nodes) and its tokens;
    children_of(logits_row [V], m) -> (m tokens, q [V]): the node's children and the
      distribution its confidence (and, sampling, its children's law) comes from.
    Returns (tree, tokens [size] list, q_at: expanded node -> q).
    """
    parents, tokens, confidence, q_at = [-1], [last], [1.0], {}
    level, left = [0], spec.budget
    for _ in range(spec.depth):
        counts = spec.children_counts(len(level), left)
        if not counts:
            break
        # The shape of this level is decided HERE, from confidences already known (draft only),
        # before any of the level's children is drawn: the proof obligation in the docstring.
        expand = ranked(level, confidence, len(counts))
        logits = node_logits(Tree.from_parents(parents), tokens, level)                 # [len(level), V]
        new_level = []
        for node, m in zip(expand, counts):
            kids, q = children_of(logits[level.index(node)], m)
            q_at[node] = q
            for token in kids:
                parents.append(node)
                tokens.append(int(token))
                confidence.append(confidence[node] * float(q[int(token)]))
                new_level.append(len(parents) - 1)
        left -= sum(counts)
        level = new_level
    return Tree.from_parents(parents), tokens, q_at


def model_node_logits(draft, d_cache, base, device):
    """node_logits for a draft model: feeds a level with the tree mask (slots base + index)."""

    def node_logits(tree, tokens, nodes):
        feed = torch.tensor([[tokens[i] for i in nodes]], device=device)        # [1, n]
        return draft(feed, d_cache, tree.positions(nodes, base, device),
                     tree.mask(nodes, base, device))[0]

    return node_logits


def sampler_children(sampler):
    """children_of for the reference's Sampler: greedy top-m (distinct), else m i.i.d. draws."""

    def children_of(logits, m):
        if m > logits.shape[-1]:
            raise ValueError(f"DynamicTree topk must be <= the vocabulary ({logits.shape[-1]}), "
                             f"got a node with {m} children")
        if sampler.greedy:
            return top_tokens(logits, m), torch.softmax(logits.double(), -1)
        q = sampler.probs(logits)
        # i.i.d. with replacement, every sibling from the same q (the proof needs it)
        return [sampler.draw(q) for _ in range(m)], q

    return children_of


def dynamic_tree_generate(target, draft, ids, max_new_tokens, stop, tree="dynamic",
                          temperature=0.0, top_k=0, top_p=1.0, generator=None):
    """Speculative decoding with a dynamic tree per round; ids [P] on the target's device
    (checked by the caller). Greedy at temperature 0, else exact sampling. draft: a model, or a
    chained head (EAGLE, EAGLE-3, MTP: reference/heads/tree.py) fed the target's own features."""
    spec = as_dynamic_tree(tree)
    sampler = Sampler(SamplingParams(temperature, top_k, top_p), generator)
    device = ids.device
    capacity = ids.numel() + max_new_tokens + spec.budget + 1
    t_cache = target.new_cache(1, capacity)
    drafter = (HeadTree(target, draft, t_cache, capacity, sampler, device) if is_head(draft)
               else ModelTree(target, draft, t_cache, capacity, device))
    if ids.numel() > 1:
        drafter.prefill(ids)
    seq = Committed(ids.tolist(), max_new_tokens, stop)
    while not seq.done:
        base = t_cache.length
        shape, grown, q_at = drafter.grow(spec, seq.context, sampler_children(sampler))
        every = list(range(shape.size))
        target_logits = drafter.verify(torch.tensor([grown], device=device),
                                       shape.positions(every, base, device),
                                       shape.mask(every, base, device))              # [size, V]
        if sampler.greedy:
            path, after = greedy_path(shape, grown, target_logits)
        else:
            path, after = sampled_path(shape, grown, q_at, target_logits, sampler)
        drafter.keep(shape, grown, path, base)
        seq.add([grown[i] for i in path] + [after], len(path), shape.depth_max)
    return seq.output, seq.stats()


class ModelTree:
    """A draft model growing the tree: its own cache, fed every level but the deepest."""

    def __init__(self, target, draft, t_cache, capacity, device):
        self.target, self.draft, self.t_cache, self.device = target, draft, t_cache, device
        self.d_cache = draft.new_cache(1, capacity)

    def prefill(self, ids):
        self.target(ids[None, :-1], self.t_cache)
        self.draft(ids[None, :-1], self.d_cache)

    def grow(self, spec, context, children_of):
        node_logits = model_node_logits(self.draft, self.d_cache, self.t_cache.length, self.device)
        return grow(spec, context[-1], node_logits, children_of)

    def verify(self, ids, positions, mask):
        return self.target(ids, self.t_cache, positions, mask)[0]

    def keep(self, shape, grown, path, base):
        keep_path(shape, grown, path, base, self.t_cache, self.draft, self.d_cache, self.device)


class HeadTree:
    """A chained head growing the tree (reference/heads/tree.py): every target forward returns
    the features the head reads; the head's cache holds verified pairs only between rounds."""

    def __init__(self, target, head, t_cache, capacity, sampler, device):
        from reference.heads.tree import TreeHeadProposer
        self.target, self.t_cache = target, t_cache
        self.proposer = TreeHeadProposer(head, capacity, sampler, device)

    def forward(self, ids, positions=None, mask=None):
        logits, features = forward_hidden(self.target, ids, self.t_cache, self.proposer.hidden,
                                          positions, mask)
        self.proposer.saw(features[0])
        return logits[0]

    def prefill(self, ids):
        self.forward(ids[None, :-1])
        self.proposer.prefill(ids)

    def grow(self, spec, context, children_of):
        if not self.proposer.start_round(context):      # no verified feature: the root alone
            return Tree.from_parents([-1]), [context[-1]], {}
        return grow(spec, context[-1], self.proposer.node_logits, children_of)

    def verify(self, ids, positions, mask):
        return self.forward(ids, positions, mask)

    def keep(self, shape, grown, path, base):
        self.t_cache.move([base + i for i in path], base + 1)
        self.t_cache.truncate(base + 1 + len(path))
        self.proposer.commit(path)
