"""The inputs of one served-engine example; its repr is valid Python for the replay tool."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ServedCase:
    """One completion request to the served target (token ids; temperature 0 is greedy)."""

    prompt: tuple
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: tuple = ()
    seed: int = 0

    def replace(self, **changes) -> "ServedCase":
        return replace(self, **changes)
