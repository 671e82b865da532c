"""fast/rejection.cpp gives, bit for bit, what fast/verify.py's tensor operations give, on the
inputs a round meets (sparse, filtered, equal, disjoint laws, every accepted count), and
refuses bad input naming it."""

import pytest
import torch

from fast.verify import rejection_sample, rejection_sample_ops


def laws(g, shape, zeros: float):
    """Float64 distributions over the last dimension, a fraction `zeros` of entries exactly 0
    (as top-k / top-p filtering leaves them); never all zero."""
    x = torch.rand(shape, generator=g, dtype=torch.float64) ** 3
    x = x.masked_fill(torch.rand(shape, generator=g) < zeros, 0.0)
    x[..., 0] += 1e-3
    return x / x.sum(-1, keepdim=True)


CASES = ["random", "sparse", "equal", "disjoint", "one-hot", "wide"]


def round_inputs(case: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    B, k, V = {"wide": (8, 7, 2048)}.get(case, (33, 4, 64))
    p = laws(g, (B, k + 1, V), 0.6 if case == "sparse" else 0.0)
    q = laws(g, (B, k, V), 0.6 if case == "sparse" else 0.0)
    if case == "equal":              # a perfect draft: every proposal accepted, the bonus drawn
        q = p[:, :k].clone()
    if case == "disjoint":           # no overlap: every first proposal rejected
        p[..., : V // 2], q[..., V // 2:] = 0, 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    if case == "one-hot":            # greedy-like laws: ties in the cumulative sum
        p = torch.nn.functional.one_hot(torch.randint(0, V, (B, k + 1), generator=g), V).double()
    proposals = torch.multinomial(q.reshape(B * k, V), 1, generator=g).view(B, k)    # x ~ q
    u = torch.rand(B, k + 1, generator=g, dtype=torch.float64)
    return p, q, proposals, u[:, :k].contiguous(), u[:, k].contiguous()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(6))
def test_kernel_equals_the_tensor_operations(native_kernel, case, seed):
    p, q, proposals, u_accept, u_draw = round_inputs(case, seed)
    accepted, block = native_kernel.rejection_sample(p, q, proposals, u_accept, u_draw)
    want_accepted, want_block = rejection_sample_ops(p, q, proposals, u_accept, u_draw)
    assert torch.equal(accepted, want_accepted)
    assert torch.equal(block, want_block)
    # and the engine's entry point takes the kernel on a CPU
    assert all(torch.equal(a, b) for a, b in zip(rejection_sample(p, q, proposals, u_accept, u_draw),
                                                 (want_accepted, want_block)))


def test_every_accepted_count_is_met(native_kernel):
    """The cases above reach every count 0 .. k (so the bonus path and each rejection point
    were compared), else the comparison would not cover them."""
    seen = set()
    for case in CASES:
        for seed in range(6):
            p, q, proposals, u_accept, u_draw = round_inputs(case, seed)
            if case != "wide":
                seen |= set(native_kernel.rejection_sample(p, q, proposals, u_accept, u_draw)[0].tolist())
    assert seen == set(range(5))


def test_extreme_uniforms_stay_in_range(native_kernel):
    """u_draw = 0 puts the level at the total (the last index with mass); a u just below 1
    at the first index with mass; u_accept = 0 accepts every proposal with p(x) > 0."""
    p, q, proposals, _, _ = round_inputs("sparse", 0)
    B, k = proposals.shape
    for u_a, u_d in [(0.0, 0.0), (0.0, 1 - 2 ** -53), (1 - 2 ** -53, 0.0)]:
        u_accept = torch.full((B, k), u_a, dtype=torch.float64)
        u_draw = torch.full((B,), u_d, dtype=torch.float64)
        got = native_kernel.rejection_sample(p, q, proposals, u_accept, u_draw)
        want = rejection_sample_ops(p, q, proposals, u_accept, u_draw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert (got[1] >= 0).all() and (got[1] < p.shape[-1]).all()


def test_bad_input_is_refused_naming_it_and_the_kernel_never_throws(native_kernel):
    """A proposal outside the vocabulary comes back from the kernel as an answer and is raised
    by fast/verify.py naming it (an exception thrown out of the extension crashed the process
    on a machine whose g++ was newer than torch's build); shapes and dtypes off the kernel's
    that do not fit each other are refused before either path runs."""
    p, q, proposals, u_accept, u_draw = round_inputs("random", 0)
    bad = proposals.clone()
    bad[2, 1] = 64
    answer = native_kernel.rejection_sample(p, q, bad, u_accept, u_draw)
    assert len(answer) == 1 and answer[0].tolist() == [2, 1, 64]
    with pytest.raises(ValueError, match=r"proposals\[2, 1\] = 64 is not a token of a vocabulary of 64"):
        rejection_sample(p, q, bad, u_accept, u_draw)
    with pytest.raises(ValueError, match=r"p must be \[33, 5, 64\] .* got \[33, 4, 64\]"):
        rejection_sample(p[:, :4], q, proposals, u_accept, u_draw)         # p one position short
    with pytest.raises(ValueError, match=r"u_accept must be \[33, 4\] .* got \[33, 2\]"):
        rejection_sample(p, q, proposals, u_accept[:, :2], u_draw)
