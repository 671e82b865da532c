// y = x w^T for a float32 x of a few rows (M <= MAX_ROWS) on an x86-64 CPU with AVX2 and FMA.
//
// Why: a decode step feeds 1 token per row and a verify k + 1, so every matmul of a speculative
// round has a handful of rows against a weight matrix that is read once. The BLAS this torch
// calls is built for large M: at M = 5 it runs ~3x its M = 1 time (BENCHMARKS.md, issue 24), so
// a verify costs ~3 decode steps instead of ~1. Here each weight vector is loaded once and used
// against every row of x while it sits in a register, so M rows cost little more than one
// until the FMA units, not the memory, are the limit.
//
// Batch invariance: y[m, n] is always the same sequence of operations, whatever M, whatever
// other rows are in x and whichever block or thread computes it: 8 lane sums over k in steps
// of 8 (one FMA each, k ascending), one fixed pairwise reduction of the 8 lanes, then the tail
// k = 8 * floor(K / 8) .. K - 1 added in order with fmaf. So every matmul of a verify gives a
// token's row bit for bit what a decode step of that token gives (tests/test_fast_small_m.py);
// fast/fused.cpp's attention is per row and head too, so a fused verify row is its decode step
// bit for bit (the eager path's attention, torch's, may round 1 and k + 1 rows differently).
// Compiled without floating-point contraction, so the compiler fuses nothing on its own.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <optional>
#include <vector>

namespace {

// The 8 lanes of v summed in one fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the last.
inline float lane_sum(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
    __m128 one = _mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1));
    return _mm_cvtss_f32(one);
}

// How many blocks ahead the weights are prefetched (a hint: it reads nothing and never faults,
// so running past the end of w is harmless).
constexpr int64_t AHEAD = 4;

// Rows n0 .. n0 + R - 1 of w against all M rows of x: M * R accumulators in registers, each
// weight vector loaded once per k step and used M times.
template <int M, int R>
inline void rows(const float* x, int64_t ldx, const float* w, float* y, int64_t K, int64_t N,
                 int64_t n0) {
    __m256 acc[M][R];
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
    const int64_t body = K - K % 8;
    // The weight rows AHEAD * R further on, into L2, a line per 16 floats of this block's
    // reads: a block of few rows is too short a stream for the hardware prefetcher to run
    // ahead of, and with 5 rows of x the FMAs leave the memory idle unless it is asked early
    // (weights larger than the last-level cache: a weight-bound target's verify). Measured on
    // the large trained target's 60 MB of matrices, 2 threads: 5 rows cost 2.2x 1 row without
    // it, 1.0-1.1x with it; into L1 (T0) 1.4-1.5x (BENCHMARKS.md, issue 24).
    const char* ahead = reinterpret_cast<const char*>(w + (n0 + AHEAD * R) * K);
    for (int64_t k = 0; k < body; k += 8) {
        if ((k * R) % 16 == 0 || R * 8 >= 16)
            for (int64_t line = 0; line < R * 8 * 4; line += 64)
                _mm_prefetch(ahead + k * R * 4 + line, _MM_HINT_T1);
        __m256 wv[R];
        for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + (n0 + r) * K + k);
        for (int m = 0; m < M; ++m) {
            const __m256 xv = _mm256_loadu_ps(x + m * ldx + k);
            for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < R; ++r) {
            float s = lane_sum(acc[m][r]);
            for (int64_t k = body; k < K; ++k) s = std::fmaf(x[m * ldx + k], w[(n0 + r) * K + k], s);
            y[m * N + n0 + r] = s;
        }
}

// Rows [begin, end) of w, R at a time and one at a time for what is left. R keeps M * R
// accumulators, R weight vectors and one x vector within the 16 ymm registers (4 x 3: 12 + 3 + 1,
// seven loads for twelve FMAs, so the FMA units rather than the loads set the pace; 5 x 2 and
// 6 x 2: 13 and 15 registers).
template <int M>
void block(const float* x, int64_t ldx, const float* w, float* y, int64_t K, int64_t N,
           int64_t begin, int64_t end) {
    static_assert(M >= 1 && M <= 6, "many() feeds blocks of at most 6 rows");
    constexpr int R = M <= 3 ? 4 : M == 4 ? 3 : 2;
    int64_t n = begin;
    for (; n + R <= end; n += R) rows<M, R>(x, ldx, w, y, K, N, n);
    for (; n < end; ++n) rows<M, 1>(x, ldx, w, y, K, N, n);
}

using Block = void (*)(const float*, int64_t, const float*, float*, int64_t, int64_t, int64_t,
                       int64_t);
constexpr Block BLOCKS[6] = {block<1>, block<2>, block<3>, block<4>, block<5>, block<6>};

// Rows of x the kernel takes: a batch's draft steps and verifies (8 rows of 5 are 40), and the
// short prefills; longer products are BLAS's own ground.
constexpr int64_t MAX_ROWS = 64;

// Rows of w per parallel task: enough work to be worth a thread (a task's last panel may be short;
// its rows go through the same blocks).
constexpr int64_t GRAIN = 64;

// Weight rows per panel in many(): a multiple of R for 4 rows of x (3) and for the 1-3 rows left
// over (4).
constexpr int64_t PANEL = 12;

// A panel the rows left over reread cheaply: one that sits in L1 (32 KB a core on the x86-64 CPUs
// of this decade), 12 rows of K <= 682 floats.
constexpr int64_t L1_BYTES = 32 * 1024;

// Rows [begin, end) of w against any number M of rows of x. Up to 3 rows: one block, the weights
// streamed once. More: the weights a panel at a time, each panel used by every 4-row block of x
// (and the 1-3 rows left over) while it sits in cache, so the weights still stream from memory
// once: a batch of 8 verifying 5 tokens each (40 rows) reads them once, not 5 or 10 times. Where
// a panel outgrows L1 (a down projection's K), the 1-3 rows left over would reread it from L2, so
// up to 6 rows take one block instead: a batch-1 verify's 5 rows against the large trained
// target's 8 down projections cost 0.83-0.89 ms as 4 + 1, 0.70-0.72 ms as one 5-row block
// (interleaved in one process, one thread; its K = 384 matrices were 3-5% faster as 4 + 1).
// Each y[m, n] is the same operations in the same order as in block<1> (top of this file), so
// the result is still batch invariant bit for bit.
inline void many(const float* x, int64_t M, int64_t ldx, const float* w, float* y, int64_t K,
                 int64_t N, int64_t begin, int64_t end) {
    if (M <= 3 || (M <= 6 && PANEL * K * 4 > L1_BYTES))
        return BLOCKS[M - 1](x, ldx, w, y, K, N, begin, end);
    // More than MAX_ROWS rows (a prefill through fast/fused.cpp): MAX_ROWS at a time, so the rows
    // a panel meets stay in L2; such a product is bound by arithmetic, not by the weights' reads.
    if (M > MAX_ROWS) {
        for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS)
            many(x + m0 * ldx, std::min(MAX_ROWS, M - m0), ldx, w, y + m0 * N, K, N, begin, end);
        return;
    }
    const int64_t tail = M % 4;
    for (int64_t n = begin; n < end; n += PANEL) {
        const int64_t stop = std::min(end, n + PANEL);
        for (int64_t m0 = 0; m0 + 4 <= M; m0 += 4) block<4>(x + m0 * ldx, ldx, w, y + m0 * N, K, N, n, stop);
        if (tail)
            BLOCKS[tail - 1](x + (M - tail) * ldx, ldx, w, y + (M - tail) * N, K, N, n, stop);
    }
}

// y [M, N] = x [M, K] (rows ldx apart) @ w [N, K]^T with many(), split across threads: by weight
// rows where there are enough for every thread (each weight then read once, by one thread: what
// a large model's step needs); else (a small model's matrices against many rows, where one
// 64-row task would leave the other threads idle) by rows of x, 4 at a time, every thread
// reading the whole small matrix. Each entry is the same operations whichever way: the split
// changes no bit of y.
inline void product(const float* x, int64_t M, int64_t ldx, const float* w, float* y, int64_t K,
                    int64_t N) {
    const int64_t tasks = (N + GRAIN - 1) / GRAIN, threads = at::get_num_threads();
    if (threads < 2 || M < 8 || tasks >= 2 * threads) {
        at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
            many(x, M, ldx, w, y, K, N, first * GRAIN, std::min(N, last * GRAIN));
        });
        return;
    }
    const int64_t rows = ((M + threads - 1) / threads + 3) / 4 * 4;    // per thread, a multiple of 4
    at::parallel_for(0, (M + rows - 1) / rows, 1, [&](int64_t first, int64_t last) {
        const int64_t m0 = first * rows, m1 = std::min(M, last * rows);
        many(x + m0 * ldx, m1 - m0, ldx, w, y + m0 * N, K, N, 0, N);
    });
}

}  // namespace

// x [..., K] @ w[N, K]^T -> [..., N], or nothing where the kernel does not apply: more than
// MAX_ROWS rows, not float32 on the CPU, a gradient wanted, w not a contiguous [N, K], x's rows not one
// uniform stride apart with contiguous entries (a strided view such as a chunk of a fused output
// is read in place). The caller (fast/small_m.py) then uses F.linear. Nothing here throws: an
// exception out of an extension built by another compiler than torch's crashed the process on
// one machine (g++ 13 against torch 2.11), and the checks cost less here than in Python.
std::optional<torch::Tensor> linear(const torch::Tensor& x, const torch::Tensor& w) {
    if (!x.defined() || !w.defined() || !x.device().is_cpu() || !w.device().is_cpu() ||
        x.scalar_type() != torch::kFloat || w.scalar_type() != torch::kFloat ||
        x.requires_grad() || w.requires_grad() || x.dim() < 1 || w.dim() != 2 ||
        !w.is_contiguous())
        return std::nullopt;
    const int64_t K = x.size(-1), N = w.size(0);
    if (K < 1 || N < 1 || w.size(1) != K || x.stride(-1) != 1) return std::nullopt;
    const int64_t M = x.numel() / K;
    if (M < 1 || M > MAX_ROWS) return std::nullopt;
    // rows: every index but the last, collapsed; uniform stride ldx between consecutive rows
    int64_t ldx = K;
    if (x.dim() >= 2 && M > 1) {
        int64_t inner = -1;          // the stride of the innermost non-trivial row dimension
        int64_t span = 1;            // rows covered by the dimensions inside the current one
        for (int64_t d = x.dim() - 2; d >= 0; --d) {
            if (x.size(d) == 1) continue;
            if (inner < 0) {
                inner = x.stride(d);
            } else if (x.stride(d) != inner * span) {
                return std::nullopt;
            }
            span *= x.size(d);
        }
        ldx = inner;
        if (ldx < K) return std::nullopt;      // overlapping rows: not a matrix
    }
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    auto y = torch::empty(shape, x.options());   // [..., N], rows contiguous
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    product(xp, M, ldx, wp, yp, K, N);
    return y;
}
