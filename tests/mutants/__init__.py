"""The kit's self-test material: correct speculative decoders and deliberately broken ones.

    engine.Speculator          a correct engine made of small overridable hooks
    independent                a second correct engine, plain functions, different style
    catalogue.MUTANTS          Speculator subclasses, one realistic bug each, with `caught_by`
                               naming the property family that must reject it
    catalogue.CORRECT          [Speculator] (classes; instantiate with no arguments)
    catalogue.CORRECT_MODULES  [independent] (modules exposing the same API)
    catalogue.correct_implementations()  ready-to-use correct objects
    alternative.ALTERNATIVE    two more correct engines with other round layouts (the first
                               token from the prefill; the prefill merged with the first verify)
    hostile.HOSTILE            engines that break the rules of the call (weights, prompt, global
                               RNGs, stale caches, nondeterminism, hangs, exits, wrong returns)
    misnamed, not_applicable_typo, sampling_only   modules whose shape is the point

See README.md in this folder for the tables of mutants, alternative and hostile engines.
"""

from tests.mutants.catalogue import (CORRECT, CORRECT_MODULES, FAMILIES, MUTANTS,
                                     correct_implementations)
from tests.mutants.engine import Speculator

__all__ = ["CORRECT", "CORRECT_MODULES", "FAMILIES", "MUTANTS", "Speculator",
           "correct_implementations"]
