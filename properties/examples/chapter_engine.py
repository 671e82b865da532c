"""An engine exposed to the kit with the chapter's API, as an engine author would expose theirs.

Point the kit at it with

    pytest properties/ --impl=properties/examples/chapter_engine.py

The kit needs module-level functions with the chapter's signatures, nothing else: here the
acceptance rule `accept_or_correct` and the engine `speculative_generate`, so the kit checks the
rule and engine levels and reports the batched and tree levels as not exposed. The engine
behind them is the reference (reference/speculative.py: the round as propose, verify, commit,
adapt k; reference/proposers.py: where proposals come from); an author's module calls into
their own engine the same way. `speculative_generate` here takes only the chapter's arguments,
not `top_k` / `top_p`, so the kit exercises it at plain temperatures only and reports the
top-k / top-p properties as not applicable.

The engine is given the kit's models, which have only the chapter's model interface:
`model(ids, cache) -> logits [1, T, V]`, `model.new_cache(batch, capacity)`, `cache.length`,
`cache.truncate(n)` and `model.parameters()`.
"""

from reference import speculative
from reference.speculative import accept_or_correct

__all__ = ["accept_or_correct", "speculative_generate"]


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None):
    """Generate up to `max_new_tokens` tokens after `prompt_ids`, distributed exactly as the
    target's own decoding (greedy at temperature 0). Returns (tokens, stats)."""
    return speculative.speculative_generate(target, draft, prompt_ids, max_new_tokens, k=k,
                                            temperature=temperature, stop_ids=stop_ids,
                                            generator=generator)
