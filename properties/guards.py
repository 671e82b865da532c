"""What the kit guards around every call into the implementation under test.

A conformance verdict is only worth something if the implementation cannot tamper with the
evidence. The kit's models, its reference computations and its randomness live in the same
process as the engine, so every call runs under these guards:

* a time limit (``--kit-timeout``, default TIMEOUT seconds): an engine that hangs fails the
  property with the case, instead of hanging the run;
* the weights of the models it was given: compared with a copy taken when the kit first saw
  them; an engine that edits
  them fails, naming the parameter, and the kit rebuilds its models so that no later check (the
  greedy reference among them) uses edited weights (the table models' tables are read-only
  arrays, so an edit there raises inside the engine);
* its inputs (the prompt list, p and q): compared with a copy afterwards;
* the global RNGs: an engine that reseeds torch / random / numpy fails (the kit seeds them for
  replay; a reseed makes the engine's sampling ignore the generator it is given);
* exceptions: shown with the engine's own traceback (file and line), the kit's frames left out;
  ``sys.exit`` inside the engine is a failure, not the end of the run.

The guards raise `EngineFault`; the properties turn it into a failure of the property that made
the call, with the case and a replay line.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import traceback
from pathlib import Path

import numpy as np
import torch

TIMEOUT = 300.0          # seconds per call; --kit-timeout changes it
_KIT_DIR = Path(__file__).resolve().parent


class EngineFault(Exception):
    """The implementation misbehaved during a call: it raised, hung, returned the wrong thing,
    or broke the kit's isolation. `describe()` says what, for the failure message."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def describe(self) -> str:
        return self.text


class KitTimeout(BaseException):
    """Raised inside the engine when its time is up. A BaseException, so that an engine's
    `except Exception` cannot swallow it."""


# --------------------------------------------------------------------------- time limit

@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """Interrupt the block after `seconds` (main thread only: elsewhere no limit applies)."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise KitTimeout(what)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- RNG reseeding

_SEEDERS = ((torch, "manual_seed"), (torch, "seed"), (torch.random, "manual_seed"),
            (torch.random, "seed"), (random, "seed"), (np.random, "seed"),
            (torch.cuda, "manual_seed"), (torch.cuda, "manual_seed_all"))


@contextlib.contextmanager
def watch_reseeding(calls: list):
    """Record (into `calls`) every global-RNG seeding function the block calls, except torch
    seeds inside `torch.random.fork_rng` (restored when it exits: nothing changes for the
    caller). The seeding functions still work: the point is to report the reseed."""
    originals = []
    forked = [0]     # depth of torch.random.fork_rng blocks entered by the engine
    for owner, name in _SEEDERS:
        fn = getattr(owner, name, None)
        if fn is None:
            continue
        label = f"{'torch.cuda' if owner is torch.cuda else owner.__name__}.{name}"
        contained = owner in (torch, torch.random, torch.cuda)

        def recorder(*args, _fn=fn, _label=label, _contained=contained, **kwargs):
            if not (_contained and forked[0]):
                shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
                calls.append(f"{_label}({shown})")
            return _fn(*args, **kwargs)

        originals.append((owner, name, fn))
        setattr(owner, name, recorder)
    fork_rng = torch.random.fork_rng

    @contextlib.contextmanager
    def counted_fork_rng(*args, **kwargs):
        with fork_rng(*args, **kwargs):
            forked[0] += 1
            try:
                yield
            finally:
                forked[0] -= 1

    originals.append((torch.random, "fork_rng", fork_rng))
    torch.random.fork_rng = counted_fork_rng
    before_seed = torch.initial_seed()
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        if not calls and torch.initial_seed() != before_seed:
            calls.append(f"torch's global seed changed from {before_seed} to "
                         f"{torch.initial_seed()}")


# --------------------------------------------------------------------------- weights

def _owner(model):
    module = getattr(model, "module", None)
    return module if isinstance(module, torch.nn.Module) else model


def _owner_and_tensors(model):
    """The object that owns a kit model's weights, and its (name, tensor) pairs."""
    module = getattr(model, "module", None)
    if isinstance(module, torch.nn.Module):
        return module, list(module.state_dict(keep_vars=True).items())
    # (the table models' tables are read-only arrays: writing to them raises in the engine)
    try:
        return model, [(f"parameter {i}", p) for i, p in enumerate(model.parameters())]
    except (AttributeError, TypeError):
        return model, []


# id(owner) -> (owner, [(name, live tensor, pristine copy)]): each weight as first seen
_PRISTINE: dict[int, tuple] = {}


def remember(models) -> None:
    """Copy the weights of `models` ((role, model) pairs) the first time the kit sees them,
    before any call into the implementation."""
    for _, model in models:
        owner = _owner(model)
        seen = _PRISTINE.get(id(owner))
        if seen is None or seen[0] is not owner:
            # (listing the tensors costs a state_dict walk: only for an owner not seen before)
            _, tensors = _owner_and_tensors(model)
            _PRISTINE[id(owner)] = (owner, [(name, t, t.detach().clone()) for name, t in tensors])


def changed_weights(models) -> list[str]:
    """The weights of `models` that differ from their pristine copies (role: name)."""
    changed = []
    for role, model in models:
        owner, now = _owner_and_tensors(model)
        entry = _PRISTINE.get(id(owner))
        if entry is None or entry[0] is not owner:
            continue  # never remembered: nothing to compare with
        seen = entry[1]
        # a parameter replaced by another tensor (not edited in place) also changes the weights
        if len(now) != len(seen) or any(a is not b for (_, a), (_, b, _) in zip(now, seen)):
            replaced = [name for (name, a), (_, b, _) in zip(now, seen) if a is not b]
            changed.extend(f"{role}: {name} (replaced)" for name in replaced or ["(structure)"])
            continue
        for name, live, copy in seen:
            if live.shape != copy.shape or not torch.equal(live.detach(), copy):
                changed.append(f"{role}: {name}")
    return changed


def forget_weights() -> None:
    _PRISTINE.clear()


# --------------------------------------------------------------------------- tracebacks

def engine_traceback(exc: BaseException, limit: int = 8) -> str:
    """The exception's traceback from the engine's entry point on: the kit's frames that lead
    to the call are left out (frames inside the kit's models, called back by the engine, stay:
    they say which model call the engine got wrong)."""
    frames = list(traceback.extract_tb(exc.__traceback__))
    while frames and _is_kit_caller(frames[0].filename):
        frames.pop(0)
    if not frames:
        return ""
    shown = frames[-limit:]
    lines = ["  traceback (most recent call last; the kit's frames left out):"]
    if len(frames) > len(shown):
        lines.append(f"    ... {len(frames) - len(shown)} earlier frames")
    for f in shown:
        lines.append(f'    File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"      {f.line.strip()}")
    return "\n".join(lines)


def describe_exception(function: str, exc: BaseException) -> str:
    text = f"the engine raised {type(exc).__name__}: {exc}" if str(exc) else \
        f"the engine raised {type(exc).__name__}"
    text += f" (in {function})"
    tb = engine_traceback(exc)
    return f"{text}\n{tb}" if tb else text


def _is_kit_caller(filename: str) -> bool:
    path = Path(filename).resolve()
    return path.parent == _KIT_DIR and path.name in _CALLERS or path.parent == _KIT_DIR / "checks" \
        or "contextlib" in path.name


_CALLERS = {"harness.py", "guards.py", "replay.py"}


def set_timeout(seconds: float) -> None:
    """--kit-timeout: seconds per call into the implementation (0: no limit)."""
    if not seconds >= 0:
        raise ValueError(f"--kit-timeout must be a number of seconds >= 0, got {seconds!r}")
    global TIMEOUT
    TIMEOUT = float(seconds)
