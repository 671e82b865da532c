"""Seeded random weights for a head, as reference.model.random_model gives a target: for
tests and demonstrations, where no trained head exists."""

import torch

from reference.heads import KINDS
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads


def randomize(head, seed: int = 0, std: float | None = None, dtype=torch.float64):
    """Fill the head's own parameters (never the target's, which it only borrows): norms 1,
    embeddings normal(0, 1), other weights normal(0, std), std = 2.4 / sqrt(hidden_size) by
    default as in random_model; o_proj and down_proj, which write into a residual stream, get
    std / 100 there too. Returns the head in `dtype`, in eval mode, without gradients."""
    H = head.config.hidden_size
    std = 2.4 / H ** 0.5 if std is None else std
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            scale = (1.0 if "embed_tokens" in name
                     else std / 100 if name.endswith(("o_proj.weight", "down_proj.weight"))
                     else std)
            p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return head.to(dtype=dtype).eval().requires_grad_(False)


def random_head(kind: str, target, seed: int = 0, dtype=torch.float64, **options):
    """A head of `kind` (eagle, eagle3, medusa, mtp, dflash) for `target` with seeded random
    weights. options go to the head's constructor (hidden=..., num_heads=..., draft_vocab=...,
    block_size=...)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    cls = KINDS[kind]
    if cls is MedusaHeads:
        options.setdefault("num_heads", 4)
    head = cls(target.config, **options) if cls in (Eagle3Head, MedusaHeads) else cls(target, **options)
    return randomize(head, seed, dtype=dtype).to(device=target.lm_head.weight.device)
