"""The fast engine's public functions, in the shapes the conformance kit calls.

Each call sizes a FastEngine to its request (batch, cache length, k). With CUDA graphs on, the
engine (and so its captured steps) is kept and reused by later calls of the same size, which is
what makes capture pay; eagerly, an engine is cheap and built per call.
"""

import weakref

from fast import checks
from fast.engine import FastEngine, graphs_wanted, is_drafter
from fast.dynamic import Layout, check_dynamic_tree, is_dynamic
from fast.tree import TreeShape, check_tree
from fast.weights import check_model, model_weights
from reference.sampling import SamplingParams

# target module -> {size key: engine}; only engines with captured graphs are kept.
_ENGINES = weakref.WeakKeyDictionary()


def _round_up(n: int, step: int = 64) -> int:
    return -(-n // step) * step


def _engine(target, draft, prompts, max_new, width: int, width_name: str, width_value,
            cuda_graphs, weights=None) -> FastEngine:
    """weights: model_weights(target) where the caller already built them (each build
    fingerprints every parameter of the target: FastEngine says what that costs)."""
    module = check_model(target, "target")
    weights = model_weights(target, "target") if weights is None else weights
    graphs = graphs_wanted(cuda_graphs, weights.device)
    needed = _cache_needed(prompts, max_new, width)
    limit = getattr(module.config, "max_position_embeddings", None) or needed
    # A request longer than the model's positions is refused here, naming what to shorten.
    checks.check_room(prompts, max_new, width, limit, width_name, width_value,
                      capacity_label="the target's max_position_embeddings")
    batch, k = len(prompts), width - 1
    capacity = min(_round_up(needed), max(limit, needed)) if graphs else needed
    if not graphs:
        return FastEngine(target, draft, max_batch=batch, max_cache_len=capacity, max_k=k,
                          cuda_graphs=False, target_weights=weights)
    key = (batch, capacity, k)
    per_target = _ENGINES.setdefault(module, {})
    engine = per_target.get(key)
    if engine is None or not _same_models(engine, weights, draft):
        engine = FastEngine(target, draft, max_batch=batch, max_cache_len=capacity, max_k=k,
                            cuda_graphs=True, target_weights=weights)
        per_target.clear()  # one captured engine per target: graphs hold device memory
        per_target[key] = engine
    return engine


def _same_models(engine: FastEngine, target_weights, draft) -> bool:
    """Whether a kept engine runs these very weights (fused copies are rebuilt on change)."""
    if engine.target_weights.layers[0].qkv is not target_weights.layers[0].qkv:
        return False
    if is_drafter(draft) or not hasattr(engine.drafter, "runner"):
        return engine.drafter is draft
    mine = engine.drafter.runner.weights
    theirs = model_weights(draft, "draft")
    return mine.embed is theirs.embed and len(mine.layers) == len(theirs.layers) and all(
        a.qkv is b.qkv for a, b in zip(mine.layers, theirs.layers))


def _sampling_args(sampling, temperature, top_k, top_p, stop_ids) -> tuple:
    """(temperature, top_k, top_p, stop_ids) of a call: from `sampling` when it is given (a
    keyword left at its default defers to it; one given with another value is an error naming
    both), else the keywords themselves. The sampler's randomness stays the `generator`'s."""
    if sampling is None:
        return temperature, top_k, top_p, stop_ids
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a reference.sampling.SamplingParams or None, got "
                         f"{type(sampling).__name__}")
    if sampling.n != 1:
        raise ValueError(f"sampling.n={sampling.n!r}: one output per prompt (repeat a prompt in "
                         f"the batch for more)")
    for name, value, default in (("temperature", temperature, 0.0), ("top_k", top_k, 0),
                                 ("top_p", top_p, 1.0), ("stop_ids", stop_ids, ())):
        theirs = getattr(sampling, name)
        if name == "stop_ids":
            value = tuple(int(t) for t in value)
        if value != default and value != theirs:
            raise ValueError(f"{name}={value!r} and sampling.{name}={theirs!r} disagree: give "
                             f"one of them")
    return sampling.temperature, sampling.top_k, sampling.top_p, sampling.stop_ids


def _cache_needed(prompts, max_new, width) -> int:
    """Slots the longest row needs: its prompt, its new tokens and one block of `width`."""
    return max(max(len(p) for p in prompts),
               max(len(p) + n + width - 1 for p, n in zip(prompts, max_new)))


def batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0, stop_ids=(),
                     generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None,
                     sampling: SamplingParams | None = None):
    """Speculative decoding of a ragged batch: (outputs, stats).

    Under greedy decoding row i is exactly the target's greedy continuation of prompts[i],
    ending at its first stop id and holding at most max_new_tokens[i] tokens; under sampling
    each row is distributed exactly as the target's ancestral sampling with the same
    temperature / top_k / top_p. cuda_graphs=None: on when CUDA is available; False: eager.
    `draft` is a Qwen3-family model or a drafter object (fast/drafter.py protocol).
    `sampling` (reference.sampling.SamplingParams), when given, supplies temperature, top_k,
    top_p and stop_ids (the project's one sampling type; see _sampling_args).
    """
    temperature, top_k, top_p, stop_ids = _sampling_args(sampling, temperature, top_k, top_p,
                                                         stop_ids)
    checks.check_cuda_graphs(cuda_graphs)
    checks.check_k(k)
    weights = model_weights(target, "target")
    prompts = checks.check_prompts(prompts, weights.shape.vocab_size)
    max_new = checks.check_max_new(max_new_tokens, len(prompts))
    engine = _engine(target, draft, prompts, max_new, k + 1, "k", k, cuda_graphs, weights)
    return engine.generate(prompts, max_new, k, temperature, stop_ids, generator,
                           top_k=top_k, top_p=top_p)


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """The chapter's engine API on the batched engine at B = 1: (tokens, stats)."""
    vocab = model_weights(target, "target").shape.vocab_size
    prompt = checks.check_prompt(prompt_ids, vocab, "prompt_ids")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    outputs, stats = batched_generate(target, draft, [prompt], max_new_tokens, k, temperature,
                                      stop_ids, generator, top_k=top_k, top_p=top_p)
    return outputs[0], _single_row(stats)


def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0, cuda_graphs=None,
                  sampling: SamplingParams | None = None):
    """Tree speculation for one prompt: (tokens, stats). tree[d] is the branching factor at
    depth d + 1. At temperature 0 the output is exactly the target's greedy continuation;
    above it, children are i.i.d. draft samples verified by recursive rejection and the output
    is distributed exactly as the target's sampling (temperature, top_k, top_p). `sampling`:
    as in batched_generate."""
    temperature, top_k, top_p, stop_ids = _sampling_args(sampling, temperature, top_k, top_p,
                                                         stop_ids)
    checks.check_cuda_graphs(cuda_graphs)
    checks.check_sampling(temperature, top_k, top_p)
    vocab = model_weights(target, "target").shape.vocab_size
    prompt = checks.check_prompt(prompt_ids, vocab, "prompt_ids")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if is_dynamic(tree):        # a tree grown per round (fast/dynamic.py)
        tree = check_dynamic_tree(tree, vocab)
        size = Layout(tree, "cpu").size
    else:
        tree = check_tree(tree, vocab)
        size = TreeShape(tree, "cpu").size
    # a drafter grows trees only where it says so (fast.HeadDrafter, fast.mtp.MTPDrafter:
    # dynamic trees, EAGLE-2's drafting)
    if is_drafter(draft) and not (is_dynamic(tree) and getattr(draft, "grows_trees", False)):
        raise ValueError(f"draft must be a Qwen3-family model for tree verification (or a head "
                         f"drafter, fast.HeadDrafter or fast.mtp.MTPDrafter, for a dynamic tree), "
                         f"got {type(draft).__name__} with tree={tree!r}")
    engine = _engine(target, draft, [prompt], [max_new_tokens], size, "tree", tree, cuda_graphs)
    outputs, stats = engine.generate_tree([prompt], max_new_tokens, tree, stop_ids, temperature,
                                          generator, top_k=top_k, top_p=top_p)
    stats = _single_row(stats)
    stats["tree"] = tree
    return outputs[0], stats


def _single_row(stats: dict) -> dict:
    """Batch stats of a one-row batch in the chapter's terms (they coincide at B = 1)."""
    row = stats["per_row"][0]
    single = {key: value for key, value in stats.items() if key != "per_row"}
    single.update(row)
    return single
