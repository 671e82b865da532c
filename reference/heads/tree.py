"""A chained head (EAGLE, EAGLE-3, MTP) drawing a dynamic tree: EAGLE-2's drafting.

reference.dynamic_tree.grow asks the drafter for its logits one level of nodes at a time. A
chained head's logits at a node come from the pair (g, t): the node's token t and g, the head's
output at the node's parent -- its guess of the target's feature there, exactly as in a chain,
where proposal i + 1 is read from the pair (head output at proposal i, proposal i + 1). So a
path of the tree is drafted as the chain of its tokens would be, and a tree of one child per
level is the chain (tests/test_reference_head_tree.py checks both).

The root is the round's newest token t_n. Its pair is the last verified one, (f_{n-1}, t_n),
fed with the other verified pairs the last round committed, as ChainHeadProposer feeds them:
the root's logits are the chain's first proposal's law.

Slots: the head's cache holds pair j at slot j + lead (reference.heads.base.lead_pairs), which
is also its position. With the root pair at slot r = n - 1 + lead, tree node i sits at slot
r + i and position r + depth(i), and sees every verified pair before r and its own ancestors,
the root included: reference.tree.Tree's mask and positions with base r, as the target's own
verify uses them with base = its cache length. Levels are contiguous in node order and fed in
order, so the cache's length is r + (the level's first node) whenever a level is fed.

After the target's verify of the tree, the committed tokens are the root and the accepted
path: their target features (rows [0] + path of the verify) become verified, and the head's
cache goes back to the verified pairs (slots <= r): the pairs of tree nodes were built on the
head's own outputs, and the next round rebuilds the path's pairs from the target's features.

A round with no verified feature (a one-token prompt's first) grows no tree: the target
verifies the root alone, as the chain proposer proposes nothing there.
"""

import torch

from reference.heads.base import lead_pairs, with_lead
from reference.heads.dflash import DFlashHead
from reference.heads.medusa import MedusaHeads
from reference.heads.verified import Verified
from reference.tree import Tree


def check_tree_head(head) -> None:
    """A tree needs a head whose pairs chain (EAGLE, EAGLE-3, MTP): Medusa reads one feature per
    round and DFlash/DSpark draft a whole block in one pass, so neither has a law at a node."""
    if isinstance(head, (MedusaHeads, DFlashHead)):
        raise ValueError(f"a dynamic tree needs a chained head (EAGLE, EAGLE-3, MTP): a "
                         f"{type(head).__name__} has no law at a tree node past its first level")


class TreeHeadProposer(Verified):
    """node_logits for reference.dynamic_tree.grow from a chained head (module docstring)."""

    def __init__(self, head, capacity, sampler, device):
        check_tree_head(head)
        super().__init__(head, sampler, device)
        self.lead = lead_pairs(head)
        self.cache = head.new_cache(capacity + self.lead)
        self.root = None      # the root pair's slot r this round, None when no tree is grown
        self.g = {}           # node -> the head's output g there [1, H]

    def start_round(self, context) -> bool:
        """Feed the verified pairs not yet fed; False when no tree can be grown (no verified
        feature). The root's logits and g are kept for node_logits."""
        n = len(context) - 1
        if self.verified(context) == 0:
            self.root = None
            return False
        start = self.cache.length - self.lead                             # -1: the lead pair
        h = with_lead(self.head, self.head.start(self.feature_rows(max(start, 0), n)[None]),
                      start)                                              # [1, n - start, H]
        tokens = torch.tensor([context[start + 1:n + 1]], device=self.device)  # [1, n - start]
        logits, g = self.head(tokens, h, self.cache)                      # [1, T, Vd], [1, T, H]
        self.root = self.cache.length - 1                                 # r = n - 1 + lead
        self.root_logits, self.g = self.placed(logits[0, -1:]), {0: g[0, -1:]}
        return True

    def placed(self, logits):
        """The head's logits [n, Vd] on the target's vocabulary [n, V]: -inf outside a draft
        vocabulary (d2t), so a child is a target token and q has no mass outside the map
        (reference/heads/eagle3.py says why that stays exact)."""
        d2t = getattr(self.head, "draft_to_target", None)
        if d2t is None:
            return logits
        out = logits.new_full((logits.shape[0], self.head.config.vocab_size), float("-inf"))
        out[:, d2t] = logits
        return out

    def node_logits(self, tree: Tree, tokens, nodes):
        """The head's logits [len(nodes), V] at a level of nodes (the root: from start_round)."""
        if nodes == [0]:
            return self.root_logits
        if self.cache.length != self.root + nodes[0]:
            raise RuntimeError(f"TreeHeadProposer: level {nodes[0]}..{nodes[-1]} fed at cache "
                               f"length {self.cache.length}, expected {self.root + nodes[0]}")
        h = torch.cat([self.g[int(tree.parent[i])] for i in nodes])[None]    # [1, n, H]
        feed = torch.tensor([[tokens[i] for i in nodes]], device=self.device)   # [1, n]
        logits, g = self.head(feed, h, self.cache, tree.positions(nodes, self.root, self.device),
                              tree.mask(nodes, self.root, self.device))
        self.g.update((i, g[0, j:j + 1]) for j, i in enumerate(nodes))
        return self.placed(logits[0])

    def commit(self, path) -> None:
        """The target's verify covered every node; the root and the accepted path are committed."""
        self.seen = self.seen[[0] + list(path)]
        self.keep(len(path))
        if self.root is not None:
            self.cache.truncate(self.root + 1)
