"""Two correct engines whose rounds are laid out differently from the chapter's.

The chapter prefills every prompt token but the last, then opens round 1 by feeding the last
prompt token with the draft's proposals. Real engines often do otherwise, and both layouts
below are lossless; the kit must pass them (greedy and sampling exact, caches correct, stats
honest):

    FirstTokenFromPrefill    the target prefills the WHOLE prompt and the first output token
                             is chosen from that call's last row (argmax, or a sample at the
                             temperature); speculation starts from that token
    PrefillMergedWithVerify  no separate prefill: the target's first call is the whole prompt
                             plus round 1's proposals, and the draft's first call is the whole
                             prompt, whose last row gives the first proposal

Both are built on the hooks of `tests.mutants.engine.Speculator` (proposal, verification,
decision, rollback, commit, stats), so only the layout of the first call differs from it.

    python -m pytest properties/ --impl=tests/mutants/alternative.py:FirstTokenFromPrefill
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference.sampling import check_sampling_args
from tests.mutants.engine import Sampling, Speculator, _as_token_list, _check_int, _stop_set


@dataclass
class Call:
    """One speculative_generate call's state: the models, their caches, the output so far and
    what the stats are made of (target calls that produced tokens, proposals kept / made)."""

    target: object
    draft: object
    t_cache: object
    d_cache: object
    device: torch.device
    s: Sampling
    generator: object
    limit: int
    stops: frozenset
    output: list = field(default_factory=list)
    rounds: int = 0
    accepted: int = 0
    proposed: int = 0


def _check_vocab(logits, draft_vocab):
    if logits.shape[-1] != draft_vocab:
        raise ValueError(f"draft and target vocabularies differ: the draft's logits have "
                         f"{draft_vocab} entries, the target's {logits.shape[-1]}")


class _Layout(Speculator):
    """The chapter's rounds from a given state on; subclasses lay out the first call."""

    def start(self, target, draft, prompt_ids, max_new_tokens, k, temperature, stop_ids,
              generator, top_k, top_p):
        """Check the arguments; (prompt, Call with fresh caches), or (prompt, None) when
        nothing is to be generated."""
        prompt = _as_token_list(prompt_ids)
        _check_int("max_new_tokens", max_new_tokens, 0)
        _check_int("k", k, 1)
        check_sampling_args(temperature, top_k, top_p)
        stops = _stop_set(stop_ids)
        if max_new_tokens == 0:
            return prompt, None
        capacity = len(prompt) + max_new_tokens + k + 1
        call = Call(target, draft, target.new_cache(1, capacity), draft.new_cache(1, capacity),
                    next(iter(target.parameters())).device,
                    Sampling(float(temperature), top_k, float(top_p)), generator,
                    max_new_tokens, stops)
        return prompt, call

    def result(self, call):
        if call is None:
            return [], self.stats([], 0, 0, 0)
        return call.output, self.stats(call.output, call.rounds, call.accepted, call.proposed)

    def settle(self, call, base, d_base, proposals, new_tokens, accepted) -> bool:
        """Roll both caches back to the invariant, count the round, commit its tokens.

        Returns True when generation is over."""
        self.rollback_target(call.t_cache, base, accepted, new_tokens)
        self.rollback_draft(call.draft, call.d_cache, d_base, accepted, new_tokens, proposals,
                            call.device)
        call.rounds += 1
        call.accepted += accepted
        call.proposed += len(proposals)
        return self.commit(call.output, new_tokens, call.limit, call.stops)

    def rounds_from(self, call, last, k) -> None:
        """Speculate until done; at entry both caches hold the committed sequence but `last`."""
        while True:
            base, d_base = call.t_cache.length, call.d_cache.length
            proposals, qs, draft_vocab = self.propose(call.draft, call.d_cache, last, k, call.s,
                                                      call.generator, call.device)
            logits = self.verify(call.target, call.t_cache, last, proposals, call.device)
            _check_vocab(logits, draft_vocab)
            new_tokens, accepted = self.decide(logits, proposals, qs, call.s, call.generator)
            if self.settle(call, base, d_base, proposals, new_tokens, accepted):
                return
            last = new_tokens[-1]


class FirstTokenFromPrefill(_Layout):
    """The target's prefill of the whole prompt also chooses the first output token.

    Call 1 feeds all P prompt tokens to the target; its last row is the target's distribution
    for output token 1, which is taken as the argmax (greedy) or sampled at the temperature,
    top-k and top-p (exactly the target's own first step). The draft is prefilled with the
    whole prompt too, so both caches then hold the committed sequence minus its newest token,
    and the chapter's rounds follow from there.

    Stats convention: `rounds` counts the target calls that produced output tokens, i.e. the
    prefill (it produced the first token) plus every verify call;
    `tokens_per_target_call = len(tokens) / rounds`; `acceptance_rate` = accepted / proposed
    over the verify calls (the prefill proposes nothing).

    Verdict it must get: CONFORMANT (every family passes).
    """

    @torch.inference_mode()
    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0,
                             top_p=1.0):
        prompt, call = self.start(target, draft, prompt_ids, max_new_tokens, k, temperature,
                                  stop_ids, generator, top_k, top_p)
        if call is None:
            return self.result(call)
        ids = torch.tensor([prompt], dtype=torch.long, device=call.device)
        # The target's next-token row after the prompt: the same choice its own decoder makes.
        first = self.bonus_token(target(ids, call.t_cache)[0, -1], call.s, generator)
        draft(ids, call.d_cache)
        call.rounds = 1
        if not self.commit(call.output, [first], max_new_tokens, call.stops):
            self.rounds_from(call, first, k)
        return self.result(call)


class PrefillMergedWithVerify(_Layout):
    """No separate prefill: the prompt travels with round 1's proposals.

    The draft's first call is the whole prompt; its last row gives proposal d1, and d2..dk
    follow one forward each. The target's first call is the prompt followed by d1..dk on an
    empty cache; its rows from the last prompt token on are exactly the rows a chapter-style
    verify call would give, and round 1 is decided and rolled back as usual (base = P - 1, the
    position of the newest committed token). Later rounds are the chapter's.

    Stats convention: `rounds` counts target verify calls; the merged call is round 1.
    `tokens_per_target_call = len(tokens) / rounds`; `acceptance_rate` = accepted / proposed.

    Verdict it must get: CONFORMANT (every family passes).
    """

    @torch.inference_mode()
    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0,
                             top_p=1.0):
        prompt, call = self.start(target, draft, prompt_ids, max_new_tokens, k, temperature,
                                  stop_ids, generator, top_k, top_p)
        if call is None:
            return self.result(call)
        proposals, qs, draft_vocab = self.propose_after_prompt(call, prompt, k)
        block = torch.tensor([prompt + proposals], dtype=torch.long, device=call.device)
        # Row P - 1 predicts the token after the prompt, i.e. it verifies d1.
        logits = target(block, call.t_cache)[0, len(prompt) - 1:]
        _check_vocab(logits, draft_vocab)
        new_tokens, accepted = self.decide(logits, proposals, qs, call.s, generator)
        base = len(prompt) - 1
        if not self.settle(call, base, base, proposals, new_tokens, accepted):
            self.rounds_from(call, new_tokens[-1], k)
        return self.result(call)

    def propose_after_prompt(self, call, prompt, k):
        """k proposals: the first from the draft's prefill of the prompt, then one per forward.

        The draft ends holding prompt + d1..d(k-1), as after a chapter-style proposal step.
        """
        ids = torch.tensor([prompt], dtype=torch.long, device=call.device)
        logits = call.draft(ids, call.d_cache)[0, -1]
        token, q = self.draft_step(logits, call.s, call.generator)
        proposals, qs = [token], [q]
        if k > 1:
            more, more_qs, _ = self.propose(call.draft, call.d_cache, token, k - 1, call.s,
                                            call.generator, call.device)
            proposals += more
            qs += more_qs
        return proposals, qs, logits.shape[-1]


ALTERNATIVE = [FirstTokenFromPrefill, PrefillMergedWithVerify]

__all__ = ["ALTERNATIVE", "FirstTokenFromPrefill", "PrefillMergedWithVerify"]
