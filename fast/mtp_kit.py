"""The fast engine drafting with an MTP layer, in the shapes the kit calls: --impl=fast-mtp.

As fast/head_kit.py does with an EAGLE-3 head: the kit's draft is set aside and every call
drafts with an MTP layer of the target (fast/mtp.py), fed by the target's own verify forwards:
the trained layer where the target has the shapes of a committed trained target with one
(reference/trained*/mtp), else a seeded random layer in the trained layers' convention
(llama.cpp's: the normed last state, embedding first, the normed output chained, a lead pair).
Which layer only changes acceptance; the output is exact with any (fast/head_kit.py says why),
and that is what the kit judges. A layer is made once per target and kept while the target
lives.

Not applicable: the perfect-draft family (the kit's draft is not what proposes here) and tree
verification (it needs a model draft).
"""

import weakref

import fast
from fast.mtp import MTPDrafter
from fast.weights import KIT_MODEL_KINDS, unwrap

KIT_NOT_APPLICABLE = {
    "perfect_draft": "fast-mtp drafts with an MTP layer of the target, not with the kit's "
                     "draft, so draft = target does not make the proposals perfect",
}

_LAYERS = weakref.WeakKeyDictionary()     # target module -> its MTP layer


def layer_for(target):
    """The MTP layer this module drafts with for `target` (see the module docstring)."""
    module = unwrap(target)
    layer = _LAYERS.get(module)
    if layer is None:
        layer = _trained_layer(module) or _random_layer(module)
        _LAYERS[module] = layer
    return layer


def _trained_layer(module):
    from reference.heads.checkpoint import load_head
    from reference.pretrained import LARGE_DIR, TRAINED_DIR
    dtype = module.lm_head.weight.dtype
    for folder in (TRAINED_DIR, LARGE_DIR):
        if (folder / "mtp" / "config.json").is_file():
            try:
                return load_head(folder / "mtp", module, dtype)
            except ValueError:      # made for a target of other shapes
                continue
    return None


def _random_layer(module):
    from reference.heads.random import random_head
    from reference.hidden import last_layer
    return random_head("mtp", module, seed=0, dtype=module.lm_head.weight.dtype,
                       hidden=last_layer(module.config.num_hidden_layers, normed=True),
                       order="embedding-first", recycle="normed", lead=True)


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


__all__ = ["KIT_MODEL_KINDS", "KIT_NOT_APPLICABLE", "batched_generate", "layer_for",
           "speculative_generate"]
