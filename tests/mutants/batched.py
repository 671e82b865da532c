"""Batched engines for the kit's "batched" family: the fast engine with one realistic mistake
in how its rows draw their random numbers.

Each row of a correct batched engine is an independent sample. The mistakes here keep every
row's own law exact (each row, looked at alone, is a correct speculative sampler), so a check
of each prompt's rows in aggregate passes them; only the joint law of two rows shows the bug.

    SharedAcceptanceUniforms  the accept / bonus uniforms of a round are drawn once, [k + 1],
                              and broadcast over the batch (`torch.rand(k + 1)` where
                              `torch.rand(B, k + 1)` was meant); the draft's draws stay per row
    SharedDraws               every uniform (draft draws too) drawn once per step and broadcast:
                              copies of one prompt become identical

Both wrap fast.batched_generate, replacing the fast engine's Sampler for the call only.
"""

from __future__ import annotations

import contextlib

import fast
import fast.engine
from fast.sampling import Sampler, uniforms


class _SharedSampler(Sampler):
    """Sampler whose uniforms with an extra shape (the verify step's) are one row's, repeated."""

    share_draft_draws = False

    def uniforms(self, row_ids, *shape):
        if shape or self.share_draft_draws:
            one = uniforms((1,) + shape, self.generator, self.device)
            return one.expand((len(row_ids),) + shape)
        return super().uniforms(row_ids, *shape)


class _AllShared(_SharedSampler):
    share_draft_draws = True


@contextlib.contextmanager
def _sampler(cls):
    saved = fast.engine.Sampler
    fast.engine.Sampler = cls
    try:
        yield
    finally:
        fast.engine.Sampler = saved


class SharedAcceptanceUniforms:
    """The rows of a batch reuse one round's acceptance uniforms (see the module docstring)."""

    caught_by = "batched"
    detected_when = "two rows sampled in one batch (their acceptances are then correlated)"
    KIT_MODEL_KINDS = fast.KIT_MODEL_KINDS
    sampler = _SharedSampler

    def batched_generate(self, target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0, cuda_graphs=None):
        with _sampler(self.sampler):
            return fast.batched_generate(target, draft, prompts, max_new_tokens, k, temperature,
                                         stop_ids, generator, top_k=top_k, top_p=top_p,
                                         cuda_graphs=cuda_graphs)


class SharedDraws(SharedAcceptanceUniforms):
    """Every uniform of a step shared by the batch: copies of one prompt come out identical."""

    detected_when = "two copies of one prompt sampled in one batch"
    sampler = _AllShared


MUTANTS = [SharedAcceptanceUniforms, SharedDraws]
