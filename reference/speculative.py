"""Speculative decoding, written to be obviously right rather than fast.

The one invariant everything rests on: at the top of every round, both caches hold every
committed token (prompt + output) except the newest one, `last`, which has been chosen but not
yet fed to either model. A round feeds `last` and the draft's proposals, accepts a prefix of the
proposals, adds one corrected or bonus token, and truncates both caches back to the invariant.
"""

import math
from dataclasses import dataclass

import torch

from reference.sampling import (check_distribution, check_sampling_args, greedy_token,
                                probs_from_logits)
from reference.tree import CHAPTER_TREE
from reference.tree import tree_generate as _tree_generate


# --- the acceptance rule -----------------------------------------------------------------

def accept_or_correct(p, q, token, generator=None):
    """One verification step for draft token `token`, which was drawn from q.

    Accept with probability min(1, p[token] / q[token]); otherwise draw from the residual
    max(p - q, 0) / sum(max(p - q, 0)). Returns (token, accepted). The committed token is
    distributed exactly as p: acceptance contributes min(p, q) at every token, rejection
    (probability sum(max(p - q, 0))) contributes max(p - q, 0), and the two add up to p.
    """
    check_distribution(p, "p")
    check_distribution(q, "q")
    if p.shape != q.shape or p.dim() != 1:
        raise ValueError(f"p and q must be 1-D over the same vocabulary, got {tuple(p.shape)} "
                         f"and {tuple(q.shape)}")
    token = int(token)
    if not 0 <= token < p.shape[0]:
        raise ValueError(f"token {token} is outside the vocabulary [0, {p.shape[0]})")
    if q[token] <= 0:
        raise ValueError(f"token {token} has probability 0 under q, so it cannot have been drawn from q")
    p, q = p.double(), q.double()
    # u is uniform on [0, 1), so P(u < ratio) = ratio exactly.
    u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
    if u < p[token] / q[token]:
        return token, True
    residual = (p - q).clamp_min(0)
    # Rejection is only possible where p < q somewhere, which forces residual mass elsewhere;
    # an all-zero residual can only come from rounding when p == q, and then p is the answer.
    if residual.sum() <= 0:
        residual = p
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False


# --- the chapter's formulas ----------------------------------------------------------------

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


# --- input checks ----------------------------------------------------------------------------

def _vocab_size(model):
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None)


def _prompt_tensor(prompt_ids):
    """One sequence of token ids, [T] or a batch of one [1, T]; anything nested is refused
    rather than flattened (a batch of prompts is not one prompt)."""
    try:
        ids = torch.as_tensor(prompt_ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"prompt_ids must be a sequence of token ids, got {prompt_ids!r} "
                         f"({error})") from None
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"prompt_ids must be one sequence of token ids ([T] or [1, T]), got "
                         f"shape {tuple(ids.shape)}: {prompt_ids!r}")
    return ids


def _stop_set(stop_ids):
    if isinstance(stop_ids, (str, bytes)) or not hasattr(stop_ids, "__iter__"):
        hint = f"; write ({stop_ids!r},)" if isinstance(stop_ids, int) else ""
        raise TypeError(f"stop_ids must be a collection of token ids, got {stop_ids!r} "
                        f"({type(stop_ids).__name__}){hint}")
    stop = set()
    for s in stop_ids:
        if torch.is_tensor(s) and s.numel() == 1 and not s.is_floating_point():
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"stop_ids must hold int token ids, got {s!r} "
                            f"({type(s).__name__}) in {stop_ids!r}")
        stop.add(s)
    return stop


def _check_generate_args(target, prompt_ids, max_new_tokens, stop_ids):
    ids = _prompt_tensor(prompt_ids)
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty: speculation needs at least one prompt token")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"prompt_ids must be integer token ids, got dtype {ids.dtype}")
    vocab = _vocab_size(target)
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0].item()
        raise ValueError(f"prompt_ids holds token id {bad}, outside the vocabulary [0, {vocab})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return ids.long(), _stop_set(stop_ids)


def _device(model):
    return next(model.parameters()).device


# --- target-only decoding: what speculation must reproduce -----------------------------------

@torch.inference_mode()
def greedy_generate(target, prompt_ids, max_new_tokens, stop_ids=()):
    """Plain greedy decoding of the target, one token per forward."""
    ids, stop = _check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    return _generate(target, ids.to(_device(target)), max_new_tokens, stop, greedy_token)


@torch.inference_mode()
def sample_generate(target, prompt_ids, max_new_tokens, temperature=1.0, stop_ids=(),
                    generator=None, *, top_k=0, top_p=1.0):
    """Plain ancestral sampling from the target (temperature 0 is greedy)."""
    ids, stop = _check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)

    def choose(logits):
        if temperature == 0:
            return greedy_token(logits)
        probs = probs_from_logits(logits.double(), temperature, top_k, top_p)
        return torch.multinomial(probs, 1, generator=generator)[..., 0]

    return _generate(target, ids.to(_device(target)), max_new_tokens, stop, choose)


def _generate(target, ids, max_new_tokens, stop, choose):
    cache = target.new_cache(1, ids.numel() + max_new_tokens)
    output, feed = [], ids.view(1, -1)
    while len(output) < max_new_tokens:
        token = int(choose(target(feed, cache)[0, -1]))
        output.append(token)
        if token in stop:
            break
        feed = torch.tensor([[token]], device=ids.device)
    return output


# --- drafting ------------------------------------------------------------------------------

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


def _draft_proposals(draft, d_cache, last, k, temperature, top_k, top_p, generator):
    """The draft feeds `last` then its own proposals, one forward each (k forwards, k cache
    entries). Returns the proposals and, when sampling, the distribution each was drawn from."""
    proposals, q_dists, token = [], [], last
    for _ in range(k):
        logits = draft(token, d_cache)[0, -1]
        if temperature == 0:
            chosen = greedy_token(logits)
        else:
            q = probs_from_logits(logits.double(), temperature, top_k, top_p)
            q_dists.append(q)
            chosen = torch.multinomial(q, 1, generator=generator)[0]
        proposals.append(int(chosen))
        token = chosen.view(1, 1)
    return proposals, q_dists


def _lookup_proposals(lookup, context, k, vocab_size, device):
    proposals = lookup.propose(context, k)
    q_dists = []
    for token in proposals:
        q = torch.zeros(vocab_size, dtype=torch.float64, device=device)
        q[token] = 1.0  # the lookup "sampled" its proposal with certainty
        q_dists.append(q)
    return proposals, q_dists


class _AdaptiveK:
    """Chooses each round's k to maximize expected_speedup under the running acceptance rate.

    The rate is estimated with one pseudo-accept and one pseudo-reject (a Laplace prior), so
    the first rounds neither assume a perfect draft nor a useless one.
    """

    def __init__(self, k_max, draft_cost):
        self.k_max, self.draft_cost = k_max, draft_cost
        self.accepted, self.proposed = 1, 2

    def next_k(self, limit):
        alpha = self.accepted / self.proposed
        return max(range(1, min(self.k_max, limit) + 1),
                   key=lambda k: expected_speedup(alpha, k, self.draft_cost))

    def update(self, accepted, proposed):
        self.accepted += accepted
        self.proposed += proposed


# --- speculative decoding --------------------------------------------------------------------

def _stats(output, rounds, accepted_total, proposed_total):
    return {"rounds": rounds,
            "acceptance_rate": accepted_total / proposed_total if proposed_total else 0.0,
            "tokens_per_target_call": len(output) / rounds if rounds else 0.0}


@torch.inference_mode()
def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=CHAPTER_TREE, stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0):
    """Tree speculation (see tree.py), the kit's tree level: (tokens, stats).

    tree[d] is the number of children of every node at depth d. At temperature 0 the children
    are the draft's top tokens and the output is the target's greedy continuation; above it the
    children are i.i.d. draws from the draft and the output is distributed exactly as the
    target's sampling (temperature, top_k, top_p as in the chain).
    """
    ids, stop = _check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)
    if isinstance(draft, PromptLookup):
        raise ValueError("tree_generate needs a model draft (it ranks and samples the draft's "
                         "distributions), got a PromptLookup")
    if _vocab_size(draft) != _vocab_size(target):
        raise ValueError(f"draft and target must share a vocabulary: draft vocab_size="
                         f"{_vocab_size(draft)}, target vocab_size={_vocab_size(target)}")
    return _tree_generate(target, draft, ids.to(_device(target)), max_new_tokens, stop, tree,
                          temperature, top_k, top_p, generator)


def _useful_k(k, remaining):
    """The most proposals worth drafting when `remaining` tokens can still be produced: a
    round yields its accepted proposals plus one, so remaining - 1 (and at least one)."""
    return max(1, min(k, remaining - 1))


@torch.inference_mode()
def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0, adaptive=False,
                         draft_cost=0.05, tree=False):
    """Generate with a draft; the output is exactly what the target alone would produce
    (token for token when greedy, in distribution when sampling). Returns (tokens, stats).

    draft: a model sharing the target's vocabulary, or a PromptLookup.
    adaptive: treat k as the largest k, choose each round's k by expected speedup.
    tree: tree verification instead of a chain (see tree.py; greedy, or exact sampling at a
        temperature): True for the chapter's 2 children at 3 depths, or the branching factor
        per depth, e.g. (3, 2, 1); k is then unused.
    """
    ids, stop = _check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    lookup = isinstance(draft, PromptLookup)
    vocab = _vocab_size(target)
    if not lookup and _vocab_size(draft) != vocab:
        raise ValueError(f"draft and target must share a vocabulary: draft vocab_size="
                         f"{_vocab_size(draft)}, target vocab_size={vocab}")
    if tree:
        if adaptive or lookup:
            raise ValueError("tree=True is tree verification with a model draft: it needs "
                             f"adaptive=False and a model draft, got adaptive={adaptive}, "
                             f"draft={type(draft).__name__}")
        branching = CHAPTER_TREE if tree is True else tree
        return _tree_generate(target, draft, ids.to(_device(target)), max_new_tokens, stop,
                              branching, temperature, top_k, top_p, generator)
    device = _device(target)
    ids = ids.to(device)
    chooser = _AdaptiveK(k, draft_cost) if adaptive else None

    # Capacity: the prompt, every output token, and one round's overshoot of k + 1 entries
    # (k capped like every round's, below).
    capacity = ids.numel() + max_new_tokens + _useful_k(k, max_new_tokens) + 1
    t_cache = target.new_cache(1, capacity)
    d_cache = None if lookup else draft.new_cache(1, capacity)
    if ids.numel() > 1:
        target(ids[None, :-1], t_cache)
        if not lookup:
            draft(ids[None, :-1], d_cache)
    context = ids.tolist()  # committed sequence: prompt + output
    output, rounds, accepted_total, proposed_total = [], 0, 0, 0

    while len(output) < max_new_tokens:
        rounds += 1
        base = t_cache.length
        last = torch.tensor([[context[-1]]], device=device)
        # A round yields at most k + 1 tokens: more proposals than can still be produced
        # would be wasted forwards (with k = 100000, a hang).
        limit = _useful_k(k, max_new_tokens - len(output))
        k_round = chooser.next_k(limit) if adaptive else limit
        if lookup:
            proposals, q_dists = _lookup_proposals(draft, context, k_round, vocab, device)
        else:
            proposals, q_dists = _draft_proposals(draft, d_cache, last, k_round, temperature,
                                                  top_k, top_p, generator)

        # One target forward over last + proposals: len(proposals) + 1 next-token distributions.
        block = torch.tensor([[context[-1]] + proposals], device=device)
        target_logits = target(block, t_cache)[0]                      # [len(proposals)+1, V]
        new_tokens, accepted = [], 0
        for i, proposal in enumerate(proposals):
            if temperature == 0:
                chosen = int(greedy_token(target_logits[i]))
                ok = chosen == proposal
            else:
                p = probs_from_logits(target_logits[i].double(), temperature, top_k, top_p)
                chosen, ok = accept_or_correct(p, q_dists[i], proposal, generator)
            new_tokens.append(chosen)
            if not ok:
                break  # the corrected token ends the round
            accepted += 1
        if accepted == len(proposals):
            # Every proposal accepted: the target's distribution after the last one is free.
            bonus = target_logits[len(proposals)]
            if temperature == 0:
                new_tokens.append(int(greedy_token(bonus)))
            else:
                probs = probs_from_logits(bonus.double(), temperature, top_k, top_p)
                new_tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
        accepted_total += accepted
        proposed_total += len(proposals)
        if adaptive:
            chooser.update(accepted, len(proposals))

        # Back to the invariant: committed minus the newest token. The target wrote last and
        # every proposal; keep last and the accepted ones. The draft wrote last and all but its
        # final proposal, so if every proposal was accepted it must be fed that one first.
        t_cache.truncate(base + accepted + 1)
        if not lookup:
            if proposals and accepted == len(proposals):
                draft(torch.tensor([[proposals[-1]]], device=device), d_cache)
            d_cache.truncate(base + accepted + 1)

        for token in new_tokens:
            output.append(token)
            context.append(token)
            if token in stop or len(output) == max_new_tokens:
                return output, _stats(output, rounds, accepted_total, proposed_total)
    return output, _stats(output, rounds, accepted_total, proposed_total)
