"""Hypothesis strategies for speculative decoding, importable by anyone testing an engine.

    from properties.strategies import distribution_pairs, engine_cases

    @given(distribution_pairs())
    def test_my_rule(pq):
        p, q = pq
        ...

Strategies that build models return *specs* (small frozen dataclasses, see properties.models
and properties.cases) rather than models, so that a failing example prints as a line of Python
that rebuilds it exactly; ``properties.models.build_pair(spec, draft)`` turns them into models.
Where a choice is drawn with ``sampled_from``, the first option is the most informative one,
because Hypothesis tries the simplest example (every first option) first.
"""

from __future__ import annotations

from hypothesis import strategies as st

from properties import oracle
from properties.cases import (P_KINDS, RELATIONS, BatchCase, EngineCase, PairSpec, RuleCase,
                              ServedCase, TreeCase)
from properties.models import (TRAINED_DRAFTS, DraftSpec, Qwen3Spec, TableSpec, TrainedSpec,
                               draft_variants, trained_pair)
from properties.models.served import VOCAB as SERVED_VOCAB
from reference.dynamic_tree import DynamicTree
from reference.sampling import SamplingParams

__all__ = ["seeds", "pair_specs", "distribution_pairs", "rule_cases", "table_specs",
           "qwen3_specs", "target_specs", "draft_specs", "prompts", "greedy_cases",
           "sampling_cases", "batch_cases", "tree_cases",
           "deep_tree_cases", "tree_sampling_cases", "trained_prompts", "trained_cases",
           "trained_tree_cases", "trained_top_k_cases", "served_prompts",
           "served_greedy_cases", "served_sampling_cases"]


def seeds() -> st.SearchStrategy[int]:
    """Seeds for the implementation's generator (and the kit's own draws)."""
    return st.integers(min_value=0, max_value=2**32 - 1)


# --------------------------------------------------------------------------- rule level

def pair_specs(small_vocab=(2, 16), large_vocab=(500, 3000), large: bool = True
               ) -> st.SearchStrategy[PairSpec]:
    """(p, q) pair specs: random, sparse, one-hot, uniform, tiny masses; q independent, equal,
    disjoint, overlapping, near or nested; small vocabularies and (if `large`) large ones."""
    small = st.builds(PairSpec, vocab=st.integers(*small_vocab), seed=seeds(),
                      p_kind=st.sampled_from(P_KINDS), q_kind=st.sampled_from(P_KINDS),
                      relation=st.sampled_from(RELATIONS))
    if not large:
        return small
    big = st.builds(PairSpec, vocab=st.integers(*large_vocab), seed=seeds(),
                    p_kind=st.sampled_from(("flat", "dirichlet", "tiny", "peaked")),
                    q_kind=st.sampled_from(("sparse", "peaked", "dirichlet")),
                    relation=st.sampled_from(("independent", "nested", "overlap")))
    return st.one_of(small, big)


def distribution_pairs(**kw) -> st.SearchStrategy:
    """(p, q) as float64 torch tensors (see pair_specs for the options)."""
    return pair_specs(**kw).map(lambda spec: spec.build())


def rule_cases(**kw) -> st.SearchStrategy[RuleCase]:
    return st.builds(RuleCase, pair=pair_specs(**kw), seed=seeds())


# --------------------------------------------------------------------------- models

def table_specs(vocab=(2, 24), sparse: bool = True) -> st.SearchStrategy[TableSpec]:
    return st.builds(TableSpec, vocab=st.integers(*vocab), seed=seeds(),
                     scale=st.sampled_from((2.0, 1.0, 4.0, 0.5)),
                     sparsity=st.sampled_from((0.0, 0.5)) if sparse else st.just(0.0))


def qwen3_specs(vocab=(2, 24), layers=(1, 2)) -> st.SearchStrategy[Qwen3Spec]:
    return st.builds(Qwen3Spec, vocab=st.integers(*vocab), seed=st.integers(0, 2**16),
                     layers=st.sampled_from(layers))


def target_specs(kind: str, **kw):
    if kind == "qwen3":
        return qwen3_specs(**kw)
    if kind == "table":
        return table_specs(**kw)
    raise ValueError(f"unknown model kind {kind!r}")


def draft_specs(target, variants=None) -> st.SearchStrategy[DraftSpec]:
    """Drafts for `target`: every variant its kind supports (see DraftSpec), noisy first."""
    allowed = draft_variants(target) if variants is None else [
        v for v in variants if v in draft_variants(target)]
    order = sorted(allowed, key=lambda v: ("noisy", "random", "perfect", "negated", "early_exit",
                                           "rolled", "lagged").index(v))
    return st.builds(DraftSpec, variant=st.sampled_from(order), seed=st.integers(0, 2**16))


def prompts(vocab: int, max_len: int = 8) -> st.SearchStrategy[tuple]:
    return st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len).map(tuple)


# --------------------------------------------------------------------------- engine level

@st.composite
def greedy_cases(draw, kind: str = "table", max_new=(0, 24), k=(1, 8), vocab=(2, 24),
                 variants=None, stops: bool = True) -> EngineCase:
    """Greedy runs: any draft, prompt lengths from 1, k 1..8, max_new_tokens from 0, and
    sometimes stop ids (random ones, or one of the target's own tokens, see test_greedy)."""
    target = draw(target_specs(kind, vocab=vocab))
    draft = draw(draft_specs(target, variants))
    prompt = draw(prompts(target.vocab))
    stop_ids = ()
    if stops:
        stop_ids = tuple(draw(st.lists(st.integers(0, target.vocab - 1), max_size=2, unique=True)))
    return EngineCase(target=target, draft=draft, prompt=prompt,
                      max_new_tokens=draw(st.integers(*max_new)), k=draw(st.integers(*k)),
                      sampling=SamplingParams(stop_ids=stop_ids, seed=draw(seeds())))


TEMPERATURES = (0.7, 1.6, 0.5, 1.3, 2.0, 1.0)


@st.composite
def sampling_cases(draw, kind: str = "table", vocab=(3, 5), length=(2, 2), k=(1, 3),
                   top_k: bool = False, top_p: bool = False, variants=None,
                   stops: bool = False) -> EngineCase:
    """Sampled runs whose first `length` tokens have a small enough outcome space for an exact
    chi-square test: small vocabularies, temperatures other than 1 first, and top-k / top-p
    when asked for (top_k below the vocabulary, top_p below 1)."""
    target = draw(target_specs(kind, vocab=vocab))
    draft = draw(draft_specs(target, variants))
    L = draw(st.integers(*length))
    if target.vocab ** L > 32:  # keep the outcome space small enough for an exact test
        L = 2
    case = EngineCase(target=target, draft=draft, prompt=draw(prompts(target.vocab, 3)),
                      max_new_tokens=L, k=draw(st.integers(*k)),
                      sampling=SamplingParams(temperature=draw(st.sampled_from(TEMPERATURES)),
                                              seed=draw(seeds())))
    return _sampling_options(draw, case, top_k, top_p, stops)


def _sampling_options(draw, case, top_k: bool, top_p: bool, stops: bool):
    """The case with a top-k, a top-p nucleus and a stop id drawn, as asked."""
    vocab = case.target.vocab
    if top_k:
        case = case.replace(top_k=draw(st.integers(2, max(2, vocab - 1))))
    if top_p:
        case = case.replace(top_p=draw(st.sampled_from((0.6, 0.8, 0.9, 0.4))))
    if stops:
        case = case.replace(stop_ids=(draw(st.integers(0, vocab - 1)),))
    return case


@st.composite
def batch_cases(draw, rows=(2, 4), vocab=(2, 24), max_new=(0, 16), k=(1, 6),
                ragged_limits: bool = True) -> BatchCase:
    """Ragged batches on qwen3 models: different prompt lengths, and (if ragged_limits)
    different max_new_tokens per row."""
    target = draw(qwen3_specs(vocab=vocab))
    draft = draw(draft_specs(target))
    n = draw(st.integers(*rows))
    batch = tuple(draw(prompts(target.vocab)) for _ in range(n))
    if ragged_limits and draw(st.booleans()):
        limit = tuple(draw(st.integers(*max_new)) for _ in range(n))
    else:
        limit = draw(st.integers(*max_new))
    stop_ids = tuple(draw(st.lists(st.integers(0, target.vocab - 1), max_size=1)))
    return BatchCase(target=target, draft=draft, prompts=batch, max_new_tokens=limit,
                     k=draw(st.integers(*k)),
                     sampling=SamplingParams(stop_ids=stop_ids, seed=draw(seeds())))


# Dynamic trees (reference/dynamic_tree.py): a shape grown per round from the draft's
# confidence. Budgets that cut a level (only the most confident nodes get children) and chains
# of one (topk 1), so that the shape differs from round to round and from a full tree.
DYNAMIC_SHAPES = (DynamicTree(3, 2, 5), DynamicTree(4, 2, 8), DynamicTree(5, 2, 7),
                  DynamicTree(3, 3, 9), DynamicTree(4, 1, 4))


def _fits(shapes, vocab: int) -> list:
    """The shapes a vocabulary allows (a dynamic tree's topk distinct greedy children)."""
    return [s for s in shapes if not isinstance(s, DynamicTree) or s.topk <= vocab]


@st.composite
def tree_cases(draw, vocab=(2, 24), max_new=(0, 16),
               shapes=((2, 2, 2), (1,), (3,), (2, 1), (1, 1, 1, 1), (3, 2), (2, 2, 1, 1))
               + DYNAMIC_SHAPES) -> TreeCase:
    """Greedy tree runs on qwen3 models: several shapes (fixed and dynamic), any draft,
    sometimes a stop id."""
    target = draw(qwen3_specs(vocab=vocab))
    return TreeCase(target=target, draft=draw(draft_specs(target)),
                    prompt=draw(prompts(target.vocab)), max_new_tokens=draw(st.integers(*max_new)),
                    tree=draw(st.sampled_from(_fits(shapes, target.vocab))),
                    sampling=SamplingParams(
                        stop_ids=tuple(draw(st.lists(st.integers(0, target.vocab - 1),
                                                     max_size=1))),
                        seed=draw(seeds())))


# Depth >= 4 with branching at the top, where a mask or position bug has siblings, uncles and
# cousins to leak from.
DEEP_SHAPES = ((2, 2, 1, 1), (2, 2, 2, 1), (3, 2, 1, 1), (2, 2, 2, 2), (2, 1, 2, 1, 1))


@st.composite
def deep_tree_cases(draw, vocab=(4, 12), max_new=(10, 24), shapes=DEEP_SHAPES) -> TreeCase:
    """Greedy runs of deep, branching trees with drafts close to the target (noisy: the target's
    weights plus small noise; perfect), so that whole paths down to the deepest level are
    accepted and the target's logits at deep nodes decide the output (how often each depth is
    reached: tests/test_kit_tree.py, CONFORMANCE.md)."""
    target = draw(qwen3_specs(vocab=vocab))
    return TreeCase(target=target, draft=draw(draft_specs(target, ("noisy", "perfect"))),
                    prompt=draw(prompts(target.vocab)), max_new_tokens=draw(st.integers(*max_new)),
                    tree=draw(st.sampled_from(shapes)), sampling=SamplingParams(seed=draw(seeds())))


@st.composite
def tree_sampling_cases(draw, vocab=(3, 4), shapes=((2,), (3,), (2, 2), (1, 2), (2, 1),
                                                  DynamicTree(2, 2, 3), DynamicTree(3, 2, 4)),
                        length=(2, 3), top_k: bool = False, top_p: bool = False,
                        stops: bool = False) -> TreeCase:
    """Sampled tree runs whose first L tokens have an outcome space small enough for an exact
    chi-square test: one-layer qwen3 targets, vocabularies of 3-4, L of 2-3 (at most 32
    outcomes), drafts unlike the target first (rejections, so every sibling gets tried)."""
    target = draw(qwen3_specs(vocab=vocab, layers=(1,)))
    draft = draw(draft_specs(target, ("random", "negated", "noisy", "rolled")))
    L = draw(st.integers(*length))
    if target.vocab ** L > 32:
        L = 2
    case = TreeCase(target=target, draft=draft, prompt=draw(prompts(target.vocab, 3)),
                    max_new_tokens=L, tree=draw(st.sampled_from(_fits(shapes, target.vocab))),
                    sampling=SamplingParams(temperature=draw(st.sampled_from(TEMPERATURES)),
                                            seed=draw(seeds())))
    return _sampling_options(draw, case, top_k, top_p, stops)


# --------------------------------------------------------------------------- trained models

def trained_prompts(min_len: int = 4) -> st.SearchStrategy[tuple]:
    """A leading part (min_len tokens or more) of one of the trained models' held-out prompts:
    real text the models never saw, which their trained drafts continue as the target would."""
    held = trained_pair().prompts()
    return st.integers(0, len(held) - 1).flatmap(
        lambda i: st.integers(min(min_len, len(held[i])), len(held[i])).map(
            lambda n: tuple(held[i][:n])))


@st.composite
def trained_cases(draw, drafts=TRAINED_DRAFTS, max_new=(8, 40), k=(2, 8),
                  stops: bool = False) -> EngineCase:
    """Greedy runs of the trained target with its trained drafts on held-out text: most
    proposals are accepted, so the late draft positions of long blocks are reached (how often:
    tests/test_trained.py). stops: a stop id drawn from the target's vocabulary."""
    target = TrainedSpec()
    stop_ids = (draw(st.integers(0, target.vocab - 1)),) if stops else ()
    return EngineCase(target=target, draft=DraftSpec(draw(st.sampled_from(drafts))),
                      prompt=draw(trained_prompts()), max_new_tokens=draw(st.integers(*max_new)),
                      k=draw(st.integers(*k)),
                      sampling=SamplingParams(stop_ids=stop_ids, seed=draw(seeds())))


@st.composite
def trained_tree_cases(draw, max_new=(8, 32), shapes=DEEP_SHAPES + ((3, 2), (2, 2, 2))
                       ) -> TreeCase:
    """Greedy tree runs of the trained target and drafts on held-out text: deep, branching
    trees whose deep levels are accepted because the drafts are trained to agree."""
    return TreeCase(target=TrainedSpec(),
                    draft=DraftSpec(draw(st.sampled_from(("small", "early_exit")))),
                    prompt=draw(trained_prompts()), max_new_tokens=draw(st.integers(*max_new)),
                    tree=draw(st.sampled_from(shapes)), sampling=SamplingParams(seed=draw(seeds())))


@st.composite
def trained_top_k_cases(draw, length=(2, 2)) -> EngineCase:
    """Sampled runs of the trained pair under top-k 2 or 3: the exact law of the first L tokens
    has at most 3**L outcomes although the vocabulary has 2,048 tokens."""
    top_k = draw(st.sampled_from((2, 3)))
    return EngineCase(target=TrainedSpec(), draft=DraftSpec(draw(st.sampled_from(("small", "early_exit")))),
                      prompt=draw(trained_prompts()), max_new_tokens=draw(st.integers(*length)),
                      k=draw(st.integers(2, 4)),
                      sampling=SamplingParams(temperature=draw(st.sampled_from((1.0, 0.7))),
                                              top_k=top_k, seed=draw(seeds())))


# --------------------------------------------------------------------------- served engines
# Requests to a served engine, over the fixed served models (properties.models.served).
# Prompts are random, or a short pattern repeated: the latter gives prompt lookup (n-gram
# speculation) matches to propose from, so speculation is exercised, not only requested.
# Stop ids are taken from the target's own greedy continuation, so that they fall inside the
# blocks a speculator proposes and the server accepts.

SERVED_TOKENS = st.integers(0, SERVED_VOCAB - 1)
SERVED_TEMPERATURES = (0.5, 0.8, 1.0, 1.3)
SERVED_TOP_KS = (0, 0, 2, 5, 12)
SERVED_TOP_PS = (1.0, 1.0, 0.9, 0.7)


@st.composite
def served_prompts(draw):
    if draw(st.booleans()):
        return tuple(draw(st.lists(SERVED_TOKENS, min_size=1, max_size=12)))
    pattern = draw(st.lists(SERVED_TOKENS, min_size=1, max_size=4))
    tail = draw(st.lists(SERVED_TOKENS, max_size=2))
    return tuple(pattern * draw(st.integers(2, 4)) + tail)


@st.composite
def served_greedy_cases(draw, with_stops: bool = False):
    prompt = draw(served_prompts())
    max_tokens = draw(st.integers(1, 16))
    stops = ()
    if with_stops or draw(st.booleans()):
        continuation = oracle.served_greedy(prompt, max_tokens)
        if len(continuation) > 1:
            at = draw(st.integers(1, len(continuation) - 1))
            stops = (continuation[at],) + tuple(draw(st.lists(SERVED_TOKENS, max_size=1)))
    return ServedCase(prompt, max_tokens, SamplingParams(stop_ids=stops, seed=0))


@st.composite
def served_sampling_cases(draw, max_len: int = 2, with_stops: bool = False, filters: bool = True,
                          min_len: int = 1, top_ps=None):
    """filters=False: no top-k and no top-p (the temperature alone shapes the law). min_len 2:
    at least one position after the first, which the prefill gives unspeculated. top_ps: the
    top-p values to draw from (a small nucleus keeps the law of longer outputs small)."""
    prompt = draw(served_prompts())
    stops = tuple(draw(st.lists(SERVED_TOKENS, min_size=1 if with_stops else 0, max_size=2)))
    if top_ps is not None:
        return ServedCase(prompt, draw(st.integers(min_len, max_len)), SamplingParams(
            temperature=draw(st.sampled_from(SERVED_TEMPERATURES)),
            top_p=draw(st.sampled_from(top_ps)), stop_ids=stops,
            seed=draw(st.integers(0, 2**20))))
    return ServedCase(prompt, draw(st.integers(min_len, max_len)), SamplingParams(
        temperature=draw(st.sampled_from(SERVED_TEMPERATURES)),
        top_k=draw(st.sampled_from(SERVED_TOP_KS)) if filters else 0,
        top_p=draw(st.sampled_from(SERVED_TOP_PS)) if filters else 1.0,
        stop_ids=stops, seed=draw(st.integers(0, 2**20))))
