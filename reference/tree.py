"""Tree verification: several candidate continuations checked in one target call.

The draft grows a tree below `last`: branching[d] children under every node at depth d (the
chapter's tree is (2, 2, 2): 2 + 4 + 8 = 14 nodes). The block fed to the target is `last`
followed by the nodes in breadth-first order; a node's position is base + its depth and it
attends to the committed prefix and its own ancestors only, so its logits are exactly those
the target would give after that path. One path is committed, plus one token after it, and
that path's cache entries are moved into place.

Greedy (temperature 0): a node's children are the draft's top-b tokens (distinct); the longest
path on which every node equals the target's argmax is committed, then the target's argmax.

Sampling (temperature > 0): a node's children are b draws from the draft's distribution q at
that node, i.i.d., WITH replacement (a repeated sibling token is allowed), all from the same q.
Walking down from the root, each node tries its children in turn (recursive rejection):

    r = p (the target's distribution at the node)
    for each child c: accept c with probability min(1, r(c) / q(c)); stop at the first accepted
                      on rejection: r = max(r - q, 0) / sum(max(r - q, 0))
    if every child was rejected (or the node is a leaf): commit a draw from r, end the round.

Proof that the committed token at a node is distributed as p. Let T(r, j) be the law of what
the loop commits when it reaches child j with current distribution r. Child j is a fresh draw
from q, independent of the earlier children and of their accept tests, so it is accepted at
token x with probability q(x) min(1, r(x) / q(x)) = min(q(x), r(x)); it is rejected with
probability 1 - sum min(q, r) = sum max(r - q, 0) = Z, and then the loop goes on with
r' = max(r - q, 0) / Z. By induction on the children left, T(r', j + 1) = r' (after the last
child, the draw from r' is r' by definition), so T(r, j) = min(q, r) + Z r' = min(q, r) +
max(r - q, 0) = r. Hence T(p, 1) = p. The subtree under the accepted child was drawn from
the draft given that child's path, independently of the tests above it, so the next node is
in the same situation: every committed token is distributed as the target's next-token law
given the committed prefix, which is the target's ancestral sampling (chain rule). The proof
needs q unchanged for every sibling: that is exactly why children are drawn with replacement.
Nothing above uses the tree's shape: the proof holds for any parents array, and for a shape
chosen per round from the draft alone (how many children a node gets fixed before they are
drawn), which is what reference/dynamic_tree.py's dynamic trees do.
Z = 0 means r <= q everywhere, i.e. r == q, where rejection has probability 0; with rounding
it falls back to r. Temperature, top-k and top-p filter p and q exactly as in the chain.
"""

import torch

from reference.committed import Committed
from reference.sampling import Sampler, SamplingParams, check_logits, greedy_token

CHAPTER_TREE = (2, 2, 2)


def top_tokens(logits, b):
    """The b largest-logit tokens, ties broken by the lowest index (a stable sort)."""
    check_logits(logits)
    return torch.sort(logits, descending=True, stable=True).indices[:b].tolist()


class Tree:
    """Node 0 is `last`; every other node has a parent with a smaller index, and the nodes of one
    depth are contiguous (levels in order), so a level is fed to a model as one block whose cache
    slots are base + index. A fixed shape is Tree(branching) (breadth first, branching[d]
    children under every node at depth d); any other tree, a dynamic tree's round included, is
    Tree.from_parents(parents): depth, children, the ancestor mask and positions all follow
    from the parent array."""

    def __init__(self, branching):
        if (isinstance(branching, (str, bytes)) or not hasattr(branching, "__len__")
                or not branching
                or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in branching)):
            raise ValueError(f"tree branching must be a non-empty sequence of ints >= 1, got {branching!r}")
        self.branching = tuple(branching)
        parent, frontier = [-1], [0]
        for b in branching:
            next_frontier = []
            for node in frontier:
                for _ in range(b):
                    parent.append(node)
                    next_frontier.append(len(parent) - 1)
            frontier = next_frontier
        self._layout(parent)

    @classmethod
    def from_parents(cls, parents):
        """A general tree from parents[i] (parents[0] == -1, the root; parents[i] < i; depths
        nondecreasing with the index, so that each level is contiguous)."""
        parents = list(parents)
        if not parents or parents[0] != -1 or any(
                not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < i
                for i, p in enumerate(parents[1:], start=1)):
            raise ValueError(f"parents must start with -1 and give every later node an earlier "
                             f"parent, got {parents!r}")
        tree = cls.__new__(cls)
        tree.branching = None
        tree._layout(parents)
        if any(a > b for a, b in zip(tree.depth, tree.depth[1:])):
            raise ValueError(f"parents must number the nodes level by level (depths "
                             f"nondecreasing), got depths {tree.depth} from parents={parents!r}")
        return tree

    def _layout(self, parent):
        self.parent = list(parent)
        self.depth = [0]
        for p in parent[1:]:
            self.depth.append(self.depth[p] + 1)
        self.size = len(self.parent)
        self.depth_max = max(self.depth)
        self.children = [[] for _ in range(self.size)]
        for c in range(1, self.size):
            self.children[self.parent[c]].append(c)
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


def residual(r, q):
    """max(r - q, 0) normalized; r itself when that is empty (r == q up to rounding)."""
    rest = (r - q).clamp_min(0)
    total = rest.sum()
    return rest / total if total > 0 else r


def draft_tree(draft, d_cache, tree, last, base, sampler, device):
    """The draft fills the tree: one forward per depth over that depth's nodes.

    Returns (tokens [size] as a list, q: node -> the distribution its children were drawn from,
    sampling only)."""
    tokens, q_at = [last] + [0] * (tree.size - 1), {}
    for d in range(tree.depth_max):
        nodes = tree.level(d)
        feed = torch.tensor([[tokens[i] for i in nodes]], device=device)
        logits = draft(feed, d_cache, tree.positions(nodes, base, device),
                       tree.mask(nodes, base, device))[0]                   # [len(nodes), V]
        for row, node in enumerate(nodes):
            kids = tree.children[node]
            if sampler.greedy:
                choices = top_tokens(logits[row], len(kids))
            else:
                q_at[node] = sampler.probs(logits[row])
                # i.i.d. with replacement, every sibling from the same q (the proof needs it)
                choices = [sampler.draw(q_at[node]) for _ in kids]
            for child, token in zip(kids, choices):
                tokens[child] = token
    return tokens, q_at


def greedy_path(tree, tokens, target_logits):
    """Follow the target's argmax while a child matches it -> (path, next token)."""
    path, node = [], 0
    while True:
        choice = int(greedy_token(target_logits[node]))
        match = [c for c in tree.children[node] if tokens[c] == choice]
        if not match:
            return path, choice
        node = match[0]
        path.append(node)


def sampled_path(tree, tokens, q_at, target_logits, sampler):
    """Recursive rejection from the root down (see the module docstring) -> (path, next token)."""
    path, node = [], 0
    while True:
        r = sampler.probs(target_logits[node])                               # [V], p at the node
        chosen = None
        for child in tree.children[node]:
            q, x = q_at[node], tokens[child]
            if sampler.uniform(r.device) < r[x] / q[x]:
                chosen = child
                break
            r = residual(r, q)  # carried to the next sibling
        if chosen is None:
            return path, sampler.draw(r)  # all rejected, or a leaf (then r = p: the bonus)
        path.append(chosen)
        node = chosen


def tree_generate(target, draft, ids, max_new_tokens, stop, branching=CHAPTER_TREE,
                  temperature=0.0, top_k=0, top_p=1.0, generator=None):
    """Speculative decoding with a token tree; ids [P] on the target's device (checked by the
    caller, reference.speculative.tree_generate). Greedy at temperature 0, else exact sampling."""
    tree = Tree(branching)
    sampler = Sampler(SamplingParams(temperature, top_k, top_p), generator)
    depth = tree.depth_max
    device = ids.device
    capacity = ids.numel() + max_new_tokens + tree.size
    t_cache, d_cache = target.new_cache(1, capacity), draft.new_cache(1, capacity)
    if ids.numel() > 1:
        target(ids[None, :-1], t_cache)
        draft(ids[None, :-1], d_cache)
    seq = Committed(ids.tolist(), max_new_tokens, stop)
    while not seq.done:
        base = t_cache.length
        tokens, q_at = draft_tree(draft, d_cache, tree, seq.context[-1], base, sampler, device)
        # Target: every node in one forward.
        every = list(range(tree.size))
        target_logits = target(torch.tensor([tokens], device=device), t_cache,
                               tree.positions(every, base, device),
                               tree.mask(every, base, device))[0]              # [size, V]
        if sampler.greedy:
            path, after = greedy_path(tree, tokens, target_logits)
        else:
            path, after = sampled_path(tree, tokens, q_at, target_logits, sampler)
        new_tokens = [tokens[i] for i in path] + [after]
        keep_path(tree, tokens, path, base, t_cache, draft, d_cache, device)
        # A round can accept at most `depth` proposals (one per level): that is what it proposed.
        seq.add(new_tokens, len(path), depth)
    return seq.output, seq.stats()


def keep_path(tree, tokens, path, base, t_cache, draft, d_cache, device):
    """Keep `last` and the accepted path, contiguous after the prefix, in both caches (node i's
    entry sits at slot base + i). The draft fed every level but the deepest, so a path that
    reaches the deepest level leaves one token for the draft to feed."""
    t_cache.move([base + i for i in path], base + 1)
    t_cache.truncate(base + 1 + len(path))
    fed = [i for i in path if tree.depth[i] < tree.depth_max]
    d_cache.move([base + i for i in fed], base + 1)
    d_cache.truncate(base + 1 + len(fed))
    if len(fed) < len(path):
        draft(torch.tensor([[tokens[path[-1]]]], device=device), d_cache)
