"""Family "perfect_draft": with draft = target every proposal is accepted.

The draft is the target model itself (a separate kit model over the same weights, with its own
caches). Greedy or sampled, without stop ids:

* ``acceptance_rate == 1``;
* every round but the last yields k + 1 tokens (k accepted proposals and the bonus token), so
  ``rounds == ceil(max_new_tokens / (k + 1))``, and where the kit's trace shows the rounds, each
  round before the last kept all k proposals;
* exactly max_new_tokens tokens.

Under sampling p and q are the same distribution (up to float64 rounding, which could reject
with probability ~1e-15 per token), so the acceptance ratio is 1.
"""

from __future__ import annotations

import math
from properties.cases import EngineCase
from properties.harness import fail, run_engine, stats_value
from properties.invariants import analyse

KINDS = ("table", "qwen3")
CHECK = "properties.checks.perfect_draft:check_perfect_draft"


def check_perfect_draft(impl, case: EngineCase):
    prop = "perfect_draft: draft = target"
    run = run_engine(impl, case)
    if run.error is not None:
        fail(impl, prop, CHECK, case, run.describe_error())
    n, k = case.max_new_tokens, case.k
    if len(run.tokens) != n:
        fail(impl, prop, CHECK, case, f"{len(run.tokens)} tokens, expected max_new_tokens={n}")
    rate = stats_value(run.stats, "acceptance_rate")
    rounds = stats_value(run.stats, "rounds")
    if rate is None or rounds is None:
        fail(impl, prop, CHECK, case, f"stats lack acceptance_rate or rounds: {run.stats!r}")
    want_rounds = math.ceil(n / (k + 1))
    analysis = analyse(run.trace, case.prompt, run.tokens)
    per_round = ""
    if analysis.chain and analysis.rounds:
        per_round = "\n  tokens per round (from the target's verify calls): " + str(
            [r.accepted + 1 for r in analysis.rounds])
        short = [r for r in analysis.rounds[:-1] if r.accepted != k]
        if short:
            r = short[0]
            fail(impl, prop, CHECK, case,
                 f"round {r.number} of {len(analysis.rounds)} kept {r.accepted} of k={k} "
                 f"proposals of a perfect draft (fed {list(r.fed)}){per_round}")
    if rounds != want_rounds:
        fail(impl, prop, CHECK, case,
             f"rounds = {rounds}, but a perfect draft needs ceil({n} / (k + 1)) = {want_rounds}: "
             f"every round but the last must yield k + 1 = {k + 1} tokens{per_round}")
    if n > 0 and abs(rate - 1.0) > 1e-9:
        fail(impl, prop, CHECK, case, f"acceptance_rate = {rate}, expected 1.0{per_round}")
