"""A speculative decoder written against the chapter's API, as an engine author would.

Point the kit at it with

    pytest properties/ --impl=properties/examples/chapter_engine.py

It exposes the two levels the kit checks: the acceptance rule `accept_or_correct` and the
engine `speculative_generate`. It does not take `top_k` / `top_p`, so the kit exercises it at
plain temperatures only. Everything here uses only the model interface the chapter defines:
`model(ids, cache) -> logits [1, T, V]`, `model.new_cache(batch, capacity)`, `cache.length`,
`cache.truncate(n)` and `model.parameters()`.
"""

import torch


def accept_or_correct(p, q, token, generator=None):
    """Verify draft token `token` (drawn from q) against the target distribution p.

    Returns (committed_token, accepted). The token is kept with probability
    min(1, p[token] / q[token]); otherwise a replacement is drawn from max(p - q, 0),
    renormalized. Both branches together commit y with probability exactly p[y].
    """
    token = int(token)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
    # u < p/q  <=>  u * q < p, which needs no division and no guard for q == 0.
    if bool(u * q[token] < p[token]):
        return token, True
    leftover = torch.clamp(p - q, min=0)
    if not bool(leftover.sum() > 0):
        # Only reachable when p == q up to rounding; then p itself is the exact correction.
        leftover = p
    pick = torch.multinomial(leftover / leftover.sum(), 1, generator=generator)
    return int(pick), False


def _distribution(logits, temperature):
    return torch.softmax(logits.double() / temperature, dim=-1)


@torch.inference_mode()
def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None):
    """Generate up to `max_new_tokens` tokens after `prompt_ids` with the target's distribution.

    Invariant at the top of each round: both caches hold the committed tokens except the newest
    one (`newest`), which neither model has been fed yet. Returns (tokens, stats).
    """
    device = next(iter(target.parameters())).device
    prompt = [int(t) for t in prompt_ids]
    stops = {int(s) for s in stop_ids}
    room = len(prompt) + max_new_tokens + k + 1
    target_cache, draft_cache = target.new_cache(1, room), draft.new_cache(1, room)
    if len(prompt) > 1:
        head = torch.tensor([prompt[:-1]], device=device)
        target(head, target_cache)
        draft(head, draft_cache)
    newest = prompt[-1]
    out, rounds, accepted_count, proposed_count = [], 0, 0, 0

    def as_ids(tokens):
        return torch.tensor([tokens], device=device)

    while len(out) < max_new_tokens:
        rounds += 1
        start = target_cache.length
        guesses, draft_probs, fed = [], [], newest
        for _ in range(k):
            row = draft(as_ids([fed]), draft_cache)[0, -1]
            if temperature == 0:
                fed = int(row.argmax())
            else:
                dist = _distribution(row, temperature)
                draft_probs.append(dist)
                fed = int(torch.multinomial(dist, 1, generator=generator))
            guesses.append(fed)
        scores = target(as_ids([newest] + guesses), target_cache)[0]      # [k + 1, V]
        committed = []
        for i, guess in enumerate(guesses):
            if temperature == 0:
                choice = int(scores[i].argmax())
                ok = choice == guess
            else:
                choice, ok = accept_or_correct(_distribution(scores[i], temperature),
                                               draft_probs[i], guess, generator)
            committed.append(choice)
            if not ok:
                break
        else:
            # Every guess survived: the target's last row gives one more token for free.
            row = scores[k]
            if temperature == 0:
                committed.append(int(row.argmax()))
            else:
                committed.append(int(torch.multinomial(_distribution(row, temperature), 1,
                                                       generator=generator)))
        kept = len(committed) - 1        # guesses that were accepted
        accepted_count += kept
        proposed_count += k
        target_cache.truncate(start + kept + 1)
        if kept == k:
            # The draft proposed its last guess without ever reading it back.
            draft(as_ids([guesses[-1]]), draft_cache)
        draft_cache.truncate(start + kept + 1)
        for token in committed:
            out.append(token)
            if token in stops or len(out) == max_new_tokens:
                return out, _stats(out, rounds, accepted_count, proposed_count)
        newest = committed[-1]
    return out, _stats(out, rounds, accepted_count, proposed_count)


def _stats(out, rounds, accepted_count, proposed_count):
    return {"rounds": rounds,
            "acceptance_rate": accepted_count / proposed_count if proposed_count else 0.0,
            "tokens_per_target_call": len(out) / rounds if rounds else 0.0}
