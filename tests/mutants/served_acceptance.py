"""Speculating fake servers for the served family "served_acceptance": one correct, and one
per acceptance bug the family must catch.

`SpeculatingServer` really speculates with a kit draft model: each round proposes n tokens
(k, also past max_tokens: the "full" schedule; or "capped" to the tokens still wanted after
the round's bonus token; or "prompt": rounds from the prompt on, each of at most the tokens
still wanted), sampled from the draft's processed law q (same
temperature, top-k, top-p as the request), accepts x with probability min(1, p(x) / q(x)),
draws a rejected position's token from the normalized residual max(0, p - q) and a bonus token
from p after a fully accepted round. It counts honestly on /metrics: the `fake` engine's
drafted/accepted counters (tests/fakes/engine.py) plus accepted tokens by draft position
(`PER_POSITION`), which `COUNTING` (the fake dialect with per-position counters) reads.

The variants, each one mistake:

    GreedyDrafts        correct too: the draft's argmax proposed, q one-hot (vLLM's and
                        llama.cpp's convention), so x is accepted with probability p(x)
    InvertedRatio       accepts with min(1, q / p): the fraction written upside down
    SquaredRatio        accepts with min(1, p / q)^2: a probability applied twice (once in the
                        test, once more in a filter meant for the residual)
    CountsUnverified    counts the drafts of one more round proposed after the request ended,
                        never verified (a drafter running ahead of the verifier)
    RawLogitsRatio      draws proposals from the processed q but divides by the draft's raw
                        softmax (temperature 1, no filters): transformers #47932

Written for the tests only, independently of properties/acceptance_sampled.py: it samples, the
kit enumerates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from properties import oracle
from properties.adapters.dialects import read_prometheus
from properties.engines import vllm
from reference.sampling import probs_from_logits
from tests.fakes.engine import ACCEPTED, DRAFTED, Fake
from tests.fakes.server import FakeServer

PER_POSITION = "kit_fake_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class Counting(Fake):
    """The fake engine's dialect, reading accepted tokens by position as well."""

    name: str = "fake-counting"
    draft_proposals: str | None = None

    def counters(self, client):
        totals = read_prometheus(client, (DRAFTED,), (ACCEPTED,))
        per = vllm.accepted_per_position(client.get_root_text("/metrics"), PER_POSITION)
        return type(totals)(totals.drafted, totals.accepted, totals.source, totals.rounds, per)


def counting(proposals: str | None = None) -> Counting:
    return Counting(stop_in_ids=True, stop_in_text=True, honours_n=True,
                    draft_proposals=proposals)


class SpeculatingServer(FakeServer):
    """``with SpeculatingServer("draft-early-exit", k=4) as fake: fake.url``."""

    proposals = "sampled"

    def __init__(self, draft: str = "draft-early-exit", k: int = 4, schedule: str = "full"):
        super().__init__(None)
        if schedule not in ("full", "capped", "prompt"):
            raise ValueError(f"schedule={schedule!r}: choose from ('full', 'capped', 'prompt')")
        self.draft_model = oracle.SERVED_TARGET if draft == "perfect" else draft
        self.k, self.schedule = k, schedule
        self.spec = {"drafted": 0, "accepted": 0, "by_position": [0] * k}
        self._logits: dict = {}

    def __enter__(self):
        super().__enter__()
        fake, base = self, self.httpd.RequestHandlerClass

        class Handler(base):
            def do_GET(self):
                if self.path != "/metrics":
                    return base.do_GET(self)
                with fake.lock:
                    s = fake.spec
                    lines = [f"# TYPE {DRAFTED} counter", f"{DRAFTED} {s['drafted']}.0",
                             f"# TYPE {ACCEPTED} counter", f"{ACCEPTED} {s['accepted']}.0",
                             f"# TYPE {PER_POSITION} counter"]
                    lines += [f'{PER_POSITION}{{position="{i}"}} {a}.0'
                              for i, a in enumerate(s["by_position"])]
                self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain")

        self.httpd.RequestHandlerClass = Handler   # read per request: takes effect now
        return self

    # ----------------------------------------------------------------- the models

    def logits(self, model: str, seq) -> torch.Tensor:
        key = (model, tuple(seq))
        if key not in self._logits:
            self._logits[key] = oracle.served_next_logits([list(seq)], model)[0]
        return self._logits[key]

    @staticmethod
    def law(logits, temperature, top_k, top_p) -> np.ndarray:
        if temperature == 0:
            out = np.zeros(logits.numel())
            out[int(torch.argmax(logits))] = 1.0
            return out
        return probs_from_logits(logits, temperature, top_k, top_p).numpy()

    @staticmethod
    def draw(law, rng) -> int:
        return int(rng.choice(len(law), p=law / law.sum()))

    # ----------------------------------------------------------------- the hooks

    def propose(self, seq, sampling, rng):
        """(token, q): a proposal and the law it is judged by."""
        q = self.law(self.logits(self.draft_model, seq), *sampling)
        return self.draw(q, rng), q

    def ratio(self, p, q, x, seq, sampling) -> float:
        return 1.0 if p[x] >= q[x] else p[x] / q[x]

    def residual(self, p, q, x, seq, sampling) -> np.ndarray:
        r = np.maximum(p - q, 0.0)
        return r if r.sum() > 0 else p

    def unverified(self, n: int) -> int:
        """Drafted tokens counted for the request beyond its verified rounds."""
        return 0

    def verify(self, seq, block, sampling, rng) -> list:
        """The round's committed tokens (the accepted proposals, then one of the target's own)
        for proposals block = [(x, q), ...] after seq: token by token."""
        committed = []
        for x, q in block:
            context = seq + committed
            p = self.law(self.logits("target", context), *sampling)
            if rng.random() < self.ratio(p, q, x, context, sampling):
                committed.append(x)
                continue
            committed.append(self.draw(self.residual(p, q, x, context, sampling), rng))
            return committed
        return committed + [self.draw(self.law(self.logits("target", seq + committed),
                                               *sampling), rng)]

    # ----------------------------------------------------------------- generation

    def _generate(self, ids, max_tokens, temperature, top_k, top_p, stops, rng):
        sampling = (temperature, top_k, top_p)
        seq = list(ids)
        # "prompt": the first round drafts from the prompt, the prefill verifies it
        out = ([] if self.schedule == "prompt" else
               [self.draw(self.law(self.logits("target", seq), *sampling), rng)])
        drafted, accepted, by_position = 0, 0, [0] * self.k
        while len(out) < max_tokens and (not out or out[-1] not in stops):
            # "capped": no more proposals than the tokens still wanted after the bonus token;
            # "prompt": than the tokens still wanted
            n = (self.k if self.schedule == "full" else
                 min(self.k, max_tokens - len(out)) if self.schedule == "prompt" else
                 min(self.k, max_tokens - len(out) - 1))
            if n <= 0:
                out.append(self.draw(self.law(self.logits("target", seq + out), *sampling), rng))
                continue
            block = []
            for _ in range(n):
                x, q = self.propose(seq + out + [t for t, _ in block], sampling, rng)
                block.append((x, q))
            committed = self.verify(seq + out, block, sampling, rng)
            for j in range(len(committed) - 1):
                by_position[j] += 1
            drafted, accepted = drafted + n, accepted + len(committed) - 1
            for t in committed:
                if len(out) < max_tokens and (not out or out[-1] not in stops):
                    out.append(t)
        drafted += self.unverified(self.k)
        with self.lock:
            self.spec["drafted"] += drafted
            self.spec["accepted"] += accepted
            for j, a in enumerate(by_position):
                self.spec["by_position"][j] += a
        return out


class GreedyDrafts(SpeculatingServer):
    """Correct: proposes the draft's argmax; q is one-hot there."""

    proposals = "greedy"

    def propose(self, seq, sampling, rng):
        logits = self.logits(self.draft_model, seq)
        q = np.zeros(logits.numel())
        q[int(torch.argmax(logits))] = 1.0
        return int(torch.argmax(logits)), q


class InvertedRatio(SpeculatingServer):
    def ratio(self, p, q, x, seq, sampling):
        return 1.0 if q[x] >= p[x] else q[x] / p[x]


class SquaredRatio(SpeculatingServer):
    def ratio(self, p, q, x, seq, sampling):
        return super().ratio(p, q, x, seq, sampling) ** 2


class CountsUnverified(SpeculatingServer):
    def unverified(self, n):
        return n


class RawLogitsRatio(SpeculatingServer):
    """Proposals from the processed q; the ratio and the residual from the raw softmax."""

    def _raw(self, seq):
        return torch.softmax(self.logits(self.draft_model, seq), -1).numpy()

    def ratio(self, p, q, x, seq, sampling):
        return super().ratio(p, self._raw(seq), x, seq, sampling)

    def residual(self, p, q, x, seq, sampling):
        return super().residual(p, self._raw(seq), x, seq, sampling)


BROKEN = (InvertedRatio, SquaredRatio, CountsUnverified, RawLogitsRatio)
