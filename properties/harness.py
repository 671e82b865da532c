"""Calling the implementation under test, and reporting what it got wrong.

Every property raises `PropertyFailure` with a message that names the property, the
implementation, the example's inputs (a case, seed included) and two ways to reproduce it:
the exact example through ``python -m properties.replay`` and the property through pytest.
"""

from __future__ import annotations

import math
import os
import random
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from properties.cases import EngineCase
from properties.impl import Impl
from properties.models import CacheViolation, Trace, build_pair


class PropertyFailure(AssertionError):
    """A property of the kit does not hold for the implementation under test."""


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def shell_quote(text: str) -> str:
    """Quote for a POSIX shell; double quotes when that needs no escaping (reprs use ')."""
    if not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def reproduction(impl: Impl, check: str, case) -> str:
    nodeid = _current_test()
    lines = ["reproduce this example exactly:",
             f"  python -m properties.replay --impl={shlex.quote(impl.spec)} {check} "
             f"{shell_quote(repr(case))}"]
    if nodeid:
        lines += ["rerun the property (the example database replays the failing example first; "
                  "Hypothesis also prints a @reproduce_failure blob):",
                  f"  python -m pytest {shlex.quote(nodeid)} --impl={shlex.quote(impl.spec)}"]
    return "\n".join(lines)


def fail(impl: Impl, prop: str, check: str, case, message: str):
    """Raise a PropertyFailure for property `prop` (e.g. "greedy: equivalence")."""
    __tracebackhide__ = True
    raise PropertyFailure(
        f"{prop}: violated by --impl={impl.spec}\n{message.rstrip()}\n\ninputs: {case!r}\n"
        f"{reproduction(impl, check, case)}")


def require(impl: Impl, level: str, kind: str | None = None, keyword: str | None = None):
    """Skip (not applicable) unless the implementation has the level, model kind and keyword."""
    from properties.impl import LEVELS
    family = _current_test().split("::", 1)[0].rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
    if family in impl.not_applicable:
        pytest.skip(f"not applicable: --impl={impl.spec}: {impl.not_applicable[family]} "
                    f"(KIT_NOT_APPLICABLE)")
    if not impl.has(level):
        names = ", ".join(impl.missing.get(level, [s.function for s in LEVELS[level]]))
        pytest.skip(f"not applicable: --impl={impl.spec} has no {names} (level {level!r})")
    if kind is not None and kind not in impl.model_kinds:
        pytest.skip(f"not applicable: --impl={impl.spec} runs only {sorted(impl.model_kinds)} "
                    f"kit models (KIT_MODEL_KINDS), this property uses {kind!r} models")
    if keyword is not None:
        fn = {"rule": "accept_or_correct", "engine": "speculative_generate",
              "batched": "batched_generate"}[level]
        if not impl.accepts(fn, keyword):
            pytest.skip(f"not applicable: --impl={impl.spec}'s {fn} does not take {keyword}=")


def seed_everything(seed: int) -> torch.Generator:
    """A generator for the implementation, and the global RNGs seeded too, so that even an
    implementation that ignores `generator` replays exactly."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- engine runs

@dataclass
class EngineRun:
    case: EngineCase
    tokens: list | None
    stats: object
    trace: Trace
    error: BaseException | None

    def describe_error(self) -> str:
        e = self.error
        return f"the engine raised {type(e).__name__}: {e}"


def normalize_tokens(tokens) -> list[int]:
    if torch.is_tensor(tokens):
        tokens = tokens.reshape(-1).tolist()
    return [int(t) for t in tokens]


def engine_kwargs(impl: Impl, case) -> dict:
    kw = {"k": case.k, "temperature": case.temperature, "stop_ids": tuple(case.stop_ids)}
    if case.top_k and impl.accepts("speculative_generate", "top_k"):
        kw["top_k"] = case.top_k
    if case.top_p < 1 and impl.accepts("speculative_generate", "top_p"):
        kw["top_p"] = case.top_p
    return kw


def run_engine(impl: Impl, case: EngineCase, *, check_logits: bool = False, models=None) -> EngineRun:
    """Run speculative_generate once on fresh instrumented kit models."""
    trace = Trace(check_logits=check_logits)
    target, draft = build_pair(case.target, case.draft, trace) if models is None else models(trace)
    generator = seed_everything(case.seed)
    try:
        tokens, stats = impl.functions["speculative_generate"](
            target, draft, list(case.prompt), case.max_new_tokens, generator=generator,
            **engine_kwargs(impl, case))
        tokens = normalize_tokens(tokens)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except CacheViolation as exc:
        return EngineRun(case, None, None, trace, exc)
    except Exception as exc:  # the engine's bug, reported by the property
        return EngineRun(case, None, None, trace, exc)
    return EngineRun(case, tokens, stats, trace, None)


def stats_value(stats, name: str):
    """stats[name] as a float, or None when missing or not a number."""
    if isinstance(stats, Mapping):
        value = stats.get(name)
    else:
        value = getattr(stats, name, None)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def expected_after_stops(greedy_tokens: list[int], stop_ids) -> list[int]:
    stops = set(stop_ids)
    for i, t in enumerate(greedy_tokens):
        if t in stops:
            return greedy_tokens[: i + 1]
    return list(greedy_tokens)


def first_difference(a, b) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
