"""Family "sampler": an engine's own sampler (target_generate) against the convention.

The properties and what they check: properties/checks/sampler.py. Not applicable to an engine
without target_generate.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from properties import profiles
from properties.checks.sampler import check_own_sampler
from properties.strategies import sampling_cases
from properties.test_sequence import Q_FILTERS, T_CLOSE, T_TOP_K, T_TOP_P

pytestmark = pytest.mark.family("sampler")


@pytest.mark.needs(kind="table")
@profiles.statistical(checks=1, scale=0.5)
@given(case=sampling_cases("table", length=(2, 3)))
@example(case=T_CLOSE)
@example(case=T_TOP_K)
@example(case=T_TOP_P)
def test_own_sampler_table(impl, case):
    check_own_sampler(impl, case)


@pytest.mark.needs(kind="qwen3")
@profiles.statistical(checks=1, scale=0.5)
@given(case=sampling_cases("qwen3", vocab=(4, 5), top_k=True, top_p=True))
@example(case=Q_FILTERS)
def test_own_sampler_qwen3(impl, case):
    check_own_sampler(impl, case)
