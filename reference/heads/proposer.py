"""A head as a proposer for speculative_generate, fed by the target's own verify forwards.

The proposer never runs the target. speculative_generate sees that it has a `hidden`
convention, runs each target forward (the prefill and every verify) through
target.forward_hidden instead, and hands the proposer that forward's features with `saw`.
Which of them the proposer keeps is the whole correctness argument for the features:

    invariant: `features` holds the target's features of every committed token except the
    newest, row j for position j -- exactly the tokens in the target's cache.

The prefill covers the prompt but its last token, all committed. A verify forward covers the
newest token and the proposals; the newest and the accepted proposals are committed, so its
first accepted + 1 rows are kept and the rest (built on rejected tokens) are dropped. The new
newest token (the correction or bonus) has no feature until the next verify.

A round whose newest token is t_n starts from f_{n-1}, the latest verified feature, so a head
proposes nothing in a round with no verified token (a one-token prompt's first round).
"""

import torch

from reference.heads.base import lead_pairs, with_lead
from reference.heads.medusa import MedusaHeads
from reference.heads.verified import Verified


class ChainHeadProposer(Verified):
    """EAGLE, EAGLE-3, MTP: a head with a one-layer cache of its own, chained within a round.

    The head's cache holds the pairs (f_j, t_{j+1}) for j < `cache.length`, all built from
    verified features. A round whose newest token is t_n first feeds the pairs not yet fed,
    j = cache.length .. n - 1 (those of the tokens the last round committed), in one forward;
    the last row's law gives proposal 1. Each further proposal feeds the previous one with the
    head's own output as its feature. Commit truncates the cache to the n verified pairs: the
    pairs built on the head's own outputs are rebuilt from the target's features next round.
    """

    def __init__(self, head, capacity, sampler, device):
        super().__init__(head, sampler, device)
        self.lead = lead_pairs(head)   # pairs before pair 0 (llama.cpp's MTP: one)
        self.cache = head.new_cache(capacity + self.lead)
        self.newest = 0   # the position of the round's newest token

    def propose(self, context, k):
        n = self.newest = len(context) - 1
        if self.verified(context) == 0:
            return [], []
        start = self.cache.length - self.lead                             # -1: the lead pair
        h = with_lead(self.head, self.head.start(self.feature_rows(max(start, 0), n)[None]),
                      start)                                              # [1, n - start, H]
        tokens = torch.tensor([context[start + 1:n + 1]], device=self.device)  # [1, n - start]
        proposals, q = [], []
        for _ in range(k):
            logits, g = self.head(tokens, h, self.cache)                  # [1, T, Vd], [1, T, H]
            token, law = self.choose(logits[0, -1])
            proposals.append(token)
            if law is not None:
                q.append(law)
            tokens, h = torch.tensor([[token]], device=self.device), g[:, -1:]
        return proposals, q

    def commit(self, accepted, proposals):
        self.keep(accepted)
        self.cache.truncate(min(self.cache.length, self.newest + self.lead))


class MedusaProposer(Verified):
    """Medusa: every head reads the latest verified feature f_{n-1}; head i proposes t_{n+i},
    so a round proposes min(k, K) tokens. No cache: the heads see one feature."""

    def propose(self, context, k):
        n = len(context) - 1
        if self.verified(context) == 0:
            return [], []
        logits = self.head(self.feature_rows(n - 1, n)[None])[0, 0]      # [K, V]
        proposals, q = [], []
        for i in range(min(k, self.head.num_heads)):
            token, law = self.choose(logits[i])
            proposals.append(token)
            if law is not None:
                q.append(law)
        return proposals, q

    def commit(self, accepted, proposals):
        self.keep(accepted)


def head_proposer(head, capacity, sampler, device):
    from reference.heads.dflash import DFlashHead, DFlashProposer
    if isinstance(head, DFlashHead):
        return DFlashProposer(head, sampler, device)
    if isinstance(head, MedusaHeads):
        return MedusaProposer(head, sampler, device)
    return ChainHeadProposer(head, capacity, sampler, device)
