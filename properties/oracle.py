"""What a lossless engine must produce, computed from the target alone, exactly (float64).

One computation, over any model given as a *batched next-logits function*
``next_logits(seqs: list[tuple]) -> Tensor[B, V]`` (float64; row b scores the token after the
non-empty seqs[b], from a fresh prefill):

* ``greedy_from(next_logits, prompt, n, stop_ids)``: the greedy continuation, each step an exact
  argmax (lowest index wins a tie), with the top-two logit gap at every step, so that a
  divergence at a genuine tie can be told apart from a bug;
* ``law_from(next_logits, prompt, L, temperature, top_k, top_p, stop_ids)``: the exact
  probability of every possible output of ancestral sampling for L steps (temperature, top-k,
  top-p exactly as ``reference.sampling`` defines them), a stop id ending an output early;
  outcomes in lexicographic order, one batched call per step for every open prefix. With
  ``row_probs`` (penalties, min_p, a logit bias: ``shaped(params, formula)``) each open
  prefix's row is processed with its own history.

Entry points, cached by the model's identity (``clear()`` forgets them all):

* kit specs (properties.models): ``greedy(spec, ...)``, ``sequence_law(spec, ...)``;
* the served target (properties.models.served, the weights a server loads):
  ``served_greedy``, ``served_law``, ``served_logits`` (every position of a continuation in one
  forward) and ``served_next_logits`` (the batched next-logits of any served model).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import torch

from properties.models import build_target
from properties.models import served as served_models
from reference.penalties import OPENAI
from reference.sampling import probs_from_logits

# Logit gaps below this count as ties: float64 forwards of the same model agree to ~1e-13.
TIE_TOLERANCE = 1e-9

SERVED_TARGET = "target"


# --------------------------------------------------------------------------- the computation

def greedy_from(next_logits, prompt, n: int, stop_ids=(), adjust=None) -> tuple[tuple, tuple]:
    """(tokens, gaps): the greedy continuation of `prompt` under `next_logits` (stopping after
    the first stop id) and the top-two logit gap at each step. `adjust(logits, prompt,
    generated)`: the logits greedy decoding takes the argmax of (after a bias and penalties),
    None for the raw ones."""
    stops = frozenset(stop_ids)
    seq, out, gaps = tuple(prompt), [], []
    for _ in range(n):
        logits = next_logits([seq])[0]
        if adjust is not None:
            logits = adjust(logits.double(), tuple(prompt), tuple(out))
        token = int(torch.argmax(logits))
        top = torch.topk(logits, min(2, logits.numel())).values
        gaps.append(float(top[0] - top[1]) if top.numel() > 1 else float("inf"))
        out.append(token)
        seq += (token,)
        if token in stops:
            break
    return tuple(out), tuple(gaps)


def law_from(next_logits, prompt, L: int, temperature: float, top_k: int = 0,
             top_p: float = 1.0, stop_ids=(), row_probs=None) -> dict:
    """outcome (tuple of generated tokens) -> exact probability, in lexicographic order.
    `row_probs(logits, prompt, generated)`: the law of the next token given its own history
    (penalties see it), replacing temperature, top_k and top_p; None: those three alone."""
    stops = frozenset(stop_ids)
    prompt = tuple(prompt)
    law: dict = {}
    frontier = [((), 1.0)]
    for _ in range(L):
        open_ = []
        for p, m in frontier:
            if p and p[-1] in stops:
                law[p] = m
            else:
                open_.append((p, m))
        if not open_:
            frontier = []
            break
        rows = next_logits([prompt + p for p, _ in open_])
        if row_probs is None:
            probs = probs_from_logits(rows.double(), temperature, top_k, top_p)
        else:
            probs = torch.stack([row_probs(row.double(), prompt, p)
                                 for row, (p, _) in zip(rows, open_)])
        frontier = []
        for (p, m), row in zip(open_, probs.tolist()):
            frontier += [(p + (t,), m * pr) for t, pr in enumerate(row) if pr > 0]
    for p, m in frontier:
        law[p] = m
    return {p: law[p] for p in sorted(law)}


# --------------------------------------------------------------------------- the models

def _kit_next_logits(spec):
    model = build_target(spec, role="oracle")
    return lambda seqs: torch.stack([model.next_logits(list(s)) for s in seqs])


def served_next_logits(seqs, name: str = SERVED_TARGET) -> torch.Tensor:
    """[B, V]: served model `name`'s logits for the token after each non-empty seqs[b] (one
    forward per length)."""
    return served_models.next_logits(seqs, name)


def _next_logits(model: tuple):
    """The batched next-logits function of a model identity: ("kit", spec) or ("served", name)."""
    kind, which = model
    if kind == "kit":
        return _kit_next_logits(which)
    return lambda seqs: served_next_logits(seqs, which)


@lru_cache(maxsize=768)
def _greedy(model: tuple, prompt: tuple, n: int, stops: frozenset):
    return greedy_from(_next_logits(model), prompt, n, stops)


@lru_cache(maxsize=192)
def _law(model: tuple, prompt: tuple, L: int, temperature: float, top_k: int, top_p: float,
         stops: frozenset):
    return law_from(_next_logits(model), prompt, L, temperature, top_k, top_p, stops)


def shaped(params, formula):
    """(row_probs, adjust) of a request's params under an engine's formula, for law_from and
    greedy_from: each row processed with its own history."""
    def row_probs(logits, prompt, generated):
        return formula.probs(logits, prompt, generated, params)

    def adjust(logits, prompt, generated):
        return formula.adjusted(logits, prompt, generated, params)
    return row_probs, adjust


def _bare(params):
    """The params as far as the law and the greedy output depend on them (no seed, n, stops
    or logprobs): one cache entry per law."""
    return replace(params, seed=None, n=1, stop_ids=(), stop_strings=(), logprobs=None)


@lru_cache(maxsize=192)
def _shaped_law(model: tuple, prompt: tuple, L: int, params, formula, stops: frozenset):
    row_probs, _ = shaped(params, formula)
    return law_from(_next_logits(model), prompt, L, params.temperature, params.top_k,
                    params.top_p, stops, row_probs=row_probs)


@lru_cache(maxsize=384)
def _shaped_greedy(model: tuple, prompt: tuple, n: int, params, formula, stops: frozenset):
    _, adjust = shaped(params, formula)
    return greedy_from(_next_logits(model), prompt, n, stops, adjust=adjust)


def _cached_law(model, prompt, L, temperature, top_k, top_p, stop_ids) -> dict:
    return dict(_law(model, tuple(int(t) for t in prompt), int(L), float(temperature),
                     int(top_k), float(top_p), frozenset(int(s) for s in stop_ids)))


def _cached_greedy(model, prompt, n, stop_ids) -> tuple[tuple, tuple]:
    return _greedy(model, tuple(int(t) for t in prompt), int(n),
                   frozenset(int(s) for s in stop_ids))


# --------------------------------------------------------------------------- kit specs

def greedy(spec, prompt, n: int, stop_ids=()) -> tuple[list[int], list[float]]:
    """The kit target's greedy continuation (stopping after the first stop id) and its gaps."""
    out, gaps = _cached_greedy(("kit", spec), prompt, n, stop_ids)
    return list(out), list(gaps)


def sequence_law(spec, prompt, L: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 stop_ids=()) -> dict:
    """outcome (tuple of generated tokens) -> exact probability under the target's sampler."""
    return _cached_law(("kit", spec), prompt, L, temperature, top_k, top_p, stop_ids)


# --------------------------------------------------------------------------- the served target

def served_greedy(prompt, n: int, stop_ids=(), params=None, formula=None) -> list[int]:
    """The served target's exact greedy continuation (lowest index wins a tie). `params`
    carrying a logit bias or penalties: the argmax of the logits after them, under `formula`
    (reference.penalties; default the OpenAI API's)."""
    return list(served_greedy_gaps(prompt, n, stop_ids, params, formula)[0])


def served_greedy_gaps(prompt, n: int, stop_ids=(), params=None, formula=None):
    """(tokens, gaps) of served_greedy: the top-two gap of the (adjusted) logits per step."""
    key = ("served", SERVED_TARGET)
    if params is None or not params.shaped:
        return _cached_greedy(key, prompt, n, stop_ids)
    return _shaped_greedy(key, tuple(int(t) for t in prompt), int(n), _bare(params),
                          formula or OPENAI, frozenset(int(s) for s in stop_ids))


def served_law(prompt, L: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
               stop_ids=(), params=None, formula=None) -> dict:
    """outcome (tuple of tokens) -> exact probability under the served target's sampler.
    `params` carrying penalties, min_p or a logit bias: the law under `formula`
    (reference.penalties; default the OpenAI API's), each step's row processed with its own
    history; then its temperature, top_k and top_p are the law's (they must agree with the
    positional ones)."""
    key = ("served", SERVED_TARGET)
    if params is None or not params.shaped:
        return _cached_law(key, prompt, L, temperature, top_k, top_p, stop_ids)
    if (params.temperature, params.top_k, params.top_p) != (temperature, top_k, top_p):
        raise ValueError(f"temperature, top_k, top_p ({temperature!r}, {top_k!r}, {top_p!r}) "
                         f"differ from those of params {params!r}")
    return dict(_shaped_law(key, tuple(int(t) for t in prompt), int(L), _bare(params),
                            formula or OPENAI, frozenset(int(s) for s in stop_ids)))


def served_logits(prompt, tokens) -> torch.Tensor:
    """[len(tokens), V]: row i is the served target's logits for the token after
    prompt + tokens[:i] (one forward of prompt + tokens)."""
    if not prompt:
        raise ValueError("prompt must hold at least one token id, got an empty prompt")
    if not tokens:
        vocab = served_models.build(SERVED_TARGET).config.vocab_size
        return torch.empty(0, vocab, dtype=torch.float64)
    seq = list(prompt) + list(tokens)
    return served_models.forward([seq[:-1]], SERVED_TARGET)[0][len(prompt) - 1:]


def clear() -> None:
    """Forget every cached result (after an engine edited the weights they were computed from)."""
    _greedy.cache_clear()
    _law.cache_clear()
    _shaped_law.cache_clear()
    _shaped_greedy.cache_clear()
