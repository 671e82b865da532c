// One round's speculative sampling decisions on the CPU, row by row, in one call.
// Returns {accepted [B], block [B, k+1]}, or {[row, position, token]} of a proposal outside the
// vocabulary.
//
// The rule and its proof are fast/verify.py's rejection_sample; this is the same computation,
// operation for operation, so the two agree bit for bit (tests/test_fast_native.py), and the
// kit's distribution checks of the engine cover both. Why a loop in C++: the torch version is
// some twenty tensor operations on [B, k+1, V], each a few microseconds of dispatch on a CPU,
// which is most of a round's bookkeeping for a small model; here the work itself (a gather, a
// compare, one residual, one cumulative sum per row) is what remains.
//
// Per row b, with proposals x_i drawn from q_i:
//   accept x_i while u_i * q_i(x_i) < p_i(x_i); a = the number accepted before the first rejection
//   residual = max(p_a - q_a, 0) if a < k, else p_k (the bonus: q_k = 0); p_a if it has no mass
//   correction = first j with cdf(residual)[j] >= (1 - u_draw) * cdf(residual)[V - 1]
//   block = x_0 .. x_{a-1}, then the correction in every later position
// As in torch: the cumulative sum runs left to right in float64 (torch's CPU cumsum), and
// "has mass" is any residual entry > 0 (a sum of non-negative numbers is > 0 iff one is).

#include <torch/extension.h>
#include <algorithm>
#include <vector>

std::vector<torch::Tensor> rejection_sample(const torch::Tensor& p, const torch::Tensor& q,
                                            const torch::Tensor& proposals,
                                            const torch::Tensor& u_accept,
                                            const torch::Tensor& u_draw) {
    TORCH_CHECK(p.dim() == 3 && q.dim() == 3 && proposals.dim() == 2,
                "rejection_sample: p must be [B, k+1, V], q [B, k, V], proposals [B, k]");
    const int64_t B = proposals.size(0), k = proposals.size(1), V = p.size(2);
    TORCH_CHECK(k >= 1, "rejection_sample: needs k >= 1 proposals per row, got ", k);
    TORCH_CHECK(p.size(0) == B && p.size(1) == k + 1 && q.size(0) == B && q.size(1) == k &&
                    q.size(2) == V,
                "rejection_sample: p is ", p.sizes(), ", q ", q.sizes(), ", proposals ",
                proposals.sizes(), ": p must be [B, k+1, V] and q [B, k, V]");
    TORCH_CHECK(u_accept.dim() == 2 && u_accept.size(0) == B && u_accept.size(1) == k &&
                    u_draw.dim() == 1 && u_draw.size(0) == B,
                "rejection_sample: u_accept must be [B, k] and u_draw [B], got ",
                u_accept.sizes(), " and ", u_draw.sizes());
    for (const auto* t : {&p, &q, &u_accept, &u_draw})
        TORCH_CHECK(t->scalar_type() == torch::kDouble && t->is_contiguous() && t->device().is_cpu(),
                    "rejection_sample: p, q and the uniforms must be contiguous float64 CPU tensors");
    TORCH_CHECK(proposals.scalar_type() == torch::kLong && proposals.is_contiguous() &&
                    proposals.device().is_cpu(),
                "rejection_sample: proposals must be a contiguous int64 CPU tensor");

    auto accepted = torch::empty({B}, proposals.options());       // [B]
    auto block = torch::empty({B, k + 1}, proposals.options());   // [B, k+1]
    const double* P = p.data_ptr<double>();
    const double* Q = q.data_ptr<double>();
    const int64_t* X = proposals.data_ptr<int64_t>();
    const double* UA = u_accept.data_ptr<double>();
    const double* UD = u_draw.data_ptr<double>();
    int64_t* A = accepted.data_ptr<int64_t>();
    int64_t* out = block.data_ptr<int64_t>();
    std::vector<double> cdf(V);                                    // one row's cumulative residual

    // A proposal outside the vocabulary is answered, not thrown: the caller (fast/verify.py)
    // raises the error naming it. An exception thrown out of an extension built by another
    // compiler than torch's crashed the process on one machine (g++ 13 with torch 2.11), so the
    // checks above are for direct callers only, and fast/verify.py never reaches them.
    for (int64_t i = 0; i < B * k; ++i)
        if (X[i] < 0 || X[i] >= V)
            return {torch::tensor({i / k, i % k, X[i]}, proposals.options())};
    for (int64_t b = 0; b < B; ++b) {
        const int64_t* x = X + b * k;
        int64_t a = 0;
        while (a < k && UA[b * k + a] * Q[(b * k + a) * V + x[a]] < P[(b * (k + 1) + a) * V + x[a]])
            ++a;
        const double* p_a = P + (b * (k + 1) + a) * V;
        const double* q_a = Q + (b * k + std::min(a, k - 1)) * V;
        bool mass = false;
        if (a < k)
            for (int64_t j = 0; j < V && !mass; ++j) mass = std::max(p_a[j] - q_a[j], 0.0) > 0;
        const bool from_residual = a < k && mass;
        double total = 0;
        for (int64_t j = 0; j < V; ++j) {
            total += from_residual ? std::max(p_a[j] - q_a[j], 0.0) : p_a[j];
            cdf[j] = total;
        }
        const double level = (1 - UD[b]) * cdf[V - 1];
        const int64_t correction = std::lower_bound(cdf.begin(), cdf.end(), level) - cdf.begin();
        A[b] = a;
        for (int64_t i = 0; i <= k; ++i) out[b * (k + 1) + i] = i < a ? x[i] : correction;
    }
    return {accepted, block};
}
