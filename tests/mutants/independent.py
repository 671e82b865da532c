"""A second correct speculative decoder, deliberately unlike `tests.mutants.engine`.

Plain module-level functions with the chapter's API:

    accept_or_correct(p, q, token, generator=None) -> (token, accepted)
    speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0) -> (tokens, stats)

Where `engine.Speculator` divides p by q and draws with torch.multinomial, this module tests
`u * q[x] < p[x]` (no division) and draws every token (proposals, corrections, bonus) by
inverse-CDF sampling from its own uniform. Where the engine truncates each cache by a formula,
this module keeps a list of the tokens each cache holds and, after every round, re-synchronizes
it with the committed sequence: cut back to the longest common prefix, then feed whatever
committed tokens (except the newest) are missing. Prefill and the draft's catch-up after a
fully accepted round are the same operation. The self-test uses the two engines to check each
other and the kit: both must pass every property, for the same reasons, by different code.
"""

from __future__ import annotations

import torch

from reference.sampling import check_distribution, check_sampling_args, probs_from_logits

__all__ = ["accept_or_correct", "speculative_generate"]


def _inverse_cdf(weights: torch.Tensor, generator) -> int:
    """Index i with probability weights[i] / sum(weights), from one uniform of our own."""
    cdf = weights.double().cumsum(0)
    point = torch.rand((), generator=generator, dtype=torch.float64, device=cdf.device) * cdf[-1]
    index = int(torch.searchsorted(cdf, point.reshape(1), right=True))
    # right=True finds the first cdf entry strictly above the point, which can never be a
    # zero-weight entry. Only rounding (point == cdf[-1]) can run past the end.
    if index >= weights.shape[0] or weights[index] <= 0:
        index = int(torch.nonzero(weights > 0)[-1])
    return index


def accept_or_correct(p, q, token, generator=None):
    """Accept `token` (drawn from q) with probability min(1, p/q); else draw from max(p - q, 0)."""
    check_distribution(p, "p")
    check_distribution(q, "q")
    if p.dim() != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be 1-D and of equal size, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    x = int(token.item()) if torch.is_tensor(token) else token
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < p.shape[0]:
        raise ValueError(f"token must be an int in [0, {p.shape[0]}), got {token!r}")
    px, qx = float(p[x]), float(q[x])
    if qx <= 0:
        raise ValueError(f"token {x} has q[token] = 0: it cannot have been drawn from q")
    u = float(torch.rand((), generator=generator, dtype=torch.float64, device=p.device))
    if u * qx < px:  # u < p/q without dividing; automatically capped at probability 1
        return x, True
    shortfall = torch.where(p > q, p.double() - q.double(), torch.zeros((), dtype=torch.float64,
                                                                         device=p.device))
    if not bool((shortfall > 0).any()):
        shortfall = p.double()  # p == q up to rounding: the residual is empty, p is exact
    return _inverse_cdf(shortfall, generator), False


class _Lane:
    """One model and its cache, with the list of tokens the cache holds."""

    def __init__(self, model, capacity, device):
        self.model = model
        self.cache = model.new_cache(1, capacity)
        self.device = device
        self.held: list[int] = []
        self.trusted = 0  # held[:trusted] is known to be committed

    def feed(self, tokens: list[int]) -> torch.Tensor:
        logits = self.model(torch.tensor([tokens], dtype=torch.long, device=self.device),
                            self.cache)[0]
        self.held.extend(tokens)
        return logits

    def sync(self, committed: list[int]) -> None:
        """Make the cache hold exactly committed[:-1]."""
        wanted = len(committed) - 1
        same = self.trusted
        limit = min(len(self.held), wanted)
        while same < limit and self.held[same] == committed[same]:
            same += 1
        if same < len(self.held):
            self.cache.truncate(same)
            del self.held[same:]
        if same < wanted:
            self.feed(committed[same:wanted])
        self.trusted = wanted


def _prompt(prompt_ids) -> list[int]:
    if torch.is_tensor(prompt_ids):
        if prompt_ids.is_floating_point():
            raise TypeError(f"prompt_ids must be integers, got dtype {prompt_ids.dtype}")
        if prompt_ids.dim() > 2 or (prompt_ids.dim() == 2 and prompt_ids.shape[0] != 1):
            raise ValueError(f"prompt_ids must be one sequence, got shape {tuple(prompt_ids.shape)}")
        prompt_ids = prompt_ids.reshape(-1).tolist()
    seq = list(prompt_ids)
    if not seq:
        raise ValueError("prompt_ids must not be empty")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in seq):
        raise ValueError(f"prompt_ids must be non-negative ints, got {seq!r}")
    return seq


@torch.inference_mode()
def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """Speculative generation; output equals (greedy) or is distributed as (sampling) the
    target's own decoding with the same temperature / top_k / top_p."""
    seq = _prompt(prompt_ids)
    for name, value, least in (("max_new_tokens", max_new_tokens, 0), ("k", k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    check_sampling_args(temperature, top_k, top_p)
    stops = {int(t) for t in stop_ids}
    greedy = temperature == 0

    def dist(logits):
        return probs_from_logits(logits, temperature, top_k, top_p)

    start = len(seq)
    rounds = accepted_sum = 0
    finished = max_new_tokens == 0
    if not finished:
        device = next(iter(target.parameters())).device
        capacity = start + max_new_tokens + k + 1
        verifier, drafter = _Lane(target, capacity, device), _Lane(draft, capacity, device)
        verifier.sync(seq)
        drafter.sync(seq)
    while not finished:
        # Both lanes hold seq[:-1]. Draft k tokens one at a time.
        guesses, guess_dists = [], []
        for _ in range(k):
            logits = drafter.feed([guesses[-1] if guesses else seq[-1]])[-1]
            if greedy:
                guesses.append(int(torch.argmax(logits)))
            else:
                q = dist(logits)
                guesses.append(_inverse_cdf(q, generator))
                guess_dists.append(q)
        rows = verifier.feed([seq[-1]] + guesses)  # rows[j] predicts the token after input j
        if rows.shape[-1] != logits.shape[-1]:
            raise ValueError(f"target vocabulary {rows.shape[-1]} != draft vocabulary "
                             f"{logits.shape[-1]}")
        if greedy:
            wanted = torch.argmax(rows, dim=-1).tolist()
            agree = 0
            while agree < k and wanted[agree] == guesses[agree]:
                agree += 1
            fresh = guesses[:agree] + [wanted[agree]]
        else:
            fresh, agree = [], k
            for j in range(k):
                tok, ok = accept_or_correct(dist(rows[j]), guess_dists[j], guesses[j], generator)
                fresh.append(tok)
                if not ok:
                    agree = j
                    break
            if agree == k:
                fresh.append(_inverse_cdf(dist(rows[k]), generator))
        rounds += 1
        accepted_sum += agree

        room = max_new_tokens - (len(seq) - start)
        cut = next((j + 1 for j, t in enumerate(fresh) if t in stops), len(fresh))
        fresh = fresh[:min(cut, room)]  # no stop id before its last token
        seq.extend(fresh)
        finished = fresh[-1] in stops or len(seq) - start >= max_new_tokens
        verifier.sync(seq)
        drafter.sync(seq)

    out = seq[start:]
    return out, {
        "rounds": rounds,
        "acceptance_rate": accepted_sum / (rounds * k) if rounds else 0.0,
        "tokens_per_target_call": len(out) / rounds if rounds else 0.0,
    }
