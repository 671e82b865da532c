"""The fast engine's CPU kernels, compiled on first use: fast/small_m.cpp (matmuls with few
rows), fast/fused.cpp (a step's decoder layers in one call), fast/rejection.cpp (a round's
speculative sampling decisions) and fast/lookup.cpp (prompt lookup's search), bound in
fast/native.cpp.

Built with torch's C++ extension builder (g++ and torch's headers; 30-40 s once on 2 cores, then
cached under torch's extensions folder, keyed on the sources and flags) on an x86-64 CPU with
AVX2 and FMA. Where that is not the machine, or the build fails, `kernel()` is None after one
warning saying why, and every caller uses its torch version (as with FAST_NATIVE=0 in the
environment). The sampling and lookup kernels give bit for bit what their tensor versions give
(tests/test_fast_native.py, tests/test_fast_lookup.py); the matmul kernel is within float32 rounding of F.linear and
batch invariant (tests/test_fast_small_m.py); the kit judges the engine with and without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).parent
# native.cpp includes the kernels' files (one translation unit); they are listed as well so
# that a change to any of them gives the build a new version
SOURCES = [HERE / "native.cpp"]
INCLUDED = [HERE / "small_m.cpp", HERE / "rejection.cpp", HERE / "lookup.cpp", HERE / "fused.cpp"]
# No floating-point contraction: the kernels' FMAs are their own intrinsics, and nothing else
# may be fused, or an operation order (which the tests hold to the bit) would be the compiler's.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp"]

class Switch:
    """An on/off switch for one kernel: on unless the environment variable says "0"; `enabled(on)`
    sets it for a block of code (the benchmarks time both sides with it)."""

    def __init__(self, variable: str):
        self.on = os.environ.get(variable, "1") != "0"

    @contextlib.contextmanager
    def enabled(self, on: bool):
        if not isinstance(on, bool):
            raise TypeError(f"enabled(on): on must be True or False, got {on!r}")
        before, self.on = self.on, on
        try:
            yield
        finally:
            self.on = before


_built: dict = {}
_lock = threading.Lock()


def unsupported() -> str | None:
    """Why the kernels cannot run on this machine, or None when they can."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernels are AVX2 code for x86-64; this machine is {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"the CPU lacks AVX2 and FMA (torch reports capability {capability})"
    return None


def failure() -> str | None:
    """Why `kernel()` is None (after it was called), or None."""
    return _built.get("reason")


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH. The project's dependency `ninja` (pip) puts it
    beside the interpreter, which is not on PATH when a virtualenv's python is run directly
    (.venv/bin/python -m pytest): add that directory, only when no ninja is found."""
    if shutil.which("ninja") is None:
        here = str(Path(sys.executable).parent)
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def kernel():
    """The compiled extension module, building it on first use; None if it cannot run here."""
    with _lock:
        if "module" not in _built:
            _built["module"] = None
            if os.environ.get("FAST_NATIVE", "1") == "0":
                return None
            reason = unsupported()
            if reason is None:
                try:
                    _ninja_on_path()
                    from torch.utils.cpp_extension import load
                    # the included files' digest among the flags: a change to any of them
                    # is a new build, as a change to native.cpp itself is
                    digest = hashlib.sha256(b"".join(f.read_bytes() for f in INCLUDED)).hexdigest()
                    _built["module"] = load("fast_native", [str(s) for s in SOURCES],
                                            extra_cflags=CFLAGS + [f"-DFAST_NATIVE_INCLUDED={digest[:16]}"],
                                            extra_ldflags=["-fopenmp"], verbose=False)
                except Exception as error:  # no compiler, no headers: the engine still runs
                    reason = f"building {', '.join(s.name for s in SOURCES)} failed: {str(error).strip()[:500]}"
            if reason is not None:
                _built["reason"] = reason
                warnings.warn(f"fast.native: using torch's operations instead of the CPU kernels "
                              f"({reason})", RuntimeWarning, stacklevel=3)
        return _built["module"]
