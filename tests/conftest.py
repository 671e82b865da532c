"""Set-up shared by the tests in this folder."""

import os

import pytest

from fast.testing import one_thread

# Many tests start Python afresh: the kit run as a user runs it (tests/test_kit_selftest.py and
# its kin), the launcher, fake servers, the findings' scripts. Where PYTHONDONTWRITEBYTECODE is
# set (as on this project's machines), none of them left byte code for the next, so each compiled
# the project again (about 700 compilations) and pytest rewrote its asserts again: a kit
# subprocess took 5.2 s to collect properties/, 3.3 s with the byte code kept (2026-12-07). Their
# byte code goes where Python keeps it by default (__pycache__, ignored by git); an installed
# package's own byte code, written at install, is read either way.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """Every test module here runs on one intra-op thread, restored afterwards: the models are
    tiny, and on a shared 2-core machine a second OpenMP thread made their kernels 10x slower
    (see BENCHMARKS.md); pytest-xdist workers run on one anyway (conftest.py), so a run without
    workers sees the same numerics and costs."""
    with one_thread():
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
