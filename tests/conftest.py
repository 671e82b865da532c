"""Set-up shared by the tests in this folder."""

import pytest

from fast.testing import one_thread


@pytest.fixture(autouse=True, scope="module")
def _fast_engine_tests_on_one_thread(request):
    """The fast engine's tests run on one intra-op thread, restored afterwards: on a shared
    2-core machine a second OpenMP thread made the tiny model's kernels 10x slower (see
    BENCHMARKS.md)."""
    if request.module.__name__.rpartition(".")[2].startswith("test_fast_"):
        with one_thread():
            yield
    else:
        yield
