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

# The reference and the fast engine run the whole kit, tree family included, in make test's own
# kit runs (dev profile); here only the mutants' correct base engine.
CORRECT = ["tests/mutants/tree.py:TreeSpeculator"]
PATHS = ["properties/test_tree.py"]

# The tree family is sized for TV 0.05: each mutant's kit run takes minutes, so these are
# extras (make test-extra), outside make test's 20-minute budget.
pytestmark = [pytest.mark.slow, pytest.mark.extra]


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


def test_deep_tree_cases_reach_their_deep_levels():
    """The deep greedy cases (properties.strategies.deep_tree_cases) reach depth 4 in most
    cases: measured over 100 derandomized draws by the engine-independent walk
    properties.checks.tree.greedy_depths (77 of 100 reach depth 4 at least once)."""
    from collections import Counter

    from hypothesis import Phase, given, settings

    from properties.checks.tree import greedy_depths
    from properties.strategies import deep_tree_cases

    deepest = []

    @settings(derandomize=True, max_examples=100, database=None, phases=[Phase.generate],
              deadline=None)
    @given(case=deep_tree_cases())
    def collect(case):
        deepest.append(max(greedy_depths(case), default=0))

    collect()
    reach = Counter(deepest)
    assert len(deepest) == 100
    assert sum(n for d, n in reach.items() if d >= 4) >= 60, reach
