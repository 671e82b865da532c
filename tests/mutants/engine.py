"""A correct speculative decoder built from small, overridable steps.

`Speculator` exposes the chapter's two public functions as methods:

    accept_or_correct(p, q, token, generator=None) -> (token, accepted)
    speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0) -> (tokens, stats)

Everything they do is split into hooks of a few lines each (the acceptance ratio, the accept
test, the residual, the draw from it, the draft's proposal step, the target row used to verify
proposal i, the bonus token, each cache's rollback, the commit of a block into the output, the
stats). The catalogue of broken engines (`tests.mutants.catalogue`) overrides exactly one hook
per bug, so every mutant differs from this class by the one mistake its docstring describes.

This engine is written independently of `reference.speculative`; it shares only the
distribution processing (`reference.sampling.probs_from_logits`), which defines what
"the target's sampler at temperature T with top-k / top-p" means for the whole project.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from reference.sampling import check_distribution, check_sampling_args, probs_from_logits


class Sampling(NamedTuple):
    """How tokens are chosen in one call: greedy when temperature == 0."""

    temperature: float
    top_k: int
    top_p: float

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


def _as_token_list(prompt_ids) -> list[int]:
    if torch.is_tensor(prompt_ids):
        if prompt_ids.is_floating_point() or prompt_ids.is_complex():
            raise TypeError(f"prompt_ids must hold integers, got a {prompt_ids.dtype} tensor")
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise ValueError(f"prompt_ids must be one sequence ([T] or [1, T]), got shape "
                             f"{tuple(prompt_ids.shape)}")
        ids = [int(t) for t in prompt_ids.tolist()]
    else:
        try:
            ids = list(prompt_ids)
        except TypeError:
            raise TypeError(f"prompt_ids must be a sequence of token ids, got "
                            f"{type(prompt_ids).__name__}") from None
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int):
                raise TypeError(f"prompt_ids must hold ints, got {t!r} ({type(t).__name__})")
    if not ids:
        raise ValueError("prompt_ids is empty: a prompt needs at least one token")
    if min(ids) < 0:
        raise ValueError(f"prompt_ids holds a negative token id {min(ids)}")
    return ids


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _stop_set(stop_ids) -> frozenset[int]:
    if isinstance(stop_ids, int) and not isinstance(stop_ids, bool):
        raise TypeError(f"stop_ids must be a collection of token ids, got the int {stop_ids}; "
                        f"write ({stop_ids},)")
    out = set()
    for t in stop_ids:
        if torch.is_tensor(t):
            t = t.item()
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"stop_ids must hold ints, got {t!r}")
        out.add(t)
    return frozenset(out)


class Speculator:
    """A correct engine; subclasses in the catalogue each break exactly one hook."""

    # ------------------------------------------------------------------ the rule
    def accept_or_correct(self, p: torch.Tensor, q: torch.Tensor, token: int, generator=None):
        """Verify draft token `token`, drawn from q, against the target distribution p.

        Accept with probability min(1, p[token] / q[token]); otherwise draw a replacement from
        max(p - q, 0), renormalized, with a fresh random number. The committed token is then
        distributed exactly as p. Returns (token, accepted).
        """
        token = self._check_rule_args(p, q, token)
        q = self.rule_q(q)
        u = self.uniform(p, generator)
        if self.accepts(u, self.acceptance_ratio(p, q, token)):
            return token, True
        return self.draw(self.residual(p, q), u, generator), False

    def _check_rule_args(self, p, q, token) -> int:
        check_distribution(p, "p")
        check_distribution(q, "q")
        if p.dim() != 1 or q.shape != p.shape:
            raise ValueError(f"p and q must be 1-D over the same vocabulary, got shapes "
                             f"{tuple(p.shape)} and {tuple(q.shape)}")
        if torch.is_tensor(token):
            if token.numel() != 1 or token.is_floating_point():
                raise TypeError(f"token must be one integer id, got a {token.dtype} tensor of "
                                f"shape {tuple(token.shape)}")
            token = int(token.item())
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int, got {token!r}")
        if not 0 <= token < p.shape[0]:
            raise ValueError(f"token {token} is outside the vocabulary [0, {p.shape[0]})")
        if q[token] <= 0:
            raise ValueError(f"token {token} has probability 0 under q, so it cannot have been "
                             f"drawn from q")
        return token

    def rule_q(self, q: torch.Tensor) -> torch.Tensor:
        """The draft distribution the rule works with: q itself."""
        return q

    def uniform(self, p: torch.Tensor, generator) -> torch.Tensor:
        return torch.rand((), generator=generator, dtype=torch.float64, device=p.device)

    def acceptance_ratio(self, p, q, token) -> torch.Tensor:
        # q[token] > 0 was checked: the token was drawn from q.
        return (p[token].double() / q[token].double()).clamp(max=1.0)

    def accepts(self, u, ratio) -> bool:
        # P(u < ratio) = ratio for u uniform on [0, 1).
        return bool(u < ratio)

    def residual(self, p, q) -> torch.Tensor:
        """Unnormalized residual max(p - q, 0); p itself when it is empty (p == q)."""
        leftover = (p - q).clamp_min(0)
        if leftover.sum() <= 0:
            return p
        return leftover

    def draw(self, weights: torch.Tensor, u, generator) -> int:
        """One fresh draw proportional to `weights` (`u`, the accept test's number, is spent)."""
        return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))

    # ------------------------------------------------------------------ the engine
    @torch.inference_mode()
    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0,
                             top_p=1.0):
        """Generate up to max_new_tokens tokens after prompt_ids, drafting k at a time.

        Greedy (temperature == 0): the output is the target's greedy output. Sampling: the
        output is distributed as the target's ancestral sampling with the same temperature,
        top_k and top_p. Returns (tokens, {"rounds", "acceptance_rate",
        "tokens_per_target_call"}).
        """
        prompt = _as_token_list(prompt_ids)
        _check_int("max_new_tokens", max_new_tokens, 0)
        _check_int("k", k, 1)
        check_sampling_args(temperature, top_k, top_p)
        stops = _stop_set(stop_ids)
        s = Sampling(float(temperature), top_k, float(top_p))
        output: list[int] = []
        if max_new_tokens == 0:
            return output, self.stats(output, 0, 0, 0)

        device = next(iter(target.parameters())).device
        capacity = len(prompt) + max_new_tokens + k + 1
        t_cache, d_cache = target.new_cache(1, capacity), draft.new_cache(1, capacity)
        if len(prompt) > 1:
            head = torch.tensor([prompt[:-1]], dtype=torch.long, device=device)
            target(head, t_cache)
            draft(head, d_cache)
        last = prompt[-1]
        rounds = accepted_total = proposed_total = 0
        while True:
            # Top of a round: both caches hold every committed token but `last`, so their
            # lengths are equal. Each rollback starts from its own cache's length anyway, so
            # that a bug in one cache's rollback never leaks into the other's.
            base, d_base = t_cache.length, d_cache.length
            proposals, qs, draft_vocab = self.propose(draft, d_cache, last, k, s, generator, device)
            logits = self.verify(target, t_cache, last, proposals, device)
            if logits.shape[-1] != draft_vocab:
                raise ValueError(f"draft and target vocabularies differ: the draft's logits have "
                                 f"{draft_vocab} entries, the target's {logits.shape[-1]}")
            new_tokens, accepted = self.decide(logits, proposals, qs, s, generator)
            self.rollback_target(t_cache, base, accepted, new_tokens)
            self.rollback_draft(draft, d_cache, d_base, accepted, new_tokens, proposals, device)
            rounds += 1
            accepted_total += accepted
            proposed_total += k
            if self.commit(output, new_tokens, max_new_tokens, stops):
                break
            last = new_tokens[-1]
        return output, self.stats(output, rounds, accepted_total, proposed_total)

    # --- drafting
    def propose(self, draft, d_cache, last, k, s: Sampling, generator, device):
        """k proposals, one draft forward each, and the distribution each was drawn from."""
        proposals, qs = [], []
        token, vocab = last, None
        for _ in range(k):
            logits = draft(torch.tensor([[token]], dtype=torch.long, device=device), d_cache)[0, -1]
            vocab = logits.shape[-1]
            token, q = self.draft_step(logits, s, generator)
            proposals.append(token)
            qs.append(q)
        return proposals, qs, vocab

    def draft_step(self, logits, s: Sampling, generator):
        if s.greedy:
            return int(torch.argmax(logits)), None
        q = self.draft_q(logits, s)
        return self.draft_pick(q, generator), self.reported_q(q, logits, s)

    def draft_q(self, logits, s: Sampling) -> torch.Tensor:
        """The distribution the draft samples from: processed exactly like the target's."""
        return s.probs(logits)

    def draft_pick(self, q, generator) -> int:
        return int(torch.multinomial(q, 1, generator=generator))

    def reported_q(self, q, logits, s: Sampling) -> torch.Tensor:
        """The q handed to the rule: the very distribution the proposal was drawn from."""
        return q

    # --- verification
    def verify(self, target, t_cache, last, proposals, device) -> torch.Tensor:
        """One target forward over [last, d1..dk]: row i predicts the token after input i."""
        block = torch.tensor([[last, *proposals]], dtype=torch.long, device=device)
        return target(block, t_cache)[0]

    def decide(self, logits, proposals, qs, s: Sampling, generator):
        """Accept a prefix of the proposals, then add the correction or the bonus token.

        Returns (new tokens, number of accepted proposals).
        """
        new_tokens = []
        for i, proposal in enumerate(proposals):
            row = self.verify_row(logits, i)
            if s.greedy:
                chosen, ok = self.greedy_check(row, proposal)
            else:
                chosen, ok = self.accept_or_correct(self.target_p(row, s), self.q_at(qs, i),
                                                    proposal, generator)
            new_tokens.append(chosen)
            if not ok:
                return new_tokens, i
        self.finish_block(new_tokens, logits, len(proposals), s, generator)
        return new_tokens, len(proposals)

    def verify_row(self, logits, i) -> torch.Tensor:
        """The target's distribution for proposal i comes from the row of the token before it."""
        return logits[i]

    def greedy_check(self, row, proposal):
        best = int(torch.argmax(row))
        return best, best == proposal

    def target_p(self, row, s: Sampling) -> torch.Tensor:
        """p, processed exactly as the target's own sampler would process it."""
        return s.probs(row)

    def q_at(self, qs, i) -> torch.Tensor:
        return qs[i]

    def finish_block(self, new_tokens, logits, k, s: Sampling, generator) -> None:
        """All k proposals accepted: the target's last row gives a free bonus token."""
        new_tokens.append(self.bonus_token(self.bonus_row(logits, k), s, generator))

    def bonus_row(self, logits, k) -> torch.Tensor:
        return logits[k]

    def bonus_token(self, row, s: Sampling, generator) -> int:
        if s.greedy:
            return int(torch.argmax(row))
        return int(torch.multinomial(self.target_p(row, s), 1, generator=generator))

    # --- rollback: back to "every committed token except the newest"
    def rollback_target(self, t_cache, base, accepted, new_tokens) -> None:
        # The target wrote last + k proposals at [base, base + k + 1); of those, last and the
        # accepted proposals are committed and not newest: base + accepted + 1 entries, which is
        # base + len(new_tokens) (the accepted proposals plus one correction or bonus token).
        t_cache.truncate(base + len(new_tokens))

    def rollback_draft(self, draft, d_cache, base, accepted, new_tokens, proposals, device) -> None:
        keep = base + len(new_tokens)
        if accepted == len(proposals) and d_cache.length < keep:
            # The draft wrote last, d1..d(k-1) but never its own last proposal.
            draft(torch.tensor([[proposals[-1]]], dtype=torch.long, device=device), d_cache)
        d_cache.truncate(keep)

    # --- output and stats
    def commit(self, output, new_tokens, max_new_tokens, stops) -> bool:
        """Append the round's tokens one by one; True when generation is over."""
        for token in new_tokens:
            output.append(token)
            if token in stops or len(output) == max_new_tokens:
                return True
        return False

    def stats(self, output, rounds, accepted_total, proposed_total) -> dict:
        return {
            "rounds": rounds,
            "acceptance_rate": accepted_total / proposed_total if proposed_total else 0.0,
            "tokens_per_target_call": len(output) / rounds if rounds else 0.0,
        }


_default = Speculator()
accept_or_correct = _default.accept_or_correct
speculative_generate = _default.speculative_generate

__all__ = ["Sampling", "Speculator", "accept_or_correct", "speculative_generate"]
