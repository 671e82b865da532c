"""The inputs of one property example, as small frozen dataclasses.

A case holds everything a check needs (model specs, prompt, k, seeds), and its repr is valid
Python: a failure message prints it, and ``python -m properties.replay`` evaluates it to rerun
exactly that example. Everything random inside a case is derived from its seed (a case that
samples: ``case.sampling.seed``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from properties.models import DraftSpec, Qwen3Spec, TableSpec, TrainedSpec  # noqa: F401  (replay namespace)
from reference.dynamic_tree import DynamicTree
from reference.sampling import SamplingParams

# --------------------------------------------------------------------------- rule level

P_KINDS = ("dirichlet", "peaked", "flat", "sparse", "one_hot", "uniform", "tiny")
RELATIONS = ("independent", "equal", "disjoint", "overlap", "near", "nested")


def _one(rng, kind: str, vocab: int, support=None) -> np.ndarray:
    """One distribution over `vocab` tokens of the given kind, restricted to `support`."""
    idx = np.arange(vocab) if support is None else np.asarray(support)
    m = len(idx)
    w = np.zeros(vocab)
    if kind == "dirichlet":
        w[idx] = rng.dirichlet(np.full(m, 1.0))
    elif kind == "peaked":
        w[idx] = rng.dirichlet(np.full(m, 0.2))
    elif kind == "flat":
        w[idx] = rng.dirichlet(np.full(m, 20.0))
    elif kind == "sparse":
        keep = rng.choice(idx, size=max(1, m // 3), replace=False)
        w[keep] = rng.dirichlet(np.ones(len(keep)))
    elif kind == "one_hot":
        w[rng.choice(idx)] = 1.0
    elif kind == "uniform":
        w[idx] = 1.0
    elif kind == "tiny":
        # a few ordinary masses and a long tail of tiny ones (1e-12 .. 1e-4)
        big = rng.choice(idx, size=max(1, min(3, m // 2)), replace=False)
        w[idx] = 10.0 ** rng.uniform(-12, -4, size=m)
        w[big] = rng.dirichlet(np.ones(len(big)))
    else:
        raise ValueError(f"unknown distribution kind {kind!r}; choose from {P_KINDS}")
    if w.sum() <= 0:
        w[idx[0]] = 1.0
    return w / w.sum()


@dataclass(frozen=True)
class PairSpec:
    """A (p, q) pair. relation: how q relates to p.

    independent  p and q drawn separately (kinds p_kind, q_kind)
    equal        q = p
    disjoint     p and q live on disjoint halves of the vocabulary (every proposal rejected)
    overlap      supports overlap in part
    near         q = p mixed with 5% of another distribution (rejections rare)
    nested       q lives on a subset of p's support (the residual covers what q misses)
    chapter      the chapter's worked example p = [0.6, 0.3, 0.1], q = [0.2, 0.3, 0.5]
    """

    vocab: int
    seed: int
    p_kind: str = "dirichlet"
    q_kind: str = "dirichlet"
    relation: str = "independent"

    def build(self) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, self.vocab, 3])
        V = self.vocab
        if self.relation == "chapter":
            return (torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64),
                    torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64))
        if self.relation == "independent":
            p, q = _one(rng, self.p_kind, V), _one(rng, self.q_kind, V)
        elif self.relation == "equal":
            p = _one(rng, self.p_kind, V)
            q = p.copy()
        elif self.relation == "disjoint":
            if V < 2:
                raise ValueError("disjoint supports need vocab >= 2")
            perm = rng.permutation(V)
            half = V // 2
            p, q = _one(rng, self.p_kind, V, perm[:half]), _one(rng, self.q_kind, V, perm[half:])
        elif self.relation == "overlap":
            perm = rng.permutation(V)
            a = max(1, (2 * V) // 3)
            p, q = _one(rng, self.p_kind, V, perm[:a]), _one(rng, self.q_kind, V, perm[V - a:])
        elif self.relation == "near":
            p = _one(rng, self.p_kind, V)
            q = 0.95 * p + 0.05 * _one(rng, "dirichlet", V)
        elif self.relation == "nested":
            p = _one(rng, self.p_kind, V)
            support = np.flatnonzero(p > 0)
            sub = rng.choice(support, size=max(1, len(support) // 2), replace=False)
            q = _one(rng, self.q_kind, V, np.sort(sub))
        else:
            raise ValueError(f"unknown relation {self.relation!r}; choose from {RELATIONS}")
        p, q = p / p.sum(), q / q.sum()
        return torch.from_numpy(p), torch.from_numpy(q)


@dataclass(frozen=True)
class RuleCase:
    pair: PairSpec
    seed: int


# --------------------------------------------------------------------------- engine level

_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))
# A case's sampling: greedy unless told otherwise, seeded (everything random in a case is).
GREEDY = SamplingParams(seed=0)


class _Sampled:
    """What every case that samples shares: `sampling` (reference.sampling.SamplingParams, the
    project's one type for it), its seed an int (0 when none is given), and ``replace``, which
    takes the sampling's own fields too (``case.replace(temperature=0.0, stop_ids=())``)."""

    def __post_init__(self):
        if self.sampling.seed is None:
            object.__setattr__(self, "sampling", replace(self.sampling, seed=0))

    def replace(self, **changes):
        own = {name: changes.pop(name) for name in list(changes) if name in _SAMPLING_FIELDS}
        if own:
            changes["sampling"] = replace(changes.get("sampling", self.sampling), **own)
        return replace(self, **changes)


@dataclass(frozen=True)
class EngineCase(_Sampled):
    """One call of speculative_generate on kit models."""

    target: object            # TableSpec or Qwen3Spec
    draft: DraftSpec
    prompt: tuple
    max_new_tokens: int
    k: int = 4
    sampling: SamplingParams = GREEDY


@dataclass(frozen=True)
class BatchCase(_Sampled):
    """One call of batched_generate: prompts may differ in length and in max_new_tokens."""

    target: object
    draft: DraftSpec
    prompts: tuple            # tuple of tuples
    max_new_tokens: object    # int or tuple of ints, one per prompt
    k: int = 4
    sampling: SamplingParams = GREEDY


@dataclass(frozen=True)
class TreeCase(_Sampled):
    """One call of tree_generate: tree[d] children under every node at depth d, or a
    reference.dynamic_tree.DynamicTree (a shape grown per round); greedy at temperature 0, else
    sampled with a generator seeded from the sampling's seed."""

    target: object
    draft: DraftSpec
    prompt: tuple
    max_new_tokens: int
    tree: tuple = (2, 2, 2)
    sampling: SamplingParams = GREEDY


# --------------------------------------------------------------------------- served engines

@dataclass(frozen=True)
class ServedCase(_Sampled):
    """One completion request to the served target (token ids; temperature 0 is greedy)."""

    prompt: tuple
    max_tokens: int
    sampling: SamplingParams = GREEDY


def namespace() -> dict:
    """Names a case's repr may use (for eval in the replay tool)."""
    return {cls.__name__: cls for cls in (PairSpec, RuleCase, EngineCase, BatchCase, TreeCase,
                                          TableSpec, Qwen3Spec, TrainedSpec, DraftSpec, ServedCase,
                                          SamplingParams, DynamicTree)}
