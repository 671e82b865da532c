"""Matrix products with few rows on the CPU: the decode step's and the verify's matmuls.

`linear(x, w)` is F.linear(x, w) (no bias). Where x is float32 on an x86-64 CPU with AVX2 and
FMA and has at most 8 rows in all (a decode step of up to 8 sequences, a verify of k + 1 <= 8
tokens of one), it runs fast/small_m.cpp (built by fast/native.py); otherwise, or when the
kernel is off or cannot be built, it is F.linear.

Why a kernel of our own: the BLAS in torch's CPU build runs a [5, K] x [K, N] product in about 3x
the time of [1, K] x [K, N] on this project's CPUs (BENCHMARKS.md, issue 24), so a verify of 5
tokens costs about 3 decode steps however large the target; the kernel reads each weight once
for all rows. It is also batch invariant: a row's result does not depend on the other rows
(fast/small_m.cpp), so every matmul of a verify gives each token the row a decode step of that
token would get, bit for bit.

Switches: the environment variable FAST_SMALL_M=0 turns it off for the process (FAST_NATIVE=0
turns off every CPU kernel); `enabled(False)` is a context manager for a block of code (the
benchmarks time both sides with it).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

from fast import native

MAX_ROWS = 8

_state = {"on": os.environ.get("FAST_SMALL_M", "1") != "0"}


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
    # the kernel's whole contract, checked here so that it never has to refuse (an exception
    # thrown out of an extension built by another compiler than torch's crashed the process
    # on one machine): anything else is F.linear's, errors included
    if not (_state["on"] and 1 <= rows <= MAX_ROWS and x.dtype == torch.float32
            and w.dtype == torch.float32 and x.device.type == "cpu" and w.device.type == "cpu"
            and w.dim() == 2 and w.shape[1] == x.shape[-1]
            and not x.requires_grad and not w.requires_grad):
        return F.linear(x, w)
    module = native.kernel()
    if module is None:
        return F.linear(x, w)
    flat = x.reshape(rows, x.shape[-1])
    y = module.linear(flat if flat.is_contiguous() else flat.contiguous(),
                      w if w.is_contiguous() else w.contiguous())       # [rows, N]
    return y.view(*x.shape[:-1], w.shape[0])
