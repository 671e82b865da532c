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
from properties.harness import TOO_LONG, fail, run_engine, stat_in_range, stats_value
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
        fail(impl, prop, CHECK, case, f"{len(run.tokens)} tokens, expected max_new_tokens={n}",
             cause=TOO_LONG if len(run.tokens) > n else None)
    rate = stats_value(run.stats, "acceptance_rate")
    rounds = stats_value(run.stats, "rounds")
    if rate is None or rounds is None:
        fail(impl, prop, CHECK, case, f"stats lack acceptance_rate or rounds: {run.stats!r}")
    analysis = analyse(run.trace, case.prompt, run.tokens)
    per_round = ""
    if analysis.chain and analysis.rounds:
        rounds_seen = analysis.rounds
        per_round = "\n  tokens per round (from the target's calls): " + str(
            [r.decided for r in rounds_seen])
        for r in rounds_seen[:-1]:
            if r.proposals == 0 and r is rounds_seen[0]:
                continue   # the prefill's own token: a round with nothing to verify
            if r.proposals != k or r.accepted != r.proposals:
                fail(impl, prop, CHECK, case,
                     f"round {r.number} of {len(rounds_seen)} verified {r.proposals} new "
                     f"proposals and kept {r.accepted}, but with a perfect draft every round "
                     f"but the last verifies k={k} proposals and keeps them all, plus the bonus "
                     f"token (fed {list(r.fed)} from position {r.start}; positions before "
                     f"{r.frontier} were already decided){per_round}")
        # rounds: the target's calls that decided output tokens; an engine may leave out of
        # its count a prefill that only yields the first token
        want = {len(rounds_seen)}
        if rounds_seen[0].proposals == 0:
            want.add(len(rounds_seen) - 1)
        how = "its target calls that decided output tokens, as the trace shows"
    else:
        want = {math.ceil(n / (k + 1))}
        how = f"ceil({n} / (k + 1)): every round but the last must yield k + 1 = {k + 1} tokens"
    if rounds not in want:
        fail(impl, prop, CHECK, case,
             f"rounds = {rounds}, but a perfect draft needs {' or '.join(map(str, sorted(want)))} "
             f"({how}){per_round}")
    # with no proposal verified at all (a prefill-only output) the rate is 0 / 0: not judged
    proposed = (sum(r.proposals for r in analysis.rounds) if analysis.chain and analysis.rounds
                else n)
    problem = proposed > 0 and stat_in_range("acceptance_rate", rate, 1.0, 1.0)
    if problem:
        fail(impl, prop, CHECK, case, f"{problem}{per_round}")
