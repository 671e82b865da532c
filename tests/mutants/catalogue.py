"""Deliberately broken speculative decoders, each one realistic mistake away from correct.

Every class below subclasses `tests.mutants.engine.Speculator` and overrides ONE hook. Its
docstring says what the bug is and why it breaks losslessness; its `caught_by` attribute names
the one property family of the kit that must fail on it (other families may fail too):

    "rule"           accept_or_correct: committed token not distributed as p, acceptance
                     probability != sum(min(p, q)), wrong residual, token outside p's support
    "greedy"         greedy output != the target's own greedy output
    "sequence"       sampled joint distribution of the first L tokens != the target's ancestral
                     sampling (with the same temperature, top-k, top-p)
    "cache"          at the top of some round a cache does not hold exactly the committed
                     sequence minus its newest token (seen by instrumented caches even where
                     the output is still right)
    "perfect_draft"  with draft = target, a round other than the last yields fewer than k+1
                     tokens, or the reported acceptance rate is not 1
    "bounds"         more than max_new_tokens, output not ending at the first stop id, or stats
                     inconsistent with the output

`detected_when` says which inputs expose the bug (a property that never draws such inputs
cannot catch it), e.g. the temperature-on-one-side bug is invisible at temperature 1.

Exports:
    MUTANTS      every broken class, in catalogue order
    CORRECT      [Speculator]: correct engines as classes (instantiate with no arguments)
    CORRECT_MODULES  [tests.mutants.independent]: correct engines as plain modules
    correct_implementations()  instances / modules exposing the API, all correct
    FAMILIES     the family names above
"""

from __future__ import annotations

import torch

from reference.sampling import probs_from_logits
from tests.mutants import independent
from tests.mutants.engine import Speculator

FAMILIES = ("rule", "greedy", "sequence", "cache", "perfect_draft", "bounds")


# ============================================================== rule: accept_or_correct
class InvertedRatio(Speculator):
    """Acceptance probability min(1, q/p) instead of min(1, p/q).

    The fraction is written upside down. Tokens the draft over-proposes are now accepted
    more, under-proposed ones less, and a token with p = 0 is always accepted (q/0 = inf), so
    the committed token can even fall outside p's support.
    """

    caught_by = "rule"
    detected_when = "p != q"

    def acceptance_ratio(self, p, q, token):
        return (q[token].double() / p[token].double()).clamp(max=1.0)


class FlippedComparison(Speculator):
    """Accepts when u >= ratio, so the acceptance probability is 1 - ratio.

    A comparison written the wrong way round (`if u > ratio: reject` turned into an accept
    branch). A token that should always be accepted (p >= q) is always rejected, and a token
    p gives no mass to is always accepted.
    """

    caught_by = "rule"
    detected_when = "p != q, or any ratio below 1"

    def accepts(self, u, ratio):
        return bool(u >= ratio)


class ResampleFromTarget(Speculator):
    """On rejection, draws the replacement from p instead of the residual max(p - q, 0).

    An intuitive shortcut ("when the draft is wrong, just sample the target"), but the
    accepted path already contributed min(p, q): tokens the draft proposes often end up with
    more than p's mass, P(y) = min(p, q)(y) + (1 - sum min(p, q)) p(y) != p(y).
    """

    caught_by = "rule"
    detected_when = "p != q"

    def residual(self, p, q):
        return p


class ResidualReversed(Speculator):
    """The residual is max(q - p, 0) instead of max(p - q, 0).

    Subtraction in the wrong order: rejections are redistributed onto exactly the tokens the
    draft over-proposed (q > p), which already got too much mass, instead of the ones the
    target wants more of.
    """

    caught_by = "rule"
    detected_when = "p != q"

    def residual(self, p, q):
        leftover = (q - p).clamp_min(0)
        return p if leftover.sum() <= 0 else leftover


class UnnormalizedInverseCdf(Speculator):
    """Inverse-CDF draw over the raw residual, without dividing by its sum.

    A hand-written sampler compares a fresh uniform u with the cumulative sum of
    max(p - q, 0), which ends at sum(max(p - q, 0)) < 1. Every u past that total runs off the
    end and is clamped to the last index, which absorbs the missing mass: the last token of
    the vocabulary is committed far too often, even where p gives it nothing.
    """

    caught_by = "rule"
    detected_when = "a rejection is possible (p != q)"

    def draw(self, weights, u, generator):
        cdf = weights.double().cumsum(0)
        v = torch.rand((), generator=generator, dtype=torch.float64, device=cdf.device)
        index = int(torch.searchsorted(cdf, v.reshape(1), right=True))
        return min(index, weights.shape[0] - 1)


class ReusedUniform(Speculator):
    """The accept test's uniform u is reused for the residual draw.

    Saving a random number: `if u < ratio: accept; else: inverse-CDF(residual, u)`. But on
    the rejection branch u is conditioned to lie in [ratio, 1), so the draw only reaches the
    upper part of the residual's CDF: tokens with low indices are under-drawn whenever the
    residual has more than one token and the ratio is above 0.
    """

    caught_by = "rule"
    detected_when = "the residual has two or more tokens and the rejected token has p > 0"

    def draw(self, weights, u, generator):
        cdf = (weights.double() / weights.double().sum()).cumsum(0)
        index = int(torch.searchsorted(cdf, u.reshape(1).double(), right=True))
        return min(index, weights.shape[0] - 1)


class DraftProbabilityFloor(Speculator):
    """q is clamped to a floor of 1e-3 "to avoid dividing by zero".

    The guard is applied to the whole q, so it also enters the residual: every token with
    p < 1e-3 where the draft gave (nearly) nothing loses its residual mass max(p - 1e-3, 0) = 0.
    With a large vocabulary or a top-k/top-p draft, the target's long tail is never committed,
    and the ratio of rarely proposed tokens is too small.
    """

    caught_by = "rule"
    detected_when = "p has mass below 1e-3 on tokens where q is below p (tiny masses, sparse q)"

    def rule_q(self, q):
        return q.clamp_min(1e-3)


# ============================================================== sequence: sampling engine
class DraftQWithoutTemperature(Speculator):
    """The draft samples at temperature T but reports q = softmax(logits) at temperature 1.

    The temperature is applied on one side only: the proposal was drawn from q_T, the rule is
    told q_1. The acceptance ratio and the residual then correct for the wrong distribution,
    and the committed tokens are not distributed as p.
    """

    caught_by = "sequence"
    detected_when = "temperature != 1"

    def reported_q(self, q, logits, s):
        return probs_from_logits(logits, 1.0, s.top_k, s.top_p)


class DraftQWithoutTopK(Speculator):
    """The draft samples from its top-k filtered distribution but reports q without top-k.

    The verifier recomputes q from the draft's logits with the temperature only, forgetting
    the filter the draft sampled with. On the kept tokens the reported q is smaller than the
    true one, so they are accepted too often and the residual is wrong.
    """

    caught_by = "sequence"
    detected_when = "top_k > 0 and smaller than the vocabulary"

    def reported_q(self, q, logits, s):
        return probs_from_logits(logits, s.temperature, 0, s.top_p)


class GreedyDraftReportsSoftmax(Speculator):
    """The draft proposes its argmax even when sampling, but reports its softmax as q.

    A "cheaper, more accepted" draft: proposals are deterministic, yet the rule is told they
    were drawn from q. The proof that the output is distributed as p needs x ~ q; with x the
    argmax fixed, y is committed with probability [y = x] a + (1 - a) r(y), a = min(1, p(x)/q(x)),
    r the residual, which is not p(y).
    """

    caught_by = "sequence"
    detected_when = "any temperature > 0"

    def draft_pick(self, q, generator):
        return int(torch.argmax(q))


class TargetWithoutTemperature(Speculator):
    """The target's p is softmax(logits) without the temperature.

    The target side of the rule forgets to divide by T (and its bonus token too): the output
    is the target's temperature-1 distribution, not the one the user asked for.
    """

    caught_by = "sequence"
    detected_when = "temperature != 1"

    def target_p(self, row, s):
        return probs_from_logits(row, 1.0, s.top_k, s.top_p)


class TargetWithoutTopP(Speculator):
    """The target's p is not restricted to the top-p nucleus.

    The draft filters with top-p, the verifier does not: tokens outside the target's nucleus
    can still be committed (from the residual and the bonus token), so the output is not the
    target's top-p sampling.
    """

    caught_by = "sequence"
    detected_when = "top_p < 1 with a nucleus smaller than the support"

    def target_p(self, row, s):
        return probs_from_logits(row, s.temperature, s.top_k, 1.0)


class GreedyBonusUnderSampling(Speculator):
    """The bonus token after a fully accepted block is the target's argmax, even when sampling.

    The bonus branch was copied from the greedy path. Whenever all k proposals are accepted,
    the (k+1)-th token is deterministic instead of a draw from p.
    """

    caught_by = "sequence"
    detected_when = "temperature > 0 and a round accepts all k proposals (k = 1 makes it common)"

    def bonus_token(self, row, s, generator):
        return int(torch.argmax(row))


class WrongPositionQ(Speculator):
    """Proposal i is verified against q_dists[i - 1], the draft distribution of the previous step.

    An off-by-one in indexing the saved draft distributions (for i = 0, Python's [-1] silently
    picks the last one). The ratio and the residual use a distribution the proposal was not
    drawn from.
    """

    caught_by = "sequence"
    detected_when = "temperature > 0 and k >= 2 (with k = 1, q_dists[-1] is q_dists[0])"

    def q_at(self, qs, i):
        return qs[i - 1]


# ============================================================== greedy
class VerifyOffByOne(Speculator):
    """Proposal i is compared with the target's prediction at row i + 1 instead of row i.

    Row i of the target's logits predicts the token after input i, i.e. the token proposal i
    must match. Using row i + 1 checks d_i against the target's choice after d_i.
    """

    caught_by = "greedy"
    detected_when = "always (both greedy and sampling)"

    def verify_row(self, logits, i):
        return logits[i + 1]


class BonusWrongPosition(Speculator):
    """The bonus token is read from row k - 1 instead of row k.

    Row k - 1 predicts d_k, which was just accepted, so the bonus repeats d_k instead of
    predicting the token after it.
    """

    caught_by = "greedy"
    detected_when = "some round accepts all k proposals (perfect or early-exit draft)"

    def bonus_row(self, logits, k):
        return logits[k - 1]


class CommitsRejectedProposal(Speculator):
    """On a greedy mismatch, the draft's proposal is committed instead of the target's token.

    `new_tokens.append(proposal)` written before the mismatch test: the round ends at the
    right place but its last token is the draft's wrong guess.
    """

    caught_by = "greedy"
    detected_when = "a proposal is rejected (any imperfect draft)"

    def greedy_check(self, row, proposal):
        best = int(torch.argmax(row))
        return proposal, best == proposal


class TinyTemperatureGreedy(Speculator):
    """Temperature 0 is run as sampling at temperature 1e-5, with the sampling rule.

    "Greedy is the zero-temperature limit", so temperature 0 is replaced by a tiny one to
    share one code path. It is argmax except near ties: with a top-two logit gap of 1e-5 the
    second token has probability 1 / (1 + e) ~ 0.27 at every such position (and the exact
    argmax rule, lowest index on a tie, is lost). The float64 kit models almost never have
    such gaps by chance, so only properties that build near-ties on purpose see it.
    """

    caught_by = "greedy"
    detected_when = "a top-two logit gap within a few multiples of 1e-5 (near-ties)"
    tiny_temperature = 1e-5

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0,
                             top_p=1.0):
        if temperature == 0:
            temperature = self.tiny_temperature
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k=k,
                                            temperature=temperature, stop_ids=stop_ids,
                                            generator=generator, top_k=top_k, top_p=top_p)


# ============================================================== perfect_draft
class MissingBonus(Speculator):
    """No bonus token when all k proposals are accepted.

    The output is still the target's greedy output (the caches are rolled back consistently),
    but a fully accepted round yields k tokens instead of k + 1: a free token per round is
    thrown away, which is the main win of a good draft.
    """

    caught_by = "perfect_draft"
    detected_when = "draft = target (any round accepting all k proposals)"

    def finish_block(self, new_tokens, logits, k, s, generator):
        pass


class AcceptanceOverKPlusOne(Speculator):
    """acceptance_rate divides the accepted proposals by k + 1 per round instead of k.

    The bonus token is counted as a proposal. The output is right, but a perfect draft reports
    k / (k + 1) instead of 1.
    """

    caught_by = "perfect_draft"
    detected_when = "always (the reported rate is wrong for every run with rounds > 0)"

    def stats(self, output, rounds, accepted_total, proposed_total):
        stats = super().stats(output, rounds, accepted_total, proposed_total)
        if rounds:
            stats["acceptance_rate"] = accepted_total / (proposed_total + rounds)
        return stats


# ============================================================== cache
class TargetCacheOneShort(Speculator):
    """The target cache is truncated to base + accepted, forgetting that `last` was written too.

    Every round drops one committed token from the target's cache; the target then verifies
    against a context with a hole in it.
    """

    caught_by = "cache"
    detected_when = "always (from the second round on)"

    def rollback_target(self, t_cache, base, accepted, new_tokens):
        t_cache.truncate(base + len(new_tokens) - 1)


class TargetCacheOneLong(Speculator):
    """The target cache keeps one entry too many after a rejection.

    Truncating to base + accepted + 2 ("accepted tokens, last, and the correction"), clamped to
    the cache's length: after a rejection the rejected proposal's keys and values stay in the
    cache and every later position attends to them.
    """

    caught_by = "cache"
    detected_when = "a proposal is rejected"

    def rollback_target(self, t_cache, base, accepted, new_tokens):
        t_cache.truncate(min(t_cache.length, base + len(new_tokens) + 1))


class TargetCacheNotTruncated(Speculator):
    """The target cache is never rolled back.

    The keys and values of all rejected proposals stay in the cache, so the context the target
    sees grows by k + 1 entries per round whatever was accepted (and the cache eventually
    overflows its capacity).
    """

    caught_by = "cache"
    detected_when = "a proposal is rejected"

    def rollback_target(self, t_cache, base, accepted, new_tokens):
        pass


class DraftCacheNotRolledBack(Speculator):
    """The draft cache is never truncated (only the target's is).

    The target decides every token, so the output is still correct: the bug only costs
    acceptance, which makes it easy to miss. The draft's context is full of rejected
    proposals (and its cache may overflow on a long run).
    """

    caught_by = "cache"
    detected_when = "a proposal is rejected"

    def rollback_draft(self, draft, d_cache, base, accepted, new_tokens, proposals, device):
        if accepted == len(proposals):
            draft(torch.tensor([[proposals[-1]]], dtype=torch.long, device=device), d_cache)


class DraftNotFedLastProposal(Speculator):
    """After a fully accepted round, the draft is never fed its own last proposal.

    The chapter's edge case: the draft wrote last, d1..d(k-1) but not d_k, and "nothing was
    rejected, so nothing to roll back" skips the catch-up. The draft's cache misses d_k from
    then on. The output is still correct (the target decides), only acceptance suffers.
    """

    caught_by = "cache"
    detected_when = "some round accepts all k proposals"

    def rollback_draft(self, draft, d_cache, base, accepted, new_tokens, proposals, device):
        if accepted < len(proposals):
            d_cache.truncate(base + len(new_tokens))


class DraftCacheOneShort(Speculator):
    """The draft cache is truncated one entry short, to base + accepted.

    The draft's rollback forgets `last`, like the target's one-short bug but on the draft side:
    the output stays correct, and only the instrumented cache sees the hole.
    """

    caught_by = "cache"
    detected_when = "always (from the second round on)"

    def rollback_draft(self, draft, d_cache, base, accepted, new_tokens, proposals, device):
        keep = base + len(new_tokens) - 1
        d_cache.truncate(min(keep, d_cache.length))


# ============================================================== bounds
class StopOnlyAtBlockEnd(Speculator):
    """A stop id is only noticed when it is the last token of a round's block.

    The whole accepted block is appended and only output[-1] is tested. A stop id accepted in
    the middle of a block is ignored, and generation runs past it.
    """

    caught_by = "bounds"
    detected_when = "a stop id occurs inside an accepted block"

    def commit(self, output, new_tokens, max_new_tokens, stops):
        for token in new_tokens:
            output.append(token)
            if len(output) == max_new_tokens:
                return True
        return output[-1] in stops


class WholeBlockOvershoot(Speculator):
    """The whole block is appended before the length limit is tested.

    `output += new_tokens; if len(output) >= max_new_tokens: break`: the last round can add
    up to k tokens too many.
    """

    caught_by = "bounds"
    detected_when = "the last round's block crosses max_new_tokens"

    def commit(self, output, new_tokens, max_new_tokens, stops):
        for token in new_tokens:
            output.append(token)
            if token in stops:
                return True
        return len(output) >= max_new_tokens


class PrefillCountedAsRound(Speculator):
    """tokens_per_target_call divides by rounds + 1, counting the prefill as a target call.

    The stats no longer satisfy tokens_per_target_call == len(tokens) / rounds.
    """

    caught_by = "bounds"
    detected_when = "always (rounds > 0)"

    def stats(self, output, rounds, accepted_total, proposed_total):
        stats = super().stats(output, rounds, accepted_total, proposed_total)
        if rounds:
            stats["tokens_per_target_call"] = len(output) / (rounds + 1)
        return stats


class StopOrderDependent(Speculator):
    """The block is cut at the first stop id *in the order stop_ids lists them* that occurs in
    it, not at the earliest position holding any stop id.

    `for s in stop_ids: if s in block: block = block[:block.index(s) + 1]; break`: with two
    stop ids in one accepted block, listed in the other order than they occur, the output goes
    on past the first one. Correct for a single stop id, and for some orders of several.
    """

    caught_by = "bounds"
    detected_when = "two stop ids in one accepted block, listed in the other order"

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, **kw):
        self._order = tuple(int(s) for s in stop_ids)   # the commit hook gets a set
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k,
                                            temperature, stop_ids, generator, **kw)

    def commit(self, output, new_tokens, max_new_tokens, stops):
        block = list(new_tokens)
        for s in self._order:
            if s in block:
                block = block[:block.index(s) + 1]
                break
        for token in block:
            output.append(token)
            if len(output) == max_new_tokens:
                return True
        return len(block) < len(new_tokens) or block[-1] in stops


MUTANTS = [
    # rule
    InvertedRatio, FlippedComparison, ResampleFromTarget, ResidualReversed,
    UnnormalizedInverseCdf, ReusedUniform, DraftProbabilityFloor,
    # sequence
    DraftQWithoutTemperature, DraftQWithoutTopK, GreedyDraftReportsSoftmax,
    TargetWithoutTemperature, TargetWithoutTopP, GreedyBonusUnderSampling, WrongPositionQ,
    # greedy
    VerifyOffByOne, BonusWrongPosition, CommitsRejectedProposal, TinyTemperatureGreedy,
    # perfect_draft
    MissingBonus, AcceptanceOverKPlusOne,
    # cache
    TargetCacheOneShort, TargetCacheOneLong, TargetCacheNotTruncated,
    DraftCacheNotRolledBack, DraftNotFedLastProposal, DraftCacheOneShort,
    # bounds
    StopOnlyAtBlockEnd, WholeBlockOvershoot, PrefillCountedAsRound, StopOrderDependent,
]

CORRECT = [Speculator]
CORRECT_MODULES = [independent]


def correct_implementations():
    """Every correct engine as an object exposing accept_or_correct and speculative_generate."""
    return [cls() for cls in CORRECT] + list(CORRECT_MODULES)


for _cls in MUTANTS:
    assert _cls.caught_by in FAMILIES, _cls
    assert _cls.__doc__, _cls
del _cls

__all__ = ["FAMILIES", "MUTANTS", "CORRECT", "CORRECT_MODULES", "correct_implementations",
           *(cls.__name__ for cls in MUTANTS)]
