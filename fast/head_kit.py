"""The fast engine drafting with a head of the kit's target, in the shapes the kit calls:
--impl=fast-head (EAGLE3, an EAGLE-3 head: fast.HeadDrafter) and --impl=fast-mtp (MTP, an MTP
layer: fast.mtp.MTPDrafter).

The kit hands every call a target and a draft model. Here the draft is set aside and the call
drafts with a head of that target, fed by the target's own verify forwards:
reference.heads.kit.head_for's, the head --impl=reference-head drafts with too (the trained one
where the target has the shapes of a committed trained target with one, else a seeded random
one; an MTP layer in the trained layers' convention, llama.cpp's). Which head only changes
acceptance: the output is exact with any head, and that is what the kit judges
(reference/heads/kit.py says why).

Trees: a dynamic tree (DynamicTree, "dynamic") is grown by the head (EAGLE-2's drafting,
fast/dynamic.py), so the tree family's dynamic examples judge the head's trees; a tree of a fixed
shape needs a model draft, so those examples run with the kit's draft as --impl=fast does. Not
applicable: the perfect-draft family (draft = target must accept everything; the kit's draft is
not what proposes here).
"""

import fast
from fast.dynamic import is_dynamic
from fast.head import HeadDrafter
from fast.mtp import MTPDrafter
from fast.weights import KIT_MODEL_KINDS
from reference.heads.kit import head_for

DRAFTERS = {"eagle3": (HeadDrafter, "an EAGLE-3 head"), "mtp": (MTPDrafter, "an MTP layer")}


class HeadKit:
    """The kit's levels (engine, batched, tree) with a head of `kind` drafting."""

    KIT_MODEL_KINDS = KIT_MODEL_KINDS

    def __init__(self, kind: str):
        if kind not in DRAFTERS:
            raise ValueError(f"kind must be one of {sorted(DRAFTERS)}, got {kind!r}")
        self.kind = kind
        self.KIT_NOT_APPLICABLE = {
            "perfect_draft": f"this engine drafts with {DRAFTERS[kind][1]} of the target, not "
                             f"with the kit's draft, so draft = target does not make the "
                             f"proposals perfect",
        }

    def drafter(self, target):
        """A drafter of the target's head (one generation's state each)."""
        return DRAFTERS[self.kind][0](head_for(target, self.kind))

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
        """fast.speculative_generate with the target's head drafting (`draft` is not used)."""
        return fast.speculative_generate(target, self.drafter(target), prompt_ids,
                                         max_new_tokens, k, temperature, stop_ids, generator,
                                         top_k=top_k, top_p=top_p)

    def batched_generate(self, target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None):
        """fast.batched_generate with the target's head drafting (`draft` is not used)."""
        return fast.batched_generate(target, self.drafter(target), prompts, max_new_tokens, k,
                                     temperature, stop_ids, generator, top_k=top_k, top_p=top_p,
                                     cuda_graphs=cuda_graphs)

    def tree_generate(self, target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2),
                      stop_ids=(), *, temperature=0.0, generator=None, top_k=0, top_p=1.0,
                      cuda_graphs=None):
        """fast.tree_generate: a dynamic tree grown by the target's head, a fixed shape by
        `draft` (the module docstring)."""
        grower = self.drafter(target) if is_dynamic(tree) else draft
        return fast.tree_generate(target, grower, prompt_ids, max_new_tokens, tree, stop_ids,
                                  temperature=temperature, generator=generator, top_k=top_k,
                                  top_p=top_p, cuda_graphs=cuda_graphs)


EAGLE3 = HeadKit("eagle3")      # --impl=fast-head
MTP = HeadKit("mtp")            # --impl=fast-mtp
