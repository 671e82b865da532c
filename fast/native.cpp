// The fast engine's CPU kernels as one extension module (fast/native.py builds it).
#include <torch/extension.h>
#include <pybind11/stl.h>
#include <optional>
#include <vector>

std::optional<torch::Tensor> linear(const torch::Tensor& x, const torch::Tensor& w);    // small_m.cpp
std::vector<torch::Tensor> rejection_sample(const torch::Tensor& p, const torch::Tensor& q,
                                            const torch::Tensor& proposals,
                                            const torch::Tensor& u_accept,
                                            const torch::Tensor& u_draw);              // rejection.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("linear", &linear, "x [..., K] @ w[N, K]^T for at most 8 float32 rows (AVX2 + FMA), or "
          "None where the kernel does not apply");
    m.def("rejection_sample", &rejection_sample,
          "(accepted [B], block [B, k+1]) of one speculative sampling round (fast/verify.py)");
}
