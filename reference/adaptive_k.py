"""How many tokens to propose: the chapter's formulas, and the policies that pick each round's k.

A policy answers `next_k(remaining)` before a round (remaining: how many tokens may still be
produced) and hears `update(accepted, proposed)` after it. Whatever k it picks, the output is
the same: k changes only how much work a round does, never what the rule commits.
"""

import math


def _check_alpha_k(alpha, k):
    if not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")


def expected_tokens_per_round(alpha, k):
    """1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) for i.i.d. acceptance."""
    _check_alpha_k(alpha, k)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha, k, c):
    """Tokens per round over the round's cost, one target step plus k draft steps of cost c."""
    _check_alpha_k(alpha, k)
    if not isinstance(c, (int, float)) or math.isnan(c) or c < 0:
        raise ValueError(f"c (draft cost relative to the target) must be >= 0, got {c!r}")
    return expected_tokens_per_round(alpha, k) / (1 + k * c)


def useful_k(k, remaining):
    """The most proposals worth drafting when `remaining` tokens can still be produced: a
    round yields its accepted proposals plus one, so remaining - 1 (and at least one). More
    would be wasted forwards (with k = 100000, a hang)."""
    return max(1, min(k, remaining - 1))


class FixedK:
    """The same k every round (capped by what can still be produced)."""

    def __init__(self, k):
        self.k = k

    def next_k(self, remaining):
        return useful_k(self.k, remaining)

    def update(self, accepted, proposed):
        pass


class AdaptiveK:
    """Chooses each round's k to maximize expected_speedup under the running acceptance rate.

    The rate is estimated with one pseudo-accept and one pseudo-reject (a Laplace prior), so
    the first rounds neither assume a perfect draft nor a useless one.
    """

    def __init__(self, k_max, draft_cost):
        self.k_max, self.draft_cost = k_max, draft_cost
        self.accepted, self.proposed = 1, 2

    def next_k(self, remaining):
        alpha = self.accepted / self.proposed
        return max(range(1, useful_k(self.k_max, remaining) + 1),
                   key=lambda k: expected_speedup(alpha, k, self.draft_cost))

    def update(self, accepted, proposed):
        self.accepted += accepted
        self.proposed += proposed
