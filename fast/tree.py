"""Tree verification: many candidate continuations, one target call per round; greedy or exact
sampling, vectorized over rows and the tree.

Shape: tree[d] is the branching factor at depth d + 1. (2, 2, 2) is the chapter's
2 + 4 + 8 = 14 nodes. Nodes are numbered breadth-first after the root (`last`, index 0), so
each level is a contiguous range and the children of a node are contiguous, in parent order.

One round (vectorized over rows):
1. the draft builds the tree level by level: one draft step per level feeds that level's nodes
   with the tree mask (each node sees the committed prefix and its own ancestors) and gives
   each node its children: greedy, the draft's top-b tokens (distinct); sampling, b i.i.d.
   draws from the draft's filtered distribution q at that node (with replacement);
2. the target scores root + all nodes in ONE call: slots length + index, positions
   length + depth, visibility = ancestor-or-self matrix;
3. the accepted path:
   greedy: a node is accepted when its token equals the target's argmax at its parent and its
     parent is accepted (siblings are distinct, so the accepted nodes form one path); the
     target's argmax at the path's end is the corrected or bonus token;
   sampling: from the root down, each node tries its children in turn with recursive rejection
     (accept child x with probability min(1, r(x) / q(x)), r = p at first; on rejection
     r <- normalized max(r - q, 0)); the first accepted child continues the path; when every
     child is rejected the round's last token is drawn from r, and after a leaf from p there.
     With children i.i.d. from an unchanged q this commits each token exactly with the
     target's law (the proof is in reference/tree.py's docstring);
4. both caches' entries for the path are moved to slots length + 1, length + 2, ... so each
   cache again holds the committed sequence in order.

The draft never feeds the deepest level; when a whole path to a leaf is accepted its cache is
one entry short, which the next round's catch-up step (fast/drafter.py) repairs.
"""

import torch

from fast.sampling import draw


class TreeShape:
    def __init__(self, branching, device):
        self.branching = tuple(branching)
        parent, depth, levels = [-1], [0], []
        first_child = []
        previous = [0]
        for d, b in enumerate(self.branching, start=1):
            level = []
            for p in previous:
                first_child.append(len(parent))            # p's children start here
                for _ in range(b):
                    parent.append(p)
                    depth.append(d)
                    level.append(len(parent) - 1)
            levels.append((level[0], level[-1] + 1))
            previous = level
        size = len(parent)                     # root + nodes
        inner = len(first_child)               # nodes with children: 0 .. inner - 1 (BFS)
        # Built as lists, then one tensor each: element-wise tensor writes cost microseconds
        # apiece, and a shape is built on every call of the eager engine.
        ancestors = [[False] * size for _ in range(size)]
        path = [[0] * (len(self.branching) + 1) for _ in range(size)]
        for i in range(size):
            j = i
            while j >= 0:
                ancestors[i][j] = True
                path[i][depth[j]] = j
                j = parent[j]
            for d in range(depth[i] + 1, len(self.branching) + 1):
                path[i][d] = i                 # past a node's depth: itself (moved, then dead)
        self.size, self.inner, self.depth_max, self.levels = size, inner, len(self.branching), levels
        self.parent = torch.tensor([max(p, 0) for p in parent], device=device)     # [size]
        self.depth = torch.tensor(depth, device=device)                          # [size]
        self.first_child = torch.tensor(first_child + [0] * (size - inner), device=device)  # [size]
        self.ancestors = torch.tensor(ancestors, dtype=torch.bool, device=device)  # [size, size]
        self.path = torch.tensor(path, dtype=torch.long, device=device)          # [size, D + 1]


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


def children(logits, b: int, sampler, row_ids):
    """Each node's b children: logits [B, n, V] -> (tokens [B, n * b], q [B, n, V] or None).

    Greedy: the top-b tokens. Sampling: b i.i.d. draws from q per node, every one from the
    same q (the exactness proof needs q unchanged for every sibling)."""
    B, n, V = logits.shape
    if sampler.greedy:
        return logits.topk(b, dim=-1).indices.reshape(B, n * b), None
    q = sampler.probs(logits)                                                  # [B, n, V]
    u = sampler.uniforms(row_ids, n * b)                                       # [B, n * b]
    weights = q.repeat_interleave(b, dim=1).reshape(B * n * b, V)              # child order
    return draw(weights, u.reshape(-1)).view(B, n * b), q


def greedy_path(shape: TreeShape, ids, logits):
    """ids [B, size], logits [B, size, V] -> (deepest accepted node [B], correction [B])."""
    choice = logits.argmax(-1)                                                 # [B, size]
    match = ids == choice[:, shape.parent]                                     # [B, size]
    match[:, 0] = True                                                         # the root is committed
    ok = ~(shape.ancestors[None] & ~match[:, None, :]).any(-1)                 # [B, size]
    best = torch.where(ok, shape.depth, -1).argmax(1)                          # [B] deepest accepted
    return best, choice.gather(1, best[:, None])[:, 0]


def sampled_path(shape: TreeShape, ids, p, q, u_accept, u_draw):
    """Recursive rejection from the root down, for every row at once.

    ids [B, size]; p [B, size, V] the target's distributions; q [B, inner, V] the draft's at
    each inner node (its children's law); u_accept [B, D, b_max], u_draw [B] uniforms.
    Returns (deepest accepted node [B], the round's last token [B]).
    """
    B = ids.shape[0]
    rows = torch.arange(B, device=ids.device)
    node = torch.zeros(B, dtype=torch.long, device=ids.device)                 # [B] path's end
    alive = torch.ones(B, dtype=torch.bool, device=ids.device)                 # still descending
    final = p[:, 0]                                                            # [B, V] last draw's law
    for d, b in enumerate(shape.branching):
        r = p[rows, node]                                                      # [B, V]
        q_node = q[rows, node]                                                 # [B, V]
        first = shape.first_child[node]                                        # [B]
        chosen = torch.full_like(node, -1)                                     # [B] accepted child
        for j in range(b):
            child = first + j
            x = ids.gather(1, child[:, None])                                  # [B, 1]
            take = (chosen < 0) & (u_accept[:, d, j] * q_node.gather(1, x)[:, 0]
                                   < r.gather(1, x)[:, 0])
            chosen = torch.where(take, child, chosen)
            # On rejection the residual is carried to the next sibling (and to the last draw).
            rest = (r - q_node).clamp_min(0)
            total = rest.sum(-1, keepdim=True)
            # An empty residual means r == q to rounding, where rejection has probability 0.
            rest = torch.where(total > 0, rest / torch.where(total > 0, total, 1), r)
            r = torch.where((chosen < 0)[:, None], rest, r)
        ends_here = alive & (chosen < 0)
        final = torch.where(ends_here[:, None], r, final)
        alive = alive & (chosen >= 0)
        node = torch.where(alive, chosen, node)
    # A row still alive accepted a leaf: its last token is the target's, drawn from p there.
    final = torch.where(alive[:, None], p[rows, node], final)
    return node, draw(final, u_draw)


def tree_round(engine, shape: TreeShape, sampler):
    """The round function for FastEngine._loop: draft a tree, verify it, keep the path."""
    draft = engine.drafter.runner
    target = engine.target
    b_max = max(shape.branching)

    def one_round(rows, lengths, bound):
        B = rows.last.shape[0]
        # Root step: the draft feeds last (with catch-up, [prev, last]) and scores its next tokens.
        if engine.drafter.catch_up:
            start = (lengths - 1).clamp(min=0)      # 0 only for a dead row (see fast/drafter.py)
            logits = draft.chain(torch.stack([rows.prev, rows.last], 1), start, bound, "last")
        else:
            logits = draft.chain(rows.last[:, None], lengths, bound, "last")       # [B, V]
        tokens, q = children(logits[:, None], shape.branching[0], sampler, rows.row_ids)
        levels, dists = [tokens], [q]
        for d in range(1, shape.depth_max):
            first, end = shape.levels[d - 1]
            index = torch.arange(first, end, device=lengths.device)                # this level
            slots = lengths[:, None] + index                                       # [B, n_d]
            positions = lengths[:, None] + d
            logits = draft.tree(levels[-1], slots, positions.expand_as(slots), lengths,
                                shape.ancestors[first:end], f"{shape.branching}/level{d}",
                                bound)                                             # [B, n_d, V]
            tokens, q = children(logits, shape.branching[d], sampler, rows.row_ids)
            levels.append(tokens)
            dists.append(q)
        ids = torch.cat([rows.last[:, None]] + levels, 1)                          # [B, size]
        slots = lengths[:, None] + torch.arange(shape.size, device=lengths.device)
        positions = lengths[:, None] + shape.depth
        logits = target.tree(ids, slots, positions, lengths, shape.ancestors,
                             f"{shape.branching}/verify", bound)                   # [B, size, V]
        if sampler.greedy:
            best, correction = greedy_path(shape, ids, logits)
        else:
            u = sampler.uniforms(rows.row_ids, shape.depth_max * b_max + 1)        # [B, D*b+1]
            u_accept = u[:, :-1].view(B, shape.depth_max, b_max)
            best, correction = sampled_path(shape, ids, sampler.probs(logits),
                                            torch.cat(dists, 1), u_accept, u[:, -1])
        accepted = shape.depth[best]                                               # [B]
        path = shape.path[best]                                                    # [B, D + 1]
        sources = lengths[:, None] + path[:, 1:]                                   # [B, D]
        target.cache.move(B, sources, lengths + 1)
        draft.cache.move(B, sources, lengths + 1)
        padded = torch.cat([ids.gather(1, path[:, 1:]), correction[:, None]], 1)   # [B, D + 1]
        position = torch.arange(shape.depth_max + 1, device=lengths.device)
        block = torch.where(position[None] < accepted[:, None], padded, correction[:, None])
        return accepted, block

    return one_round


def generate_tree(engine, prompts, max_new_tokens, tree, stop_ids=(), **sampling):
    """Tree speculation for a batch on a FastEngine: engine.generate_tree, for callers that
    hold an engine and a tree (keywords: temperature, generator, top_k, top_p)."""
    return engine.generate_tree(prompts, max_new_tokens, tree, stop_ids, **sampling)
