"""Matrix products with few rows on the CPU: the decode step's and the verify's matmuls.

`linear(x, w)` is F.linear(x, w) (no bias). Where x is float32 on an x86-64 CPU with AVX2 and
FMA and has at most 8 rows in all (a decode step of up to 8 sequences, a verify of k + 1 <= 8
tokens of one), it runs fast/small_m.cpp, compiled on first use with torch's C++ extension
builder (g++, about 40 s once; cached under torch's extensions folder); otherwise, or when the
kernel is off or cannot be built, it is F.linear.

Why a kernel of our own: the BLAS in torch's CPU build runs a [5, K] x [K, N] product in about 3x
the time of [1, K] x [K, N] on this project's CPUs (BENCHMARKS.md, issue 24), so a verify of 5
tokens costs about 3 decode steps however large the target; the kernel reads each weight once
for all rows. It is also batch invariant: a row's result does not depend on the other rows
(fast/small_m.cpp), so a verify's logits equal, bit for bit, what decode steps of the same
tokens give.

Switches: the environment variable FAST_SMALL_M=0 turns it off for the process; `enabled(False)`
is a context manager for a block of code (the benchmarks time both sides with it).
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_ROWS = 8
SOURCE = Path(__file__).with_name("small_m.cpp")
# No floating-point contraction: the kernel's FMAs are its own intrinsics, and nothing else may
# be fused, or a row's operation order would depend on how the compiler treated each variant.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp"]

_state = {"on": os.environ.get("FAST_SMALL_M", "1") != "0"}
_built: dict = {}
_lock = threading.Lock()


def unsupported() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is AVX2 code for x86-64; this machine is {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"the CPU lacks AVX2 and FMA (torch reports capability {capability})"
    return None


def kernel():
    """The compiled extension module, building it on first use; None if it cannot run here (a
    warning says why, once)."""
    with _lock:
        if "module" not in _built:
            _built["module"] = None
            reason = unsupported()
            if reason is None:
                try:
                    from torch.utils.cpp_extension import load
                    _built["module"] = load("fast_small_m", [str(SOURCE)], extra_cflags=CFLAGS,
                                            extra_ldflags=["-fopenmp"], verbose=False)
                except Exception as error:  # no compiler, no headers: the engine still runs
                    reason = f"building {SOURCE.name} failed: {str(error).strip()[:500]}"
            if reason is not None:
                _built["reason"] = reason
                warnings.warn(f"fast.small_m: using F.linear for few-row products ({reason})",
                              RuntimeWarning, stacklevel=3)
        return _built["module"]


def is_enabled() -> bool:
    return _state["on"]


@contextlib.contextmanager
def enabled(on: bool):
    """Use the kernel (True) or F.linear (False) inside the block."""
    if not isinstance(on, bool):
        raise TypeError(f"enabled(on): on must be True or False, got {on!r}")
    before = _state["on"]
    _state["on"] = on
    try:
        yield
    finally:
        _state["on"] = before


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w[N, K].T -> [..., N]; the kernel where it applies (module docstring)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not (_state["on"] and 1 <= rows <= MAX_ROWS and x.dtype == torch.float32
            and w.dtype == torch.float32 and x.device.type == "cpu" and w.device.type == "cpu"
            and not x.requires_grad and not w.requires_grad):
        return F.linear(x, w)
    module = kernel()
    if module is None:
        return F.linear(x, w)
    flat = x.reshape(rows, x.shape[-1])
    y = module.linear(flat if flat.is_contiguous() else flat.contiguous(),
                      w if w.is_contiguous() else w.contiguous())       # [rows, N]
    return y.view(*x.shape[:-1], w.shape[0])
