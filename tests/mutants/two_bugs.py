"""An engine with two bugs, one hiding the other if the kit stops at the first: it crashes for
max_new_tokens <= 2 (an edge case), and its verifier ignores the temperature (a sampling bug
every sequence example would show, were any sequence example to run past the crash)."""

from __future__ import annotations

from tests.mutants.catalogue import TargetWithoutTemperature


class CrashesOnShortOutputs(TargetWithoutTemperature):
    caught_by = "sequence"

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4,
                             temperature=0.0, stop_ids=(), generator=None, **kw):
        if 0 < max_new_tokens <= 2:
            raise IndexError("list index out of range")   # e.g. a block slice at the edge
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k,
                                            temperature, stop_ids, generator, **kw)
