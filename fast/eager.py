"""The fast engine with every step run by the eager loop (fast/forward.py), not fast/fused.cpp.

`pytest properties/ --impl=fast-eager` judges this path the way `--impl=fast` judges the fused
one, so that each is checked against the reference by the same properties (greedy and
distribution), as the CUDA-graph path and the eager one are on a GPU. Everything else (the
matmul kernel, the vectorized sampler) is the engine's usual code.
"""

import functools

import fast
from fast import fused
from fast.weights import KIT_MODEL_KINDS


def _eager(function):
    @functools.wraps(function)
    def run(*args, **kwargs):
        with fused.enabled(False):
            return function(*args, **kwargs)
    return run


accept_or_correct = fast.accept_or_correct
speculative_generate = _eager(fast.speculative_generate)
batched_generate = _eager(fast.batched_generate)
tree_generate = _eager(fast.tree_generate)

__all__ = ["KIT_MODEL_KINDS", "accept_or_correct", "batched_generate", "speculative_generate",
           "tree_generate"]
