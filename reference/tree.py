"""Greedy tree verification: several candidate continuations checked in one target call.

The draft proposes its top-b tokens at each depth (the chapter's tree: b = 2 at 3 depths,
2 + 4 + 8 = 14 nodes). The block fed to the target is `last` followed by the nodes in
breadth-first order; a node's position is base + its depth and it attends to the committed
prefix and its own ancestors only, so its logits are exactly those the target would give after
that path. The longest path on which every node equals the target's argmax is committed, plus
the target's own token after it, and that path's cache entries are moved into place.
"""

import torch

from reference.sampling import check_logits

CHAPTER_TREE = (2, 2, 2)


def top_tokens(logits, b):
    """The b largest-logit tokens, ties broken by the lowest index (a stable sort)."""
    check_logits(logits)
    return torch.sort(logits, descending=True, stable=True).indices[:b].tolist()


class Tree:
    """Node 0 is `last`; nodes are numbered breadth-first, each with a parent and a depth."""

    def __init__(self, branching):
        if not branching or any(not isinstance(b, int) or b < 1 for b in branching):
            raise ValueError(f"tree branching must be a non-empty sequence of ints >= 1, got {branching!r}")
        self.branching = tuple(branching)
        self.parent, self.depth = [-1], [0]
        frontier = [0]
        for d, b in enumerate(branching, start=1):
            next_frontier = []
            for node in frontier:
                for _ in range(b):
                    self.parent.append(node)
                    self.depth.append(d)
                    next_frontier.append(len(self.parent) - 1)
            frontier = next_frontier
        self.size = len(self.parent)
        # ancestors[i, j]: node j is node i or one of its ancestors.
        self.ancestors = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            self.ancestors[i] |= self.ancestors[self.parent[i]]

    def level(self, d):
        return [i for i in range(self.size) if self.depth[i] == d]

    def mask(self, nodes, base, device):
        """May-attend mask [len(nodes), base + nodes[-1] + 1] for nodes fed after the prefix and
        every earlier node: the whole prefix, then the nodes' ancestors (themselves included)."""
        rows = self.ancestors[nodes][:, : nodes[-1] + 1]
        return torch.cat([torch.ones(len(nodes), base, dtype=torch.bool), rows], 1).to(device)

    def positions(self, nodes, base, device):
        return torch.tensor([[base + self.depth[i] for i in nodes]], device=device)


def tree_generate(target, draft, ids, max_new_tokens, stop, branching=CHAPTER_TREE):
    """Greedy speculative decoding with a token tree; ids [P] on the target's device."""
    tree = Tree(branching)
    depth = len(tree.branching)
    device = ids.device
    capacity = ids.numel() + max_new_tokens + tree.size
    t_cache, d_cache = target.new_cache(1, capacity), draft.new_cache(1, capacity)
    if ids.numel() > 1:
        target(ids[None, :-1], t_cache)
        draft(ids[None, :-1], d_cache)
    last = int(ids[-1])
    output, rounds, accepted_total = [], 0, 0
    while len(output) < max_new_tokens:
        rounds += 1
        base = t_cache.length
        tokens = [last] + [0] * (tree.size - 1)
        # Draft: one forward per depth over that depth's nodes; children are its top-b tokens.
        for d in range(depth):
            nodes = tree.level(d)
            feed = torch.tensor([[tokens[i] for i in nodes]], device=device)
            logits = draft(feed, d_cache, tree.positions(nodes, base, device),
                           tree.mask(nodes, base, device))[0]
            children = tree.level(d + 1)
            for row, node in enumerate(nodes):
                kids = [c for c in children if tree.parent[c] == node]
                for child, token in zip(kids, top_tokens(logits[row], tree.branching[d])):
                    tokens[child] = token
        # Target: every node in one forward.
        every = list(range(tree.size))
        target_logits = target(torch.tensor([tokens], device=device), t_cache,
                               tree.positions(every, base, device), tree.mask(every, base, device))[0]
        path, node = [], 0
        while True:
            choice = int(target_logits[node].argmax())
            match = [c for c in range(tree.size) if tree.parent[c] == node and tokens[c] == choice]
            if not match:
                break
            node = match[0]
            path.append(node)
        new_tokens = [tokens[i] for i in path] + [choice]
        accepted_total += len(path)
        # Keep `last` and the accepted path, contiguous after the prefix. The draft never fed
        # the leaves, so a path that reaches full depth leaves one token for the draft to feed.
        t_cache.move([base + i for i in path], base + 1)
        t_cache.truncate(base + 1 + len(path))
        fed = [i for i in path if tree.depth[i] < depth]
        d_cache.move([base + i for i in fed], base + 1)
        d_cache.truncate(base + 1 + len(fed))
        if len(fed) < len(path):
            draft(torch.tensor([[tokens[path[-1]]]], device=device), d_cache)
        for token in new_tokens:
            output.append(token)
            if token in stop or len(output) == max_new_tokens:
                return output, _tree_stats(output, rounds, accepted_total, depth)
        last = new_tokens[-1]
    return output, _tree_stats(output, rounds, accepted_total, depth)


def _tree_stats(output, rounds, accepted_total, depth):
    # A round can accept at most `depth` proposals (one per level), so that is what it proposed.
    return {"rounds": rounds,
            "acceptance_rate": accepted_total / (rounds * depth) if rounds else 0.0,
            "tokens_per_target_call": len(output) / rounds if rounds else 0.0}
