"""One multi-token-prediction layer (DeepSeek-V3, 2024; Xiaomi's MiMo, 2025): the next feature
from its current one and the next token, read with the target's own final norm and lm_head.

At position j it reads the pair (h_j, t_{j+1}): the target's hidden state h_j (by default the
input of its final norm) and the token after it. Each is RMS-normalized by a norm of its own
(enorm, hnorm), the two are concatenated and projected 2H -> H (eh_proj), one transformer block
runs over the result with a KV cache of the earlier pairs, and the target's final norm and
lm_head turn the block's output into the law of t_{j+2}. For k > 1 the same layer is chained,
as engines do with one MTP layer: its output is the h of the next pair.

Two conventions differ between checkpoints and engines, so they are parameters:
  order    "embedding-first": eh_proj reads [enorm(e), hnorm(h)] (DeepSeek-V3);
           "hidden-first": [hnorm(h), enorm(e)] (MiMo)
  recycle  what feeds the next chained pair: "output", the block's output (the final norm's
           input, like the h the target gives); "normed", after the final norm (what vLLM's
           DeepSeek MTP recycles)
  lead     whether a pair comes before pair 0: False, the pairs (h_j, t_{j+1}) from j = 0 at
           positions j (vLLM, which drops t_0); True, llama.cpp's draft-mtp: its layer decodes
           every token of the sequence, so t_0 is paired with a zero state (the first token of
           a sequence gets the pending state, zero in a fresh slot: common/speculative.cpp,
           common_speculative_impl_draft_mtp::process) and pair j sits at position j + 1. The
           callers feed it (reference.heads.base.lead_pairs: replay.py, proposer.py). A zero
           state is exactly zero after hnorm, so the lead pair reads enorm(emb(t_0)) alone.
  mask0    whether the pair at position 0 gets a zero embedding: vLLM's GLM-4.5 and DeepSeek
           MTP layers zero inputs_embeds where positions == 0 ("masking inputs at position 0,
           as not needed by MTP", model_executor/models/glm4_moe_mtp.py, forward), which there
           is the pair (h_0, t_1); enorm of a zero embedding is exactly zero.
"""

import torch
import torch.nn as nn

from reference.heads.base import check_pairs, new_cache, one_layer, share_target
from reference.hidden import HiddenStates, last_layer
from reference.model import Block, RMSNorm

ORDERS = ("embedding-first", "hidden-first")
RECYCLES = ("output", "normed")


class MTPLayer(nn.Module):
    def __init__(self, target, hidden: HiddenStates | None = None, order="embedding-first",
                 recycle="output", lead=False, mask0=False):
        super().__init__()
        c = target.config
        self.config = one_layer(c)
        self.hidden = last_layer(c.num_hidden_layers) if hidden is None else hidden
        if not isinstance(self.hidden, HiddenStates) or len(self.hidden.layers) != 1:
            raise ValueError(f"MTPLayer reads one hidden state of the target: hidden must be a "
                             f"HiddenStates of one layer, got {hidden!r}")
        self.hidden.indices(c.num_hidden_layers)
        if order not in ORDERS:
            raise ValueError(f"MTPLayer: order must be one of {ORDERS}, got {order!r}")
        if recycle not in RECYCLES:
            raise ValueError(f"MTPLayer: recycle must be one of {RECYCLES}, got {recycle!r}")
        if not isinstance(lead, bool):
            raise ValueError(f"MTPLayer: lead must be a bool, got {lead!r}")
        if not isinstance(mask0, bool):
            raise ValueError(f"MTPLayer: mask0 must be a bool, got {mask0!r}")
        self.order, self.recycle, self.lead, self.mask0 = order, recycle, lead, mask0
        H = c.hidden_size
        self.enorm = RMSNorm(H, c.rms_norm_eps)
        self.hnorm = RMSNorm(H, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.mtp_block = Block(self.config, 0)
        share_target(self, target)

    @property
    def draft_to_target(self):
        return None

    def new_cache(self, capacity: int):
        return new_cache(self.config, capacity, self.eh_proj.weight)

    def start(self, features):
        """The target's hidden states [B, T, H] as the layer's h: used as they are."""
        return features

    def forward(self, tokens, h, cache, positions=None, mask=None):
        """tokens [B, T] (t_{j+1}), h [B, T, H] at positions cache.length + t -> (logits
        [B, T, V] for t_{j+2}, the h of the next pair [B, T, H]). positions [B, T] and mask
        [B, T, S]: a tree level's instead (reference/heads/tree.py)."""
        positions, mask = check_pairs(tokens, h, self.config.hidden_size, cache,
                                      self.config.vocab_size, "MTPLayer",
                                      positions, mask)
        e = self.target.model.embed_tokens(tokens)
        if self.mask0:      # vLLM: the pair at position 0 without its embedding
            e = torch.where((positions == 0)[..., None], torch.zeros_like(e), e)
        e = self.enorm(e)
        n = self.hnorm(h)
        x = self.eh_proj(torch.cat([e, n] if self.order == "embedding-first" else [n, e], -1))
        out = self.mtp_block(x, cache, positions, mask)   # [B, T, H]
        cache.advance(tokens.shape[1])
        normed = self.target.model.norm(out)
        return self.target.lm_head(normed), (out if self.recycle == "output" else normed)
