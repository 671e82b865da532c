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
