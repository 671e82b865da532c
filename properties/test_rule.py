"""Family "rule": accept_or_correct commits a token distributed exactly as p.

The properties and what they check: properties/checks/rule.py. Hypothesis draws the cases here.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.cases import PairSpec, RuleCase
from properties.checks.rule import check_rule, check_support
from properties.strategies import rule_cases

pytestmark = pytest.mark.family("rule")


@profiles.statistical(checks=3)
@given(case=rule_cases())
@example(case=RuleCase(PairSpec(6, seed=1, p_kind="dirichlet", q_kind="peaked"), seed=11))
@example(case=RuleCase(PairSpec(4, seed=0, p_kind="uniform", q_kind="peaked", relation="nested"),
                       seed=13))
@example(case=RuleCase(PairSpec(2000, seed=2, p_kind="flat", q_kind="sparse"), seed=12))
def test_committed_token_is_distributed_as_p(impl, case):
    """Rule exactness: y ~ p, P(accept) = sum(min(p, q)), rejections draw the residual."""
    check_rule(impl, case)


@profiles.deterministic(0.4)
@given(case=rule_cases(large=False))
def test_never_commits_outside_support(impl, case):
    """Cheap and deterministic, many pairs: see check_support."""
    check_support(impl, case)


def test_chapter_worked_example(impl):
    """The chapter's example p = [0.6, 0.3, 0.1], q = [0.2, 0.3, 0.5], checked like any pair."""
    check_rule(impl, RuleCase(PairSpec(3, seed=0, relation="chapter"), seed=2023))


test_chapter_worked_example.kit_fixed_checks = 3  # for the alpha budget (tests/test_statistics.py)
