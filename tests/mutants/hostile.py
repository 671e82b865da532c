"""Hostile engines: they break the rules of the call, not (only) the mathematics.

A catalogue mutant (`catalogue.py`) is lossy and a property family must say so. The engines
here produce the right tokens, or none at all, and do something else a conformance kit must
not let through: they change the models they were lent, the caller's prompt or the global
random state, reuse a cache from an earlier call, ignore the seed, hang, exit the process,
raise, or return the wrong shape. Each docstring says what it does and the verdict the kit
must give; tests/test_kit_hostile.py holds the kit to it.

Every engine is a class with the chapter's API (instantiated with no arguments):

    python -m pytest properties/test_greedy.py --impl=tests/mutants/hostile.py:ClampsWeights

Engines that hang (and, for the Ctrl-C test, say so) write the file named by the environment
variable KIT_HOSTILE_MARK, when it is set, just before they start hanging.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np
import torch

from tests.mutants.catalogue import TinyTemperatureGreedy
from tests.mutants.engine import Speculator

MARK_ENV = "KIT_HOSTILE_MARK"


def _announce_hang() -> None:
    """Tell a waiting test that the engine is now inside its hang."""
    path = os.environ.get(MARK_ENV)
    if path:
        with open(path, "w") as file:
            file.write(f"{os.getpid()}\n")


# ============================================================== the models and the caller's state
class ClampsWeights(Speculator):
    """Clamps every target parameter to [-0.01, 0.01] in place, then decodes.

    An engine "simulating quantization" on the weights it was lent. The target is no longer
    the model the caller owns; every later user of it sees other logits. Verdict: NOT
    CONFORMANT, a failure saying the engine modified the weights and naming the parameter.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        with torch.no_grad():
            for weight in target.parameters():
                weight.clamp_(-0.01, 0.01)
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, **kwargs)


class MutatesPrompt(Speculator):
    """Appends its output to the caller's prompt_ids list (right tokens, returned as usual).

    "Extending the context in place" saves a copy and corrupts the caller's list: a caller
    that reuses its prompt now sends prompt + output. Verdict: NOT CONFORMANT, a failure
    saying the engine mutated prompt_ids.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        tokens, stats = super().speculative_generate(target, draft, prompt_ids, max_new_tokens,
                                                     **kwargs)
        prompt_ids.extend(tokens)
        return tokens, stats


class _Reseeds(Speculator):
    """Base: reseed one global generator "for reproducibility", then decode with `generator`."""

    def reseed(self) -> None:
        raise NotImplementedError

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        self.reseed()
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, **kwargs)


class ReseedsTorch(_Reseeds):
    """Calls torch.manual_seed(0) inside the call (its own draws use `generator`).

    The caller's torch random stream restarts at seed 0 after every call: two "independent"
    dropout masks or samples taken around it repeat. Verdict: NOT CONFORMANT, a failure
    saying the engine reseeded the global RNG.
    """

    def reseed(self):
        torch.manual_seed(0)


class ReseedsPython(_Reseeds):
    """Calls random.seed(0) inside the call. Verdict: as ReseedsTorch."""

    def reseed(self):
        random.seed(0)


class ReseedsNumpy(_Reseeds):
    """Calls np.random.seed(0) inside the call. Verdict: as ReseedsTorch."""

    def reseed(self):
        np.random.seed(0)


class _PooledTarget:
    """The target as the engine sees it: new_cache hands out a cache kept from an earlier
    call when it is large enough (truncated to 0), else a new one that is then kept."""

    def __init__(self, model, pool: dict):
        self.model, self.pool = model, pool

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, ids, cache, *args, **kwargs):
        return self.model(ids, cache, *args, **kwargs)

    def new_cache(self, batch, capacity):
        kept = self.pool.get("target")
        if kept is not None and kept.capacity >= capacity:
            kept.truncate(0)
            return kept
        self.pool["target"] = self.model.new_cache(batch, capacity)
        return self.pool["target"]


_CACHE_POOL: dict = {}  # module-level on purpose: it outlives the call that filled it


class KeepsCacheAcrossCalls(Speculator):
    """Keeps the target's cache in a module-level pool and reuses it in later calls.

    A "cache pool" that skips an allocation per request: from the second call on, the target
    is fed through a cache the engine did not create in this call (it belongs to the model of
    an earlier call). Verdict: NOT CONFORMANT, a failure saying the engine used a cache it
    did not create / a cache from an earlier call.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        return super().speculative_generate(_PooledTarget(target, _CACHE_POOL), draft,
                                            prompt_ids, max_new_tokens, **kwargs)


# ============================================================== randomness and time
class UrandomSampling(Speculator):
    """Ignores `generator`: every call samples from a generator seeded by os.urandom.

    Its samples are distributed exactly right, but the same seed gives other tokens on every
    run, so no result replays. Greedy output is unaffected. Verdict: NOT CONFORMANT, a
    failure saying the engine is nondeterministic given the same seeded generator.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        kwargs["generator"] = torch.Generator().manual_seed(
            int.from_bytes(os.urandom(8), "little"))
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, **kwargs)


class ClockSeededSampling(Speculator):
    """Ignores `generator`: every call samples from a generator seeded by the clock
    (time.perf_counter_ns). Verdict: as UrandomSampling ("nondeterministic")."""

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        kwargs["generator"] = torch.Generator().manual_seed(time.perf_counter_ns())
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, **kwargs)


class SpinsWhenKAtLeast2(Speculator):
    """Busy-waits forever (`while True: pass`) whenever k >= 2; correct for k = 1.

    A wait for a draft worker that this engine never started. Verdict: with
    --kit-timeout=SECONDS, NOT CONFORMANT: a failure of the property that called it, saying
    the call exceeded the time limit (--kit-timeout) and naming the case.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4, **kwargs):
        if k >= 2:
            _announce_hang()
            while True:
                pass
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k=k,
                                            **kwargs)


class SleepsWhenKAtLeast2(Speculator):
    """Sleeps for 10**6 seconds whenever k >= 2; correct for k = 1.

    A blocking wait, interruptible by signals (unlike SpinsWhenKAtLeast2's loop, which holds
    the interpreter). Verdict: as SpinsWhenKAtLeast2; interrupted by Ctrl-C, the run's verdict
    is INCOMPLETE.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, k=4, **kwargs):
        if k >= 2:
            _announce_hang()
            time.sleep(10**6)
        return super().speculative_generate(target, draft, prompt_ids, max_new_tokens, k=k,
                                            **kwargs)


# ============================================================== leaving the call the wrong way
class ExitsWithSysExit(Speculator):
    """Calls sys.exit(0) inside the call (a leftover "stop here" from debugging).

    SystemExit is an exception: the kit catches it as the engine's failure. Verdict: NOT
    CONFORMANT, a failure saying the engine called sys.exit.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        sys.exit(0)


class ExitsWithOsExit(Speculator):
    """Calls os._exit(0) inside the call: the process ends at once with status 0, no cleanup.

    Nothing in the process can report this. Verdict: the JSON summary written at the start of
    the session stays as it was, verdict "INCOMPLETE" (never a pass), whatever the exit status.
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        sys.stdout.flush()
        os._exit(0)


class BonusIndexError(Speculator):
    """Reads the bonus token from row k + 1 of the verify logits, which has k + 1 rows.

    An off-by-one in the bonus path: the engine raises IndexError on every fully accepted
    round and is right otherwise. Verdict: NOT CONFORMANT; the failure (and its replay)
    says the engine raised and shows the engine's traceback, this file and the line below.
    """

    def finish_block(self, new_tokens, logits, k, s, generator):
        row = logits[k + 1]  # BONUS-INDEX-ERROR: the line the kit's traceback must show
        new_tokens.append(self.bonus_token(row, s, generator))


class ReturnsTokensOnly(Speculator):
    """Returns the token list alone, without the stats mapping.

    Verdict: NOT CONFORMANT; the failure says what the engine returned (a list) and that the
    API expects (tokens, stats), not that "the engine raised TypeError".
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        tokens, _ = super().speculative_generate(target, draft, prompt_ids, max_new_tokens,
                                                 **kwargs)
        return tokens


class ReturnsThreeTuple(Speculator):
    """Returns (tokens, stats, timings): one element more than the API's (tokens, stats).

    Verdict: as ReturnsTokensOnly (the failure says it returned a 3-tuple).
    """

    def speculative_generate(self, target, draft, prompt_ids, max_new_tokens, **kwargs):
        start = time.perf_counter()
        tokens, stats = super().speculative_generate(target, draft, prompt_ids, max_new_tokens,
                                                     **kwargs)
        return tokens, stats, {"seconds": time.perf_counter() - start}


HOSTILE = [ClampsWeights, MutatesPrompt, ReseedsTorch, ReseedsPython, ReseedsNumpy,
           KeepsCacheAcrossCalls, UrandomSampling, ClockSeededSampling, SpinsWhenKAtLeast2,
           SleepsWhenKAtLeast2, ExitsWithSysExit, ExitsWithOsExit, BonusIndexError,
           ReturnsTokensOnly, ReturnsThreeTuple]

__all__ = ["HOSTILE", "MARK_ENV", "TinyTemperatureGreedy", *[c.__name__ for c in HOSTILE]]
