"""Dynamic trees on the fast engine: each row grows its own tree every round, where its draft is
confident; one target call verifies every row's tree.

The rule is reference/dynamic_tree.py's (DynamicTree(depth, topk, budget); its docstring holds
the exactness argument): a node's confidence is the product of the draft's probabilities along
its path; level d + 1 expands the topk most confident nodes of level d (ties: lower index), in
rank order, each with min(topk, budget left) children; greedy children are the draft's top
tokens (distinct), sampled children i.i.d. draws from q (with replacement). How many nodes each
level holds, and how many children each RANK gets, follow from (depth, topk, budget) alone, so
every row has the same number of nodes N = 1 + sum(level sizes) at the same slots and depths;
only each row's parents differ (which nodes its ranks are). Nothing is padded but per-row
tensors: parent [B, N], ancestors [B, N, N] (the tree mask, per row), first_child and
n_children [B, N] (a node's children are contiguous: they were made together).

One round:
1. root step: the draft feeds `last` (with catch-up, [prev, last]) -> logits at the root;
2. per level: rank the level's nodes by confidence (draft only, before any child of the level
   is drawn), make the children of the ranked nodes, then (below the deepest level) the draft
   feeds the new level with each row's own ancestor mask;
3. the target scores all N nodes of every row in ONE call (per-row mask, positions length +
   depth);
4. greedy: the deepest node whose every ancestor matches the target's argmax at its parent;
   sampling: recursive rejection from the root down, a node's children tried in turn
   (fast/tree.py's rule, with per-row child ranges);
5. both caches' entries along the path move to slots length + 1, ... (fast/tree.py's step).
"""

from __future__ import annotations

import torch

from fast.forward import forward
from fast.sampling import device_generator, draw
from fast.tree import children
from reference.dynamic_tree import DynamicTree, as_dynamic_tree


def check_dynamic_tree(tree, vocab_size: int) -> DynamicTree:
    spec = as_dynamic_tree(tree)
    if spec.topk > vocab_size:
        raise ValueError(f"DynamicTree topk must be <= the vocabulary ({vocab_size}), got "
                         f"topk={spec.topk} in tree={spec!r}")
    return spec


def is_dynamic(tree) -> bool:
    return isinstance(tree, DynamicTree) or (isinstance(tree, str) and tree == "dynamic")


class Layout:
    """The slots every row shares: level sizes, depth per slot, and per level the children
    count of each rank (reference.dynamic_tree.DynamicTree.children_counts)."""

    def __init__(self, spec: DynamicTree, device):
        self.spec = spec
        self.levels, self.counts = [], []          # levels: (start, end) slots of level d + 1
        start, frontier, left = 1, 1, spec.budget
        for _ in range(spec.depth):
            counts = spec.children_counts(frontier, left)
            if not counts:
                break
            n = sum(counts)
            self.levels.append((start, start + n))
            self.counts.append(counts)
            start, frontier, left = start + n, n, left - n
        self.size = start                           # N: the root and every node
        self.depth_max = len(self.levels)
        depth = [0] + [d + 1 for d, (a, b) in enumerate(self.levels) for _ in range(a, b)]
        self.depth = torch.tensor(depth, device=device)                          # [N]


def rows_window_mask(window_start, visibility, span):
    """Mask [B, T, span] (True = may attend): the row's prefix, then its own visibility
    [B, T, W] over the W slots from window_start [B] (fast.forward.window_mask, per row)."""
    B, T, W = visibility.shape
    slots = torch.arange(span, device=window_start.device)
    relative = slots[None, :] - window_start[:, None]                    # [B, span]
    prefix = relative < 0
    inside = (relative >= 0) & (relative < W)
    seen = visibility.gather(2, relative.clamp(0, W - 1)[:, None, :].expand(B, T, span))
    return prefix[:, None, :] | (inside[:, None, :] & seen)             # [B, T, span]


def rows_tree(runner, ids, slots, positions, window_start, visibility, bound, name,
              states=None):
    """runner.tree with a visibility per row [B, T, W]: ids [B, T] -> logits [B, T, V]; with
    residual-state indices `states` (a head drafting, fast/head.py), (logits, features
    [B, T, n * hidden])."""
    B, T = ids.shape
    span = runner.span(bound)

    def step(ids, slots, positions, window_start, visibility):
        mask = rows_window_mask(window_start, visibility, span)
        out = forward(runner.weights, runner.cache, ids, slots, positions, mask, span, "all",
                      runner.rotary, states)
        # a captured step has one static output tensor: logits and features side by side
        return out if states is None else torch.cat(out, -1)

    out = runner.steps(("rows-tree", id(runner), name, B, T, visibility.shape[-1], span, states),
                       step, ids, slots, positions, window_start, visibility.contiguous())
    if states is None:
        return out
    V = runner.weights.shape.vocab_size
    return out[..., :V], out[..., V:]


def greedy_path(depth, parent, ancestors, ids, logits):
    """depth [N], parent [B, N], ancestors [B, N, N], ids [B, N], logits [B, N, V] ->
    (deepest accepted node [B], the target's argmax there [B])."""
    choice = logits.argmax(-1)                                           # [B, N]
    match = ids == choice.gather(1, parent)                              # [B, N]
    match[:, 0] = True                                                   # the root is committed
    ok = ~(ancestors & ~match[:, None, :]).any(-1)                       # [B, N]
    best = torch.where(ok, depth, -1).argmax(1)                          # [B]
    return best, choice.gather(1, best[:, None])[:, 0]


def sampled_path(layout, first_child, n_children, ids, p, q, u_accept, u_draw):
    """Recursive rejection from the root down, every row at once (fast.tree.sampled_path with
    per-row child ranges). first_child, n_children [B, N]; p [B, N, V] the target's law at each
    node; q [B, N, V] the draft's at each expanded node (its children's law); u_accept
    [B, D, topk], u_draw [B]. Returns (deepest accepted node [B], the round's last token [B])."""
    B = ids.shape[0]
    rows = torch.arange(B, device=ids.device)
    node = torch.zeros(B, dtype=torch.long, device=ids.device)           # [B] path's end
    alive = torch.ones(B, dtype=torch.bool, device=ids.device)
    final = p[:, 0]                                                      # [B, V]
    for d in range(layout.depth_max):
        r = p[rows, node]                                                # [B, V]
        q_node = q[rows, node]                                           # [B, V]
        first, count = first_child[rows, node], n_children[rows, node]   # [B], [B]
        chosen = torch.full_like(node, -1)
        for j in range(layout.spec.topk):
            child = (first + j).clamp(max=layout.size - 1)
            exists = j < count                                           # [B]
            x = ids.gather(1, child[:, None])                            # [B, 1]
            take = exists & (chosen < 0) & (u_accept[:, d, j] * q_node.gather(1, x)[:, 0]
                                            < r.gather(1, x)[:, 0])
            chosen = torch.where(take, child, chosen)
            # A rejected child carries the residual to its next sibling (and the last draw).
            rest = (r - q_node).clamp_min(0)
            total = rest.sum(-1, keepdim=True)
            rest = torch.where(total > 0, rest / torch.where(total > 0, total, 1), r)
            r = torch.where((exists & (chosen < 0))[:, None], rest, r)
        ends_here = alive & (chosen < 0)     # every child rejected, or none (then r is p)
        final = torch.where(ends_here[:, None], r, final)
        alive = alive & (chosen >= 0)
        node = torch.where(alive, chosen, node)
    final = torch.where(alive[:, None], p[rows, node], final)           # after a leaf: p there
    return node, draw(final, u_draw)


class ModelLevels:
    """A draft model's part of a round: its root step (with the catch-up of fast/drafter.py),
    a forward per level with each row's ancestor mask, and the path moved in its cache as in
    the target's. fast.head.HeadDrafter has the same four members for a head's tree."""

    def __init__(self, drafter, name):
        self.drafter, self.runner, self.name = drafter, drafter.runner, name

    def tree_root(self, rows, lengths, bound, size):
        if self.drafter.catch_up:
            start = (lengths - 1).clamp(min=0)      # 0 only for a dead row (see fast/drafter.py)
            return self.runner.chain(torch.stack([rows.prev, rows.last], 1), start, bound, "last")
        return self.runner.chain(rows.last[:, None], lengths, bound, "last")  # [B, V]

    def tree_level(self, ids, parent, lengths, depth, ancestors, bound, start):
        slots = lengths[:, None] + torch.arange(start, start + ids.shape[1], device=ids.device)
        return rows_tree(self.runner, ids, slots, (lengths[:, None] + depth).expand_as(slots),
                         lengths, ancestors, bound, f"{self.name}/level{depth}")

    def tree_keep(self, features, path, ids, lengths):
        B, sources = path.shape[0], lengths[:, None] + path[:, 1:]
        self.runner.cache.move(B, sources, lengths + 1)


def tree_drafter(engine, name):
    """What grows the round's trees: the engine's head (fast/head.py, fast/mtp.py) or its draft
    model."""
    if getattr(engine.drafter, "grows_trees", False):
        return engine.drafter
    return ModelLevels(engine.drafter, name)


def dynamic_round(engine, layout: Layout, sampler):
    """The round function for FastEngine._loop: grow each row's tree, verify, keep the path."""
    target = engine.target
    spec, N, D = layout.spec, layout.size, layout.depth_max
    name = f"dynamic{(spec.depth, spec.topk, spec.budget)}"
    draft = tree_drafter(engine, name)

    def one_round(rows, lengths, bound):
        B, device = rows.last.shape[0], lengths.device
        logits = draft.tree_root(rows, lengths, bound, N)[:, None]      # [B, 1, V] the root level
        ids = torch.zeros(B, N, dtype=torch.long, device=device)        # [B, N] node tokens
        ids[:, 0] = rows.last
        parent = torch.zeros(B, N, dtype=torch.long, device=device)     # [B, N] (root: itself)
        confidence = torch.zeros(B, N, dtype=torch.float64, device=device)
        confidence[:, 0] = 1.0
        ancestors = torch.eye(N, dtype=torch.bool, device=device).repeat(B, 1, 1)  # [B, N, N]
        first_child = torch.zeros(B, N, dtype=torch.long, device=device)
        n_children = torch.zeros(B, N, dtype=torch.long, device=device)
        q_all = None                                                    # [B, N, V], sampling
        level_start, level_end = 0, 1
        for d, ((start, end), counts) in enumerate(zip(layout.levels, layout.counts)):
            # Rank this level by confidence: known before any of its children is drawn (the
            # shape depends on the draft only; reference/dynamic_tree.py's proof obligation).
            order = torch.sort(-confidence[:, level_start:level_end], dim=1, stable=True).indices
            ranked = order[:, :len(counts)]                             # [B, e] level-local
            chosen_logits = logits.gather(1, ranked[:, :, None].expand(-1, -1, logits.shape[-1]))
            kids, q = children(chosen_logits, spec.topk, sampler, rows.row_ids)  # [B, e*topk]
            law = (torch.softmax(chosen_logits.double(), -1) if q is None else q)  # [B, e, V]
            nodes = level_start + ranked                                # [B, e] node indices
            offset = start
            for r, m in enumerate(counts):
                node = nodes[:, r]                                      # [B]
                slots = slice(offset, offset + m)
                # the first m of the rank's topk children: top-m greedy; i.i.d. draws sampling
                ids[:, slots] = kids[:, r * spec.topk: r * spec.topk + m]
                parent[:, slots] = node[:, None]
                confidence[:, slots] = (confidence.gather(1, node[:, None])
                                        * law[:, r].gather(1, ids[:, slots]))
                ancestors[:, slots] = ancestors[torch.arange(B, device=device), node][:, None]
                first_child[torch.arange(B, device=device), node] = offset
                n_children[torch.arange(B, device=device), node] = m
                offset += m
            ancestors[:, start:end, start:end] |= torch.eye(end - start, dtype=torch.bool,
                                                            device=device)
            if q is not None:
                if q_all is None:
                    q_all = torch.zeros(B, N, q.shape[-1], dtype=q.dtype, device=device)
                q_all.scatter_(1, nodes[:, :, None].expand(-1, -1, q.shape[-1]), q)
            if d + 1 < D:   # the deepest level is never fed to the draft
                logits = draft.tree_level(ids[:, start:end], parent[:, start:end], lengths,
                                          d + 1, ancestors[:, start:end], bound, start)
            level_start, level_end = start, end
        slots = lengths[:, None] + torch.arange(N, device=device)
        positions = lengths[:, None] + layout.depth
        logits = rows_tree(target, ids, slots, positions, lengths, ancestors, bound,
                           f"{name}/verify", engine.states)             # [B, N, V]
        features = None
        if engine.states is not None:   # the head's next verified pairs (fast/head.py)
            logits, features = logits
        if sampler.greedy:
            best, correction = greedy_path(layout.depth, parent, ancestors, ids, logits)
        else:
            u = sampler.uniforms(rows.row_ids, D * spec.topk + 1)       # [B, D*topk + 1]
            best, correction = sampled_path(layout, first_child, n_children, ids,
                                            sampler.probs(logits), q_all,
                                            u[:, :-1].view(B, D, spec.topk), u[:, -1])
        accepted = layout.depth[best]                                   # [B]
        # The path by depth: best's ancestor at each depth (past best's depth: best itself).
        on_path = ancestors[torch.arange(B, device=device), best]       # [B, N]
        at_depth = on_path[:, None, :] & (layout.depth[None, None, :]
                                          == torch.arange(D + 1, device=device)[None, :, None])
        path = torch.where(at_depth.any(-1), at_depth.to(torch.int8).argmax(-1),
                           best[:, None])                               # [B, D + 1]
        target.cache.move(B, lengths[:, None] + path[:, 1:], lengths + 1)
        draft.tree_keep(features, path, ids, lengths)
        padded = torch.cat([ids.gather(1, path[:, 1:]), correction[:, None]], 1)  # [B, D + 1]
        position = torch.arange(D + 1, device=device)
        block = torch.where(position[None] < accepted[:, None], padded, correction[:, None])
        return accepted, block

    return one_round


def generate_dynamic(engine, prompts, max_new_tokens, tree, stop_ids=(), temperature=0.0,
                     generator=None, *, top_k=0, top_p=1.0):
    """Dynamic-tree speculation for a batch on a FastEngine (engine.generate_tree with a
    DynamicTree or tree="dynamic")."""
    from fast import checks
    from fast.sampling import Sampler
    if not (hasattr(engine.drafter, "runner") or getattr(engine.drafter, "grows_trees", False)):
        raise ValueError("draft must be a Qwen3-family model or a head drafter (fast.HeadDrafter, "
                         f"fast.mtp.MTPDrafter) for a dynamic tree, got a "
                         f"{type(engine.drafter).__name__} drafter")
    spec = check_dynamic_tree(tree, engine.vocab_size)
    prompts, max_new, stops = engine._check_batch(prompts, max_new_tokens, stop_ids)
    checks.check_sampling(temperature, top_k, top_p)
    checks.check_generator(generator)
    layout = Layout(spec, engine.device)
    checks.check_room(prompts, max_new, layout.size, engine.capacity, "tree", spec)
    sampler = Sampler(temperature, top_k, top_p, device_generator(generator, engine.device),
                      engine.device, len(prompts))
    return engine._loop(prompts, max_new, stops, layout.size, layout.depth_max,
                        dynamic_round(engine, layout, sampler))
