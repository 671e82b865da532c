"""A correct sampling-only engine: temperature 0 is refused with a ValueError.

Engines built for sampling (a server whose greedy path is elsewhere) may declare the greedy
family not applicable. Then no other family may draw temperature 0 for it either (cache,
perfect_draft and bounds run it at temperatures > 0). Verdict: CONFORMANT on every family
but greedy, which is reported not applicable with the reason below.
"""

from tests.mutants.engine import Speculator

KIT_NOT_APPLICABLE = {"greedy": "sampling-only engine: temperature 0 is refused"}


class SamplingOnly(Speculator):
    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, *, top_k=0,
                             top_p=1.0):
        if temperature == 0:
            raise ValueError(f"temperature must be > 0: this engine only samples, got "
                             f"temperature={temperature!r}")
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k=k,
                                            temperature=temperature, stop_ids=stop_ids,
                                            generator=generator, top_k=top_k, top_p=top_p)


_engine = SamplingOnly()

accept_or_correct = _engine.accept_or_correct
speculative_generate = _engine.speculative_generate
