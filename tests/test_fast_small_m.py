"""fast/small_m: the few-row matmul kernel computes F.linear, gives every row the result it gets
alone, and steps aside (to F.linear) wherever it does not apply."""

import pytest
import torch
import torch.nn.functional as F

from fast import small_m
from fast.cache import StaticCache
from fast.forward import forward, window_mask
from fast.weights import model_weights
from reference.model import random_model


# K and N off every multiple the kernel blocks by (8 lanes, R rows of w, 64-row tasks) and on them;
# K = 1161: 12-row panels too large for L1, where 4-6 rows of x take one block
SHAPES = [(8, 1), (7, 3), (128, 384), (130, 67), (96, 200), (383, 1153), (1161, 97)]


@pytest.mark.parametrize("K,N", SHAPES)
# every register block (1-6 rows) and every 4-row tail, a batch's verify (40), the limit (64)
@pytest.mark.parametrize("M", [*range(1, 10), 13, 40, 64])
def test_kernel_computes_the_product(native_kernel, K, N, M):
    """Within float32 rounding of the float64 product, and no further from it than F.linear's
    float32 result (plus one rounding step of the sum's size)."""
    g = torch.Generator().manual_seed(K * 1000 + N * 10 + M)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    exact = F.linear(x.double(), w.double())
    error = (native_kernel.linear(x, w).double() - exact).abs()
    blas_error = (F.linear(x, w).double() - exact).abs()
    scale = (x.double().abs() @ w.double().abs().T)          # the sum of |terms|: rounding's scale
    assert (error <= K * 2.0 ** -24 * scale + 1e-30).all()
    assert error.max() <= blas_error.max() + 2.0 ** -23 * scale.max()


@pytest.mark.parametrize("K,N", [(130, 67), (384, 1152), (64, 2048), (1152, 384)])
def test_each_row_is_what_it_is_alone(native_kernel, K, N):
    """Batch invariance, bit for bit: row m of an M-row product equals the product of row m
    alone, for every M and on one thread or two (the tasks split N differently)."""
    g = torch.Generator().manual_seed(K + N)
    x, w = torch.randn(40, K, generator=g), torch.randn(N, K, generator=g)
    alone = torch.cat([native_kernel.linear(x[m:m + 1].contiguous(), w) for m in range(40)])  # [40, N]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for M in (*range(1, 10), 15, 40):
                assert torch.equal(native_kernel.linear(x[:M].contiguous(), w), alone[:M]), (threads, M)
    finally:
        torch.set_num_threads(before)


def test_linear_falls_back_to_f_linear_where_the_kernel_does_not_apply():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 24, generator=g)
    cases = {"65 rows": torch.randn(65, 24, generator=g),
             "5 x 13 rows": torch.randn(5, 13, 24, generator=g),
             "float64": torch.randn(2, 24, generator=g, dtype=torch.float64)}
    for name, x in cases.items():
        weight = w.to(x.dtype)
        assert torch.equal(small_m.linear(x, weight), F.linear(x, weight)), name
    x = torch.randn(2, 24, generator=g, requires_grad=True)   # autograd: F.linear's gradient
    y = small_m.linear(x, w)
    assert y.requires_grad and torch.equal(y, F.linear(x, w))
    with small_m.enabled(False):
        assert not small_m.is_enabled()
        x = torch.randn(5, 24, generator=g)
        assert torch.equal(small_m.linear(x, w), F.linear(x, w))
    assert small_m.is_enabled()


def test_linear_runs_the_kernel_on_few_float32_rows(native_kernel):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(1, 5, 32, generator=g), torch.randn(48, 32, generator=g)
    y = small_m.linear(x, w)                                           # [1, 5, 48]
    assert y.shape == (1, 5, 48)
    assert torch.equal(y, native_kernel.linear(x.reshape(5, 32), w).view(1, 5, 48))
    # rows a uniform stride apart (a chunk of a fused output, as the SwiGLU product is) are
    # read in place: bit for bit the product of their contiguous copy
    for view in (torch.randn(5, 96, generator=g)[:, 32:64],
                 torch.randn(2, 3, 80, generator=g)[:, :, 8:40],
                 torch.randn(4, 1, 2, 32, generator=g)):
        assert torch.equal(small_m.linear(view, w), native_kernel.linear(view.contiguous(), w))
    # anything else is F.linear's: strided entries, rows not one stride apart
    for view in (torch.randn(5, 64, generator=g)[:, ::2], torch.randn(2, 4, 32, generator=g)[:, :2]):
        assert native_kernel.linear(view, w) is None
        assert torch.equal(small_m.linear(view, w), F.linear(view, w))


def test_kernel_answers_none_where_it_does_not_apply(native_kernel):
    """Its contract is checked in C++ and answered with None (never an exception)."""
    w = torch.randn(16, 8)
    cases = {"65 rows": (torch.randn(65, 8), w), "float64": (torch.randn(2, 8).double(), w.double()),
             "K mismatch": (torch.randn(2, 7), w), "w not contiguous": (torch.randn(2, 8), w.T.contiguous().T),
             "w 3-D": (torch.randn(2, 8), w[None]), "gradient": (torch.randn(2, 8, requires_grad=True), w),
             "no rows": (torch.randn(0, 8), w)}
    for name, (x, weight) in cases.items():
        assert native_kernel.linear(x, weight) is None, name


def test_bad_input_gets_f_linears_error_never_the_kernel():
    """The wrapper checks the kernel's whole contract itself, so the kernel never refuses
    (an exception thrown out of the extension crashed the process on a machine whose g++ was
    newer than torch's build); a mismatched shape gets F.linear's own error."""
    w = torch.randn(16, 8)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        small_m.linear(torch.randn(2, 7), w)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        small_m.linear(torch.randn(2, 8), torch.randn(16, 7))
    with pytest.raises(TypeError, match="on must be True or False, got 1"):
        with small_m.enabled(1):
            pass


def test_a_verify_row_gives_the_logits_of_decode_steps(native_kernel):
    """In the fast forward (float32), the logits a verify of 5 tokens gives at each position
    are within rounding of those of 5 decode steps; the matmuls' part of them is exact (the
    test above), so what is left is attention's and the norms' rounding."""
    model = random_model("tiny", seed=3)
    weights = model_weights(model)
    s = weights.shape

    def run(blocks):
        cache = StaticCache(s.num_layers, 1, s.num_kv_heads, s.head_dim, 32, weights.dtype, "cpu")
        out, at = [], 0
        for block in blocks:
            ids = torch.tensor([block])
            T = len(block)
            slots = at + torch.arange(T)[None]
            mask = window_mask(torch.tensor([at]), torch.ones(T, T, dtype=torch.bool).tril(), at + T)
            out.append(forward(weights, cache, ids, slots, slots, mask, at + T)[0])
            at += T
        return torch.cat(out)                                          # [tokens, V]

    prompt, tokens = list(range(3, 12)), [5, 9, 1, 30, 17]
    verify = run([prompt, tokens])[len(prompt):]
    steps = run([prompt] + [[t] for t in tokens])[len(prompt):]
    assert (verify - steps).abs().max() < 1e-5
