// The fast engine's CPU kernels as one extension module (fast/native.py builds it). One
// translation unit: torch's headers cost most of a build, so the kernels' files are included
// here rather than compiled one by one (about half the first-use build time).
#include <torch/extension.h>
#include <pybind11/stl.h>

#include "small_m.cpp"      // linear
#include "rejection.cpp"    // rejection_sample
#include "lookup.cpp"       // lookup
#include "fused.cpp"        // decoder_layers, window_mask (uses small_m.cpp's product)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("linear", &linear, "x [..., K] @ w[N, K]^T for at most 64 float32 rows (AVX2 + FMA), or "
          "None where the kernel does not apply");
    m.def("decoder_layers", &decoder_layers, "a model's decoder layers (and its final norm, when "
          "given) for at most 1024 float32 or float64 rows in one call (fast/fused.py), or None "
          "where the inputs are off its contract");
    m.def("window_mask", &window_mask, "forward.window_mask's [B, T, span] mask in one call, or "
          "None where the inputs are off its contract");
    m.def("lookup", &lookup, "prompt lookup's proposals [B, k] (fast/lookup.py), or None where "
          "the inputs are off its contract");
    m.def("rejection_sample", &rejection_sample,
          "(accepted [B], block [B, k+1]) of one speculative sampling round (fast/verify.py)");
}
