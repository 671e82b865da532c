"""Calling the implementation under test, and reporting what it got wrong.

Every property raises `PropertyFailure` with a message that names the property, the
implementation, the example's inputs (a case, seed included) and two ways to reproduce it:
the exact example through ``python -m properties.replay`` and the property through pytest.
"""

from __future__ import annotations

import copy
import math
import os
import random
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from properties import guards
from properties.cases import EngineCase
from properties.guards import EngineFault
from properties.impl import Impl
from properties.models import Trace, build_pair


class PropertyFailure(AssertionError):
    """A property of the kit does not hold for the implementation under test. `cause` is the
    first line of what went wrong (the summary groups failures of several families that share
    one cause)."""

    cause = ""


class PropertyHang(BaseException):
    """The implementation hung in a property's call (the time limit expired). A BaseException,
    so that Hypothesis does not shrink by calling the hanging engine again and again: the test
    fails at once with the case that hung."""

    cause = ""


# Calls into the implementation in this process (the summary adds them up across workers).
calls_made = 0
# The description of the last call that hung: a failure whose message carries it is a hang.
_hang_text = ""


def begin_test(nodeid: str) -> None:
    """A new kit test starts (called by the conftest)."""
    global _hang_text
    _hang_text = ""


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


# Causes named alike in every family, so that the summary groups one bug under one headline.
TOO_LONG = "the engine returns more tokens than max_new_tokens"


def too_long(outputs, max_new_tokens: int) -> str | None:
    """TOO_LONG, with the first offending output, when any output exceeds max_new_tokens."""
    for out in outputs:
        if len(out) > max_new_tokens:
            return f"{TOO_LONG} ({len(out)} for max_new_tokens={max_new_tokens}: {list(out)})"
    return None


def fail(impl: Impl, prop: str, check: str, case, message: str, cause: str | None = None):
    """Raise a PropertyFailure for property `prop` (e.g. "greedy: equivalence"). `cause`: the
    headline to group it under (default: the message's first line); give one only when the
    evidence singles it out (e.g. TOO_LONG, seen in the output itself)."""
    global _hang_text
    __tracebackhide__ = True
    kind = PropertyHang if _hang_text and _hang_text in message else PropertyFailure
    _hang_text = ""
    error = kind(f"{prop}: violated by --impl={impl.spec}\n{message.rstrip()}\n\ninputs: "
                 f"{case!r}\n{reproduction(impl, check, case)}")
    error.cause = cause or (message.strip().splitlines()[0] if message.strip() else prop)
    raise error


def temperatures(impl: Impl, choices) -> tuple:
    """The temperatures a property may draw for this implementation: temperature 0 only if it
    decodes greedily (a sampling-only engine declares KIT_NOT_APPLICABLE = {"greedy": why},
    and then no family asks it for temperature 0)."""
    if "greedy" not in impl.not_applicable:
        return tuple(choices)
    return tuple(t for t in choices if t > 0) or (1.0,)


def seed_everything(seed: int) -> torch.Generator:
    """A generator for the implementation, and the global RNGs seeded too, so that even an
    implementation that ignores `generator` replays exactly."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- calling the engine

def invoke(impl: Impl, function: str, *args, models=(), inputs=(), **kwargs):
    """Call the implementation's `function` under the kit's guards (properties.guards): a time
    limit, the weights of `models` ((role, model) pairs) and the `inputs` ((name, value)
    pairs: lists, tensors) unchanged, no global reseeding. Any misbehaviour raises EngineFault.
    KeyboardInterrupt passes through: an interrupted run is INCOMPLETE, not a failure."""
    global calls_made, _hang_text
    calls_made += 1
    fn = impl.functions[function] if function in impl.functions else getattr(impl, function)
    snapshots = [(name, copy.deepcopy(value)) for name, value in inputs]
    guards.remember(models)
    reseeds: list = []
    seconds = guards.TIMEOUT
    try:
        with guards.watch_reseeding(reseeds), guards.time_limit(seconds, function):
            value = fn(*args, **kwargs)
    except guards.KitTimeout:
        _hang_text = (f"{function} did not return within the per-call time limit of "
                      f"{seconds:g} s (--kit-timeout={seconds:g}; raise it for a slow engine)")
        raise EngineFault(_hang_text)
    except SystemExit as exc:
        raise EngineFault(f"the engine called sys.exit({exc.code!r}) inside {function}: a "
                          f"library must not end the process\n{guards.engine_traceback(exc)}")
    except (KeyboardInterrupt, MemoryError):
        raise
    except EngineFault:
        raise
    except Exception as exc:
        raise EngineFault(guards.describe_exception(function, exc)) from exc
    finally:
        changed = guards.changed_weights(models)
        if changed:
            reset_models()
    if changed:
        raise EngineFault(f"{function} modified the weights of the models it was given, in "
                          f"place: {', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''} "
                          f"(an engine must only read its models; the kit rebuilt them)")
    for name, snapshot in snapshots:
        now = dict(inputs)[name]
        if not _same(now, snapshot):
            raise EngineFault(f"{function} mutated {name} in place: it was {_short(snapshot)}, "
                              f"after the call it is {_short(now)} (the caller's input must "
                              f"stay as it was)")
    if reseeds:
        raise EngineFault(f"{function} reseeded the global RNG: {'; '.join(reseeds[:3])} (its "
                          f"sampling must come from the generator it is given, and reseeding "
                          f"the caller's global RNGs changes the caller's randomness)")
    return value


def _same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and \
            bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _short(value) -> str:
    text = repr(value.tolist() if torch.is_tensor(value) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def reset_models() -> None:
    """Forget every cached kit model and oracle result (after an engine edited weights)."""
    from properties import models as kit_models, oracle
    guards.forget_weights()
    for cached in (kit_models.qwen3_module, kit_models.qwen3_draft_module, kit_models.table_lm,
                   kit_models.table_draft_lm, kit_models.trained_pair):
        cached.cache_clear()
    oracle.clear()


def tokens_and_stats(impl: Impl, function: str, value):
    """Check that `value` is the API's (tokens, stats) and return (tokens as ints, stats)."""
    expected = ("the API expects a pair (tokens, stats): tokens a list or 1-D tensor of token "
                "ids, stats a mapping or object with rounds, acceptance_rate and "
                "tokens_per_target_call")
    if torch.is_tensor(value) or (isinstance(value, (list, tuple)) and value
                                  and all(isinstance(v, (int, np.integer)) for v in value)):
        raise EngineFault(f"{function} returned {_kind(value)} (tokens only?); {expected}")
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise EngineFault(f"{function} returned {_kind(value)}; {expected}")
    tokens, stats = value
    try:
        return normalize_tokens(tokens), stats
    except (TypeError, ValueError) as exc:
        raise EngineFault(f"{function} returned ({_kind(tokens)}, ...) whose tokens are not "
                          f"token ids ({exc}); {expected}") from None


def _kind(value) -> str:
    if torch.is_tensor(value):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple {_short(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)} items {_short(value)}"
    return f"{type(value).__name__} {_short(value)}"


# --------------------------------------------------------------------------- engine runs

@dataclass
class EngineRun:
    case: EngineCase
    tokens: list | None
    stats: object
    trace: Trace
    error: EngineFault | None

    def describe_error(self) -> str:
        return self.error.describe()


def normalize_tokens(tokens) -> list[int]:
    if torch.is_tensor(tokens):
        if tokens.dim() > 1 and tokens.shape[0] != 1:
            raise ValueError(f"a tensor of shape {tuple(tokens.shape)} is not one row of tokens")
        tokens = tokens.reshape(-1).tolist()
    return [_token(t) for t in tokens]


def _token(t) -> int:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) and not (
            torch.is_tensor(t) and t.numel() == 1 and not t.is_floating_point()):
        raise ValueError(f"{t!r} is not a token id")
    return int(t)


def engine_kwargs(impl: Impl, case) -> dict:
    """The keyword arguments of speculative_generate for `case` (its k and its sampling in the
    chapter's terms: temperature, stop_ids, and top_k / top_p where they filter and the
    implementation accepts them)."""
    s = case.sampling
    kw = {"k": case.k, "temperature": s.temperature, "stop_ids": tuple(s.stop_ids)}
    if s.top_k and impl.accepts("speculative_generate", "top_k"):
        kw["top_k"] = s.top_k
    if s.top_p < 1 and impl.accepts("speculative_generate", "top_p"):
        kw["top_p"] = s.top_p
    return kw


# Calls whose determinism is checked: the first engine call of every test is run twice.
_determinism = {"checked": set()}


def run_engine(impl: Impl, case: EngineCase, *, check_logits: bool = False, models=None,
               generator=None) -> EngineRun:
    """Run speculative_generate once on fresh instrumented kit models (seeded from the case,
    or with the given generator). The first run of each test also checks that the engine is
    deterministic (see `_check_determinism`)."""
    run = _run_once(impl, case, check_logits, models, generator)
    test = _current_test() or "outside pytest"
    if run.error is None and models is None and test not in _determinism["checked"]:
        _determinism["checked"].add(test)
        run.error = _check_determinism(impl, case)
        if run.error is not None:
            run.tokens = None
    return run


def _check_determinism(impl: Impl, case: EngineCase) -> EngineFault | None:
    """An engine must be a function of its inputs and its generator. Two runs from the same
    seeds on fresh models must agree; under sampling the probe asks for at least 24 tokens, so
    that two independent samples (an engine drawing from the clock or os.urandom) coincide
    with negligible probability."""
    probe = case
    if case.sampling.temperature > 0:
        probe = case.replace(max_new_tokens=max(case.max_new_tokens, 24), stop_ids=())
    first = _run_once(impl, probe, False, None, None)
    second = _run_once(impl, probe, False, None, None)
    if first.error is not None or second.error is not None or first.tokens == second.tokens:
        return None   # an error here is the property's own run's business
    i = first_difference(first.tokens, second.tokens)
    return EngineFault(
        f"the engine is nondeterministic: two calls with the same inputs and a generator seeded "
        f"alike (global RNGs seeded alike too) gave different outputs, first at position {i}:\n"
        f"  first:  {first.tokens}\n  second: {second.tokens}\n  (inputs of these two calls: "
        f"{probe!r})\nits randomness must come from the generator it is given")


def _run_once(impl, case, check_logits, models, generator) -> EngineRun:
    trace = Trace(check_logits=check_logits)
    target, draft = build_pair(case.target, case.draft, trace) if models is None else models(trace)
    if generator is None:
        generator = seed_everything(case.sampling.seed)
    prompt = list(case.prompt)
    try:
        with trace.active():
            value = invoke(impl, "speculative_generate", target, draft, prompt,
                           case.max_new_tokens, generator=generator,
                           models=(("target", target), ("draft", draft)),
                           inputs=(("prompt_ids", prompt),), **engine_kwargs(impl, case))
        tokens, stats = tokens_and_stats(impl, "speculative_generate", value)
    except EngineFault as exc:
        return EngineRun(case, None, None, trace, exc)
    stale = trace.foreign_use()
    if stale:
        return EngineRun(case, None, None, trace, EngineFault(stale))
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


# --------------------------------------------------------------------------- reported statistics

# An engine may accumulate its stats in float32 (a tensor on the GPU, say): each of the
# quantities involved (counts, their ratio, a running mean) is then rounded to float32, whose
# unit roundoff is 2^-24 ~ 6e-8. A ratio of two exactly counted integers below 2^24 carries one
# rounding, a running mean over n rounds at most n of them; 2^-20 ~ 9.5e-7 (16 float32 units of
# roundoff) admits a mean over 16 rounds and is still a million times finer than any count the
# kit could be off by (1 / (tokens or proposals) >= 1e-3 for the kit's runs).
STATS_RTOL = 2.0 ** -20


class StatsRounding(UserWarning):
    """A reported statistic outside its exact range by float32 rounding only: accepted, and
    reported (pytest counts these warnings) so that it never passes silently."""


def stat_in_range(name: str, value: float, low: float, high: float,
                  exact: str = "") -> str | None:
    """None when `value` lies in [low, high] up to float32 rounding (STATS_RTOL relative to the
    range's magnitude); else the problem, saying by how much and that it is more than rounding.
    A value outside by rounding only passes with a StatsRounding warning."""
    if low <= value <= high:
        return None
    scale = max(abs(low), abs(high), abs(value))
    excess = low - value if value < low else value - high
    allowed = STATS_RTOL * scale
    bounds = f"{low!r}" if low == high else f"[{low!r}, {high!r}]"
    what = f"{name} = {value!r} is outside {bounds}{exact} by {excess:.3g}"
    if excess <= allowed:
        import warnings
        warnings.warn(StatsRounding(
            f"{what} (relative {excess / scale:.2g}): float32 rounding only (tolerance "
            f"{STATS_RTOL:.2g} relative), accepted"), stacklevel=2)
        return None
    return (f"{what} (relative {excess / scale:.2g}), more than float32 rounding of the "
            f"quantities involved (tolerance {STATS_RTOL:.2g} relative)")


def law_mismatch(what: str, result, the_plan, outcomes: int, **settings) -> str:
    """The message of a failed chi-square check of sampled outputs against the exact law."""
    shown = ", ".join(f"{name}={value}" for name, value in settings.items())
    return (f"{what} are not distributed as the target's sampling ({shown}):\n"
            f"{result.summary()}\n(sample plan: {the_plan.describe()}; {outcomes} possible "
            f"outputs)")


def first_difference(a, b) -> int:
    """The first index where sequences a and b differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
