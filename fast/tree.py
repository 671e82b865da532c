"""Greedy tree verification: many candidate continuations, one target call per round.

Shape: tree[d] is the branching factor at depth d + 1. The draft takes its top tree[0] tokens
after `last`, then the top tree[1] after each of those, and so on; (2, 2, 2) is the chapter's
2 + 4 + 8 = 14 nodes. Nodes are numbered breadth-first after the root (`last`, index 0), so
each level is a contiguous range and the children of a level-d node come in parent order.

One round (vectorized over rows):
1. the draft builds the tree level by level: one draft step per level feeds that level's nodes
   with the tree mask (each node sees the committed prefix and its own ancestors) and expands
   each into its top-b children;
2. the target scores root + all nodes in ONE call: slots length + index, positions
   length + depth, visibility = ancestor-or-self matrix;
3. a node is accepted when its token equals the target's argmax at its parent and its parent
   is accepted; the deepest accepted node ends the accepted path (siblings are distinct tokens,
   so at most one child of a node matches and the accepted nodes form one path);
4. both caches' entries for the path are moved to slots length + 1, length + 2, ... so each
   cache again holds the committed sequence in order; the target's argmax at the path's end is
   the corrected or bonus token.
Every committed token is the target's argmax after the committed prefix: tree == chain ==
target greedy.

The draft never feeds the deepest level; when a whole path to a leaf is accepted its cache is
one entry short, which the next round's catch-up step (fast/drafter.py) repairs.
"""

import torch

from fast import checks


class TreeShape:
    def __init__(self, branching, device):
        self.branching = tuple(branching)
        parent, depth, levels = [-1], [0], []
        previous = [0]
        for d, b in enumerate(self.branching, start=1):
            level = []
            for p in previous:
                for _ in range(b):
                    parent.append(p)
                    depth.append(d)
                    level.append(len(parent) - 1)
            levels.append((level[0], level[-1] + 1))
            previous = level
        size = len(parent)                     # root + nodes
        ancestors = torch.zeros(size, size, dtype=torch.bool)
        path = torch.zeros(size, len(self.branching) + 1, dtype=torch.long)
        for i in range(size):
            j = i
            while j >= 0:
                ancestors[i, j] = True
                path[i, depth[j]] = j
                j = parent[j]
            path[i, depth[i] + 1:] = i         # past a node's depth: itself (moved, then dead)
        self.size, self.depth_max, self.levels = size, len(self.branching), levels
        self.parent = torch.tensor([max(p, 0) for p in parent], device=device)     # [size]
        self.depth = torch.tensor(depth, device=device)                          # [size]
        self.ancestors = ancestors.to(device)                                    # [size, size]
        self.path = path.to(device)                                              # [size, D + 1]


def check_tree(tree, vocab_size: int) -> tuple:
    if isinstance(tree, int) or not isinstance(tree, (tuple, list)) or len(tree) == 0:
        raise ValueError(f"tree must be a non-empty tuple of branching factors, got {tree!r}")
    for b in tree:
        if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= vocab_size:
            raise ValueError(f"tree branching factors must be ints in [1, {vocab_size}], got {b!r} "
                             f"in tree={tuple(tree)!r}")
    size, level = 1, 1
    for b in tree:
        level *= b
        size += level
        if size > 4096:
            raise ValueError(f"tree={tuple(tree)!r} has more than 4096 nodes")
    return tuple(tree)


def tree_round(engine, shape: TreeShape):
    """The round function for FastEngine._loop: draft a tree, verify it, keep the path."""
    draft = engine.drafter.runner
    target = engine.target

    def one_round(rows, lengths, bound):
        B = rows.last.shape[0]
        # Root step: the draft feeds last (with catch-up, [prev, last]) and ranks its next tokens.
        if engine.drafter.catch_up:
            start = (lengths - 1).clamp(min=0)      # 0 only for a dead row (see fast/drafter.py)
            logits = draft.chain(torch.stack([rows.prev, rows.last], 1), start, bound, "last")
        else:
            logits = draft.chain(rows.last[:, None], lengths, bound, "last")       # [B, V]
        tokens = logits.topk(shape.branching[0], dim=-1).indices                   # [B, b1]
        levels = [tokens]
        for d in range(1, shape.depth_max):
            first, end = shape.levels[d - 1]
            index = torch.arange(first, end, device=lengths.device)                # this level
            slots = lengths[:, None] + index                                       # [B, n_d]
            positions = lengths[:, None] + d
            logits = draft.tree(levels[-1], slots, positions.expand_as(slots), lengths,
                                shape.ancestors[first:end], f"{shape.branching}/level{d}",
                                bound)                                             # [B, n_d, V]
            children = logits.topk(shape.branching[d], dim=-1).indices             # [B, n_d, b]
            levels.append(children.reshape(B, -1))
        ids = torch.cat([rows.last[:, None]] + levels, 1)                          # [B, size]
        slots = lengths[:, None] + torch.arange(shape.size, device=lengths.device)
        positions = lengths[:, None] + shape.depth
        logits = target.tree(ids, slots, positions, lengths, shape.ancestors,
                             f"{shape.branching}/verify", bound)
        choice = logits.argmax(-1)                                                 # [B, size]
        match = ids == choice[:, shape.parent]                                     # [B, size]
        match[:, 0] = True                                                         # the root is committed
        ok = ~(shape.ancestors[None] & ~match[:, None, :]).any(-1)                 # [B, size]
        best = torch.where(ok, shape.depth, -1).argmax(1)                          # [B] deepest accepted
        accepted = shape.depth[best]                                               # [B]
        path = shape.path[best]                                                    # [B, D + 1]
        sources = lengths[:, None] + path[:, 1:]                                   # [B, D]
        target.cache.move(B, sources, lengths + 1)
        draft.cache.move(B, sources, lengths + 1)
        correction = choice.gather(1, best[:, None])                               # [B, 1]
        padded = torch.cat([ids.gather(1, path[:, 1:]), correction], 1)            # [B, D + 1]
        position = torch.arange(shape.depth_max + 1, device=lengths.device)
        block = torch.where(position[None] < accepted[:, None], padded, correction)
        return accepted, block

    return one_round


def generate_tree(engine, prompts, max_new_tokens, tree, stop_ids=()):
    """Greedy tree speculation for a batch on a FastEngine with a model draft."""
    if not hasattr(engine.drafter, "runner"):
        raise ValueError("draft must be a Qwen3-family model for tree verification, got a "
                         f"{type(engine.drafter).__name__} drafter")
    tree = check_tree(tree, engine.vocab_size)
    prompts, max_new, stops = engine._check_batch(prompts, max_new_tokens, stop_ids)
    shape = TreeShape(tree, engine.device)
    checks.check_room(prompts, max_new, shape.size, engine.capacity, "tree", tree)
    with torch.no_grad():
        return engine._loop(prompts, max_new, stops, shape.size, shape.depth_max,
                            tree_round(engine, shape))
