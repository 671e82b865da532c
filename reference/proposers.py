"""Proposers: where a round's draft tokens come from.

One interface: `propose(context, k) -> (proposals, q)`, up to k tokens to follow the committed
sequence `context`, and when sampling the distribution each proposal was drawn from (q[i] for
proposals[i]). The acceptance rule's proof needs exactly that: proposals[i] really is a draw
from q[i], made before and independently of the target's verdict. `prefill(ids)` and
`commit(accepted, proposals)` keep whatever state a proposer has in step with the target's
cache; a proposer without a model has none.
"""

from dataclasses import dataclass

import torch

from reference.sampling import greedy_token


class DraftProposer:
    """A draft model decodes k tokens of its own, one forward each, in a cache of its own."""

    def __init__(self, draft, capacity, sampler, device):
        self.draft, self.sampler, self.device = draft, sampler, device
        self.cache = draft.new_cache(1, capacity)
        self.base = 0  # the cache's length when the round began

    def prefill(self, ids):
        self.draft(ids[None, :-1], self.cache)

    def propose(self, context, k):
        # The draft's cache holds all of context but its newest token (the engine's
        # invariant), so it feeds that token, then each proposal but the last: k forwards.
        self.base = self.cache.length
        proposals, q, token = [], [], context[-1]
        for _ in range(k):
            logits = self.draft(torch.tensor([[token]], device=self.device), self.cache)[0, -1]
            if self.sampler.greedy:
                token = int(greedy_token(logits))
            else:
                q.append(self.sampler.probs(logits))
                token = self.sampler.draw(q[-1])
            proposals.append(token)
        return proposals, q

    def commit(self, accepted, proposals):
        # Keep the newest token and the accepted proposals, as the target does. The final
        # proposal was drawn but never fed: if it was accepted, the draft catches up on it now.
        if proposals and accepted == len(proposals):
            self.draft(torch.tensor([[proposals[-1]]], device=self.device), self.cache)
        self.cache.truncate(self.base + accepted + 1)


@dataclass(frozen=True)
class PromptLookup:
    """A draft with no model: propose the k tokens that followed the most recent earlier
    occurrence of the context's last `ngram` tokens (shorter n-grams are tried if that fails).

    Its proposals are deterministic, so under sampling q is one-hot on the proposal and the
    acceptance rule reduces to: accept with probability p(token), else draw from p with the
    proposal removed and renormalized. The output stays exactly the target's distribution.
    """
    ngram: int = 3

    def __post_init__(self):
        if not isinstance(self.ngram, int) or self.ngram < 1:
            raise ValueError(f"ngram must be an int >= 1, got {self.ngram!r}")

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            pattern = context[-n:]
            # latest match first; the match must end before the context does
            for start in range(len(context) - n - 1, -1, -1):
                if context[start:start + n] == pattern:
                    return context[start + n:start + n + k]
        return []


class PromptLookupProposer:
    """A PromptLookup behind the proposer interface: q is one-hot on each proposal (the lookup
    "drew" it with certainty); no cache, so nothing to prefill or roll back."""

    def __init__(self, lookup, vocab_size, device):
        self.lookup, self.vocab_size, self.device = lookup, vocab_size, device

    def prefill(self, ids):
        pass

    def propose(self, context, k):
        proposals = self.lookup.propose(context, k)
        q = [torch.zeros(self.vocab_size, dtype=torch.float64, device=self.device)
             for _ in proposals]
        for dist, token in zip(q, proposals):
            dist[token] = 1.0
        return proposals, q

    def commit(self, accepted, proposals):
        pass
