"""Rotary position tables, computed once instead of on every layer of every call.

The angles are computed exactly as reference.model.rotate computes them (float64 positions
times float64 inverse frequencies, cos/sin in float64, then cast to the model's dtype), so a
lookup gives bit-identical factors. The sin table carries the rotation's sign: for the
half-split layout, rotate(x) = x * cos + [x2, x1] * [-sin, sin], and a sign flip is exact, so
this equals the reference's x * cos + [-x2, x1] * sin to the last bit with one op fewer.
"""

import torch

_TABLES = {}


def rotary_table(head_dim: int, theta: float, length: int, dtype: torch.dtype, device):
    """cos [length, head_dim] and signed sin [length, head_dim] in `dtype`; row p = position p."""
    key = (head_dim, theta, dtype, str(device))
    cached = _TABLES.get(key)
    if cached is not None and cached[0].shape[0] >= length:
        return cached
    length = max(length, 256)
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    positions = torch.arange(length, device=device, dtype=torch.float64)
    angles = positions[:, None] * inv_freq                        # [length, head_dim / 2]
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)             # [length, head_dim]
    sin = angles.sin()
    signed_sin = torch.cat([-sin, sin], -1).to(dtype)             # [length, head_dim]
    _TABLES[key] = (cos, signed_sin)
    return cos, signed_sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]; cos, signed_sin [B, T, 1, D] (looked up at each token's position)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * signed_sin
