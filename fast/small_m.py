"""Matrix products with few rows on the CPU: the decode step's and the verify's matmuls.

`linear(x, w)` is F.linear(x, w) (no bias). Where x is float32 on an x86-64 CPU with AVX2 and
FMA and has at most 64 rows in all (a decode step or a verify of a batch of up to 8, a short
prefill), it runs fast/small_m.cpp (built by fast/native.py); otherwise, or when the
kernel is off or cannot be built, it is F.linear.

Why a kernel of our own: the BLAS in torch's CPU build runs a [5, K] x [K, N] product in about 3x
the time of [1, K] x [K, N] on this project's CPUs (BENCHMARKS.md, issue 24), so a verify of 5
tokens costs about 3 decode steps however large the target; the kernel reads each weight once
for all rows (with more than 3 rows, a panel of weights at a time for every row, so 40 rows
still read them once). It is also batch invariant: a row's result does not depend on the other rows
(fast/small_m.cpp), so every matmul of a verify gives each token the row a decode step of that
token would get, bit for bit.

Switches: the environment variable FAST_SMALL_M=0 turns it off for the process (FAST_NATIVE=0
turns off every CPU kernel); `enabled(False)` is a context manager for a block of code (the
benchmarks time both sides with it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fast import native

_switch = native.Switch("FAST_SMALL_M")


def is_enabled() -> bool:
    return _switch.on


def enabled(on: bool):
    """Use the kernel (True) or F.linear (False) inside the block."""
    return _switch.enabled(on)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w[N, K].T -> [..., N]; the kernel where it applies (module docstring).

    The kernel checks its own contract and answers None where it does not apply (so it never
    throws, and the checks cost a few nanoseconds in C++ rather than microseconds here)."""
    if _switch.on:
        module = _module or _load()
        if module is not None:
            y = module.linear(x, w)
            if y is not None:
                return y
    return F.linear(x, w)


_module = None


def _load():
    global _module
    _module = native.kernel()
    return _module
