"""The kit's served heads: for the 32-token served target, a head of each kind the engines'
head methods declare (a HeadDraft: its kind and hidden-state convention), with seeded random
weights, as draft-random is a seeded model, and the rounds a HeadDraft answers the exact replays
with (properties/acceptance.py, acceptance_sampled.py).

- `served_head(drafter)`: the reference head (reference/heads/), float32 values held in
  float64; EAGLE-3's embedding is the target's. A fully random head is accepted about once in
  120 drafted tokens, too rarely to show anything, so its readout is fitted by least squares to
  the target's own logits of the tokens it drafts (about once in 9 for EAGLE-3, 6 for Medusa).
- `greedy_proposals`, `round_proposals`, `round_logits`: a chained head's proposals depend on
  where its round started (the verified features end there), so they are a function of
  (context, prefix), not of the sequence alone as a draft model's are.

properties/export/heads.py writes these heads in an engine's checkpoint format.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from properties.models import served
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads
from reference.heads.mtp import MTPLayer
from reference.heads.random import random_head

# one seed per kind, apart from the served models' (9001, 9002)
SEEDS = {"eagle3": 9003, "medusa": 9004}
SEEDS["mtp"] = 9005   # an MTP layer (llama.cpp's draft-mtp, served in a GLM-4.5 export)
RIDGE = 1e-3          # the MTP layer's eh_proj fit: ridge weight, relative to the mean of diag(X'X)
SEEDS["dflash"] = 9006   # a DFlash block drafter (properties/models/dflash.py)
SEEDS["dspark"] = 9007   # a DSpark block drafter (properties/models/dflash.py too)
DTYPE = torch.float32
# Medusa heads of the served head methods: one per drafted position (the methods' k)
MEDUSA_HEADS = 4


@lru_cache(maxsize=8)
def served_head(drafter):
    """The reference head (float64, weights exact in float32) a HeadDraft of the served
    methods loads: its kind, its hidden-state convention, a seeded random init, for the served
    target it names (drafter.target: the kit's, or a deeper variant)."""
    if drafter.kind not in SEEDS:
        raise ValueError(f"no served head of kind {drafter.kind!r}: the kit exports "
                         f"{sorted(SEEDS)} for vLLM")
    if drafter.kind in ("dflash", "dspark"):
        from properties.models.dflash import served_dflash
        return served_dflash(drafter, SEEDS[drafter.kind])
    target = served.build(drafter.target)
    options = {"hidden": drafter.hidden} if drafter.hidden is not None else {}
    if drafter.kind == "medusa":
        options["num_heads"] = MEDUSA_HEADS
    if not drafter.qk_norm:
        options["qk_norm"] = False
    options.update(dict(drafter.options))
    head = random_head(drafter.kind, target, seed=SEEDS[drafter.kind], **options)
    if isinstance(head, Eagle3Head):
        with torch.no_grad():
            head.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    _fit_readout(head, target, SEEDS[drafter.kind])
    # the numbers a float32 checkpoint stores, as the served models are
    return head.to(DTYPE).to(torch.float64).eval().requires_grad_(False)


@torch.no_grad()
def _fit_readout(head, target, seed: int, rows: int = 256, length: int = 32):
    """Fit the head's lm_head(s) by least squares to the target's own logits of the token it
    drafts, on greedy continuations of seeded random prompts. A head with random weights
    throughout accepts almost nothing (about 1 of 120 drafted greedily here), too few for
    its counters to show that the engine drafts with it; with the fitted readout about 1 in 9
    drafted tokens is accepted (EAGLE-3), 1 in 6 (Medusa), over 80 greedy rounds of seeded
    random prompts."""
    from reference.cache import KVCache
    if isinstance(head, MTPLayer):
        return _fit_mtp(head, target, seed, rows, length)
    c = target.config
    seqs = served.greedy_sequences(target, seed, rows, length)
    cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim, length,
                    torch.float64, "cpu")
    logits, features = target.forward_hidden(seqs, cache, head.hidden)   # logits[:, j]: t_{j+1}
    if isinstance(head, Eagle3Head):
        # the pair (f_j, t_{j+1}) drafts t_{j+2}, whose target logits are row j + 1
        own = KVCache(1, rows, c.num_key_value_heads, c.head_dim, length, torch.float64, "cpu")
        _, g = head(seqs[:, 1:], head.start(features[:, :-1]), own)
        _least_squares(head.lm_head, head.norm(g), logits[:, 1:])
    else:
        # Medusa head i (from 0) reads f_j and drafts t_{j+2+i}: target logits row j + 1 + i
        for i, (block, lm_head) in enumerate(zip(head.blocks, head.lm_heads)):
            _least_squares(lm_head, block(features[:, :length - 1 - i]), logits[:, 1 + i:])


@torch.no_grad()
def _fit_mtp(head, target, seed: int, rows: int, length: int):
    """An MTP layer reads out through the target's own final norm and lm_head, so there is no
    readout of its own to fit: fit its eh_proj instead, by least squares, so that the pair
    (h_j, t_{j+1}) projects onto the target's pre-norm state at j + 1 (whose readout is the
    target's law of t_{j+2}), on greedy continuations of seeded random prompts; the block then
    adds its (random) attention and MLP on that residual stream. Its o_proj is scaled to std / 10
    (random's std / 100 writes almost nothing): then what the layer attends to, the pairs
    before (llama.cpp's lead pair included), changes 67 of 384 rounds' proposals, and 42 % of
    drafted tokens are accepted (greedy, 16 seeded prompts, k = 4)."""
    from reference.cache import KVCache
    from reference.hidden import last_layer
    head.mtp_block.self_attn.o_proj.weight.mul_(10.0)
    c = target.config
    seqs = served.greedy_sequences(target, seed, rows, length)
    states = {}
    for name, hidden in (("features", head.hidden), ("pre-norm", last_layer(c.num_hidden_layers))):
        cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim, length,
                        torch.float64, "cpu")
        states[name] = target.forward_hidden(seqs, cache, hidden)[1]
    e = head.enorm(target.model.embed_tokens(seqs[:, 1:]))              # t_{j+1}
    n = head.hnorm(states["features"][:, :-1])                          # h_j
    x = torch.cat([e, n] if head.order == "embedding-first" else [n, e], -1)
    y = states["pre-norm"][:, 1:]                                       # the state at j + 1
    x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    # ridge, not lstsq: the embedding half takes only the vocabulary's 32 values, so x is rank
    # deficient and a plain least-squares solution is not unique: which one LAPACK returns
    # moved between calls in one process (eh_proj differing by 0.5, 2026-12-07), and the
    # replay must rebuild the very weights the export wrote. The ridge term makes it unique.
    gram = x.T @ x
    ridge = RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    head.eh_proj.weight.copy_(torch.linalg.solve(gram + ridge, x.T @ y).T)


def _least_squares(linear, x, y):
    """linear.weight := the W minimizing |x W^T - y| (y centred per row: softmax ignores a
    row's shift), x [..., H], y [..., V]."""
    x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    y = y - y.mean(-1, keepdim=True)
    linear.weight.copy_(torch.linalg.lstsq(x, y).solution.T)


def greedy_proposals(head, target, context, k: int) -> tuple:
    """The head's argmax proposals (at most k; Medusa: at most its number of heads) in a round
    whose newest token is context[-1], as reference/heads/proposer.py drafts them: from the
    target's float64 features of the verified tokens context[:-1], chained on its own
    proposals. () for a one-token context (no verified feature)."""
    from reference.sampling import greedy_token
    context = [int(t) for t in context]
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"greedy_proposals: k must be an int >= 0, got {k!r}")
    if len(context) < 2 or k == 0:
        return ()
    features = _features(head, target, context[:-1])
    limit = (min(k, head.num_heads) if isinstance(head, MedusaHeads)
             else min(k, getattr(head, "max_proposals", k)))   # DFlash: its block's masks
    out = []
    for _ in range(limit):
        out.append(int(greedy_token(_round_row(head, features, context, out))))
    return tuple(out)


@torch.no_grad()
def _features(head, target, verified) -> torch.Tensor:
    """The target's features of the verified tokens, as the head reads them: [len, width]."""
    from reference.cache import KVCache
    c = target.config
    cache = KVCache(len(target.layers), 1, c.num_key_value_heads, c.head_dim, len(verified),
                    torch.float64, "cpu")
    return target.forward_hidden(torch.tensor([list(verified)]), cache, head.hidden)[1][0]


@torch.no_grad()
def _round_row(head, features, context, prefix) -> torch.Tensor:
    """The head's logits [V] (-inf outside a draft vocabulary) for the proposal after `prefix`
    in the round whose newest token is context[-1]; features of context[:-1]."""
    from reference.heads.replay import round_logits
    # rows 0 .. n - 1 of the features are read; the proposals' rows never are
    return round_logits(head, features, list(context) + list(prefix), len(context) - 1,
                        len(prefix) + 1)[-1]


@lru_cache(maxsize=4096)
def round_proposals(drafter, context: tuple, n: int) -> tuple:
    """greedy_proposals of the served head `drafter` loads, cached."""
    return greedy_proposals(served_head(drafter), served.build(drafter.target), context, n)


@lru_cache(maxsize=1024)
def _served_features(drafter, verified: tuple) -> torch.Tensor:
    return _features(served_head(drafter), served.build(drafter.target), verified)


def round_logits(drafter, context, prefix) -> torch.Tensor:
    """The served head's logits [V] for the proposal after `prefix` in a round whose newest
    token is context[-1] (a context of two or more tokens)."""
    context = tuple(int(t) for t in context)
    if len(context) < 2:
        raise ValueError(f"round_logits: a head drafts from a verified feature, so the context "
                         f"needs two or more tokens, got {list(context)}")
    return _round_row(served_head(drafter), _served_features(drafter, context[:-1]), context,
                      [int(t) for t in prefix])
