"""Served engines for the kit's "served_params" family: fake servers, each correct except for
one sampling parameter, broken as engines have broken it under speculation.

    RejectedDraftInHistory   the repetition penalty's history holds the draft's proposal at
                             the current position before verification (a sampler that took
                             drafted tokens in and never took the rejected ones out)
    IgnoresMinP              min_p is accepted and silently dropped
    BiasAfterTemperature     the logit bias is added after temperature scaling (to processed
                             logits) instead of to the raw logits
    BiasFirstTokenOnly       the logit bias reaches the first token (the prefill's sampler)
                             but not the speculated positions (a verifier that loads no bias
                             processor, as vLLM's speculative path does not)
    DraftLogprobs            the returned logprobs are the draft's (the logits a drafted token
                             came with), not the target's
    StopStringLate           a multi-token stop string ends the output one token after it
                             completes (the check ran before the verified block was cut)
    SharedStreamN            the n completions of one request share one random stream (the
                             same seed for every completion), so they are equal

Each overrides one hook of FakeServer, so exactly one check of the family is meant for it.

Two more speculate for real, in rounds (tests/fakes/speculating.py: K = 4 greedy proposals of
draft-early-exit, token-wise verification), and break state that carries from one round to the
next, which shows only after a rejection and a later round (issue 42):

    RejectedKeptInHistory    the penalty history keeps one rejected draft token per round: the
                             rollback after a rejection takes out the tokens after the rejected
                             proposal but not the proposal itself (an off-by-one), so the
                             repetition, presence and frequency penalties of every later round
                             count it
    GeneratorRolledBack      the sampler's generator is rolled back with the KV cache: after a
                             round with a rejection its state is restored to the one before the
                             round, so the next round draws the same uniforms again (its state
                             after a rejection differs from the baseline's, which has moved on)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from properties import oracle
from properties.models import tokenizer
from reference.penalties import OPENAI
from tests.fakes.server import FakeServer
from tests.fakes.speculating import RoundsServer

DRAFT = "draft-early-exit"


class RejectedDraftInHistory(FakeServer):
    def history(self, ids, out):
        seq = list(ids) + list(out)
        proposal = int(oracle.served_next_logits([seq], DRAFT)[0].argmax())
        return tuple(ids), tuple(out) + (proposal,)


class IgnoresMinP(FakeServer):
    def params(self, body, temperature, top_k, top_p):
        return replace(super().params(body, temperature, top_k, top_p), min_p=0.0)


class BiasAfterTemperature(FakeServer):
    def next_probs(self, logits, ids, out, params):
        unbiased = replace(params, logit_bias=())
        x = unbiased.adjusted(logits, *self.history(ids, out), OPENAI) / params.temperature
        for token, bias in params.logit_bias:
            x[token] += bias
        # the rest (min_p, top-k, top-p) as the correct server does it, on these logits
        rest = replace(unbiased, temperature=1.0, repetition_penalty=1.0, presence_penalty=0.0,
                       frequency_penalty=0.0)
        return rest.probs_after(x, (), (), OPENAI)


class BiasFirstTokenOnly(FakeServer):
    def next_greedy(self, logits, ids, out, params):
        if out:
            params = replace(params, logit_bias=())
        return super().next_greedy(logits, ids, out, params)

    def next_probs(self, logits, ids, out, params):
        if out:
            params = replace(params, logit_bias=())
        return super().next_probs(logits, ids, out, params)


class DraftLogprobs(FakeServer):
    def logprob_rows(self, ids, tokens):
        seq = list(ids) + list(tokens)
        return torch.stack([oracle.served_next_logits([seq[:len(ids) + i]], DRAFT)[0]
                            for i in range(len(tokens))])


class StopStringLate(FakeServer):
    def stop_at(self, out, strings):
        text = tokenizer.decode(out[:-1])
        found = [text.find(x) for x in strings if x in text]
        return min(found) if found else None


class SharedStreamN(FakeServer):
    def _rng(self, seed, i):
        return np.random.default_rng([int(seed or 0), 0])


class RejectedKeptInHistory(RoundsServer):
    def round_history(self, state, ids, out):
        return tuple(ids), tuple(out) + tuple(state.kept)

    def rejected(self, state, proposal):
        state.kept.append(proposal)


class GeneratorRolledBack(RoundsServer):
    def round_start(self, state, draws):
        state.mark = draws.mark()

    def round_end(self, state, draws, rejected):
        if rejected:
            draws.restore(state.mark)
