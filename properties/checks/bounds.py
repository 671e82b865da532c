"""Family "bounds": the output respects max_new_tokens and stop ids, and the stats add up.

* never more than max_new_tokens tokens; exactly max_new_tokens unless a stop id ended it;
* the output ends at the first stop id: none before its last token (also when the stop id is
  accepted in the middle of a block);
* every token is in the vocabulary; max_new_tokens = 0 gives no tokens;
* stats: ``rounds`` an int >= 0, at least 1 when there was output and at most one per output
  token (every round commits at least one); ``tokens_per_target_call == len(tokens) / rounds``;
  ``acceptance_rate`` in [0, 1]; and where the kit's trace shows the rounds (chain engines on kit
  caches), ``rounds`` equals the number of target verify calls and ``acceptance_rate`` equals
  the kept proposals over the proposals verified. Reported numbers are compared up to
  float32 rounding (harness.STATS_RTOL, 2^-20 relative): an engine may accumulate them in
  float32; a value outside by rounding only passes with a StatsRounding warning.
"""

from __future__ import annotations

from properties.cases import EngineCase
from properties.harness import TOO_LONG, fail, run_engine, stat_in_range, stats_value
from properties.invariants import analyse
from properties import evidence

KINDS = ("table", "qwen3")
CHECK = "properties.checks.bounds:check_bounds"


def check_bounds(impl, case: EngineCase):
    run = run_engine(impl, case)
    prop = "bounds: length, stops and stats"
    if run.error is not None:
        fail(impl, prop, CHECK, case, run.describe_error())
    tokens, n, stops = run.tokens, case.max_new_tokens, set(case.sampling.stop_ids)
    vocab = case.target.vocab
    if len(tokens) > n:
        fail(impl, prop, CHECK, case, f"{len(tokens)} tokens returned, more than "
                                      f"max_new_tokens={n}: {tokens}", cause=TOO_LONG)
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        fail(impl, prop, CHECK, case, f"token ids {bad} are outside the vocabulary [0, {vocab})")
    early = [i for i, t in enumerate(tokens[:-1]) if t in stops]
    if early:
        fail(impl, prop, CHECK, case,
             f"the output goes on after stop id {tokens[early[0]]} at position {early[0]}: "
             f"{tokens} (it must end at the first stop id)")
    if len(tokens) < n and (not tokens or tokens[-1] not in stops):
        fail(impl, prop, CHECK, case,
             f"only {len(tokens)} of max_new_tokens={n} tokens, and the output does not end "
             f"with a stop id {sorted(stops)}: {tokens}")
    check_stats(impl, case, run, prop)


def check_stats(impl, case, run, prop):
    stats, tokens = run.stats, run.tokens
    rounds = stats_value(stats, "rounds")
    rate = stats_value(stats, "acceptance_rate")
    tpc = stats_value(stats, "tokens_per_target_call")
    for name, value in (("rounds", rounds), ("acceptance_rate", rate),
                        ("tokens_per_target_call", tpc)):
        if value is None:
            fail(impl, prop, CHECK, case, f"stats[{name!r}] is missing or not a finite number: "
                                          f"stats = {stats!r}")
    if rounds != int(rounds) or rounds < 0:
        fail(impl, prop, CHECK, case, f"stats['rounds'] = {rounds} is not an int >= 0")
    analysis = analyse(run.trace, case.prompt, tokens)
    traced = analysis.chain and analysis.rounds and analysis.problem is None
    prefill_only = traced and len(analysis.rounds) == 1 and analysis.rounds[0].proposals == 0
    if tokens and rounds < 1 and not prefill_only:
        fail(impl, prop, CHECK, case, f"{len(tokens)} tokens were produced in rounds = {rounds}")
    if rounds > max(len(tokens), 0) and tokens:
        fail(impl, prop, CHECK, case, f"rounds = {rounds} for {len(tokens)} tokens: every round "
                                      f"commits at least one token")
    want = len(tokens) / rounds if rounds else 0.0
    problem = stat_in_range("tokens_per_target_call", tpc, want, want,
                            f" = len(tokens) / rounds = {len(tokens)} / {int(rounds)}")
    if problem:
        fail(impl, prop, CHECK, case, problem)
    problem = stat_in_range("acceptance_rate", rate, 0.0, 1.0)
    if problem:
        fail(impl, prop, CHECK, case, problem)
    if not traced:
        return  # no trace to compare with (or a cache problem, the cache family's business)
    evidence.acceptance(case, analysis, tokens)   # for --kit-report: no-op without it
    verified = len(analysis.rounds)
    # a prefill that yields the first token is a round with no proposals: an engine may count
    # it or not
    allowed = {verified} | ({verified - 1} if analysis.rounds[0].proposals == 0 else set())
    if rounds not in allowed:
        fail(impl, prop, CHECK, case,
             f"stats['rounds'] = {int(rounds)}, but the target made {verified} calls that decided "
             f"output tokens" + (f" (one of them the prefill, with no proposals: {verified - 1} "
                                 f"is accepted too)" if len(allowed) > 1 else ""))
    proposed = sum(r.proposals for r in analysis.rounds)
    kept = sum(r.accepted for r in analysis.rounds)
    last = analysis.rounds[-1]
    # the last round may have kept more proposals than the output shows (cut by max_new_tokens
    # or a stop id); count it anywhere from what is visible to all of it
    low = high = kept
    if last.truncated_by_end:
        high = kept - last.accepted + last.proposals
    problem = proposed and stat_in_range(
        "acceptance_rate", rate, low / proposed, high / proposed,
        f" = kept / verified proposals ({low}" + (f" .. {high}" if high != low else "")
        + f" of {proposed})")
    if problem:
        fail(impl, prop, CHECK, case,
             f"{problem}: the target verified {proposed} proposals in {verified} rounds and the "
             f"output kept {kept}"
             + (f" (up to {high} counting the last round's cut block)" if high != low else ""))
