"""A step's decoder layers in one native call on the CPU (fast/fused.cpp).

The CPU counterpart of a replayed CUDA graph: where a step of the eager forward runs ~35 torch
operations a layer, each with its Python call, dispatch and allocation, this runs the
embedding and every decoder layer as one call into plain loops over buffers allocated once.
The final norm comes with it on request (`final_norm`), and a prefill that wants only the cache
stops after the last layer's keys and values (`cache_only`); the row selection for `logits_at` and
the head stay in fast/forward.py. `window_mask` builds forward.window_mask's mask in one call
too: on a draft step of a small model the few torch operations around the layers cost more
than the layers (BENCHMARKS.md, issue 24). For a feature-level head (fast/head.py) the call
also copies out the residual streams the head reads (`states`), and runs the head's own layer
(`pair`): an EAGLE-3 layer is a decoder layer whose stream starts as the feature and whose
q/k/v read [embedding, feature], so it needs no kernel of its own. An MTP layer's block
(fast/mtp.py) is a plain decoder layer whose stream starts as eh_proj's output (`start`).

It applies on a CPU to float32 and float64 weights and steps of at most 1024 fed tokens in all
(a decode step, a draft step, a verify, a tree of a batch, most prefills); longer prefills, other
dtypes, other devices, a kernel that cannot be built, or input off its contract run the eager
loop, which is kept as the definition and raises the usual errors.

Switches, as for fast/small_m.py: FAST_FUSED=0 in the environment turns it off for the process
(FAST_NATIVE=0 turns off every CPU kernel); `enabled(False)` for a block of code (the
benchmarks time both sides with it, and fast.eager runs the whole engine without it so that
the kit can judge both paths).
"""

from __future__ import annotations

import torch

from fast import native

MAX_ROWS = 1024     # fast/fused.cpp's fused::MAX_ROWS
_switch = native.Switch("FAST_FUSED")


def is_enabled() -> bool:
    return _switch.on


def enabled(on: bool):
    """Run steps through the fused call (True) or the eager loop (False) inside the block."""
    return _switch.enabled(on)


def _flat(weights) -> list:
    """The layers' tensors in fused.cpp's order, built once per ModelWeights."""
    flat = weights.__dict__.get("_fused_flat")
    if flat is None:
        flat = [t for layer in weights.layers for t in (layer.input_norm, layer.qkv, layer.qk_norm,
                                                        layer.o, layer.post_norm, layer.gate_up,
                                                        layer.down)]
        weights.__dict__["_fused_flat"] = flat
    return flat


def decoder_layers(weights, cache, ids, slots, positions, mask, span: int, rotary,
                   final_norm: bool = False, cache_only: bool = False, states=None,
                   features=None, pair=None, start=None):
    """x [B, T, hidden] after every decoder layer (and the model's final norm when final_norm;
    an empty [B, T, 0] when cache_only), keys/values written to `cache`; or None where the fused
    call does not apply (module docstring). states, features: the residual streams after
    states[i] layers copied into features [B, T, n * hidden] (fast/forward.py's forward).
    pair: (h [B, T, hidden], hidden_norm [hidden]) for an EAGLE-3 head's layer (fast/head.py):
    the stream starts as h, and the first layer's q/k/v read [input_norm(embedding),
    hidden_norm(h)]. start: x [B, T, hidden] for an MTP layer's block (fast/mtp.py): the stream
    starts as x instead of the embedding of ids (ids are then only range-checked); not with
    pair."""
    if pair is not None and start is not None:
        raise ValueError("decoder_layers: pair (an EAGLE-3 layer) and start (an MTP block) are "
                         "two modes; give one")
    if (not _switch.on or ids.device.type != "cpu" or ids.numel() > MAX_ROWS
            or weights.dtype not in (torch.float32, torch.float64)):
        return None
    module = _module or _load()
    if module is None:
        return None
    s = weights.shape
    # the kernel tells the modes apart by the norm: the stream's start alone is the MTP block's
    first, second = (None, None) if pair is None else (pair[0].contiguous(), pair[1])
    if start is not None:
        first = start.contiguous()
    cos, sin = rotary
    # The kernel reads its index tensors and the mask row by row; window_mask's result is laid
    # out [T, B, span] in memory (a transposed operand), and a caller's ids may be a broadcast.
    return module.decoder_layers(ids.contiguous(), weights.embed, _flat(weights), cache.keys,
                                 cache.values, slots.contiguous(), positions.contiguous(),
                                 mask.contiguous(), span, cos, sin, s.num_heads,
                                 s.num_kv_heads, s.head_dim, s.eps,
                                 weights.norm if final_norm else None, cache_only,
                                 list(states or ()), features, first, second)


def window_mask(window_start: torch.Tensor, visibility: torch.Tensor, span: int):
    """forward.window_mask's mask [B, T, span], contiguous, or None where the native call does
    not apply (off, not on the CPU, not built, or inputs off its contract)."""
    if not _switch.on or window_start.device.type != "cpu":
        return None
    module = _module or _load()
    return None if module is None else module.window_mask(window_start, visibility, span)


_module = None


def _load():
    global _module
    _module = native.kernel()
    return _module
