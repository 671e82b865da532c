"""What a lossless engine must produce, computed from the target alone.

* ``greedy``: the target's greedy continuation, each step an exact argmax (lowest index wins a
  tie) of float64 logits from a fresh prefill of the whole prefix; with the top-two logit gap at
  every step, so that a divergence at a genuine tie can be told apart from a bug.
* ``sequence_law``: the exact probability of every possible output of ancestral sampling from
  the target for L steps (temperature, top-k, top-p exactly as ``reference.sampling`` defines
  them), where a stop id ends a sequence early.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from properties.models import KitModel, build_target
from reference.sampling import probs_from_logits

# Logit gaps below this count as ties: float64 forwards of the same model agree to ~1e-13.
TIE_TOLERANCE = 1e-9


@lru_cache(maxsize=256)
def _greedy(spec, prompt: tuple, n: int, stops: frozenset):
    model = build_target(spec, role="oracle")
    seq, out, gaps = list(prompt), [], []
    for _ in range(n):
        logits = model.next_logits(seq)
        token = int(torch.argmax(logits))
        top = torch.topk(logits, min(2, logits.numel())).values
        gaps.append(float(top[0] - top[1]) if top.numel() > 1 else float("inf"))
        out.append(token)
        seq.append(token)
        if token in stops:
            break
    return tuple(out), tuple(gaps)


def greedy(spec, prompt, n: int, stop_ids=()) -> tuple[list[int], list[float]]:
    """The target's greedy continuation (stopping after the first stop id) and its gaps."""
    out, gaps = _greedy(spec, tuple(int(t) for t in prompt), int(n), frozenset(stop_ids))
    return list(out), list(gaps)


@lru_cache(maxsize=64)
def _law(spec, prompt: tuple, L: int, temperature: float, top_k: int, top_p: float,
         stops: frozenset):
    model: KitModel = build_target(spec, role="oracle")
    law: dict = {}

    def expand(prefix: tuple, mass: float):
        if len(prefix) == L or (prefix and prefix[-1] in stops):
            law[prefix] = law.get(prefix, 0.0) + mass
            return
        logits = model.next_logits(list(prompt) + list(prefix))
        probs = probs_from_logits(logits.double(), temperature, top_k, top_p)
        for token, pr in enumerate(probs.tolist()):
            if pr > 0:
                expand(prefix + (token,), mass * pr)

    expand((), 1.0)
    return law


def sequence_law(spec, prompt, L: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 stop_ids=()) -> dict:
    """outcome (tuple of generated tokens) -> exact probability under the target's sampler."""
    return dict(_law(spec, tuple(int(t) for t in prompt), int(L), float(temperature), int(top_k),
                     float(top_p), frozenset(stop_ids)))


def clear() -> None:
    """Forget every cached result (after an engine edited the weights they were computed from)."""
    _greedy.cache_clear()
    _law.cache_clear()
