"""Family "tree": tree verification, greedy and sampled (level "tree").

    tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0)

tree[d] is the number of children under every node at depth d; or a dynamic tree
(reference.dynamic_tree.DynamicTree(depth, topk, budget): a shape grown per round from the
draft's confidence, EAGLE-2 style), judged by the same properties. The properties:

* greedy: the output equals the target's greedy continuation and the chain's
  (speculative_generate, when the implementation has it), for several tree shapes;
* sampling: with a temperature (and top-k / top-p where named), the joint law of the first L
  tokens equals the target's ancestral sampling: a chi-square test against
  properties.oracle.sequence_law at alpha = ALPHA (2e-6), sized by the power calculation to
  detect total variation >= DELTA_TREE (0.05; DELTA_TREE_THOROUGH, 0.02, in the thorough
  profile) with power POWER (0.99): the sibling and node mix-ups of tests/mutants/tree.py move
  the law by 0.03-0.06;
* cache: at every model call, the entries the cache holds below the current round (the
  committed sequence except its newest token) have exactly the keys and values of a fresh
  prefill of the committed sequence: right tokens, right positions, moved from the right path;
* bounds: never more than max_new_tokens, a stop id ends the output where it first occurs
  (also in the middle of an accepted path), stats consistent with the output.

All of them run on qwen3 kit models (tree masks need a transformer).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from properties import oracle, profiles
from properties.cases import TreeCase
from properties.guards import EngineFault
from properties.harness import (fail, first_difference, invoke, law_mismatch, seed_everything,
                                stat_in_range, stats_value, tokens_and_stats, TOO_LONG,
                                too_long)
from properties.models import (Qwen3KitModel, Trace, TracedKVCache, build_pair,
                               qwen3_draft_module, qwen3_module)
from properties.statistics import DELTA_TREE, DELTA_TREE_THOROUGH, chi_square_gof, plan
from reference.cache import KVCache
from reference.dynamic_tree import DynamicTree

CHECK_GREEDY = "properties.checks.tree:check_tree_greedy"
CHECK_SAMPLING = "properties.checks.tree:check_tree_sampling"
CHECK_CACHE = "properties.checks.tree:check_tree_cache"
CHECK_BOUNDS = "properties.checks.tree:check_tree_bounds"

# Float64 keys/values of the same tokens at the same positions agree to ~1e-13.
KV_TOLERANCE = 1e-7


def tree_arg(tree):
    """The tree= argument: a DynamicTree as it is, a fixed shape as a tuple."""
    return tree if isinstance(tree, DynamicTree) else tuple(tree)


def tree_depth(tree) -> int:
    """The most levels a round's tree has (a dynamic tree's depth; a fixed shape's length)."""
    return tree.depth if isinstance(tree, DynamicTree) else len(tree)


def tree_kwargs(impl, case: TreeCase, generator=None) -> dict:
    s = case.sampling
    kw = {"tree": tree_arg(case.tree), "stop_ids": tuple(s.stop_ids)}
    if s.temperature > 0:
        kw["temperature"] = s.temperature
        if s.top_k:
            kw["top_k"] = s.top_k
        if s.top_p < 1:
            kw["top_p"] = s.top_p
    if generator is not None and impl.accepts("tree_generate", "generator"):
        kw["generator"] = generator
    return kw


def run_tree(impl, prop, check, case, target, draft, generator=None, where=""):
    """One tree_generate call under the kit's guards -> (tokens, stats)."""
    prompt = list(case.prompt)
    try:
        value = invoke(impl, "tree_generate", target, draft, prompt, case.max_new_tokens,
                       models=(("target", target), ("draft", draft)),
                       inputs=(("prompt_ids", prompt),), **tree_kwargs(impl, case, generator))
        return tokens_and_stats(impl, "tree_generate", value)
    except EngineFault as exc:
        fail(impl, prop, check, case, where + exc.describe())


def _tie(case, got, expected, gaps) -> bool:
    """A first difference at a genuine tie of the target's top-two logits is not a bug."""
    i = first_difference(got, expected)
    return i < len(got) and i < len(expected) and gaps[i] < oracle.TIE_TOLERANCE


# --------------------------------------------------------------------------- greedy

def check_tree_greedy(impl, case: TreeCase):
    """tree_generate at temperature 0 == the target's greedy output == the chain's output."""
    prop = "tree: greedy tree == chain == target greedy"
    case = case.replace(temperature=0.0)
    target, draft = build_pair(case.target, case.draft)
    tokens, _ = run_tree(impl, prop, CHECK_GREEDY, case, target, draft)
    expected, gaps = oracle.greedy(case.target, case.prompt, case.max_new_tokens,
                                   case.sampling.stop_ids)
    if tokens != expected and not _tie(case, tokens, expected, gaps):
        fail(impl, prop, CHECK_GREEDY, case,
             f"tree_generate(tree={case.tree}) != the target's greedy continuation of "
             f"{list(case.prompt)} (max_new_tokens={case.max_new_tokens}, stop_ids="
             f"{list(case.sampling.stop_ids)})\n  got:      {tokens}\n  expected: {expected}\n"
             f"first difference at output position {first_difference(tokens, expected)}",
             cause=TOO_LONG if len(tokens) > case.max_new_tokens else None)
    if not impl.has("engine"):
        return
    target, draft = build_pair(case.target, case.draft)
    prompt = list(case.prompt)
    try:
        chain, _ = tokens_and_stats(impl, "speculative_generate", invoke(
            impl, "speculative_generate", target, draft, prompt, case.max_new_tokens,
            k=tree_depth(case.tree), temperature=0.0, stop_ids=tuple(case.sampling.stop_ids),
            models=(("target", target), ("draft", draft)), inputs=(("prompt_ids", prompt),)))
    except EngineFault:
        return  # the chain's own faults are the engine families' to report
    if chain != tokens and not _tie(case, chain, tokens, gaps):
        fail(impl, prop, CHECK_GREEDY, case,
             f"tree_generate gave {tokens}, the chain (speculative_generate, k="
             f"{tree_depth(case.tree)}) gave {chain}")


def greedy_depths(case: TreeCase) -> list[int]:
    """How deep each round of a correct greedy tree run accepts: per round, the number of
    levels along which the target's greedy token is among the draft's top tree[d] tokens at
    that node (the children a greedy tree drafts). From float64 fresh prefills of both models,
    independent of any engine: a statement about the case, used to show that the deep cases
    reach their deep levels. Fixed shapes only (a dynamic tree's shape depends on the round)."""
    if isinstance(case.tree, DynamicTree):
        raise ValueError(f"greedy_depths needs a fixed tree shape, got tree={case.tree!r}")
    target, draft = build_pair(case.target, case.draft)
    context, out, depths = list(case.prompt), [], []
    while len(out) < case.max_new_tokens:
        depth = 0
        for width in case.tree:
            best = int(target.next_logits(context).argmax())
            top = torch.sort(draft.next_logits(context), descending=True, stable=True).indices
            if best not in top[:width].tolist():
                break
            depth += 1
            context.append(best)
            out.append(best)
        context.append(int(target.next_logits(context).argmax()))
        out.append(context[-1])
        depths.append(depth)
        if set(out) & set(case.sampling.stop_ids):
            break
    return depths


# --------------------------------------------------------------------------- sampling

def tree_delta() -> float:
    """The deviation the tree family's sampling checks are sized for in the active profile."""
    return DELTA_TREE_THOROUGH if profiles.current() == "thorough" else DELTA_TREE


def check_tree_sampling(impl, case: TreeCase, delta: float | None = None):
    """The first L = max_new_tokens sampled tokens are distributed as the target's sampling."""
    prop = "tree: sampled law of the first L tokens"
    delta = delta or tree_delta()
    if case.sampling.temperature <= 0:
        raise ValueError(f"check_tree_sampling needs a temperature > 0, got {case!r}")
    L = case.max_new_tokens
    s = case.sampling
    law = oracle.sequence_law(case.target, case.prompt, L, s.temperature, s.top_k, s.top_p,
                              s.stop_ids)
    the_plan = plan(list(law.values()), delta)
    generator = seed_everything(case.sampling.seed)
    observed = Counter()
    for i in range(the_plan.n):
        target, draft = build_pair(case.target, case.draft)
        tokens, _ = run_tree(impl, prop, CHECK_SAMPLING, case, target, draft, generator,
                             where=f"run {i + 1} of {the_plan.n}: ")
        observed[tuple(tokens)] += 1
    result = chi_square_gof(observed, law)
    if not result.passed:
        fail(impl, prop, CHECK_SAMPLING, case, law_mismatch(
            f"the outputs of tree_generate(tree={case.tree})", result, the_plan, len(law),
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, L=L),
            cause=TOO_LONG if too_long(result.impossible, L) else None)


# --------------------------------------------------------------------------- cache

class _Snapshot:
    def __init__(self, role, start, keys, values, index):
        self.role, self.start, self.keys, self.values, self.index = role, start, keys, values, index


class SnapshotQwen3(Qwen3KitModel):
    """A qwen3 kit model that copies what its cache holds before every call: the check compares
    it, after the run, with a fresh prefill of the committed sequence."""

    def __init__(self, module, role, trace, snapshots, name):
        super().__init__(module, role, trace, name)
        self.snapshots = snapshots

    def __call__(self, ids, cache, positions=None, mask=None):
        if isinstance(cache, TracedKVCache) and getattr(cache, "owner", None) is self:
            n = cache.length
            self.snapshots.append(_Snapshot(
                self.role, n, [k[0, :, :n].clone() for k in cache.keys],           # [H, n, D]
                [v[0, :, :n].clone() for v in cache.values], len(self.trace.events)))
        return super().__call__(ids, cache, positions, mask)

    forward = __call__


def _fresh_kv(module, sequence):
    """Keys and values [H, len, D] per layer of a fresh prefill of `sequence`."""
    p = module.model.embed_tokens.weight
    c = module.config
    cache = KVCache(len(module.layers), 1, c.num_key_value_heads, c.head_dim,
                    max(1, len(sequence)), p.dtype, p.device)
    if sequence:
        with torch.inference_mode():
            module(torch.tensor([list(sequence)], device=p.device), cache)
    n = len(sequence)
    return [k[0, :, :n] for k in cache.keys], [v[0, :, :n] for v in cache.values]


def _bounds(snapshots, committed: int) -> list[int]:
    """For each snapshot, how many leading entries must be the committed sequence's.

    Target: all of them (a target call starts a round, or is the prefill). Draft: those below
    the next target call's start (the draft's calls inside a round sit on this round's tree
    nodes, which are not committed yet), or below the committed length after the last round.
    """
    bounds, next_target = [0] * len(snapshots), committed
    for i in range(len(snapshots) - 1, -1, -1):
        s = snapshots[i]
        if s.role == "target":
            bounds[i] = s.start
            next_target = s.start
        else:
            bounds[i] = min(s.start, next_target)
    return bounds


def check_tree_cache(impl, case: TreeCase):
    """At every call, the cache entries below the round hold the committed sequence: the same
    keys and values (so the same tokens at the same positions) as a fresh prefill."""
    prop = "tree: committed path's cache entries in place"
    if "qwen3" != case.target.kind:
        raise ValueError(f"check_tree_cache needs a qwen3 target, got {case.target!r}")
    trace, snapshots = Trace(), []
    target = SnapshotQwen3(qwen3_module(case.target), "target", trace, snapshots, "target")
    draft = SnapshotQwen3(qwen3_draft_module(case.target, case.draft), "draft", trace, snapshots,
                          "draft")
    generator = seed_everything(case.sampling.seed)
    tokens, _ = run_tree(impl, prop, CHECK_CACHE, case, target, draft, generator)
    if not trace.used_caches():
        pytest.skip(f"not applicable: --impl={impl.spec} keeps its own caches (it never asked the "
                    f"kit's models for one), so the kit cannot inspect them; the greedy and "
                    f"sampling properties check what its caches produce")
    committed = list(case.prompt) + tokens
    fresh = {"target": _fresh_kv(target.module, committed),
             "draft": _fresh_kv(draft.module, committed)}
    for snap, n in zip(snapshots, _bounds(snapshots, len(committed))):
        if n > len(committed):
            fail(impl, prop, CHECK_CACHE, case,
                 f"before event #{snap.index} the {snap.role} cache held {n} entries, more than "
                 f"the {len(committed)} tokens ever committed ({committed})\n"
                 f"{trace.tail(snap.index)}")
        keys, values = fresh[snap.role]
        for layer, (k, v) in enumerate(zip(snap.keys, snap.values)):
            diff = torch.maximum((k[:, :n] - keys[layer][:, :n]).abs().amax(dim=(0, 2)),
                                 (v[:, :n] - values[layer][:, :n]).abs().amax(dim=(0, 2)))
            bad = (diff > KV_TOLERANCE).nonzero()
            if len(bad):
                slot = int(bad[0])
                fail(impl, prop, CHECK_CACHE, case,
                     f"before event #{snap.index} the {snap.role} cache's entry at slot {slot} "
                     f"(layer {layer}) differs by {float(diff[slot]):.3g} from a fresh prefill of "
                     f"the committed sequence: it should hold token {committed[slot]} at position "
                     f"{slot} (committed: {committed}; a path moved from the wrong nodes or to the "
                     f"wrong slots, or a stale entry)\nthe run's events up to there:\n"
                     f"{trace.tail(snap.index)}")


# --------------------------------------------------------------------------- bounds

def check_tree_bounds(impl, case: TreeCase, runs: int = 1):
    """max_new_tokens, stop ids and stats, greedy or sampled (then over `runs` seeded runs)."""
    prop = "tree: stops, budgets and stats"
    generator = seed_everything(case.sampling.seed)
    stops = set(case.sampling.stop_ids)
    for run in range(runs):
        target, draft = build_pair(case.target, case.draft)
        tokens, stats = run_tree(impl, prop, CHECK_BOUNDS, case, target, draft, generator)
        where = f"run {run + 1} of {runs}: " if runs > 1 else ""
        problem = None
        hit = [i for i, t in enumerate(tokens) if t in stops]
        if len(tokens) > case.max_new_tokens:
            fail(impl, prop, CHECK_BOUNDS, case, f"{where}{len(tokens)} tokens for "
                 f"max_new_tokens={case.max_new_tokens}\n  output: {tokens}", cause=TOO_LONG)
        elif hit and hit[0] != len(tokens) - 1:
            problem = f"stop id {tokens[hit[0]]} at output position {hit[0]}, but the output goes on"
        elif not hit and len(tokens) < case.max_new_tokens:
            problem = (f"{len(tokens)} tokens, no stop id among them, fewer than "
                       f"max_new_tokens={case.max_new_tokens}")
        else:
            problem = _stats_problem(stats, len(tokens), tree_depth(case.tree))
        if problem:
            fail(impl, prop, CHECK_BOUNDS, case, f"{where}{problem}\n  output: {tokens}")


def _stats_problem(stats, n_tokens: int, depth: int) -> str | None:
    rounds = stats_value(stats, "rounds")
    per_call = stats_value(stats, "tokens_per_target_call")
    rate = stats_value(stats, "acceptance_rate")
    if rounds is None or per_call is None or rate is None:
        return f"stats lack a number for rounds, tokens_per_target_call or acceptance_rate: {stats!r}"
    if n_tokens == 0:
        return None if rounds == 0 else f"stats say {rounds:g} rounds for an empty output"
    # Every round commits at least one token and at most depth + 1 (a path and one more).
    if not n_tokens / (depth + 1) <= rounds <= n_tokens:
        return (f"stats say {rounds:g} rounds for {n_tokens} tokens with a tree of depth {depth} "
                f"(each round commits 1 to {depth + 1})")
    return (stat_in_range("tokens_per_target_call", per_call, n_tokens / rounds,
                          n_tokens / rounds, f" = {n_tokens} tokens / {rounds:g} rounds")
            or stat_in_range("acceptance_rate", rate, 0.0, 1.0))
