"""The kit's self-test material: correct speculative decoders and deliberately broken ones.

    engine.Speculator          a correct engine made of small overridable hooks
    independent                a second correct engine, plain functions, different style
    catalogue.MUTANTS          Speculator subclasses, one realistic bug each, with `caught_by`
                               naming the property family that must reject it
    catalogue.CORRECT          [Speculator] (classes; instantiate with no arguments)
    catalogue.CORRECT_MODULES  [independent] (modules exposing the same API)
    catalogue.correct_implementations()  ready-to-use correct objects

See README.md in this folder for the table of mutants.
"""

from tests.mutants.catalogue import (CORRECT, CORRECT_MODULES, FAMILIES, MUTANTS,
                                     correct_implementations)
from tests.mutants.engine import Speculator

__all__ = ["CORRECT", "CORRECT_MODULES", "FAMILIES", "MUTANTS", "Speculator",
           "correct_implementations"]
