"""The fake server speculating for real, in rounds, and the exact law of what it answers.

`RoundsServer` is tests/fakes/server.py's FakeServer (the same HTTP answers, the OpenAI
formula for penalties, min_p and logit_bias) whose completions are made as an engine makes them:
the first token from the prefill, then rounds of K greedy proposals of a draft model
(draft-early-exit), each verified token by token against the target's law after the committed
tokens (processed by the formula with the penalty history), a proposal x accepted with
probability p(x) (the one-hot q of a greedy proposal: min(1, p / q)), the first rejection
replaced by a draw from the normalized residual (p without x), and a bonus token after a round
that accepted all K. It is correct: its outputs have the law of ancestral sampling.

The round is written once, against a `Draws` object, with four hooks a mutant overrides
(tests/mutants/served_params.py): the penalty history (`round_history`), what a rejection
leaves behind (`rejected`), and the start and end of a round (`round_start`, `round_end`: the
generator's state). Two kinds of Draws run it:

    Sampled      the request's numpy generator: a uniform per decision (a choice by inversion
                 of the cumulative law, an acceptance by u < p(x)); mark / restore its state
    Enumerating  one path of the exhaustive enumeration of every decision: each uniform of the
                 stream is an interval, narrowed by each decision taken on it (a restored
                 generator reuses its uniforms, so they are narrowed again); a path's probability
                 is the product of its intervals' lengths, exact for any reuse

`exact_law(server, ...)` runs the round again and again, one path per run (the decisions of a
path are a script; each new decision's other branches become new scripts), and adds up each
output's probability: the exact law of the server's answers, correct or broken, with no
sampling (tests/test_served_rounds.py checks it against the oracle's law for the correct server).

(tests/mutants/served_acceptance.py's SpeculatingServer speculates too, for the acceptance
counters: sampled or greedy proposals and several schedules, with no penalty history. This one
carries the penalty history across rounds and knows its own law exactly.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from properties import oracle
from reference.penalties import OPENAI
from reference.sampling import SamplingParams
from tests.fakes.server import FakeServer

K = 4
DRAFT = "draft-early-exit"


@lru_cache(maxsize=1 << 16)
def next_logits(model: str, seq: tuple) -> torch.Tensor:
    """The served model's float64 logits after seq (cached: the enumeration asks again)."""
    return oracle.served_next_logits([seq], model)[0]


# --------------------------------------------------------------------------- draws

class Sampled:
    """Decisions drawn from a numpy generator, one uniform each."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def choice(self, probs) -> int:
        p = np.asarray(probs, dtype=np.float64)
        cut = np.cumsum(p) / p.sum()
        i = int(np.searchsorted(cut, self.rng.random(), side="right"))
        return min(i, int(np.flatnonzero(p > 0)[-1]))

    def accept(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def mark(self):
        return self.rng.bit_generator.state

    def restore(self, state) -> None:
        self.rng.bit_generator.state = state


class Enumerating:
    """One path of the enumeration: decisions taken from `script` while it lasts, then the
    first possible branch of each new decision, its other possible branches left in
    `alternatives` (each a script) for later runs."""

    def __init__(self, script: list[int]):
        self.script, self.taken, self.alternatives = script, [], []
        self.intervals: list[tuple[float, float]] = []    # per uniform of the stream
        self.position = 0                                 # the next uniform's index

    def _decide(self, cuts) -> int:
        """The branch of a decision on the next uniform; `cuts`: the branches' upper ends
        (branch j: u in [cuts[j - 1], cuts[j]))."""
        i = self.position
        self.position += 1
        if i == len(self.intervals):
            self.intervals.append((0.0, 1.0))
        a, b = self.intervals[i]
        lows = np.concatenate([[0.0], cuts[:-1]])
        spans = [(max(a, lo), min(b, hi)) for lo, hi in zip(lows, cuts)]
        possible = [j for j, (lo, hi) in enumerate(spans) if hi > lo]
        d = len(self.taken)
        if d < len(self.script):
            branch = self.script[d]
        else:
            branch = possible[0]
            self.alternatives += [self.taken + [j] for j in possible[1:]]
        self.taken.append(branch)
        self.intervals[i] = spans[branch]
        return branch

    def choice(self, probs) -> int:
        p = np.asarray(probs, dtype=np.float64)
        cuts = np.cumsum(p) / p.sum()
        cuts[-1] = 1.0
        return self._decide(cuts)

    def accept(self, prob: float) -> bool:
        return self._decide(np.array([min(max(float(prob), 0.0), 1.0), 1.0])) == 0

    def mark(self):
        return self.position

    def restore(self, state) -> None:
        self.position = state

    @property
    def probability(self) -> float:
        return float(np.prod([b - a for a, b in self.intervals]))


class Greedy:
    """Temperature 0: no decision is random."""


# --------------------------------------------------------------------------- the server

@dataclass
class RoundState:
    """What one request's rounds carry: the mutants' extra history, the generator's mark."""

    kept: list = field(default_factory=list)
    mark: object = None


class RoundsServer(FakeServer):
    """FakeServer whose token-id completions (stop strings aside) are speculated in rounds."""

    draft = DRAFT

    # ----------------------------------------------------------------- hooks

    def round_history(self, state: RoundState, ids, out) -> tuple:
        """(prompt, generated) the penalties see: the committed tokens."""
        return tuple(ids), tuple(out)

    def rejected(self, state: RoundState, proposal: int) -> None:
        """A round's proposal was rejected (and replaced)."""

    def round_start(self, state: RoundState, draws) -> None:
        """A round begins (after the prefill's token)."""

    def round_end(self, state: RoundState, draws, rejected: bool) -> None:
        """A round ended, with a rejection or without."""

    # ----------------------------------------------------------------- the rounds

    def _law_after(self, state, ids, out, params):
        logits = next_logits("target", tuple(ids) + tuple(out))
        prompt, generated = self.round_history(state, ids, out)
        if params.greedy:
            return int(torch.argmax(params.adjusted(logits, prompt, generated, OPENAI)))
        return params.probs_after(logits, prompt, generated, OPENAI).numpy()

    def _token(self, law, draws) -> int:
        return law if isinstance(law, int) else draws.choice(law)

    def speculate(self, ids, max_tokens: int, params: SamplingParams, stops, draws) -> list:
        """One completion, made in rounds (the module's docstring)."""
        state, out = RoundState(), []
        done = lambda: len(out) >= max_tokens or (out and out[-1] in stops)  # noqa: E731
        if max_tokens < 1:
            return out
        out.append(self._token(self._law_after(state, ids, out, params), draws))
        while not done():
            self.round_start(state, draws)
            context, proposals = tuple(ids) + tuple(out), []
            for _ in range(K):
                proposals.append(int(next_logits(self.draft, context + tuple(proposals))
                                     .argmax()))
            rejected = False
            for x in proposals:
                law = self._law_after(state, ids, out, params)
                if isinstance(law, int):
                    ok, token = law == x, law
                elif draws.accept(law[x]):
                    ok, token = True, x
                else:
                    residual = law.copy()
                    residual[x] = 0.0
                    ok, token = False, draws.choice(residual)
                out.append(token)
                if not ok:
                    rejected = True
                    self.rejected(state, x)
                    break
                if done():
                    break
            else:
                if not done():      # every proposal accepted: the bonus token
                    out.append(self._token(self._law_after(state, ids, out, params), draws))
            self.round_end(state, draws, rejected)
        return out

    # ----------------------------------------------------------------- FakeServer's paths

    def _generate(self, ids, max_tokens, temperature, top_k, top_p, stops, rng):
        params = SamplingParams(temperature=float(temperature), top_k=int(top_k or 0),
                                top_p=float(top_p))
        return self.speculate(ids, max_tokens, params, set(stops), Sampled(rng))

    def _generate_shaped(self, ids, max_tokens, params, stops, rng):
        if params.stop_strings:
            return super()._generate_shaped(ids, max_tokens, params, stops, rng)
        return self.speculate(ids, max_tokens, params, set(stops), Sampled(rng)), None


# --------------------------------------------------------------------------- the exact law

def exact_law(server: RoundsServer, prompt, max_tokens: int, params: SamplingParams,
              stops=()) -> dict:
    """outcome (tuple of tokens) -> the exact probability that `server` answers it, by
    enumerating every path of its decisions (the module's docstring)."""
    if params.greedy:
        return {tuple(server.speculate(prompt, max_tokens, params, set(stops), Greedy())): 1.0}
    law: dict = {}
    scripts = [[]]
    while scripts:
        draws = Enumerating(scripts.pop())
        tokens = tuple(server.speculate(prompt, max_tokens, params, set(stops), draws))
        scripts += draws.alternatives
        law[tokens] = law.get(tokens, 0.0) + draws.probability
    return {o: law[o] for o in sorted(law)}


def total_variation(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(o, 0.0) - q.get(o, 0.0)) for o in set(p) | set(q))
