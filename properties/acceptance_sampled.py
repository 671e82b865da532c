"""The exact law of one drafting round's accepted count under sampling, from the kit's models.

A round after the committed sequence c proposes x_1 .. x_n from the draft. The target accepts
x_j, having accepted x_1 .. x_{j-1}, with probability min(1, p_j(x_j) / q_j(x_j)), where p_j and
q_j are the target's and the draft's processed laws (temperature, top-k, top-p) after
c + x_<j. The round's accepted count A therefore has

    P(A >= i) = sum over x_1 .. x_i of  prod_{j <= i} q_j(x_j) min(1, p_j(x_j) / q_j(x_j))
              = sum over x_1 .. x_i of  prod_{j <= i} min(p_j(x_j), q_j(x_j)),

a sum over the draft tree of depth n: a node x_<j carries the weight prod min(p, q) of its
path, and P(A >= i) is the weight of the tree's level i. A branch whose min(p, q) is 0 carries
no weight below it, so it is pruned; nothing else is (the sum is exact in float64). Then

    E[A]   = sum_i P(A >= i)
    E[A^2] = sum_i sum_j P(A >= max(i, j)) = sum_i (2 i - 1) P(A >= i)
    P(A = a) = P(A >= a) - P(A >= a + 1).

Two conventions for the proposals (engines differ):
    "sampled"  x_j is drawn from q_j (the textbook rule; vLLM's draft_sample_method=
               "probabilistic"); with the target as its own draft min(p, p) = p sums to 1 at
               every node, so every level weighs 1: A = n surely
    "greedy"   x_j is the draft's argmax (lowest index on a tie) and q_j is one-hot there, so
               the tree is one path and P(accept) = p_j(x_j)

Two verification rules (reference/speculative.py verify, reference/block.py):
    "token-wise"  the rule above: a node's weight is prod_{j <= i} min(p_j(x_j), q_j(x_j))
    "block"       block verification (Sun et al. 2024): the round accepts i or more with
                  probability w_i given x_<=i, so a node carries
                      W_i(x_<=i) = min(Q(x_<=i), W_{i-1}(x_<i) p_i(x_i)),  W_0 = 1,
                  Q(x_<=i) = prod_{j <= i} q_j(x_j) the draft's probability of the path, and
                  P(A >= i) is again the weight of level i (reference/block.py proves it).
                  Since W_{i-1} <= Q(x_<i), W_i >= W_{i-1} min(p_i(x_i), q_i(x_i)): level by
                  level at least token-wise's weight (equal for one proposal, for one-hot q,
                  i.e. greedy proposals, and for q = p)

Accepted counts of independent rounds add; `sum_law` convolves their laws exactly, and
`two_sided_p` reads the chance of a total at least as far out as the one observed from it (no
normal approximation in the tail where the kit's level ALPHA lies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from properties import oracle
from reference.sampling import SamplingParams, greedy_token

PROPOSALS = ("sampled", "greedy")
VERIFICATIONS = ("token-wise", "block")
# Nodes of one round's tree evaluated at most (two forwards each): a larger tree is refused
# with a clear error, and the check narrows top-k beforehand so that it never asks for one.
MAX_NODES = 4096


@dataclass(frozen=True)
class RoundLaw:
    """The law of one round's accepted count: reach[i - 1] = P(A >= i), i = 1 .. drafted."""

    reach: tuple

    @property
    def drafted(self) -> int:
        return len(self.reach)

    @property
    def mean(self) -> float:
        return float(sum(self.reach))

    @property
    def var(self) -> float:
        second = sum((2 * i - 1) * r for i, r in enumerate(self.reach, start=1))
        return max(0.0, float(second - self.mean ** 2))

    def law(self) -> np.ndarray:
        """P(A = a) for a = 0 .. drafted."""
        reach = np.array((1.0,) + tuple(self.reach) + (0.0,))
        return np.clip(reach[:-1] - reach[1:], 0.0, None)


def tree_nodes(drafted: int, support: int) -> int:
    """Nodes whose laws a round of `drafted` proposals needs at most, when each law has
    `support` tokens: levels 0 .. drafted - 1."""
    return sum(support ** j for j in range(drafted))


def _law(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The processed law of each row (one-hot at the argmax at temperature 0)."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(greedy_token(logits), logits.shape[-1]).double()
    return sampling.probs(logits.double())


def _next_logits(seqs: list, name: str) -> torch.Tensor:
    """Next-token logits of `name` for sequences of any lengths, one forward per length."""
    out = [None] * len(seqs)
    by_length: dict = {}
    for i, s in enumerate(seqs):
        by_length.setdefault(len(s), []).append(i)
    for rows in by_length.values():
        logits = oracle.served_next_logits([seqs[i] for i in rows], name)
        for i, row in zip(rows, logits):
            out[i] = row
    return torch.stack(out)


def round_laws(contexts, drafted: int, draft: str, sampling: SamplingParams,
               proposals: str, verification: str = "token-wise") -> list[RoundLaw]:
    """The law of the accepted count of a round of `drafted` proposals after each context
    (token tuples), for served model `draft` (a method's `drafter.model`; the target drafting
    for itself is oracle.SERVED_TARGET), or a drafter that computes its own rounds (a head:
    `draft.round_logits(context, prefix)`, methods.exact_draft), under `proposals` and
    `verification`.
    The trees of all contexts are walked level by level together (one forward per level and
    context length)."""
    if proposals not in PROPOSALS:
        raise ValueError(f"proposals={proposals!r}: choose from {PROPOSALS}")
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification={verification!r}: choose from {VERIFICATIONS}")
    if not isinstance(drafted, int) or drafted < 0:
        raise ValueError(f"drafted must be an int >= 0, got {drafted!r}")
    contexts = [tuple(int(t) for t in c) for c in contexts]
    if any(not c for c in contexts):
        raise ValueError("every context needs at least one token (the prompt)")
    name = draft
    if name == oracle.SERVED_TARGET and proposals == "sampled":
        # q = p at every node: min(p, q) = p, whose level sums are 1 (a law sums to 1); under
        # block verification W_i = min(Q, W_{i-1} p) = Q, whose level sums are 1 too
        return [RoundLaw((1.0,) * drafted) for _ in contexts]

    walked = []   # tree_laws asks for one level after the other: level L's prefixes are L long

    def laws(seqs):
        target = _next_logits(seqs, oracle.SERVED_TARGET)
        p = _law(target, sampling)
        level = len(walked)
        walked.append(level)
        # a drafter that computes its own rounds: a head (its laws depend on where the round
        # started), a script
        if hasattr(name, "round_logits"):
            q_logits = torch.stack([name.round_logits(s[:len(s) - level], s[len(s) - level:])
                                    for s in seqs])
        else:
            q_logits = target if name == oracle.SERVED_TARGET else _next_logits(seqs, name)
        if proposals == "greedy":
            return p, torch.nn.functional.one_hot(greedy_token(q_logits), p.shape[-1]).double()
        return p, _law(q_logits, sampling)

    return tree_laws(contexts, drafted, laws, verification,
                     f"narrow top_k (sampling={sampling!r})")


def tree_laws(contexts, drafted: int, laws, verification: str = "token-wise",
              advice: str = "a smaller tree") -> list[RoundLaw]:
    """The walk behind round_laws, for any models: `laws(seqs) -> (p, q)`, the target's and
    the proposals' laws [len(seqs), V] after each sequence (float64). Each node of the draft
    tree is (context index, sequence, weight, Q: the draft's probability of its path); a child
    of weight 0 carries none below it and is pruned."""
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification={verification!r}: choose from {VERIFICATIONS}")
    reach = [[0.0] * drafted for _ in contexts]
    nodes = [(i, tuple(c), 1.0, 1.0) for i, c in enumerate(contexts)]
    for level in range(drafted):
        if not nodes:
            break
        if len(nodes) > MAX_NODES * len(contexts):
            raise ValueError(f"the draft tree of {drafted} proposals has {len(nodes)} nodes at "
                             f"level {level} for {len(contexts)} contexts, more than MAX_NODES="
                             f"{MAX_NODES} each: {advice}")
        p, q = laws([s for _, s, _, _ in nodes])
        children = []
        for (i, s, w, path), p_row, q_row in zip(nodes, p, q):
            if verification == "token-wise":
                child = w * torch.minimum(p_row, q_row)
            else:
                child = torch.minimum(path * q_row, w * p_row)
            reach[i][level] += float(child.sum())
            if level + 1 < drafted:
                children += [(i, s + (x,), float(child[x]), path * float(q_row[x]))
                             for x in torch.nonzero(child > 0).flatten().tolist()]
        nodes = children
    # rounding can lift a level a hair above the one before it (or 1)
    return [RoundLaw(tuple(min(1.0, r) for r in np.minimum.accumulate(row)) if row else ())
            for row in reach]


def cached_round_laws(contexts, drafted: int, draft: str, sampling: SamplingParams,
                      proposals: str, verification: str = "token-wise") -> list[RoundLaw]:
    """round_laws, computing only the contexts not seen before (batched) and caching them
    (many rounds share a context: a prompt and one of few first tokens)."""
    contexts = [tuple(int(t) for t in c) for c in contexts]
    # the law depends on temperature, top-k and top-p only (not on the seed or n)
    sampling = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)
    key = (drafted, draft, sampling, proposals, verification)
    missing = sorted({c for c in contexts if not _in_cache(c, *key)})
    if missing:
        for c, law in zip(missing, round_laws(missing, drafted, draft, sampling, proposals,
                                              verification)):
            _cache[(c, *key)] = law
    return [_cache[(c, *key)] for c in contexts]


_cache: dict = {}


def _in_cache(*key) -> bool:
    if len(_cache) > 50_000:
        _cache.clear()
    return key in _cache


# --------------------------------------------------------------------------- sums of rounds

def sum_law(laws) -> np.ndarray:
    """The exact law of the sum of independent counts, each given by its law over 0 .. n
    (np arrays): P(S = s) for s = 0 .. sum of n. Pairwise convolution keeps it fast."""
    parts = [np.asarray(law, dtype=np.float64) for law in laws]
    if not parts:
        return np.ones(1)
    while len(parts) > 1:
        paired = [np.convolve(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            paired.append(parts[-1])
        parts = paired
    law = np.clip(parts[0], 0.0, None)
    return law / law.sum()


def two_sided_p(law: np.ndarray, observed: float) -> float:
    """The chance, under `law` (P(S = s), s = 0, 1, ...), of a total at least as far out as
    `observed` on its side, doubled (capped at 1): 2 min(P(S <= s), P(S >= s))."""
    s = round(float(observed))
    if abs(s - float(observed)) > 1e-6:
        raise ValueError(f"observed={observed!r}: a count of accepted tokens is a whole number")
    if s < 0 or s >= len(law):
        return 0.0
    below, above = float(law[:s + 1].sum()), float(law[s:].sum())
    return min(1.0, 2 * min(below, above))


def z_power(shift: float, sd: float, alpha: float) -> float:
    """The power of a two-sided level-alpha z-test against a mean shift `shift` of a total
    whose standard deviation is `sd` (normal approximation): Phi(|shift| / sd - z_{1-alpha/2})
    (the far tail's other side is negligible)."""
    from scipy import stats   # at first use, as in properties/statistics.py
    if sd <= 0:
        return 1.0 if shift else 0.0
    return float(stats.norm.cdf(abs(shift) / sd - stats.norm.isf(alpha / 2)))


def samples_needed(var: float, shift: float, alpha: float, power: float) -> int:
    """Smallest N with z_power(N shift, sqrt(N var), alpha) >= power:
    N = (z_{1-alpha/2} + z_power)^2 var / shift^2 (shift and var per sample)."""
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift!r}")
    if var <= 0:
        return 1
    from scipy import stats
    z = stats.norm.isf(alpha / 2) + stats.norm.ppf(power)
    return max(1, math.ceil(z * z * var / (shift * shift)))
