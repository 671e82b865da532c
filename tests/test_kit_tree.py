"""The kit's self-test for the "tree" family: it must reject every tree mutant
(tests/mutants/tree.py) and pass the correct tree engines (the reference, the fast engine and
the mutants' own correct base engine).

Each check runs the tree family the way a user would, in a subprocess, and reads the
per-family summary (see tests/test_kit_selftest.py); mutants stop at the first failure (-x).
"""

from __future__ import annotations

import pytest

from tests.mutants import tree as tree_mutants
from tests.test_kit_selftest import run_kit

CORRECT = ["reference", "fast", "tests/mutants/tree.py:TreeSpeculator"]
PATHS = ["properties/test_tree.py"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [cls.__name__ for cls in tree_mutants.MUTANTS])
def test_tree_family_rejects_mutant(name, tmp_path):
    assert getattr(tree_mutants, name).caught_by == "tree"
    proc, data = run_kit(f"tests/mutants/tree.py:{name}", PATHS, tmp_path, "-x")
    entry = data["families"]["tree"]
    assert entry["failed"] > 0, (
        f"the tree family did not reject {name}: {entry}\n{proc.stdout[-3000:]}")
    assert proc.returncode == 1


@pytest.mark.parametrize("spec", CORRECT)
def test_tree_family_passes_correct_engine(spec, tmp_path):
    proc, data = run_kit(spec, PATHS, tmp_path)
    entry = data["families"]["tree"]
    assert entry["failed"] == 0, f"false alarm on --impl={spec}: {entry}\n{proc.stdout[-4000:]}"
    assert entry["passed"] > 0, (spec, entry)
    assert proc.returncode == 0, proc.stdout[-4000:]
