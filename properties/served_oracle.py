"""What the served target must produce, in float64 from the very weights the server loaded.

* ``logits(prompt, tokens)``: the target's next-token logits at every position of `tokens`
  (one forward of prompt + tokens; position i scores tokens[i]);
* ``greedy(prompt, n, stop_ids)``: the exact greedy continuation (lowest index wins a tie);
* ``law(prompt, L, temperature, top_k, top_p, stop_ids)``: the exact probability of every
  output of ancestral sampling for L tokens (reference.sampling semantics; a stop id ends an
  output early).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from properties.models.served import build
from reference.cache import KVCache
from reference.sampling import probs_from_logits

MODEL = "target"


def _forward(seqs: list[list[int]], name: str = MODEL) -> torch.Tensor:
    """Float64 logits [B, T, V] for equal-length sequences, from a fresh prefill."""
    model = build(name)
    c = model.config
    T = len(seqs[0])
    cache = KVCache(len(model.layers), len(seqs), c.num_key_value_heads, c.head_dim, T,
                    torch.float64, "cpu")
    with torch.inference_mode():
        return model(torch.tensor(seqs, dtype=torch.long), cache)


def next_logits(seq, name: str = MODEL) -> torch.Tensor:
    """[V]: served model `name`'s logits for the token after the non-empty `seq`."""
    return _forward([list(seq)], name)[0, -1]


def logits(prompt, tokens) -> torch.Tensor:
    """[len(tokens), V]: row i is the target's logits for the token after prompt + tokens[:i]."""
    if not prompt:
        raise ValueError("prompt must hold at least one token id, got an empty prompt")
    seq = list(prompt) + list(tokens)
    if not tokens:
        return torch.empty(0, build(MODEL).config.vocab_size, dtype=torch.float64)
    out = _forward([seq[:-1]])[0]
    return out[len(prompt) - 1:]


@lru_cache(maxsize=512)
def _greedy(prompt: tuple, n: int, stops: frozenset) -> tuple:
    seq, out = list(prompt), []
    for _ in range(n):
        token = int(torch.argmax(_forward([seq])[0, -1]))
        out.append(token)
        seq.append(token)
        if token in stops:
            break
    return tuple(out)


def greedy(prompt, n: int, stop_ids=()) -> list[int]:
    return list(_greedy(tuple(int(t) for t in prompt), int(n), frozenset(stop_ids)))


@lru_cache(maxsize=128)
def _law(prompt: tuple, L: int, temperature: float, top_k: int, top_p: float,
         stops: frozenset) -> dict:
    law: dict = {}
    frontier = [((), 1.0)]
    for _ in range(L):
        open_ = [(p, m) for p, m in frontier if not (p and p[-1] in stops)]
        for p, m in frontier:
            if p and p[-1] in stops:
                law[p] = law.get(p, 0.0) + m
        if not open_:
            frontier = []
            break
        rows = _forward([list(prompt) + list(p) for p, _ in open_])[:, -1]
        probs = probs_from_logits(rows, temperature, top_k, top_p)
        frontier = []
        for (p, m), row in zip(open_, probs.tolist()):
            frontier += [(p + (t,), m * pr) for t, pr in enumerate(row) if pr > 0]
    for p, m in frontier:
        law[p] = law.get(p, 0.0) + m
    return law


def law(prompt, L: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
        stop_ids=()) -> dict:
    """outcome (tuple of tokens) -> exact probability."""
    return dict(_law(tuple(int(t) for t in prompt), int(L), float(temperature), int(top_k),
                     float(top_p), frozenset(int(s) for s in stop_ids)))
