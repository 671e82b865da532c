"""What the kit knows of an engine's sampling parameters, read from its dialect: its formula
for penalties, min_p and logit_bias (reference.penalties.Formula, declared with citations of
the engine's source in its file under properties/engines/), and the parameters its API cannot
take. An engine whose dialect declares no formula is judged against its baseline server.
"""

from __future__ import annotations

from reference.penalties import OPENAI, Formula

__all__ = ["OPENAI", "Formula", "for_dialect", "unsupported"]


def for_dialect(dialect) -> Formula | None:
    """The formula of the engine behind a dialect, or None where the kit knows none."""
    return dialect.formula


def unsupported(dialect, params) -> str | None:
    """Why the engine behind `dialect` cannot be asked for `params`, or None."""
    asked = {"presence_penalty": params.presence_penalty != 0,
             "frequency_penalty": params.frequency_penalty != 0,
             "logprobs": params.logprobs is not None}
    for param, why in dialect.unsupported.items():
        if asked.get(param):
            return f"{dialect.name} takes no {param}: {why}"
    return None
