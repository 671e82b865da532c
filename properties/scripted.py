"""The kit's scripted drafts: proposals computed from the served target, so that an engine
that takes caller-supplied drafts (vLLM's `custom_class` proposer) is driven through every
accept/reject branch of its verifier on purpose, not by chance.

A script is a next-token function of the whole sequence, so it is replayed as a draft model
is (its drafter, properties.methods.Scripted, answers the exact replays with `next_logits`):

    right              the target's greedy token (its float64 argmax, lowest index on a tie):
                       every proposal of a greedy request is accepted
    wrong              (argmax + 1) mod V: never the target's argmax, so a greedy request
                       accepts none
    right-then-wrong   right, except after a sequence whose hash (crc32 of its int32 tokens)
                       is 0 mod WRONG_ONE_IN: wrong there. A round is right for its first j
                       proposals and wrong at proposal j + 1 (j = k: all right), j set by the
                       round's context, so a greedy request accepts exactly j, and over the
                       rounds of a few requests every j in 0 .. k happens (a rule on the
                       length alone would not do: after a rejection every round would start at
                       the same length modulo the period, with the same j)

Drafts longer than what remains (vLLM drafts k also past max_tokens) and drafts holding a stop
id (a right draft where the target's greedy continuation holds one) come with the served
bounds family's cases. The drafter's next logits are 0 at the scripted token and NEG elsewhere
(one-hot after any temperature), so under sampling the acceptance oracle judges the proposals
as one-hot q whatever the convention.

This module needs torch and the kit's served models only: vLLM's process imports it
(properties/engines/vllm_scripted.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from properties.models import served as served_models

SCRIPTS = ("right", "wrong", "right-then-wrong")
WRONG_ONE_IN = 3    # right-then-wrong: about one proposal in 3 wrong, so j = 0 .. 4 all happen
NEG = -1.0e4        # exp(NEG) is 0 in float64: the scripted token has probability 1


def _target_logits(seqs) -> torch.Tensor:
    return served_models.next_logits(seqs, "target")


def tokens(script: str, seqs) -> list[int]:
    """The scripted next token after each sequence (token tuples, non-empty)."""
    if script not in SCRIPTS:
        raise ValueError(f"script={script!r}: choose from {SCRIPTS}")
    seqs = [tuple(int(t) for t in s) for s in seqs]
    if any(not s for s in seqs):
        raise ValueError("every sequence needs at least one token (the prompt)")
    logits = _target_logits(seqs)
    vocab = logits.shape[-1]
    argmax = [int(torch.argmax(row)) for row in logits]     # lowest index on a tie
    if script == "right":
        return argmax
    if script == "wrong":
        return [(a + 1) % vocab for a in argmax]
    return [(a + 1) % vocab if wrong_after(s) else a for a, s in zip(argmax, seqs)]


def wrong_after(seq) -> bool:
    """Whether right-then-wrong proposes a wrong token after `seq`."""
    return zlib.crc32(np.asarray(seq, dtype=np.int32).tobytes()) % WRONG_ONE_IN == 0


def next_logits(seqs, script: str) -> torch.Tensor:
    """[B, V] float64: 0 at the scripted token after each sequence, NEG elsewhere."""
    chosen = tokens(script, seqs)
    from properties.models.served import VOCAB
    out = torch.full((len(chosen), VOCAB), NEG, dtype=torch.float64)
    out[torch.arange(len(chosen)), torch.tensor(chosen, dtype=torch.long)] = 0.0
    return out


def propose(script: str, context, n: int) -> list[int]:
    """The script's n proposals after `context`, each after the ones before it."""
    seq, out = tuple(int(t) for t in context), []
    for _ in range(n):
        token = tokens(script, [seq])[0]
        out.append(token)
        seq += (token,)
    return out


def accepted_by_greedy(script: str, context, n: int) -> int:
    """How many of the n proposals after `context` a greedy verifier accepts (the leading ones
    equal to the target's greedy continuation)."""
    seq, a = tuple(int(t) for t in context), 0
    for x in propose(script, context, n):
        if x != tokens("right", [seq])[0]:
            break
        a, seq = a + 1, seq + (x,)
    return a
