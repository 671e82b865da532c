"""What a kit model is, as a small frozen spec (its repr is valid Python for the replay tool), and
the cached modules built from a spec: seeded Qwen3 models, the trained pair, table LMs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from reference.model import Config, EarlyExit, random_model

from properties.models.tables import LaggedLM, NegatedLM, NoisyLM, TableLM


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class TableSpec:
    """A table-driven target. scale: logit standard deviation (larger = more peaked);
    sparsity: fraction of tokens each context gives probability 0."""

    vocab: int
    seed: int
    scale: float = 2.0
    sparsity: float = 0.0
    tie_gap: float = 0.0     # > 0: every context's top-two logits differ by exactly this

    @property
    def kind(self) -> str:
        return "table"


@dataclass(frozen=True)
class Qwen3Spec:
    """A seeded random tiny Qwen3 target (reference.model), float64."""

    vocab: int
    seed: int
    layers: int = 1
    hidden: int = 16

    @property
    def kind(self) -> str:
        return "qwen3"


@dataclass(frozen=True)
class TrainedSpec:
    """The committed trained target (reference/trained/, `make models`; another directory with
    --kit-trained, e.g. make models-large's weight-bound target), float64. Its drafts:
    small (the separately trained 1-layer model), early_exit (the target's first layers, trained
    for it), perfect. Its vocabulary (2,048) is too large for exact laws of long outputs: it is
    used where the vocabulary does not matter (greedy, cache, bounds) or the law stays small
    (top-k sampling)."""

    vocab: int = 2048

    @property
    def kind(self) -> str:
        return "qwen3"


@dataclass(frozen=True)
class DraftSpec:
    """How the draft relates to the target.

    random      an independent model of the same kind and vocabulary
    perfect     the target itself (a separate wrapper with its own caches)
    early_exit  qwen3: the target's first layer, then its final norm and head
    negated     the target with its logits negated: its argmax is never the target's
    rolled      qwen3: the target with its head rows rolled by one token (argmax + 1)
    small       trained: the separately trained small draft
    noisy       the target's logits plus small noise: agrees most of the time
    lagged      table: the target's prediction one position earlier (shifted by one)
    """

    variant: str = "random"
    seed: int = 0


QWEN3_DRAFTS = ("random", "early_exit", "perfect", "negated", "rolled", "noisy")
TABLE_DRAFTS = ("random", "perfect", "negated", "noisy", "lagged")
TRAINED_DRAFTS = ("small", "early_exit", "perfect")


_TRAINED_DIR: list = []   # the directory chosen with --kit-trained; empty: the committed pair


def use_trained_models(path) -> Path:
    """Run the kit's trained properties on the models in `path` (a directory written by
    `make models` or `make models-large`) instead of the committed pair; checked here, so that
    a wrong path is one clear error before any example is drawn."""
    from reference.pretrained import load_dir
    path = Path(path)
    try:
        pair = load_dir(path, dtype=torch.float64)
    except (FileNotFoundError, OSError) as error:
        raise ValueError(f"--kit-trained={path}: not a trained-models directory ({error})") from None
    if pair.target.config.vocab_size != TrainedSpec.vocab:
        raise ValueError(f"--kit-trained={path}: the target's vocabulary is "
                         f"{pair.target.config.vocab_size}, the kit's trained cases need "
                         f"{TrainedSpec.vocab}")
    _TRAINED_DIR[:] = [path]
    trained_pair.cache_clear()
    qwen3_module.cache_clear()
    qwen3_draft_module.cache_clear()
    return path


def trained_dir() -> Path:
    from reference.pretrained import TRAINED_DIR
    return _TRAINED_DIR[0] if _TRAINED_DIR else TRAINED_DIR


@lru_cache(maxsize=1)
def trained_pair():
    """The trained models in float64, from trained_dir() (reloaded after reset_models)."""
    from reference.pretrained import load_dir
    pair = load_dir(trained_dir(), dtype=torch.float64)
    if pair.target.config.vocab_size != TrainedSpec.vocab:
        raise ValueError(f"the trained target's vocabulary is {pair.target.config.vocab_size}, "
                         f"TrainedSpec says {TrainedSpec.vocab}")
    return pair


def qwen3_config(spec: Qwen3Spec) -> Config:
    return Config(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
                  num_hidden_layers=spec.layers, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=8, max_position_embeddings=4096)


@lru_cache(maxsize=64)
def qwen3_module(spec: Qwen3Spec):
    if isinstance(spec, TrainedSpec):
        return trained_pair().target.eval().requires_grad_(False)
    return random_model(qwen3_config(spec), seed=spec.seed, dtype=torch.float64)


@lru_cache(maxsize=64)
def qwen3_draft_module(spec: Qwen3Spec, draft: DraftSpec):
    target = qwen3_module(spec)
    v = draft.variant
    if v == "perfect":
        return target
    if isinstance(spec, TrainedSpec):
        if v == "small":
            return trained_pair().small.eval().requires_grad_(False)
        if v == "early_exit":
            return EarlyExit(target, trained_pair().exit_layers).eval().requires_grad_(False)
        raise ValueError(f"the trained target's drafts are {TRAINED_DRAFTS}, got {v!r}")
    if v == "random":
        return qwen3_module(Qwen3Spec(spec.vocab, seed=10_000 + draft.seed, layers=1,
                                      hidden=spec.hidden))
    if v == "early_exit":
        if spec.layers < 2:
            raise ValueError("an early_exit draft needs a target with at least 2 layers")
        return EarlyExit(target, 1).eval().requires_grad_(False)
    module = copy.deepcopy(target)
    with torch.no_grad():
        head = module.lm_head.weight
        if v == "negated":
            head.neg_()
        elif v == "rolled":
            head.copy_(torch.roll(head.clone(), shifts=1, dims=0))
        elif v == "noisy":
            g = torch.Generator().manual_seed(draft.seed)
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
        else:
            raise ValueError(f"unknown qwen3 draft variant {v!r}; choose from {QWEN3_DRAFTS}")
    return module.eval().requires_grad_(False)


@lru_cache(maxsize=64)
def table_lm(spec: TableSpec):
    return TableLM(spec.vocab, spec.seed, spec.scale, spec.sparsity, spec.tie_gap)


@lru_cache(maxsize=64)
def table_draft_lm(spec: TableSpec, draft: DraftSpec):
    base = table_lm(spec)
    v = draft.variant
    if v == "perfect":
        return base
    if v == "random":
        return table_lm(TableSpec(spec.vocab, seed=10_000 + draft.seed, scale=spec.scale,
                                  sparsity=spec.sparsity, tie_gap=spec.tie_gap))
    if v == "negated":
        return NegatedLM(base)
    if v == "noisy":
        return NoisyLM(base, draft.seed)
    if v == "lagged":
        return LaggedLM(base)
    raise ValueError(f"unknown table draft variant {v!r}; choose from {TABLE_DRAFTS}")
