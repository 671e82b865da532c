"""Family "cache": the engine keeps both caches holding exactly the committed sequence.

The kit's models record every call and truncate (properties.models), and
properties.invariants rebuilds what each cache held at every moment. Checked here:

* at the top of every round both caches hold exactly the committed sequence minus its newest
  token (see properties.invariants for how rounds are delimited from the outside);
* a truncate never grows a cache;
* rolled-back entries never influence later logits: every call's logits equal those of a fresh
  prefill of the tokens the cache holds;
* the kit's caches themselves: a Hypothesis state machine appends, truncates and compares
  with a fresh prefill.

Engines that never create caches through ``model.new_cache`` (the fast engine keeps its own)
are not applicable here.
"""

from __future__ import annotations

import pytest
from properties.cases import EngineCase
from properties.harness import fail, run_engine
from properties.invariants import analyse
from properties.models import (CacheViolation)

KINDS = ("table", "qwen3")
CHECK = "properties.checks.cache:check_cache_invariant"


def _not_applicable_unless_cached(impl, run):
    if run.error is None and not run.trace.used_caches():
        pytest.skip(f"not applicable: --impl={impl.spec} never created a cache through "
                    f"model.new_cache (it keeps its own), so the kit cannot see its caches")


def check_cache_invariant(impl, case: EngineCase, check_logits: bool = True):
    prop = "cache: every model call sees the committed sequence (and the round's proposals)"
    run = run_engine(impl, case, check_logits=check_logits)
    _not_applicable_unless_cached(impl, run)
    tokens = run.tokens
    if tokens is None:
        # the engine failed; the trace usually says why (e.g. a cache that kept rolled-back
        # entries overflowing its capacity): report the first broken invariant if there is one
        analysis = analyse(run.trace, case.prompt, [])
        partial = analysis.problem if isinstance(run.error, CacheViolation) else None
        fail(impl, prop, CHECK, case, (partial + "\n" if partial else "") + run.describe_error()
             + f"\n  the engine's calls up to the error (most recent last):\n{run.trace.tail()}")
    analysis = analyse(run.trace, case.prompt, tokens)
    if analysis.problem is not None:
        fail(impl, prop, CHECK, case, f"{analysis.problem}\n  (output: {tokens})")
    logit_problems = [v for v in run.trace.violations if "fresh prefill" in v]
    if logit_problems:
        fail(impl, "cache: rolled-back entries never influence later logits", CHECK, case,
             logit_problems[0])
