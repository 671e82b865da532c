"""Acceptance by draft position, measured and exact, from the rounds a run already made.

A round that proposes x_1 .. x_k after the committed sequence c accepts x_j, given that it
reached j, with probability α_j = Σ_x min(p_j(x), q_j(x)), where p_j and q_j are the target's
and the draft's laws after c + x_1 .. x_{j-1} (at temperature 0: 1 when their argmaxes agree,
else 0). That holds whatever happened before j, so over every position a run reached,
accepted - Σ α has mean 0 and variance Σ α (1 - α): the measured acceptance at position j is
compared with the mean α_j of the rounds that reached it, and tokens per target call with
(Σ decided) / rounds against (Σ over rounds of the bonus token plus Σ α of the positions
reached) / rounds. Both expectations come from the models' laws at the contexts the run
reached, never from the acceptance it measured.

Only positions inside the output are counted: a round that the end of the output (max_new_tokens
or a stop id) cut short stops being observed there, a stopping rule decided by what came before.
"""

from __future__ import annotations

import torch

from properties.models import build_pair
from reference.sampling import greedy_token

_models: dict = {}
_alpha: dict = {}
CACHE = 20000           # α values kept (a test reruns one case with other stop ids)


def _pair(case):
    key = (case.target, case.draft)
    if key not in _models:
        if len(_models) > 8:
            _models.clear()
        _models[key] = build_pair(case.target, case.draft)
    return _models[key]


def alpha(case, context: tuple) -> float:
    """Σ min(p, q) after `context` for the case's target and draft at its sampling settings."""
    s = case.sampling
    key = (case.target, case.draft, context, s.temperature, s.top_k, s.top_p)
    if key in _alpha:
        return _alpha[key]
    target, draft = _pair(case)
    p_logits, q_logits = target.next_logits(context), draft.next_logits(context)
    if s.temperature == 0:
        value = float(greedy_token(p_logits) == greedy_token(q_logits))
    else:
        p, q = s.probs(p_logits.double()), s.probs(q_logits.double())
        value = min(1.0, float(torch.minimum(p, q).sum()))   # rounding can pass 1 by 1e-16
    if len(_alpha) > CACHE:
        _alpha.clear()
    _alpha[key] = value
    return value


def by_position(case, analysis, tokens) -> dict | None:
    c = [int(t) for t in case.prompt] + [int(t) for t in tokens]
    rounds = analysis.rounds
    if not rounds:
        return None
    k = max((r.proposals for r in rounds), default=0)
    positions = [{"reached": 0, "accepted": 0, "exact": 0.0, "var": 0.0} for _ in range(k)]
    decided = exact_tokens = var_tokens = 0.0
    for r in rounds:
        F = r.frontier
        proposals = list(r.fed[F - r.start:]) if r.proposals else []
        visible = min(len(proposals), len(c) - F)
        for j in range(visible):
            a = alpha(case, tuple(c[:F]) + tuple(proposals[:j]))
            slot = positions[j]
            slot["reached"] += 1
            slot["exact"] += a
            slot["var"] += a * (1 - a)
            exact_tokens += a
            var_tokens += a * (1 - a)
            if j < r.accepted:
                slot["accepted"] += 1
            else:
                break              # rejected here: the later proposals were not reached
        decided += r.decided
        exact_tokens += 0 if r.truncated_by_end else 1
    return {"kind": "acceptance", "k": k, "temperature": float(case.sampling.temperature),
            "rounds": len(rounds), "tokens": int(decided), "exact_tokens": float(exact_tokens),
            "var_tokens": float(var_tokens), "positions": positions}
