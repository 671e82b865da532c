"""Turning logits into the distribution a sampler draws from.

The order is the one samplers conventionally use: temperature first, then top-k, then top-p
on what top-k left. Both filters keep ties at their boundary, so the kept set depends only on
the values, never on how a sort happened to order equal entries. Greedy decoding is an exact
argmax (lowest index wins a tie), not a tiny temperature.
"""

import math
import sys
from dataclasses import dataclass, fields

import torch


def check_logits(logits: torch.Tensor, name: str = "logits") -> None:
    if not torch.is_tensor(logits) or not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(logits).__name__}")
    if torch.isnan(logits).any():
        raise ValueError(f"{name} contains NaN at index {torch.isnan(logits).nonzero()[0].tolist()}")
    if torch.isposinf(logits).any():
        raise ValueError(f"{name} contains +inf at index {torch.isposinf(logits).nonzero()[0].tolist()}")


def check_distribution(probs: torch.Tensor, name: str, atol: float = 1e-6) -> None:
    """A distribution over the last dimension: finite, non-negative, summing to one."""
    if not torch.is_tensor(probs) or not probs.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(probs).__name__}")
    if not torch.isfinite(probs).all():
        bad = (~torch.isfinite(probs)).nonzero()[0].tolist()
        raise ValueError(f"{name} has a non-finite entry {probs[tuple(bad)].item()} at index {bad}")
    if (probs < 0).any():
        bad = (probs < 0).nonzero()[0].tolist()
        raise ValueError(f"{name} has a negative entry {probs[tuple(bad)].item()} at index {bad}")
    total = probs.sum(-1)
    if ((total - 1).abs() > atol * probs.shape[-1] ** 0.5 + atol).any():
        raise ValueError(f"{name} must sum to 1 over its last dimension, sums to {total.flatten()[:4].tolist()}")


def check_temperature(temperature: float) -> None:
    """0 (greedy) or a finite temperature that logits can be divided by."""
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or math.isnan(temperature) or temperature < 0):
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    if math.isinf(temperature):
        raise ValueError(f"temperature must be finite, got {temperature!r}: logits / inf is 0 "
                         f"everywhere, a uniform distribution rather than a sampler")
    if 0 < temperature < sys.float_info.min:
        # A subnormal temperature: 1 / temperature overflows, so every logit divided by it is
        # +-inf and the softmax is NaN. Greedy decoding is temperature=0.
        raise ValueError(f"temperature={temperature!r} underflows: it is below the smallest "
                         f"normal float64 {sys.float_info.min!r}, so logits / temperature "
                         f"overflows; use temperature=0 for greedy decoding")


def check_sampling_args(temperature: float, top_k: int, top_p: float) -> None:
    check_temperature(temperature)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {top_p!r}")


def probs_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                      top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / temperature) restricted to the top-k, then to the top-p nucleus.

    Works over the last dimension of any shape; returns the logits' dtype (use float64 when
    exactness matters). top_k keeps every token whose logit is >= the k-th largest; top_p keeps
    every token for which the mass of the strictly more probable tokens is < top_p.
    """
    check_logits(logits)
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("temperature=0 means greedy: use greedy_token, not a distribution")
    scaled = logits / temperature
    overflow = torch.isinf(scaled) & torch.isfinite(logits)
    if overflow.any():
        # A tiny temperature can overflow the logits' dtype (e.g. float32 logits at 1e-40).
        raise ValueError(f"temperature={temperature!r} is too small for these {logits.dtype} "
                         f"logits: logits / temperature overflows at index "
                         f"{overflow.nonzero()[0].tolist()}; use temperature=0 for greedy decoding")
    if top_k and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        # In descending order the mass strictly before each entry is monotone, so the kept
        # entries are a sorted prefix; widening it to every token >= its smallest value keeps
        # the ties, whose strictly-more-probable mass is no larger than the prefix's last.
        ordered = probs.sort(dim=-1, descending=True).values
        before = ordered.cumsum(-1) - ordered
        count = (before < top_p).sum(-1, keepdim=True)
        smallest_kept = ordered.gather(-1, count - 1)
        probs = probs.masked_fill(probs < smallest_kept, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """Exact argmax over the last dimension; the lowest index wins a tie."""
    check_logits(logits)
    # torch.argmax is documented to return the first maximal index.
    return logits.argmax(-1)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: the project's one type for it, from the kit's strategies and
    cases to the bodies of HTTP requests and the fast engine's API.

    temperature 0 is greedy (an exact argmax); otherwise ``probs(logits)`` is the law a lossless
    engine must sample from (``probs_from_logits``). A stop id ends the output where it first
    occurs and is kept. ``seed`` seeds the sampler (a request's seed; the generator of an
    in-process run); ``n`` asks for that many independent completions of one request.

    What users send besides (each off at its default, so the defaults change nothing):
    ``repetition_penalty`` (1 = off), ``presence_penalty`` and ``frequency_penalty`` (0 = off),
    ``min_p`` (0 = off), ``logit_bias`` (pairs (token, bias); empty = off), ``stop_strings``
    (texts that end the output where they first complete), ``logprobs`` (None = off, else how
    many top alternatives to return per token). The penalties depend on the history, so their
    law is ``probs_after(logits, prompt, generated, formula)``, where the formula
    (reference.penalties) is the engine's order of operations.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: tuple = ()
    seed: int | None = None
    n: int = 1
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: tuple = ()
    stop_strings: tuple = ()
    logprobs: int | None = None

    def __post_init__(self):
        check_sampling_args(self.temperature, self.top_k, self.top_p)
        stops = tuple(self.stop_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stops):
            raise ValueError(f"stop_ids must be token ids (ints >= 0), got {self.stop_ids!r}")
        object.__setattr__(self, "stop_ids", stops)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        check_penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty,
                        self.min_p)
        object.__setattr__(self, "logit_bias", normal_logit_bias(self.logit_bias))
        strings = (self.stop_strings,) if isinstance(self.stop_strings, str) else self.stop_strings
        strings = tuple(strings)
        if not all(isinstance(s, str) and s for s in strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        object.__setattr__(self, "stop_strings", strings)
        if self.logprobs is not None and (not isinstance(self.logprobs, int)
                                          or isinstance(self.logprobs, bool) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None (off) or an int >= 0 (top alternatives per "
                             f"token), got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the law depends on the history (a penalty is on)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def shaped(self) -> bool:
        """Whether anything besides temperature, top-k and top-p shapes the law."""
        return self.penalized or bool(self.logit_bias) or self.min_p != 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution this request samples from after `logits` (not for greedy), for the
        history-free case (temperature, top-k, top-p); see probs_after for the rest."""
        if self.shaped:
            raise ValueError(f"{self!r} carries penalties, min_p or a logit bias: their law "
                             f"depends on the engine's formula (and the history); use "
                             f"probs_after(logits, prompt, generated, formula)")
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)

    def adjusted(self, logits: torch.Tensor, prompt, generated, formula):
        """The logits after the bias and the penalties, for the token after prompt +
        generated, under `formula` (a reference.penalties.Formula, e.g. its OPENAI: the
        engine's order of operations, passed in, since reference.penalties builds on this
        module). Greedy decoding takes their argmax."""
        return formula.adjusted(logits, prompt, generated, self)

    def probs_after(self, logits: torch.Tensor, prompt, generated, formula):
        """The distribution after prompt + generated under `formula` (a
        reference.penalties.Formula; not for greedy)."""
        return formula.probs(logits, prompt, generated, self)

    def __repr__(self):
        # only what differs from the defaults: a failing case's replay line stays short
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                   if getattr(self, f.name) != f.default]
        return f"SamplingParams({', '.join(changed)})"


def _finite(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def check_penalties(repetition: float, presence: float, frequency: float, min_p: float) -> None:
    if not _finite(repetition) or repetition <= 0:
        raise ValueError(f"repetition_penalty must be a finite number > 0 (1 disables it), got "
                         f"{repetition!r}")
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not _finite(value):
            raise ValueError(f"{name} must be a finite number (0 disables it), got {value!r}")
    if not _finite(min_p) or not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {min_p!r}")


def normal_logit_bias(bias) -> tuple:
    """((token, bias), ...) sorted by token, from pairs or a dict; hashable, so a case holding
    it can be cached and replayed."""
    pairs = tuple(bias.items()) if isinstance(bias, dict) else bias
    try:
        pairs = tuple((t, b) for t, b in pairs)
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must be (token, bias) pairs or a dict, got {bias!r}") from None
    for t, b in pairs:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"logit_bias token must be an int >= 0, got {t!r} in {bias!r}")
        if not _finite(b):
            raise ValueError(f"logit_bias of token {t} must be a finite number, got {b!r}")
    tokens = [t for t, _ in pairs]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"logit_bias names a token twice: {bias!r}")
    return tuple(sorted((t, float(b)) for t, b in pairs))


class Sampler:
    """One run's token choices: its SamplingParams and its generator. Greedy is the exact
    argmax; otherwise every draw is from the filtered distribution the params define."""

    def __init__(self, params: SamplingParams, generator=None):
        self.params, self.generator = params, generator

    @property
    def greedy(self):
        return self.params.greedy

    def probs(self, logits):
        return self.params.probs(logits.double())

    def draw(self, probs):
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def choose(self, logits):
        """The next token: the argmax, or one draw from the filtered distribution."""
        return int(greedy_token(logits)) if self.greedy else self.draw(self.probs(logits))

    def uniform(self, device):
        # u is uniform on [0, 1), so P(u < ratio) = min(1, ratio) exactly.
        return torch.rand((), generator=self.generator, dtype=torch.float64, device=device)
