"""A drafter with controlled, i.i.d. acceptance, for checking tokens-per-round against theory.

Under greedy verification the committed sequence is the target's greedy continuation, known in
advance (`truth`). This drafter proposes, for the i-th slot of a round, the true next token with
probability alpha and a wrong one (true + 1 mod V) otherwise, each by an independent coin.
Proposal i is then accepted exactly when coins 1..i all came up true, so a round yields
min(G, k) + 1 tokens with G ~ Geometric(alpha) and the expected tokens per round is
(1 - alpha^(k+1)) / (1 - alpha), the chapter's formula, with no model effects at all.
"""

import torch


class OracleDrafter:
    def __init__(self, truth: torch.Tensor, alpha: float, vocab_size: int, seed: int = 0):
        """truth [B, L]: row b's target greedy continuation, L >= max_new_tokens + k."""
        self.truth, self.alpha, self.vocab_size = truth, alpha, vocab_size
        self.generator = torch.Generator(device=truth.device).manual_seed(seed)
        self.catch_up = False

    def prefill(self, ids, lengths):
        pass

    def propose(self, rows, lengths, k, sampler, bound):
        if not sampler.greedy:
            raise ValueError("OracleDrafter drafts for greedy verification only (temperature=0)")
        columns = rows.n_out[:, None] + torch.arange(k, device=self.truth.device)   # [B, k]
        true = self.truth[rows.row_ids[:, None], columns.clamp(max=self.truth.shape[1] - 1)]
        coins = torch.rand(true.shape, generator=self.generator, device=true.device) < self.alpha
        return torch.where(coins, true, (true + 1) % self.vocab_size), None

    def after_round(self, catch_up):
        pass

    def compact(self, order, count):
        pass
