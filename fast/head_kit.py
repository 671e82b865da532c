"""The fast engine drafting with an EAGLE-3 head, in the shapes the kit calls: --impl=fast-head.

The kit hands every call a target and a draft model. Here the draft is set aside and the call
drafts with an EAGLE-3 head of that target (fast/head.py), fed by the target's own verify
forwards: reference.heads.kit.head_for's, the head --impl=reference-head drafts with too (the
trained head where the target has the shapes of a committed trained target with one, else a
seeded random head). Which head only changes acceptance: the output is exact with any head, and
that is what the kit judges (reference/heads/kit.py says why).

Trees: a dynamic tree (DynamicTree, "dynamic") is grown by the head (EAGLE-2's drafting,
fast/dynamic.py with fast.HeadDrafter), so the tree family's dynamic examples judge the head's
trees; a tree of a fixed shape needs a model draft, so those examples run with the kit's draft
as --impl=fast does. Not applicable: the perfect-draft family (draft = target must accept
everything; the kit's draft is not what proposes here).
"""

import fast
from fast.dynamic import is_dynamic
from fast.head import HeadDrafter
from fast.weights import KIT_MODEL_KINDS
from reference.heads.kit import head_for

KIT_NOT_APPLICABLE = {
    "perfect_draft": "fast-head drafts with an EAGLE-3 head of the target, not with the kit's "
                     "draft, so draft = target does not make the proposals perfect",
}


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """fast.speculative_generate with the target's head drafting (`draft` is not used)."""
    return fast.speculative_generate(target, HeadDrafter(head_for(target)), prompt_ids,
                                     max_new_tokens, k, temperature, stop_ids, generator,
                                     top_k=top_k, top_p=top_p)


def batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0, stop_ids=(),
                     generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None):
    """fast.batched_generate with the target's head drafting (`draft` is not used)."""
    return fast.batched_generate(target, HeadDrafter(head_for(target)), prompts, max_new_tokens,
                                 k, temperature, stop_ids, generator, top_k=top_k, top_p=top_p,
                                 cuda_graphs=cuda_graphs)


def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0, cuda_graphs=None):
    """fast.tree_generate: a dynamic tree grown by the target's head, a fixed shape by `draft`
    (the module docstring)."""
    grower = HeadDrafter(head_for(target)) if is_dynamic(tree) else draft
    return fast.tree_generate(target, grower, prompt_ids, max_new_tokens, tree, stop_ids,
                              temperature=temperature, generator=generator, top_k=top_k,
                              top_p=top_p, cuda_graphs=cuda_graphs)


__all__ = ["KIT_MODEL_KINDS", "KIT_NOT_APPLICABLE", "batched_generate", "head_for",
           "speculative_generate", "tree_generate"]
