"""Tree engines for the kit's "tree" family: one correct engine made of small hooks, and mutants
that each override one hook with a realistic mistake in multi-candidate tree sampling.

`TreeSpeculator.tree_generate` has the kit's tree-level API. Under sampling every node's
children are i.i.d. draws from the draft's q at that node, and the node tries them in turn:
accept child x with probability min(1, r(x) / q(x)), on rejection r <- norm(max(r - q, 0)),
after the last child (or at a leaf) draw from r, starting from r = p. The hooks:

    draw_children(q, count)      the children's tokens (i.i.d. from q, with replacement)
    sibling_q(q, earlier)        the q that sibling j is tested with, given earlier siblings' tokens
    tested_against(p, r)         the distribution a sibling's ratio uses (the current residual)
    next_residual(p, r, q)       r after a rejection (carried from sibling to sibling)
    after_leaf(p_at, leaf, tree) the distribution of the token after a fully accepted path
    kept_nodes(tree, path)       the nodes whose cache entries are moved in place after the round

    layout(parents)              a dynamic round's layout (its ancestor matrix is the mask)
    residual_q(q_at, node, tree, q)  the q a rejection's residual subtracts (the node's own)

Models are the kit's qwen3 models (the tree needs positions and a mask); the engine uses the
chapter's cache interface plus `move`. The model tree layout comes from reference.tree.Tree.
tree= is a fixed shape or a DynamicTree (reference/dynamic_tree.py: the shape grown per round
from the draft's confidence by reference.dynamic_tree.grow; children i.i.d. under sampling).
"""

from __future__ import annotations

import torch

from reference.dynamic_tree import as_dynamic_tree, grow
from reference.sampling import greedy_token, probs_from_logits
from reference.tree import Tree


def _norm_residual(r, q):
    rest = (r - q).clamp_min(0)
    return rest / rest.sum() if rest.sum() > 0 else r


class TreeSpeculator:
    """Correct: i.i.d. children, recursive rejection with the residual carried, q unchanged."""

    caught_by = None
    detected_when = None

    # ------------------------------------------------------------------ hooks
    def draw_children(self, q, count, generator):
        return torch.multinomial(q, count, replacement=True, generator=generator).tolist()

    def sibling_q(self, q, earlier):
        return q

    def tested_against(self, p, r):
        return r

    def next_residual(self, p, r, q):
        return _norm_residual(r, q)

    def after_leaf(self, p_at, leaf, tree):
        return p_at(leaf)

    def kept_nodes(self, tree, path):
        return path

    def node_q(self, q_at, node, tree):
        """The draft distribution a node's children were drawn from (and are tested with)."""
        return q_at[node]

    def sibling_uniform(self, generator, earlier):
        """The uniform of the next sibling's accept test (`earlier`: the previous sibling's)."""
        return torch.rand((), dtype=torch.float64, generator=generator)

    def shape(self, branching):
        """The tree layout, whose ancestor matrix makes the attention mask."""
        return Tree(tuple(branching))

    def layout(self, parents):
        """A dynamic round's layout from its parents array (the mask, as shape() for fixed)."""
        return Tree.from_parents(parents)

    def residual_q(self, q_at, node, tree, q):
        """The draft distribution a rejection's residual subtracts: the one the node's children
        were drawn from and tested with."""
        return q

    # ------------------------------------------------------------------ the engine
    @torch.inference_mode()
    def tree_generate(self, target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2),
                      stop_ids=(), *, temperature=0.0, generator=None, top_k=0, top_p=1.0):
        dynamic = not isinstance(tree, (tuple, list))
        spec = as_dynamic_tree(tree) if dynamic else None
        shape = None if dynamic else self.shape(tree)
        prompt = [int(t) for t in prompt_ids]
        stops = set(int(s) for s in stop_ids)
        device = next(target.parameters()).device
        capacity = len(prompt) + max_new_tokens + (spec.budget + 1 if dynamic else shape.size)
        t_cache, d_cache = target.new_cache(1, capacity), draft.new_cache(1, capacity)
        if len(prompt) > 1:
            head = torch.tensor([prompt[:-1]], device=device)
            target(head, t_cache)
            draft(head, d_cache)
        probs = lambda logits: probs_from_logits(logits.double(), temperature, top_k, top_p)
        out, rounds, accepted, last = [], 0, 0, prompt[-1]
        depth = spec.depth if dynamic else shape.depth_max     # a round's depth, set per round
        while len(out) < max_new_tokens:
            rounds += 1
            base = t_cache.length
            if dynamic:
                shape, tokens, q_at = self._grow(spec, last, draft, d_cache, base, device,
                                                 probs, temperature, generator)
            else:
                tokens, q_at = self._draft_fixed(shape, last, draft, d_cache, base, device,
                                                 probs, temperature, generator)
            depth = shape.depth_max
            every = list(range(shape.size))
            t_logits = target(torch.tensor([tokens], device=device), t_cache,
                              shape.positions(every, base, device), shape.mask(every, base, device))[0]
            path, node = [], 0
            while True:
                kids = shape.children[node]
                if temperature == 0:
                    after = int(greedy_token(t_logits[node]))
                    nxt = next((k for k in kids if tokens[k] == after), None)
                else:
                    nxt, after = self._walk(node, kids, tokens, q_at, t_logits, probs, shape,
                                            generator)
                if nxt is None:
                    break
                path.append(nxt)
                node = nxt
            accepted += len(path)
            kept = self.kept_nodes(shape, path)
            t_cache.move([base + i for i in kept], base + 1)
            t_cache.truncate(base + 1 + len(kept))
            fed = [i for i in kept if shape.depth[i] < depth]
            d_cache.move([base + i for i in fed], base + 1)
            d_cache.truncate(base + 1 + len(fed))
            if len(fed) < len(kept):
                draft(torch.tensor([[tokens[kept[-1]]]], device=device), d_cache)
            for token in [tokens[i] for i in path] + [after]:
                out.append(token)
                if token in stops or len(out) == max_new_tokens:
                    return out, self._stats(out, rounds, accepted, depth)
            last = out[-1]
        return out, self._stats(out, rounds, accepted, depth)

    def _draft_fixed(self, shape, last, draft, d_cache, base, device, probs, temperature,
                     generator):
        """A fixed shape's tokens, level by level -> (tokens, q_at)."""
        tokens, q_at = [last] + [0] * (shape.size - 1), {}
        for d in range(shape.depth_max):
            nodes = shape.level(d)
            logits = draft(torch.tensor([[tokens[i] for i in nodes]], device=device), d_cache,
                           shape.positions(nodes, base, device), shape.mask(nodes, base, device))[0]
            for row, node in enumerate(nodes):
                kids = shape.children[node]
                if temperature == 0:
                    picks = torch.sort(logits[row], descending=True, stable=True).indices[:len(kids)].tolist()
                else:
                    q_at[node] = probs(logits[row])
                    picks = self.draw_children(q_at[node], len(kids), generator)
                for kid, token in zip(kids, picks):
                    tokens[kid] = int(token)
        return tokens, q_at

    def _grow(self, spec, last, draft, d_cache, base, device, probs, temperature, generator):
        """A dynamic round's tree (reference.dynamic_tree.grow) -> (layout, tokens, q_at)."""

        def node_logits(tree, tokens, nodes):
            lay = self.layout(tree.parent)
            feed = torch.tensor([[tokens[i] for i in nodes]], device=device)
            return draft(feed, d_cache, lay.positions(nodes, base, device),
                         lay.mask(nodes, base, device))[0]

        def children_of(logits, m):
            if temperature == 0:
                return (torch.sort(logits, descending=True, stable=True).indices[:m].tolist(),
                        torch.softmax(logits.double(), -1))
            q = probs(logits)
            return self.draw_children(q, m, generator), q

        tree, tokens, q_at = grow(spec, last, node_logits, children_of)
        return self.layout(tree.parent), tokens, q_at

    def _walk(self, node, kids, tokens, q_at, t_logits, probs, shape, generator):
        """One node's recursive rejection -> (accepted child or None, token drawn if None)."""
        p = probs(t_logits[node])
        if not kids:
            leaf_dist = self.after_leaf(lambda n: probs(t_logits[n]), node, shape)
            return None, int(torch.multinomial(leaf_dist, 1, generator=generator))
        r, earlier, u = p, [], None
        for kid in kids:
            x = tokens[kid]
            q = self.sibling_q(self.node_q(q_at, node, shape), earlier)
            u = self.sibling_uniform(generator, u)
            if u * q[x] < self.tested_against(p, r)[x]:
                return kid, None
            r = self.next_residual(p, r, self.residual_q(q_at, node, shape, q))
            earlier.append(x)
        return None, int(torch.multinomial(r, 1, generator=generator))

    @staticmethod
    def _stats(out, rounds, accepted, depth):
        return {"rounds": rounds, "acceptance_rate": accepted / (rounds * depth) if rounds else 0.0,
                "tokens_per_target_call": len(out) / rounds if rounds else 0.0}


# --------------------------------------------------------------------------- the mutants

class ResidualNotCarried(TreeSpeculator):
    """After a rejection the next sibling is tested against norm(max(p - q, 0)) computed from p
    afresh, not from the residual the earlier siblings left."""

    caught_by = "tree"
    detected_when = "two siblings rejected in a row (then the last draw uses the wrong residual)"

    def next_residual(self, p, r, q):
        return _norm_residual(p, q)


class SiblingsAgainstOriginalP(TreeSpeculator):
    """Every sibling's ratio uses the target's p, not the current residual (the residual is
    still carried for the final draw)."""

    caught_by = "tree"
    detected_when = "a first sibling rejected, the second tested (tree width >= 2)"

    def tested_against(self, p, r):
        return p


class WithoutReplacementUnrenormalized(TreeSpeculator):
    """Children drawn without replacement (distinct tokens), but each sibling is tested with
    the original q, not q renormalized over the tokens not drawn yet."""

    caught_by = "tree"
    detected_when = "tree width >= 2 and the first child's q mass is large"

    def draw_children(self, q, count, generator):
        support = int((q > 0).sum())
        picks = torch.multinomial(q, min(count, support), replacement=False,
                                  generator=generator).tolist()
        return picks + picks[:count - len(picks)]


class RenormalizedWithReplacement(TreeSpeculator):
    """The mirror image: children drawn i.i.d. with replacement, but each sibling is tested
    (and the residual taken) with q renormalized over the tokens earlier siblings did not take,
    as if they had been drawn without replacement."""

    caught_by = "tree"
    detected_when = "tree width >= 2, a first sibling rejected"

    def sibling_q(self, q, earlier):
        kept = q.clone()
        kept[list(set(earlier))] = 0
        return kept / kept.sum() if kept.sum() > 0 else q


class BonusFromParent(TreeSpeculator):
    """The token after a fully accepted path is drawn from the target's distribution at the
    leaf's parent (one node too high), not at the leaf."""

    caught_by = "tree"
    detected_when = "a full path accepted and more tokens than the tree's depth"

    def after_leaf(self, p_at, leaf, tree):
        return p_at(tree.parent[leaf])


class CacheFromWrongPath(TreeSpeculator):
    """After the round, each accepted node's cache entry is taken from its parent's FIRST child,
    whichever child was accepted: the moved keys/values belong to a sibling's token."""

    caught_by = "tree"
    detected_when = "an accepted node that is not its parent's first child, then another round"

    def kept_nodes(self, tree, path):
        return [tree.children[tree.parent[node]][0] for node in path]


class QFromFirstNodeOfLevel(TreeSpeculator):
    """Each node's children are tested with the draft distribution of the FIRST node at the same
    depth (`q_level[depth]` kept per level instead of per node), not with the q they were drawn
    from. Right for the root and for a node that is first in its level; wrong elsewhere."""

    caught_by = "tree"
    detected_when = ("a node that is not first in its level is reached (a depth-1 sibling "
                     "accepted) and its draft distribution differs from the first node's")

    def node_q(self, q_at, node, tree):
        first = tree.level(tree.depth[node])[0]
        return q_at[first]


class OneUniformForSiblings(TreeSpeculator):
    """One uniform drawn per node and reused for every sibling's accept test: after a rejection
    at u the next sibling is tested with the same u (known to be >= the first ratio), so the
    siblings' acceptances are correlated and the residual chain is biased."""

    caught_by = "tree"
    detected_when = "a first sibling rejected and a second one tested (width >= 2)"

    def sibling_uniform(self, generator, earlier):
        if earlier is None:
            return torch.rand((), dtype=torch.float64, generator=generator)
        return earlier


class _UncleTree(Tree):
    """A layout whose mask also lets each node see its parent's siblings (its uncles)."""

    def __init__(self, branching):
        super().__init__(branching)
        for i in range(1, self.size):
            parent = self.parent[i]
            if parent > 0:
                for uncle in self.children[self.parent[parent]]:
                    self.ancestors[i, uncle] = True


class MaskSeesUncles(TreeSpeculator):
    """The tree attention mask is built from ancestors plus the parent's siblings (a mask made
    level by level that opens the whole previous level under the grandparent): a node at depth
    >= 2 attends to tokens that are not on its path. Only deeper accepted paths show it."""

    caught_by = "tree"
    detected_when = "a path of depth >= 2 through a tree with branching >= 2 above it accepted"

    def shape(self, branching):
        return _UncleTree(tuple(branching))


MUTANTS = [ResidualNotCarried, SiblingsAgainstOriginalP, WithoutReplacementUnrenormalized,
           RenormalizedWithReplacement, BonusFromParent, CacheFromWrongPath,
           QFromFirstNodeOfLevel, OneUniformForSiblings, MaskSeesUncles]
CORRECT = [TreeSpeculator]


def _with_siblings(tree):
    """A layout whose mask also lets each node see its siblings (its parent's other children)."""
    for i in range(1, tree.size):
        for sibling in tree.children[tree.parent[i]]:
            tree.ancestors[i, sibling] = True
    return tree


class MaskSeesSiblings(TreeSpeculator):
    """The tree mask lets a node attend to its siblings as well as its ancestors (a mask made
    per level that opens the node's whole sibling group): a node's logits are computed after
    tokens that are not on its path, in the draft and in the target's verify."""

    caught_by = "tree"
    detected_when = "an accepted node with siblings whose logits change the next token"

    def shape(self, branching):
        return _with_siblings(Tree(tuple(branching)))

    def layout(self, parents):
        return _with_siblings(Tree.from_parents(parents))


class ResidualFromParent(TreeSpeculator):
    """After a rejected child, the residual subtracts the draft distribution of the node's
    PARENT (the q one level up, which its own siblings were drawn from), not of the node whose
    children were tested. Right at the root (no parent); wrong below it."""

    caught_by = "tree"
    detected_when = "a node below the root reached with children, one of them rejected"

    def residual_q(self, q_at, node, tree, q):
        parent = tree.parent[node]
        return q_at[parent] if parent >= 0 else q


MUTANTS += [MaskSeesSiblings, ResidualFromParent]
