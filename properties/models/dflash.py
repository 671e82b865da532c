"""The kit's served DFlash head (reference/heads/dflash.py) for the 32-token served target: what
properties/models/heads.py `served_head` returns for a HeadDraft of kind "dflash", and what
properties/export/dflash.py writes for the engines.

- a block of BLOCK = K + 1 tokens (the newest and K masks): both engines decode 1 + k tokens a
  round (llama.cpp n_max + 1, vLLM 1 + num_speculative_tokens), so the served head's block is
  the head methods' k + 1, and its config says so (dflash_config.block_size);
- the mask token: MASK = the vocabulary's last id (its embedding is the target's, as the
  head's embedding is the target's);
- seeded random weights, then its own lm_head fitted by least squares to the target's logits
  of the tokens it drafts (a fully random head is accepted too rarely to show anything; with
  the target's lm_head nothing could be fitted): the export ships that lm_head, which both
  engines load as the head's own.

The served DSpark head (reference/heads/dspark.py; a HeadDraft of kind "dspark") is the same
recipe with DSpark's differences: a block of K tokens (the newest and K - 1 masks, every row
read: llama.cpp decodes n_max tokens, vLLM num_speculative_tokens), the target's lm_head
(llama.cpp's DSpark converter drops a full-vocabulary lm_head, conversion/qwen.py:926-927), so
what is fitted is the Markov head's markov_w2, by least squares to what the target's logits
leave over the base logits, given markov_w1 of the token before each row (rank MARKOV_RANK).
"""

from __future__ import annotations

import torch

from properties.models import served
from reference.heads.dflash import DFlashHead
from reference.heads.dspark import DSparkHead
from reference.heads.random import randomize

K = 4                  # the proposals a round of the engines' dflash methods
BLOCK = K + 1
MASK = served.VOCAB - 1
MARKOV_RANK = 8        # the served DSpark head's Markov rank
DTYPE = torch.float32


def served_dflash(drafter, seed: int) -> DFlashHead:
    """The served DFlash (or DSpark) head a HeadDraft of kind "dflash" ("dspark") loads:
    float64, its weights exact in float32, reading the drafter's hidden states
    (drafter.hidden: target layers' outputs)."""
    if drafter.kind not in ("dflash", "dspark"):
        raise ValueError(f"served_dflash: drafter.kind must be 'dflash' or 'dspark', got "
                         f"{drafter.kind!r}")
    if drafter.hidden is None:
        raise ValueError(f"served_dflash: the HeadDraft {drafter.head!r} must name its hidden "
                         f"states (the target layers whose outputs dflash_config."
                         f"target_layer_ids lists)")
    target = served.build(getattr(drafter, "target", "target"))
    if drafter.kind == "dspark":
        head = DSparkHead(target, drafter.hidden, block_size=K, mask_token_id=MASK,
                          markov_rank=MARKOV_RANK)
    else:
        head = DFlashHead(target, drafter.hidden, block_size=BLOCK, mask_token_id=MASK,
                          own_lm_head=True)
    head = randomize(head, seed).to(device=target.lm_head.weight.device)
    (fit_markov if drafter.kind == "dspark" else fit_readout)(head, target, seed)
    return head.to(DTYPE).to(torch.float64).eval().requires_grad_(False)


@torch.no_grad()
def fit_readout(head, target, seed: int, rows: int = 256, length: int = 24):
    """Fit the head's own lm_head by least squares to the target's logits of the tokens its
    masks draft (fit_rows)."""
    x, y, _ = fit_rows(head, target, seed, rows, length)
    head.lm_head.weight.copy_(torch.linalg.lstsq(x, y).solution.T)


@torch.no_grad()
def fit_markov(head, target, seed: int, rows: int = 256, length: int = 24):
    """Fit a DSpark head's markov_w2 by least squares: given e = markov_w1[the token before the
    row] (the sequence's own, as when the chain drafted it), markov_w2 e is fitted to the
    target's logits less the head's base logits (fit_rows)."""
    x, y, prev = fit_rows(head, target, seed, rows, length)
    e = head.markov_head.markov_w1(prev)                                     # [N, rank]
    residual = y - head.readout()(x)
    residual = residual - residual.mean(-1, keepdim=True)
    head.markov_head.markov_w2.weight.copy_(torch.linalg.lstsq(e, residual).solution.T)


@torch.no_grad()
def fit_rows(head, target, seed: int, rows: int, length: int):
    """What the rows a round reads should give: (x, y, prev) with x [N, H] the head's final-norm
    states of those rows, y [N, V] the target's logits of the tokens they draft (centred), prev
    [N] the token before each drafted one. Row r of those the round whose newest token sits at
    n reads drafts t_{n+r+1} (DFlash's mask i = r + 1 drafts t_{n+i}; DSpark's row r, its
    anchor's own first), whose target logits are row n + r of a forward over the sequence. The
    sequences
    are greedy continuations of seeded random prompts (as properties/models/heads.py fits
    EAGLE-3)."""
    from reference.cache import KVCache
    c = target.config
    seqs = served.greedy_sequences(target, seed, rows, length)
    cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim, length,
                    torch.float64, "cpu")
    logits, features = target.forward_hidden(seqs, cache, head.hidden)
    xs, ys, prevs = [], [], []
    read = head.max_proposals
    for n in range(1, length - read):
        xs.append(head.states(features[:, :n], seqs[:, n]))                  # [rows, read, H]
        ys.append(logits[:, n:n + read])
        prevs.append(seqs[:, n:n + read])
    x, y = torch.cat(xs).reshape(-1, c.hidden_size), torch.cat(ys).reshape(-1, c.vocab_size)
    y = y - y.mean(-1, keepdim=True)     # softmax ignores a row's shift
    return x, y, torch.cat(prevs).reshape(-1)
