"""Drafters: what proposes k tokens per row each round.

The engine talks to a drafter through four calls (any object with them can draft):
    prefill(ids [B, T], lengths [B])          the padded prompts minus their newest token
    propose(rows, lengths, k, sampler, bound) -> (proposals [B, k], q [B, k, V] or None)
    after_round(catch_up: bool)               host flag: some row accepted all k last round
    compact(order, count)                     keep rows order[:count], in that order
`q` is the distribution each proposal was drawn from (None under greedy).
A drafter fed by the target's own hidden states (fast/head.py) also has
    attach(target_weights, max_batch, capacity)   called once; then sets `states`, the
                                                  residual-state indices it reads
    saw(features [B, T, n * hidden])              after the target's prefill and every verify

ModelDrafter runs a Qwen3-family draft with its own static cache, kept to the chapter's
invariant: at the top of a round it holds every committed token but the newest (`last`).

Catch-up without a ragged feed: when a row accepts all k proposals, the draft never fed its own
k-th proposal, so its cache is one entry short. Instead of an extra draft forward for those rows
only, the next round's first draft step feeds the two newest committed tokens [prev, last] at
slots [length - 1, length] for every row. For rows that were not short this rewrites slot
length - 1 with the keys/values of the same token over the same prefix, which changes nothing
the target sees (proposals only steer acceptance, never the output).
"""

import torch

from fast.runner import ModelRunner
from fast.sampling import Sampler


class ModelDrafter:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.catch_up = False

    @property
    def vocab_size(self) -> int:
        return self.runner.weights.shape.vocab_size

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        self.runner.prefill(ids, lengths)
        self.catch_up = False

    def propose(self, rows, lengths: torch.Tensor, k: int, sampler: Sampler, bound: int):
        """rows.last/.prev [B]; lengths [B]: committed tokens minus one (the target cache's).

        bound: a host-side upper bound on (largest slot written this round) + 1, so eager
        attention can read a prefix of the cache instead of all of it.
        """
        if self.catch_up:
            # Every running row has length >= 1 after its first round; only a dead row kept
            # for its batch bucket can sit at 0, and what it writes is never read.
            ids, start = torch.stack([rows.prev, rows.last], 1), (lengths - 1).clamp(min=0)  # [B, 2]
        else:
            ids, start = rows.last[:, None], lengths                            # [B, 1]
        proposals, dists = [], []
        for i in range(k):
            logits = self.runner.chain(ids, start, bound, logits_at="last")  # [B, V]
            token, probs = sampler.pick(logits, rows.row_ids)
            proposals.append(token)
            dists.append(probs)
            start = start + ids.shape[1]
            ids = token[:, None]
        q = None if sampler.greedy else torch.stack(dists, 1)                   # [B, k, V]
        return torch.stack(proposals, 1), q                                     # [B, k]

    def after_round(self, catch_up: bool) -> None:
        self.catch_up = catch_up

    def compact(self, order: torch.Tensor, count: int) -> None:
        self.runner.cache.compact(order, count)
