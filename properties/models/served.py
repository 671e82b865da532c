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

# Deeper variants of the served target, built as it is (seeded, its shapes but the depth), for a
# method that needs more layers than two: OpenVINO GenAI's EAGLE-3 reads three distinct
# decoder-layer outputs (issue 40). A method names one (methods.HeadDraft.target); its run makes
# it the served target (`use_target`): "target" in the export, the oracle and the replays. Not
# in MODELS: an export without a variant is unchanged.
VARIANTS = {"target-deep": "the served target's shapes with 4 layers (seed 9100)"}
DEEP_CONFIG = replace(TARGET_CONFIG, num_hidden_layers=4)
DEEP_SEED = 9100   # apart from the served models' and heads' seeds (9001 ...)
_TARGET = ["target"]     # what "target" is in this process: itself or a variant


def served_target() -> str:
    """The model "target" names in this process: "target" or a name of VARIANTS."""
    return _TARGET[0]


def use_target(name: str = "target") -> None:
    """Make `name` (a name of VARIANTS, or "target": the served target itself) what "target"
    names in this process, from now on: build, forward, next_logits and the export. Results
    cached from the other target elsewhere (properties.oracle) are the caller's to clear."""
    if name != "target" and name not in VARIANTS:
        raise ValueError(f"use_target: {name!r} is no variant of the served target; choose "
                         f"\"target\" or one of {sorted(VARIANTS)}")
    _TARGET[0] = name


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


def build(name: str) -> Qwen3:
    """The served model `name` (a key of MODELS, or of VARIANTS), float64, weights exact in
    float32; "target" is served_target()'s, and the early exit is that target's."""
    if name == "target" or name == "draft-early-exit":
        return _build(name, served_target())
    return _build(name, None)


@lru_cache(maxsize=None)
def _build(name: str, target: str | None) -> Qwen3:
    if name == "target":
        return _build(target, None) if target != "target" else _float32_exact(random_model(
            TARGET_CONFIG, seed=TARGET_SEED, dtype=torch.float32, std=PROJECTION_STD))
    if name == "target-deep":
        return _float32_exact(random_model(DEEP_CONFIG, seed=DEEP_SEED, dtype=torch.float32,
                                           std=PROJECTION_STD))
    if name == "draft-early-exit":
        # what the chapter's early exit computes
        reference_draft = EarlyExit(_build("target", target), 1)
        return standalone_early_exit(reference_draft.target, 1)
    if name == "draft-random":
        config = replace(TARGET_CONFIG, num_hidden_layers=1)
        return _float32_exact(random_model(config, seed=RANDOM_DRAFT_SEED, dtype=torch.float32,
                                           std=PROJECTION_STD))
    raise ValueError(f"unknown served model {name!r}; choose from {sorted(MODELS)} or a "
                     f"variant of the target, {sorted(VARIANTS)}")


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


@torch.no_grad()
def greedy_sequences(target, seed: int, rows: int, length: int) -> torch.Tensor:
    """[rows, length] token ids: seeded random prompts of 4 tokens, each continued by the
    target's greedy tokens: the text the served heads' readouts are fitted on."""
    c = target.config
    generator = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, c.vocab_size, (rows, 4), generator=generator)
    while seqs.shape[1] < length:
        cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim,
                        seqs.shape[1], torch.float64, "cpu")
        seqs = torch.cat([seqs, target(seqs, cache)[:, -1].argmax(-1)[:, None]], 1)
    return seqs
