"""Block verifiers, one correct and each broken one a realistic mistake away from it, for the
tests of block verification (tests/test_block_verification.py).

A block verifier judges a round's proposals x_1 .. x_n (x_i drawn from q_i) against the
target's laws p_1 .. p_{n+1} with one uniform per position: position i "passes" when
u_i < h_i, the accepted count tau is read off the passes (`scan`), and one token of the
target's own follows, y ~ residual / its sum (p_{n+1} when every proposal is accepted). Every
rule here is that shape with its own three pieces (h, scan, residual), so the tests can both
sample it and compute its exact output law (`tau_law`, `residual_law`) by enumeration:

    PAPER               Sun et al. 2024 (reference/block.py): h_i = rho_i / (rho_i + 1 - w_i),
                        h_n = w_n from the block's capped joint ratio w; tau = the largest
                        passing i; residual max(w_tau p - q, 0). Lossless.
    TOKENWISE           the token-wise rule (vllm-ascend #7807: "block verification" that ran
                        the token-wise rule): h_i = min(1, p_i(x_i) / q_i(x_i)), tau = the
                        passes before the first failure, residual max(p - q, 0). Lossless, but
                        its accepted count has token-wise's law, not block's: only the
                        acceptance-law check sees it.
    TOKENWISE_RESIDUAL  the paper's tau, the token-wise residual max(p - q, 0) at the block's
                        end (the weight w_tau dropped where the correction is drawn). Lossy.
    NO_WEIGHT_UPDATE    w_i = min(1, p_i(x_i) / q_i(x_i)) per token: the running product over
                        the block never updated (each position judged on its own ratio, with
                        the block's formulas). Lossy.
    UNNORMALIZED_H      h_i = rho_i: the residual mass taken as the stopping chance, without
                        dividing by rho_i + 1 - w_i. Lossy.
    FIRST_FAILURE       the paper's h, but tau = the passes before the first failure (the
                        "longest accepted prefix" read as a forward scan). Lossy.

Written for the tests from the paper's formulas; reference/block.py is not imported, so a test
that compares the two compares two writings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def capped_joint_ratio(p, q, proposals) -> list:
    """w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))."""
    w = [1.0]
    for i, x in enumerate(proposals):
        w.append(min(1.0, w[-1] * float(p[i, x]) / float(q[i, x])))
    return w


def per_token_ratio(p, q, proposals) -> list:
    """The bug of NO_WEIGHT_UPDATE: w_i = min(1, p_i(x_i) / q_i(x_i)), nothing carried."""
    return [1.0] + [min(1.0, float(p[i, x]) / float(q[i, x])) for i, x in enumerate(proposals)]


def paper_h(weights) -> Callable:
    def h(p, q, proposals):
        w, n, out = weights(p, q, proposals), len(proposals), []
        for i in range(1, n + 1):
            if i == n:
                out.append(w[n])
                continue
            rho = float((w[i] * p[i] - q[i]).clamp_min(0).sum())
            out.append(rho / (rho + 1 - w[i]) if rho + 1 - w[i] > 0 else 1.0)
        return out
    return h


def unnormalized_h(p, q, proposals):
    w, n = capped_joint_ratio(p, q, proposals), len(proposals)
    return [float((w[i] * p[i] - q[i]).clamp_min(0).sum()) if i < n else w[n]
            for i in range(1, n + 1)]


def tokenwise_h(p, q, proposals):
    return [min(1.0, float(p[i, x]) / float(q[i, x])) for i, x in enumerate(proposals)]


def block_residual(weights) -> Callable:
    def residual(p, q, proposals, tau):
        return (weights(p, q, proposals)[tau] * p[tau] - q[tau]).clamp_min(0)
    return residual


def tokenwise_residual(p, q, proposals, tau):
    return (p[tau] - q[tau]).clamp_min(0)


@dataclass(frozen=True)
class BlockRule:
    name: str
    h: Callable            # (p, q, proposals) -> [h_1 .. h_n]
    residual: Callable     # (p, q, proposals, tau) -> unnormalized law of y, for tau < n
    scan: str = "last"     # "last": tau = the largest passing i; "first-failure": the passes
                           # before the first failure
    lossless: bool = False

    def __call__(self, p, q, proposals, generator=None):
        """(new tokens, accepted), as reference.block.block_accept."""
        p, q, proposals = p.double(), q.double(), [int(x) for x in proposals]
        n = len(proposals)
        h = self.h(p, q, proposals)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        passed = [bool(u[i] < h[i]) for i in range(n)]
        if self.scan == "last":
            tau = max((i + 1 for i in range(n) if passed[i]), default=0)
        else:
            tau = next((i for i in range(n) if not passed[i]), n)
        law = p[n] if tau == n else self.residual_law(p, q, proposals, tau)
        y = int(torch.multinomial(law, 1, generator=generator))
        return proposals[:tau] + [y], tau

    def tau_law(self, p, q, proposals) -> list:
        """P(tau = i | proposals), i = 0 .. n, the uniforms being independent."""
        h = self.h(p, q, proposals)
        n = len(h)
        out = []
        for i in range(n + 1):
            if self.scan == "last":   # i passes (or i = 0), every later position fails
                chance = 1.0 if i == 0 else h[i - 1]
                for j in range(i, n):
                    chance *= 1 - h[j]
            else:                     # the first i pass, the next fails (or none is left)
                chance = 1.0
                for j in range(i):
                    chance *= h[j]
                if i < n:
                    chance *= 1 - h[i]
            out.append(chance)
        return out

    def residual_law(self, p, q, proposals, tau):
        r = self.residual(p, q, proposals, tau)
        return r / r.sum() if r.sum() > 0 else p[tau]


PAPER = BlockRule("paper", paper_h(capped_joint_ratio), block_residual(capped_joint_ratio),
                  lossless=True)
TOKENWISE = BlockRule("tokenwise", tokenwise_h, tokenwise_residual, scan="first-failure",
                      lossless=True)
TOKENWISE_RESIDUAL = BlockRule("tokenwise_residual", paper_h(capped_joint_ratio),
                               tokenwise_residual)
NO_WEIGHT_UPDATE = BlockRule("no_weight_update", paper_h(per_token_ratio),
                             block_residual(per_token_ratio))
UNNORMALIZED_H = BlockRule("unnormalized_h", unnormalized_h, block_residual(capped_joint_ratio))
FIRST_FAILURE = BlockRule("first_failure", paper_h(capped_joint_ratio),
                          block_residual(capped_joint_ratio), scan="first-failure")

LOSSY = (TOKENWISE_RESIDUAL, NO_WEIGHT_UPDATE, UNNORMALIZED_H, FIRST_FAILURE)
RULES = (PAPER, TOKENWISE) + LOSSY
