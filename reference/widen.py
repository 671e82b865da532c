"""Growing a trained model into a larger one that computes the same function (Net2Net-style
widening and deepening), so that a large target starts from what the small one learned and
needs a short training, not a new one.

    wide = widen(model, replace(model.config, hidden_size=384, ...), seed=0)

What is added, and why the output does not move:

* hidden dimensions: every weight that *writes* into the residual stream (the embedding, each
  o_proj and down_proj) gets zero rows for them, so the new dimensions of the stream stay 0;
  every weight that *reads* the stream (q/k/v, gate/up; the tied head reads through the zero
  embedding columns) gets small random columns for them, which read those zeros. An RMSNorm
  over d' = d + extra dimensions of which only d are non-zero divides by a root mean square
  sqrt(d / d') times the old one, so its weight is scaled by sqrt(d / d') (exact up to the
  eps term, a relative 1e-6 at rms_norm_eps 1e-6).
* MLP units: random gate/up rows, zero down_proj columns.
* attention heads: random q rows (and k, v rows for new key-value heads), zero o_proj
  columns. New heads are appended with the old group size, so every old query head keeps its
  key-value head (q head h reads kv head h // group).
* layers: appended after the old ones, with zero o_proj and down_proj, so each new block adds
  0 to the stream; an early exit after the first layers is the same draft as before.

The random parts are what training moves first: with the readers random, the gradient reaching
the zero writers is not zero (zeros on both sides would stay zeros).
"""

from __future__ import annotations

import math

import torch

from reference.model import Config, Qwen3

_SAME = ("vocab_size", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings")


def _check(old: Config, new: Config):
    for name in _SAME:
        if getattr(old, name) != getattr(new, name):
            raise ValueError(f"config.{name} must stay {getattr(old, name)!r} to widen, got "
                             f"{getattr(new, name)!r}")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads"):
        if getattr(new, name) < getattr(old, name):
            raise ValueError(f"config.{name} can only grow: {getattr(old, name)} -> "
                             f"{getattr(new, name)}")
    old_group = old.num_attention_heads // old.num_key_value_heads
    if new.num_attention_heads != old_group * new.num_key_value_heads:
        raise ValueError(f"the query heads per key-value head must stay {old_group}: got "
                         f"num_attention_heads={new.num_attention_heads}, "
                         f"num_key_value_heads={new.num_key_value_heads}")


@torch.no_grad()
def widen(model: Qwen3, config: Config, seed: int = 0, std: float = 0.02) -> Qwen3:
    """A Qwen3 of shape `config` computing what `model` computes (module docstring)."""
    old = model.config
    _check(old, config)
    generator = torch.Generator().manual_seed(seed)
    d, d2 = old.hidden_size, config.hidden_size
    H, H2, G, G2 = (old.num_attention_heads, config.num_attention_heads,
                    old.num_key_value_heads, config.num_key_value_heads)
    D, I2 = old.head_dim, config.intermediate_size
    norm_scale = math.sqrt(d / d2)
    wide = Qwen3(config)
    state = model.state_dict()
    new_state = {}

    def reader(w, rows, cols):
        """Reads the stream: random on new columns and on new rows (new units or heads)."""
        out = torch.randn((rows, cols), generator=generator).to(w.dtype) * std
        out[: w.shape[0], : w.shape[1]] = w
        out[: w.shape[0], w.shape[1]:] = torch.randn(
            (w.shape[0], cols - w.shape[1]), generator=generator).to(w.dtype) * std
        return out

    def writer(w, rows, cols):
        """Writes the stream (rows: hidden): zero rows for new hidden dimensions, zero
        columns for new units or heads."""
        out = torch.zeros((rows, cols), dtype=w.dtype)
        out[: w.shape[0], : w.shape[1]] = w
        return out

    def norm(w, size):
        out = torch.full((size,), float(w.mean()) * norm_scale, dtype=w.dtype)
        out[: w.shape[0]] = w * norm_scale
        return out

    for name, w in wide.state_dict().items():
        if name not in state:              # an appended layer: identity block, random readers
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                new_state[name] = torch.zeros_like(w)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                new_state[name] = torch.ones_like(w)
            elif name.endswith("norm.weight"):
                new_state[name] = torch.full_like(w, norm_scale)
            else:
                new_state[name] = torch.randn(w.shape, generator=generator).to(w.dtype) * std
            continue
        w0 = state[name]
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            new_state[name] = w0.clone()                     # over head_dim, unchanged
        elif name.endswith("norm.weight"):
            new_state[name] = norm(w0, d2)
        elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            new_state[name] = writer(w0, config.vocab_size, d2)   # [V, hidden]
        elif name.endswith("q_proj.weight"):
            new_state[name] = reader(w0, H2 * D, d2)
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            new_state[name] = reader(w0, G2 * D, d2)
        elif name.endswith("o_proj.weight"):
            new_state[name] = writer(w0, d2, H2 * D)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            new_state[name] = reader(w0, I2, d2)
        elif name.endswith("down_proj.weight"):
            new_state[name] = writer(w0, d2, I2)
        else:
            raise ValueError(f"widen does not know the parameter {name!r}")
    wide.load_state_dict(new_state)
    return wide.to(next(model.parameters()).dtype)
