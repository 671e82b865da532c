"""Engines that are correct but do things their own way: the kit must not call them broken
(or, for class 6, must say exactly what differs).

    Float32Stats           correct; accumulates its stats in float32 (as a GPU engine keeping
                           counters in a float32 tensor would): acceptance_rate 4/6 comes back
                           as 0.6666666865, not 0.6666666667. CONFORMANT.
    AcceptanceOffByRounding  broken: acceptance_rate computed as (accepted + 1e-4) / proposed,
                           an error far above float32 rounding. The bounds family must reject it.
"""

from __future__ import annotations

import torch

from reference.sampling import probs_from_logits
from tests.mutants.engine import Speculator


class Float32Stats(Speculator):
    """Correct speculation; every reported statistic is computed in float32 tensors."""

    caught_by = None

    def stats(self, output, rounds, accepted_total, proposed_total):
        f32 = lambda x: torch.tensor(x, dtype=torch.float32)
        rate = f32(accepted_total) / f32(proposed_total) if proposed_total else f32(0.0)
        per_call = f32(len(output)) / f32(rounds) if rounds else f32(0.0)
        return {"rounds": rounds, "acceptance_rate": float(rate),
                "tokens_per_target_call": float(per_call)}


class AcceptanceOffByRounding(Speculator):
    """acceptance_rate off by 1e-4 / proposed: a small error, but hundreds of float32 units of
    roundoff, so no rounding tolerance may admit it."""

    caught_by = "bounds"

    def stats(self, output, rounds, accepted_total, proposed_total):
        stats = super().stats(output, rounds, accepted_total, proposed_total)
        if proposed_total:
            stats["acceptance_rate"] = (accepted_total + 1e-4) / proposed_total
        return stats


# ----------------------------------------------------------------- class 6: the engine's own sampler

def top_p_before_temperature(logits, temperature, top_k=0, top_p=1.0):
    """A sampler definition other than the convention: the top-k / top-p support is chosen at
    temperature 1, then the temperature is applied to what is kept."""
    kept = probs_from_logits(logits.double(), 1.0, top_k, top_p) > 0
    scaled = (logits.double() / temperature).masked_fill(~kept, float("-inf"))
    return torch.softmax(scaled, -1)


def ancestral(probs_fn, target, prompt_ids, max_new_tokens, temperature=0.0, stop_ids=(),
              generator=None, *, top_k=0, top_p=1.0):
    """Plain ancestral sampling with `probs_fn`, on the chapter's model interface."""
    prompt, stops, out = [int(t) for t in prompt_ids], set(stop_ids), []
    cache = target.new_cache(1, len(prompt) + max_new_tokens + 1)
    device = next(iter(target.parameters())).device
    ids = prompt
    with torch.inference_mode():
        while len(out) < max_new_tokens:
            logits = target(torch.tensor([ids], device=device), cache)[0, -1]
            if temperature == 0:
                token = int(torch.argmax(logits))
            else:
                probs = probs_fn(logits, temperature, top_k, top_p)
                token = int(torch.multinomial(probs, 1, generator=generator))
            out.append(token)
            if token in stops:
                break
            ids = [token]
    return out


class _OwnSampling(Speculator):
    """Speculation exact relative to `probs_fn`: target and draft both processed with it."""

    probs_fn = staticmethod(probs_from_logits)

    def target_p(self, row, s):
        return self.probs_fn(row, s.temperature, s.top_k, s.top_p)

    def draft_q(self, logits, s):
        return self.probs_fn(logits, s.temperature, s.top_k, s.top_p)


class TopPFirstNoHook(_OwnSampling):
    """Top-p before temperature, with or without speculation; no target_generate: the kit
    cannot tell a speculation bug from a sampler definition, and must say so."""

    probs_fn = staticmethod(top_p_before_temperature)


class TopPFirstWithHook(TopPFirstNoHook):
    """The same engine exposing its own sampler: speculation exact relative to it (sequence
    passes); family sampler reports the difference from the convention."""

    def target_generate(self, target, prompt_ids, max_new_tokens, temperature=0.0, stop_ids=(),
                        generator=None, *, top_k=0, top_p=1.0):
        return ancestral(self.probs_fn, target, prompt_ids, max_new_tokens, temperature,
                         stop_ids, generator, top_k=top_k, top_p=top_p)


class ConventionalWithHook(TopPFirstWithHook):
    """Correct: the convention's sampler, exposed as target_generate. CONFORMANT."""

    probs_fn = staticmethod(probs_from_logits)


class BrokenSpeculationWithHook(ConventionalWithHook):
    """Conventional sampler exposed, but the verifier's p lacks top-p: a speculation bug, which
    the two-sample test against the engine's own sampler must catch."""

    def target_p(self, row, s):
        return probs_from_logits(row, s.temperature, s.top_k, 1.0)
