// A model's decoder layers for a few rows on the CPU, in one call: the CPU counterpart of
// replaying a captured CUDA graph.
//
// Why: on a CPU a small model's step is bound by per-operation overhead, not by arithmetic.
// The eager forward (fast/forward.py) runs about 35 torch operations a layer, each a Python
// call, a dispatch and an allocation (~13 us each on this project's CPUs, BENCHMARKS.md), so
// a draft that is 10x smaller than its target is nowhere near 10x cheaper. Here a whole step
// (embedding, and per layer: norm, q/k/v, q/k norms, rotary, cache write, attention, o, norm,
// gate/up, SwiGLU, down, both residual adds) is plain loops over buffers allocated once per
// call; the float32 matmuls are small_m.cpp's product() (the weights read once for all rows), the
// per-row work (norms, rotary, SwiGLU, residual adds) split across threads when there are rows
// enough.
//
// It means what fast/forward.py's eager loop means, to rounding (tests/test_fast_fused.py);
// the kit judges the engine with it (float64) against the reference.
//
// Batch invariance: every row's result is computed by the same operations in the same order
// whatever the other rows are (norms and attention are per row and head; the float32 matmuls
// are small_m.cpp's, which are batch invariant; the float64 ones a fixed per-row loop). So a
// verify's row for a token is bit for bit the decode step of that token on the same cache.
//
// Contract (anything else answers nullopt and the caller runs the eager loop, which raises the
// usual errors for bad input): CPU tensors, float32 or float64 weights, contiguous, no
// gradient; ids, slots, positions int64 [B, T] with B * T <= MAX_ROWS; mask bool [B, T, span];
// every id, slot and position in range; 7 tensors a layer in LayerWeights' order.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace fused {

constexpr int64_t MAX_ROWS = 1024;
constexpr int PER_LAYER = 7;   // input_norm, qkv, qk_norm, o, post_norm, gate_up, down

// y [M, N] = x [M, K] (rows ldx apart) @ w [N, K]^T, float32: small_m.cpp's product(), which
// reads the weights once for all M rows and splits the work across threads as small_m's linear.
inline void matmul(const float* x, int64_t M, int64_t ldx, const float* w, float* y, int64_t K,
                   int64_t N) {
    product(x, M, ldx, w, y, K, N);
}

// float64: four partial sums over k (ascending), added in one fixed order, then the tail.
inline void matmul(const double* x, int64_t M, int64_t ldx, const double* w, double* y,
                   int64_t K, int64_t N) {
    at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
            const double* wn = w + n * K;
            for (int64_t m = 0; m < M; ++m) {
                const double* xm = x + m * ldx;
                double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
                int64_t k = 0;
                for (; k + 4 <= K; k += 4) {
                    a0 += xm[k] * wn[k];
                    a1 += xm[k + 1] * wn[k + 1];
                    a2 += xm[k + 2] * wn[k + 2];
                    a3 += xm[k + 3] * wn[k + 3];
                }
                double s = (a0 + a1) + (a2 + a3);
                for (; k < K; ++k) s += xm[k] * wn[k];
                y[m * N + n] = s;
            }
        }
    });
}

// out = weight * x / rms(x) over n entries, as forward.rms_norm computes it in float32/64:
// x * (1 / sqrt(mean(x^2) + eps)), then times the weight.
template <typename T>
inline void rms_row(const T* x, const T* weight, T* out, int64_t n, T eps) {
    T squares = 0;
    for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
    const T inv = T(1) / std::sqrt(squares / T(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * weight[i];
}

// float32 with n a multiple of 8 (every hidden and head size here): the sum of squares in 8
// lanes, reduced in small_m.cpp's fixed order (the scalar loop above is one long dependency
// chain the compiler may not reorder, ~4 cycles an entry).
inline void rms_row(const float* x, const float* weight, float* out, int64_t n, float eps) {
    if (n % 8 != 0) return rms_row<float>(x, weight, out, n, eps);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    const float inv = 1.0f / std::sqrt(lane_sum(acc) / float(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * weight[i];
}

// body(r) for every row r < R, the rows split across threads when there are enough of them to
// pay for it (a decode step's few rows run inline). Rows are independent, so which thread runs
// a row changes nothing in its result.
template <typename F>
inline void each_row(int64_t R, const F& body) {
    at::parallel_for(0, R, 16, [&](int64_t first, int64_t last) {
        for (int64_t r = first; r < last; ++r) body(r);
    });
}

// e^x. float64 (the kit's precision): the C library's. float32: a branch-free polynomial the
// compiler vectorizes (the library's expf is a call per element, and a verify's softmax and
// SwiGLU take tens of thousands a step): x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in
// two so n ln 2 is exact), e^r by its Taylor polynomial to r^7 (relative error < 2e-7 on that
// range, about 2 float32 ulps), times 2^n built in the exponent bits. Arguments are clamped to
// where e^x is a normal float; -inf (a masked score) gives 0 as e^x does; NaN stays NaN.
inline double exponential(double x) { return std::exp(x); }

inline float exponential(float x) {
    const float clamped = std::min(std::max(x, -87.0f), 88.0f);
    const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
    const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const float e = p * scale;
    return x != x ? x : (x < -87.0f ? 0.0f : e);
}

// exponential() on 8 floats at once, the same operations lane by lane (so the same bits).
inline __m256 exponential8(__m256 x) {
    const __m256 clamped = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(1.44269504088896341f)),
                                                   _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(clamped, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    // below the clamp: 0 (e^-inf of a masked score); NaN: itself
    const __m256 zeroed = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
    return _mm256_blendv_ps(zeroed, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// y[i] = e^x[i] for i < n
template <typename T>
inline void exponentials(const T* x, T* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = exponential(x[i]);
}

inline void exponentials(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exponential8(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = exponential(x[i]);
}

// a [I] = silu(gate) * up = gate / (1 + e^-gate) * up, gate = gate_up[:I], up = gate_up[I:]
template <typename T>
inline void swiglu(const T* gate_up, T* a, int64_t I) {
    for (int64_t i = 0; i < I; ++i) a[i] = -gate_up[i];
    exponentials(a, a, I);
    for (int64_t i = 0; i < I; ++i) a[i] = gate_up[i] / (T(1) + a[i]) * gate_up[I + i];
}

// q . k over D entries: 8 partial sums over d (ascending), added in one fixed order, then the
// tail; independent lanes, so the compiler vectorizes the loop without reassociating anything.
template <typename T>
inline T dot(const T* q, const T* k, int64_t D) {
    T lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 8 <= D; d += 8)
        for (int j = 0; j < 8; ++j) lanes[j] += q[d + j] * k[d + j];
    T s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; d < D; ++d) s += q[d] * k[d];
    return s;
}

// o [D] = sum over the visible slots j, in slot order, of p[j] * v[j] (v rows D apart)
template <typename T>
inline void weighted_sum(T* o, const T* p, const bool* seen, const T* v, int64_t span, int64_t D) {
    std::fill_n(o, D, T(0));
    for (int64_t j = 0; j < span; ++j)
        if (seen[j])
            for (int64_t d = 0; d < D; ++d) o[d] += p[j] * v[j * D + d];
}

// The 8 sums of a[0]..a[7]'s lanes, a[s]'s in lane s, each reduced in one fixed order,
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), whichever lane it lands in: 7 operations
// for 8 sums, where lane_sum() takes ~5 for one.
inline __m256 lane_sums8(const __m256* a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// o [8V] = sum of p[j] * v[j] over the visible slots j in slot order, v rows D apart: even and odd
// slots in two sets of V registers, added at the end (two chains of half the length: a long
// chain of dependent FMAs, not the arithmetic, set the pace of one accumulator).
template <int V>
inline void weighted_sum8(float* o, const float* p, const bool* seen, const float* v,
                          int64_t span, int64_t D) {
    __m256 even[V], odd[V];
    for (int i = 0; i < V; ++i) even[i] = odd[i] = _mm256_setzero_ps();
    auto add = [&](__m256* acc, int64_t j) {       // acc += p[j] * v[j] where slot j is visible
        if (!seen[j]) return;
        const __m256 pj = _mm256_set1_ps(p[j]);
        for (int i = 0; i < V; ++i) acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * D + 8 * i), acc[i]);
    };
    int64_t j = 0;
    for (; j + 2 <= span; j += 2) {
        add(even, j);
        add(odd, j + 1);
    }
    if (j < span) add(even, j);
    for (int i = 0; i < V; ++i) _mm256_storeu_ps(o + 8 * i, _mm256_add_ps(even[i], odd[i]));
}

// Attention of one query q [D] (D a multiple of 8) over the visible slots of keys k0 and
// values v0 [span, D]: o [D] = softmax(q . k * scale) @ v. scores: room for span rounded up to 8.
// DV = D / 8 where it is known when compiled (the common head sizes: every loop over D then has
// fixed bounds and offsets), 0 where D is only known at run time.
//
// Why not the loop in run(): there each score is one dependent chain (D / 8 adds, then a lane
// sum) and the weighted sum one chain per 8 entries of o over every slot, so a decode step's
// attention waited on latency, ~1 us a head for 53 slots; here 8 slots' dot products run side by
// side and the weighted sum has two chains. A verify of 5 tokens pays attention 5 times, a decode
// step once, so this is most of what the verify costs beyond its matmuls.
//
// Batch invariance: every score, the softmax total and every entry of o are the same operations
// in the same order for a given query and cache, whatever the span beyond the visible slots:
// a score's lanes are reduced by one tree wherever it sits in a block of 8 (slots past the span
// read a valid slot and are discarded), masked slots give exactly 0 to the total and are skipped
// by the weighted sum (their keys and values may be anything, even never written).
template <int DV>
inline void attend8(const float* q, const bool* seen, const float* k0, const float* v0,
                    int64_t span, int64_t D_run, float scale, float* scores, float* o) {
    const int64_t D = DV ? 8 * DV : D_run;
    const __m256 hidden_slot = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const int64_t padded = (span + 7) / 8 * 8;
    __m256 top = hidden_slot;
    for (int64_t j0 = 0; j0 < padded; j0 += 8) {
        // a[s] = 8 lanes of q . k for slot j0 + s, whose key key(s) gives
        __m256 a[8];
        auto dots = [&](auto key) {
            for (int s = 0; s < 8; ++s) a[s] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(q + d);
                for (int s = 0; s < 8; ++s) a[s] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(key(s) + d), a[s]);
            }
        };
        __m256 shown;
        if (j0 + 8 <= span) {
            dots([&](int s) { return k0 + (j0 + s) * D; });
            int64_t bytes;               // the 8 slots' visibility, one byte each
            std::memcpy(&bytes, seen + j0, 8);
            const __m256i flags = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
            shown = _mm256_castsi256_ps(_mm256_cmpgt_epi32(flags, _mm256_setzero_si256()));
        } else {
            // the last, partial block: slots past the span read the last slot, then are hidden
            dots([&](int s) { return k0 + std::min(j0 + s, span - 1) * D; });
            alignas(32) float visible[8];
            for (int s = 0; s < 8; ++s) visible[s] = j0 + s < span && seen[j0 + s] ? 1.0f : 0.0f;
            shown = _mm256_cmp_ps(_mm256_load_ps(visible), _mm256_setzero_ps(), _CMP_NEQ_OQ);
        }
        const __m256 block = _mm256_blendv_ps(hidden_slot, _mm256_mul_ps(lane_sums8(a), _mm256_set1_ps(scale)), shown);
        _mm256_storeu_ps(scores + j0, block);
        top = _mm256_max_ps(top, block);
    }
    // the largest visible score (a maximum is exact in any order); every fed token sees its own
    // slot (forward.window_mask), so it is finite
    const __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    const __m128 quarter = _mm_max_ps(half, _mm_movehl_ps(half, half));
    const __m256 largest = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1))));
    // e^(score - largest), 0 for a hidden slot; the total over 8 lanes (slot j in lane j % 8),
    // reduced in lane_sum's order
    __m256 lanes = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < padded; j0 += 8) {
        const __m256 p = exponential8(_mm256_sub_ps(_mm256_loadu_ps(scores + j0), largest));
        _mm256_storeu_ps(scores + j0, p);
        lanes = _mm256_add_ps(lanes, p);
    }
    const __m256 total = _mm256_set1_ps(lane_sum(lanes));
    const int64_t V = D / 8;
    int64_t i = 0;
    for (; i + 4 <= V; i += 4) weighted_sum8<4>(o + 8 * i, scores, seen, v0 + 8 * i, span, D);
    if (V - i == 3) weighted_sum8<3>(o + 8 * i, scores, seen, v0 + 8 * i, span, D);
    if (V - i == 2) weighted_sum8<2>(o + 8 * i, scores, seen, v0 + 8 * i, span, D);
    if (V - i == 1) weighted_sum8<1>(o + 8 * i, scores, seen, v0 + 8 * i, span, D);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), total));
}

// attend8 with the head size fixed when compiled where it is a common one
inline void attend(const float* q, const bool* seen, const float* k0, const float* v0,
                   int64_t span, int64_t D, float scale, float* scores, float* o) {
    switch (D) {
        case 16: return attend8<2>(q, seen, k0, v0, span, D, scale, scores, o);
        case 32: return attend8<4>(q, seen, k0, v0, span, D, scale, scores, o);
        case 64: return attend8<8>(q, seen, k0, v0, span, D, scale, scores, o);
        case 128: return attend8<16>(q, seen, k0, v0, span, D, scale, scores, o);
        default: return attend8<0>(q, seen, k0, v0, span, D, scale, scores, o);
    }
}

inline bool float_tensor(const torch::Tensor& t, torch::ScalarType type, int64_t dim) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == type && t.dim() == dim &&
           t.is_contiguous() && !t.requires_grad();
}

inline bool long_tensor(const torch::Tensor& t, int64_t B, int64_t T) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kLong && t.dim() == 2 &&
           t.size(0) == B && t.size(1) == T && t.is_contiguous();
}

inline bool all_within(const torch::Tensor& t, int64_t limit) {
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
        if (p[i] < 0 || p[i] >= limit) return false;
    return true;
}

template <typename T>
std::optional<torch::Tensor> run(const torch::Tensor& ids, const torch::Tensor& embed,
                                 const std::vector<torch::Tensor>& layers,
                                 const std::vector<torch::Tensor>& keys,
                                 const std::vector<torch::Tensor>& values,
                                 const torch::Tensor& slots, const torch::Tensor& positions,
                                 const torch::Tensor& mask, int64_t span,
                                 const torch::Tensor& cos_table, const torch::Tensor& sin_table,
                                 int64_t H, int64_t KV, int64_t D, double eps_value,
                                 const std::optional<torch::Tensor>& final_norm, bool cache_only,
                                 const std::vector<int64_t>& states,
                                 const std::optional<torch::Tensor>& features,
                                 const std::optional<torch::Tensor>& pair_h,
                                 const std::optional<torch::Tensor>& pair_norm) {
    const auto type = embed.scalar_type();
    const int64_t B = ids.size(0), Tn = ids.size(1), R = B * Tn;
    const int64_t vocab = embed.size(0), hidden = embed.size(1);
    const int64_t L = static_cast<int64_t>(keys.size());
    if (static_cast<int64_t>(layers.size()) != PER_LAYER * L ||
        static_cast<int64_t>(values.size()) != L || H < 1 || KV < 1 || H % KV != 0 || D < 2 ||
        D % 2 != 0)
        return std::nullopt;
    const int64_t QKV = (H + 2 * KV) * D;
    // An EAGLE-3 head's layer (fast/head.py): the residual stream starts as pair_h [B, T, hidden]
    // instead of the embedding, and the first layer's q/k/v read the pair [input_norm(embedding),
    // pair_norm(pair_h)], 2 * hidden wide.
    // An MTP layer's block (fast/mtp.py): pair_h without pair_norm. The stream starts as pair_h
    // (eh_proj's output, which the caller computes with the few-row kernel) and every layer reads
    // it as a decoder layer reads its stream; ids are then read for nothing but the range check.
    const bool starts = pair_h.has_value();
    const bool pair = starts && pair_norm.has_value();
    if (starts && (L < 1 || !float_tensor(*pair_h, type, 3) || pair_h->size(0) != B ||
                   pair_h->size(1) != Tn || pair_h->size(2) != hidden))
        return std::nullopt;
    if (pair && (!float_tensor(*pair_norm, type, 1) || pair_norm->size(0) != hidden))
        return std::nullopt;
    int64_t I = -1;
    for (int64_t l = 0; l < L; ++l) {
        const torch::Tensor* w = &layers[PER_LAYER * l];
        const int64_t reads = pair && l == 0 ? 2 * hidden : hidden;
        if (!float_tensor(w[0], type, 1) || w[0].size(0) != hidden ||
            !float_tensor(w[1], type, 2) || w[1].size(0) != QKV || w[1].size(1) != reads ||
            !float_tensor(w[2], type, 2) || w[2].size(0) != H + KV || w[2].size(1) != D ||
            !float_tensor(w[3], type, 2) || w[3].size(0) != hidden || w[3].size(1) != H * D ||
            !float_tensor(w[4], type, 1) || w[4].size(0) != hidden ||
            !float_tensor(w[5], type, 2) || w[5].size(1) != hidden || w[5].size(0) % 2 != 0 ||
            !float_tensor(w[6], type, 2) || w[6].size(0) != hidden ||
            w[6].size(1) != w[5].size(0) / 2)
            return std::nullopt;
        if (I >= 0 && w[6].size(1) != I) return std::nullopt;
        I = w[6].size(1);
        for (const auto* store : {&keys[l], &values[l]})
            if (!float_tensor(*store, type, 4) || store->size(0) < B || store->size(1) != KV ||
                store->size(3) != D || store->size(2) < span)
                return std::nullopt;
    }
    if (final_norm && (!float_tensor(*final_norm, type, 1) || final_norm->size(0) != hidden))
        return std::nullopt;
    // The residual streams a feature-level head reads (fast/head.py): states[i] is the stream
    // after states[i] layers (0 .. L), copied into block i of features [B, T, n * hidden].
    const int64_t n_states = static_cast<int64_t>(states.size());
    if (n_states > 0 && (!features || !float_tensor(*features, type, 3) || features->size(0) != B ||
                         features->size(1) != Tn || features->size(2) != n_states * hidden))
        return std::nullopt;
    bool wants_last = false;
    for (int64_t index : states) {
        if (index < 0 || index > L) return std::nullopt;
        wants_last = wants_last || index == L;
    }
    const int64_t capacity = L ? keys[0].size(2) : span;
    if (!float_tensor(cos_table, type, 2) || !float_tensor(sin_table, type, 2) ||
        cos_table.size(1) != D || sin_table.sizes() != cos_table.sizes() ||
        !mask.defined() || !mask.device().is_cpu() || mask.scalar_type() != torch::kBool ||
        mask.dim() != 3 || mask.size(0) != B || mask.size(1) != Tn || mask.size(2) != span ||
        !mask.is_contiguous() || span < 1 ||
        !all_within(ids, vocab) || !all_within(slots, std::min(span, capacity)) ||
        !all_within(positions, cos_table.size(0)))
        return std::nullopt;

    const T eps = static_cast<T>(eps_value);
    const T scale = T(1) / std::sqrt(T(D));
    const int64_t half = D / 2, group = H / KV;
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const bool* visible = mask.data_ptr<bool>();
    const T* cos = cos_table.data_ptr<T>();
    const T* sin = sin_table.data_ptr<T>();

    auto out = torch::empty({B, Tn, hidden}, embed.options());           // [B, T, hidden]
    T* x = out.data_ptr<T>();
    T* kept = n_states > 0 ? features->data_ptr<T>() : nullptr;
    // a copy, since the stream is updated in place by every layer after it
    auto keep = [&](int64_t after) {
        for (int64_t i = 0; i < n_states; ++i)
            if (states[i] == after)
                for (int64_t r = 0; r < R; ++r)
                    std::copy_n(x + r * hidden, hidden, kept + (r * n_states + i) * hidden);
    };
    const T* table = embed.data_ptr<T>();
    const T* start = starts ? pair_h->data_ptr<T>() : nullptr;
    for (int64_t r = 0; r < R; ++r)
        std::copy_n(starts ? start + r * hidden : table + id[r] * hidden, hidden, x + r * hidden);

    // Scratch for one layer, reused by every layer: rows are the B * T fed tokens.
    std::vector<T> h(R * hidden * (pair ? 2 : 1)), qkv(R * QKV), attended(R * H * D), sum(R * hidden),
        gate_up(R * 2 * I), act(R * I);
    for (int64_t l = 0; l < L; ++l) {
        const torch::Tensor* w = &layers[PER_LAYER * l];
        keep(l);
        const T* input_norm = w[0].data_ptr<T>();
        const T* qk_norm = w[2].data_ptr<T>();
        const T* post_norm = w[4].data_ptr<T>();
        T* key_store = keys[l].data_ptr<T>();
        T* value_store = values[l].data_ptr<T>();

        if (pair && l == 0) {
            const T* second = pair_norm->data_ptr<T>();
            each_row(R, [&](int64_t r) {
                rms_row(table + id[r] * hidden, input_norm, &h[2 * r * hidden], hidden, eps);
                rms_row(x + r * hidden, second, &h[(2 * r + 1) * hidden], hidden, eps);
            });
            matmul(h.data(), R, 2 * hidden, w[1].data_ptr<T>(), qkv.data(), 2 * hidden, QKV);
        } else {
            each_row(R, [&](int64_t r) { rms_row(x + r * hidden, input_norm, &h[r * hidden], hidden, eps); });
            matmul(h.data(), R, hidden, w[1].data_ptr<T>(), qkv.data(), hidden, QKV);
        }

        // q and k heads: per-head norm, then rotary at the token's position (half-split layout,
        // the sin table carrying the sign: x * cos + [x2, x1] * signed_sin); then the cache write.
        each_row(R, [&](int64_t r) {
            const T* c = cos + pos[r] * D;
            const T* s = sin + pos[r] * D;
            T normed[512];
            T* row = &qkv[r * QKV];
            for (int64_t j = 0; j < H + KV; ++j) {
                T* head = row + j * D;
                rms_row(head, qk_norm + j * D, normed, D, eps);
                for (int64_t d = 0; d < half; ++d) head[d] = normed[d] * c[d] + normed[d + half] * s[d];
                for (int64_t d = half; d < D; ++d) head[d] = normed[d] * c[d] + normed[d - half] * s[d];
            }
            const int64_t b = r / Tn;
            for (int64_t g = 0; g < KV; ++g) {
                const int64_t at = ((b * KV + g) * capacity + slot[r]) * D;
                std::copy_n(row + (H + g) * D, D, key_store + at);
                std::copy_n(row + (H + KV + g) * D, D, value_store + at);
            }
        });
        // A prefill wants the cache and no logits: past the last layer's keys and values nothing
        // it computes is read (its attention and MLP would only feed the head).
        // (unless a head reads the stream after the last layer)
        if (cache_only && l == L - 1 && !wants_last) return torch::empty({B, Tn, 0}, embed.options());

        // Attention of each (token, query head) over the visible slots, in slot order.
        at::parallel_for(0, R * H, 4, [&](int64_t first, int64_t last) {
            std::vector<T> scores((span + 7) / 8 * 8);
            for (int64_t item = first; item < last; ++item) {
                const int64_t r = item / H, head = item % H, b = r / Tn, g = head / group;
                const T* q = &qkv[r * QKV + head * D];
                const bool* seen = visible + r * span;
                const T* k0 = key_store + (b * KV + g) * capacity * D;
                const T* v0 = value_store + (b * KV + g) * capacity * D;
                if constexpr (std::is_same_v<T, float>) {
                    if (D % 8 == 0) {
                        attend(q, seen, k0, v0, span, D, scale, scores.data(), &attended[r * H * D + head * D]);
                        continue;
                    }
                }
                T top = -std::numeric_limits<T>::infinity();
                for (int64_t j = 0; j < span; ++j) {
                    scores[j] = seen[j] ? dot(q, k0 + j * D, D) * scale
                                        : -std::numeric_limits<T>::infinity();
                    top = std::max(top, scores[j]);
                }
                // one pass of exponentials (vectorized for float32), masked slots giving 0
                for (int64_t j = 0; j < span; ++j) scores[j] -= top;
                exponentials(scores.data(), scores.data(), span);
                T* o = &attended[r * H * D + head * D];
                T total = 0;
                for (int64_t j = 0; j < span; ++j)
                    if (seen[j]) total += scores[j];
                weighted_sum(o, scores.data(), seen, v0, span, D);
                // Every fed token sees its own slot (forward.window_mask), so total >= 1.
                for (int64_t d = 0; d < D; ++d) o[d] /= total;
            }
        });

        matmul(attended.data(), R, H * D, w[3].data_ptr<T>(), sum.data(), H * D, hidden);
        each_row(R, [&](int64_t r) {
            for (int64_t i = r * hidden; i < (r + 1) * hidden; ++i) x[i] += sum[i];
            rms_row(x + r * hidden, post_norm, &h[r * hidden], hidden, eps);
        });
        matmul(h.data(), R, hidden, w[5].data_ptr<T>(), gate_up.data(), hidden, 2 * I);
        each_row(R, [&](int64_t r) { swiglu(&gate_up[r * 2 * I], &act[r * I], I); });
        matmul(act.data(), R, I, w[6].data_ptr<T>(), sum.data(), I, hidden);
        each_row(R, [&](int64_t r) {
            for (int64_t i = r * hidden; i < (r + 1) * hidden; ++i) x[i] += sum[i];
        });
    }
    keep(L);
    if (cache_only) return torch::empty({B, Tn, 0}, embed.options());
    // The model's final norm, in place (rms_row reads each entry before it writes it), so the
    // caller's next step is the head: one torch operation fewer per call.
    if (final_norm) {
        const T* norm = final_norm->data_ptr<T>();
        each_row(R, [&](int64_t r) { rms_row(x + r * hidden, norm, x + r * hidden, hidden, eps); });
    }
    return out;
}

}  // namespace fused

// The decoder layers' output x [B, T, hidden] (after final_norm where one is given; an empty
// [B, T, 0] when cache_only), or nothing where the contract at the top of this file does not hold.
// states, features: the residual streams after states[i] layers, copied into features' blocks.
// pair_h, pair_norm: an EAGLE-3 head's layer (the stream starts as pair_h; q/k/v read the pair);
// pair_h alone: an MTP layer's block (the stream starts as pair_h; the layers are plain).
// Keys/values of the fed tokens are written into the given per-layer cache tensors
// [max_batch, KV, capacity, D] at `slots`.
std::optional<torch::Tensor> decoder_layers(
        const torch::Tensor& ids, const torch::Tensor& embed,
        const std::vector<torch::Tensor>& layers, const std::vector<torch::Tensor>& keys,
        const std::vector<torch::Tensor>& values, const torch::Tensor& slots,
        const torch::Tensor& positions, const torch::Tensor& mask, int64_t span,
        const torch::Tensor& cos_table, const torch::Tensor& sin_table, int64_t heads,
        int64_t kv_heads, int64_t head_dim, double eps,
        const std::optional<torch::Tensor>& final_norm, bool cache_only,
        const std::vector<int64_t>& states, const std::optional<torch::Tensor>& features,
        const std::optional<torch::Tensor>& pair_h, const std::optional<torch::Tensor>& pair_norm) {
    if (!ids.defined() || !embed.defined() || ids.dim() != 2 || embed.dim() != 2 ||
        !embed.device().is_cpu() || !embed.is_contiguous() || embed.requires_grad() ||
        head_dim > 512)
        return std::nullopt;
    const int64_t B = ids.size(0), T = ids.size(1);
    if (B < 1 || T < 1 || B * T > fused::MAX_ROWS || !fused::long_tensor(ids, B, T) ||
        !fused::long_tensor(slots, B, T) || !fused::long_tensor(positions, B, T))
        return std::nullopt;
    if (embed.scalar_type() == torch::kFloat)
        return fused::run<float>(ids, embed, layers, keys, values, slots, positions, mask, span,
                                 cos_table, sin_table, heads, kv_heads, head_dim, eps, final_norm, cache_only,
                                 states, features, pair_h, pair_norm);
    if (embed.scalar_type() == torch::kDouble)
        return fused::run<double>(ids, embed, layers, keys, values, slots, positions, mask, span,
                                  cos_table, sin_table, heads, kv_heads, head_dim, eps, final_norm, cache_only,
                                  states, features, pair_h, pair_norm);
    return std::nullopt;
}

// forward.window_mask on the CPU in one call: mask [B, T, span] (True = may attend) from
// window_start [B] and visibility [T, W]: slot j of row b is visible to fed token t when it lies
// before the row's window (j < start[b]), or inside it where visibility[t, j - start[b]] says so.
// Nothing where the inputs are off that contract (the caller then builds it with torch ops).
std::optional<torch::Tensor> window_mask(const torch::Tensor& window_start,
                                         const torch::Tensor& visibility, int64_t span) {
    if (!window_start.defined() || !visibility.defined() || !window_start.device().is_cpu() ||
        !visibility.device().is_cpu() || window_start.scalar_type() != torch::kLong ||
        visibility.scalar_type() != torch::kBool || window_start.dim() != 1 ||
        visibility.dim() != 2 || !window_start.is_contiguous() || !visibility.is_contiguous() ||
        visibility.size(1) < 1 || span < 0)
        return std::nullopt;
    const int64_t B = window_start.size(0), T = visibility.size(0), W = visibility.size(1);
    auto mask = torch::empty({B, T, span}, visibility.options());   // [B, T, span]
    const int64_t* start = window_start.data_ptr<int64_t>();
    const bool* seen = visibility.data_ptr<bool>();
    bool* out = mask.data_ptr<bool>();
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
            bool* row = out + (b * T + t) * span;
            for (int64_t j = 0; j < span; ++j) {
                const int64_t relative = j - start[b];
                row[j] = relative < 0 || (relative < W && seen[t * W + relative]);
            }
        }
    return mask;
}
