"""EAGLE-3 (Li et al., 2025): draft from low, middle and high features of the target.

The target's features at position j -- the hidden states of several layers (low, middle, high
by default), concatenated, [nH] -- are projected by an fc to H: that is h_j. The decoder layer
reads the pair (h_j, t_{j+1}) as EAGLE-3 heads do: attention's q/k/v projections take the 2H
vector [input_norm(embedding(t_{j+1})), hidden_norm(h_j)], while the residual stream is h_j
alone; an MLP follows. Its output g_j (before the head's own final norm) is the h of the next
pair within a round: the head is chained on its own outputs, never through the fc again.
The head has its own embedding (engines copy the target's), final norm and lm_head.

Its attention normalizes q and k per head (qk_norm=True) as the Qwen3 target's layers do, the
layer vLLM's Eagle3Qwen3ForCausalLM loads; qk_norm=False is the Llama layer of EAGLE-3's own
checkpoints (LlamaForCausalLMEagle3), the only EAGLE-3 layer llama.cpp's `eagle3` architecture
computes (src/models/eagle3.cpp: q and k go from their projections straight to RoPE).

A draft vocabulary (EAGLE-3's d2t): the lm_head scores only Vd < V tokens, draft index i
standing for target token draft_to_target[i]. Proposals are mapped back to target ids, and q is
placed on the target's vocabulary with zero mass outside the map. That keeps the rejection rule
exact: the rule only needs the proposal to be a draw from the q it is given, and a draw from
the draft vocabulary mapped to target ids is exactly a draw from that placed q (the map is one
to one); tokens outside the map have q = 0, so min(p, q) = 0 there (never accepted through q)
and the residual max(p - q, 0) keeps all of their p (always reachable by the correction).
"""

import torch
import torch.nn as nn

from reference.heads.base import check_pairs, new_cache, one_layer
from reference.hidden import HiddenStates
from reference.model import MLP, Attention, RMSNorm


def default_hidden(num_layers: int) -> HiddenStates:
    """Low, middle and high: the inputs of layers 1, N // 2 and N - 1 of an N-layer target
    (for 6 layers: 1, 3, 5; vLLM's default for its own models is 2, N // 2, N - 3)."""
    if num_layers < 3:
        raise ValueError(f"EAGLE-3's default low/middle/high layers need a target of >= 3 "
                         f"layers, got {num_layers}: pass hidden=HiddenStates(...)")
    return HiddenStates((1, num_layers // 2, num_layers - 1), "input")


class Eagle3Layer(nn.Module):
    """One decoder layer whose attention reads [embedding, hidden] (2H) and whose residual
    stream is the hidden (H)."""

    def __init__(self, config, qk_norm: bool = True):
        super().__init__()
        c, H = config, config.hidden_size
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)    # on the embedding
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)        # on the hidden
        self.self_attn = Attention(c, 0)
        # the projections that read the pair are 2H wide
        self.self_attn.q_proj = nn.Linear(2 * H, c.num_attention_heads * c.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * H, c.num_key_value_heads * c.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * H, c.num_key_value_heads * c.head_dim, bias=False)
        if not qk_norm:   # a Llama layer: no per-head norm of q and k (and no weights for one)
            self.self_attn.q_norm, self.self_attn.k_norm = nn.Identity(), nn.Identity()
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, embeds, h, cache, positions, mask):
        pair = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], dim=-1)  # [B, T, 2H]
        h = h + self.self_attn(pair, cache, positions, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    def __init__(self, config, hidden: HiddenStates | None = None, draft_vocab=None,
                 qk_norm: bool = True):
        """config: the target's Config (the head has its shapes). hidden: which target layers
        feed the fc (default_hidden). draft_vocab: the target ids of the draft vocabulary, in
        draft-index order (d2t), or None for the target's whole vocabulary. qk_norm: the
        attention's per-head q/k norm (Qwen3's layer), or none (False: a Llama layer)."""
        super().__init__()
        if not isinstance(qk_norm, bool):
            raise ValueError(f"Eagle3Head: qk_norm must be a bool, got {qk_norm!r}")
        self.qk_norm = qk_norm
        self.target_config = config
        self.config = one_layer(config)
        self.hidden = default_hidden(config.num_hidden_layers) if hidden is None else hidden
        if not isinstance(self.hidden, HiddenStates):
            raise ValueError(f"Eagle3Head: hidden must be a HiddenStates, got {hidden!r}")
        self.hidden.indices(config.num_hidden_layers)
        H, V = config.hidden_size, config.vocab_size
        self.embed_tokens = nn.Embedding(V, H)
        self.fc = nn.Linear(self.hidden.width(H), H, bias=False)   # [nH] -> H
        self.midlayer = Eagle3Layer(self.config, qk_norm)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        if draft_vocab is None:
            self.draft_to_target = None
            self.lm_head = nn.Linear(H, V, bias=False)
        else:
            self.register_buffer("draft_to_target", _check_draft_vocab(draft_vocab, V))
            self.lm_head = nn.Linear(H, len(self.draft_to_target), bias=False)

    @classmethod
    def from_target(cls, target, hidden=None, draft_vocab=None, qk_norm: bool = True):
        """A head for `target` whose embedding starts as a copy of the target's."""
        head = cls(target.config, hidden, draft_vocab, qk_norm)
        p = target.model.embed_tokens.weight
        head.to(dtype=p.dtype, device=p.device)
        with torch.no_grad():
            head.embed_tokens.weight.copy_(p)
        return head

    def new_cache(self, capacity: int):
        return new_cache(self.config, capacity, self.fc.weight)

    def start(self, features):
        """The target's features [B, T, nH] -> h [B, T, H], through the fc."""
        width = self.hidden.width(self.config.hidden_size)
        if not torch.is_tensor(features) or features.shape[-1] != width:
            raise ValueError(f"Eagle3Head: features must end in {width} ({self.hidden.describe()}),"
                             f" got {tuple(getattr(features, 'shape', ())) or type(features).__name__}")
        return self.fc(features)

    def forward(self, tokens, h, cache, positions=None, mask=None):
        """tokens [B, T] (t_{j+1}), h [B, T, H] at positions cache.length + t -> (logits
        [B, T, Vd] over the draft vocabulary, g [B, T, H] for the next pair). positions [B, T]
        and mask [B, T, S]: a tree level's instead (reference/heads/tree.py)."""
        positions, mask = check_pairs(tokens, h, self.config.hidden_size, cache,
                                      self.config.vocab_size, "Eagle3Head",
                                      positions, mask)
        g = self.midlayer(self.embed_tokens(tokens), h, cache, positions, mask)
        cache.advance(tokens.shape[1])
        return self.lm_head(self.norm(g)), g


def _check_draft_vocab(draft_vocab, vocab_size: int) -> torch.Tensor:
    ids = torch.as_tensor(draft_vocab)
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"draft_vocab must be a non-empty 1-D sequence of target token ids, got "
                         f"{draft_vocab!r}")
    ids = ids.long()
    if ids.min() < 0 or ids.max() >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)][0].item()
        raise ValueError(f"draft_vocab holds token id {bad}, outside the target's vocabulary "
                         f"[0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError(f"draft_vocab names a target token twice: the map must be one to one "
                         f"(else q would not be a law on the target's vocabulary), got "
                         f"{ids.tolist()}")
    return ids
