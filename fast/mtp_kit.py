"""The fast engine drafting with an MTP layer, in the shapes the kit calls: --impl=fast-mtp.

As fast/head_kit.py does with an EAGLE-3 head: the kit's draft is set aside and every call
drafts with an MTP layer of the target (fast/mtp.py), fed by the target's own verify forwards:
reference.heads.kit.head_for(target, "mtp"), the trained layer where the target has the shapes
of a committed trained target with one (reference/trained*/mtp), else a seeded random layer in
the trained layers' convention (llama.cpp's: the normed last state, embedding first, the normed
output chained, a lead pair). Which layer only changes acceptance; the output is exact with any
(reference/heads/kit.py says why), and that is what the kit judges.

Trees: a dynamic tree is grown by the layer (EAGLE-2's drafting, fast/dynamic.py with
fast.mtp.MTPDrafter); a tree of a fixed shape needs a model draft, so those examples run with the
kit's draft as --impl=fast does. Not applicable: the perfect-draft family (the kit's draft is not
what proposes here).
"""

import fast
from fast.dynamic import is_dynamic
from fast.mtp import MTPDrafter
from fast.weights import KIT_MODEL_KINDS
from reference.heads.kit import head_for

KIT_NOT_APPLICABLE = {
    "perfect_draft": "fast-mtp drafts with an MTP layer of the target, not with the kit's "
                     "draft, so draft = target does not make the proposals perfect",
}


def layer_for(target):
    """The MTP layer this module drafts with for `target`: reference.heads.kit.head_for's (the
    one place that picks the kit target's head; see the module docstring)."""
    return head_for(target, "mtp")


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """fast.speculative_generate with the target's MTP layer drafting (`draft` is not used)."""
    return fast.speculative_generate(target, MTPDrafter(layer_for(target)), prompt_ids,
                                     max_new_tokens, k, temperature, stop_ids, generator,
                                     top_k=top_k, top_p=top_p)


def batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0, stop_ids=(),
                     generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None):
    """fast.batched_generate with the target's MTP layer drafting (`draft` is not used)."""
    return fast.batched_generate(target, MTPDrafter(layer_for(target)), prompts, max_new_tokens,
                                 k, temperature, stop_ids, generator, top_k=top_k, top_p=top_p,
                                 cuda_graphs=cuda_graphs)


def tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2), stop_ids=(), *,
                  temperature=0.0, generator=None, top_k=0, top_p=1.0, cuda_graphs=None):
    """fast.tree_generate: a dynamic tree grown by the target's MTP layer, a fixed shape by
    `draft` (the module docstring)."""
    grower = MTPDrafter(layer_for(target)) if is_dynamic(tree) else draft
    return fast.tree_generate(target, grower, prompt_ids, max_new_tokens, tree, stop_ids,
                              temperature=temperature, generator=generator, top_k=top_k,
                              top_p=top_p, cuda_graphs=cuda_graphs)


__all__ = ["KIT_MODEL_KINDS", "KIT_NOT_APPLICABLE", "batched_generate", "layer_for",
           "speculative_generate", "tree_generate"]
