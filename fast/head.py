"""An EAGLE-3 head as a fast-engine drafter, fed by the hidden states of the target's own forwards.

    fast.batched_generate(target, fast.HeadDrafter(head), prompts, 64, k=4)

`head` is a reference.heads.Eagle3Head (e.g. reference.heads.checkpoint.load_head); the drafter
proposes what reference.heads.proposer.ChainHeadProposer proposes, token for token
(tests/test_fast_head.py), with the engine's batched rows, static cache and few-row kernels.

No draft prefill, no second cache of the target's size: the engine asks the target's prefill
and every verify for the residual states the head reads (`states`, fast/forward.py returns them
beside the logits) and hands them over with `saw`. The head keeps a one-layer cache of its own.

The head's cache (the reference's layout, reference/heads/__init__.py): the pair (f_j, t_{j+1})
-- the target's feature at position j and the token after it -- sits at slot j.

    invariant: at the top of a round whose row has target length L (its newest token sits at
    position L), the head's slots j < L0 hold the pairs of verified features, where L0 is the
    row's target length when the last target forward began (0 after the prefill); that
    forward's features cover positions L0, L0 + 1, ... and its first L - L0 rows are committed.

So a round first feeds the L - L0 new verified pairs at slots L0 .. L - 1 (one forward of the
whole block, ragged by row: the rows past a row's count are written and never read, as the
target's rejected entries are), and the output at slot L - 1 gives proposal 1; each further
proposal feeds the previous one with the head's own output as its feature at slot L, L + 1, ...
Nothing is ever truncated: the next round writes from its L0 = this round's L, and attention
sees only the slots before a fed token's own window, so pairs built on the head's own outputs are
rebuilt from the target's features before anything reads them.

A row with no verified feature (a one-token prompt's first round) proposes its newest token
with certainty, q one-hot (the reference proposes nothing there): a proposal only steers
acceptance, and a one-hot q keeps the rule exact (fast/lookup.py says why).

Sampling: proposals are drawn from the head's processed law q (temperature, top-k, top-p, as
the target's), which the engine's rejection sampling receives. A draft vocabulary (d2t) places
the head's logits on the target's vocabulary at -inf outside the map, so q has no mass there
(reference/heads/eagle3.py says why that stays exact).

A head step on a CPU is one native call (fast/fused.py's decoder layers in their EAGLE-3 mode:
the stream starts as the feature, q/k/v read [embedding, feature], 2H wide) followed by the
head's norm and lm_head on the rows read; elsewhere, and as its definition, torch operations
over the few-row kernel (fast/small_m.py). Head steps are not captured in CUDA graphs.
"""

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fast import fused
from fast.cache import StaticCache
from fast.forward import eager_layers, rms_norm, window_mask
from fast.rotary import rotary_table
from fast.small_m import linear
from fast.weights import (LayerWeights, ModelWeights, Shape, _fingerprint, _matrices, huge_pages,
                          kept)


@dataclass
class HeadWeights:
    model: ModelWeights          # the head as a one-layer model: embed, its layer, norm, lm_head
    fc: torch.Tensor             # [H, n * H]: the target's features -> h
    hidden_norm: torch.Tensor    # [H] on h (the layer's input_norm is on the embedding)
    draft_to_target: torch.Tensor | None   # [Vd] target ids, or None (the whole vocabulary)


# The fast copies per head: head module -> (fingerprint, HeadWeights), kept as fast/weights.py
# keeps the target's fused layers: fast.batched_generate builds a HeadDrafter per call, and
# copying the head's 11 MB each time cost 3.4 ms a call on the weight-bound pair, more than a
# decode step. The fingerprint (every parameter's and buffer's storage and version) rebuilds
# them when the head's weights change in place or are replaced.
_HEAD_WEIGHTS = weakref.WeakKeyDictionary()


def head_weights(head) -> HeadWeights:
    """head_weights_of(head), made once per head and state of its weights (_HEAD_WEIGHTS)."""
    key = _fingerprint(head) + tuple((b.data_ptr(), b._version) for b in head.buffers()) + \
        (huge_pages.on,)
    return kept(_HEAD_WEIGHTS, head, key, lambda: head_weights_of(head))


def head_weights_of(head) -> HeadWeights:
    """The weights of a reference Eagle3Head, q/k/v and gate/up fused (copies, made once). Its
    layer's qkv is [(heads + 2 kv_heads) * D, 2H]: it reads [embedding, h]. The matrices share
    one block on 2 MB pages where the target's would be (fast/weights.py): a round's verify
    streams the target's weights through the caches, so every round reads the head's from
    memory again, and on 4 KB pages that is a TLB miss every 4 KB."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    c = head.config
    if not getattr(head, "qk_norm", True):
        raise ValueError("head_weights: the fast engine's fused layer normalizes q and k (a Qwen3 "
                         "layer); this head has a Llama layer (qk_norm=False)")
    with torch.no_grad():
        qkv, o, gate_up, down, lm_head, fc = _matrices([
            [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], [attn.o_proj.weight],
            [layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight], [layer.mlp.down_proj.weight],
            [head.lm_head.weight], [head.fc.weight]])
        fused_layer = LayerWeights(
            input_norm=layer.input_layernorm.weight.detach(), qkv=qkv,
            qk_norm=torch.cat([attn.q_norm.weight.expand(c.num_attention_heads, -1),
                               attn.k_norm.weight.expand(c.num_key_value_heads, -1)]).detach(),
            o=o, post_norm=layer.post_attention_layernorm.weight.detach(), gate_up=gate_up,
            down=down)
        shape = Shape(vocab_size=head.lm_head.weight.shape[0], hidden_size=c.hidden_size,
                      num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                      head_dim=c.head_dim, rope_theta=float(c.rope_theta), eps=c.rms_norm_eps,
                      num_layers=1)
        model = ModelWeights(shape=shape, embed=head.embed_tokens.weight.detach(),
                             layers=[fused_layer], norm=head.norm.weight.detach(),
                             lm_head=lm_head)
        return HeadWeights(model=model, fc=fc,
                           hidden_norm=layer.hidden_norm.weight.detach(),
                           draft_to_target=head.draft_to_target)


class HeadDrafter:
    """The fast engine's EAGLE-3 drafter (fast/drafter.py protocol); see the module."""

    grows_trees = True     # tree_root, tree_level, tree_keep below (fast/dynamic.py)

    def __init__(self, head):
        from reference.heads.eagle3 import Eagle3Head
        if not isinstance(head, Eagle3Head):
            raise ValueError(f"head must be a reference.heads.Eagle3Head, got "
                             f"{type(head).__name__}")
        self.head, self.config = head, head.config
        self.weights = head_weights(head)
        self.vocab_size = head.config.vocab_size
        self.states = None          # residual-state indices the target's forwards return
        self.cache = None

    def attach(self, target_weights, max_batch: int, capacity: int) -> None:
        """Called by the engine: check the head against the target and size its cache."""
        c, s = self.config, target_weights.shape
        mine = (c.vocab_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                c.head_dim)
        theirs = (s.vocab_size, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim)
        if mine != theirs:
            raise ValueError(f"{self.what} was made for a target of (vocab, hidden, heads, kv "
                             f"heads, head_dim) = {mine}, but the target has {theirs}")
        mat = self._matrix
        if mat.dtype != target_weights.dtype or mat.device != target_weights.device:
            raise ValueError(f"{self.what} is {mat.dtype} on {mat.device} but the target is "
                             f"{target_weights.dtype} on {target_weights.device}")
        self.states = tuple(self.head.hidden.indices(s.num_layers))
        self.target_norm = target_weights.norm if self.head.hidden.normed else None
        self.eps, self.shape = s.eps, s
        room = capacity + self.extra_slots
        self.cache = StaticCache(1, max_batch, s.num_kv_heads, s.head_dim, room,
                                 target_weights.dtype, target_weights.device)
        self.rotary = rotary_table(s.head_dim, s.rope_theta, room, target_weights.dtype,
                                   target_weights.device)
        self._causal = {}

    what = "head"           # how an error names the drafter
    extra_slots = 0         # its cache's slots past the engine's capacity (fast/mtp.py: 2)

    @property
    def _matrix(self) -> torch.Tensor:
        """One of its matrices: its dtype and device must be the target's."""
        return self.weights.fc

    # --------------------------------------------------------------- what the engine calls

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """ids [B, T]: the padded prompts minus their newest token, fed to the target from 0.
        Pair j's token is t_{j+1}: ids[j + 1], and for a row's last pair its newest token (put
        in by propose, which knows it)."""
        self.start = torch.zeros_like(lengths)
        self.next_tokens = torch.cat([ids[:, 1:], ids[:, :1]], 1)               # [B, T]
        self.pending = None

    def saw(self, features: torch.Tensor) -> None:
        """The features [B, T, n * H] of the target forward that fed next_tokens' predecessors
        at slots start .. start + T - 1."""
        self.pending = features

    def propose(self, rows, lengths: torch.Tensor, k: int, sampler, bound: int):
        """rows.last [B]; lengths [B] (the target's, L); bound: a host bound on the slots
        written this round. Returns (proposals [B, k], q [B, k, V] or None under greedy)."""
        T = self.next_tokens.shape[1]
        count = lengths - self.start                            # [B] new verified pairs
        # no verified feature: the newest token, with certainty (module docstring)
        blind = count <= 0
        fillers = rows.last[:, None].expand(-1, k)                          # [B, k]
        if T == 0:      # no row has one (every prompt a single token): no head step at all
            proposals, q = fillers, None
        else:
            proposals, q = self._chain(rows, lengths, count, k, sampler, bound)
            proposals = torch.where(blind[:, None], fillers, proposals)
        # the next target forward (the verify) feeds [last, proposals] at slots L .. L + k
        self.start = lengths.clone()
        self.next_tokens = torch.cat([proposals, proposals[:, :1]], 1)      # [B, k + 1]
        if sampler.greedy:
            return proposals, None
        one_hot = F.one_hot(proposals, self.vocab_size).to(torch.float64)   # [B, k, V]
        return proposals, one_hot if q is None else torch.where(blind[:, None, None], one_hot, q)

    def _chain(self, rows, lengths, count, k: int, sampler, bound: int):
        """The head's k steps: the new verified pairs, then each proposal fed back with the
        head's own output as its feature. Returns (proposals [B, k], q [B, k, V] or None)."""
        at = (count - 1).clamp(min=0)[:, None]                  # [B, 1] each row's last pair
        tokens = self.next_tokens.scatter(1, at, rows.last[:, None])        # t_{j+1} [B, T]
        h = self._features_to_h(self.pending)                               # [B, T, H]
        logits, g = self._step(tokens, h, self.start, bound, at)            # [B, Vd], [B, H]
        proposals, laws = [], []
        for i in range(k):
            if i > 0:
                logits, g = self._step(proposals[-1][:, None], g[:, None], lengths + i - 1,
                                       bound, None)
            token, probs = sampler.pick(self._on_target_vocab(logits), rows.row_ids)
            proposals.append(token)
            laws.append(probs)
        q = None if sampler.greedy else torch.stack(laws, 1)                # [B, k, V]
        return torch.stack(proposals, 1), q                                 # [B, k]

    def after_round(self, catch_up: bool) -> None:
        pass    # the next round's first step feeds every verified pair (module docstring)

    def compact(self, order: torch.Tensor, count: int) -> None:
        keep = order[:count]
        self.cache.compact(order, count)
        self.start, self.next_tokens = self.start[keep], self.next_tokens[keep]
        if self.pending is not None:
            self.pending = self.pending[keep]

    # --------------------------------------------------------------- the head's computation

    def _features_to_h(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [B, T, n * H] -> h [B, T, H] through the fc (normed first
        where the head's convention reads the final norm's output)."""
        if self.target_norm is not None:
            H = self.shape.hidden_size
            features = torch.cat([rms_norm(part, self.target_norm, self.eps)
                                  for part in features.split(H, -1)], -1)
        return linear(features, self.weights.fc)

    def _on_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, Vd] -> [B, V]: -inf outside a draft vocabulary (module docstring)."""
        d2t = self.weights.draft_to_target
        if d2t is None:
            return logits
        placed = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        return placed.index_copy_(1, d2t, logits)

    def _causal_of(self, T: int) -> torch.Tensor:
        if T not in self._causal:
            self._causal[T] = torch.ones(T, T, dtype=torch.bool, device=self.cache.device).tril()
        return self._causal[T]

    def _step(self, tokens, h, start, bound: int, at):
        """Feed pairs (h, tokens) [B, T] at slots start + t (also their positions); each sees
        the slots before its row's start and the fed pairs up to itself. Returns (logits
        [B, Vd], g [B, H]) at index at [B, 1] of the block (its last row when None)."""
        model = self.weights.model
        B, T = tokens.shape
        span = min(self.cache.capacity, bound)
        slots = start[:, None] + torch.arange(T, device=start.device)          # [B, T]
        mask = window_mask(start, self._causal_of(T), span)                    # [B, T, span]
        g = fused.decoder_layers(model, self.cache, tokens, slots, slots, mask, span,
                                 self.rotary, pair=(h, self.weights.hidden_norm))
        if g is None:
            g = self._eager_layer(tokens, h, slots, mask, span)
        # the block's row each batch row reads on (the norm and lm_head are per row)
        g = g[:, -1] if at is None else g.gather(1, at[:, :, None].expand(B, 1, g.shape[-1]))[:, 0]
        return linear(rms_norm(g, model.norm, model.shape.eps), model.lm_head), g   # [B, Vd], [B, H]

    def _eager_layer(self, tokens, h, slots, mask, span, positions=None):
        """The head's layer as torch operations: g [B, T, H] (fast/forward.py's eager layers in
        their EAGLE-3 mode, the definition the native call is checked against). positions: the
        slots unless given (a tree's nodes sit at root + depth)."""
        return eager_layers(self.weights.model, self.cache, tokens, slots,
                            slots if positions is None else positions, mask, span, self.rotary,
                            pair=(h, self.weights.hidden_norm))

    # --------------------------------------------------------------- a dynamic tree's levels
    # fast/dynamic.py grows each row's tree from these (EAGLE-2's drafting; the rule and its
    # proof are reference/dynamic_tree.py's, the head's side reference/heads/tree.py's): a node's
    # law is the head's at the pair (its parent's output g, its token). The round's root is
    # `last`, whose pair is the last verified one, fed with the round's other new verified pairs
    # exactly as the chain's first step feeds them; node i then sits at slot L - 1 + i, position
    # L - 1 + depth(i), seeing the verified pairs and its ancestors. Nothing is truncated: the
    # next round's verified pairs, rebuilt from the target's features of the accepted path
    # (tree_keep), are written from slot L over the tree's.

    def tree_root(self, rows, lengths: torch.Tensor, bound: int, size: int) -> torch.Tensor:
        """The head's logits at every row's root [B, V] (on the target's vocabulary); keeps g
        of the root for the levels in self.tree_g [B, size, H]. A row with no verified feature
        (a one-token prompt's first round) is certain of its newest token: its tree is all
        `last` under sampling, and any tree is exact (the module docstring's one-hot q)."""
        B, H = lengths.shape[0], self.shape.hidden_size
        count = lengths - self.start                            # [B] new verified pairs
        self.tree_g = torch.zeros(B, size, H, dtype=self.target_dtype,
                                  device=lengths.device)                    # [B, N, H]
        certain = torch.full((B, self.vocab_size), float("-inf"), dtype=self.target_dtype,
                             device=lengths.device)
        certain.scatter_(1, rows.last[:, None], 0.0)                        # [B, V]
        if self.next_tokens.shape[1] == 0:    # no row has a verified feature
            return certain
        logits, g = self._tree_first(rows, lengths, count, bound)           # [B, Vd], [B, H]
        self.tree_g[:, 0] = g
        return torch.where((count <= 0)[:, None], certain, self._on_target_vocab(logits))

    def tree_level(self, ids, parent, lengths: torch.Tensor, depth: int, ancestors,
                   bound: int, start: int) -> torch.Tensor:
        """Feed a level's nodes start .. start + n - 1: ids [B, n] with their parents [B, n]
        (node indices), at depth `depth`, under ancestors [B, n, N]. Returns their logits
        [B, n, V] and keeps their g."""
        from fast.dynamic import rows_window_mask
        B, n = ids.shape
        span = self._tree_span(bound)
        root = self._root_slot(lengths)                         # [B] the root pair's slot
        slots = root[:, None] + torch.arange(start, start + n, device=ids.device)   # [B, n]
        positions = (root[:, None] + depth).expand(B, n).contiguous()
        mask = rows_window_mask(root, ancestors, span)                        # [B, n, span]
        h = self.tree_g.gather(1, parent[:, :, None].expand(B, n, self.tree_g.shape[-1]))
        logits, g = self._tree_pairs(ids, h, slots, positions, mask, span)    # [B, n, Vd], g
        self.tree_g[:, start:start + n] = g
        return self._on_target_vocab(logits.flatten(0, 1)).view(B, n, -1)

    # what an EAGLE-3 head does at those three places (fast/mtp.py's layer has its own)

    @property
    def target_dtype(self):
        return self._matrix.dtype

    def _root_slot(self, lengths: torch.Tensor) -> torch.Tensor:
        return lengths - 1          # the pair (f_{L-1}, t_L) at slot L - 1

    def _tree_span(self, bound: int) -> int:
        return min(self.cache.capacity, bound)

    def _tree_first(self, rows, lengths, count, bound: int):
        """The round's new verified pairs, as the chain's first step feeds them: (logits [B, Vd],
        g [B, H]) at each row's root pair."""
        at = (count - 1).clamp(min=0)[:, None]                  # [B, 1] each row's last pair
        tokens = self.next_tokens.scatter(1, at, rows.last[:, None])        # t_{j+1} [B, T]
        return self._step(tokens, self._features_to_h(self.pending), self.start, bound, at)

    def _tree_pairs(self, ids, h, slots, positions, mask, span: int):
        """Pairs (h, ids) [B, n] at slots with positions under mask: (logits [B, n, Vd], g)."""
        model = self.weights.model
        g = fused.decoder_layers(model, self.cache, ids, slots, positions, mask, span,
                                 self.rotary, pair=(h, self.weights.hidden_norm))
        if g is None:
            g = self._eager_layer(ids, h, slots, mask, span, positions)
        return linear(rms_norm(g, model.norm, model.shape.eps), model.lm_head), g

    def tree_keep(self, features, path, ids, lengths: torch.Tensor) -> None:
        """After the verify: features [B, N, n * H] of every node, path [B, D + 1] (the root,
        then the accepted nodes, the last repeated past it), ids [B, N]. The path's pairs are
        the next round's verified pairs from slot L: (f_root, its first node's token), ..."""
        width = features.shape[-1]
        self.pending = features.gather(1, path[:, :, None].expand(-1, -1, width))   # [B, D+1, nH]
        tokens = ids.gather(1, path[:, 1:])                                         # [B, D]
        self.next_tokens = torch.cat([tokens, tokens[:, :1]], 1)  # the last: `last`, put in later
        self.start = lengths.clone()

