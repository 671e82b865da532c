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


def check_pairs(tokens, h, width: int, cache, vocab_size: int, name: str, positions=None,
                mask=None):
    """Check a chained head's input -- tokens [B, T] and h [B, T, width] -- and return the
    positions [B, T] and mask [B, T, S] of the pairs: by default cache.length + t and causal;
    a tree's level gives its own (reference/heads/tree.py)."""
    if not torch.is_tensor(h) or h.dim() != 3 or h.shape[-1] != width:
        raise ValueError(f"{name}: h must be [batch, tokens, {width}], got "
                         f"{tuple(getattr(h, 'shape', ())) or type(h).__name__}")
    if torch.is_tensor(tokens) and tuple(tokens.shape) != tuple(h.shape[:2]):
        raise ValueError(f"{name}: tokens {tuple(tokens.shape)} and h {tuple(h.shape)} must "
                         f"pair up one to one ([batch, tokens])")
    return prepare_inputs(tokens, cache, positions, mask, vocab_size)


def lead_pairs(head) -> int:
    """How many pairs a chained head's cache holds before pair 0 (the pair of f_0 and t_1): 1
    for an MTP layer with lead=True (llama.cpp's draft-mtp: t_0 paired with a zero state, see
    reference/heads/mtp.py), else 0. Its cache then holds pair j at position j + lead."""
    return 1 if getattr(head, "lead", False) else 0


def with_lead(head, h, first: int) -> torch.Tensor:
    """h [B, T, H] of the pairs first .. first + T - 1 (after head.start), with the lead
    pair's zero state put in front when the first pair fed is the lead one (first == -1)."""
    if first >= 0:
        return h
    if first != -1 or not lead_pairs(head):
        raise ValueError(f"with_lead: pair {first} precedes the {lead_pairs(head)} lead pair(s) "
                         f"of a {type(head).__name__}")
    return torch.cat([torch.zeros_like(h[:, :1]), h], 1)
