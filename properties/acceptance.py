"""The acceptance a speculating server must report, computed exactly from the kit's models.

For a greedy request the committed output is the target's greedy continuation, and a draft
token is accepted exactly when it equals the target's token there: Σ min(p, q) per position
with one-hot p and q is 1 where the argmaxes agree and 0 elsewhere. Replaying the rounds with
the kit's own float64 draft gives the number of drafts, drafted tokens and accepted tokens the
engine's counters must show for that request.

Engines schedule drafts differently at the end of a request: `schedule` names the two habits
seen so far.
    "full"    every round drafts k tokens while the output is short of max_tokens, also when
              fewer remain (tokens accepted beyond max_tokens are counted, then cut)
    "capped"  a round drafts at most the tokens still wanted after its bonus token
    "prompt"  no first token from the prefill: the first round drafts from the prompt and the
              prefill verifies it; a round drafts at most the tokens still wanted
Otherwise a first token comes from the prefill (no draft); each round then commits its
accepted tokens and one more from the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from properties import oracle

SCHEDULES = ("full", "capped", "prompt")


@dataclass(frozen=True)
class Expected:
    drafts: int
    drafted: int
    accepted: int


@lru_cache(maxsize=4096)
def _draft_greedy(draft: str, seq: tuple, k: int) -> tuple:
    out, s = [], list(seq)
    for _ in range(k):
        token = int(torch.argmax(oracle.served_next_logits([s], draft)[0]))
        out.append(token)
        s.append(token)
    return tuple(out)


def greedy(prompt, max_tokens: int, draft: str, k: int, schedule: str = "full",
           produced: int | None = None, eos_stops_acceptance: bool = False) -> Expected:
    """Exact counters of one greedy request whose draft is served model `draft` (a method's
    `drafter.model`; "target": the target drafts for itself), or a drafter that computes its
    own rounds (a head: `draft.greedy_round(context, n)`, methods.exact_draft).
    `produced`: the request ended after this many tokens (an end-of-sequence id) before
    max_tokens; its rounds are those of a request for max_tokens, up to that end.
    `eos_stops_acceptance`: the engine's convention at that end (see `replay`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: choose from {SCHEDULES}")
    if max_tokens < 1:
        return Expected(0, 0, 0)
    target = oracle.served_greedy(prompt, max_tokens + k + 1)   # accepted tokens may run past the end
    round_of = getattr(draft, "greedy_round", None) or (lambda seq, n: _draft_greedy(draft, seq, n))
    return replay(target, lambda committed, n: round_of(
        tuple(prompt) + tuple(target[:committed]), n), max_tokens, k, schedule, produced,
        eos_stops_acceptance)


def replay(target, propose, max_tokens: int, k: int, schedule: str = "full",
           produced: int | None = None, eos_stops_acceptance: bool = False) -> Expected:
    """The rounds of one greedy request, for any pair of models: `target` is the target's
    greedy continuation of the prompt (max_tokens + k + 1 tokens: accepted proposals may run
    past the end), `propose(committed, n)` the draft's n greedy proposals after the prompt and
    target[:committed]. `produced` as in `greedy`.

    A round whose accepted proposals reach a request's end of sequence (`produced` before
    max_tokens: target[produced - 1] is the end-of-sequence id) is counted in one of two ways,
    each an engine's convention: by default as if the request went on (every matching proposal
    accepted, as a verifier that stops only after accepting); with `eos_stops_acceptance` no
    proposal after the end-of-sequence id is accepted and the id itself only as the round's
    last proposal (llama.cpp's common_sampler_sample_and_accept_n: "do not accept draft tokens
    after an EOG ... a trailing EOG is still accepted"), so a perfect draft that proposes the
    end inside a round has proposals left unaccepted."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: choose from {SCHEDULES}")
    if max_tokens < 1:
        return Expected(0, 0, 0)
    end = max_tokens if produced is None else min(produced, max_tokens)
    committed = 0 if schedule == "prompt" else 1
    drafts = drafted = accepted = 0
    while committed < end:
        n = (k if schedule == "full" else min(k, max_tokens - committed) if schedule == "prompt"
             else min(k, max_tokens - committed - 1))
        if n <= 0:
            break
        proposals = tuple(propose(committed, n))
        a = 0
        while a < n and proposals[a] == target[committed + a]:
            a += 1
        eos = end - 1 - committed      # the end-of-sequence id's place among the proposals
        if eos_stops_acceptance and produced is not None and end < max_tokens and a > eos:
            a = eos + 1 if eos == n - 1 else eos
        drafts, drafted, accepted = drafts + 1, drafted + n, accepted + a
        committed += a + 1
    return Expected(drafts, drafted, accepted)
