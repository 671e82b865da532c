"""A correct engine whose KIT_NOT_APPLICABLE names a family that does not exist ("greedyy").

A typo here would otherwise silently switch nothing off, or, worse, be read as switching the
wrong thing off. Verdict: a usage error (pytest exit status 4) naming "greedyy" and the kit's
families, before any test runs.
"""

from tests.mutants.engine import Speculator

KIT_NOT_APPLICABLE = {"greedyy": "the typo this module exists for"}

_engine = Speculator()

accept_or_correct = _engine.accept_or_correct
speculative_generate = _engine.speculative_generate
