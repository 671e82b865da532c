"""The reference drafting with an EAGLE-3 head of the kit's target: --impl=reference-head.

The kit hands every call a target and a draft model. Here the draft is set aside (except for a
tree of a fixed shape, below) and the call drafts with a head of that target, fed by the
target's own verify forwards (reference/heads/proposer.py): the trained head where the target
has the shapes of a committed trained target with one (reference/trained*/), else a seeded
random head. Which head only changes acceptance: the output is exact with any head (greedy: the
target's argmax decides every token; sampling: proposals are drawn from the head's q and the
rejection rule corrects to the target's law), and that is what the kit judges. `head_for` is
also what --impl=fast-head and --impl=fast-mtp draft with (fast/head_kit.py),
so the reference and the fast engine are judged with the same head.

Trees: a dynamic tree (DynamicTree, "dynamic") is grown by the head (EAGLE-2's drafting,
reference/heads/tree.py), so the tree family's dynamic examples judge the head's trees; a tree
of a fixed shape needs a model draft, so those examples run with the kit's draft. Not
applicable: the perfect-draft family (the kit's draft is not what proposes here).
"""

import weakref

from reference import speculative

KIT_MODEL_KINDS = {"qwen3"}     # a head reads the target's hidden states (forward_hidden)
KIT_NOT_APPLICABLE = {
    "perfect_draft": "reference-head drafts with an EAGLE-3 head of the target, not with the "
                     "kit's draft, so draft = target does not make the proposals perfect",
}

_HEADS = weakref.WeakKeyDictionary()     # target module -> {kind: head}


def module_of(target):
    """The kit's target without its wrappers (objects exposing the real module as `.module`)."""
    for _ in range(16):
        if not hasattr(target, "module"):
            break
        target = target.module
    return target


def head_for(target, kind: str = "eagle3"):
    """The head of `kind` ("eagle3" or "mtp") the kit's calls draft with for `target`: made once
    per target and kept while the target lives (the module docstring)."""
    if kind not in ("eagle3", "mtp"):
        raise ValueError(f"kind must be 'eagle3' or 'mtp', got {kind!r}")
    module = module_of(target)
    heads = _HEADS.setdefault(module, {})
    if kind not in heads:
        heads[kind] = _trained(module, kind) or _random(module, kind)
    return heads[kind]


def _trained(module, kind: str):
    from reference.heads.checkpoint import load_head
    from reference.pretrained import LARGE_DIR, TRAINED_DIR
    dtype = module.lm_head.weight.dtype
    for folder in (TRAINED_DIR, LARGE_DIR):
        if (folder / kind / "config.json").is_file():
            try:
                return load_head(folder / kind, module, dtype)
            except ValueError:      # made for a target of other shapes
                continue
    return None


def _random(module, kind: str):
    from reference.heads.eagle3 import default_hidden
    from reference.heads.random import random_head
    from reference.hidden import HiddenStates, last_layer
    layers, dtype = module.config.num_hidden_layers, module.lm_head.weight.dtype
    if kind == "mtp":   # the trained layers' convention: llama.cpp's (reference/train_mtp.py)
        return random_head("mtp", module, seed=0, dtype=dtype,
                           hidden=last_layer(layers, normed=True), order="embedding-first",
                           recycle="normed", lead=True)
    # EAGLE-3's low / middle / high layers need 3; a shallower kit target gives its embeddings
    # and its last stream
    hidden = default_hidden(layers) if layers >= 3 else HiddenStates((0, layers), "input")
    return random_head("eagle3", module, seed=0, dtype=dtype, hidden=hidden)


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """reference.speculative.speculative_generate with the target's head drafting."""
    return speculative.speculative_generate(target, head_for(target), prompt_ids, max_new_tokens,
                                            k, temperature, stop_ids, generator, top_k=top_k,
                                            top_p=top_p)


def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0):
    """reference.speculative.tree_generate: a dynamic tree grown by the target's head, a fixed
    shape by `draft` (the module docstring)."""
    grower = head_for(target) if speculative.is_grown(tree) else draft
    return speculative.tree_generate(target, grower, prompt_ids, max_new_tokens, tree, stop_ids,
                                     temperature=temperature, generator=generator, top_k=top_k,
                                     top_p=top_p)


__all__ = ["KIT_MODEL_KINDS", "KIT_NOT_APPLICABLE", "head_for", "speculative_generate",
           "tree_generate"]
