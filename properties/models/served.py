"""The kit's served models: a small fixed set, rebuilt bit for bit from seeds.

A server loads checkpoints; the kit computes the exact law from the same weights. Both sides
build them here: the export writes them, the checks rebuild them in memory (and the identity
probe confirms that the server holds the same target before anything else is checked).

Shapes are ones GPU servers accept (head_dim 64, a vocabulary of 32 tokens): small enough that
the exact law of two tokens has 1,024 outcomes, so it is enumerated exactly. Weights are
float32 values (the dtype servers load); the kit's oracle runs the very same numbers in float64.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import torch

from reference.cache import KVCache
from reference.model import Config, EarlyExit, Qwen3, random_model

VOCAB = 32
TARGET_CONFIG = Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=64, rope_theta=10000.0, max_position_embeddings=2048)
TARGET_SEED = 9001
RANDOM_DRAFT_SEED = 9002
# A larger projection scale than random_model's default makes next-token laws peaked (top
# probability around one half), as in trained models: greedy gaps are wide, and a sampled
# law of two tokens keeps most of its mass on cells the chi-square test can see one by one.
PROJECTION_STD = 0.6

# name -> what it is (the directory names of the export)
MODELS = {
    "target": "the target: 2 layers",
    "draft-early-exit": "the target's first layer, then its final norm and head",
    "draft-random": "an independent random model of 1 layer (rarely agrees with the target)",
}


def _float32_exact(model: Qwen3) -> Qwen3:
    """float32 weights held in float64: the exact numbers a float32 checkpoint stores."""
    return model.to(torch.float32).to(torch.float64).eval().requires_grad_(False)


def standalone_early_exit(target: Qwen3, depth: int) -> Qwen3:
    """The early exit after `depth` blocks as a model of its own (a checkpoint cannot share the
    target's weights): the same numbers as reference.model.EarlyExit(target, depth)."""
    config = replace(target.config, num_hidden_layers=depth)
    standalone = Qwen3(config).to(target.lm_head.weight.dtype)
    keep = {name: t for name, t in target.state_dict().items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < depth}
    standalone.load_state_dict(keep, strict=True)
    return standalone.eval().requires_grad_(False)


@lru_cache(maxsize=None)
def build(name: str) -> Qwen3:
    """The served model `name` (a key of MODELS), float64, weights exact in float32."""
    if name == "target":
        return _float32_exact(random_model(TARGET_CONFIG, seed=TARGET_SEED, dtype=torch.float32,
                                           std=PROJECTION_STD))
    if name == "draft-early-exit":
        reference_draft = EarlyExit(build("target"), 1)  # what the chapter's early exit computes
        return standalone_early_exit(reference_draft.target, 1)
    if name == "draft-random":
        config = replace(TARGET_CONFIG, num_hidden_layers=1)
        return _float32_exact(random_model(config, seed=RANDOM_DRAFT_SEED, dtype=torch.float32,
                                           std=PROJECTION_STD))
    raise ValueError(f"unknown served model {name!r}; choose from {sorted(MODELS)}")


def forward(seqs, name: str) -> torch.Tensor:
    """Float64 logits [B, T, V] of served model `name` for equal-length sequences, from a
    fresh prefill."""
    model = build(name)
    c = model.config
    cache = KVCache(len(model.layers), len(seqs), c.num_key_value_heads, c.head_dim,
                    len(seqs[0]), torch.float64, "cpu")
    with torch.inference_mode():
        return model(torch.tensor([list(s) for s in seqs], dtype=torch.long), cache)


def next_logits(seqs, name: str) -> torch.Tensor:
    """[B, V]: served model `name`'s logits for the token after each non-empty seqs[b] (one
    forward per length)."""
    seqs = [tuple(s) for s in seqs]
    if len({len(s) for s in seqs}) == 1:
        return forward(seqs, name)[:, -1]
    return torch.stack([forward([s], name)[0, -1] for s in seqs])
