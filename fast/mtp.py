"""An MTP layer as a fast-engine drafter, fed by the hidden states of the target's own forwards.

    fast.batched_generate(target, fast.mtp.MTPDrafter(layer), prompts, 64, k=4)

`layer` is a reference.heads.mtp.MTPLayer (e.g. reference.heads.checkpoint.load_head on a
trained pair's mtp/); the drafter proposes what reference.heads.proposer.ChainHeadProposer
proposes with it, token for token (tests/test_fast_mtp.py), with the engine's batched rows,
static cache and few-row kernels. As fast/head.py's EAGLE-3 drafter (whose rhythm this one
inherits): no draft prefill, no second cache of the target's size; the target's prefill and
every verify return the residual state the layer reads (`states`), handed over with `saw`; the
layer keeps a one-layer cache of its own.

A layer step: x = eh_proj([enorm(emb(t)), hnorm(h)]) (the order is the layer's) through the
few-row kernel, the layer's decoder block over x (on a CPU one native call: fast/fused.py's
decoder layers with the stream starting as x), then the target's own final norm and lm_head,
shared, on the rows read. The eager torch path below is the definition the native call is
checked against.

The layer's cache, in the layer's two layouts (reference/heads/mtp.py, `lead`):

    lead=False (vLLM): the pair (h_j, t_{j+1}) at slot j, as fast/head.py's EAGLE-3 head.
    lead=True (llama.cpp's draft-mtp): t_0 paired with a zero state at slot 0, and the pair
        (h_j, t_{j+1}) at slot j + 1. So slot s holds (h_{s-1}, t_s): the target's token at
        position s, beside the feature before it (zero before the first).

Both keep fast/head.py's invariant: at the top of a round whose row has target length L, the
layer's slots hold the pairs of verified features below the row's `start` (L0, the target
length when the last target forward began), and that forward's features cover positions L0,
L0 + 1, ...; its first L - L0 rows are committed.

With lead=False a round feeds slots L0 .. L - 1 exactly as the EAGLE-3 drafter does. With
lead=True the new verified pairs are slots L0 + 1 .. L, and a round feeds one more in front:
slot L0 again, (h_{L0-1}, t_{L0}), kept from the round before (`first`, `previous`; zero and t_0
after the prefill). Feeding it again rewrites that slot with the keys and values of the same pair
over the same prefix, which changes nothing (the native call is batch invariant, so not even a
bit), and it is what makes the lead pair uniform: after the prefill L0 = 0, and slot 0 is the
lead pair, fed in the first round that has a verified feature, a one-token prompt's included
(its first round has none, fast/head.py, and proposes its newest token with q one-hot). The
round's proposal 1 is read at slot L, where the pair (h_{L-1}, t_L) sits; proposal i + 1 feeds
(the layer's recycled output, proposal i) at slot L + i.

A round's block then writes up to slot L0 + k + 1, one past the verify's last (a row's padded
rows included, written and never read), so the layer's cache and rotary table have two slots
more than the engine's cache, and the attention spans one slot more than the round's bound.

Dynamic trees (EAGLE-2's drafting, fast/dynamic.py): as fast/head.py's, a node's pair is (its
parent's recycled output, its token), at slot root + node and position root + depth, where the
root pair (h_{L-1}, t_L) sits at slot L - 1 + lead; the round's first block is the chain's.
"""

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fast import fused
from fast.forward import eager_layers, rms_norm, window_mask
from fast.head import HeadDrafter
from fast.small_m import linear
from fast.weights import (LayerWeights, ModelWeights, Shape, _fingerprint, _head, _matrices,
                          huge_pages, kept)

# slots the layer's cache holds beyond the engine's (module docstring: the block's last write)
EXTRA_SLOTS = 2


@dataclass
class MTPWeights:
    block: ModelWeights          # the layer's block as a one-layer model, with the target's
                                 # embedding, final norm and lm_head (shared, not copied)
    eh_proj: torch.Tensor        # [H, 2H]: [enorm(e), hnorm(h)] (or the other order) -> x
    enorm: torch.Tensor          # [H] on the token's embedding
    hnorm: torch.Tensor          # [H] on h


# The fast copies per layer: MTP layer -> (fingerprint, MTPWeights), as fast/head.py keeps the
# EAGLE-3 head's (fast.batched_generate builds a drafter per call). The fingerprint covers the
# layer's own weights and the target modules it reads (not registered in the layer).
_MTP_WEIGHTS = weakref.WeakKeyDictionary()


def _shared(layer) -> tuple:
    """The target's modules an MTP layer reads: embedding, final norm, lm_head."""
    model = layer.target.model
    return model.embed_tokens, model.norm, layer.target.lm_head


def mtp_weights(layer) -> MTPWeights:
    """mtp_weights_of(layer), made once per layer and state of its (and its target's) weights."""
    key = _fingerprint(layer) + sum((_fingerprint(m) for m in _shared(layer)), ()) + \
        (huge_pages.on,)
    return kept(_MTP_WEIGHTS, layer, key, lambda: mtp_weights_of(layer))


def mtp_weights_of(layer) -> MTPWeights:
    """The weights of a reference MTPLayer, q/k/v and gate/up fused, its matrices (eh_proj with
    them) in one block on 2 MB pages where the target's are (fast/head.py's head_weights_of
    says why). The lm_head is the target's own fast copy (fast/weights.py keeps one per lm_head
    module, so an engine of the same target reads the same matrix)."""
    block, attn, c = layer.mtp_block, layer.mtp_block.self_attn, layer.config
    embed, norm, lm_head = _shared(layer)
    with torch.no_grad():
        qkv, o, gate_up, down, eh_proj = _matrices([
            [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], [attn.o_proj.weight],
            [block.mlp.gate_proj.weight, block.mlp.up_proj.weight], [block.mlp.down_proj.weight],
            [layer.eh_proj.weight]])
        fused_layer = LayerWeights(
            input_norm=block.input_layernorm.weight.detach(), qkv=qkv,
            qk_norm=torch.cat([attn.q_norm.weight.expand(c.num_attention_heads, -1),
                               attn.k_norm.weight.expand(c.num_key_value_heads, -1)]).detach(),
            o=o, post_norm=block.post_attention_layernorm.weight.detach(), gate_up=gate_up,
            down=down)
        shape = Shape(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                      num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                      head_dim=c.head_dim, rope_theta=float(c.rope_theta), eps=c.rms_norm_eps,
                      num_layers=1)
        model = ModelWeights(shape=shape, embed=embed.weight.detach(), layers=[fused_layer],
                             norm=norm.weight.detach(), lm_head=_head(lm_head))
        return MTPWeights(block=model, eh_proj=eh_proj, enorm=layer.enorm.weight.detach(),
                          hnorm=layer.hnorm.weight.detach())


class MTPDrafter(HeadDrafter):
    """The fast engine's MTP drafter (fast/drafter.py protocol); see the module. From
    HeadDrafter it takes attach, saw, after_round, the causal masks and the tree levels'
    shape; the rest is the layer's."""

    def __init__(self, layer):
        from reference.heads.mtp import MTPLayer
        if not isinstance(layer, MTPLayer):
            raise ValueError(f"layer must be a reference.heads.mtp.MTPLayer, got "
                             f"{type(layer).__name__}")
        self.head = self.layer = layer
        self.config = layer.config
        self.weights = mtp_weights(layer)
        self.vocab_size = layer.config.vocab_size
        self.lead = int(layer.lead)
        self.embedding_first = layer.order == "embedding-first"
        # the norms of eh_proj's two halves, in its order: [2, H]
        w = self.weights
        self.pair_norms = torch.stack([w.enorm, w.hnorm] if self.embedding_first
                                      else [w.hnorm, w.enorm])
        self.states = None          # residual-state indices the target's forwards return
        self.cache = None

    what = "layer"
    extra_slots = EXTRA_SLOTS       # the module docstring's two slots

    @property
    def _matrix(self) -> torch.Tensor:
        return self.weights.eh_proj

    # --------------------------------------------------------------- what the engine calls

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """ids [B, T]: the padded prompts minus their newest token, fed to the target from 0.
        next_tokens: the tokens of the pairs after slot `start` (t_1, t_2, ...; a row's last
        put in by propose, which knows it); with a lead pair, `first` and `previous` are the
        pair at slot 0: t_0 and a zero state."""
        B, device = ids.shape[0], ids.device
        self.start = torch.zeros_like(lengths)
        self.next_tokens = torch.cat([ids[:, 1:], ids[:, :1]], 1)               # [B, T]
        # t_0 where the row has a prompt before its newest token, else the newest (propose)
        self.first = ids[:, 0].clone() if ids.shape[1] else torch.zeros(B, dtype=torch.long,
                                                                           device=device)
        self.previous = torch.zeros(B, self.shape.hidden_size, dtype=self.weights.eh_proj.dtype,
                                    device=device)                              # [B, H]
        self.pending = None

    def propose(self, rows, lengths: torch.Tensor, k: int, sampler, bound: int):
        """rows.last [B]; lengths [B] (the target's, L); bound: a host bound on the slots the
        target writes this round. Returns (proposals [B, k], q [B, k, V] or None)."""
        T = self.next_tokens.shape[1]
        count = lengths - self.start                            # [B] new verified pairs
        blind = count <= 0      # no verified feature: the newest token, with certainty
        fillers = rows.last[:, None].expand(-1, k)                          # [B, k]
        if T == 0:      # no row has one (every prompt a single token): no layer step at all
            proposals, q, previous = fillers, None, self.previous
        else:
            proposals, q, previous = self._chain(rows, lengths, count, k, sampler, bound)
            proposals = torch.where(blind[:, None], fillers, proposals)
        # the next target forward (the verify) feeds [last, proposals] at slots L .. L + k
        self.start = lengths.clone()
        self.next_tokens = torch.cat([proposals, proposals[:, :1]], 1)      # [B, k + 1]
        self.first, self.previous = rows.last.clone(), previous
        if sampler.greedy:
            return proposals, None
        one_hot = F.one_hot(proposals, self.vocab_size).to(torch.float64)   # [B, k, V]
        return proposals, one_hot if q is None else torch.where(blind[:, None, None], one_hot, q)

    def _chain(self, rows, lengths, count, k: int, sampler, bound: int):
        """The layer's k steps: the new verified pairs (and, with a lead pair, the pair at
        `start` again), then each proposal fed back with the layer's recycled output as its h.
        Returns (proposals [B, k], q [B, k, V] or None, the h of slot L's pair [B, H] for the
        next round's first pair)."""
        tokens, h, at, previous = self._first(rows, count)
        logits, g = self._step(tokens, h, self.start, bound, at)            # [B, V], [B, H]
        proposals, laws = [], []
        first_chained = lengths + self.lead                     # slot of proposal 1's pair
        for i in range(k):
            if i > 0:
                logits, g = self._step(proposals[-1][:, None], g[:, None],
                                       first_chained + i - 1, bound, None)
            token, probs = sampler.pick(logits, rows.row_ids)
            proposals.append(token)
            laws.append(probs)
        q = None if sampler.greedy else torch.stack(laws, 1)                # [B, k, V]
        return torch.stack(proposals, 1), q, previous                       # [B, k]

    def _first(self, rows, count):
        """The round's first block: (tokens [B, T'], h [B, T', H] from slot `start`, at [B, 1]
        the row of the pair at the root, the state before slot L for the next round [B, H])."""
        h = self._features_to_h(self.pending)                               # [B, T, H]
        if self.lead:
            tokens = torch.cat([self.first[:, None], self.next_tokens], 1)  # t_s [B, T + 1]
            h = torch.cat([self.previous[:, None], h], 1)                   # h_{s-1} [B, T + 1, H]
            at = count.clamp(min=0)[:, None]                            # [B, 1] slot L's row
        else:
            tokens = self.next_tokens                                       # t_{j+1} [B, T]
            at = (count - 1).clamp(min=0)[:, None]                      # [B, 1] slot L - 1's
        tokens = tokens.scatter(1, at, rows.last[:, None])
        # the state before slot L (lead) for the next round: the block's row `at` holds it
        previous = h.gather(1, at[:, :, None].expand(-1, 1, h.shape[-1]))[:, 0] if self.lead \
            else self.previous                                              # [B, H]
        return tokens, h, at, previous

    # --------------------------------------------------------------- a dynamic tree's levels
    # fast/head.py's tree_root / tree_level / tree_keep, with the layer's own slots (the root
    # pair (h_{L-1}, t_L) at slot L - 1 + lead, a slot its pair's position), its first block
    # (the lead pair's slot fed again) and its step (eh_proj's input, the block, the target's
    # norm and lm_head, the recycled output as a child's h).

    def _root_slot(self, lengths: torch.Tensor) -> torch.Tensor:
        return lengths - 1 + self.lead

    def _on_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return logits               # the target's own lm_head: its whole vocabulary

    def _tree_span(self, bound: int) -> int:
        return min(self.cache.capacity, bound + 1)      # the first block's last write

    def tree_root(self, rows, lengths: torch.Tensor, bound: int, size: int) -> torch.Tensor:
        # a round with no verified feature in any row feeds no block: the state before slot L
        # stays what it was, as in propose
        self._tree_previous = self.previous
        return super().tree_root(rows, lengths, bound, size)

    def _tree_first(self, rows, lengths, count, bound: int):
        tokens, h, at, self._tree_previous = self._first(rows, count)
        return self._step(tokens, h, self.start, bound, at)

    def _tree_pairs(self, ids, h, slots, positions, mask, span: int):
        model = self.weights.block
        x = self._input(ids, h, positions)
        g = fused.decoder_layers(model, self.cache, ids, slots, positions, mask, span,
                                 self.rotary, start=x)
        if g is None:
            g = self._eager_block(ids, x, slots, mask, span, positions)
        normed = rms_norm(g, model.norm, model.shape.eps)                      # [B, n, H]
        return linear(normed, model.lm_head), normed if self.layer.recycle == "normed" else g

    def tree_keep(self, features, path, ids, lengths: torch.Tensor) -> None:
        super().tree_keep(features, path, ids, lengths)
        # the next round feeds slot L again: (h_{L-1}, t_L), t_L the root's token
        self.first, self.previous = ids[:, 0].clone(), self._tree_previous

    def compact(self, order: torch.Tensor, count: int) -> None:
        keep = order[:count]
        self.cache.compact(order, count)
        self.start, self.next_tokens = self.start[keep], self.next_tokens[keep]
        self.first, self.previous = self.first[keep], self.previous[keep]
        if self.pending is not None:
            self.pending = self.pending[keep]

    # --------------------------------------------------------------- the layer's computation

    def _features_to_h(self, features: torch.Tensor) -> torch.Tensor:
        """The target's feature [B, T, H] as the layer's h (after the target's final norm where
        the layer reads the normed state, as the trained ones do)."""
        if self.target_norm is None:
            return features
        return rms_norm(features, self.target_norm, self.eps)

    def _input(self, tokens, h, slots):
        """x [B, T, H] = eh_proj of the pair (tokens [B, T], h [B, T, H]) at slots [B, T] (a
        tree's nodes: their positions, the pair's position being what mask0 reads)."""
        w = self.weights
        B, T, H = h.shape
        e = F.embedding(tokens, w.block.embed)                                 # [B, T, H]
        # vLLM: the pair at position 0 without its embedding (a slot is its pair's position in
        # both layouts, so with a lead pair this is the lead pair's, as in the reference)
        if self.layer.mask0:
            e = torch.where((slots == 0)[..., None], torch.zeros_like(e), e)
        # both halves normed by one rms_norm over [B, T, 2, H] (each half by its own rms and
        # weight, the same arithmetic as two calls): a step's few torch operations cost more
        # than its arithmetic here
        pair = torch.stack([e, h] if self.embedding_first else [h, e], 2)     # [B, T, 2, H]
        pair = rms_norm(pair, self.pair_norms, self.eps).view(B, T, 2 * H)
        return linear(pair, w.eh_proj)                                         # [B, T, H]

    def _step(self, tokens, h, start, bound: int, at):
        """Feed pairs (h, tokens) [B, T] at slots start + t (also their positions); each sees
        the slots before its row's start and the fed pairs up to itself. Returns (logits [B, V],
        the h of the next chained pair [B, H]) at index at [B, 1] of the block (its last row
        when None)."""
        model = self.weights.block
        B, T = tokens.shape
        span = min(self.cache.capacity, bound + 1)      # the block's last write (module doc)
        slots = start[:, None] + torch.arange(T, device=start.device)          # [B, T]
        mask = window_mask(start, self._causal_of(T), span)                    # [B, T, span]
        x = self._input(tokens, h, slots)
        g = fused.decoder_layers(model, self.cache, tokens, slots, slots, mask, span,
                                 self.rotary, start=x)
        if g is None:
            g = self._eager_block(tokens, x, slots, mask, span)
        # the block's row each batch row reads on (the norm and lm_head are per row)
        g = g[:, -1] if at is None else g.gather(1, at[:, :, None].expand(B, 1, g.shape[-1]))[:, 0]
        normed = rms_norm(g, model.norm, model.shape.eps)                      # [B, H]
        logits = linear(normed, model.lm_head)                                 # [B, V]
        return logits, normed if self.layer.recycle == "normed" else g

    def _eager_block(self, tokens, x, slots, mask, span, positions=None):
        """The layer's block over x [B, T, H] as torch operations: its output [B, T, H]
        (fast/forward.py's eager layers with the stream starting as x, the definition the native
        call is checked against). positions: the slots unless given (a tree's nodes)."""
        return eager_layers(self.weights.block, self.cache, tokens, slots,
                            slots if positions is None else positions, mask, span, self.rotary,
                            start=x)
