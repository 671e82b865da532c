"""What the chained heads share: a one-layer config and cache, the target's modules held
without copying them, and the checks on what a head is fed."""

from dataclasses import replace

import torch

from reference.cache import KVCache
from reference.model import prepare_inputs


def one_layer(config):
    """The target's config with one layer: a head's decoder layer has the target's shapes."""
    return replace(config, num_hidden_layers=1)


def share_target(head, target):
    """Hold the target (its embedding, final norm, lm_head) without registering it: the head's
    parameters and state_dict are its own weights only, as in engines' head checkpoints, and
    head.to(...) leaves the target where it is."""
    object.__setattr__(head, "target", target)


def new_cache(config, capacity: int, like: torch.Tensor) -> KVCache:
    """A one-layer cache for a head's decoder layer, in the dtype and device of `like`."""
    return KVCache(1, 1, config.num_key_value_heads, config.head_dim, capacity, like.dtype,
                   like.device)


def check_pairs(tokens, h, width: int, cache, vocab_size: int, name: str):
    """Check a chained head's input -- tokens [B, T] and h [B, T, width] -- and return the
    positions [B, T] and causal mask [B, T, S] of the pairs (cache.length + t)."""
    if not torch.is_tensor(h) or h.dim() != 3 or h.shape[-1] != width:
        raise ValueError(f"{name}: h must be [batch, tokens, {width}], got "
                         f"{tuple(getattr(h, 'shape', ())) or type(h).__name__}")
    if torch.is_tensor(tokens) and tuple(tokens.shape) != tuple(h.shape[:2]):
        raise ValueError(f"{name}: tokens {tuple(tokens.shape)} and h {tuple(h.shape)} must "
                         f"pair up one to one ([batch, tokens])")
    return prepare_inputs(tokens, cache, None, None, vocab_size)
