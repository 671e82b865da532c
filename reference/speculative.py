"""Speculative decoding, written to be obviously right rather than fast.

A round proposes k tokens cheaply, verifies them with one target forward, commits an accepted
prefix plus one token of the target's own, and adapts k. What makes that lossless:

* The invariant: at the top of every round both caches hold every committed token (prompt +
  output) except the newest one, which has been chosen but not yet fed to either model. So the
  target's forward over [newest] + proposals gives, at row i, its next-token logits after the
  committed sequence and the first i proposals, exactly what decoding without a draft would
  compute there; the round's commit truncates both caches back to the invariant.
* The rule (`accept_or_correct`): a committed token is distributed exactly as the target's p,
  whatever the draft's q, provided the proposal was drawn from q independently of the verdict.
  Greedy, acceptance means "equals the target's argmax". Either way every committed token
  follows the target's law given what precedes it, so the output is the target's own.
  verification="block" judges a round's proposals jointly instead (block.py, Sun et al. 2024):
  as lossless, and never fewer tokens accepted in expectation.
"""

import torch

from reference.adaptive_k import AdaptiveK, FixedK, useful_k
from reference.adaptive_k import expected_speedup, expected_tokens_per_round  # noqa: F401 (API)
from reference.block import block_accept, verify_block  # noqa: F401 (API)
from reference.committed import Committed
from reference.heads import is_head
from reference.heads.proposer import head_proposer
from reference.hidden import forward_hidden
from reference.inputs import (check_generate_args, check_k, check_same_vocabulary, device_of,
                              vocab_size)
from reference.proposers import DraftProposer, PromptLookup, PromptLookupProposer
from reference.sampling import (Sampler, SamplingParams, check_distribution, check_sampling_args,
                                greedy_token)
from reference.tree import CHAPTER_TREE
from reference.dynamic_tree import dynamic_tree_generate
from reference.tree import tree_generate as fixed_tree_generate


VERIFICATIONS = ("token-wise", "block")


@torch.inference_mode()
def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0, adaptive=False,
                         draft_cost=0.05, tree=False, verification="token-wise"):
    """Generate with a draft; the output is exactly what the target alone would produce
    (token for token when greedy, in distribution when sampling). Returns (tokens, stats).

    draft: a model sharing the target's vocabulary, a PromptLookup, or a feature-level head
        (reference.heads: EAGLE, EAGLE-3, Medusa, MTP), fed the target's verified hidden states.
    adaptive: treat k as the largest k, choose each round's k by expected speedup.
    tree: tree verification instead of a chain (see tree.py; greedy, or exact sampling at a
        temperature): True for the chapter's 2 children at 3 depths, or the branching factor
        per depth, e.g. (3, 2, 1); k is then unused.
    verification: "token-wise" (accept_or_correct at each position, up to the first rejection)
        or "block" (block.py: the round's proposals judged jointly, Sun et al. 2024); both
        are lossless, and block accepts at least as many tokens in expectation.
    """
    ids, stop = check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)
    check_k(k)
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification={verification!r}: choose from {VERIFICATIONS}")
    if tree and verification != "token-wise":
        raise ValueError(f"tree={tree!r} verifies a tree of its own; verification="
                         f"{verification!r} is a rule for a chain: leave it 'token-wise'")
    lookup, head = isinstance(draft, PromptLookup), is_head(draft)
    if not lookup:
        check_same_vocabulary(draft, target)
    if tree and head and not is_grown(tree):
        raise ValueError(f"tree={tree!r} needs a model draft; a {type(draft).__name__} drafts "
                         f"a chain or a dynamic tree (tree='dynamic' or a DynamicTree)")
    if tree:
        return _hand_off_to_tree(target, draft, ids, max_new_tokens, stop, tree, adaptive,
                                 temperature, top_k, top_p, generator)
    device = device_of(target)
    ids = ids.to(device)
    sampler = Sampler(SamplingParams(temperature, top_k, top_p), generator)
    # Room for the prompt, every output token and one round's overshoot of k + 1 entries.
    capacity = ids.numel() + max_new_tokens + useful_k(k, max_new_tokens) + 1
    t_cache = target.new_cache(1, capacity)
    proposer = (PromptLookupProposer(draft, vocab_size(target), device) if lookup
                else head_proposer(draft, capacity, sampler, device) if head
                else DraftProposer(draft, capacity, sampler, device))
    run_target = _target_forward(target, t_cache, proposer)
    k_policy = AdaptiveK(k, draft_cost) if adaptive else FixedK(k)
    if ids.numel() > 1:  # the invariant from the start: all of the prompt but its last token
        run_target(ids[None, :-1])
        proposer.prefill(ids)
    seq = Committed(ids.tolist(), max_new_tokens, stop)
    rule = verify if verification == "token-wise" else verify_block

    while not seq.done:
        base = t_cache.length
        proposals, q = proposer.propose(seq.context, k_policy.next_k(seq.remaining))
        # One target forward over the newest token and the proposals: by the invariant, row i
        # is the target's next-token logits after the committed sequence and i proposals.
        block = torch.tensor([[seq.context[-1]] + proposals], device=device)
        new_tokens, accepted = rule(run_target(block), proposals, q, sampler)
        # Commit: the target wrote the newest token and every proposal; keeping the newest and
        # the accepted ones restores the invariant (the proposer does the same for the draft).
        t_cache.truncate(base + accepted + 1)
        proposer.commit(accepted, proposals)
        seq.add(new_tokens, accepted, len(proposals))
        k_policy.update(accepted, len(proposals))
    return seq.output, seq.stats()


def _target_forward(target, cache, proposer):
    """ids [1, T] -> the target's logits [T, V], written to `cache`. A head's proposer (one that
    names the hidden states it reads, `proposer.hidden`) is handed the same forward's hidden
    states, [T, width], so that it drafts from what the target itself computed; every other
    proposer gets the plain forward."""
    hidden = getattr(proposer, "hidden", None)
    if hidden is None:
        return lambda ids: target(ids, cache)[0]

    def forward(ids):
        logits, features = forward_hidden(target, ids, cache, hidden)
        proposer.saw(features[0])
        return logits[0]
    return forward


def verify(target_logits, proposals, q, sampler):
    """Accept a prefix of the proposals, then add one token of the target's own: the correction
    at the first rejection, or the bonus after the last proposal. -> (new tokens, accepted).

    target_logits [len(proposals) + 1, V]: row i follows the committed sequence and the first
    i proposals. Sampling, accept_or_correct commits a token distributed exactly as row i's p
    only if proposals[i] was drawn from q[i] (the proposer's promise) with a fresh uniform for
    the test; greedy, it commits row i's argmax either way. The round stops at the first
    rejection because the later rows assumed a token that was not committed.
    """
    new_tokens = []
    for i, proposal in enumerate(proposals):
        if sampler.greedy:
            token = int(greedy_token(target_logits[i]))
            ok = token == proposal
        else:
            token, ok = accept_or_correct(sampler.probs(target_logits[i]), q[i], proposal,
                                          sampler.generator)
        new_tokens.append(token)
        if not ok:
            return new_tokens, i
    # Every proposal accepted: the target's distribution after the last one is free.
    return new_tokens + [sampler.choose(target_logits[len(proposals)])], len(proposals)


def accept_or_correct(p, q, token, generator=None):
    """One verification step for draft token `token`, which was drawn from q.

    Accept with probability min(1, p[token] / q[token]); otherwise draw from the residual
    max(p - q, 0) / sum(max(p - q, 0)). Returns (token, accepted). The committed token is
    distributed exactly as p: acceptance contributes min(p, q) at every token, rejection
    (probability sum(max(p - q, 0))) contributes max(p - q, 0), and the two add up to p.
    """
    check_distribution(p, "p")
    check_distribution(q, "q")
    if p.shape != q.shape or p.dim() != 1:
        raise ValueError(f"p and q must be 1-D over the same vocabulary, got {tuple(p.shape)} "
                         f"and {tuple(q.shape)}")
    token = int(token)
    if not 0 <= token < p.shape[0]:
        raise ValueError(f"token {token} is outside the vocabulary [0, {p.shape[0]})")
    if q[token] <= 0:
        raise ValueError(f"token {token} has probability 0 under q, so it cannot have been drawn from q")
    p, q = p.double(), q.double()
    # u is uniform on [0, 1), so P(u < ratio) = ratio exactly.
    u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
    if u < p[token] / q[token]:
        return token, True
    residual = (p - q).clamp_min(0)
    # Rejection is only possible where p < q somewhere, which forces residual mass elsewhere;
    # an all-zero residual can only come from rounding when p == q, and then p is the answer.
    if residual.sum() <= 0:
        residual = p
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False


# --- tree verification (tree.py) -------------------------------------------------------------

def is_grown(tree) -> bool:
    """A tree grown per round ("dynamic" or a DynamicTree) rather than a fixed shape."""
    return (isinstance(tree, str) and tree == "dynamic") or hasattr(tree, "budget")


def _tree_generate(target, draft, ids, max_new_tokens, stop, tree, *sampling):
    """A tree of a fixed shape (reference/tree.py), or one grown every round where the draft is
    confident ("dynamic" or a DynamicTree: reference/dynamic_tree.py)."""
    run = dynamic_tree_generate if is_grown(tree) else fixed_tree_generate
    return run(target, draft, ids, max_new_tokens, stop, tree, *sampling)


def _hand_off_to_tree(target, draft, ids, max_new_tokens, stop, tree, adaptive, temperature,
                      top_k, top_p, generator):
    if adaptive or isinstance(draft, PromptLookup):
        raise ValueError("tree=True is tree verification with a model draft: it needs "
                         f"adaptive=False and a model draft, got adaptive={adaptive}, "
                         f"draft={type(draft).__name__}")
    branching = CHAPTER_TREE if tree is True else tree
    return _tree_generate(target, draft, ids.to(device_of(target)), max_new_tokens, stop,
                          branching, temperature, top_k, top_p, generator)


@torch.inference_mode()
def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=CHAPTER_TREE, stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0):
    """Tree speculation (see tree.py), the kit's tree level: (tokens, stats).

    tree[d] is the number of children of every node at depth d. At temperature 0 the children
    are the draft's top tokens and the output is the target's greedy continuation; above it the
    children are i.i.d. draws from the draft and the output is distributed exactly as the
    target's sampling (temperature, top_k, top_p as in the chain).
    """
    ids, stop = check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)
    if isinstance(draft, PromptLookup) or (is_head(draft) and not is_grown(tree)):
        raise ValueError(f"tree_generate needs a model draft (it ranks and samples the draft's "
                         f"distributions), or a chained head with a dynamic tree, got a "
                         f"{type(draft).__name__} with tree={tree!r}")
    check_same_vocabulary(draft, target)
    return _tree_generate(target, draft, ids.to(device_of(target)), max_new_tokens, stop, tree,
                          temperature, top_k, top_p, generator)


# --- target-only decoding: what speculation must reproduce -----------------------------------

@torch.inference_mode()
def greedy_generate(target, prompt_ids, max_new_tokens, stop_ids=()):
    """Plain greedy decoding of the target, one token per forward."""
    ids, stop = check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    return _generate(target, ids.to(device_of(target)), max_new_tokens, stop, greedy_token)


@torch.inference_mode()
def sample_generate(target, prompt_ids, max_new_tokens, temperature=1.0, stop_ids=(),
                    generator=None, *, top_k=0, top_p=1.0):
    """Plain ancestral sampling from the target (temperature 0 is greedy)."""
    ids, stop = check_generate_args(target, prompt_ids, max_new_tokens, stop_ids)
    check_sampling_args(temperature, top_k, top_p)
    choose = Sampler(SamplingParams(temperature, top_k, top_p), generator).choose
    return _generate(target, ids.to(device_of(target)), max_new_tokens, stop, choose)


def _generate(target, ids, max_new_tokens, stop, choose):
    cache = target.new_cache(1, ids.numel() + max_new_tokens)
    output, feed = [], ids.view(1, -1)
    while len(output) < max_new_tokens:
        token = int(choose(target(feed, cache)[0, -1]))
        output.append(token)
        if token in stop:
            break
        feed = torch.tensor([[token]], device=ids.device)
    return output
