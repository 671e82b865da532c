"""The served family "served_acceptance": under sampling, the engine's own acceptance counters
against the exact expectation of its draft's acceptance.

The design makes each completion one drafting round. A sampled request of max_tokens L gets its
first token t0 from the prefill; one round of proposals follows from (prompt, t0):

    "full" schedule (vLLM)        L = 2: the round drafts k, also past max_tokens
    "capped" schedule (llama.cpp) L = 3: the round drafts the tokens still wanted after its
                                  bonus token, min(k, 3 - 1 - 1) = 1 (at L = 2 it drafts none:
                                  tools/server/server-context.cpp, get_n_draft_max caps the
                                  draft at n_remaining - 1)

and the round leaves nothing to draft for (at least L tokens, or none wanted after the bonus).
An engine whose first round drafts from the prompt (onnxruntime-genai: the target's prefill
verifies it) has no t0 before its round:

    "prompt" schedule             L = 1: the round drafts min(k, 1) = 1 token from the prompt
                                  (at L >= 2 a round committing one token is followed by a
                                  second), so A is Bernoulli with the exact law of the prompt's
                                  round, the same for every completion

Given each completion's observed t0, its accepted count A has an exact law computed from the
kit's models (properties.acceptance_sampled); the rounds are independent given their t0, so
the engine's total accepted has the exact law of the sum (a convolution), and is tested two-
sided against it. Conditioning on t0 is sound: t0 is decided before the round, and nothing
after it is conditioned on (the tokens the round commits are not).

The convention of the proposals, from the engines' sources:
    vLLM 0.32.0   greedy: the draft's argmax, treated as one-hot by the rejection sampler
                  (vllm/config/speculative.py draft_sample_method="greedy" by default;
                  v1/spec_decode/llm_base_proposer.py _sample_draft_tokens; v1/sample/
                  rejection_sampler.py rejection_random_sample_kernel, draft_prob = 1)
    llama.cpp     greedy: draft-simple proposes the top candidate of a top-k 10 sampler
                  (common/speculative.cpp, common_speculative_impl_draft_simple::draft,
                  cur_p->data[0]); the target samples its own token at each position and keeps
                  the draft while they agree (common/sampling.cpp,
                  common_sampler_sample_and_accept_n): P(accept x) = p(x)
An engine's dialect declares it as `draft_proposals`; where it does not, both conventions are
tried and the check passes when one fits (each alone at the check's level, so a correct engine
still fails with chance at most alpha); the result says which fitted.

The verification rule is the method's (`Method.verification`): "token-wise" (above), or
"block" (Sun et al. 2024; reference/block.py), whose exact law the same tree walk gives
(properties.acceptance_sampled). Block verification accepts at least as many tokens as token-
wise at every position, and exactly as many under greedy proposals (one-hot q), so with greedy
proposals the check cannot tell whether the engine ran block verification (the Verdict's
`rule_power` is 0 there). With sampled proposals the plan also sizes N so that token-wise
verification running where block was declared (vllm-ascend #7807) is rejected with POWER: N >=
52.1 v / s^2, s the exact expected shift of a round's accepted count between the two rules (at
most MAX_RULE_SAMPLES completions; the Verdict states the power reached), and a failure says
when the engine's counts fit token-wise verification instead.

Counts judged:
    drafted     exactly the schedule's count per round (k or capped), in total, per response
                where the engine reports per response, and one round per completion where it
                counts rounds (vLLM's spec_decode_num_drafts)
    accepted    the total, exact two-sided test at level ALPHA / 2
    by position where the engine counts accepted tokens by draft position (vLLM's
                spec_decode_num_accepted_tokens_per_pos): the number of rounds accepting
                position i is a sum of independent Bernoulli(P(A >= i)), tested exactly at
                level ALPHA / (2 k) each; the positions add up to the total accepted
By the union bound the check's false-alarm rate is at most statistics.ALPHA = 2e-6.

Sample size (power against the design deviation): an engine whose acceptance rate per drafted
token is off by DELTA_ACCEPTANCE = 0.05 (absolute) shifts the total accepted of N rounds of n
proposals by 0.05 n N, while its standard deviation is sqrt(N v), v = E over t0 of
Var[A | prompt, t0] (t0 drawn from the target's law after the prompt: the same exact variances
the test uses). The two-sided z-test at level ALPHA / 2 = 1e-6 detects that with power
Phi(0.05 n sqrt(N) / sqrt(v) - z_{1 - 5e-7}) >= POWER = 0.99 when

    N >= (z_{1 - 5e-7} + z_{0.99})^2 v / (0.05 n)^2 = (4.892 + 2.326)^2 v / (0.05 n)^2
      = 52.1 v / (0.05 n)^2,

at least MIN_SAMPLES. Worked example (the family's first canonical case: prompt
(3, 9, 27, 3, 9, 27), temperature 1, no filters; vLLM's k = 4 greedy proposals of the early-exit
draft): v = 0.997, so N = 52.1 * 0.997 / 0.2^2 = 1299 completions; llama.cpp's one capped
proposal there: v = 0.017 (greedy), 0.040 (sampled), N = max(360, 833) = 833 for either
convention. The variance is the null's; the exact test needs no approximation, the power does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from properties import acceptance_sampled as exact
from properties import evidence, methods, oracle, progress, statistics
from properties.cases import ServedCase
from properties.checks import served as served_checks
from properties.harness import fail
from properties.models.served import VOCAB
from properties.speculation import send
from properties.adapters.protocol import Request, ServedError

CHECK = "properties.checks.served_acceptance:check_sampled_acceptance"
PROP = "served_acceptance: the engine's accepted counts under sampling equal the exact expectation"
DELTA_ACCEPTANCE = 0.05    # design deviation: acceptance rate per drafted token, absolute
MIN_SAMPLES = 200          # completions at least (the power's normal approximation needs many)
# max_tokens that make each completion one drafting round: after the prefill token, a full
# round of k, or a capped round of one; or ("prompt") a round of one proposal drafted from the
# prompt itself, which the target's prefill verifies (a second round would follow any round
# that commits fewer than max_tokens tokens, so max_tokens 1 is the only one-round length)
DESIGN = {"full": 2, "capped": 3, "prompt": 1}
# Nodes of one round's draft tree the sampled convention may evaluate (two forwards each):
# beyond it the check narrows top-k (a k-way tree of depth n - 1 has (k^n - 1) / (k - 1) nodes).
MAX_TREE = 400
PROBE_COMPLETIONS = 8      # an undeclared schedule is learned from this many
# completions at most spent on telling a declared verification rule from token-wise (the power
# reached is in the Verdict)
MAX_RULE_SAMPLES = 8000


@dataclass(frozen=True)
class Verdict:
    """What the check saw: the convention(s) that fitted, the design and the counts."""

    fitted: tuple
    schedule: str
    samples: int
    drafted: float
    accepted: float
    expected: dict            # convention -> exact expected accepted total
    p_values: dict            # convention -> p-value of the total
    power: float
    verification: str = "token-wise"   # the rule the method declared, and judged against
    # convention -> the power of telling the declared rule from token-wise verification at
    # these samples (empty for a token-wise method; 0 where the two laws are one)
    rule_power: dict = field(default_factory=dict)


def drafts_per_round(schedule: str, k: int, budget: int) -> int:
    """Proposals of the design's round, the request wanting `budget` tokens: after the prefill
    token, k ("full") or the tokens still wanted after the round's bonus ("capped"); from the
    prompt, the tokens wanted, at most k ("prompt")."""
    if schedule not in DESIGN:   # the schedules with a one-round design
        raise ValueError(f"schedule={schedule!r}: choose from {tuple(DESIGN)}")
    if schedule == "prompt":
        return max(0, min(k, budget))
    return k if schedule == "full" else max(0, min(k, budget - 2))


def rounds_of(prompt, completion, max_tokens: int, schedule: str, k: int) -> list:
    """(context, proposals) of each drafting round of a completion of the one-round design.
    A completion assembled from several requests (pieces, each from the prefix so far) had a
    round after the prefill token of each piece that went on past it; with max_tokens at most
    DESIGN[schedule] no piece has a second round (its first commits >= 2 of <= 2 tokens, or
    leaves none to draft for)."""
    pieces = completion.pieces or (len(completion.tokens),)
    # the round's context: the prefix and the prefill token ("full", "capped"), or the prefix
    # alone ("prompt": the round drafts before the piece's first token)
    first = 0 if schedule == "prompt" else 1
    out, done = [], 0
    for length in pieces:
        n = drafts_per_round(schedule, k, max_tokens - done)
        if length >= first + 1 and n > 0:
            out.append((tuple(prompt) + tuple(completion.tokens[:done + first]), n))
        done += length
    return out


def conventions(impl) -> tuple:
    """The proposal convention the method fixes or the engine's dialect declares, else both
    (either may fit)."""
    declared = impl.method.proposals or getattr(impl.client.dialect, "draft_proposals", None)
    if declared is not None and declared not in exact.PROPOSALS:
        raise ValueError(f"{impl.client.dialect.name} dialect: draft_proposals={declared!r}, "
                         f"choose from {exact.PROPOSALS}")
    return (declared,) if declared else exact.PROPOSALS


def design(case: ServedCase, schedule: str, k: int, proposals: tuple,
           perfect: bool = False) -> ServedCase:
    """The case as the check sends it: max_tokens of the one-round design, no stop ids, and
    top-k narrowed where the sampled convention's tree would pass MAX_TREE nodes (a perfect
    draft's sampled tree is never walked: every level weighs 1)."""
    if case.sampling.temperature == 0:
        raise ValueError(f"case={case!r}: served_acceptance samples (temperature > 0); greedy "
                         f"counters are check_counters' (served_bounds)")
    out = case.replace(max_tokens=DESIGN[schedule], stop_ids=())
    n = drafts_per_round(schedule, k, DESIGN[schedule])
    if "sampled" in proposals and not perfect:
        support = out.sampling.top_k or VOCAB
        while support > 1 and exact.tree_nodes(n, support) > MAX_TREE:
            support -= 1
        if support < (out.sampling.top_k or VOCAB):
            out = out.replace(top_k=support)
    return out


def verification(impl) -> str:
    """The verification rule the method declares (token-wise where it declares none)."""
    declared = getattr(impl.method, "verification", "token-wise")
    if declared not in exact.VERIFICATIONS:
        raise ValueError(f"method {impl.method.name!r}: verification={declared!r}, choose from "
                         f"{exact.VERIFICATIONS}")
    return declared


def rule(impl) -> dict:
    """The verification rule the method declares, as the exact law's keyword (none for
    token-wise, the law's default)."""
    declared = verification(impl)
    return {} if declared == "token-wise" else {"verification": declared}


def rule_shifts(impl, case: ServedCase, schedule: str, proposals: tuple) -> dict:
    """convention -> the exact expected shift of one design round's accepted count between
    the declared rule and token-wise verification (t0 by its law): {} for a token-wise method,
    0 for greedy proposals or a perfect draft (one law)."""
    declared = verification(impl)
    if declared == "token-wise":
        return {}
    n = drafts_per_round(schedule, impl.k, DESIGN[schedule])
    law = {None: 1.0} if schedule == "prompt" else t0_law(case)
    contexts = [tuple(case.prompt) + ((t,) if t is not None else ()) for t in law]
    shifts = {}
    for convention in proposals:
        means = [[r.mean for r in exact.cached_round_laws(contexts, n,
                                                          methods.exact_draft(impl.method.drafter),
                                                          case.sampling, convention, which)]
                 for which in (declared, "token-wise")]
        shifts[convention] = sum(p * (a - b) for p, a, b in zip(law.values(), *means))
    return shifts


def t0_law(case: ServedCase) -> dict:
    """The target's law of the prefill token: t0 -> probability."""
    probs = case.sampling.probs(oracle.served_next_logits([case.prompt])[0])
    return {t: float(p) for t, p in enumerate(probs) if p > 0}


def plan(impl, case: ServedCase, schedule: str, proposals: tuple) -> tuple[int, float, int]:
    """(N, v, n): completions needed for POWER at DELTA_ACCEPTANCE (the module's arithmetic),
    the mean variance per round of the convention that needs most, proposals per round."""
    n = drafts_per_round(schedule, impl.k, DESIGN[schedule])
    # the round's context: the prompt and each prefill token by its law, or the prompt alone
    law = {None: 1.0} if schedule == "prompt" else t0_law(case)
    contexts = [tuple(case.prompt) + ((t,) if t is not None else ()) for t in law]
    worst_v = 0.0
    for convention in proposals:
        laws = exact.cached_round_laws(contexts, n, methods.exact_draft(impl.method.drafter),
                                       case.sampling, convention, **rule(impl))
        worst_v = max(worst_v, sum(p * r.var for p, r in zip(law.values(), laws)))
    need = exact.samples_needed(worst_v, DELTA_ACCEPTANCE * n, statistics.ALPHA / 2,
                                statistics.POWER) if n else MIN_SAMPLES
    # a declared rule other than token-wise: enough samples to tell the two apart (sampled
    # proposals; where their laws are one no number of samples does)
    shifts = [s for s in rule_shifts(impl, case, schedule, proposals).values() if s > 1e-12]
    if shifts and n:
        tell = exact.samples_needed(worst_v, min(shifts), statistics.ALPHA / 2,
                                    statistics.POWER)
        need = max(need, min(tell, MAX_RULE_SAMPLES))
    return max(MIN_SAMPLES, need), worst_v, n


def _probe_schedule(impl, case: ServedCase) -> str:
    """An undeclared schedule, from what the engine drafts for a few requests of max_tokens 2:
    k per round ("full") or none ("capped")."""
    client = impl.client
    probe = case.replace(max_tokens=DESIGN["full"], stop_ids=())
    requests = [Request(tuple(probe.prompt), probe.max_tokens,
                        replace(probe.sampling, seed=probe.sampling.seed + 10_000 + i, n=1))
                for i in range(PROBE_COMPLETIONS)]
    try:
        counted = client.dialect.count(client, requests)
    except ServedError as exc:
        fail(impl, PROP, CHECK, case, f"cannot read the engine's counters: {exc}")
    if counted is None:
        fail(impl, PROP, CHECK, case, f"{client.url} reports no speculation counters")
    done = [c for a in counted.answers for c in a]
    fits = [s for s in ("full", "capped")
            if counted.drafted == sum(n for c in done
                                      for _, n in rounds_of(probe.prompt, c, probe.max_tokens,
                                                            s, impl.k))]
    if not fits:
        fail(impl, PROP, CHECK, case,
             f"{counted.drafted:g} tokens drafted for {len(done)} completions of max_tokens 2: "
             f"neither schedule drafts that many (full: k={impl.k} per completion; capped: "
             f"none)")
    return fits[0]


def _counters(impl, case):
    """The engine's server-wide counters now, where they count accepted tokens by position."""
    dialect = impl.client.dialect
    if dialect.per_response:
        return None
    try:
        now = dialect.counters(impl.client)
    except ServedError as exc:
        fail(impl, PROP, CHECK, case, f"cannot read the engine's counters: {exc}")
    return now if getattr(now, "accepted_per_position", None) is not None else None


def check_sampled_acceptance(impl, case: ServedCase) -> Verdict:
    proposals = conventions(impl)
    schedule = impl.schedule or _probe_schedule(impl, case)
    case = design(case, schedule, impl.k, proposals, impl.method.drafter.perfect)
    N, v, n = plan(impl, case, schedule, proposals)
    power = exact.z_power(DELTA_ACCEPTANCE * n * N, (N * v) ** 0.5, statistics.ALPHA / 2)
    declared = verification(impl)
    rule_power = {c: exact.z_power(s * N, (N * v) ** 0.5, statistics.ALPHA / 2)
                  for c, s in rule_shifts(impl, case, schedule, proposals).items()}
    the_plan = statistics.Plan(n=N, df=1, delta=DELTA_ACCEPTANCE, power=power,
                               alpha=statistics.ALPHA)
    evidence.planned(the_plan)
    progress.planned(N)
    statistics.checks_run += 1

    before = _counters(impl, case)
    try:
        answers, seen = send(impl, served_checks.sampling_requests(impl.client, case, N))
    except ServedError as exc:
        fail(impl, PROP, CHECK, case, f"the server failed a request: {exc}")
    after = _counters(impl, case) if before is not None else None
    done = [c for a in answers for c in a]
    for c in done:
        problem = served_checks.bounds_violation(case, c)
        if problem or len(c.tokens) != case.max_tokens:
            fail(impl, PROP, CHECK, case, f"a sampled completion breaks the bounds: "
                                          f"{problem or 'too short'}\nserved: {list(c.tokens)}")
    if seen.drafted is None or seen.accepted is None:
        fail(impl, PROP, CHECK, case, f"the engine reported no drafted/accepted counts for "
                                      f"these requests ({seen.describe()})")

    # ---- drafted: exactly the schedule's proposals, round by round
    rounds = [rounds_of(case.prompt, c, case.max_tokens, schedule, impl.k) for c in done]
    drafted = sum(m for r in rounds for _, m in r)
    where = (f"{len(done)} completions of max_tokens {case.max_tokens}, {schedule} schedule, "
             f"k={impl.k}, {impl.method.drafter.describe()}")
    if seen.drafted != drafted:
        fail(impl, PROP, CHECK, case,
             f"the engine reports {seen.drafted:g} drafted tokens, "
             f"{'fewer' if seen.drafted < drafted else 'more'} than the schedule's; the "
             f"{schedule} schedule proposes exactly {drafted} in the {sum(map(len, rounds))} "
             f"rounds of {where} (a drafted token no round verified, or a round the schedule "
             f"does not make)")
    if impl.client.dialect.per_response:
        for c, r in zip(done, rounds):
            if c.drafted != sum(m for _, m in r):
                fail(impl, PROP, CHECK, case,
                     f"a completion reports {c.drafted} drafted tokens; its {schedule} round(s) "
                     f"propose {sum(m for _, m in r)}\nserved: {list(c.tokens)}")
    counted_rounds = seen.speculated if not impl.client.dialect.per_response else None
    if counted_rounds is not None and counted_rounds != sum(map(len, rounds)):
        fail(impl, PROP, CHECK, case,
             f"the engine counts {counted_rounds:g} drafting rounds; {where} make exactly "
             f"{sum(map(len, rounds))} (one per completion whose prefill token is not its last)")
    if seen.accepted > seen.drafted:
        fail(impl, PROP, CHECK, case, f"{seen.accepted:g} tokens accepted of {seen.drafted:g} "
                                      f"drafted: more than were proposed")
    by_position = None
    if before is not None and after is not None:
        width = max(len(before.accepted_per_position), len(after.accepted_per_position))
        pad = lambda t: tuple(t) + (0.0,) * (width - len(t))
        by_position = tuple(a - b for a, b in zip(pad(after.accepted_per_position),
                                                  pad(before.accepted_per_position)))
        if abs(sum(by_position) - seen.accepted) > 1e-6:
            fail(impl, PROP, CHECK, case,
                 f"the engine's accepted tokens by position {list(by_position)} add up to "
                 f"{sum(by_position):g}, its accepted total is {seen.accepted:g}")

    # ---- accepted: the exact law of the total (and by position), per convention
    contexts = [ctx for r in rounds for ctx, _ in r]
    sizes = [m for r in rounds for _, m in r]
    results, lines = {}, []
    named = "" if declared == "token-wise" else f", {declared} verification"
    for convention in proposals:
        laws = _round_laws(impl, case, contexts, sizes, convention, declared)
        ok, text, p_total, mean = _judge(laws, seen.accepted, by_position, drafted)
        results[convention] = (ok, p_total, mean)
        lines.append(f"{convention} proposals{named}: {text}")
    fitted = tuple(c for c in proposals if results[c][0])
    verdict = Verdict(fitted, schedule, len(done), seen.drafted, seen.accepted,
                      {c: results[c][2] for c in proposals},
                      {c: results[c][1] for c in proposals}, power, declared, rule_power)
    if not fitted and declared != "token-wise":
        # the declared rule's law does not fit: does token-wise verification's, of the declared
        # proposals or of the other convention? (a rule claimed but not run: vllm-ascend
        # #7807; vLLM 0.32's V1 runner drafts argmax tokens unless rejection_sample_method is
        # "standard", so "block" with "probabilistic" drafting runs neither)
        others = list(proposals) + [c for c in exact.PROPOSALS if c not in proposals]
        for convention in others:
            laws = _round_laws(impl, case, contexts, sizes, convention, "token-wise")
            ok, text, _, _ = _judge(laws, seen.accepted, by_position, drafted)
            if not ok:
                continue
            power_line = (f"; token-wise verification in place of {declared} is detected with "
                          f"power {rule_power[convention]:.4f} at these samples"
                          if convention in rule_power else "")
            fail(impl, PROP, CHECK, case,
                 f"the engine accepts drafted tokens as token-wise verification of "
                 f"{convention} proposals does, not as the {declared} verification its method "
                 f"declares ({'/'.join(proposals)} proposals): rate "
                 f"{seen.accepted / max(seen.drafted, 1):.3f} per drafted token, for {where}, "
                 f"{seen.drafted:g} drafted:\n" + "\n".join(lines) +
                 f"\n{convention} proposals, token-wise verification: {text}"
                 f"\n(false-alarm rate <= {statistics.ALPHA:.0e}{power_line})")
    if not fitted:
        # the failure's pattern on its cause line: which way and how far the rate is off
        means = [results[c][2] for c in proposals]
        way = ("fewer" if all(seen.accepted < m for m in means) else
               "more" if all(seen.accepted > m for m in means) else "other")
        rates = ", ".join(f"{m / max(seen.drafted, 1):.3f} ({c})"
                          for c, m in zip(proposals, means))
        fail(impl, PROP, CHECK, case,
             f"the engine accepts {way} drafted tokens than the exact expectation of its draft "
             f"({impl.method.drafter.describe()}{named}): rate {seen.accepted / max(seen.drafted, 1):.3f} per drafted "
             f"token against {rates}, for {where}, {seen.drafted:g} drafted:\n"
             + "\n".join(lines) +
             f"\n(false-alarm rate <= {statistics.ALPHA:.0e}; an acceptance rate per drafted "
             f"token off by {DELTA_ACCEPTANCE} is detected with power {power:.4f}, planned "
             f"from the exact variances, {v:.4g} per round)")
    return verdict


def _round_laws(impl, case, contexts, sizes, convention: str, rule: str) -> list:
    """The exact law of each round's accepted count (rounds of several sizes), under one
    proposal convention and verification rule."""
    laws = [None] * len(contexts)
    for m in set(sizes):
        idx = [i for i, s in enumerate(sizes) if s == m]
        for i, law in zip(idx, exact.cached_round_laws([contexts[i] for i in idx], m,
                                                       methods.exact_draft(impl.method.drafter),
                                                       case.sampling, convention, rule)):
            laws[i] = law
    return laws


def _judge(laws, accepted: float, by_position, drafted: int):
    """(passed, description, p of the total, expected total) of one convention."""
    mean = sum(r.mean for r in laws)
    sd = sum(r.var for r in laws) ** 0.5
    p_total = exact.two_sided_p(exact.sum_law([r.law() for r in laws]), accepted)
    z = (accepted - mean) / sd if sd > 0 else (0.0 if accepted == mean else float("inf"))
    rate = f"{accepted / drafted:.4f} vs {mean / drafted:.4f}" if drafted else "n/a"
    text = (f"accepted {accepted:g}, expected {mean:.1f} +- {sd:.1f} (z = {z:+.2f}, exact "
            f"p = {p_total:.3g} at level {statistics.ALPHA / 2:.0e}); rate per drafted token "
            f"{rate}")
    ok = p_total >= statistics.ALPHA / 2
    if by_position is not None:
        depth = max((r.drafted for r in laws), default=0)
        level = statistics.ALPHA / (2 * max(1, len(by_position), depth))
        cells = []
        for i in range(max(depth, len(by_position))):
            reach = [r.reach[i] for r in laws if r.drafted > i]
            law = exact.sum_law([np.array([1 - q, q]) for q in reach])
            got = by_position[i] if i < len(by_position) else 0.0
            p = exact.two_sided_p(law, got)
            ok = ok and p >= level
            cells.append(f"{i + 1}: {got:g} vs {sum(reach):.1f} (p = {p:.2g})")
        text += f"\n  by position (level {level:.0e} each): " + "; ".join(cells)
    return ok, text, p_total, mean
