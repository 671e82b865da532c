"""Logit adjustments that depend on the history, and where an engine applies them.

A request may carry a logit bias, a repetition penalty, presence and frequency penalties and
min_p besides temperature, top-k and top-p. Engines agree on what each one does to a logit but
not on the *formula* as a whole: which history a penalty counts (the prompt too, or only the
generated tokens; the whole context or its last N tokens), and where min_p sits among the
filters. A `Formula` states those choices; the law of a request is then exact given the
engine's formula (properties/formulas.py holds each engine's, read from its source).

Every formula here applies, in this order (the order all three engines the kit knows share):

    1. logit_bias            added to the raw logits
    2. repetition_penalty    a token of the repetition history: a positive logit divided by the
                             penalty, a non-positive one multiplied by it
    3. frequency, presence   logit -= frequency * count + presence * (count > 0), count over the
                             counting history
    4. temperature, then min_p (tokens with p < min_p * p_max removed) and top-k and top-p
       (reference.sampling), min_p before top-k or after top-p as the formula says

Greedy decoding is the exact argmax of the logits after steps 1-3 (min_p, temperature, top-k
and top-p never move the argmax).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from reference.sampling import probs_from_logits

HISTORIES = ("prompt+output", "output")


@dataclass(frozen=True)
class Formula:
    """One engine's order of operations and the history each penalty sees.

    repetition_sees   the tokens the repetition penalty applies to: "prompt+output" or "output"
    counts_see        the tokens frequency and presence count: "prompt+output", "output", or
                      None where the engine has no such penalties (requests carrying them are
                      not the engine's to judge under this formula)
    window            only the last `window` tokens of the history count (None: all of it)
    min_p_after_top_p min_p filters after top-p (True) or right after temperature (False);
                      p / p_max is the same before and after renormalizing, so min_p after
                      top-p is the intersection of both kept sets
    """

    name: str
    repetition_sees: str = "prompt+output"
    counts_see: str | None = "output"
    window: int | None = None
    min_p_after_top_p: bool = False

    def __post_init__(self):
        if self.repetition_sees not in HISTORIES:
            raise ValueError(f"repetition_sees must be one of {HISTORIES}, got "
                             f"{self.repetition_sees!r}")
        if self.counts_see is not None and self.counts_see not in HISTORIES:
            raise ValueError(f"counts_see must be one of {HISTORIES} or None, got "
                             f"{self.counts_see!r}")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"window must be an int >= 1 or None, got {self.window!r}")

    def history(self, which: str, prompt, generated) -> tuple:
        seen = tuple(prompt) + tuple(generated) if which == "prompt+output" else tuple(generated)
        return seen[-self.window:] if self.window is not None else seen

    def adjusted(self, logits: torch.Tensor, prompt, generated, params) -> torch.Tensor:
        """Steps 1-3: the logits after the bias and the penalties, for the token after
        prompt + generated. `logits`: [V] (float64 for exactness)."""
        if self.counts_see is None and (params.presence_penalty or params.frequency_penalty):
            raise ValueError(f"the {self.name} formula has no presence or frequency penalty; "
                             f"got presence_penalty={params.presence_penalty!r}, "
                             f"frequency_penalty={params.frequency_penalty!r}")
        x = logits.clone()
        vocab = x.shape[-1]
        for token, bias in params.logit_bias:
            if token >= vocab:
                raise ValueError(f"logit_bias token {token} is outside the vocabulary 0..{vocab - 1}")
            x[..., token] += bias
        if params.repetition_penalty != 1.0:
            seen = sorted(set(self.history(self.repetition_sees, prompt, generated)))
            if seen:
                r = params.repetition_penalty
                part = x[..., seen]
                x[..., seen] = torch.where(part > 0, part / r, part * r)
        if self.counts_see is not None and (params.presence_penalty or params.frequency_penalty):
            counts = Counter(self.history(self.counts_see, prompt, generated))
            for token, count in counts.items():
                x[..., token] -= params.frequency_penalty * count + params.presence_penalty
        return x

    def probs(self, logits: torch.Tensor, prompt, generated, params) -> torch.Tensor:
        """The distribution the request samples from after prompt + generated (not greedy)."""
        if params.greedy:
            raise ValueError("temperature=0 means greedy: use the argmax of adjusted(), not a "
                             "distribution")
        x = self.adjusted(logits, prompt, generated, params)
        if not params.min_p:
            return probs_from_logits(x, params.temperature, params.top_k, params.top_p)
        if self.min_p_after_top_p:
            probs = probs_from_logits(x, params.temperature, params.top_k, params.top_p)
            return renormalized(min_p_filter(probs, params.min_p))
        scaled = probs_from_logits(x, params.temperature)    # min_p sees the tempered law
        kept = min_p_filter(scaled, params.min_p) > 0
        # the tempered logits with the removed tokens at -inf: top-k and top-p see the rest
        tempered = (x / params.temperature).masked_fill(~kept, -math.inf)
        return probs_from_logits(tempered, 1.0, params.top_k, params.top_p)


def min_p_filter(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """probs with every entry below min_p times the largest set to 0 (not renormalized)."""
    top = probs.amax(-1, keepdim=True)
    return probs.masked_fill(probs < min_p * top, 0.0)


def renormalized(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(-1, keepdim=True)


# The OpenAI API's definitions (presence and frequency over the generated tokens; its
# repetition_penalty extension over prompt and output) with min_p right after temperature:
# the default formula, and vLLM's (properties/formulas.py cites its source).
OPENAI = Formula("openai", repetition_sees="prompt+output", counts_see="output")
