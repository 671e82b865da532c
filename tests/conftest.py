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


@pytest.fixture(scope="session")
def native_kernel():
    """fast/native.py's compiled CPU kernels. Where they cannot run (not x86-64 with AVX2) the
    test is skipped, saying why; where they can, a failed build is a failure, not a skip (g++
    is part of the set-up)."""
    from fast import native
    reason = native.unsupported()
    if reason is not None:
        pytest.skip(f"the CPU kernels cannot run here: {reason}")
    module = native.kernel()
    assert module is not None, f"fast/native.py did not build: {native.failure()}"
    return module
