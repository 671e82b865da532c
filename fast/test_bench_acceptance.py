"""(d) Measured tokens per target call vs the chapter's formula, for i.i.d. acceptance alpha.

The drafter (fast/oracle.py) proposes the target's true greedy token with probability alpha
and a wrong one otherwise, coin by coin, so acceptance is i.i.d. by construction and a round
should yield E = (1 - alpha^(k+1)) / (1 - alpha) tokens. Measured: 1 + the mean accepted count
over all row-rounds of a B = 32 batch, 512 new tokens per row, k = 4 (the verify's yield before
a row's budget cuts its last round short; the engine's tokens per row-round, which includes
those cut rounds, is reported alongside). Target: within 3% of the formula.
"""

import pytest
import torch

import fast
from fast.oracle import OracleDrafter
from reference.model import random_model

try:
    from reference.speculative import expected_tokens_per_round
except ImportError:  # the formula, should the reference engine be absent
    def expected_tokens_per_round(alpha, k):
        return k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)

K, BATCH, NEW_TOKENS = 4, 32, 512


@pytest.fixture(scope="module")
def setup():
    target = random_model("tiny", seed=0, dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in range(3, 3 + BATCH)]
    return target, prompts


def truth_for(target, prompts, new_tokens):
    """Each row's target greedy continuation, k tokens beyond its budget (a perfect draft)."""
    outputs, _ = fast.batched_generate(target, target, prompts, new_tokens + K, k=K)
    return torch.tensor(outputs)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_d_tokens_per_target_call(benchmark, figures, setup, alpha):
    target, prompts = setup
    rows, new = (prompts[:2], 8) if benchmark.disabled else (prompts, NEW_TOKENS)
    truth = truth_for(target, rows, new)
    benchmark.group = "(d) tokens per target call, i.i.d. acceptance"

    def run():
        drafter = OracleDrafter(truth, alpha, 256, seed=int(alpha * 100))
        return fast.batched_generate(target, drafter, rows, new, k=K)

    outputs, stats = benchmark.pedantic(run, rounds=1)
    assert outputs == truth[:, :new].tolist()
    expected = expected_tokens_per_round(alpha, K)
    measured = stats["verified_tokens_per_row_round"]
    benchmark.extra_info.update({"expected": expected, "measured": measured,
                                 "tokens_per_row_round": stats["tokens_per_row_round"],
                                 "row_rounds": stats["row_rounds"]})
    if not benchmark.disabled:
        ratio = measured / expected
        figures.ratio(benchmark, f"(d) measured / formula tokens per call, alpha={alpha}, k={K}",
                      ratio, "1 +- 0.03", abs(ratio - 1) <= 0.03,
                      f"{measured:.3f} vs {expected:.3f}; with cut last rounds "
                      f"{stats['tokens_per_row_round']:.3f}; {stats['row_rounds']} row-rounds")
