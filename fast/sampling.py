"""Sampling distributions and exact categorical draws, vectorized and free of host syncs.

`filtered_probs` has the semantics of reference.sampling.probs_from_logits (temperature, then
top-k keeping ties, then top-p keeping ties) but skips its validation: the checks there read
tensor values on the host (`if torch.isnan(...).any()`), which would cost a device sync per
call inside the round loop. The engine validates its arguments once, before any work.

`draw` samples one index per row by inverting the cumulative distribution with a float64
uniform: P(index = i) = weight_i / total, to float64 rounding.
"""

import torch


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """Float64 probabilities over the last dimension of logits [..., V]; temperature > 0."""
    scaled = logits.to(torch.float64) / temperature
    vocab = scaled.shape[-1]
    if top_k and top_k < vocab:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]              # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))        # ties with the k-th stay
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        # Descending, the mass strictly before each entry is monotone: the kept set is a sorted
        # prefix, widened to every entry equal to its smallest member (ties stay together).
        ordered = probs.sort(dim=-1, descending=True).values
        before = ordered.cumsum(-1) - ordered
        count = (before < top_p).sum(-1, keepdim=True)                 # >= 1: before[0] == 0
        smallest_kept = ordered.gather(-1, count - 1)
        probs = probs.masked_fill(probs < smallest_kept, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def uniforms(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Float64 uniforms in [0, 1), drawn on the generator's device (or `device` without one)."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, dtype=torch.float64, generator=generator, device=where).to(device)


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of weights [N, V] (non-negative, positive sum) given u [N] in [0, 1).

    With level = (1 - u) * total in (0, total], the index is the first whose cumulative mass
    reaches the level: P(index = i) = P(cdf[i-1] < level <= cdf[i]) = weight_i / total. A
    zero-weight index never qualifies first (its cdf equals its predecessor's, which would
    have qualified already), and the level never exceeds cdf[-1] = total, so the index is
    always in range with no fix-up.
    """
    cdf = weights.cumsum(-1)                                            # [N, V], non-decreasing
    level = (1 - u) * cdf[:, -1]                                        # [N]
    return torch.searchsorted(cdf, level[:, None])[:, 0]                # [N]


class Sampler:
    """Turns one step's logits [B, V] into tokens: greedy argmax or an exact draw.

    Uniforms are drawn for every row of the original batch and picked by row id, so each
    row's random stream does not depend on which rows are still running, on batch buckets, or
    on graphs being on: with one seed, eager and graph modes sample the same tokens.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float, generator, device,
                 batch: int):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator, self.device, self.batch = generator, device, batch

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return filtered_probs(logits, self.temperature, self.top_k, self.top_p)

    def uniforms(self, row_ids: torch.Tensor, *shape) -> torch.Tensor:
        """Float64 uniforms [len(row_ids), *shape] for the rows row_ids (original indices)."""
        return uniforms((self.batch,) + shape, self.generator, self.device)[row_ids]

    def pick(self, logits: torch.Tensor, row_ids: torch.Tensor):
        """logits [B, V] -> (tokens [B], probs [B, V] or None)."""
        if self.greedy:
            return logits.argmax(-1), None
        probs = self.probs(logits)
        return draw(probs, self.uniforms(row_ids)), probs


def same_device(a, b) -> bool:
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def device_generator(generator, device):
    """A generator on the model's device. A generator elsewhere (a CPU one for a CUDA model)
    seeds a device one once, so that no round copies random numbers between devices."""
    if generator is None or same_device(generator.device, device):
        return generator
    seed = int(torch.randint(2 ** 62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)
