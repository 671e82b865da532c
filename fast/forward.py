"""One batched forward pass of a Qwen3-family model over a static cache.

Every row feeds T tokens at its own slots and positions, and sees the cache through a mask
built from a per-row window:

    row b, fed token t may attend to slot s  iff  s < window_start[b]
                                              or  visibility[t, s - window_start[b]]

For a chain (prefill, draft step, verify of k+1 tokens) the window starts at the row's length
and `visibility` is lower-triangular; for a token tree it is the ancestor-or-self matrix, so a
node sees the committed prefix and its own branch only. Each fed token always sees its own slot,
so no attention row is empty (an empty row would be NaN).

The computation means what reference.model.Qwen3.forward means (RMSNorm in at least float32,
per-head q/k norms, half-split rotary, grouped-query attention, SwiGLU), with fewer kernels:
fused q/k/v and gate/up matmuls, one norm and one rotary for the q and k heads together, rotary
factors looked up from a table. Every matmul goes through fast/small_m.py: on a CPU a product
with at most 64 rows (a decode step, a verify of a batch) runs a kernel that reads the
weights once for all rows and gives each row the result it would get alone. With float64
weights the logits agree with the reference's to rounding (tests/test_fast_forward.py).

On a CPU, a step of at most 1024 fed tokens in float32 or float64 runs every decoder layer in one
native call (fast/fused.py, fast/fused.cpp: the CPU counterpart of a replayed CUDA graph); the
loop of torch operations below (eager_layers) is the definition it is tested against, and runs
everything else (long prefills, low precision, GPUs, FAST_FUSED=0).

Nothing here reads a tensor's value on the host, so the whole function can be captured in a
CUDA graph (fast/graphs.py) as long as `span` is fixed.
"""

import torch
import torch.nn.functional as F

from fast import fused
from fast.cache import StaticCache
from fast.rotary import apply_rotary, rotary_table
from fast.small_m import linear
from fast.weights import ModelWeights


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dimension, in x's dtype."""
    if x.is_cuda:
        return F.rms_norm(x, x.shape[-1:], None, eps)      # one fused kernel on a GPU
    # On a CPU F.rms_norm is a composite of more kernels than this.
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension; weight broadcasts against x's tail."""
    if x.dtype in (torch.float32, torch.float64):
        return _normalize(x, eps) * weight
    # Low precision is normalized in float32 and rounded before the weight, as Qwen3 does.
    return weight * _normalize(x.float(), eps).to(x.dtype)


def window_mask(window_start: torch.Tensor, visibility: torch.Tensor, span: int) -> torch.Tensor:
    """Attention mask [B, T, span] (True = may attend) from window_start [B], visibility [T, W]."""
    native = fused.window_mask(window_start, visibility, span)
    if native is not None:
        return native
    T, W = visibility.shape
    slots = torch.arange(span, device=window_start.device)
    relative = slots[None, :] - window_start[:, None]                    # [B, span]
    prefix = relative < 0                                                # [B, span]
    inside = (relative >= 0) & (relative < W)                            # [B, span]
    seen = visibility[:, relative.clamp(0, W - 1)]                       # [T, B, span]
    return prefix[:, None, :] | (inside[:, None, :] & seen.transpose(0, 1))


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """mask [B, T, span] (True = may attend) as an additive bias [B, 1, T, span] in dtype."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf"))[:, None]


def forward(weights: ModelWeights, cache: StaticCache, ids: torch.Tensor, slots: torch.Tensor,
            positions: torch.Tensor, mask: torch.Tensor, span: int,
            logits_at: str | torch.Tensor | None = "all", rotary=None, states=None):
    """Run ids [B, T] through the model, writing their keys/values at slots [B, T].

    positions [B, T]: rotary positions. mask [B, T, span]: see window_mask; attention reads slots
    [0, span) of each row. logits_at: "all" -> [B, T, V]; "last" -> [B, V]; an index tensor
    [B, n] of positions within T -> [B, n, V]; None -> no head at all (prefill).
    rotary: the (cos, signed sin) tables to read; a captured step passes tables its owner keeps
    alive (a graph holds raw pointers, not references).
    states: residual-state indices (states[i]: the stream after i decoder layers, 0 .. N, as in
    reference.hidden) to return beside the logits: (logits or None, features [B, T, n * hidden],
    the states concatenated in the order given). What a feature-level head drafts from
    (fast/head.py): the target's own forward computes them, nothing runs twice.
    """
    s = weights.shape
    if rotary is None:
        rotary = rotary_table(s.head_dim, s.rope_theta, cache.capacity, weights.dtype, ids.device)
    features = None
    if states is not None:
        states = _check_states(states, s.num_layers)
        features = torch.empty(*ids.shape, len(states) * s.hidden_size, dtype=weights.dtype,
                               device=ids.device)                       # [B, T, n * hidden]
    x = fused.decoder_layers(weights, cache, ids, slots, positions, mask, span, rotary,
                             final_norm=logits_at is not None, cache_only=logits_at is None,
                             states=states, features=features)
    normed = x is not None
    if x is None:
        x = eager_layers(weights, cache, ids, slots, positions, mask, span, rotary, states,
                         features)
    if logits_at is None:
        return None if states is None else (None, features)
    logits = _head(weights, x, logits_at, normed)
    return logits if states is None else (logits, features)


def _check_states(states, num_layers: int) -> tuple:
    states = tuple(states)
    if not states or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= num_layers
                         for i in states):
        raise ValueError(f"states must be a non-empty sequence of residual-state indices in "
                         f"[0, {num_layers}] (the stream after i of the {num_layers} layers), "
                         f"got {states!r}")
    return states


def _head(weights: ModelWeights, x: torch.Tensor, logits_at, normed: bool) -> torch.Tensor:
    """The logits at logits_at from the last layer's output x [B, T, hidden] (already through
    the final norm when normed)."""
    s = weights.shape
    if isinstance(logits_at, str):
        if logits_at == "last":
            x = x[:, -1]
        elif logits_at != "all":
            raise ValueError(f"logits_at must be 'all', 'last', None or an index tensor, got {logits_at!r}")
    else:
        x = x.gather(1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
    # the norm is per row, so selecting rows first and norming after is the same
    return linear(x if normed else rms_norm(x, weights.norm, s.eps), weights.lm_head)


def eager_layers(weights, cache, ids, slots, positions, mask, span, rotary, states=None,
                 features=None, pair=None, start=None) -> torch.Tensor:
    """The decoder layers as torch operations: x [B, T, hidden] before the final norm. The
    definition fast/fused.cpp is checked against (tests/test_fast_fused.py, and the heads' tests
    for its two modes). With states, the residual stream after i layers is copied into
    features' i-th block for each i named (a copy: the stream is updated in place).
    The native call's modes for a head's layer (fast/fused.py): pair = (h [B, T, hidden],
    hidden_norm): an EAGLE-3 layer, the stream starting as h and the first layer's q/k/v reading
    [input_norm(embedding), hidden_norm(h)]; start = x [B, T, hidden]: an MTP layer's block, the
    stream starting as x."""
    s = weights.shape
    B, T = ids.shape
    H, KV, D = s.num_heads, s.num_kv_heads, s.head_dim
    cos_table, sin_table = rotary
    cos = cos_table[positions][:, :, None, :]                            # [B, T, 1, D]
    sin = sin_table[positions][:, :, None, :]
    # Built once per call, not per layer: the additive form of the mask (0 where a token may
    # attend, -inf where not), which is what attention turns a boolean mask into on every call.
    attn_bias = attention_bias(mask, weights.dtype)                      # [B, 1, T, span]
    # Where each fed token's key/value goes, shared by every layer's cache write.
    write_at = slots[:, None, :, None].expand(B, KV, T, D)               # [B, KV, T, D]
    embedded = F.embedding(ids, weights.embed)                           # [B, T, hidden]
    # the stream: the embedding, or a head's own start (copied: it is updated in place)
    x = embedded if pair is None and start is None else \
        (pair[0] if start is None else start).clone()
    for index, layer in enumerate(weights.layers):
        _keep(x, index, states, features)
        if pair is not None and index == 0:
            h = torch.cat([rms_norm(embedded, layer.input_norm, s.eps),
                           rms_norm(x, pair[1], s.eps)], -1)             # [B, T, 2 hidden]
        else:
            h = rms_norm(x, layer.input_norm, s.eps)
        qkv = linear(h, layer.qkv).view(B, T, H + 2 * KV, D)             # [B, T, H + 2 KV, D]
        # q and k heads share one norm (per-head weights) and one rotary.
        qk = apply_rotary(rms_norm(qkv[:, :, :H + KV], layer.qk_norm, s.eps), cos, sin)
        q, k, v = qk[:, :, :H], qk[:, :, H:], qkv[:, :, H + KV:]
        cache.write_at(index, B, write_at, k.transpose(1, 2), v.transpose(1, 2))
        keys, values = cache.view(index, B, span)                        # [B, KV, span, D]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=attn_bias,
                                           enable_gqa=H != KV)           # [B, H, T, D]
        # Residual adds and the SwiGLU product in place: x, and the fused gate/up output, are
        # this call's own tensors, so no step allocates for them.
        x.add_(linear(y.transpose(1, 2).reshape(B, T, H * D), layer.o))
        h = rms_norm(x, layer.post_norm, s.eps)
        gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)
        x.add_(linear(F.silu(gate, inplace=True).mul_(up), layer.down))
    _keep(x, len(weights.layers), states, features)
    return x


def _keep(x, index: int, states, features) -> None:
    """Copy the stream x (after `index` layers) into every block of features that names it."""
    if states is None:
        return
    H = x.shape[-1]
    for block, wanted in enumerate(states):
        if wanted == index:
            features[..., block * H:(block + 1) * H] = x
