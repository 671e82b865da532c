"""A Qwen3-style decoder, small enough to read in one sitting.

RMSNorm, rotary positions (half-split, as in Qwen3), grouped-query attention with RMSNorm on
each head's queries and keys, a SwiGLU MLP and an optionally tied head. Parameter names follow
the Hugging Face Qwen3 layout, so a state dict saves and loads as a Qwen3 checkpoint.

forward(ids, cache, positions=None, mask=None) takes explicit positions and an attention mask
so that a token tree can be verified in one call: a node's position is its depth, and it may
attend only to the committed prefix and its own ancestors.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference.cache import KVCache


@dataclass(frozen=True)
class Config:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096


PRESETS = {
    # The chapter's toy: 6 layers, quick on a CPU.
    "tiny": Config(),
    # The published shapes of Qwen3-0.6B and Qwen3-1.7B (config.json of each release); the
    # weights here are random, for timing only.
    "qwen3-0.6b": Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, rope_theta=1e6, tie_word_embeddings=True,
                         max_position_embeddings=40960),
    "qwen3-1.7b": Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, rope_theta=1e6, tie_word_embeddings=True,
                         max_position_embeddings=40960),
}


def preset(name: str, **overrides) -> Config:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # Low-precision inputs are normalized in float32, as Qwen3 does; float64 stays float64.
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x, positions, theta):
    """Rotary embedding, half-split layout. x [B, H, T, D], positions [B, T]."""
    d = x.shape[-1]
    inv_freq = theta ** -(torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None, :, None] * inv_freq  # [B, 1, T, D/2]
    cos = torch.cat([angles.cos()] * 2, -1).to(x.dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, c: Config, layer: int):
        super().__init__()
        self.c, self.layer = c, layer
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cache, positions, mask):
        B, T, _ = x.shape
        c = self.c
        q = self.q_norm(self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, positions, c.rope_theta), rotate(k, positions, c.rope_theta)
        k, v = cache.write(self.layer, k, v)  # [B, kv_heads, S, D], S = cached + T
        groups = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # [B, H, T, D]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: Config, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, layer)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cache, positions, mask):
        x = x + self.self_attn(self.input_layernorm(x), cache, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def prepare_inputs(ids, cache, positions, mask, vocab_size):
    """Check ids and fill in default positions (cache.length + t) and the causal mask.

    Returns positions [B, T] and mask [B, T, S] (True = may attend), S = cache.length + T.
    """
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must be an integer tensor of shape [batch, tokens], got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
    B, T = ids.shape
    if T == 0:
        raise ValueError("ids must hold at least one token, got shape "
                         f"{tuple(ids.shape)}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)][0].item()
        raise ValueError(f"token id {bad} in ids is outside the vocabulary [0, {vocab_size})")
    cache.check_room(T)
    S = cache.length + T
    if positions is None:
        positions = torch.arange(cache.length, S, device=ids.device).expand(B, T)
    elif positions.dim() == 1:
        positions = positions.expand(B, T)
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=ids.device).tril(cache.length)
    if mask.dim() == 2:
        mask = mask.expand(B, T, S)
    if tuple(mask.shape) != (B, T, S) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool [{B}, {T}, {S}] (or [{T}, {S}]), got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    if tuple(positions.shape) != (B, T):
        raise ValueError(f"positions must be [{B}, {T}] (or [{T}]), got {tuple(positions.shape)}")
    return positions, mask


class Qwen3(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def layers(self):
        return self.model.layers

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        p = self.model.embed_tokens.weight
        c = self.config
        return KVCache(len(self.layers), batch, c.num_key_value_heads, c.head_dim, capacity,
                       p.dtype, p.device)

    def forward(self, ids, cache, positions=None, mask=None):
        """ids [B, T] -> logits [B, T, V]; writes T entries to the cache."""
        positions, mask = prepare_inputs(ids, cache, positions, mask, self.config.vocab_size)
        x = self.model.embed_tokens(ids)
        for block in self.layers:
            x = block(x, cache, positions, mask)
        cache.advance(ids.shape[1])
        return self.lm_head(self.model.norm(x))

    def forward_hidden(self, ids, cache, hidden, positions=None, mask=None):
        """forward, also returning the hidden states `hidden` (a reference.hidden.HiddenStates)
        names: (logits [B, T, V], features [B, T, hidden.width(H)]). The same blocks in the
        same order as forward, so the logits are forward's, bit for bit."""
        positions, mask = prepare_inputs(ids, cache, positions, mask, self.config.vocab_size)
        x = self.model.embed_tokens(ids)
        states = [x]  # states[i]: the residual stream after i blocks, [B, T, H]
        for block in self.layers:
            x = block(x, cache, positions, mask)
            states.append(x)
        cache.advance(ids.shape[1])
        return self.lm_head(self.model.norm(x)), hidden.pick(states, self.model.norm)


class EarlyExit(nn.Module):
    """The draft that is the target's first n layers, then its final norm and head.

    It shares the target's weights (no copy) and keeps a cache of its own, n layers deep.
    """

    def __init__(self, target: Qwen3, num_layers: int):
        super().__init__()
        if not 1 <= num_layers <= len(target.layers):
            raise ValueError(f"num_layers must be in [1, {len(target.layers)}], got {num_layers}")
        self.config = replace(target.config, num_hidden_layers=num_layers)
        self.target = target

    @property
    def layers(self):
        return self.target.layers[: self.config.num_hidden_layers]

    @property
    def model(self):
        return self.target.model

    @property
    def lm_head(self):
        return self.target.lm_head

    new_cache = Qwen3.new_cache
    forward = Qwen3.forward


def random_model(config: Config | str = "tiny", seed: int = 0, dtype=torch.float32,
                 std: float | None = None, device=None) -> Qwen3:
    """A Qwen3 with seeded random weights, for inference only.

    Embeddings are normal(0, 1); projections normal(0, std) with std = 2.4 / sqrt(hidden_size)
    by default (0.3 for `tiny`), which makes next-token distributions peaked (top probability
    around 0.2-0.3) rather than nearly uniform, so float64 greedy ties do not occur in practice.
    The projections that write into the residual stream (o_proj, down_proj) get std / 100, so
    the stream changes gradually with depth as in trained models: that is what lets an
    early-exit draft agree with the full model on a fair share of tokens (the chapter's 2-of-6
    draft accepted about a third of its proposals).
    """
    config = preset(config) if isinstance(config, str) else config
    std = 2.4 / config.hidden_size ** 0.5 if std is None else std
    generator = torch.Generator().manual_seed(seed)
    model = Qwen3(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                scale = None
            elif "embed_tokens" in name:
                scale = 1.0
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                scale = std / 100
            else:
                scale = std
            if scale is None:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return model.to(dtype=dtype, device=device).eval().requires_grad_(False)
