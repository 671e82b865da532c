"""Distribution processing: temperature, top-k and top-p with ties kept, exact greedy."""

import torch

from reference.sampling import greedy_token, probs_from_logits


def logits_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def test_temperature_one_is_softmax():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(probs_from_logits(x), torch.softmax(x, -1))


def test_temperature_scales_logits():
    x = torch.tensor([0.0, 1.0], dtype=torch.float64)
    e = torch.tensor(2.0, dtype=torch.float64).exp()  # logits / 0.5 = [0, 2]
    torch.testing.assert_close(probs_from_logits(x, 0.5), torch.stack([1 / (1 + e), e / (1 + e)]))


def test_top_k_keeps_ties_at_the_boundary():
    probs = probs_from_logits(logits_of([0.4, 0.2, 0.2, 0.1, 0.1]), top_k=2)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.25, 0.25, 0, 0], dtype=torch.float64))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # Mass before each token: 0, .5, .8, .95; a token is kept while that mass is < top_p.
    probs = probs_from_logits(logits_of([0.5, 0.3, 0.15, 0.05]), top_p=0.79)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0, 0], dtype=torch.float64) / 0.8)
    probs = probs_from_logits(logits_of([0.5, 0.3, 0.15, 0.05]), top_p=0.81)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.float64) / 0.95)


def test_top_p_keeps_ties():
    probs = probs_from_logits(logits_of([0.4, 0.3, 0.3]), top_p=0.5)
    torch.testing.assert_close(probs, torch.tensor([0.4, 0.3, 0.3], dtype=torch.float64))


def test_top_k_then_top_p_on_what_top_k_left():
    # top-2 of [.5, .3, .2] renormalizes to [.625, .375]; top_p .6 then keeps only token 0.
    probs = probs_from_logits(logits_of([0.5, 0.3, 0.2]), top_k=2, top_p=0.6)
    torch.testing.assert_close(probs, torch.tensor([1.0, 0, 0], dtype=torch.float64))


def test_greedy_breaks_ties_by_lowest_index():
    assert int(greedy_token(torch.tensor([1.0, 3.0, 3.0, 0.0]))) == 1
    assert greedy_token(torch.tensor([[0.0, 1.0], [2.0, 2.0]])).tolist() == [1, 0]


def test_batched_rows_are_processed_independently():
    rows = torch.stack([logits_of([0.5, 0.3, 0.2]), logits_of([0.2, 0.3, 0.5])])
    probs = probs_from_logits(rows, top_p=0.5)
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0, 0], [0, 0, 1.0]], dtype=torch.float64))


def test_sampling_builds_on_nothing_of_the_penalties():
    """reference.penalties builds on reference.sampling, never the other way (one-way: no import
    circle): a fresh interpreter importing reference.sampling loads no reference.penalties."""
    import subprocess
    import sys
    code = ("import sys, reference.sampling; "
            "assert 'reference.penalties' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
