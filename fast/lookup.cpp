// Prompt lookup's search on the CPU: each row's proposals in one call (fast/lookup.py).
//
// The same search as PromptLookup's tensor operations, loop for loop, so the two agree exactly
// (tests/test_fast_lookup.py): for n-gram sizes ngram .. 1, the latest start s <= n - size - 1
// whose size tokens equal the context's last size tokens (n = length + 1 tokens of context,
// history[b, 0 .. n)); the first size with a match gives source = s + size; proposal i is
// history[b, source + i] while source + i < n, else the row's newest token. Why in C++: the
// tensor version is some sixty small operations, a quarter of a decode step of the trained
// target, for work that is a few comparisons here.
//
// Returns proposals [B, k], or nothing where the inputs are off the contract (the caller then
// runs the tensor version); it never throws (see small_m.cpp).

#include <torch/extension.h>
#include <optional>

std::optional<torch::Tensor> lookup(const torch::Tensor& history, const torch::Tensor& lengths,
                                    const torch::Tensor& last, int64_t k, int64_t ngram,
                                    int64_t bound) {
    for (const auto* t : {&history, &lengths, &last})
        if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != torch::kLong ||
            !t->is_contiguous())
            return std::nullopt;
    if (history.dim() != 2 || lengths.dim() != 1 || last.dim() != 1) return std::nullopt;
    const int64_t B = lengths.size(0), W = history.size(1);
    if (history.size(0) < B || last.size(0) != B || k < 1 || ngram < 1 || bound < 1 || bound > W)
        return std::nullopt;
    const int64_t* H = history.data_ptr<int64_t>();
    const int64_t* L = lengths.data_ptr<int64_t>();
    const int64_t* X = last.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
        if (L[b] < 0 || L[b] + 1 > bound) return std::nullopt;
    auto proposals = torch::empty({B, k}, lengths.options());    // [B, k]
    int64_t* out = proposals.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
        const int64_t* row = H + b * W;
        const int64_t n = L[b] + 1;
        int64_t source = -1;
        for (int64_t size = ngram; size >= 1 && source < 0; --size) {
            if (size >= bound) continue;
            for (int64_t s = n - size - 1; s >= 0; --s) {    // latest first
                int64_t j = 0;
                while (j < size && row[s + j] == row[n - size + j]) ++j;
                if (j == size) {
                    source = s + size;
                    break;
                }
            }
        }
        for (int64_t i = 0; i < k; ++i)
            out[b * k + i] = (source >= 0 && source + i < n) ? row[source + i] : X[b];
    }
    return proposals;
}
