"""A speculating fake server that verifies by blocks (Sun et al. 2024), for the served family
"served_acceptance" judged against a method's declared verification rule
(tests/test_served_acceptance_block.py).

`BlockServer` is tests/mutants/served_acceptance.py's SpeculatingServer (a kit draft model
proposing from its processed law q, honest counters) whose round is verified by
reference/block.py's block_accept instead of token by token. Paired with the methods the tests
declare:

    BlockServer declared "block"           correct: passes
    SpeculatingServer declared "block"     token-wise verification where block is claimed
                                           (vllm-ascend #7807): lossless, but it accepts fewer
                                           tokens than block's exact law says; rejected
    GreedyBlockServer declared "block"     correct: passes, argmax proposals (q one-hot), where
                                           the two rules have one law (rule not shown)

(BlockServer declared "token-wise" accepts more than token-wise's law, but a token-wise
method's check is sized for the design deviation, 0.05 per drafted token, not for block's
smaller gain, and running a lossless rule that accepts more is no defect.)
"""

from __future__ import annotations

import numpy as np
import torch

from reference.block import block_accept
from tests.mutants.served_acceptance import GreedyDrafts, SpeculatingServer


class BlockServer(SpeculatingServer):
    """Correct: each round's proposals judged jointly (reference.block.block_accept), with a
    generator seeded from the request's own stream."""

    def verify(self, seq, block, sampling, rng) -> list:
        xs = [x for x, _ in block]
        p = np.stack([self.law(self.logits("target", seq + xs[:i]), *sampling)
                      for i in range(len(xs) + 1)])
        q = np.stack([q for _, q in block])
        g = torch.Generator().manual_seed(int(rng.integers(2 ** 62)))
        tokens, _ = block_accept(torch.from_numpy(p), torch.from_numpy(q), xs, g)
        return tokens


class GreedyBlockServer(GreedyDrafts, BlockServer):
    """Correct: argmax proposals (q one-hot) verified by blocks, whose law is token-wise's."""
